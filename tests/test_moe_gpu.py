"""GPU parity of the fused INT4 MoE kernel against the float32 reference (marker ``gpu``)."""
import pytest
import torch

from workbench.moe.bench import check_case, make_routing
from workbench.moe.fused import fused_moe_int4
from workbench.moe.packing import random_int4_experts

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def small():
    return random_int4_experts(16, 1024, 1024, device="cuda", seed=7)


@pytest.mark.parametrize("m,routing", [(1, "uniform"), (5, "skewed"), (16, "uniform"), (40, "skewed"),
                                       (129, "uniform"), (300, "skewed")])
def test_parity_small(small, m, routing):
    res = check_case(small, m, routing, torch.Generator().manual_seed(m), topk=8)
    assert res["nonfinite"] == 0 and res["rel_err"] <= 1e-2, res


@pytest.mark.parametrize("m", [1, 9, 64])
def test_parity_kimi_shape(m):
    ex = random_int4_experts(24, 7168, 2048, device="cuda", seed=m)
    res = check_case(ex, m, "uniform", torch.Generator().manual_seed(m), topk=8)
    assert res["nonfinite"] == 0 and res["rel_err"] <= 1e-2, res


def test_duplicate_ids_and_invalid_id(small):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 16, (11, 8), generator=g, dtype=torch.int32)
    res = check_case(small, 11, "duplicates", g, topk=8, ids=ids)
    assert res["ok"], res
    ids[4, 0] = 16
    x = torch.randn(11, 1024, device="cuda").bfloat16()
    w = torch.full((11, 8), 0.125, device="cuda")
    with pytest.raises(ValueError, match="topk_ids"):
        fused_moe_int4(x, ids.cuda(), w, small)
    out = fused_moe_int4(x, ids.cuda(), w, small, validate=False)
    assert torch.isnan(out[4]).all() and torch.isfinite(out[:4]).all()


def test_deterministic(small):
    g = torch.Generator().manual_seed(9)
    ids, w = make_routing(64, 16, 8, "skewed", g)
    x = torch.randn(64, 1024, device="cuda").bfloat16()
    a = fused_moe_int4(x, ids.cuda(), w.cuda(), small)
    b = fused_moe_int4(x, ids.cuda(), w.cuda(), small)
    assert torch.equal(a, b)


@pytest.mark.parametrize("m", [1, 4, 16, 40])
def test_in_graph_timing_checks_back_to_back_calls(small, m):
    """Calls captured back to back in one graph (the benchmark's in-graph timing) over two weight sets:
    outputs right (checked up to M = 16), a per-call time for every sample, one routing per call."""
    from workbench.moe.bench import IN_GRAPH_CALLS, second_bank, time_ours_in_graph

    banks = [small, second_bank(small, seed=8)]
    res = time_ours_in_graph(banks, m, "skewed", torch.Generator().manual_seed(m), reps=4)
    assert res["calls"] == IN_GRAPH_CALLS and len(res["distinct"]) == IN_GRAPH_CALLS
    assert len(res["ms"]) == 4 and all(t > 0 for t in res["ms"])
    assert res["check"]["checked"] == (m <= 16) and res["check"]["ok"], res["check"]


def test_in_graph_with_gaps_checks_outputs_and_sleep_baseline(small):
    """The probe's form: a sleep kernel after every call inside the graph; outputs still right, and the
    per-call time exceeds the sleep alone."""
    from workbench.moe.bench import time_ours_in_graph, time_sleep_in_graph

    res = time_ours_in_graph([small], 4, "uniform", torch.Generator().manual_seed(4), reps=3, gap_cycles=20_000)
    assert res["check"]["checked"] and res["check"]["ok"], res["check"]
    sleep = time_sleep_in_graph(20_000, reps=3)
    assert len(sleep) == 3 and min(res["ms"]) > sorted(sleep)[1] > 0


