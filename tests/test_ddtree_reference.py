"""CPU tests of the DDTree references (topk_logprobs, build_tree, accept_greedy)."""
import itertools

import numpy as np
import pytest

from workbench.ddtree import accept_greedy, build_tree, topk_logprobs, tree_size
from workbench.ddtree.reference import DraftTree


def _rand_grid(rng, L, K, quant=None):
    lp = -np.abs(rng.standard_normal((L, K))).astype(np.float32) * 3
    if quant:
        lp = (np.round(lp * quant) / quant).astype(np.float32)
    lp = -np.sort(-lp, axis=1)
    ids = rng.integers(0, 1000, size=(L, K))
    return lp.astype(np.float32), ids


def _chain_score(lp, path):
    """Score of a rank path by the incremental formulas (first, sibling, child)."""
    lp = lp.astype(np.float64)
    s = lp[0, 0]
    for d, r in enumerate(path):
        if d > 0:
            s = s + lp[d, 0]
        for j in range(r):
            s = (s - lp[d, j]) + lp[d, j + 1]
    return s


def _check_invariants(tree: DraftTree, lp, ids, budget):
    L, K0 = lp.shape
    K = min(budget, K0)
    n = tree.n
    assert n == tree_size(L, K0, budget)
    assert tree.parents[0] == -1 and tree.depths[0] == 0
    for arr in (tree.tokens, tree.parents, tree.depths, tree.ranks):
        assert arr.dtype == np.int64 and arr.shape == (n,)
    assert tree.scores.dtype == np.float32
    assert np.all(tree.parents[1:] < np.arange(1, n))          # parent < child
    assert np.all(tree.parents[1:] >= 0)
    assert np.all(tree.depths[1:] == tree.depths[tree.parents[1:]] + 1)  # prefix-closed
    assert np.all(np.diff(tree.scores[1:]) <= 0)               # non-increasing pop order
    assert np.all((tree.ranks[1:] >= 0) & (tree.ranks[1:] < K))
    paths = [tree.rank_path(i) for i in range(n)]
    assert len(set(paths)) == n                                # every node distinct
    for i in range(1, n):
        assert paths[tree.parents[i]] == paths[i][:-1]
        # prefix-closed over siblings too: rank r>0 means rank r-1 sibling exists
        if paths[i][-1] > 0:
            assert paths[i][:-1] + (paths[i][-1] - 1,) in set(paths)
        assert tree.tokens[i] == ids[tree.depths[i] - 1, tree.ranks[i]]
    grid = sum(K ** d for d in range(1, L + 1))
    if grid >= budget:
        assert n == budget + 1


def test_hand_made_tree():
    lp = np.array([[-0.1, -2.0], [-0.2, -3.0]], dtype=np.float32)
    ids = np.array([[10, 11], [20, 21]])
    t = build_tree(lp, ids, budget=3, root_token=7)
    assert t.tokens.tolist() == [7, 10, 20, 11]
    assert t.parents.tolist() == [-1, 0, 1, 0]
    assert t.depths.tolist() == [0, 1, 2, 1]
    assert t.ranks.tolist() == [-1, 0, 0, 1]
    np.testing.assert_array_equal(t.scores, np.float32([0, -0.1, np.float64(np.float32(-0.1))
                                                        + np.float64(np.float32(-0.2)), -2.0]))
    vis = t.visibility()
    assert vis.tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]]
    assert t.positions(100).tolist() == [100, 101, 102, 101]


def test_all_ties_break_by_rank_path():
    # equal scores everywhere: the heap falls back to the lexicographic rank path
    lp = np.zeros((3, 3), dtype=np.float32)
    ids = np.arange(9).reshape(3, 3)
    t = build_tree(lp, ids, budget=5)
    assert [t.rank_path(i) for i in range(6)] == [(), (0,), (0, 0), (0, 0, 0), (0, 0, 1), (0, 0, 2)]
    assert t.parents.tolist() == [-1, 0, 1, 2, 2, 2]
    assert t.tokens[0] == -1


