"""Drafter training (issue 28 item 3): batch construction, one step lowers the loss on a fixed batch,
checkpoints resume, and the H200 script's dry run writes acceptance.json end to end."""
import dataclasses
import json

import pytest
import torch

pytest.importorskip("transformers")

from workbench.acceptance.target import HFTarget, tiny_llama
from workbench.acceptance.textdata import build_splits, byte_tokenize, save_splits
from workbench.acceptance.train import (TrainConfig, default_target_layers, drafter_batch, drafter_loss,
                                        greedy_continuations, load_checkpoint, train)
from workbench.engine.drafters import DFlashConfig, DFlashDrafter

CFG = DFlashConfig(hidden_size=32, num_layers=1, num_heads=2, head_dim=16, intermediate_size=64, block=4,
                   target_layers=(0, 1), mask_token_id=0, context_window=8)


@pytest.fixture(scope="module")
def target():
    return HFTarget(tiny_llama(vocab_size=64, hidden_size=32, layers=2, heads=4, kv_heads=2, intermediate=64, seed=2),
                    capture_layers=(0, 1))


def test_default_target_layers():
    assert default_target_layers(30, 4) == (1, 10, 18, 27)
    assert default_target_layers(2, 2) == (1,)


def test_greedy_continuations_are_the_targets_greedy_tokens(target):
    prompts = torch.randint(0, 64, (3, 5), generator=torch.Generator().manual_seed(0))
    seqs = greedy_continuations(target, prompts, 6, batch=2)
    assert seqs.shape == (3, 11) and torch.equal(seqs[:, :5], prompts)
    for row in range(3):
        hf = target.model.generate(prompts[row:row + 1], max_new_tokens=6, do_sample=False)
        assert torch.equal(seqs[row], hf[0])


def test_batch_layout(target):
    seqs = torch.arange(40).reshape(2, 20) % 64
    _, feats = target.forward_features(seqs)
    anchors = torch.tensor([[3, 16], [8, 10]])
    toks, pos, ctx, cpos, cmask, labels = drafter_batch(seqs, feats, anchors, CFG)
    assert toks.shape == (4, 4) and ctx.shape == (4, 8, 64) and labels.shape == (4, 3)
    assert toks[0].tolist() == [3, 0, 0, 0] and labels[0].tolist() == [4, 5, 6]
    assert pos[1].tolist() == [16, 17, 18, 19]
    assert cmask[0].tolist() == [False] * 5 + [True] * 3 and cpos[0, 5:].tolist() == [0, 1, 2]
    torch.testing.assert_close(ctx[3, -1], feats[1, 9])
    with pytest.raises(ValueError, match="anchors"):
        drafter_batch(seqs, feats, torch.tensor([[17, 3], [3, 3]]), CFG)


def test_one_step_lowers_the_loss_on_a_fixed_batch(target):
    torch.manual_seed(0)
    seqs = greedy_continuations(target, torch.randint(0, 64, (4, 6)), 14)
    _, feats = target.forward_features(seqs)
    inputs = drafter_batch(seqs, feats, torch.tensor([[6, 9], [7, 12], [6, 16], [10, 11]]), CFG)
    d = DFlashDrafter.random(CFG, target, seed=0, std=0.02).train()
    opt = torch.optim.AdamW(d.parameters(), lr=3e-3)
    before = drafter_loss(d(*inputs[:5]), inputs[5], 7.0)
    before.backward()
    opt.step()
    with torch.no_grad():
        after = drafter_loss(d(*inputs[:5]), inputs[5], 7.0)
    assert after.item() < before.item() - 1e-3


def test_train_time_box_checkpoint_and_resume(target, tmp_path):
    seqs = greedy_continuations(target, torch.randint(0, 64, (6, 6), generator=torch.Generator().manual_seed(1)), 10)
    cfg = TrainConfig(max_steps=9, batch=2, anchors=2, prompt_len=6, warmup=2, seed=5)
    d1, s1 = train(target, CFG, seqs, cfg, checkpoint_dir=tmp_path, progress=False, data_info={"x": 1}, stop_after=6)
    assert s1["steps"] == 6 and len(s1["loss_curve"]) == 6 and s1["resumed_from"] is None
    assert {p.name for p in tmp_path.iterdir()} == {"drafter.safetensors", "optimizer.safetensors", "state.json"}
    d2, s2 = train(target, CFG, seqs, cfg, checkpoint_dir=tmp_path, progress=False)
    assert s2["steps"] == 9 and s2["resumed_from"] == 6 and s2["loss_curve"][:6] == s1["loss_curve"]
    # an uninterrupted 9-step run draws the same batches: the same losses
    d3, s3 = train(target, CFG, seqs, TrainConfig(max_steps=9, batch=2, anchors=2, prompt_len=6, warmup=2, seed=5),
                   progress=False)
    got = [c[2] for c in s2["loss_curve"]]
    want = [c[2] for c in s3["loss_curve"]]
    assert got == pytest.approx(want, rel=1e-4)
    loaded, _, st = load_checkpoint(tmp_path, target)
    assert st["steps"] == 9 and loaded.config == CFG


