"""The README's generated blocks (results table, findings in words) equal what the committed files give."""
import copy
import json
import re
from types import SimpleNamespace

import pytest

from workbench import MEASUREMENTS_DIR
from workbench.capacity import capacity
from workbench.measure import load_measurement
from workbench.projection.model import load_anchors
from workbench.projection.speedup import scripted_speedup, trained_speedups
from workbench.reports import readme as report

STALE_MESSAGE = "README is stale: run python -m workbench.reports.readme --write-readme"


def test_readme_results_block_matches_measurements():
    assert report.readme_block() in report.README.read_text(), STALE_MESSAGE


def test_readme_findings_block_matches_measurements():
    assert report.findings_block() in report.README.read_text(), STALE_MESSAGE


def test_rows_cover_every_area():
    areas = {r["area"] for r in report.results_rows()}
    assert {"DDTree tree kernels", "INT4 MoE"} <= areas


def test_serving_goals_reach_the_results_table():
    """Each goal of the committed serving run is a row (server against engine, the relative gap, met or not)."""
    doc = load_measurement("serving")
    if doc is None:
        pytest.skip("no serving.json committed")
    rows = [r for r in report.results_rows() if r["file"] == "serving.json"]
    assert len(rows) == len(doc["results"]["goals"]) > 0
    for r, g in zip(rows, doc["results"]["goals"]):
        assert g["goal"] in r["goal"] and r["met"] == bool(g["met"]) and f"{100 * g['relative']:+.1f}%" in r["measured"]


def test_findings_are_few_and_each_names_its_notebook_and_source():
    found = report.findings()
    assert 6 <= len(found) <= 10
    for f in found:
        assert re.search(r"notebooks? 0\d", f), f
        assert "papers/" in f or "workbench capacity" in f, f


def _engine_rows(doc, C):
    """The engine step's greedy and DDTree graph rows at C, fuse mode the engine dispatches (the last measured)."""
    fuse, p_top = doc["parameters"]["fuses"][-1], doc["parameters"]["p_tops"][0]
    pick = [r for r in doc["results"]["rows"] if r["C"] == C and r["path"] == "graph" and r["fuse"] == fuse]
    greedy = next(r for r in pick if r["method"] == "greedy")
    ddtree = next(r for r in pick if r["method"] == "ddtree" and r["p_top"] == p_top)
    return greedy["wall_ms"], ddtree["wall_ms"]


def test_headline_is_ddtree_over_greedy_from_the_step_and_acceptance_files():
    """The first finding's ratios are accepted x greedy step / DDTree step, recomputed here from the raw rows."""
    engine, (acc, _) = load_measurement("engine_step"), report.acceptance_measurement()
    if engine is None or acc is None:
        pytest.skip("engine_step.json or acceptance.json not committed")
    block, budget = engine["parameters"]["block"], engine["parameters"]["budget"]
    accepted = [r["mean_accepted"] for r in report.measured_rows(acc) if (r["block"], r["budget"]) == (block, budget)]
    headline = report.findings()[0]
    for C in report.HEADLINE_CONCURRENCY:
        greedy_ms, ddtree_ms = _engine_rows(engine, C)
        ratios = [a * greedy_ms / ddtree_ms for a in accepted]
        assert f"{report._span(ratios)}x" in headline and f"at C={C}" in headline
        assert f"{ddtree_ms / greedy_ms:.2f}" in headline and f"{ddtree_ms:.2f} vs {greedy_ms:.2f} ms" in headline