def test_queued_timing_is_device_time(small):
    """time_ours(queued=True): one replay queued behind a sleep kernel is not slower than one on an idle GPU
    by more than noise (it leaves the host's launch latency out), and every sample has its routing."""
    from workbench.moe.bench import time_ours

    t = time_ours(small, 4, "uniform", torch.Generator().manual_seed(2), reps=12, eager_reps=0, queued=True)
    assert len(t["queued_ms"]) == 12 == len(t["queued_distinct"]) and all(v > 0 for v in t["queued_ms"])
    med = sorted(t["queued_ms"])[6]
    assert med <= 1.2 * sorted(t["ms"])[6], (t["queued_ms"], t["ms"])


def test_span_timing_is_device_time_of_the_dispatched_launches(small):
    """time_ours(spans=True): the profiler's kernel spans have one sample per replay with its routing, count the
    phased pair's two kernels at M = 1 (nothing else in the graph), and are not longer than one replay on an idle
    GPU (which adds the host's launch latency) beyond noise."""
    from workbench.moe.bench import time_ours

    t = time_ours(small, 1, "uniform", torch.Generator().manual_seed(3), reps=12, eager_reps=0, spans=True)
    assert t["span_error"] is None, t["span_error"]
    assert len(t["span_ms"]) == 12 == len(t["span_distinct"]) and all(v > 0 for v in t["span_ms"])
    assert t["span_kernels"] == 2
    assert sorted(t["span_ms"])[6] <= 1.2 * sorted(t["ms"])[6], (t["span_ms"], t["ms"])


def test_graph_launch_latency_probe():
    from workbench.measure import graph_launch_latency

    lat = graph_launch_latency(reps=20)
    assert len(lat["one_replay_ms"]) == 20 == len(lat["queued_ms"])
    assert 0 < lat["queued_ms_median"] and 0 < lat["one_replay_ms_median"] < 1.0
    assert lat["latency_ms"] == lat["one_replay_ms_median"] - lat["queued_ms_median"]
    assert "raw_error" in lat or (len(lat["raw_one_replay_ms"]) == 20 and lat["raw_one_replay_ms_median"] > 0)


def test_small_path_edge_cases(small):
    from workbench.moe.bench import small_path_edge_checks

    for res in small_path_edge_checks(small, torch.Generator().manual_seed(5), 8):
        assert res["ok"], res


@pytest.fixture
def small_path_on():
    """Force the one-launch path for M * topk <= 128 (SMALL_TABLE may have it off), each M with the kernel
    SMALL_TABLE names there (the default kernel where it names four launches)."""
    from workbench.moe.fused import DEFAULT_SMALL_VARIANT, SMALL_MAX_PAIRS, SMALL_TABLE, set_small_table

    saved = list(SMALL_TABLE)
    rows = [(mx, v or DEFAULT_SMALL_VARIANT) for mx, v in saved]
    set_small_table(rows[:-1] + [(SMALL_MAX_PAIRS, rows[-1][1])])
    yield
    set_small_table(saved)


@pytest.mark.parametrize("m", [4, 16])
def test_small_path_graph_replays(small, m, small_path_on):
    from workbench.moe.bench import check_graph_replay

    res = check_graph_replay(small, m, torch.Generator().manual_seed(m), 8, replays=4)
    assert res["path"] == _small_path(m) and res["ok"], res


def _small_path(m: int) -> str:
    """bench's path label of the one-launch kernel dispatched for M tokens of top-8 (splitk_s4 at M >= 2 and
    ctasplit at M = 1 today)."""
    from workbench.moe.bench import path_name

    p = path_name(m, 8)
    assert p.startswith("small_"), p
    return p


@pytest.mark.parametrize("m", [1, 9])
def test_small_path_parity_kimi_shape(m, small_path_on):
    ex = random_int4_experts(24, 7168, 2048, device="cuda", seed=m)
    res = check_case(ex, m, "uniform", torch.Generator().manual_seed(m), topk=8)
    assert res["path"] == _small_path(m) and res["nonfinite"] == 0 and res["rel_err"] <= 1e-2, res


