from workbench.reports import readme as report


def test_readme_results_block_matches_measurements():
    text = report.README.read_text()
    assert report.readme_block() in text, "README results are stale: run python -m workbench.reports.readme --write-readme"


def test_rows_cover_every_area():
    areas = {r["area"] for r in report.results_rows()}
    assert {"DDTree tree kernels", "INT4 MoE"} <= areas
