"""Invariants of the step-cost model and its calibration (CPU, fast)."""
import json
import math

import pytest

from workbench.projection import load_calibration, load_gpu, project, step_terms
from workbench.projection.calibration import moe_points_from_measurement
from workbench.projection.model import (
    StepShape, attention_layer_costs, default_model, expected_distinct_experts, expert_bytes, load_anchors, moe_layer_bytes,
)
from workbench.projection.project import param_ranges
from workbench.projection.scenarios import source_moe_percent, source_step_arithmetic

GPUS = ("rtx-pro-6000", "h200", "b300")


@pytest.fixture(scope="module")
def calib():
    return load_calibration(use_measurements=False)


def _central(calib, gpu):
    return {k: r.central for k, r in param_ranges([gpu], calib, calibrated_overhead=False).items()}


def test_expert_bytes_and_expected_experts():
    cfg = default_model()
    # 3 x 7168 x 2048 INT4 values + one bf16 scale per 32 values
    assert expert_bytes(cfg) == 3 * 7168 * 2048 // 2 + 3 * 7168 * 2048 // 32 * 2
    assert expected_distinct_experts(cfg, 1) == pytest.approx(8)
    assert expected_distinct_experts(cfg, 10_000) == pytest.approx(384)
    e = [expected_distinct_experts(cfg, m) for m in (1, 2, 9, 33, 256)]
    assert e == sorted(e) and e[-1] < 384


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("block,budget,acc", [(8, 8, 4.4), (16, 32, 12), (16, 256, 14)])
def test_more_bandwidth_never_slower(calib, gpu, block, budget, acc):
    bw = load_gpu(gpu).bandwidth_bytes_per_s
    prev = None
    for scale in (0.5, 1, 1.5, 2, 4, 10):
        r = project(gpu, block, budget, acc, calibration=calib, bandwidth_bytes_per_s=bw * scale).tokens_per_s[0]
        if prev is not None:
            for k in ("low", "central", "high"):
                assert r[k] >= prev[k] - 1e-9
        prev = r


@pytest.mark.parametrize("gpu", GPUS)
def test_higher_acceptance_never_slower(calib, gpu):
    res = project(gpu, 16, 32, [1, 2, 4.4, 8, 12, 15.5, 16], calibration=calib)
    for k in ("low", "central", "high"):
        vals = [r[k] for r in res.tokens_per_s]
        assert vals == sorted(vals)
        assert len(set(vals)) == len(vals)
    for r in res.tokens_per_s:  # tokens/s = accepted / step
        assert r["central"] == pytest.approx(r["accept"] / res.step_ms["central"] * 1e3)
        assert r["low"] <= r["central"] <= r["high"]


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("ratio", [1.5, 2, 4, 10])
def test_zero_overhead_bandwidth_speedup_bounded(calib, gpu, ratio):
    bw = load_gpu(gpu).bandwidth_bytes_per_s
    for builder in ("cpu", "gpu"):
        a = project(gpu, 16, 32, 12, calibration=calib, overhead_ms=0, tree_builder=builder)
        b = project(gpu, 16, 32, 12, calibration=calib, overhead_ms=0, tree_builder=builder,
                    bandwidth_bytes_per_s=bw * ratio)
        for k in ("low", "central", "high"):
            speedup = b.tokens_per_s[0][k] / a.tokens_per_s[0][k]
            assert 1 < speedup <= ratio + 1e-9