def test_small_path_matches_four_launch(small, small_path_on):
    from workbench.moe.fused import set_small_path, uses_small_path

    g = torch.Generator().manual_seed(2)
    ids, w = make_routing(16, 16, 8, "skewed", g)
    x = torch.randn(16, 1024, generator=g).bfloat16().cuda()
    assert uses_small_path(16, 8)
    a = fused_moe_int4(x, ids.cuda(), w.cuda(), small)
    set_small_path(False)
    try:
        b = fused_moe_int4(x, ids.cuda(), w.cuda(), small)
    finally:
        set_small_path(True)
    assert float((a.double() - b.double()).norm() / b.double().norm()) < 1e-2


# ---- split-K form of the one-launch kernel (moe_small_splitk_*; splitk_s4 dispatched at M = 2-16, others forced)

SPLITK = ["splitk_s3", "splitk_s4", "splitk_s3_max"]


@pytest.fixture
def splitk_on(request):
    """The one-launch path for M * topk <= 128, with the one-launch kernel named by the test's parameter."""
    from workbench.moe.fused import forced_small_variant

    with forced_small_variant(request.param) as name:
        yield name


@pytest.mark.parametrize("splitk_on", SPLITK, indirect=True)
@pytest.mark.parametrize("m", [1, 2, 9])
def test_splitk_parity_kimi_shape(splitk_on, m):
    ex = random_int4_experts(24, 7168, 2048, device="cuda", seed=m)
    res = check_case(ex, m, "uniform", torch.Generator().manual_seed(m), topk=8)
    assert res["path"] == f"small_{splitk_on}" and res["nonfinite"] == 0 and res["rel_err"] <= 1e-2, res


def _assert_edge_cases_replays_and_determinism(small, edge_seed: int, replay_ms, same_inputs=()) -> None:
    """The forced one-launch kernel on the small experts: small_path_edge_checks (invalid and duplicate ids, every M
    edge) with generator seed ``edge_seed``; replays of one graph at each M of ``replay_ms`` (the kernel's counters
    must be left zero for the next replay); and for each (M, seed, routing) of ``same_inputs`` two calls on the same
    inputs, bit-identical (determinism)."""
    from workbench.moe.bench import check_graph_replay, small_path_edge_checks

    for res in small_path_edge_checks(small, torch.Generator().manual_seed(edge_seed), 8):
        assert res["ok"], res
    for m in replay_ms:
        res = check_graph_replay(small, m, torch.Generator().manual_seed(m), 8, replays=4)
        assert res["ok"], res
    for m, seed, routing in same_inputs:
        g = torch.Generator().manual_seed(seed)
        ids, w = make_routing(m, 16, 8, routing, g)
        x = torch.randn(m, 1024, generator=g).bfloat16().cuda()
        a = fused_moe_int4(x, ids.cuda(), w.cuda(), small)
        b = fused_moe_int4(x, ids.cuda(), w.cuda(), small)
        assert torch.equal(a, b)


@pytest.mark.parametrize("splitk_on", ["splitk_s3_max", "splitk_s4"], indirect=True)
def test_splitk_edge_cases_graph_replays_and_determinism(small, splitk_on):
    # the counters (task, reduction, done) must be left zero for the next replay
    _assert_edge_cases_replays_and_determinism(small, 5, (1, 4), [(2, 4, "uniform")])


@pytest.mark.parametrize("splitk_on", ["splitk_s3"], indirect=True)
def test_splitk_matches_v3(small, splitk_on):
    from workbench.moe.fused import set_small_variant

    g = torch.Generator().manual_seed(12)
    ids, w = make_routing(1, 16, 8, "uniform", g)
    x = torch.randn(1, 1024, generator=g).bfloat16().cuda()
    a = fused_moe_int4(x, ids.cuda(), w.cuda(), small)
    set_small_variant("v3")
    b = fused_moe_int4(x, ids.cuda(), w.cuda(), small)
    set_small_variant(splitk_on)
    assert float((a.double() - b.double()).norm() / b.double().norm()) < 1e-2


# ---- CTA-split form of the one-launch kernel (moe_small_ctasplit; dispatched at M = 1, forced here at every M)

CTASPLIT = ["ctasplit", "ctasplit_max"]   # H = I = 1024: splits (1, 1) and (4, 4) (1 stage per warp, queue 3 ahead)


