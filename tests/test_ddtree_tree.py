"""Batched tree kernels (build, visibility, accept, commit) and the composed round.

CPU tests exercise the CPU path of the batched wrappers (the references, row by
row) and the composition; `gpu`-marked tests check the CUDA kernels bit for bit
against the references on fresh random inputs, ties included.
"""
import numpy as np
import pytest
import torch

from workbench.ddtree import (GpuAccepted, GpuTrees, accept_greedy, accept_greedy_batched,
                              build_tree, build_trees, commit_compact, commit_scattered,
                              tree_size, tree_visibility)
from workbench.ddtree.compose import (ddtree_round, make_toy_problem, verify_attention_torch)


def _grid(gen, B, L, K, quant=None, device="cpu"):
    lp = -torch.rand(B, L, K, generator=gen) * 6
    if quant:
        lp = torch.round(lp * quant) / quant
    lp = torch.sort(lp, dim=-1, descending=True).values.float()
    ids = torch.randint(0, 50000, (B, L, K), generator=gen)
    return lp.to(device), ids.to(device)


def _assert_same_as_reference(trees, lp, ids, budget, roots):
    lp, ids = lp.cpu().numpy(), ids.cpu().numpy()
    for b in range(lp.shape[0]):
        t = build_tree(lp[b], ids[b], budget, root_token=int(roots[b]))
        got = trees.tree(b)
        for f in ("tokens", "parents", "depths", "ranks"):
            np.testing.assert_array_equal(getattr(got, f), getattr(t, f), err_msg=f"{f} b={b}")
        assert got.scores.tobytes() == t.scores.tobytes()


def test_cpu_path_matches_reference():
    gen = torch.Generator().manual_seed(0)
    lp, ids = _grid(gen, 3, 5, 6, quant=2)
    roots = torch.tensor([1, 2, 3])
    trees = build_trees(lp, ids, 12, root_tokens=roots, validate=True)
    assert trees.tokens.shape == (3, 13)
    _assert_same_as_reference(trees, lp, ids, 12, roots)
    vis = tree_visibility(trees.parents)
    for b in range(3):
        np.testing.assert_array_equal(vis[b].numpy(), trees.tree(b).visibility())
    am = torch.randint(0, 3, (3, 13))
    am[:, 0] = trees.tokens[:, 1]  # make the first step match
    acc = accept_greedy_batched(trees, am)
    for b in range(3):
        a = accept_greedy(trees.tree(b), am[b].numpy())
        assert acc.lengths[b] == a.length and acc.bonus[b] == a.bonus
        assert acc.nodes[b, :a.length].tolist() == a.nodes.tolist()
        assert (acc.nodes[b, a.length:] == -1).all()


def test_cpu_commit():
    gen = torch.Generator().manual_seed(1)
    lp, ids = _grid(gen, 2, 4, 3)
    trees = build_trees(lp, ids, 9)
    am = torch.where(torch.rand(2, 10, generator=gen) < 0.5, 0, 1)
    am[:, 0] = trees.tokens[:, 1]
    acc = accept_greedy_batched(trees, am)
    slots = torch.arange(20).view(2, 10) * 3 + 1
    keep, freed, nfree = commit_scattered(slots, acc)
    for b in range(2):
        ln = int(acc.lengths[b])
        assert keep[b, :ln].tolist() == slots[b, acc.nodes[b, :ln]].tolist()
        kept = set(keep[b, :ln].tolist())
        assert freed[b, :int(nfree[b])].tolist() == [s for s in slots[b].tolist() if s not in kept]
        assert int(nfree[b]) == 10 - ln
    kv = torch.randn(2, 64, 8)  # [layers, S, row]
    orig = kv.clone()
    start = torch.tensor([1, 40])
    commit_compact(kv, slots, acc, start, slot_dim=1)
    for b in range(2):
        ln = int(acc.lengths[b])
        src = slots[b, acc.nodes[b, :ln]]
        assert torch.equal(kv[:, int(start[b]):int(start[b]) + ln], orig[:, src])


def test_build_trees_errors():
    lp = torch.zeros(2, 3, 4)
    ids = torch.zeros(2, 3, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="budget"):
        build_trees(lp, ids, 0)
    with pytest.raises(ValueError, match=r"\[B, L, K\]"):
        build_trees(lp[0], ids[0], 4)
    with pytest.raises(ValueError, match="float32"):
        build_trees(lp.double(), ids, 4)
    with pytest.raises(ValueError, match="shape"):
        build_trees(lp, ids[:, :2], 4)
    with pytest.raises(ValueError, match="sorted"):
        build_trees(-torch.arange(24.0).view(2, 3, 4).flip(-1), ids, 4, validate=True)
    with pytest.raises(ValueError, match="root_tokens"):
        build_trees(lp, ids, 4, root_tokens=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"root_tokens=-2 is not allowed"):
        build_trees(lp, ids, 4, root_tokens=-2)
    with pytest.raises(ValueError, match=r"method='warp' is not allowed: one of 'auto', 'small', 'heap'"):
        build_trees(lp, ids, 4, method="warp")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_build_trees_rejects_positive_logprobs_and_negative_ids(device):
    """Log-probs are log q <= 0 and token ids vocabulary indices >= 0: the error names the element and the rule
    (CPU: always, the reference checks; GPU: with validate=True, which syncs)."""
    lp = torch.full((2, 3, 4), -1.0, device=device)
    ids = torch.zeros(2, 3, 4, dtype=torch.int64, device=device)
    bad = lp.clone()
    bad[1, 2, 0] = 0.25
    with pytest.raises(ValueError, match=r"logprobs\[1, 2, 0\]=0.25 is not allowed: finite numbers <= 0.0"):
        build_trees(bad, ids, 4, validate=True)
    neg = ids.clone()
    neg[0, 1, 3] = -5
    with pytest.raises(ValueError, match=r"token_ids\[0, 1, 3\]=-5 is not allowed: integers >= 0"):
        build_trees(lp, neg, 4, validate=True)


