"""Sampling and log-probabilities in the engine (CPU, tiny model).

- DDTree sampling is lossless: for a seed, the tokens equal plain sampling's token for token, at several
  temperatures and with top-k / top-p, whatever the drafter proposes and whatever else is batched.
- The sampled distribution is the target's: the first two generated tokens of many seeds, against the exact
  joint distribution computed from the model's float32 logits, within a total-variation bound that a correct
  sampler exceeds with probability below 1e-6 (Bretagnolle-Huber-Carol); a sampler at the wrong temperature
  exceeds it.
- Log-probabilities equal log_softmax of the eager reference's float32 logits, for generated and prompt tokens,
  and DDTree's equal greedy decoding's.
- Near the context limit every admitted request finishes, for every method.
"""
from __future__ import annotations

import math

import pytest
import torch

from workbench.decode import DecodeConfig
from workbench.engine import Batch, DecodeEngine, ScriptedDrafter, generate, synthetic_model, tiny_config
from workbench.engine.request import SamplingParams
from workbench.engine.sampling import choose, gumbel_noise, keep_mask, scale
from workbench.validation import InvalidParameter

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17, 18], [40]]


@pytest.fixture(scope="module")
def model():
    return synthetic_model(tiny_config(), layers=None, dtype=torch.float32, seed=1)


@pytest.fixture(scope="module")
def engine(model):
    return DecodeEngine(model, max_requests=8, capacity=96, max_generated=40)


def run(engine, prompts, n, config, drafter=None, sampling=None):
    b = Batch(engine, config, drafter, reserve=False)
    reqs = [b.add(p, n, sampling=s) for p, s in zip(prompts, sampling)]
    while b.busy:
        b.step()
    assert all(r.error is None for r in reqs)
    return reqs


@pytest.mark.parametrize("temperature,top_p,top_k", [(0.6, 1.0, 0), (1.0, 1.0, 0), (1.0, 0.9, 0), (0.8, 1.0, 5)])
def test_ddtree_sampling_equals_plain_sampling(model, engine, temperature, top_p, top_k):
    samp = [SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=100 + i) for i in range(4)]
    plain = run(engine, PROMPTS, 24, DecodeConfig(method="greedy"), sampling=samp)
    toks = [r.tokens for r in plain]
    assert len({tuple(t) for t in toks}) > 1
    # the same seeds decode again to the same tokens; another seed to others
    assert [r.tokens for r in run(engine, PROMPTS[:2], 24, DecodeConfig(method="greedy"), sampling=samp[:2])] == \
        toks[:2]
    other = [SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=7)]
    assert run(engine, PROMPTS[:1], 24, DecodeConfig(method="greedy"), sampling=other)[0].tokens != toks[0]
    for block, budget, p_top in ((6, 10, 0.7), (8, 24, 0.3)):
        d = ScriptedDrafter(toks, model.config.vocab_size, block=block, p_top=p_top, seed=block)
        tree = run(engine, PROMPTS, 24, DecodeConfig(method="ddtree", block=block, budget=budget), d, samp)
        assert [r.tokens for r in tree] == toks
        assert any(s.accepted_length > 1 for r in tree for s in r.steps)  # the tree accepted sampled tokens


def test_sampling_is_independent_of_the_batch(model, engine):
    """A sampled request's tokens do not depend on what runs beside it (greedy rows, other seeds)."""
    s = SamplingParams(temperature=0.9, seed=5)
    alone = run(engine, PROMPTS[2:3], 20, DecodeConfig(method="greedy"), sampling=[s])[0].tokens
    mixed = run(engine, PROMPTS, 20, DecodeConfig(method="greedy"),
                sampling=[SamplingParams(), SamplingParams(temperature=1.0, seed=9), s, SamplingParams()])
    assert mixed[2].tokens == alone
    assert mixed[0].tokens == generate(model, PROMPTS[:1], 20)[0].tokens  # greedy rows stay the argmax


def _exact_first_two(model, prompt, temperature, top_k):
    """The exact joint distribution of the first two sampled tokens {(t1, t2): p}, from float32 logits."""
    def dist(ids):
        logits = model(torch.tensor(ids))[-1].float()[None]
        scaled = scale(logits, torch.tensor([temperature]))
        keep = keep_mask(scaled, torch.tensor([1.0]), torch.tensor([top_k]))
        return torch.softmax(torch.where(keep, scaled, float("-inf")), -1)[0]

    p1 = dist(prompt)
    return {(a, b): float(p1[a] * q) for a in torch.nonzero(p1).flatten().tolist()
            for b, q in enumerate(dist(prompt + [a]).tolist()) if q > 0}


def _tv_bound(cells: int, n: int, delta: float) -> float:
    """Total variation that the empirical distribution of n draws over ``cells`` outcomes exceeds with probability
    at most ``delta`` (Bretagnolle-Huber-Carol: P(L1 >= e) <= 2^cells exp(-n e^2 / 2))."""
    return 0.5 * math.sqrt(2 * (cells * math.log(2) + math.log(1 / delta)) / n)


