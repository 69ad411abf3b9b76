"""papers/serving.md's generator (workbench.reports.serving): every block rendered from the committed H200
``serving.json`` (provenance, goals, lossless counts computed from the file), the committed paper current
(``--check`` exits 0), a stale copy refused and regenerated, and without the file the blocks say so."""
from __future__ import annotations

import copy

import pytest

from workbench.reports import papers, serving


@pytest.fixture(scope="module")
def doc():
    d = serving.load()
    if d is None:
        pytest.skip("no committed serving.json")
    return d


def test_blocks_render_from_the_file(doc):
    text = serving.render(serving.PAPER.read_text(), doc)
    assert sorted(papers.block_names(text)) == sorted(serving.BLOCKS)
    assert "Not measured yet" not in text
    pv = doc["provenance"]
    assert f"at commit `{pv['git_commit'][:12]}`, {pv['date_utc']}" in text and pv["gpu"] in text
    for g in doc["results"]["goals"]:
        assert f"{g['goal']}: {g['server']:,.2f} vs {g['engine']:,.2f} {g['unit']} ({100 * g['relative']:+.1f}%" in text
    met = sum(g["met"] for g in doc["results"]["goals"])
    assert f"{met} of {len(doc['results']['goals'])} goals met" in text
    rows = doc["results"]["lossless"]
    assert f"in {sum(r['equal'] for r in rows)} of {len(rows)} requests" in text
    assert len(serving.server_rows(doc)) == len(doc["results"]["server"])
    assert len(serving.engine_rows(doc)) == len(doc["results"]["engine"])


def test_lossless_and_head_of_line_follow_the_file(doc):
    d = copy.deepcopy(doc)
    d["results"]["lossless"][0]["equal"] = False
    s = serving.lossless_summary(d)
    assert s["equal"] == s["total"] - sum(not r["equal"] for r in doc["results"]["lossless"]) - 1
    d["results"]["head_of_line"] = [{"chunk": None, "itl_ms_max": 1234.5, "gaps": [1.0]}]
    assert serving.hol_rows(d) == [{"chunk": None, "itl_ms_max": "1,234.50"}]
    d["results"]["head_of_line"] = []
    assert "recorded no head-of-line figures" in serving.block_head_of_line(d)


def test_committed_paper_is_current_and_check(doc, tmp_path):
    assert serving.main(["--check"]) == 0
    stale = tmp_path / "p.md"
    stale.write_text(serving.PAPER.read_text().replace(doc["provenance"]["gpu"], "SOME GPU", 1))
    assert serving.main(["--paper", str(stale), "--check"]) == 1
    assert serving.main(["--paper", str(stale)]) == 0 and serving.main(["--paper", str(stale), "--check"]) == 0


def test_without_the_file_the_blocks_say_so(tmp_path):
    paper = tmp_path / "p.md"
    paper.write_text(serving.PAPER.read_text())
    assert serving.main(["--data", str(tmp_path / "none.json"), "--paper", str(paper)]) == 0
    assert "Not measured yet" in paper.read_text()