def test_terms_respond_as_their_formulas(calib):
    gpu = load_gpu("b300")
    params = _central(calib, gpu)
    cfg = default_model()
    shape = StepShape(block=16, budget=32, context=1024)
    t1 = step_terms(shape, gpu, params, calib)
    # bandwidth x2: bandwidth-bound terms halve, link and host terms do not move
    t2 = step_terms(shape, gpu.with_bandwidth(2 * gpu.bandwidth_bytes_per_s), params, calib)
    for name in ("moe", "dense", "draft"):
        assert t2[name] == pytest.approx(t1[name] / 2)
    # 33 nodes x 8 heads over a short prefix is compute-bound: it follows the matrix rate instead
    for name in ("attention", "allreduce", "tree_build", "overhead"):
        assert t2[name] == t1[name]
    mm = f"matmul_flops:{gpu.id}"
    t2b = step_terms(shape, gpu, {**params, mm: 2 * params[mm]}, calib)
    fixed = cfg.num_hidden_layers * params["attention_fixed_us_per_layer"] * 1e-3  # per-call part, ms
    assert t2b["attention"] - fixed == pytest.approx((t1["attention"] - fixed) / 2)
    assert t2b["moe"] == t1["moe"]
    # overhead adds one for one
    t3 = step_terms(shape, gpu, params, calib, overhead_ms=7.5)
    assert sum(t3.values()) - sum(t1.values()) == pytest.approx(7.5)
    # all-reduce: 2 per layer, linear in latency
    lat = f"allreduce_latency_s:{gpu.id}"
    t4 = step_terms(shape, gpu, {**params, lat: params[lat] + 10e-6}, calib)
    assert t4["allreduce"] - t1["allreduce"] == pytest.approx(2 * cfg.num_hidden_layers * 10e-6 * 1e3)
    # CPU tree build: budget x per-node cost
    t5 = step_terms(StepShape(block=16, budget=64, context=1024), gpu, params, calib)
    assert t5["tree_build"] == pytest.approx(2 * t1["tree_build"])
    assert t1["tree_build"] == pytest.approx(32 * params["cpu_tree_us_per_node"] * 1e-3)
    # MoE: E(M) x expert bytes / tp / (bw x copy x fraction), per MoE layer
    frac = calib.moe_fraction(33, params)
    want = (cfg.num_moe_layers * moe_layer_bytes(cfg, 33) / 8
            / (gpu.bandwidth_bytes_per_s * params["copy_fraction:b300"] * frac) * 1e3)
    assert t1["moe"] == pytest.approx(want)
    # tp=1 has no all-reduce
    assert step_terms(StepShape(block=16, budget=32, tp=1), gpu, params, calib)["allreduce"] == 0


def test_moe_term_reproduces_the_source_anchor_times(calib):
    """On the PRO 6000 with one GPU holding the whole layer, the calibrated MoE term is the anchor."""
    pro = load_gpu("rtx-pro-6000")
    params = _central(calib, pro)
    a = load_anchors()["anchors"]
    layers = default_model().num_moe_layers
    for key in ("moe_ms_per_layer_m9", "moe_ms_per_layer_m32"):
        m = a[key]["m"]
        t = step_terms(StepShape(block=16, budget=m - 1, tp=1), pro, params, calib)
        assert t["moe"] / layers == pytest.approx(a[key]["value"], rel=1e-9)


def test_b300_anchor_is_reproduced_by_the_calibration(calib):
    a = load_anchors()["anchors"]
    res = project("b300", 8, 8, a["b300_accept"]["value"], calibration=calib)
    assert res.tokens_per_s[0]["central"] == pytest.approx(a["b300_tokens_per_s"]["value"])
    # the source's 'overhead' is the step minus the MoE term: close to its ~12.5 ms
    ar = source_step_arithmetic()
    assert ar["lumped_overhead_ms"] == pytest.approx(a["source_overhead_ms"]["value"], abs=0.1)
    assert res.lumped_overhead_ms["central"] == pytest.approx(ar["lumped_overhead_ms"], abs=0.05)


def test_source_moe_percent_counts_payload_only():
    """The source's '67-73% of 1.8 TB/s' holds only without the bf16 group scales."""
    lo, hi = load_anchors()["anchors"]["moe_percent_of_peak"]["value"]
    rows = source_moe_percent()
    for r in rows:
        assert lo - 1 <= r["payload_pct_of_1_8"] <= hi + 1
        assert r["with_scales_pct_of_datasheet"] > hi + 3


