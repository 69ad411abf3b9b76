"""The shared generated-block mechanism (workbench.reports.papers) and the measurement papers built on it."""
import importlib

import pytest

from workbench.reports import papers

REPORTS = ["workbench.reports.ddtree", "workbench.reports.moe", "workbench.reports.projection",
           "workbench.reports.context", "workbench.reports.serving"]


def test_render_check_and_main(tmp_path):
    blocks = {"a": lambda: "A\n", "b-2": lambda: papers.markdown_table([{"x": 1, "y": "p|q"}])}
    text = ("# t\n<!-- BEGIN GENERATED: a -->\nold\n<!-- END GENERATED: a -->\nprose\n"
            "<!-- BEGIN GENERATED: b-2 -->\n<!-- END GENERATED: b-2 -->\n")
    out = papers.render(text, blocks)
    assert "<!-- BEGIN GENERATED: a -->\nA\n<!-- END GENERATED: a -->\nprose\n" in out
    assert "| x | y |\n| --- | --- |\n| 1 | p\\|q |\n" in out
    assert papers.block_names(out) == ["a", "b-2"]
    p = tmp_path / "paper.md"
    p.write_text(text)
    kw = dict(paper=p, blocks=blocks, prog="python -m x")
    assert not papers.is_current(p, blocks)
    assert papers.main(["--check"], **kw) == 1
    assert papers.main([], **kw) == 0
    assert papers.is_current(p, blocks) and papers.main(["--check"], **kw) == 0
    with pytest.raises(ValueError, match="unknown generated block 'c'"):
        papers.render("<!-- BEGIN GENERATED: c -->\n<!-- END GENERATED: c -->\n", blocks)
    assert papers.markdown_table([]) == "(none)\n"


def test_committed_json_reads_history_or_none():
    assert papers.committed_json("0" * 40, "data/hardware.json") is None


@pytest.mark.parametrize("module", REPORTS)
def test_committed_paper_is_current(module):
    """Each paper's generated blocks equal what the committed measurement files give."""
    rep = importlib.import_module(module)
    text = rep.PAPER.read_text()
    assert sorted(papers.block_names(text)) == sorted(rep.BLOCKS), "paper and BLOCKS disagree"
    history = getattr(rep, "VERIFY_RUNS", None) or getattr(rep, "MOE_RUNS", None)  # blocks that read git history
    if history and papers.committed_json(history[0][0], "data/hardware.json") is None:
        pytest.skip("git history of the earlier measurement runs is not available (shallow clone?)")
    assert rep.render(text) == text, f"{rep.PAPER.name} is stale: run python -m {module}"
