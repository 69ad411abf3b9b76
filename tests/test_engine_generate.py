"""Greedy vs DDTree generation (lossless), drafters, KV-pool exhaustion, synthetic models."""
from __future__ import annotations

import pytest
import torch

from workbench.decode import DecodeConfig
from workbench.engine import (DFlashConfig, DFlashDrafter, DraftInput, KVPoolFull, PagedKVCache,
                              ScriptedDrafter, generate, synthetic_model, tiny_config)

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17, 18], [40]]


@pytest.fixture(scope="module")
def model():
    return synthetic_model(tiny_config(), layers=None, dtype=torch.float32, seed=1)


@pytest.fixture(scope="module")
def greedy(model):
    return [r.tokens for r in generate(model, PROMPTS, 24)]


def test_greedy_batched_equals_single_and_prefill_logits(model, greedy):
    assert all(len(t) == 24 for t in greedy)
    alone = generate(model, [PROMPTS[2]], 24)[0]
    assert alone.tokens == greedy[2]
    # the first token is the argmax of a fresh (naive-attention) prefill
    assert greedy[2][0] == int(model(torch.tensor(PROMPTS[2]))[-1].argmax())
    # and token-by-token greedy agrees with re-running the full sequence
    seq = torch.tensor(PROMPTS[0] + greedy[0][:-1])
    assert model(seq)[len(PROMPTS[0]) - 1:].argmax(-1).tolist() == greedy[0]
    st = alone.steps[0]
    assert st.accepted_length == 1 and st.tree_size == 1 and st.batch == 1
    assert set(st.times_ms) >= {"draft", "tree_build", "verify", "accept", "commit", "total"}


@pytest.mark.parametrize("block,budget,p_top,miss_rank,commit,conc,impl", [
    (8, 12, 0.8, None, "scattered", 4, "reference"),
    (4, 1, 0.9, 1, "compacted", 2, "reference"),
    (16, 32, 0.6, 2, "scattered", 3, "reference"),
    (6, 40, 0.3, 1, "compacted", 1, "reference"),
    (16, 8, 1.0, None, "compacted", 4, "reference"),
    (8, 24, 0.7, 1, "scattered", 4, "batched"),
    (12, 16, 0.9, None, "compacted", 3, "batched"),
])
def test_ddtree_is_lossless(model, greedy, block, budget, p_top, miss_rank, commit, conc, impl):
    d = ScriptedDrafter(greedy, model.config.vocab_size, block=block, p_top=p_top, miss_rank=miss_rank, seed=block)
    res = generate(model, PROMPTS[:conc], 24, method="ddtree", drafter=d, block=block, budget=budget,
                   commit=commit, tree_impl=impl)
    for r, want in zip(res, greedy):
        assert r.error is None and r.tokens == want
        assert all(1 <= s.accepted_length <= min(block, budget + 1) for s in r.steps)
        assert all(s.tree_size <= budget + 1 and s.batch >= 1 for s in r.steps)


def test_lossless_with_a_wrong_drafter(model, greedy):
    """A drafter that knows nothing (a random continuation) still gives the greedy output."""
    junk = [[(t * 7 + 3) % model.config.vocab_size for t in g] for g in greedy]
    d = ScriptedDrafter(junk, model.config.vocab_size, block=8, p_top=0.9)
    res = generate(model, PROMPTS, 24, method="ddtree", drafter=d, block=8, budget=16)
    assert [r.tokens for r in res] == greedy