def test_pro6000_cross_check_brackets_the_measured_baseline(calib):
    """138.7 tok/s (accepted length not stated) is inside the model's range at the B300 anchor's 4.4."""
    a = load_anchors()["anchors"]
    r = project("rtx-pro-6000", 8, 8, a["b300_accept"]["value"], calibration=calib).tokens_per_s[0]
    assert r["low"] <= a["rtx_pro_6000_tokens_per_s"]["value"] <= r["high"]


def _synthetic_moe(tmp_path, frac=0.8, copy_tbs=4.25):
    doc = {"name": "moe_bandwidth", "provenance": {"gpu": "NVIDIA H200"},
           "parameters": {"ms": [1, 9, 32]},
           "results": {"copy": {"gb_per_s": copy_tbs * 1e3},
                       "uniform": [{"m": m, "median_ms_per_layer": 1.0, "percent_of_copy_bandwidth": 100 * frac}
                                   for m in (1, 8, 9, 16, 32, 64)],
                       "skewed": [{"m": m, "percent_of_copy_bandwidth": 10.0} for m in (1, 9, 32)],
                       "peers": [{"m": 9, "kernel": "cublas_bf16", "percent_of_copy_bandwidth": 30.0}]}}
    p = tmp_path / "moe_bandwidth.json"
    p.write_text(json.dumps(doc))
    return p


def test_synthetic_calibration_file(tmp_path):
    p = _synthetic_moe(tmp_path, frac=0.8)
    cal = load_calibration([p], use_measurements=False)
    assert cal.moe_measured == [(m, pytest.approx(0.8)) for m in (1, 8, 9, 16, 32, 64)]
    assert cal.moe_measured_gpu == "h200" and cal.moe_copy_bytes_per_s == pytest.approx(4.25e12)
    h200 = load_gpu("h200")
    assert cal.gpu_overrides(h200)["copy_fraction:h200"].central == pytest.approx(4.25 / 4.8)
    # a lower MoE efficiency than the anchors' makes the MoE term longer by the ratio
    anchors = load_calibration(use_measurements=False)
    a = project("b300", 16, 32, 12, calibration=anchors, overhead_ms=0)
    b = project("b300", 16, 32, 12, calibration=cal, overhead_ms=0)
    fa = anchors.moe_fraction(33, {k: r.central for k, r in a.ranges.items()})
    assert b.breakdown["central"]["moe"] == pytest.approx(a.breakdown["central"]["moe"] * fa / 0.8)
    # the host overhead is fitted with the anchor's own (source) MoE kernel either way
    oa = project("b300", 8, 8, 4.4, calibration=anchors).anchor_overhead_ms["central"]
    ob = project("b300", 8, 8, 4.4, calibration=cal).anchor_overhead_ms["central"]
    assert ob == pytest.approx(oa)
    # via the CLI option too
    c = project("b300", 16, 32, 12, calibration=[str(p)], use_measurements=False, overhead_ms=0)
    assert c.breakdown["central"]["moe"] == pytest.approx(b.breakdown["central"]["moe"])


