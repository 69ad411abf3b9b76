"""The DDTree paper's generated blocks, the README's goal rows and notebook 01's tables and figures."""
import pytest

from workbench.reports import papers
from workbench.reports import ddtree as R


def test_paper_is_current_and_blocks_match():
    text = R.PAPER.read_text()
    assert sorted(papers.block_names(text)) == sorted(R.BLOCKS), "paper and BLOCKS disagree"
    assert R.render(text) == text, "papers/ddtree_kernels.md is stale: python -m workbench.reports.ddtree"
    assert len(text.splitlines()) < 500


def test_rows_from_the_committed_measurements():
    if R.load_tree() is None or R.load_verify() is None:
        pytest.skip("no committed ddtree measurements")
    goals = R.goal_rows()
    assert goals and {"goal", "measured", "met"} <= set(goals[0])
    builds = R.build_rows()
    assert [r["budget"] for r in builds] == sorted(r["budget"] for r in builds)
    assert all(r["fastest"] in R.KEPT_BUILDERS for r in builds)
    rows = R.verify_rows()
    assert {(r["H"], r["prefix"]) for r in rows} >= {(8, 4096), (64, 131072)}
    for r in rows:
        assert r["% of floor"] == pytest.approx(100 * r["floor ms"] / r["kernel ms"])
    for r in R.tree_floor_rows():
        assert float(r["% of floor"]) < 100
    assert len(R.build_sweep_figure().data) == len(R.KEPT_BUILDERS) + 1
    assert len(R.verify_figure().data) == 4 * len({r["H"] for r in rows})