def test_speedup_arithmetic_on_a_small_document():
    """DDTree / greedy = accepted x greedy step / DDTree step; break-even = DDTree step / greedy step."""
    engine = {"parameters": {"block": 16, "budget": 32, "fuses": ["compile"], "p_tops": [0.8, 0.95]},
              "results": {"rows": [
                  {"method": "greedy", "C": 1, "path": "graph", "fuse": "compile", "wall_ms": 10.0, "floor_ms": 5.0},
                  {"method": "ddtree", "p_top": 0.8, "C": 1, "path": "graph", "fuse": "compile", "wall_ms": 25.0,
                   "floor_ms": 15.0, "mean_accepted": 3.0},
                  {"method": "ddtree", "p_top": 0.95, "C": 1, "path": "graph", "fuse": "compile", "wall_ms": 26.0,
                   "floor_ms": 15.0, "mean_accepted": 13.0}]}}
    acc = {"results": {"rows": [{"text_type": "math", "block": 16, "budget": 32, "mean_accepted": 2.0},
                                {"text_type": "math", "block": 16, "budget": 8, "mean_accepted": 1.5}]}}
    (s,) = trained_speedups(engine, acc, 1)
    assert s.source == "math" and s.break_even == pytest.approx(2.5) and s.ratio == pytest.approx(0.8)
    hi = scripted_speedup(engine, 1)
    assert hi.accepted == 13.0 and hi.ratio == pytest.approx(13.0 * 10.0 / 26.0)
    with pytest.raises(ValueError, match="block 16, budget 32"):
        trained_speedups(engine, {"results": {"rows": acc["results"]["rows"][1:]}}, 1)
    with pytest.raises(ValueError, match="C=8"):
        trained_speedups(engine, acc, 8)


def test_capacity_finding_is_what_capacity_answers():
    text = next(f for f in report.findings() if "notebook 05" in f)
    pro = capacity(gpu="rtx-pro-6000")
    assert f"{pro.context:,}-token request {'fits' if pro.fits else 'does not fit'}" in text
    assert f"{pro.pool_tokens:,} tokens" in text and f"{pro.kv_bytes_per_token:,} B per token" in text
    for gpu in ("h200", "b300"):
        assert f"hold {capacity(gpu=gpu).concurrent_requests}" in text


def test_b300_finding_quotes_the_source_scenario_from_the_anchors():
    text = next(f for f in report.findings() if "notebook 04, `papers/b300_projection.md`)" in f and "B300" in f)
    sc = next(s for s in load_anchors()["scenarios"] if s["id"] == "strong_drafter")
    assert "the source said " + "-".join(f"{v:g}" for v in sc["source_tokens_per_s"]) in text


def test_a_missing_measurement_drops_its_sentence(monkeypatch):
    """Without the context sweep the three sentences it gives are left out; the rest stand."""
    real = report.load_measurement
    monkeypatch.setattr(report, "load_measurement", lambda n, gpu="h200": None if n == "context_sweep" else real(n, gpu))
    found = report.findings()
    assert found and not any("context_sweep.json" in f for f in found)


def test_write_readme_replaces_both_blocks(tmp_path, monkeypatch):
    path = tmp_path / "README.md"
    path.write_text(f"intro\n{report.FINDINGS_BEGIN}\nSTALE\n{report.FINDINGS_END}\nmiddle\n{report.BEGIN}\nSTALE\n"
                    f"{report.END}\nend\n")
    monkeypatch.setattr(report, "README", path)
    report.write_readme()
    text = path.read_text()
    assert report.findings_block() in text and report.readme_block() in text and "STALE" not in text
    path.write_text("no markers\n")
    with pytest.raises(ValueError, match="findings:begin|results:begin"):
        report.write_readme()


def test_older_acceptance_layout_gives_the_goals_from_its_rows():
    """A file without results.goals (the earlier layout) still yields each goal's figures from its rows."""
    path = MEASUREMENTS_DIR / "h200" / "acceptance.json"
    if not path.exists():
        pytest.skip("no acceptance.json committed")
    doc = copy.deepcopy(json.loads(path.read_text()))
    doc["results"].pop("goals", None)
    if doc["results"]["rows"] and "method" in doc["results"]["rows"][0]:
        pytest.skip("acceptance.json is of the current layout")
    goals = report.acceptance_goals(doc)
    for t, g in goals.items():
        assert g["met"] == (g["mean_accepted"] >= g["goal"])
        assert g["tree_over_chain"] > 0


def test_headline_verdict_follows_the_ratios():
    """Faster / slower / on a par per concurrency, from the ratios, never typed."""
    def at(*ratios):
        return [SimpleNamespace(ratio=r) for r in ratios]

    assert report._verdict({1: at(0.5, 0.6), 8: at(0.3)}) == "DDTree is slower than greedy decoding on this engine"
    assert report._verdict({1: at(1.2), 8: at(0.9)}) == ("DDTree is faster than greedy decoding at C=1 and slower "
                                                         "than greedy decoding at C=8")
    assert "on a par with greedy decoding" in report._verdict({1: at(0.9, 1.1)})
