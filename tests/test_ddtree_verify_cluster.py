"""CPU checks of the cluster variant of the tree-verify kernel (impl="cluster"; its GPU parity tests are in
test_ddtree_verify.py)."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from workbench.ddtree import verify as V
from workbench.ddtree import verify_bench as VB
from workbench.ddtree import verify_probe as VPR
from workbench.ddtree.verify_cluster import ROW_CHUNKS, cluster_grid, cluster_plan, half_gather_map


@pytest.mark.parametrize("rb,n_a,n_b", [(1, 1, 1), (1, 7, 7), (2, 3, 0), (5, 26, 26), (5, 25, 32), (5, 22, 33),
                                         (33, 4, 4), (32, 4, 0), (3, 5, 5), (3, 24, 48), (7, 1, 1)])
def test_plan_covers_every_row_block_and_chunk_once(rb, n_a, n_b):
    plan = cluster_plan(rb, n_a, n_b)
    assert plan["grid"] % 2 == 0 and plan["grid"] == cluster_grid(rb, n_a, n_b)
    q = rb & ~1
    want = Counter({(r, g): 1 for r in range(q) for g in range(n_a)})
    if rb & 1:
        want.update({(rb - 1, g): 1 for g in range(n_b)})
    assert Counter((c["row_block"], c["chunk"]) for c in plan["ctas"] if c["mode"] != "idle") == want
    assert plan["idle_ctas"] == plan["grid"] - sum(want.values()) <= 1
    by_cluster: dict[int, list] = {}
    for c in plan["ctas"]:
        by_cluster.setdefault(c["cluster"], []).append(c)
    for a, b in by_cluster.values():
        assert {a["rank"], b["rank"]} == {0, 1}
        # a cluster shares iff both CTAs hold the same chunk of region A, and then both share (the kernel's
        # decision is cluster-uniform: a cluster barrier with one side absent would hang)
        assert (a["mode"] == "shared") == (b["mode"] == "shared")
        if a["mode"] == "shared":
            assert a["chunk"] == b["chunk"] and a["row_block"] != b["row_block"] and a["region"] == "A"
    assert plan["l2_tile_reads"] == plan["shared_ctas"] / 2 + plan["solo_ctas"]


def test_plan_with_fewer_valid_chunks_idles_whole_clusters():
    # batched requests: n_a is an upper bound, CTAs of chunks >= chunk_start[B] return; both CTAs of a
    # region-A cluster then return together
    plan = cluster_plan(5, 10, 10, valid_chunks=7)
    for c in plan["ctas"]:
        assert (c["mode"] == "idle") == (c["chunk"] >= 7)
    assert plan["shared_ctas"] == 28 and plan["solo_ctas"] == 7


def test_plan_at_the_benchmark_points():
    # H = 8 (5 row blocks, 26 chunks at 128k): 104 CTAs share, 26 run solo, L2 reads 0.6x the default's;
    # H = 64 (33 row blocks, 4 chunks): 128 share, 4 solo, 68 / 132 = 0.52x; T = 32, H = 64 (32 row
    # blocks): all share, 0.5x
    p8 = cluster_plan(5, 26)
    assert (p8["shared_ctas"], p8["solo_ctas"], p8["idle_ctas"]) == (104, 26, 0)
    assert p8["l2_ratio"] == pytest.approx(0.6)
    p64 = cluster_plan(33, 4)
    assert (p64["shared_ctas"], p64["solo_ctas"]) == (128, 4) and p64["l2_ratio"] == pytest.approx(68 / 132)
    assert cluster_plan(32, 4, 0)["solo_ctas"] == 0 and cluster_plan(32, 4, 0)["l2_ratio"] == 0.5
    assert cluster_grid(3, 5) == 16 and cluster_plan(3, 5)["idle_ctas"] == 1
    with pytest.raises(ValueError, match="row_blocks"):
        cluster_grid(0, 3)
    with pytest.raises(ValueError, match="n_a"):
        cluster_plan(2, 1.5)
    with pytest.raises(ValueError, match="no CTA"):
        cluster_grid(1, 3, 0)


def test_launch_plan():
    from workbench.ddtree import verify as V
    from workbench.ddtree.verify_cluster import cluster_launch_plan

    def plan(T, H, P, rho, chunk_len=None, single=True):
        rb, clen, n = V._plan(P, 1, T, T * H, 64, 132, chunk_len)
        return (rb, clen, n), cluster_launch_plan(rb, P + T, clen, n, 132, single, rho, chunk_len is not None)

    # solo_ratio 1: the default's chunking in both regions (bit-identical outputs)
    for T, H, P in ((33, 8, 131072), (33, 64, 4096), (32, 64, 131072), (9, 8, 0)):
        (rb, clen, n), p = plan(T, H, P, 1.0)
        assert (p["clen_a"], p["n_a"], p["slots"]) == (clen, n, n)
        assert p["n_b"] == (n if rb & 1 else 0) and p["clen_b"] == clen
    # H = 8, 128k, solo tiles 1.25x: region A 25 chunks of 82 tiles, the solo row block 32 chunks of 65 tiles,
    # 132 CTAs, 32 partial slots per row
    _, p = plan(33, 8, 131072, 1.25)
    assert (p["n_a"], p["clen_a"] // 64, p["n_b"], p["clen_b"] // 64, p["grid"], p["slots"]) == (25, 82, 32, 65, 132, 32)
    assert p["q"] * p["n_a"] + p["n_b"] <= 132
    # H = 64: no SM left for region B beyond the default's split; even row blocks, an explicit chunk_len or a
    # batch keep the default's chunking
    for args in ((33, 64, 131072, 1.25), (32, 64, 131072, 1.25), (33, 8, 131072, 1.25, 640),
                 (33, 8, 131072, 1.25, None, False)):
        (rb, clen, n), p = plan(*args)
        assert (p["clen_a"], p["n_a"]) == (clen, n) and p["n_b"] in (0, n), args
    # every region covers all keys, and the slots hold both regions' chunks
    for T, H, P in ((33, 8, 4096 + 37), (33, 8, 16384), (17, 8, 3000), (33, 5, 20000)):
        _, p = plan(T, H, P, 1.25)
        for c, n in ((p["clen_a"], p["n_a"]), (p["clen_b"], p["n_b"])):
            assert n == -(-(P + T) // c) and c % 64 == 0
        assert p["slots"] == max(p["n_a"], p["n_b"])
    with pytest.raises(ValueError, match="solo_ratio"):
        cluster_launch_plan(5, 1000, 64, 16, 132, True, 0.5)


def test_half_gathers_cover_the_tile_once():
    # the two CTAs of a sharing cluster gather disjoint halves that together are every 16-byte chunk of the
    # 64-key tile exactly once; each thread copies to the partner exactly the chunks it gathered
    both = half_gather_map(0) + half_gather_map(1)
    assert Counter((k, c) for _, k, c in both) == Counter({(k, c): 1 for k in range(64) for c in range(ROW_CHUNKS)})
    for rank in (0, 1):
        m = half_gather_map(rank)
        assert len(m) == 256 * 9 and {k for _, k, _ in m} == set(range(32 * rank, 32 * rank + 32))
        # 8 consecutive threads read one 128-byte line (a column block) of one row per step
        for tid0 in range(0, 256, 8):
            for i in range(9):
                chunks = {c for t, k, c in m if tid0 <= t < tid0 + 8 and c // 8 == i}
                assert chunks == set(range(8 * i, 8 * i + 8))
    with pytest.raises(ValueError, match="rank"):
        half_gather_map(2)


def test_cluster_impl_on_cpu_and_errors():
    inp = V.random_verify_inputs(3, 2, 10, torch.float32, "cpu", seed=4)
    ref, _ = V.verify_attention(**inp)
    o, _ = V.verify_attention(**inp, impl="cluster")  # CPU tensors: the torch path, impl accepted
    assert torch.equal(o, ref)
    assert "cluster" in V._IMPLS and V.auto_impl("bfloat16") != "cluster"
    with pytest.raises(ValueError, match="impl"):
        V.verify_attention(**inp, impl="clusters")
    o, _ = V.verify_attention(**inp, impl="cluster", _cluster_solo_ratio=1.25)  # private switch accepted on a CPU
    assert torch.equal(o, ref)


def test_cluster_variants_named_in_bench_and_probe():
    named = VB._named_variants()
    assert named["cluster"] == {"impl": "cluster"}
    assert named["cluster_diag_gather"]["_options"] == ("-DVERIFY_WG_DIAG=1",)
    assert named["cluster_bal"] == {"impl": "cluster", "_cluster_solo_ratio": 1.25}
    assert "cluster" not in VB.WGMMA_VARIANTS  # the default benchmark run is unchanged
    v = VPR._parse_variants(["default", "cluster", "cg=impl:cluster,-DVERIFY_WG_DIAG=1", "g=-DVERIFY_WG_DIAG=1"])
    assert v == {"default": {}, "cluster": {"impl": "cluster"},
                 "cg": {"_options": ("-DVERIFY_WG_DIAG=1",), "impl": "cluster"},
                 "g": {"_options": ("-DVERIFY_WG_DIAG=1",)}}
    with pytest.raises(SystemExit):
        VPR._parse_variants(["x=impl:cluster,impl:wgmma"])
    kernels = {c["kernel"] for c in VB.CLUSTER_PARITY_CASES}
    assert kernels == {"verify_attention[cluster]", "verify_attention_batched[cluster]"}
    assert {c.get("variant") for c in VB.CLUSTER_PARITY_CASES} == {None, "cluster_bal"}
    rows = VB.verify_parity_rows([dict(kernel="verify_attention[cluster]", nodes=4, heads=2, prefix=9,
                                      dtype="float32")], "cpu")
    assert rows[0]["pass"]


def test_bench_and_probe_write_named_files_with_the_prediction(tmp_path, monkeypatch):
    import json

    from workbench.ddtree.verify_cluster import PREDICTION

    assert "PREDICTION" in PREDICTION and "before any GPU run" in PREDICTION
    res = dict(points=[], parameters={"heads": [8]}, samples={"kernels": {}}, complete=False)
    path = VB._write(res, tmp_path, "ddtree_verify_cluster", PREDICTION)
    doc = json.loads(open(path).read())
    assert path.name == "ddtree_verify_cluster.json" and doc["notes"].endswith(PREDICTION)

    # the probe's CLI on a CPU with its GPU parts replaced: the file is rewritten after every point, and
    # points of the same H and P with different T keep their own samples
    calls = []
    monkeypatch.setattr("workbench.kernels.require_gpu", lambda what: None)
    monkeypatch.setattr(VPR, "minimal_nodes", lambda reps=200: {"nodes_1_ms": 0.01, "nodes_3_ms": 0.01,
                                                                "nodes_1_samples": [0.01]})

    def fake_breakdown(H, P, nodes=33, variants=None, reps=40, seed=0):
        calls.append((H, P, nodes, tuple(variants)))
        pts = {n: dict(prepare=None, attention=0.1, merge=0.01, sum=0.11, call=0.1) for n in variants}
        return {"heads": H, "prefix": P, "nodes": nodes, "kv_sets": 2, "points": pts,
                "samples": {f"{n}.call": [0.1] for n in variants}}

    monkeypatch.setattr(VPR, "launch_breakdown", fake_breakdown)
    rc = VPR.main(["--out", str(tmp_path), "--name", "probe_x", "--points", "64:16384", "64:16384:32", "--sweep",
                   "--variants", "default", "cluster", "--extra-notes", "PRED"])
    assert rc == 0 and calls == [(64, 16384, 33, ("default", "cluster")), (64, 16384, 32, ("default", "cluster"))]
    doc = json.loads((tmp_path / "probe_x.json").read_text())
    assert doc["results"]["complete"] is True and doc["notes"].endswith("PRED")
    assert set(doc["samples"]["breakdown"]) == {"H64_P16384", "H64_P16384_T32"}
    assert all("samples" not in b for b in doc["results"]["breakdown"])
    with pytest.raises(SystemExit):
        VPR.main(["--points", "64"])


@pytest.mark.parametrize("T,H,P,rho,sms,uneven", [
    (33, 8, 500, 1.25, 12, True), (33, 8, 500, 1.5, 20, True), (17, 8, 3000, 1.25, 132, True),
    (33, 8, 4096 + 37, 1.25, 132, True), (33, 8, 700, 1.0, 132, False), (9, 8, 0, 1.0, 132, False),
    (33, 2, 900, 1.25, 30, False), (33, 64, 250, 1.0, 132, False), (4, 16, 200, 1.25, 12, False)])
def test_simulated_call_matches_the_reference(T, H, P, rho, sms, uneven):
    # the plan's regions, chunk lengths, -inf slots and merge, CTA by CTA on a CPU (float64), against the
    # float64 reference; `uneven`: the balanced plan gives the solo row block more, shorter chunks than
    # region A (the merge then sees slots that region A's rows leave at weight 0)
    from workbench.ddtree import verify as V
    from workbench.ddtree.verify_cluster import cluster_launch_plan, simulate_cluster_call

    inp = V.random_verify_inputs(T, H, P, torch.float64, "cpu", seed=T + H + P)
    rb, clen, n = V._plan(P, 1, T, T * H, 64, sms, None)
    plan = cluster_launch_plan(rb, P + T, clen, n, sms, True, rho)
    assert (plan["n_b"] > plan["n_a"]) == uneven, plan
    out, lse = simulate_cluster_call(**inp, plan=plan)
    ref_o, ref_l = V.verify_attention_reference(**inp)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert torch.allclose(out, ref_o, rtol=1e-9, atol=1e-9) and torch.allclose(lse, ref_l, rtol=1e-9, atol=1e-9)


def test_cluster_kernel_arguments():
    # the host passes region A's chunk length in the chunk_len slot, then p_single, parents, n_a, clen_b, n_b:
    # the order of ddtree_verify_wgmma_cluster_bf16's parameters
    import re

    from workbench.kernels import KERNEL_DIR

    args = tuple(f"a{i}" for i in range(15)) + (640, 1.5)  # ... W, chunk_len, scale_log2
    plan = dict(clen_a=704, n_a=24, clen_b=512, n_b=33)
    got = V._cluster_args(args, plan, 16384, "par")
    assert got == tuple(f"a{i}" for i in range(15)) + (704, 1.5, 16384, "par", 24, 512, 33)
    src = (KERNEL_DIR / "ddtree_verify.cu").read_text()
    sig = re.search(r"ddtree_verify_wgmma_cluster_bf16\((.*?)\)\s*\{", src, re.S).group(1)
    assert re.sub(r"\s+", " ", sig) == ("TC_ARGS, long long p_single, const long long* __restrict__ parents, int n_a, "
                                        "int clen_b, int n_b")
    tc = re.search(r"#define TC_ARGS(.*?)\n\n", src, re.S).group(1)
    assert re.sub(r"[\s\\\\]+", " ", tc).strip().endswith("int chunk_len, float scale_log2")
    assert re.sub(r"[\s\\\\]+", " ", tc).count(",") + 1 == len(args)  # 17 shared parameters


def test_tables_show_a_failed_variant():
    # a variant that fails on the device is recorded (status, reason) and shown, the run goes on
    pt = dict(heads=8, nodes=33, prefix=4096, median_ms=0.03, pipelined_ms=0.029, eager_median_ms=0.2, floor_ms=0.003,
              floor_bound="compute", percent_of_floor=10.0, achieved_tflops=80.0, peers={},
              speedup_vs_best_peer=None, faster_than_all_peers=True,
              variants={"cluster": {"status": "failed", "reason": "CUDADriverError: launch failed"},
                        "cluster_bal": {"median_ms": 0.028, "mode": "cuda_graph", "pipelined_ms": 0.027}})
    text = VB.verify_table({"points": [pt]})
    assert "failed" in text and "0.0280" in text
    rows = VB.verify_benchmark_rows({"points": [pt]})
    assert rows[0]["cluster_ms"] is None and rows[0]["cluster_bal_ms"] == 0.028
    res = {"breakdown": [{"heads": 64, "prefix": 16384, "nodes": 32, "points": {
        "default": dict(prepare=None, attention=0.1, merge=0.01, sum=0.11, call=0.1),
        "cluster": dict(prepare=None, attention=None, merge=None, sum=None, call=None, failed="RuntimeError: x")}}]}
    text = VPR.probe_table(res)
    assert "cluster T=32" in text and "FAILED: RuntimeError: x" in text