def test_synthetic_ddtree_kernels_file(tmp_path):
    """The layout workbench.bench.ddtree writes: build_* records and verify points."""
    build = {f"build_B64_L15_budget{b}": {"gpu_graph_ms": g, "gpu_eager_ms": 0.05, "cpu_ms": c, "batch": 64,
                                          "L": 15, "K": b, "budget": b, "method": "warp"}
             for b, g, c in ((8, 0.01, 2.048), (32, 0.02, 8.192))}
    build["build_B64_L15_budget32_heap"] = {"gpu_graph_ms": 0.03, "gpu_eager_ms": 0.06, "cpu_ms": 8.192,
                                            "batch": 64, "budget": 32, "method": "heap"}
    verify = {"points": [{"heads": 8, "nodes": 33, "prefix": p, "median_ms": ms, "floor_ms": fl,
                          "percent_of_floor": 100 * fl / ms,
                          "peers": {"naive_torch": {"status": "ok", "median_ms": 1.0}}}
                         for p, ms, fl in ((4096, 0.11, 0.005), (16384, 0.14, 0.02), (131072, 0.26, 0.08))] +
                        [{"heads": 64, "nodes": 33, "prefix": 4096, "median_ms": 1.0, "floor_ms": 0.9,
                          "percent_of_floor": 90.0}],
              "copy_gb_per_s": 4250.0}
    doc = {"name": "ddtree_kernels", "provenance": {"gpu": "NVIDIA H200"}, "parameters": {},
           "results": {**build, "verify": verify, "parity": [{"kernel": "build_trees", "passed": True}]}}
    p = tmp_path / "ddtree_kernels.json"
    p.write_text(json.dumps(doc))
    cal = load_calibration([p], use_measurements=False)
    assert [p for p, _, _ in cal.attention_measured] == [4096, 16384, 131072]
    fixed, eff = cal.attention_fit      # time = 0.1 ms + 2 x floor
    assert fixed == pytest.approx(0.1) and eff == pytest.approx(0.5)
    assert cal.tree_build_measured == [(8, pytest.approx(0.01)), (32, pytest.approx(0.02))]
    assert cal.cpu_tree_us_per_node_measured == pytest.approx(4.0)  # 8.192 ms / (64 x 32)
    res = project("b300", 16, 32, 12, calibration=cal, tree_builder="gpu", overhead_ms=0)
    assert res.breakdown["central"]["tree_build"] == pytest.approx(0.02)
    assert "attention_fraction_of_floor" not in res.ranges and "gpu_tree_build_ms" not in res.ranges
    # the fitted attention: layers x (fixed + floor / efficiency)
    cfg = default_model()
    gpu = load_gpu("b300")
    params = {k: r.central for k, r in res.ranges.items()}
    nbytes, flops = attention_layer_costs(cfg, 1024, 33, 8)
    floor = max(nbytes / (gpu.bandwidth_bytes_per_s * params["copy_fraction:b300"]),
                flops / (params["matmul_flops:b300"] * params["matmul_fraction:b300"])) * 1e3
    assert res.breakdown["central"]["attention"] == pytest.approx(cfg.num_hidden_layers * (0.1 + floor / 0.5))
    assert res.ranges["cpu_tree_us_per_node"].kind == "measured"
    # verify timings in a separate ddtree_verify file are read too
    v = tmp_path / "ddtree_verify.json"
    v.write_text(json.dumps({"name": "ddtree_verify", "results": verify}))
    cal2 = load_calibration([v], use_measurements=False)
    assert cal2.attention_measured == cal.attention_measured and not cal2.tree_build_measured


def test_unreadable_measurement_falls_back_with_a_note(tmp_path):
    p = tmp_path / "moe_bandwidth.json"
    p.write_text(json.dumps({"name": "moe_bandwidth", "results": {"something": [1, 2, 3]}}))
    cal = load_calibration([p], use_measurements=False)
    assert cal.moe_measured is None and any("anchors" in n for n in cal.notes)
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"name": "unrelated"}))
    with pytest.raises(ValueError, match="allowed measurement names"):
        load_calibration([bad])
    with pytest.raises(FileNotFoundError):
        load_calibration([tmp_path / "missing.json"])


def test_moe_points_skip_peers_and_skewed(tmp_path):
    doc = json.loads(_synthetic_moe(tmp_path, frac=0.9).read_text())
    pts = moe_points_from_measurement(doc)
    assert all(math.isclose(f, 0.9) for _, f in pts)