def test_scripted_drafter_acceptance_knob(model, greedy):
    V = model.config.vocab_size
    perfect = ScriptedDrafter(greedy, V, block=8, p_top=1.0)
    res = generate(model, PROMPTS[:2], 22, method="ddtree", drafter=perfect, block=8, budget=7)
    assert all(s.accepted_length == 8 for r in res for s in r.steps[:-1])  # the whole chain, every step
    assert perfect.expected_accepted_length(7) == pytest.approx(8.0)
    never = ScriptedDrafter(greedy, V, block=8, p_top=0.0)
    assert never.expected_accepted_length(16) == pytest.approx(1.0)
    res = generate(model, PROMPTS[:1], 6, method="ddtree", drafter=never, block=8, budget=16)
    assert all(s.accepted_length == 1 for s in res[0].steps)
    p = ScriptedDrafter(greedy, V, block=8, p_top=0.7)
    assert p.expected_accepted_length(7) == pytest.approx(sum(0.7 ** j for j in range(8)))
    # a miss at rank 1 is recovered when the budget holds the (0, .., 0, 1) nodes
    m1 = ScriptedDrafter(greedy, V, block=8, p_top=0.7, miss_rank=1)
    assert m1.expected_accepted_length(7) == pytest.approx(p.expected_accepted_length(7))
    assert m1.expected_accepted_length(64) > p.expected_accepted_length(64) + 0.5
    # the drafted logits rank the true continuation as scripted
    lg = perfect.draft(DraftInput(torch.tensor([greedy[1][0]]), torch.tensor([3]), [1], [1]))
    assert lg.shape == (1, 7, V) and lg[0].argmax(-1).tolist() == greedy[1][1:8]
    with pytest.raises(ValueError, match="p_top has 3 entries"):
        ScriptedDrafter(greedy, V, block=8, p_top=[0.5] * 3)
    with pytest.raises(ValueError, match="miss_rank"):
        ScriptedDrafter(greedy, V, block=8, miss_rank=0)


def test_full_pool_fails_one_request_only(model, greedy):
    # mid-generation: one slot short of what the four requests need; the last to allocate in the
    # final step (request 3) fails, the others finish with their greedy output
    need = sum(len(p) + 23 for p in PROMPTS)
    cache = PagedKVCache.for_model(model, need - 1)
    res = generate(model, PROMPTS, 24, cache=cache)
    assert [r.error is None for r in res] == [True, True, True, False]
    assert "KV pool full: request 3 needs 1 slots, 0 of" in res[3].error
    assert res[3].tokens == greedy[3][:23]
    assert [r.tokens for r in res[:3]] == greedy[:3]
    assert cache.free_slots == cache.num_slots  # everything released at the end
    # at prefill: a prompt that cannot fit fails alone
    prompts = [PROMPTS[0], [5] * 100, PROMPTS[2]]
    res = generate(model, prompts, 24, kv_slots=(5 + 23) + (9 + 23) + 10)
    assert res[1].error is not None and "needs 100 slots" in res[1].error and res[1].tokens == []
    assert res[0].tokens == greedy[0] and res[2].tokens == greedy[2]
    # DDTree: the verify tree's allocation fails for one request, the others stay lossless
    d = ScriptedDrafter(greedy, model.config.vocab_size, block=8, p_top=0.8)
    res = generate(model, PROMPTS, 24, method="ddtree", drafter=d, block=8, budget=16,
                   kv_slots=sum(len(p) + 24 for p in PROMPTS[:3]) + 2 * 17 + 3)
    assert any(r.error for r in res)
    for r, want in zip(res, greedy):
        assert r.tokens == (want if r.error is None else want[:len(r.tokens)])


