"""Drafter training: batch layout with ragged sequences, the KL + CE loss, layer initialisation from the target,
validation / best checkpoint / early stopping / resume of train_drafters."""
import pytest
import torch

pytest.importorskip("transformers")

from workbench.acceptance.fastllama import StaticLlama
from workbench.acceptance.target import tiny_llama
from workbench.acceptance.train import (SeqData, TrainConfig, default_target_layers, drafter_batch, drafter_loss,
                                        init_from_target, sample_anchors, train_drafters)
from workbench.engine.drafters import DFlashConfig, DFlashDrafter
from workbench.validation import InvalidParameter

CFG = DFlashConfig(hidden_size=32, num_layers=1, num_heads=4, head_dim=8, intermediate_size=64, block=4,
                   target_layers=(0, 1), mask_token_id=0, context_window=8)


@pytest.fixture(scope="module")
def target():
    return StaticLlama(tiny_llama(vocab_size=64, hidden_size=32, layers=2, heads=4, kv_heads=2, intermediate=64,
                                  seed=2), capture_layers=(0, 1))


def _data(target, n=6, new=14, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 64, (int(k),), generator=g).tolist() for k in torch.randint(3, 8, (n,), generator=g)]
    gens, _ = target.generate(prompts, new, batch=4, max_prompt=8)
    return SeqData.from_lists(prompts, gens, eos=None)


def test_default_target_layers():
    assert default_target_layers(30, 5) == (1, 8, 14, 20, 27)
    assert default_target_layers(2, 2) == (1,)


def test_batch_layout_masks_labels_past_the_length(target):
    seqs = torch.arange(40).reshape(2, 20) % 64
    _, feats = target.forward(seqs)
    anchors = torch.tensor([[3, 16], [8, 10]])
    toks, pos, ctx, cpos, cmask, labels = drafter_batch(seqs, feats, anchors, CFG, lengths=torch.tensor([20, 12]))
    assert toks.shape == (4, 4) and ctx.shape == (4, 8, 64) and labels.shape == (4, 3)
    assert toks[0].tolist() == [3, 0, 0, 0] and labels[0].tolist() == [4, 5, 6]
    assert labels[1].tolist() == [17, 18, 19] and labels[3].tolist() == [31, -100, -100]
    assert cmask[0].tolist() == [False] * 5 + [True] * 3 and cpos[0, 5:].tolist() == [0, 1, 2]
    torch.testing.assert_close(ctx[3, -1], feats[1, 9])
    with pytest.raises(ValueError, match="anchors"):
        drafter_batch(seqs, feats, torch.tensor([[19, 3], [3, 3]]), CFG)


def test_loss_ignores_masked_labels_and_adds_the_kl():
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 10)
    labels = torch.randint(0, 10, (3, 4))
    base = drafter_loss(logits, labels, 7.0)
    masked = labels.clone()
    masked[:, 3] = -100
    assert drafter_loss(logits, masked, 7.0) != base
    assert drafter_loss(logits, labels, 7.0, logits, 1.0) == pytest.approx(float(base), rel=1e-5)  # KL(p||p) = 0
    assert drafter_loss(logits, labels, 7.0, torch.randn(3, 4, 10), 1.0) > base


def test_anchors_lie_in_the_continuation(target):
    data = _data(target)
    rows = torch.arange(data.tokens.shape[0])
    a = sample_anchors(data, rows, 50, torch.Generator().manual_seed(1))
    assert bool((a >= data.prompt_lens[:, None]).all()) and bool((a <= data.lengths[:, None] - 2).all())


def test_init_from_target_reproduces_a_target_layer(target):
    cfg = DFlashConfig(hidden_size=32, num_layers=1, num_heads=4, head_dim=8, intermediate_size=64, block=4,
                       target_layers=(0, 1), context_window=8)
    d = DFlashDrafter.random(cfg, target, seed=0)
    assert init_from_target(d, target, layers=(1,)) == [1]
    t = target.layers[1]
    torch.testing.assert_close(d.layers[0].gate_proj.weight, t.mlp.gate_proj.weight)
    kv = t.self_attn.k_proj.weight.view(2, 8, 32)
    torch.testing.assert_close(d.layers[0].k_proj.weight.view(4, 8, 32)[1], kv[0])   # heads 0, 1 share kv head 0
    bad = DFlashConfig(hidden_size=32, num_layers=1, num_heads=2, head_dim=16, intermediate_size=64, block=4,
                       target_layers=(0, 1))
    with pytest.raises(InvalidParameter, match="num_heads, head_dim"):
        init_from_target(DFlashDrafter.random(bad, target), target)


def test_train_drafters_validates_keeps_best_stops_early_and_resumes(target, tmp_path):
    data, valid = _data(target, 8, seed=0), _data(target, 4, seed=1)
    cfg = TrainConfig(max_steps=6, batch=4, anchors=3, lr=3e-3, warmup=2, eval_every_steps=2, val_anchors=16,
                      patience=50, amp=False)
    out = train_drafters(target, {"a": (CFG, "target"), "b": (CFG, "random")}, data, valid, cfg,
                         checkpoint_dir=tmp_path, progress=False)
    for name in ("a", "b"):
        d, st = out[name]
        assert st["steps"] == 6 and len(st["loss_curve"]) == 6
        assert [v["step"] for v in st["val_curve"]] == [0, 2, 4, 6]
        assert st["best"]["loss"] == min(v["loss"] for v in st["val_curve"])
        assert len(st["best"]["top1"]) == CFG.block - 1 and 1 <= st["best"]["chain_accepted"] <= CFG.block
        assert not d.training
    assert out["a"][1]["init_layers"] == [1] and out["b"][1]["init_layers"] is None
    # resume: the checkpoint carries on from step 6
    again = train_drafters(target, {"a": (CFG, "target")}, data, valid,
                           TrainConfig(max_steps=2, batch=4, anchors=3, eval_every_steps=1, val_anchors=16, amp=False),
                           checkpoint_dir=tmp_path, progress=False)
    st = again["a"][1]
    assert st["resumed_from"] == 6 and st["steps"] == 8 and [s["last_step"] for s in st["segments"]] == [6, 8]
    # early stopping: a zero learning rate never improves
    stop = train_drafters(target, {"c": (CFG, "random")}, data, valid,
                          TrainConfig(max_steps=50, batch=2, anchors=2, lr=1e-12, warmup=0, eval_every_steps=1,
                                      val_anchors=8, patience=2, amp=False), progress=False)
    assert stop["c"][1]["stopped"].startswith("early stop") and stop["c"][1]["steps"] <= 4


def test_bad_inputs_name_what_is_allowed(target):
    data = _data(target, 4)
    with pytest.raises(InvalidParameter, match="init"):
        train_drafters(target, {"a": (CFG, "copy")}, data, data, TrainConfig(max_steps=1), progress=False)
    with pytest.raises(InvalidParameter, match="patience"):
        TrainConfig(patience=0).check()