@pytest.mark.parametrize("splitk_on", SPLITK + CTASPLIT, indirect=True)
@pytest.mark.parametrize("m,routing", [(1, "uniform"), (2, "uniform"), (5, "skewed"), (16, "uniform")])
def test_one_launch_parity_small(small, splitk_on, m, routing):
    """Split-K and CTA-split kernels at the small shapes (H = I = 1024, 16 experts)."""
    res = check_case(small, m, routing, torch.Generator().manual_seed(m), topk=8)
    assert res["path"] == f"small_{splitk_on}" and res["nonfinite"] == 0 and res["rel_err"] <= 1e-2, res


@pytest.mark.parametrize("splitk_on", CTASPLIT, indirect=True)
@pytest.mark.parametrize("m", [1, 2, 9, 16])
def test_ctasplit_parity_kimi_shape(splitk_on, m):
    """Kimi shapes: ctasplit (4, 2) and ctasplit_max (4, 4: down tasks of 2 stages per warp, 2 tasks ahead)."""
    ex = random_int4_experts(24, 7168, 2048, device="cuda", seed=m)
    res = check_case(ex, m, "uniform" if m < 16 else "skewed", torch.Generator().manual_seed(m), topk=8)
    assert res["path"] == f"small_{splitk_on}" and res["nonfinite"] == 0 and res["rel_err"] <= 1e-2, res


@pytest.mark.parametrize("splitk_on", CTASPLIT + ["ctasplit_x4e_r3", "ctasplit_x4e_r3f", "ctasplit_x4e_r3fs",
                                       "ctasplit_x4e_r3fst"], indirect=True)
def test_ctasplit_edge_cases_graph_replays_and_determinism(small, splitk_on):
    # the counters (task, done_gu, done_dn, fin) must be left zero for the next replay
    _assert_edge_cases_replays_and_determinism(small, 5, (1, 4, 16), [(m, 4 + m, "skewed") for m in (2, 16)])


@pytest.mark.parametrize("splitk_on", ["ctasplit"], indirect=True)
def test_ctasplit_matches_splitk_s4_kimi_shape(splitk_on):
    """Same fragments, same gate_up split and part order at M = 1 (4 parts): only down's summation order
    differs (parts before the routing weight here, after it in splitk_s4)."""
    from workbench.moe.fused import set_small_variant

    ex = random_int4_experts(24, 7168, 2048, device="cuda", seed=3)
    g = torch.Generator().manual_seed(13)
    for m in (1, 2):
        ids, w = make_routing(m, 24, 8, "uniform", g)
        x = torch.randn(m, 7168, generator=g).bfloat16().cuda()
        a = fused_moe_int4(x, ids.cuda(), w.cuda(), ex)
        set_small_variant("splitk_s4")
        try:
            b = fused_moe_int4(x, ids.cuda(), w.cuda(), ex)
        finally:
            set_small_variant(splitk_on)
        assert torch.isfinite(a).all()
        assert float((a.double() - b.double()).norm() / b.double().norm()) < 5e-3


@pytest.mark.parametrize("splitk_on", ["ctasplit"], indirect=True)
@pytest.mark.parametrize("m", [1, 3])
def test_ctasplit_parity_split2(splitk_on, m):
    """H = I = 1536 (6 stages): both phases split 2 (two tiles per CTA task, 3 stages per warp), the one split
    the other shapes do not give gate_up."""
    from workbench.moe.ctasplit import ctasplit_splits

    assert ctasplit_splits(1536, 1536) == (2, 2)
    ex = random_int4_experts(8, 1536, 1536, device="cuda", seed=11 + m)
    res = check_case(ex, m, "uniform", torch.Generator().manual_seed(m), topk=8)
    assert res["path"] == f"small_{splitk_on}" and res["nonfinite"] == 0 and res["rel_err"] <= 1e-2, res


