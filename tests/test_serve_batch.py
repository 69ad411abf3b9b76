"""Continuous batching (workbench.engine.batch.Batch): requests admitted and retired between steps decode
exactly generate()'s greedy / DDTree tokens, whatever joined or left around them, and every slot is free after."""
from __future__ import annotations

import pytest
import torch

from workbench.decode import DecodeConfig
from workbench.engine import DecodeEngine, KVPoolFull, ScriptedDrafter, generate, synthetic_model, tiny_config
from workbench.engine.batch import Batch

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17, 18], [40], [3, 3, 3], [50, 60]]
NEW = [12, 7, 15, 9, 4, 10]


@pytest.fixture(scope="module")
def model():
    return synthetic_model(tiny_config(), layers=None, dtype=torch.float32, seed=1)


@pytest.fixture(scope="module")
def want(model):
    return [generate(model, [p], n)[0].tokens for p, n in zip(PROMPTS, NEW)]


def _run(batch, schedule, steps_limit=200):
    """schedule: step index -> prompt indices to add before that step; returns tokens by prompt index."""
    got, reqs, streamed = {}, {}, {}
    for k in range(steps_limit):
        for i in schedule.get(k, ()):
            reqs[i] = batch.add(PROMPTS[i], NEW[i])
            streamed[i] = []
        events = batch.step()
        for i, r in reqs.items():
            streamed[i] += events.get(r, [])
        if len(reqs) == len(PROMPTS) and all(r.done for r in reqs.values()):
            break
    for i, r in reqs.items():
        assert r.error is None and r.finish == "length"
        assert streamed[i] == r.tokens  # the per-step events add up to the output
        got[i] = r.tokens
    return got, reqs


@pytest.mark.parametrize("schedule", [
    {0: range(6)},                       # all at once (bucket 8 with padding rows)
    {0: [0], 2: [1, 2], 5: [3], 6: [4, 5]},  # staggered: joins while others decode
    {0: [2], 1: [4], 3: [0, 1, 3], 9: [5]},  # row 1 (prompt 4) retires early, its row is reused
])
def test_greedy_tokens_independent_of_admission(model, want, schedule):
    e = DecodeEngine(model, max_requests=8, capacity=64, kv_slots=400, max_generated=32)
    b = Batch(e)
    got, _ = _run(b, schedule)
    assert [got[i] for i in range(len(PROMPTS))] == want
    assert b.slots_used() == 0 and b.slots_free() == 400 and not b.live
    assert int(e.cache.lengths.sum()) == 0


def test_ddtree_tokens_independent_of_admission(model, want):
    block, budget = 6, 10
    e = DecodeEngine(model, max_requests=4, capacity=64, max_generated=32)
    # request ids (0, 1, 2, ...) follow admission order: the script for id k is prompt order[k]'s continuation
    order = [3, 0, 5, 1]
    d = ScriptedDrafter([want[i] for i in order], model.config.vocab_size, block=block, p_top=0.8, seed=2)
    b = Batch(e, DecodeConfig(method="ddtree", block=block, budget=budget), d)
    reqs = {}
    for k in range(100):
        if k == 0:
            reqs[3] = b.add(PROMPTS[3], NEW[3])
            reqs[0] = b.add(PROMPTS[0], NEW[0])
        if k == 2:
            reqs[5] = b.add(PROMPTS[5], NEW[5])
        if k == 3:
            reqs[1] = b.add(PROMPTS[1], NEW[1])
        b.step()
        if len(reqs) == 4 and all(r.done for r in reqs.values()):
            break
    for i, r in reqs.items():
        assert r.error is None and r.tokens == want[i]
    assert max(r.mean_accepted_length for r in reqs.values()) > 1.5  # the tree accepted drafted tokens
    assert b.slots_used() == 0


def test_cancel_frees_slots_and_leaves_others_unchanged(model, want):
    e = DecodeEngine(model, max_requests=4, capacity=64, kv_slots=200, max_generated=32)
    b = Batch(e)
    keep = b.add(PROMPTS[2], NEW[2])
    drop = b.add(PROMPTS[0], NEW[0])
    b.step()
    b.step()
    used = b.slots_used()
    assert used == len(PROMPTS[2]) + len(PROMPTS[0]) + 2 * 2  # prompts + one slot per step each
    b.cancel(drop)
    assert drop.finish == "cancelled" and b.slots_used() == used - len(PROMPTS[0]) - 2
    while not keep.done:
        b.step()
    assert keep.tokens == want[2] and b.slots_used() == 0


def test_pool_full_and_context_limit_refused_without_harm(model, want):
    e = DecodeEngine(model, max_requests=2, capacity=32, kv_slots=36, max_generated=32)
    b = Batch(e)
    a = b.add(PROMPTS[2], NEW[2])
    with pytest.raises(ValueError, match="context limit"):
        b.add(list(range(1, 30)), 10)
    with pytest.raises(KVPoolFull):
        b.add(list(range(1, 29)), 1)  # 28 prompt slots; 9 of 36 are taken
    other = b.add(PROMPTS[1], NEW[1])
    with pytest.raises(RuntimeError, match="rows"):
        b.add(PROMPTS[3], 2)
    while not (a.done and other.done):
        b.step()
    assert a.tokens == want[2] and other.tokens == want[1] and b.slots_used() == 0


