"""HF target adapter (issue 28 item 1): the verify forward's mask and positions, KV commit, and
DDTree output equal to the model's own greedy decoding, on tiny random Llamas made here."""
import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from workbench.acceptance.target import (HFTarget, ddtree_generate, greedy_generate, tiny_llama,
                                         tree_attention_mask)
from workbench.ddtree import build_tree, topk_logprobs
from workbench.engine.drafters import DFlashConfig, DFlashDrafter, ScriptedDrafter


# transformers' eager attention takes its softmax in float32 (then casts back), so a float64 model agrees
# with itself across different key lengths / masks to about 1e-7, not to float64 rounding
TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def target():
    return HFTarget(tiny_llama(vocab_size=96, hidden_size=32, layers=2, heads=4, kv_heads=2, intermediate=64,
                               seed=1, dtype=torch.float64), capture_layers=(0, 1))


def _tree(seed, L=4, budget=12, V=96):
    g = np.random.default_rng(seed)
    lp, ids = topk_logprobs(g.normal(size=(L, V)).astype(np.float32) * 2, min(budget, V))
    return build_tree(lp, ids, budget, root_token=int(g.integers(V)))


def test_mask_is_prefix_plus_ancestor_closure():
    tree = _tree(0)
    P = 5
    m = tree_attention_mask(tree, P, torch.float32)
    assert m.shape == (1, 1, tree.n, P + tree.n)
    allowed = m[0, 0] == 0
    assert allowed[:, :P].all()
    for i in range(tree.n):
        anc, j = set(), i
        while j >= 0:
            anc.add(j)
            j = int(tree.parents[j])
        assert {int(j) for j in torch.nonzero(allowed[i, P:]).flatten()} == anc
    assert (m[0, 0][~allowed] == torch.finfo(torch.float32).min).all()


def test_verify_logits_equal_sequential_forward_of_each_path(target):
    """One tree forward gives, at every node, the logits of the plain causal forward over prefix + path."""
    prompt = [3, 17, 42, 8, 61, 5]
    tree = _tree(1)
    state, _ = target.prefill(prompt)
    logits, feats = target.verify(state, tree)
    assert logits.shape == (tree.n, 96) and logits.dtype == torch.float32
    assert feats.shape == (tree.n, 64)
    for i in range(tree.n):
        path, j = [], i
        while j >= 0:
            path.append(int(tree.tokens[j]))
            j = int(tree.parents[j])
        ids = torch.tensor([prompt + path[::-1]])
        ref = target.model(input_ids=ids).logits[0, -1].float()
        torch.testing.assert_close(logits[i], ref, **TOL)


def test_commit_keeps_accepted_rows(target):
    prompt = [1, 2, 3, 4]
    tree = _tree(2)
    state, _ = target.prefill(prompt)
    _, feats = target.verify(state, tree)
    leaf = tree.n - 1
    nodes, j = [], leaf
    while j >= 0:
        nodes.append(j)
        j = int(tree.parents[j])
    nodes = nodes[::-1]
    target.commit(state, nodes, tree.n, feats)
    assert state.length == len(prompt) + len(nodes)
    assert state.cache.layers[0].keys.shape[-2] == state.length
    assert state.features.shape == (state.length, 64)
    # the committed cache continues like a fresh prefill of the same tokens
    toks = prompt + [int(tree.tokens[n]) for n in nodes]
    fresh, _ = target.prefill(toks)
    nxt = 7
    torch.testing.assert_close(target.step(state, nxt), target.step(fresh, nxt), **TOL)
    torch.testing.assert_close(state.features, fresh.features, **TOL)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ddtree_equals_greedy(target, seed):
    g = np.random.default_rng(seed)
    prompt = g.integers(0, 96, size=int(g.integers(3, 12))).tolist()
    greedy = greedy_generate(target, prompt, 30)
    hf = target.model.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False)[0, len(prompt):]
    assert greedy.tokens == hf.tolist()
    assert len(set(greedy.tokens)) > 3  # the tiny model does not just repeat a token
    scripted = ScriptedDrafter([greedy.tokens], vocab_size=96, block=6, p_top=0.7, miss_rank=1, seed=seed)
    dflash = DFlashDrafter.random(DFlashConfig(hidden_size=32, num_layers=1, num_heads=2, head_dim=16,
                                               intermediate_size=32, block=6, target_layers=(0, 1)), target, seed=seed)
    accepted_more = False
    for drafter in (scripted, dflash):
        for budget in (1, 4, 16):
            out = ddtree_generate(target, drafter, prompt, 30, budget)
            assert out.tokens == greedy.tokens, (type(drafter).__name__, budget)
            assert out.forwards == len(out.steps)
            assert sum(s.accepted for s in out.steps) >= 29
            accepted_more |= drafter is scripted and budget > 1 and max(s.accepted for s in out.steps) > 2
    assert accepted_more  # the scripted drafter's trees accept several tokens at once