@pytest.mark.parametrize("splitk_on", ["splitk_s4x4", "ctasplit_x4", "splitk_s4x4e", "ctasplit_x4e"], indirect=True)
@pytest.mark.parametrize("m", [1, 2, 9, 16])
def test_xprefetch_variants_parity_kimi_shape(splitk_on, m):
    """The activation-prefetch variants (same arithmetic as splitk_s4 / ctasplit): parity at Kimi shapes, and
    bit-identical to their base kernel on the same grid."""
    from workbench.moe.fused import set_small_variant

    ex = random_int4_experts(24, 7168, 2048, device="cuda", seed=m)
    res = check_case(ex, m, "skewed", torch.Generator().manual_seed(m), topk=8)
    assert res["path"] == f"small_{splitk_on}" and res["nonfinite"] == 0 and res["rel_err"] <= 1e-2, res
    g = torch.Generator().manual_seed(60 + m)
    ids, w = make_routing(m, 24, 8, "uniform", g)
    x = torch.randn(m, 7168, generator=g).bfloat16().cuda()
    a = fused_moe_int4(x, ids.cuda(), w.cuda(), ex)
    set_small_variant("ctasplit" if splitk_on.startswith("ctasplit") else "splitk_s4")   # restored by the fixture
    b = fused_moe_int4(x, ids.cuda(), w.cuda(), ex)
    assert torch.equal(a, b)


@pytest.mark.parametrize("splitk_on", ["ctasplit_x4_g2d1", "ctasplit_x4_g1d1", "ctasplit_x4e_g1d1", "ctasplit_x4e_g2d1",
                                       "ctasplit_x4e_g4d1", "ctasplit_x4e_g2d2"], indirect=True)
@pytest.mark.parametrize("m", [1, 2, 9, 16])
def test_ctasplit_x4_fixed_splits_parity_kimi_shape(splitk_on, m):
    """ctasplit_x4 at fixed splits (2, 1) and (1, 1): parity at Kimi shapes, uniform and skewed routing."""
    ex = random_int4_experts(24, 7168, 2048, device="cuda", seed=30 + m)
    for routing in ("uniform", "skewed"):
        res = check_case(ex, m, routing, torch.Generator().manual_seed(m), topk=8)
        assert res["path"] == f"small_{splitk_on}" and res["nonfinite"] == 0 and res["rel_err"] <= 1e-2, res


def _assert_parity_and_equal_to(variant: str, base: str, m: int, experts_seed: int, compare_seed: int,
                                rel_tol: float | None = None) -> None:
    """The forced one-launch kernel ``variant``: parity at Kimi shapes under uniform and skewed routing, then, on one
    more routing (at M = 1 a token routed twice to one expert: an item of two columns), outputs bit-identical to
    ``base``'s (set as the forced kernel here; the splitk_on fixture restores the dispatch), or with ``rel_tol``
    within that relative distance of them by norm."""
    from workbench.moe.fused import set_small_variant

    ex = random_int4_experts(24, 7168, 2048, device="cuda", seed=experts_seed)
    for routing in ("uniform", "skewed"):
        res = check_case(ex, m, routing, torch.Generator().manual_seed(m), topk=8)
        assert res["path"] == f"small_{variant}" and res["nonfinite"] == 0 and res["rel_err"] <= 1e-2, res
    g = torch.Generator().manual_seed(compare_seed)
    ids, w = make_routing(m, 24, 8, "uniform", g)
    if m == 1:
        ids[0, 1] = ids[0, 0]
    x = torch.randn(m, 7168, generator=g).bfloat16().cuda()
    a = fused_moe_int4(x, ids.cuda(), w.cuda(), ex)
    set_small_variant(base)
    b = fused_moe_int4(x, ids.cuda(), w.cuda(), ex)
    assert torch.isfinite(a).all(), variant
    if rel_tol is None:
        assert torch.equal(a, b), variant
    else:
        a, b = a.float(), b.float()
        assert (a - b).norm() <= rel_tol * b.norm(), float((a - b).norm() / b.norm())


# ---- x4e with a 3-stage ring (x4e_r3; run 19's control, then its own comparison)

# each form -> ctasplit_x4e at the same split
R3_BASE = {f"ctasplit_x4e_{k}{sfx}": f"ctasplit_x4e{sfx}" for k in ("r3", "r3f", "r3fs", "r3fst")
           for sfx in ("", "_g4d1", "_g2d1", "_g1d1")}