def test_budget_caps_and_grid_exhaustion():
    lp, ids = _rand_grid(np.random.default_rng(0), 2, 2)
    t = build_tree(lp, ids, budget=100)  # grid allows 2 + 4
    assert t.n == 7
    lp, ids = _rand_grid(np.random.default_rng(1), 1, 5)
    t = build_tree(lp, ids, budget=2)  # K cut to 2, L = 1
    assert t.n == 3 and set(t.ranks[1:].tolist()) == {0, 1}


@pytest.mark.parametrize("quant", [None, 2, 8])
def test_random_invariants(quant):
    rng = np.random.default_rng(42 if quant is None else quant)
    for _ in range(30):
        L = int(rng.integers(1, 16))
        K = int(rng.integers(1, 12))
        budget = int(rng.integers(1, 80))
        lp, ids = _rand_grid(rng, L, K, quant)
        _check_invariants(build_tree(lp, ids, budget), lp, ids, budget)


def test_matches_brute_force_global_order():
    # with quantised log-probs every score operation is exact, so best-first
    # pop order equals a global sort of all grid paths by (-score, path)
    rng = np.random.default_rng(3)
    for _ in range(20):
        L, K = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        budget = int(rng.integers(1, 40))
        lp, ids = _rand_grid(rng, L, K, quant=2)
        Ke = min(K, budget)
        paths = [p for d in range(1, L + 1) for p in itertools.product(range(Ke), repeat=d)]
        paths.sort(key=lambda p: (-_chain_score(lp, p), p))
        t = build_tree(lp, ids, budget)
        assert [t.rank_path(i) for i in range(1, t.n)] == paths[:budget]


def test_tree_inputs_rejected():
    lp = np.array([[-0.1, -2.0]], dtype=np.float32)
    ids = np.array([[1, 2]])
    with pytest.raises(ValueError, match="budget"):
        build_tree(lp, ids, 0)
    with pytest.raises(ValueError, match="sorted"):
        build_tree(lp[:, ::-1].copy(), ids, 2)
    with pytest.raises(ValueError, match="NaN"):
        build_tree(np.float32([[np.nan, -1]]), ids, 2)
    with pytest.raises(ValueError, match="finite"):
        build_tree(np.float32([[-1, -np.inf]]), ids, 2)
    with pytest.raises(ValueError, match="shape"):
        build_tree(lp, np.array([[1, 2, 3]]), 2)
    with pytest.raises(ValueError, match="K >= 1"):
        build_tree(np.zeros((2, 0), np.float32), np.zeros((2, 0), np.int64), 2)
    with pytest.raises(ValueError, match="float32"):
        build_tree(lp.astype(np.float64), ids, 2)
    with pytest.raises(ValueError, match=r"\[L, K\]"):
        build_tree(lp[0], ids[0], 2)


def test_tree_values_rejected_with_the_element_and_the_rule():
    """Log-probs are log q <= 0, token ids are vocabulary indices >= 0, the root token is an id or -1: the error
    names the parameter, the element, the value and what is allowed (workbench.validation.InvalidParameter)."""
    from workbench.validation import InvalidParameter

    lp = np.array([[-0.1, -2.0], [-0.3, -0.4]], dtype=np.float32)
    ids = np.array([[1, 2], [3, 4]])
    with pytest.raises(InvalidParameter, match=r"^logprobs\[1, 0\]=0.5 is not allowed: finite numbers <= 0.0 "
                                               r"\(log-probabilities: log q <= 0\)$"):
        build_tree(np.float32([[-0.1, -2.0], [0.5, -0.4]]), ids, 2)
    with pytest.raises(InvalidParameter, match=r"^token_ids\[0, 1\]=-7 is not allowed: integers >= 0"):
        build_tree(lp, np.array([[1, -7], [3, 4]]), 2)
    with pytest.raises(ValueError, match=r"^token_ids must be integers, got float64$"):
        build_tree(lp, ids.astype(np.float64), 2)
    with pytest.raises(InvalidParameter, match=r"^root_token=-2 is not allowed: an integer >= -1$"):
        build_tree(lp, ids, 2, root_token=-2)
    # log q = 0 (a certain token) is allowed, and so are NumPy integer root tokens
    t = build_tree(np.zeros((2, 2), np.float32), ids, 3, root_token=np.int64(9))
    assert t.tokens[0] == 9 and t.n == 4