@pytest.mark.parametrize("chunk", [1, 4])
def test_chunked_prefill_equals_generate_and_lets_others_step(model, want, chunk):
    """prefill_chunk=K: a long prompt is prefilled K tokens per step boundary while the live request keeps
    stepping; every output still equals generate()'s."""
    e = DecodeEngine(model, max_requests=4, capacity=64, kv_slots=300, max_generated=32)
    b = Batch(e, prefill_chunk=chunk)
    first = b.add(PROMPTS[0], NEW[0])  # 5 tokens: ceil(5 / chunk) boundaries to join
    while first.row not in b.live:
        assert not first.steps
        b.step()
    long = b.add(PROMPTS[2], NEW[2])  # 9 tokens: ceil(9 / chunk) boundaries before it joins
    joins = -(-len(PROMPTS[2]) // chunk)
    steps_before = len(first.steps)
    for _ in range(joins - 1):
        ev = b.step()
        assert long not in ev and long.row not in b.live and b.busy
    assert len(first.steps) == steps_before + joins - 1  # the live request stepped meanwhile
    while not (first.done and long.done):
        b.step()
    assert first.tokens == want[0] and long.tokens == want[2] and b.slots_used() == 0
    with pytest.raises(ValueError, match="prefill_chunk"):
        Batch(e, prefill_chunk=0)


def test_chunked_prefill_ddtree_with_dflash_features(model, want):
    """DDTree with a DFlash drafter (it reads the prompt's target features): the chunks' features are joined
    before the drafter admits the request; tokens equal generate()'s."""
    from workbench.engine import DFlashConfig, DFlashDrafter

    cfg = DFlashConfig(hidden_size=model.config.hidden_size, num_layers=1, num_heads=2, head_dim=16,
                       intermediate_size=64, block=5, target_layers=(0, 2), mask_token_id=95, context_window=8)
    d = DFlashDrafter.random(cfg, model, seed=3)
    dc = DecodeConfig(method="ddtree", block=5, budget=8)
    e = DecodeEngine(model, max_requests=2, capacity=64, max_generated=32)
    b = Batch(e, dc, d, prefill_chunk=3)
    reqs = [b.add(PROMPTS[i], NEW[i]) for i in (2, 1)]
    while not all(r.done for r in reqs):
        b.step()
    assert [r.tokens for r in reqs] == [want[2], want[1]]
    w = generate(model, [PROMPTS[2]], NEW[2], config=dc, drafter=d)[0]
    assert [s.accepted_length for s in reqs[0].steps] == [s.accepted_length for s in w.steps]


def test_reservation_admits_worst_cases_that_fit_and_refuses_the_rest(model, want):
    """DDTree: a request reserves prompt + max_new + the tree size; two that fit the pool exactly are admitted and
    decode to generate()'s tokens with no pool failure; one more slot is refused (KVPoolFull) before anything is
    taken; finished requests return their reservation."""
    cfg = DecodeConfig(method="ddtree", block=4, budget=6)
    d = ScriptedDrafter([want[0], want[1]], model.config.vocab_size, block=4, p_top=0.7, seed=0)
    e = DecodeEngine(model, max_requests=4, capacity=64, max_generated=32, kv_slots=64)
    b = Batch(e, cfg, d)
    T = b.step_tokens
    assert T == 7
    w0, w1 = b.worst_case(len(PROMPTS[0]), NEW[0]), b.worst_case(len(PROMPTS[1]), NEW[1])
    assert (w0, w1) == (5 + 12 + T, 3 + 7 + T)
    e = DecodeEngine(model, max_requests=4, capacity=64, max_generated=32, kv_slots=w0 + w1)
    b = Batch(e, cfg, d)
    r0, r1 = b.add(PROMPTS[0], NEW[0]), b.add(PROMPTS[1], NEW[1])
    assert b.reserved == w0 + w1 and b.slots_unreserved() == 0
    used = b.slots_used()
    with pytest.raises(KVPoolFull, match="reserved"):
        b.add([40], 1)
    assert b.slots_used() == used and b.rows_free() == 2
    with pytest.raises(ValueError, match="whole pool"):
        b.check(30, 10)  # 30 + 10 + 7 = 47 slots at worst, beyond the whole pool of 41
    while not (r0.done and r1.done):
        b.step()
    assert r0.error is None and r1.error is None
    assert (r0.tokens, r1.tokens) == (want[0], want[1])
    assert b.reserved == 0 and b.slots_used() == 0


@pytest.mark.parametrize("chunk", [None, 4])
def test_head_of_line_itl_is_finite_and_consistent(model, chunk):
    """The head-of-line measure: every running request gets a token at every boundary; whole-prompt prefill
    takes one boundary, chunking ceil(P / K); times finite and positive; the engine is left empty."""
    from workbench.serve.headofline import head_of_line_sweep

    e = DecodeEngine(model, max_requests=4, capacity=64, max_generated=32)
    (row,) = head_of_line_sweep(e, long_context=24, running=2, running_context=5, chunks=[chunk], warm=2, after=2)
    assert row["boundaries"] == (1 if chunk is None else 6) and row["tokens_each_boundary"]
    vals = [row["baseline_itl_ms"], row["max_itl_ms"], row["after_itl_ms"], row["long_ttft_ms"]]
    assert all(v > 0 and v == v and v < float("inf") for v in vals)
    assert row["max_itl_ms"] == max(row["admission_itl_ms"]) and row["stall_ms"] >= 0
    assert row["long_ttft_ms"] >= sum(row["admission_itl_ms"]) * 0.99
    assert e.cache.num_slots == int(e.cache.top)