@pytest.mark.parametrize("splitk_on", list(R3_BASE), indirect=True)
@pytest.mark.parametrize("m", [1, 2, 9, 16])
def test_r3_parity_and_equal_to_x4e_kimi_shape(splitk_on, m):
    """Parity at Kimi shapes (uniform and skewed routing), and outputs equal to ctasplit_x4e's at the same split (the
    same arithmetic; only the ring's depth differs). At M = 1 a token routed twice to one expert gives an item of two
    columns."""
    _assert_parity_and_equal_to(splitk_on, R3_BASE[splitk_on], m, 70 + m, 80 + m)


@pytest.mark.parametrize("config", [(2, 1024, 2), (8, 512, 4), (4, 96, 3)])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_stream_touched_reads_every_touched_word_once(small, config, m):
    """The streaming-read ceiling kernel reads exactly the touched experts' fragment words: the XOR and the count
    of what it read equal the fragments' (duplicate and invalid ids included), at launch shapes whose grids are
    far smaller than the words."""
    from workbench.moe.ceiling import expected_sink, stream_touched

    g = torch.Generator().manual_seed(m)
    ids, _ = make_routing(m, 16, 8, "skewed", g)
    ids = ids.to(torch.int32)
    ids[0, 1] = ids[0, 0]
    ids[-1, -1] = -1
    sink = stream_touched(ids.cuda(), small, config, check=True).cpu().numpy().view("uint32")
    want_xor, want_words = expected_sink(ids, small)
    assert want_words > 0
    assert (int(sink[1]), int(sink[2])) == (want_xor, want_words)


def test_stream_touched_rejects_bad_launch_shapes(small):
    from workbench.moe.ceiling import stream_touched

    ids = torch.zeros(1, 8, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="loads in flight"):
        stream_touched(ids, small, (3, 256, 4))
    with pytest.raises(ValueError, match="multiple of 32"):
        stream_touched(ids, small, (4, 100, 4))
    with pytest.raises(ValueError, match="CTAs per SM"):
        stream_touched(ids, small, (4, 1024, 4))


@pytest.mark.parametrize("build", ["nomath", "nowait", "nomath_nowait", "noact", "nomath_nowait_noact"])
def test_diagnostic_builds_run_and_leave_the_default_alone(small, build):
    """The diag builds compile and run the kernel they were written for (diag.DIAG_VARIANT; nomath's output differs:
    its math is gone); the default build's output is the same before and after."""
    from workbench.moe import fused
    from workbench.moe.diag import BUILDS, DIAG_VARIANT

    g = torch.Generator().manual_seed(5)
    ids, w = make_routing(1, 16, 8, "uniform", g)
    x = torch.randn(1, 1024, device="cuda").bfloat16()
    with fused.forced_small_variant(DIAG_VARIANT):
        before = fused_moe_int4(x, ids.cuda(), w.cuda(), small)
        with fused.diagnostic_build(BUILDS[build]):
            diag = fused_moe_int4(x, ids.cuda(), w.cuda(), small)
        after = fused_moe_int4(x, ids.cuda(), w.cuda(), small)
    torch.cuda.synchronize()
    assert torch.equal(before, after)
    assert diag.shape == before.shape
    if "nomath" in build:
        assert not torch.equal(diag, before)


@pytest.mark.parametrize("config", [(3, 5, 1), (3, 5, 0), (4, 2, 1), (3, 1, 0), (3, 5, 1, 3), (3, 5, 0, 2)])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_stream_ring_reads_every_touched_word_once(small, config, m):
    """The ring-read kernel reads exactly the touched experts' fragment words, in either unit order."""
    from workbench.moe.ceiling import expected_sink, stream_ring

    g = torch.Generator().manual_seed(10 + m)
    ids, _ = make_routing(m, 16, 8, "uniform", g)
    ids = ids.to(torch.int32)
    ids[-1, 0] = -1
    sink = stream_ring(ids.cuda(), small, config, check=True).cpu().numpy().view("uint32")
    assert (int(sink[1]), int(sink[2])) == expected_sink(ids, small)


