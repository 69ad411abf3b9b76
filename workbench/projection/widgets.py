"""Interactive what-ifs: ipywidgets sliders driving a plotly figure.

:func:`projection_explorer` returns an ``ipywidgets.VBox`` (display it). The
figure is an ordinary plotly figure re-drawn into an ``ipywidgets.Output`` at
each change (not a ``FigureWidget``: its saved state would carry a second copy
of plotly.js in every executed notebook); it runs headless (papermill, nbval).
An input the model rejects (an accepted length above the block, ...) is shown
as the error message; nothing is clipped.
"""
from __future__ import annotations

from typing import Any

import ipywidgets as w
import plotly.graph_objects as go

from workbench.decode import DEFAULT, MAX_BUDGET, MAX_L
from workbench.projection.calibration import Calibration, load_calibration
from workbench.projection.figures import TERM_COLORS
from workbench.projection.model import TERM_NAMES, StepShape, load_gpu
from workbench.projection.project import project


def explorer_state(gpu: str, block: int, budget: int, accept: float, bandwidth_tbs: float, overhead_ms: float,
                   calibration: Calibration, context: int = StepShape.context) -> dict[str, Any]:
    """What the explorer draws for one slider setting: baseline (datasheet bandwidth, calibrated
    overhead) and what-if breakdowns, with tokens/s. Raises ValueError on invalid inputs."""
    base = project(gpu, block, budget, (accept,), calibration=calibration, context=context)
    what = project(gpu, block, budget, (accept,), calibration=calibration, context=context,
                   overhead_ms=overhead_ms, bandwidth_bytes_per_s=bandwidth_tbs * 1e12)
    return {"baseline": base, "what_if": what}


def _draw(fig: Any, state: dict[str, Any]) -> None:
    base, what = state["baseline"], state["what_if"]
    labels = [f"baseline<br>{base.bandwidth_bytes_per_s / 1e12:.2f} TB/s, calibrated overhead",
              f"what-if<br>{what.bandwidth_bytes_per_s / 1e12:.2f} TB/s, overhead {what.breakdown['central']['overhead']:.1f} ms"]
    for i, name in enumerate(TERM_NAMES):
        fig.data[i].x = labels
        fig.data[i].y = [base.breakdown["central"][name], what.breakdown["central"][name]]
    b, w = base.tokens_per_s[0], what.tokens_per_s[0]
    fig.layout.title = (f"{what.gpu_name}, block {what.shape.block}, budget {what.shape.budget}, accepted "
                        f"{w['accept']:g}: baseline {b['central']:.0f} ({b['low']:.0f}-{b['high']:.0f}) tok/s, "
                        f"what-if {w['central']:.0f} tok/s")


def _empty_figure() -> go.Figure:
    fig = go.Figure()
    for name in TERM_NAMES:
        fig.add_bar(x=[], y=[], name=name, marker_color=TERM_COLORS[name])
    fig.update_layout(barmode="stack", yaxis_title="ms per step (central)", height=450,
                      margin=dict(l=10, r=10, t=60, b=10))
    return fig


def projection_explorer(gpu: str = "b300", block: int = DEFAULT.block, budget: int = DEFAULT.budget,
                        accept: float = 12.0, calibration: Calibration | None = None, use_measurements: bool = True,
                        context: int = StepShape.context) -> Any:
    """Sliders (accepted length, block, budget, bandwidth, overhead) updating a stacked bar of the
    step breakdown, baseline beside what-if. Returns an ipywidgets.VBox."""
    calib = calibration or load_calibration(use_measurements=use_measurements)
    spec = load_gpu(gpu)
    base = project(gpu, block, budget, (accept,), calibration=calib, context=context)
    oh0 = base.breakdown["central"]["overhead"]
    sliders = {
        "accept": w.FloatSlider(value=accept, min=1, max=MAX_L + 1, step=0.5, description="accepted"),
        "block": w.IntSlider(value=block, min=2, max=MAX_L + 1, description="block"),
        "budget": w.IntSlider(value=budget, min=1, max=MAX_BUDGET, description="budget"),
        "bandwidth_tbs": w.FloatSlider(value=round(spec.bandwidth_bytes_per_s / 1e12, 2), min=0.5, max=20,
                                       step=0.1, description="TB/s"),
        "overhead_ms": w.FloatSlider(value=round(oh0, 2), min=0, max=30, step=0.1, description="overhead ms"),
    }
    message = w.HTML(value="")
    fig, out = _empty_figure(), w.Output()

    def update(_change: Any = None) -> None:
        vals = {k: s.value for k, s in sliders.items()}
        try:
            state = explorer_state(gpu, calibration=calib, context=context, **vals)
        except ValueError as e:
            message.value = f"<b>not drawn:</b> {e}"
            return
        message.value = ""
        _draw(fig, state)
        out.clear_output(wait=True)
        with out:
            fig.show()

    for s in sliders.values():
        s.observe(update, names="value")
    update()
    return w.VBox([w.HBox(list(sliders.values())[:3]), w.HBox(list(sliders.values())[3:]), message, out])