def test_generate_errors(model, greedy):
    d = ScriptedDrafter(greedy, model.config.vocab_size, block=4)
    with pytest.raises(ValueError, match="method='beam' is not allowed"):
        generate(model, PROMPTS, 4, method="beam")
    with pytest.raises(ValueError, match="needs a drafter"):
        generate(model, PROMPTS, 4, method="ddtree")
    with pytest.raises(ValueError, match="budget=0 is not allowed"):
        generate(model, PROMPTS, 4, method="ddtree", drafter=d, budget=0)
    with pytest.raises(ValueError, match="block 8 needs 7 drafted positions, the drafter produced 3"):
        generate(model, PROMPTS, 4, method="ddtree", drafter=d, block=8)
    with pytest.raises(ValueError, match=r"outside \[0, 96\)"):
        generate(model, [[1, 200]], 4)
    with pytest.raises(ValueError, match="beyond the context limit"):
        generate(model, [[1] * 1000], 100)
    with pytest.raises(ValueError, match="either config= or method"):
        generate(model, PROMPTS, 4, method="greedy", config=DecodeConfig(method="greedy"))
    # a float prompt is refused, not truncated
    with pytest.raises(ValueError, match="prompt 0 must hold integer token ids"):
        generate(model, [[1.7, 2.0]], 4)
    with pytest.raises(ValueError, match="must hold integer token ids, got a torch.float32 tensor"):
        generate(model, torch.tensor([[1.0, 2.0]]), 4)
    with pytest.raises(ValueError, match="prompt 1 must hold integer token ids"):
        generate(model, [[1, 2], torch.tensor([3.5])], 4)


def test_dflash_drafter_forward_load_and_generate(model, greedy, tmp_path):
    cfg = DFlashConfig(hidden_size=model.config.hidden_size, num_layers=2, num_heads=2, head_dim=16,
                       intermediate_size=64, block=6, target_layers=(0, 2), mask_token_id=95, context_window=8)
    d = DFlashDrafter.random(cfg, model, seed=3)
    B, C = 2, 5
    ctx = torch.randn(B, C, 2 * model.config.hidden_size)
    toks = torch.randint(0, 96, (B, 6))
    pos = torch.arange(6)[None].repeat(B, 1) + 5
    cpos = torch.arange(C)[None].repeat(B, 1)
    cm = torch.ones(B, C, dtype=torch.bool)
    lg = d(toks, pos, ctx, cpos, cm)
    assert lg.shape == (B, 5, 96) and torch.isfinite(lg).all()
    # non-causal: changing the last block token changes the first drafted position's logits
    toks2 = toks.clone()
    toks2[:, -1] = (toks2[:, -1] + 1) % 96
    assert not torch.allclose(d(toks2, pos, ctx, cpos, cm)[:, 0], lg[:, 0])
    # masked context rows are ignored
    cm2 = cm.clone()
    cm2[:, 0] = False
    ctx2 = ctx.clone()
    ctx2[:, 0] = 100.0
    assert torch.allclose(d(toks, pos, ctx2, cpos, cm2), d(toks, pos, ctx, cpos, cm2))
    # save / load round trip (shared embedding and head are not stored)
    path = d.save(tmp_path / "dflash.safetensors")
    d2 = DFlashDrafter.load(path, model)
    assert torch.equal(d2(toks, pos, ctx, cpos, cm), lg)
    assert "embed_tokens.weight" not in d.state_dict()
    from safetensors.torch import save_file
    bad = dict(d.state_dict())
    bad["fc.weight"] = torch.zeros(3, 3)
    save_file(bad, str(tmp_path / "bad.safetensors"), metadata={"dflash_config": cfg.to_json()})
    with pytest.raises(ValueError, match=r"tensor fc\.weight has shape \(3, 3\)"):
        DFlashDrafter.load(tmp_path / "bad.safetensors", model)
    # in generate: lossless, and it receives the target's features
    for impl in ("reference", "batched"):
        res = generate(model, PROMPTS[:3], 16, method="ddtree", drafter=d2, block=6, budget=10, tree_impl=impl)
        assert [r.tokens for r in res] == [g[:16] for g in greedy[:3]]
    with pytest.raises(ValueError, match="hidden_size"):
        DFlashDrafter(DFlashConfig(hidden_size=8), model)