def test_topk_logprobs():
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((2, 3, 50)).astype(np.float32)
    logits[0, 0, [4, 9]] = 9.0  # a tie: lower id first
    lp, ids = topk_logprobs(logits, 6)
    assert lp.dtype == np.float32 and ids.dtype == np.int64 and lp.shape == (2, 3, 6)
    assert ids[0, 0, :2].tolist() == [4, 9]
    assert np.all(np.diff(lp, axis=-1) <= 0)
    ref = logits.astype(np.float64)
    ref = ref - np.log(np.exp(ref).sum(-1, keepdims=True))
    np.testing.assert_allclose(lp, np.take_along_axis(ref, ids, -1), atol=1e-5)
    assert set(ids[1, 2].tolist()) == set(np.argsort(-logits[1, 2])[:6].tolist())
    # large vocabulary path (argpartition) agrees with the full sort
    big = rng.standard_normal((2, 5000)).astype(np.float32)
    big[1, [7, 70, 700]] = 4.5
    lp2, ids2 = topk_logprobs(big, 8)
    for row in range(2):
        assert ids2[row].tolist() == np.argsort(-big[row], kind="stable")[:8].tolist()
    with pytest.raises(ValueError, match="k must be"):
        topk_logprobs(big, 0)
    with pytest.raises(ValueError, match="shape"):
        topk_logprobs(big[0], 2)
    # feeds build_tree directly
    t = build_tree(lp[0], ids[0], 10, root_token=3)
    assert t.n == 11


def test_accept_hand_made():
    lp = np.array([[-0.1, -2.0], [-0.2, -3.0]], dtype=np.float32)
    ids = np.array([[10, 11], [20, 21]])
    t = build_tree(lp, ids, budget=3, root_token=7)  # tokens [7, 10, 20, 11]
    a = accept_greedy(t, np.array([10, 20, 99, 5]))
    assert a.nodes.tolist() == [0, 1, 2] and a.length == 3 and a.bonus == 99
    a = accept_greedy(t, np.array([11, 20, 99, 5]))
    assert a.nodes.tolist() == [0, 3] and a.length == 2 and a.bonus == 5
    a = accept_greedy(t, np.array([42, 20, 99, 5]))
    assert a.nodes.tolist() == [0] and a.length == 1 and a.bonus == 42
    assert a.nodes.dtype == np.int64
    with pytest.raises(ValueError, match="shape"):
        accept_greedy(t, np.array([1, 2]))


def test_accept_random_is_root_path():
    rng = np.random.default_rng(11)
    for _ in range(50):
        L, K, budget = int(rng.integers(1, 8)), int(rng.integers(1, 6)), int(rng.integers(1, 40))
        lp, _ = _rand_grid(rng, L, K)
        ids = rng.integers(0, 4, size=(L, K))  # small vocab: long accepts and duplicates
        t = build_tree(lp, ids, budget)
        am = rng.integers(0, 4, size=t.n)
        a = accept_greedy(t, am)
        assert a.nodes[0] == 0 and a.length == len(a.nodes)
        for j in range(1, a.length):
            assert t.parents[a.nodes[j]] == a.nodes[j - 1]
            assert t.tokens[a.nodes[j]] == am[a.nodes[j - 1]]
        last = a.nodes[-1]
        assert a.bonus == am[last]
        kids = np.flatnonzero(t.parents == last)
        assert not np.any(t.tokens[kids] == a.bonus)