def test_dispatch_tree_build_rule_is_known():
    """Every dispatch table's tree_build rule names builders this module has."""
    import json

    from workbench.dispatch import DISPATCH_DIR
    from workbench.ddtree.tree_gpu import TREE_BUILD_RULES

    for path in sorted(DISPATCH_DIR.glob("*.json")):
        rule = json.loads(path.read_text())["tree_build"]
        assert rule in TREE_BUILD_RULES, f"{path.name}: tree_build={rule!r}, known: {sorted(TREE_BUILD_RULES)}"


def test_compose_round_cpu():
    prob = make_toy_problem(batch=3, L=4, budget=8, prefix=5, heads=2, vocab=64, seed=3)
    res = ddtree_round(prob, verify="torch")
    n = res.trees.n
    assert res.target_argmax.shape == (3, n)
    for b in range(3):
        tr = res.trees.tree(b)
        a = accept_greedy(tr, res.target_argmax[b].numpy())
        assert int(res.accepted.lengths[b]) == a.length and int(res.accepted.bonus[b]) == a.bonus
        assert int(res.n_free[b]) == n - a.length


def test_verify_attention_torch_matches_loop():
    g = torch.Generator().manual_seed(4)
    B, T, H, P, S = 2, 5, 3, 4, 30
    ql, qr = torch.randn(B, T, H, 512, generator=g), torch.randn(B, T, H, 64, generator=g)
    kv = torch.randn(S, 576, generator=g)
    ps = torch.randint(0, S, (B, P), generator=g)
    tail = torch.randn(B, T, 576, generator=g)
    parents = torch.tensor([[-1, 0, 0, 1, 2], [-1, 0, 1, 2, 3]])
    vis = tree_visibility(parents)
    out, lse = verify_attention_torch(ql, qr, kv, ps, tail, vis, 0.1)
    for b in range(B):
        for t in range(T):
            keys = torch.cat([kv[ps[b]], tail[b][vis[b, t]]]).double()
            q = torch.cat([ql[b, t], qr[b, t]], -1).double()
            s = q @ keys.T * 0.1
            p = torch.softmax(s, -1)
            torch.testing.assert_close(out[b, t].double(), p @ keys[:, :512], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(lse[b, t].double(), torch.logsumexp(s, -1),
                                       rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------------------
# GPU parity (bit-exact), skipped without CUDA
# ---------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("method", ["auto", "small", "heap"])
@pytest.mark.parametrize("B,L,K,budget,quant", [(64, 15, 32, 32, None), (8, 7, 8, 8, 2),
                                                  (16, 15, 64, 256, 4), (4, 32, 1024, 1024, 8),
                                                  (5, 3, 40, 1024, None), (3, 1, 5, 9, 1),
                                                  (64, 7, 32, 32, 2), (9, 32, 8, 31, 1),
                                                  (6, 4, 50, 20, 2), (5, 32, 16, 3, None),
                                                  (7, 1, 32, 1000, 1), (4, 5, 32, 32, 1)])
def test_gpu_build_bit_exact(B, L, K, budget, quant, method):
    gen = torch.Generator().manual_seed(B * 1000 + budget)
    lp, ids = _grid(gen, B, L, K, quant, device="cuda")
    roots = torch.randint(0, 100, (B,)).cuda()
    n = tree_size(L, K, budget)
    if method == "small" and n - 1 > 32:
        with pytest.raises(ValueError, match="small"):
            build_trees(lp, ids, budget, method=method)
        return
    poison = GpuTrees(*(torch.full((B, n), -7, dtype=torch.int64, device="cuda") for _ in range(4)),
                      torch.full((B, n), float("nan"), device="cuda"))
    trees = build_trees(lp, ids, budget, root_tokens=roots, method=method, out=poison)
    assert trees.tokens.data_ptr() == poison.tokens.data_ptr()
    torch.cuda.synchronize()
    _assert_same_as_reference(trees, lp, ids, budget, roots.cpu())
    vis = trees.visibility()
    for b in range(min(B, 4)):
        np.testing.assert_array_equal(vis[b].cpu().numpy(), trees.tree(b).visibility())


@pytest.mark.gpu
def test_gpu_auto_follows_the_dispatch():
    from workbench.ddtree.tree_gpu import TREE_BUILD_RULES, dispatched_build_method
    from workbench.dispatch import dispatch_for

    small, large = TREE_BUILD_RULES[dispatch_for(torch.cuda.get_device_name()).tree_build]
    assert dispatched_build_method(32) == small and dispatched_build_method(33) == large


@pytest.mark.gpu
@pytest.mark.parametrize("method,budget", [("heap", 200), ("small", 32), ("heap", 32)])
def test_gpu_build_all_ties(method, budget):
    lp = torch.zeros(3, 6, 4, device="cuda")
    ids = torch.arange(72, device="cuda").view(3, 6, 4)
    trees = build_trees(lp, ids, budget, method=method)
    _assert_same_as_reference(trees, lp, ids, budget, [-1, -1, -1])


@pytest.mark.gpu
@pytest.mark.parametrize("B,budget", [(64, 32), (7, 300)])
def test_gpu_accept_and_commit(B, budget):
    gen = torch.Generator().manual_seed(budget)
    lp, ids = _grid(gen, B, 15, 8, device="cuda")
    ids = ids % 3  # tiny vocabulary: long accepts and duplicate children
    trees = build_trees(lp, ids, budget)
    n = trees.n
    am = torch.randint(0, 3, (B, n), generator=gen).cuda()
    poison = GpuAccepted(torch.full((B, n), -7, dtype=torch.int64, device="cuda"),
                         torch.full((B,), -7, dtype=torch.int64, device="cuda"),
                         torch.full((B,), -7, dtype=torch.int64, device="cuda"))
    acc = accept_greedy_batched(trees, am, out=poison)
    cpu = accept_greedy_batched(type(trees)(*(t.cpu() for t in (trees.tokens, trees.parents,
                                                                   trees.depths, trees.ranks,
                                                                   trees.scores))), am.cpu())
    assert torch.equal(acc.nodes.cpu(), cpu.nodes)
    assert torch.equal(acc.lengths.cpu(), cpu.lengths) and torch.equal(acc.bonus.cpu(), cpu.bonus)
    slots = torch.randperm(B * n * 2)[: B * n].view(B, n).cuda()
    keep, freed, nfree = commit_scattered(slots, acc)
    k2, f2, n2 = commit_scattered(slots.cpu(), cpu)
    assert torch.equal(keep.cpu(), k2) and torch.equal(freed.cpu(), f2) and torch.equal(nfree.cpu(), n2)
    # compaction in place where sources and destinations overlap
    S = B * n
    kv = torch.randn(3, S, 576, device="cuda").to(torch.bfloat16)
    slots_c = torch.arange(S, device="cuda").view(B, n)
    ref = kv.cpu().clone()
    commit_compact(ref, slots_c.cpu(), cpu, slots_c[:, 0].cpu(), slot_dim=1)
    commit_compact(kv, slots_c, acc, slots_c[:, 0].contiguous(), slot_dim=1)
    assert torch.equal(kv.cpu(), ref)


@pytest.mark.gpu
def test_gpu_round_no_sync_and_graph():
    from workbench.ddtree.compose import capture_round, check_no_host_sync

    prob = make_toy_problem(batch=8, L=7, budget=32, prefix=256, heads=8, vocab=1024,
                            dtype="bfloat16", device="cuda")
    eager = ddtree_round(prob, verify="torch")
    res = check_no_host_sync(prob, verify="torch")
    assert torch.equal(res.accepted.nodes, eager.accepted.nodes)
    g, cap = capture_round(prob, verify="torch")
    prob.drafter_logits.copy_(torch.randn_like(prob.drafter_logits) * 3)
    g.replay()
    again = ddtree_round(prob, verify="torch")
    torch.cuda.synchronize()
    assert torch.equal(cap.trees.tokens, again.trees.tokens)
    assert torch.equal(cap.accepted.nodes, again.accepted.nodes)


def test_bench_helpers_on_cpu(tmp_path):
    from workbench.bench import ddtree as bench

    lp, ids = bench.random_grid(np.random.default_rng(0), 3, 4, 5, quant=2)
    assert lp.dtype == np.float32 and (lp <= 0).all() and (np.diff(lp, axis=-1) <= 0).all()
    assert ids.dtype == np.int64 and ids.min() >= 0
    (tmp_path / "memcheck.log").write_text("sanitize driver done\n========= ERROR SUMMARY: 0 errors\nexit=0\n")
    (tmp_path / "racecheck.log").write_text("========= RACECHECK SUMMARY: 3 hazards displayed (3 errors, 0 warnings)\n"
                                            "exit=1\n")
    r = bench.read_sanitizer_logs(tmp_path)
    assert r["memcheck"]["errors"] == 0 and r["memcheck"]["driver_done"] and r["memcheck"]["returncode"] == 0
    assert r["racecheck"]["errors"] == 3 and not r["racecheck"]["driver_done"] and r["racecheck"]["returncode"] == 1
    assert r["racecheck"]["command"].startswith("compute-sanitizer --tool racecheck")