def test_checkpoint_carries_the_training_data_of_the_run_that_trained(target, tmp_path):
    """A resumed run that trains no step must not report its own data as the drafter's training data."""
    from workbench.acceptance.train import training_segments

    seqs = greedy_continuations(target, torch.randint(0, 64, (6, 6), generator=torch.Generator().manual_seed(1)), 10)
    cfg = TrainConfig(max_steps=5, batch=2, anchors=2, prompt_len=6, warmup=2, seed=5)
    _, s1 = train(target, CFG, seqs, cfg, checkpoint_dir=tmp_path, progress=False, data_info={"sequences": 6},
                  stop_after=3)
    assert s1["segments"] == [{"first_step": 1, "last_step": 3, "data": {"sequences": 6},
                               "train_config": s1["train_config"]}] and s1["data"] == {"sequences": 6}
    _, s2 = train(target, CFG, seqs, cfg, checkpoint_dir=tmp_path, progress=False, data_info={"sequences": 4})
    assert [(g["first_step"], g["last_step"], g["data"]) for g in s2["segments"]] == [
        (1, 3, {"sequences": 6}), (4, 5, {"sequences": 4})] and s2["data"] == {"sequences": 4}
    # resumed at max_steps: no step trained, no segment added; another time box is not this run's either
    _, s3 = train(target, CFG, seqs, dataclasses.replace(cfg, seconds=1e-9), checkpoint_dir=tmp_path,
                  progress=False, data_info={"sequences": 1})
    assert s3["steps"] == s3["resumed_from"] == 5 and s3["segments"] == s2["segments"]
    assert s3["data"] == {"sequences": 4} and s3["train_config"]["seconds"] is None
    assert json.loads((tmp_path / "state.json").read_text())["segments"] == s2["segments"]
    # a checkpoint written before segments: one segment over its steps, marked legacy
    legacy = training_segments({"steps": 7, "data": {"sequences": 2}, "train_config": {"batch": 2}})
    assert legacy[0]["first_step"] == 1 and legacy[0]["last_step"] == 7 and "legacy" in legacy[0]
    assert training_segments({"steps": 0}) == []


def test_measure_time_box_skips_points_and_reports_each(target):
    from workbench.acceptance.measure import measure, measurement_order, point_estimate

    assert measurement_order(["a", "b"], [16, 8], [1, 32]) == [
        ("a", 16, 1), ("b", 16, 1), ("a", 16, 32), ("b", 16, 32), ("a", 8, 1), ("b", 8, 1), ("a", 8, 32), ("b", 8, 32)]
    assert point_estimate(("a", 16, 32), {}, {"a": 2.0}) == 2.0
    assert point_estimate(("b", 16, 32), {("a", 16, 32): 3.0, ("a", 16, 1): 5.0}, {"b": 1.0}) == 3.0
    assert point_estimate(("b", 8, 32), {("a", 16, 32): 3.0, ("a", 16, 1): 5.0}, {"b": 1.0}) == 5.0
    d = DFlashDrafter.random(CFG, target, seed=0, std=0.02).eval()
    prompts = {"code": torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(3)),
               "math": torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(4))}
    seen = []
    full = measure(target, d, prompts, [4, 3], [1, 4], 6, on_row=lambda r: seen.append(len(r["rows"])))
    assert full["complete"] and full["skipped"] == [] and seen == list(range(1, 9))
    assert [(r["text_type"], r["block"], r["budget"]) for r in full["rows"]] == [
        (t, b, k) for t in ("code", "math") for b in (3, 4) for k in (1, 4)]
    none = measure(target, d, prompts, [4], [1, 4], 6, seconds=1e-9)
    assert not none["complete"] and none["rows"] == [] and set(none["greedy"]) == {"code", "math"}
    assert [(k["text_type"], k["block"], k["budget"]) for k in none["skipped"]] == measurement_order(
        ["code", "math"], [4], [1, 4]) and all(k["estimate_seconds"] > 0 for k in none["skipped"])


