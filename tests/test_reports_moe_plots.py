"""The notebook-02 and paper tables built from the committed MoE measurements."""
import pytest

from workbench.moe import dispatched
from workbench.reports import moe_plots as plots
from workbench.reports import moe as report

H200 = "NVIDIA H200"


@pytest.fixture(scope="module")
def small():
    doc = plots.load_moe_small("h200")
    if doc is None:
        pytest.skip("no committed moe_small_dispatch measurement")
    return doc


def test_small_path_rows_follow_the_dispatch_table(small):
    rows = dispatched.small_path_rows(small)
    assert len(rows) == len(small["results"]["rows"]) > 0
    k = small["parameters"]["topk"]
    for r in rows:
        label = dispatched.dispatched_label(r["M"], k, H200)
        assert r["dispatched"].startswith(label)
        assert r["dispatched % copy"] == r[f"{label} % copy"] is not None
        timed = {p: r[f"{p} % copy"] for p in dispatched.one_launch_paths(small) + ["four_launch"]}
        assert r["fastest"] == max(timed, key=timed.get)


def test_dispatched_worst_is_the_minimum_and_table_never_picks_a_clearly_slower_path(small):
    pct, row = plots.dispatched_worst_pct(small)
    rows = dispatched.small_path_rows(small)
    assert pct == min(r["dispatched % copy"] for r in rows) == row["dispatched % copy"]
    # This file times every dispatched kernel in one process. The dispatch sees M, not the routing, so the check is per
    # M: averaged over the two routings the dispatched path is within 1.5 points of copy bandwidth of each row's
    # fastest path, and in every row within 3 points (the spread of one path at one row between processes).
    by_m: dict[int, list[float]] = {}
    for r in rows:
        gap = r[f"{r['fastest']} % copy"] - r["dispatched % copy"]
        assert gap <= 3.0, r
        by_m.setdefault(r["M"], []).append(gap)
    for m, gaps in by_m.items():
        assert sum(gaps) / len(gaps) <= 1.5, (m, gaps)


def test_dispatched_label_follows_the_dispatch_data():
    assert [dispatched.dispatched_label(m, 8, H200) for m in (1, 2, 4, 9, 16, 17)] == [
        "phased_r2_pdl", "phased_r3_pdl_k4", "phased_r3_pdl_gu2", "phased_r3_pdl_gu2", "phased_r3_pdl_gu2",
        "four_launch"]                                           # 17 x 8 > 128 pairs
    assert dispatched.dispatched_label(1, 8, "a GPU without a table") == "four_launch"   # generic.json


def test_dispatched_path_missing_from_the_file_is_an_error(small):
    doc = {**small, "results": {**small["results"], "rows": [
        {k: v for k, v in r.items() if not k.startswith("phased_r2_pdl")} for r in small["results"]["rows"]]}}
    with pytest.raises(ValueError, match="did not time the dispatched path"):
        plots.dispatched_worst_pct(doc)


def test_pct_figure_overlays_the_small_kernel(small):
    fig = plots.pct_figure(plots.load_moe_bandwidth("h200"), None, small)
    names = [t.name for t in fig.data]
    assert any("dispatched path at M <= 16" in n for n in names)
    span = [t for t in fig.data if "profiler span" in t.name]
    assert len(span) == 2 and all(len(t.x) == 12 and min(t.y) > 0 for t in span)   # both routings, every M


def test_call_time_rows_are_the_sweeps_four_timings():
    doc = plots.load_moe_bandwidth()
    rows = plots.call_time_rows(doc)
    assert len(rows) == 12 and {r["kernels"] for r in rows} == {2}
    r = next(r for r in rows if (r["routing"], r["M"]) == ("uniform", 1))
    src = next(x for x in doc["results"]["rows"] if (x["routing"], x["m"]) == ("uniform", 1))
    assert r["span us"] == f"{1e3 * src['span_ms_median']:.1f}"
    assert float(r["one - span us"]) == pytest.approx(1e3 * (src["ms_median"] - src["span_ms_median"]), abs=0.06)
    assert plots.call_time_rows({"results": {"rows": [{"m": 1, "routing": "uniform"}]}}) == []


