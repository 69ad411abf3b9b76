from workbench.reports import readme as report


def test_readme_results_block_matches_measurements():
    text = report.README.read_text()
    assert report.readme_block() in text, "README results are stale: run python -m workbench.reports.readme --write-readme"


def test_rows_cover_every_area():
    areas = {r["area"] for r in report.results_rows()}
    assert {"DDTree tree kernels", "INT4 MoE"} <= areas


def test_serving_goals_reach_the_results_table():
    """Each goal of the committed serving run is a row (server against engine, the relative gap, met or not)."""
    from workbench.measure import load_measurement
    from workbench.reports.readme import results_rows

    doc = load_measurement("serving")
    if doc is None:
        import pytest

        pytest.skip("no serving.json committed")
    rows = [r for r in results_rows() if r["file"] == "serving.json"]
    assert len(rows) == len(doc["results"]["goals"]) > 0
    for r, g in zip(rows, doc["results"]["goals"]):
        assert g["goal"] in r["goal"] and r["met"] == bool(g["met"]) and f"{100 * g['relative']:+.1f}%" in r["measured"]