def test_bench_dry_run_writes_acceptance_json(tmp_path):
    from workbench.acceptance.measure import acceptance_for
    from workbench.bench.acceptance import main

    docs = [(f"d{i}", "def f(x):\n    return x + %d\n" % i * 6) for i in range(12)]
    splits = [build_splits(t, byte_tokenize, chunk=24, docs=docs, heldout_fraction=0.25) for t in ("code", "math")]
    f = save_splits(tmp_path / "s.safetensors", splits, {"tokenizer": "bytes", "vocab_size": 256})
    args = ["--dry-run", "--device", "cpu", "--splits", str(f), "--out", str(tmp_path), "--text-types", "code", "math",
            "--prompt-tokens", "16", "--gen-tokens", "12", "--gen-batch", "8", "--gen-seconds", "1",
            "--train-seconds", "2", "--max-steps", "3", "--batch", "4", "--anchors", "2", "--block", "4",
            "--blocks", "3", "4", "--budgets", "1", "4", "--prompts", "2", "--max-new", "10",
            "--checkpoint-dir", str(tmp_path / "ck")]
    rc = main(args)
    assert rc == 0
    doc = json.loads((tmp_path / "acceptance.json").read_text())
    assert "DRY RUN" in doc["notes"] and doc["provenance"]["git_commit"]
    rows = doc["results"]["rows"]
    assert len(rows) == 2 * 2 * 2
    for r in rows:
        assert r["lossless"] == r["prompts"] == 2
        assert sum(r["histogram"]) == r["rounds"] and len(r["histogram"]) == r["block"]
        assert 1 <= r["mean_accepted"] <= r["block"]
    dr = doc["results"]["drafter"]
    assert dr["steps"] == 3 and dr["final_loss"] > 0 and len(dr["loss_curve"]) == 3
    assert acceptance_for("math", 4, 4, doc=doc) == next(
        r["mean_accepted"] for r in rows if (r["text_type"], r["block"], r["budget"]) == ("math", 4, 4))
    assert dr["steps_this_run"] == 3 and dr["data"]["sequences"] > 0 and "this_run_data" not in dr
    assert doc["results"]["complete"] and doc["results"]["skipped"] == []
    # the same checkpoint resumed at max_steps with a time-boxed measurement: nothing trained, nothing measured
    rc = main(args[:args.index("--gen-seconds")] + ["--gen-seconds", "0.001", "--gen-batch", "4"]
              + args[args.index("--gen-seconds") + 2:] + ["--measure-seconds", "1e-9"])
    assert rc == 0
    doc2 = json.loads((tmp_path / "acceptance.json").read_text())
    dr2 = doc2["results"]["drafter"]
    assert dr2["steps"] == dr2["resumed_from"] == 3 and dr2["steps_this_run"] == 0
    assert dr2["data"] == dr["data"] and dr2["segments"] == dr["segments"] and dr2["train_config"] == dr["train_config"]
    assert dr2["this_run_data"]["sequences"] == 4 != dr["data"]["sequences"]
    assert "trained no step" in dr2["this_run_note"]
    assert doc2["results"]["rows"] == [] and len(doc2["results"]["skipped"]) == 2 * 2 * 2
    assert doc2["notes"].startswith("PARTIAL: 0 points measured, 8 skipped")


def test_acceptance_for_and_reading_on_a_constructed_doc():
    from workbench.acceptance.figures import reading
    from workbench.acceptance.measure import acceptance_for
    from workbench.validation import InvalidParameter

    rows = [{"text_type": "math", "block": 16, "budget": k, "mean_accepted": a, "prompts": 4, "rounds": 30,
             "histogram": [10, 10, 10] + [0] * 13} for k, a in ((1, 2.0), (8, 2.4), (32, 2.6), (128, 2.65))]
    doc = {"results": {"rows": rows}}
    assert acceptance_for("math", 16, 32, doc=doc) == 2.6
    with pytest.raises(InvalidParameter, match="text_type"):
        acceptance_for("prose", 16, 32, doc=doc)
    with pytest.raises(InvalidParameter, match=r"\(16, 128\)"):
        acceptance_for("math", 8, 32, doc=doc)
    text = reading(doc)
    assert "1.30x the chain at budget 32" in text and "goal (math, budget 32 >= 1.25 x chain): met" in text
    assert "gains < 5% past budget 32" in text and "on 4 held-out prompt(s) per text type" in text
    assert "the longest accepted run was 3 token(s); below every reference line" in text and "over-fitting" not in text
