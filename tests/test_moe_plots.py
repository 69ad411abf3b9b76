"""The notebook-02 tables built from the committed one-launch vs four-launch comparison."""
import pytest

from workbench.moe import fused, plots


@pytest.fixture(scope="module")
def small():
    doc = plots.load_moe_small("h200")
    if doc is None:
        pytest.skip("no committed moe_small_v3 measurement")
    return doc


def test_small_path_rows_follow_the_dispatch_table(small):
    rows = plots.small_path_rows(small)
    assert len(rows) == len(small["results"]["rows"]) > 0
    k = small["parameters"]["topk"]
    for r in rows:
        one = fused.uses_small_path(r["M"], k)
        assert r["dispatched"].startswith("one-launch" if one else "four-launch")
        expect = r["one-launch % copy"] if one else r["four-launch % copy"]
        assert r["dispatched % copy"] == expect


def test_dispatched_worst_is_the_minimum_and_table_never_picks_the_slower_path(small):
    pct, row = plots.dispatched_worst_pct(small)
    rows = plots.small_path_rows(small)
    assert pct == min(r["dispatched % copy"] for r in rows) == row["dispatched % copy"]
    # SMALL_TABLE was set from this file: at each measured M the dispatched path is the faster one
    # for at least one routing (the two routings agree on every M in the committed run).
    by_m = {}
    for r in rows:
        faster_one = r["x one vs four"] > 1
        by_m.setdefault(r["M"], set()).add(faster_one == r["dispatched"].startswith("one-launch"))
    assert all(True in v for v in by_m.values()), by_m


def test_pct_figure_overlays_the_small_kernel(small):
    fig = plots.pct_figure(plots.load_moe_bandwidth("h200"), None, small)
    names = [t.name for t in fig.data]
    assert any("one-launch" in n for n in names)