@pytest.mark.parametrize("kw,match", [
    ({"gpu": "b301"}, "gpu='b301' is not allowed: one of"),
    ({"accept": 17}, r"accept=17 is not allowed: a non-empty list of numbers in \[1, 16\]"),
    ({"accept": 0.5}, r"accept=0.5 is not allowed"),
    ({"accept": []}, r"accept=\[\] is not allowed: a non-empty list"),
    ({"budget": -1}, r"budget=-1 is not allowed: an integer in \[1, 1024\]"),
    ({"budget": 100_000, "tree_builder": "gpu"}, r"budget=100000 is not allowed: an integer in \[1, 1024\]"),
    ({"block": 0}, r"block=0 is not allowed: an integer in \[2, "),
    ({"overhead_ms": -1.0}, "overhead_ms=-1.0 is not allowed: a finite number >= 0"),
    ({"overhead_ms": 1.0, "overhead_cut_ms": 1.0}, "overhead_cut_ms=1.0 is not allowed: None when overhead_ms"),
    ({"context": -5}, r"context=-5 is not allowed: an integer in \[1, 262144\] tokens"),
    ({"context": 100_000_000}, "context=100000000 is not allowed: .*YaRN limit"),
    ({"bandwidth_bytes_per_s": -1.0}, "bandwidth_bytes_per_s=-1.0 is not allowed: a finite number > 0"),
    ({"tree_builder": "fpga"}, "tree_builder='fpga' is not allowed: one of 'cpu', 'gpu'"),
    ({"tp": 3}, "tp=3 is not allowed: an integer that divides the 64 attention heads"),
    ({"tp": 1000}, "tp=1000 is not allowed"),
    ({"anchor_budget": 0}, "anchor_budget=0 is not allowed"),
])
def test_bad_inputs_are_clear_errors(calib, kw, match):
    args = {"gpu": "b300", "block": 16, "budget": 32, "accept": 12, "calibration": calib, **kw}
    with pytest.raises(ValueError, match=match):
        project(**args)


def test_moe_bench_layout(tmp_path):
    """The layout workbench.bench.moe writes: results.rows per (routing, m), copy_gb_per_s, checks."""
    rows = [{"routing": r, "m": m, "bytes_median": 1e9, "ms_median": 0.4, "gb_per_s_median": 2500.0,
             "pct_of_copy": (60.0 if r == "uniform" else 20.0) + m / 10, "floor_ms": 0.3,
             "bf16_cublas_ms_median": 2.0, "speedup_vs_bf16_cublas": 5.0, "timing": "cuda_graph"}
            for r in ("uniform", "skewed") for m in (1, 9, 32, 64)]
    doc = {"name": "moe_bandwidth", "provenance": {"gpu": "NVIDIA H200"},
           "results": {"copy_gb_per_s": 4200.0, "bf16_matmul_tflops": 700.0, "rows": rows,
                       "tuning": {"ms": {"(64, 2)": {"1": 0.1}}, "best": [[1, [64, 2]]]},
                       "checks": [{"m": 9, "routing": "uniform", "ok": True, "rel_err": 1e-3}]}}
    p = tmp_path / "moe_bandwidth.json"
    p.write_text(json.dumps(doc))
    cal = load_calibration([p], use_measurements=False)
    assert cal.moe_measured == [(m, pytest.approx((60 + m / 10) / 100)) for m in (1, 9, 32, 64)]
    assert cal.moe_copy_bytes_per_s == pytest.approx(4.2e12)
    # M = 33 sits between the 32 and 64 points (log-linear)
    f33 = cal.moe_fraction(33, {})
    assert cal.moe_measured[2][1] < f33 < cal.moe_measured[3][1]