def test_versions_table_reads_every_run_from_git():
    """The paper's versions table: one row per run of report.VERSIONS (and the earlier sweeps), each with a measured
    column computed from the run's file as committed at report.HISTORY; None only without git history."""
    rows = report.version_rows()
    if rows is None:
        pytest.skip(f"git history at {report.HISTORY} not available")
    assert len(rows) == len(report.VERSIONS) + len(report.MOE_RUNS) + len(report.LATER_VERSIONS)
    assert all(r["measured"] and r["code"] and r["outcome"] for r in rows)


def test_dispatch_block_names_every_dispatched_launch():
    rows = plots.dispatch_rows(H200)
    text = report.block_dispatch()
    assert [r["path"] for r in rows] == ["small-M"] * 3 + ["four_launch"] * 2   # the fragment layout's variants
    assert "moe_small_phased_gu_r2p" in text and "moe_gate_up_frag_nt1" in text and "generic.json" in text
    assert [r["path"] for r in plots.dispatch_rows("a GPU without a table")] == ["four_launch"] * 3   # packed


def test_load_moe_repeat_only_at_todays_dispatch(monkeypatch):
    """plots.load_moe_repeat: the committed repeat of today's sweep (same small-M dispatch), and None once the two
    differ (a repeat of an older dispatch) or the repeat is missing."""
    doc = plots.load_moe_bandwidth()
    rep = plots.load_moe_repeat()
    assert rep is not None and plots._dispatch_key(rep) == plots._dispatch_key(doc)
    real = plots.load_measurement

    def older(name, gpu="h200"):
        d = real(name, gpu)
        if name == plots.CURRENT_REPEAT:
            d = {**d, "parameters": {**d["parameters"], "small_table": [[128, "phased_r3_pdl"]]}}
        return d

    monkeypatch.setattr(plots, "load_measurement", older)
    assert plots.load_moe_repeat() is None
    monkeypatch.setattr(plots, "load_measurement", lambda name, gpu="h200": None if name == plots.CURRENT_REPEAT
                        else real(name, gpu))
    assert plots.load_moe_repeat() is None


def test_bandwidth_goal_rows_are_the_copy_rows():
    """plots.bandwidth_goal_rows: the % of copy rows of goal_rows, first in it: the profiler's span (where the file
    has it), in-graph, queued, one replay."""
    doc = plots.load_moe_bandwidth()
    rows = plots.bandwidth_goal_rows(doc)
    n = len(rows)
    assert [r["goal"] for r in rows] == [r["goal"] for r in plots.goal_rows(doc)[:n]]
    has_span = any("span_pct_of_copy" in r for r in doc["results"]["rows"])
    assert n == 3 + has_span
    assert ("profiler" in rows[0]["goal"]) == has_span
    assert "in-graph" in rows[has_span]["goal"] and "queued" in rows[has_span + 1]["goal"]
    assert "one graph replay" in rows[-1]["goal"]
    assert not any("% of copy" in r["goal"] for r in plots.goal_rows(doc)[n:])


def test_goal_rows_judge_each_timing_on_its_worst_row():
    doc = {"results": {"rows": [
        {"m": 1, "pct_of_copy": 79.0, "ingraph_pct_of_copy": 85.0, "queued_pct_of_copy": 82.0, "span_pct_of_copy": 83.0,
         "speedup_vs_bf16_cublas": 6.0, "speedup_vs_torch_int4pack": 4.0},
        {"m": 16, "pct_of_copy": 90.0, "ingraph_pct_of_copy": 81.0, "queued_pct_of_copy": 79.5, "span_pct_of_copy": 90.0,
         "speedup_vs_bf16_cublas": 5.0, "speedup_vs_torch_int4pack": 3.0},
        {"m": 32, "pct_of_copy": 10.0, "ingraph_pct_of_copy": 10.0, "queued_pct_of_copy": 10.0, "span_pct_of_copy": 1.0}],
        "checks": [{"rel_err": 3e-3, "ok": True}], "all_checks_ok": True}}
    got = [(r["measured (worst)"], r["met"]) for r in plots.goal_rows(doc)]
    assert got == [(83.0, True), (81.0, True), (79.5, False), (79.0, False), (5.0, True), (3.0, True), (3e-3, True)]
    del doc["results"]["rows"][0]["span_pct_of_copy"], doc["results"]["rows"][1]["span_pct_of_copy"]
    del doc["results"]["rows"][2]["span_pct_of_copy"]
    assert [r["measured (worst)"] for r in plots.goal_rows(doc)][:3] == [81.0, 79.5, 79.0]   # no span row