def test_stream_ring_refuses_what_does_not_fit(small):
    from workbench.moe.ceiling import stream_ring

    ids = torch.zeros(1, 8, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="do not fit"):
        stream_ring(ids, small, (4, 64, 1))
    with pytest.raises(ValueError, match="at most 128 ids"):
        stream_ring(torch.zeros(17, 8, dtype=torch.int32, device="cuda"), small, (3, 5, 1))


# ---- the warp-split form (moe_small_wsplit_*; run 25): bit-identical to the CTA-split kernel at the same split

WSPLIT_BASE = {"wsplit_r3": "ctasplit_x4e_r3fst", "wsplit_r4": "ctasplit_x4e_r3fst",
               **{f"wsplit_r{rs}{sfx}": f"ctasplit_x4e_r3{sfx}" for rs in (3, 4) for sfx in ("_g4d1", "_g2d1", "_g1d1")}}


@pytest.mark.parametrize("splitk_on", list(WSPLIT_BASE), indirect=True)
@pytest.mark.parametrize("m", [1, 2, 5, 16])
def test_wsplit_parity_and_equal_to_ctasplit_kimi_shape(splitk_on, m):
    """Parity at Kimi shapes (uniform and skewed), and outputs bit-identical to the CTA-split kernel at the same
    split (the same partial sums in the same order); at M = 1 a token routed twice to one expert (an item of two
    columns)."""
    _assert_parity_and_equal_to(splitk_on, WSPLIT_BASE[splitk_on], m, 90 + m, 95 + m)


@pytest.mark.parametrize("splitk_on", ["wsplit_r3", "wsplit_r3_g1d1", "wsplit_r4"], indirect=True)
def test_wsplit_edge_cases_graph_replays_and_determinism(small, splitk_on):
    """Invalid and duplicate ids, every M edge, replays of one graph (every counter left zero), determinism."""
    _assert_edge_cases_replays_and_determinism(small, 5, (1, 4, 16), [(m, 40 + m, "skewed") for m in (1, 16)])


@pytest.mark.parametrize("splitk_on", ["wsplit_r3"], indirect=True)
@pytest.mark.parametrize("m", [1, 3])
def test_wsplit_parity_split2(splitk_on, m):
    """H = I = 1536 (6 stages): both phases split 2 (3 stages per unit)."""
    ex = random_int4_experts(8, 1536, 1536, device="cuda", seed=21 + m)
    res = check_case(ex, m, "uniform", torch.Generator().manual_seed(m), topk=8)
    assert res["path"] == f"small_{splitk_on}" and res["nonfinite"] == 0 and res["rel_err"] <= 1e-2, res


# ---- x4e_r3fst with one more static task per CTA (x4e_r3fstd, run 27c): the same tasks, the first grab one task later

SD_BASE = {f"ctasplit_x4e_r3fstd{sfx}": f"ctasplit_x4e_r3fst{sfx}" for sfx in ("", "_g4d1", "_g2d1", "_g1d1")}


@pytest.mark.parametrize("splitk_on", list(SD_BASE), indirect=True)
@pytest.mark.parametrize("m", [1, 2, 9, 16])
def test_static_deeper_parity_and_equal_to_r3fst_kimi_shape(splitk_on, m):
    """Parity at Kimi shapes (uniform and skewed), and outputs bit-identical to x4e_r3fst at the same split."""
    _assert_parity_and_equal_to(splitk_on, SD_BASE[splitk_on], m, 130 + m, 140 + m)


@pytest.mark.parametrize("splitk_on", ["ctasplit_x4e_r3fstd", "ctasplit_x4e_r3fstd_g1d1"], indirect=True)
def test_static_deeper_edge_cases_and_graph_replays(small, splitk_on):
    """Invalid and duplicate ids, every M edge (fewer tasks than the static ones at the smallest shapes), and replays
    of one graph (every counter left zero)."""
    _assert_edge_cases_replays_and_determinism(small, 9, (1, 4, 16))