def test_sampled_distribution_is_the_targets(model):
    """4,000 seeds x the first two tokens under DDTree sampling against the exact joint distribution."""
    prompt, temperature, top_k, n = [10, 11, 12], 1.0, 4, 4000
    exact = _exact_first_two(model, prompt, temperature, top_k)
    e = DecodeEngine(model, max_requests=64, capacity=32, max_generated=4)
    d = ScriptedDrafter([[0] * 8], model.config.vocab_size, block=4, p_top=0.5, seed=1)
    counts: dict[tuple[int, int], int] = {}
    b = Batch(e, DecodeConfig(method="ddtree", block=4, budget=6), d)
    for start in range(0, n, 64):
        reqs = [b.add(prompt, 2, sampling=SamplingParams(temperature=temperature, top_k=top_k, seed=s))
                for s in range(start, start + 64)]
        while b.busy:
            b.step()
        for r in reqs:
            counts[tuple(r.tokens)] = counts.get(tuple(r.tokens), 0) + 1
    assert set(counts) <= set(exact)
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - p) for k, p in exact.items())
    bound = _tv_bound(len(exact), n, 1e-6)
    assert tv < bound, (tv, bound)
    wrong = _exact_first_two(model, prompt, 0.5, top_k)  # a sampler at the wrong temperature would fail
    assert 0.5 * sum(abs(counts.get(k, 0) / n - wrong.get(k, 0.0)) for k in set(wrong) | set(exact)) > bound


def test_logprobs_match_the_reference(model, engine):
    s = SamplingParams(logprobs=3, prompt_logprobs=2)
    g = run(engine, PROMPTS[:2], 12, DecodeConfig(method="greedy"), sampling=[s, s])
    for r, p in zip(g, PROMPTS[:2]):
        seq = p + r.tokens
        lp = torch.log_softmax(model(torch.tensor(seq)).float(), -1)
        want = [float(lp[len(p) - 1 + i, t]) for i, t in enumerate(r.tokens)]
        assert r.logprobs == pytest.approx(want, abs=1e-4)
        assert [len(t) for t in r.top_logprobs] == [3] * len(r.tokens)
        assert all(t[0][0] == tok for t, tok in zip(r.top_logprobs, r.tokens))  # greedy: its token is the top
        assert r.prompt_logprobs[0] is None and len(r.prompt_logprobs) == len(p)
        assert r.prompt_logprobs[1:] == pytest.approx([float(lp[i, p[i + 1]]) for i in range(len(p) - 1)], abs=1e-4)
        assert all(len(t) == 2 for t in r.prompt_top_logprobs[1:])
    d = ScriptedDrafter([r.tokens for r in g], model.config.vocab_size, block=6, p_top=0.8, seed=2)
    t = run(engine, PROMPTS[:2], 12, DecodeConfig(method="ddtree", block=6, budget=10), d, [s, s])
    for a, b in zip(g, t):
        assert b.tokens == a.tokens
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
        assert [[i for i, _ in x] for x in b.top_logprobs] == [[i for i, _ in x] for x in a.top_logprobs]


def test_chunked_prefill_prompt_logprobs_equal_one_pass(model):
    s = SamplingParams(prompt_logprobs=1)
    e = DecodeEngine(model, max_requests=2, capacity=64, max_generated=8)
    one = run(e, PROMPTS[2:3], 3, DecodeConfig(method="greedy"), sampling=[s])[0]
    b = Batch(e, prefill_chunk=4, reserve=False)
    r = b.add(PROMPTS[2], 3, sampling=s)
    while b.busy:
        b.step()
    assert r.prompt_logprobs[0] is None and r.prompt_logprobs[1:] == pytest.approx(one.prompt_logprobs[1:], abs=1e-5)
    assert r.tokens == one.tokens


@pytest.mark.parametrize("config", [DecodeConfig(method="greedy"), DecodeConfig(method="ddtree", block=8, budget=32),
                                    DecodeConfig(method="ddtree", block=16, budget=12)])
def test_requests_at_the_context_limit_finish(model, config):
    """The longest request the loop admits (prompt + max_new_tokens + extra_slots = capacity) finishes: its last
    step finds room for its whole tree, with the drafter right or wrong."""
    e = DecodeEngine(model, max_requests=2, capacity=64, max_generated=64)
    extra = config.extra_slots(model.config.vocab_size)
    prompt = list(range(1, 9))
    n = 64 - len(prompt) - extra
    greedy = generate(model, [prompt], n)[0].tokens
    for p_top in (0.0, 1.0):
        d = ScriptedDrafter([greedy], model.config.vocab_size, block=config.block, p_top=p_top, seed=3)
        b = Batch(e, config, d if config.method == "ddtree" else None)
        r = b.add(prompt, n)
        while b.busy:
            b.step()
        assert r.error is None and r.tokens == greedy
        with pytest.raises(ValueError, match="context limit 64"):
            b.add(prompt, n + 1)


def test_sampling_params_are_checked():
    with pytest.raises(InvalidParameter, match="temperature=nan"):
        SamplingParams(temperature=float("nan"))
    with pytest.raises(InvalidParameter, match="top_p=0.0 is not allowed"):
        SamplingParams(top_p=0.0)
    with pytest.raises(InvalidParameter, match="logprobs=21 is not allowed"):
        SamplingParams(logprobs=21)
    with pytest.raises(InvalidParameter, match="seed=-1 is not allowed"):
        SamplingParams(seed=-1)


def test_noise_and_choice_are_deterministic_and_masked():
    seed, idx = torch.tensor([1, 1, 2]), torch.tensor([0, 1, 0])
    g = gumbel_noise(seed, idx, 50)
    assert torch.equal(g, gumbel_noise(seed, idx, 50)) and not torch.equal(g[0], g[1]) and not torch.equal(g[0], g[2])
    u = torch.exp(-torch.exp(-gumbel_noise(torch.arange(2000), torch.zeros(2000, dtype=torch.int64), 64)))
    assert abs(float(u.mean()) - 0.5) < 0.01  # Gumbel -> uniform
    logits = torch.randn(3, 50)
    one = torch.ones(3)
    assert torch.equal(choose(logits, torch.zeros(3), one, torch.zeros(3, dtype=torch.int64), seed, idx),
                       logits.argmax(-1))
    top2 = choose(logits, one, one, torch.full((3,), 2), seed, idx)
    assert all(int(t) in logits[i].topk(2).indices.tolist() for i, t in enumerate(top2))
