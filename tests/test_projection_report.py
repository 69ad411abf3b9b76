"""The paper's generated blocks, the figures and the what-if explorer (headless)."""
import plotly.graph_objects as go
import pytest

from workbench.projection import figures, load_calibration, project
from workbench.reports.projection import BLOCKS, PAPER, _BLOCK, main, render


def test_paper_has_every_generated_block_and_renders(tmp_path):
    text = PAPER.read_text()
    names = [m.group("name") for m in _BLOCK.finditer(text)]
    assert sorted(names) == sorted(BLOCKS)
    out = render(text)
    for name in BLOCKS:
        assert f"<!-- BEGIN GENERATED: {name} -->" in out
    assert "| scenario |" in out and "| term |" in out
    p = tmp_path / "paper.md"
    p.write_text(text.replace("<!-- END GENERATED: terms -->", "stale\n<!-- END GENERATED: terms -->"))
    assert main(["--paper", str(p), "--check"]) == 1
    assert main(["--paper", str(p)]) == 0
    assert main(["--paper", str(p), "--check"]) == 0
    bad = tmp_path / "bad.md"
    bad.write_text("<!-- BEGIN GENERATED: nope -->\n<!-- END GENERATED: nope -->\n")
    with pytest.raises(ValueError, match="unknown generated block"):
        main(["--paper", str(bad)])


def test_figures_are_plotly_figures():
    cal = load_calibration(use_measurements=False)
    res = project("b300", 16, 32, (12, 16), calibration=cal)
    items = figures.breakdown_by_gpu(calibration=cal)
    fig = figures.breakdown_figure(items)
    assert isinstance(fig, go.Figure) and len(fig.data) == 7 and len(items) == 6
    # the Amdahl shift: for each config the MoE share falls as bandwidth grows (PRO 6000 -> H200 -> B300)
    for k in (0, 3):
        shares = [r.breakdown["central"]["moe"] / r.step_ms["central"] for _, r in items[k:k + 3]]
        assert shares == sorted(shares, reverse=True)
    for f in (figures.sensitivity_figure(res), figures.terms_table(), figures.calibration_table(cal),
              figures.projection_table(res), figures.source_arithmetic_table(),
              figures.accept_sweep_figure(calibration=cal, block=8, budget=8)):
        assert isinstance(f, go.Figure) and f.data


def test_explorer_runs_headless_and_reports_bad_input():
    ipywidgets = pytest.importorskip("ipywidgets")
    from workbench.projection.widgets import explorer_state, projection_explorer

    cal = load_calibration(use_measurements=False)
    box = projection_explorer("b300", 16, 32, 12, calibration=cal)
    sliders = {s.description: s for row in box.children[:2] for s in row.children}
    message = box.children[2]
    assert set(sliders) == {"accepted", "block", "budget", "TB/s", "overhead ms"}
    sliders["accepted"].value = 20          # above the block: an error message, no exception, no clipping
    assert "accept=(20.0,) is not allowed: a non-empty list of numbers in [1, 16]" in message.value
    assert sliders["accepted"].value == 20
    sliders["accepted"].value = 12
    assert message.value == ""
    sliders["TB/s"].value = 16.0
    assert message.value == "" and isinstance(box.children[3], ipywidgets.Output)
    state = explorer_state("b300", 16, 32, 12, bandwidth_tbs=16.0, overhead_ms=8.0, calibration=cal)
    moe = [state[k].breakdown["central"]["moe"] for k in ("baseline", "what_if")]
    assert moe[1] == pytest.approx(moe[0] / 2)   # twice the B300's 8 TB/s, half the MoE term


def test_committed_paper_is_current():
    """papers/b300_projection.md's generated blocks equal what the committed data gives."""
    text = PAPER.read_text()
    assert render(text) == text, "paper is stale: run python -m workbench.reports.projection"