def test_synthetic_model_slice():
    cfg = tiny_config(n_routed_experts=16, n_group=1, topk_group=1, num_hidden_layers=6)
    m = synthetic_model(cfg, layers=3, experts=8, seed=2, dtype=torch.float32, int4=True)
    assert len(m.layers) == 3 and m.layers[1].mlp.experts.num_experts == 8 and m.layers[1].mlp.experts.int4
    for name, t in list(m.named_parameters()) + list(m.named_buffers()):
        assert t.abs().sum() > 0, name  # never zero
    lg = m(torch.tensor([1, 2, 3]))
    assert torch.isfinite(lg).all() and lg.std() > 0
    m2 = synthetic_model(cfg, layers=3, experts=8, seed=2, dtype=torch.float32, int4=True)
    assert torch.equal(m2(torch.tensor([1, 2, 3])), lg)  # reproducible
    with pytest.raises(ValueError, match="experts must be in"):
        synthetic_model(cfg, experts=1)
    with pytest.raises(ValueError, match="layers must be in"):
        synthetic_model(cfg, layers=0)


@pytest.mark.gpu
def test_ddtree_lossless_on_gpu(greedy):
    m = synthetic_model(tiny_config(), layers=None, dtype=torch.float32, seed=1, device="cuda")
    g = [r.tokens for r in generate(m, PROMPTS, 24)]
    d = ScriptedDrafter(g, m.config.vocab_size, block=8, p_top=0.8, miss_rank=1, device="cuda")
    for commit, impl in (("scattered", "batched"), ("compacted", "reference")):
        res = generate(m, PROMPTS, 24, method="ddtree", drafter=d, block=8, budget=16, commit=commit,
                       tree_impl=impl)
        assert [r.tokens for r in res] == g


def test_int4_experts_convert_to_the_fragment_layout_once_and_compute_the_same():
    """What prepare() does at load on a GPU whose kernels read the fragment layout, run on the CPU: the packed buffers
    are replaced (not joined) by the fragment ones, the model's device bytes are unchanged, the torch path's output is
    bit-identical and the expert weights dequantise to the same values."""
    cfg = tiny_config(hidden_size=512, moe_intermediate_size=512, n_routed_experts=4, num_experts_per_tok=2,
                      n_group=1, topk_group=1, vocab_size=64)
    m = synthetic_model(cfg, layers=2, seed=5, dtype=torch.float32, int4=True)
    ex = m.layers[1].mlp.experts
    x = torch.randn(3, 512)
    ids, w = m.layers[1].mlp.gate(x)
    before, bytes_before = ex(x, ids, w).detach(), m.device_bytes()
    w_up = ex.expert_weight("up_proj", 2, torch.float32)
    ex.to_fragment_layout()
    names = {n for n, _ in ex.named_buffers()}
    assert ex.layout == "fragments" and names == {"gate_up_frag", "down_frag"}
    assert m.device_bytes() == bytes_before
    assert ex.as_int4_experts().gate_up_frag.data_ptr() == ex.gate_up_frag.data_ptr()
    assert torch.equal(ex(x, ids, w).detach(), before)
    assert torch.equal(ex.expert_weight("up_proj", 2, torch.float32), w_up)
    with pytest.raises(ValueError, match="converted at load"):
        ex.int4_slot("down_proj", "packed", 0)
    with pytest.raises(ValueError, match="only packed INT4 experts"):
        ex.to_fragment_layout()


def test_int4_experts_share_the_moe_kernel_layout():
    """The engine's INT4 storage is a zero-copy workbench.moe.Int4Experts; the moe reference agrees."""
    moe = pytest.importorskip("workbench.moe")
    cfg = tiny_config(n_routed_experts=8, n_group=1, topk_group=1)
    m = synthetic_model(cfg, layers=2, seed=4, dtype=torch.bfloat16, int4=True)
    ex = m.layers[1].mlp.experts
    view = ex.as_int4_experts()
    assert view.gate_up_packed.data_ptr() == ex.gate_up_packed.data_ptr()
    x = torch.randn(5, cfg.hidden_size, dtype=torch.bfloat16)
    ids, w = m.layers[1].mlp.gate(x)
    ours = ex(x, ids, w).float()
    ref = moe.moe_reference(x, ids, w, view).float()
    assert float((ours - ref).norm() / ref.norm()) < 1e-2