def test_engine_step_comparison(tmp_path):
    """The layout of issue 4's engine_step.json, shown beside the model (not fitted)."""
    from workbench.projection.scenarios import engine_step_comparison

    parts = {"attention": 8e8, "dense_mlp": 8e8, "router": 3e7, "shared_experts": 2.6e8,
             "routed_experts": 4.5e9, "lm_head": 2.35e9, "embedding_rows": 4.7e5, "kv_read": 1.9e7}
    doc = {"name": "engine_step", "provenance": {"gpu": "NVIDIA H200"},
           "parameters": {"layers": 4, "experts": 384, "prefix": 4096, "block": 16, "budget": 32, "batch": 1},
           "results": {"ddtree": {"median_ms": {"draft": 3.0, "tree_build": 0.7, "verify": 9.0, "accept": 0.1,
                                                "commit": 0.4, "total": 13.2},
                                  "bytes_by_part": parts},
                       "dflash_draft": {"own_weight_bytes": 2.0e9}, "copy_bandwidth_gbps": 4200.0}}
    p = tmp_path / "engine_step.json"
    p.write_text(json.dumps(doc))
    cal = load_calibration([p], use_measurements=False)
    rows = engine_step_comparison(cal)
    by = {r["part"]: r for r in rows}
    assert by["verify (MoE + dense + attention)"]["measured ms"] == 9.0
    params = {k: r.central for k, r in param_ranges([load_gpu("h200")], cal, calibrated_overhead=False).items()}
    dense_ms = (8e8 + 8e8 + 3e7 + 2.6e8 + 2.35e9) / (4.2e12 * params["dense_fraction_of_copy"]) * 1e3
    assert by["draft"]["model ms"] == pytest.approx((2.0e9 + 2.35e9) / (4.2e12 * params["dense_fraction_of_copy"]) * 1e3)
    assert by["verify (MoE + dense + attention)"]["model ms"] > dense_ms
    assert by["accept + commit"]["measured ms"] == pytest.approx(0.5)
    assert engine_step_comparison(load_calibration(use_measurements=False)) is None


def test_small_m_comparison_replaces_the_points_it_measured(tmp_path):
    """A bench small-M comparison file beside moe_bandwidth: at its M values the dispatched path's uniform % of
    copy replaces the sweep's point; other M keep the sweep; alone it is not used (a note says so)."""
    from workbench.moe.dispatched import dispatched_label
    from workbench.moe.fused import FOUR_LAUNCH

    gpu = "NVIDIA H200"
    rows = [{"routing": r, "m": m, "pct_of_copy": 60.0, "ms_median": 1.0, "bytes_moved": 1e9, "timing": "cuda_graph"}
            for r in ("uniform", "skewed") for m in (1, 9, 32)]
    big = {"name": "moe_bandwidth", "provenance": {"gpu": gpu}, "results": {"copy_gb_per_s": 4200.0, "rows": rows}}
    # each M's row times the path data/dispatch names there (one-launch kernels may differ by M)
    label = {m: dispatched_label(m, 8, gpu) for m in (1, 9)}
    small_rows = [{"routing": r, "m": m, "four_launch_variant": "nt1_rt2_l2",
                   "four_launch_pct_of_copy": 50.0, "four_launch_ms_median": 1.0,
                   **({} if label[m] == FOUR_LAUNCH else
                      {f"{label[m]}_pct_of_copy": 80.0 + m if r == "uniform" else 10.0, f"{label[m]}_ms_median": 1.0})}
                  for r in ("uniform", "skewed") for m in (1, 9)]
    paths = sorted({v for v in label.values() if v != FOUR_LAUNCH}) + [FOUR_LAUNCH]
    small = {"name": "moe_small_test", "provenance": {"gpu": gpu}, "parameters": {"topk": 8, "paths": paths},
             "results": {"rows": small_rows}}
    (tmp_path / "moe_bandwidth.json").write_text(json.dumps(big))
    (tmp_path / "moe_small_test.json").write_text(json.dumps(small))
    cal = load_calibration([tmp_path / "moe_bandwidth.json", tmp_path / "moe_small_test.json"],
                           use_measurements=False)
    expect = {m: 0.50 if label[m] == FOUR_LAUNCH else (80.0 + m) / 100 for m in (1, 9)}
    assert cal.moe_measured == [(1.0, pytest.approx(expect[1])), (9.0, pytest.approx(expect[9])),
                                (32.0, pytest.approx(0.6))]
    assert "moe_small_test.json" in cal.moe_source
    alone = load_calibration([tmp_path / "moe_small_test.json"], use_measurements=False)
    assert alone.moe_measured is None and any("small-M comparison" in n for n in alone.notes)