# ---- the phased form (two launches, whole-K tiles, no counters; run 28): bit-identical to version 3

RING2_VARIANTS = ["phased_r2_pdl", "phased_r3_pdl_dn2", "phased_r3_pdl_gu2"]   # run 33's two-stage rings


@pytest.mark.parametrize("splitk_on", ["phased_r3", "phased_r4", "phased_r3_pdl", *RING2_VARIANTS], indirect=True)
@pytest.mark.parametrize("m", [1, 2, 5, 16])
def test_phased_parity_and_equal_to_v3_kimi_shape(splitk_on, m):
    """Parity at Kimi shapes (uniform and skewed), and outputs bit-identical to version 3 (moe_small_fused: the same
    whole-K fragment steps and the same order of sums); at M = 1 a token routed twice to one expert."""
    _assert_parity_and_equal_to(splitk_on, "v3", m, 150 + m, 160 + m)


@pytest.mark.parametrize("splitk_on", ["phased_r3_pdl_k4"], indirect=True)
@pytest.mark.parametrize("m", [1, 2, 5, 16])
def test_phased_k4_parity_and_close_to_v3_kimi_shape(splitk_on, m):
    """The K-split gate/up form (run 29f): parity at Kimi shapes (uniform and skewed), and within 2e-3 by norm of
    version 3's outputs (the same products; gate/up's sum over K in four fp32 parts added in a fixed order instead of
    one chain, so a few h values round to the neighbouring bf16); at M = 1 a token routed twice to one expert."""
    _assert_parity_and_equal_to(splitk_on, "v3", m, 170 + m, 180 + m, rel_tol=2e-3)


@pytest.mark.parametrize("splitk_on", ["phased_r3", "phased_r4", "phased_r3_pdl", "phased_r3_pdl_k4", *RING2_VARIANTS],
                         indirect=True)
def test_phased_edge_cases_graph_replays_and_determinism(small, splitk_on):
    """Invalid and duplicate ids, every M edge, replays of one graph of both launches, determinism."""
    _assert_edge_cases_replays_and_determinism(small, 5, (1, 4, 16), [(m, 40 + m, "skewed") for m in (1, 16)])


@pytest.mark.parametrize("splitk_on", ["phased_r4"], indirect=True)
def test_phased_small_grids_stride(small, splitk_on, monkeypatch):
    """Grids far below one task per warp and one CTA per tile (both kernels stride): the same outputs as the full
    grids, at M = 1 and 16."""
    from workbench.moe import fused

    g = torch.Generator().manual_seed(77)
    ids, w = make_routing(16, 16, 8, "uniform", g)
    x = torch.randn(16, 1024, generator=g).bfloat16().cuda()
    full = [fused_moe_int4(x[:m], ids[:m].cuda(), w[:m].cuda(), small) for m in (1, 16)]
    monkeypatch.setattr(fused, "phased_grids", lambda *a: (3, 5))
    tiny = [fused_moe_int4(x[:m], ids[:m].cuda(), w[:m].cuda(), small) for m in (1, 16)]
    for a, b in zip(full, tiny):
        assert torch.equal(a, b)


@pytest.mark.parametrize("variant", ["phased_r3", "phased_r3_pdl"])
def test_phased_breakdown_times_every_part(small, variant):
    """workbench.moe.phased: each launch alone and both, one replay and in-graph, every sample positive."""
    from workbench.moe.bench import second_bank
    from workbench.moe.phased import PARTS, breakdown, table_rows

    res = breakdown([small, second_bank(small, seed=3)], 2, "uniform", variant, torch.Generator().manual_seed(1),
                    reps=3, calls=2)
    for parts in PARTS:
        assert res[parts]["one_replay_ms"] > 0 and res[parts]["in_graph_ms"] > 0
        assert len(res[parts]["one_replay_samples"]) == 3
    assert res["boundary_in_graph_ms"] == pytest.approx(
        res["gu+dn"]["in_graph_ms"] - res["gu"]["in_graph_ms"] - res["dn"]["in_graph_ms"])
    assert len(table_rows([res])) == 1
