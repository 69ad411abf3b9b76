"""Plotly figures and tables of the projection (what notebook 04 shows).

Tables are ``go.Table`` figures (pandas is not a dependency). Every function
computes from the model, the anchors and the measurement files.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import plotly.graph_objects as go

from workbench.decode import DEFAULT
from workbench.projection.calibration import Calibration, load_calibration
from workbench.projection.model import TERMS, TERM_NAMES, load_gpu
from workbench.projection.project import Projection, project
from workbench.projection.scenarios import (engine_step_comparison, overhead_comparison, plateau_check,
                                            pro6000_cross_check, scenario_rows, source_moe_percent,
                                            source_step_arithmetic, structural_whatifs)

TERM_COLORS = {"moe": "#1f77b4", "dense": "#aec7e8", "attention": "#2ca02c", "allreduce": "#ff7f0e",
               "draft": "#9467bd", "tree_build": "#8c564b", "overhead": "#d62728"}
DEFAULT_GPUS = ("rtx-pro-6000", "h200", "b300")


def table_figure(rows: Sequence[dict[str, Any]], title: str = "", height: int | None = None,
                 column_widths: Sequence[float] | None = None) -> go.Figure:
    """A go.Table of ``rows`` (dicts with the same keys)."""
    if not rows:
        raise ValueError("no rows to show")
    cols = list(rows[0])
    fig = go.Figure(go.Table(
        columnwidth=list(column_widths) if column_widths else None,
        header=dict(values=[f"<b>{c}</b>" for c in cols], align="left"),
        cells=dict(values=[[r[c] for r in rows] for c in cols], align="left")))
    fig.update_layout(title=title, margin=dict(l=10, r=10, t=40 if title else 10, b=10),
                      height=height or (120 + 60 * len(rows)))
    return fig


def terms_table() -> go.Figure:
    """The model's terms: formula, source, scaling rule."""
    return table_figure([{"term": t.name, "formula": t.formula, "source": t.source, "scaling": t.scaling}
                         for t in TERMS], "Step-cost terms", height=620, column_widths=[1, 4, 4, 2.5])


def calibration_table(calib: Calibration) -> go.Figure:
    rows = calib.describe()
    rows.append({"quantity": "files read", "source": "; ".join(calib.files) or "none (anchors only)",
                 "value": "; ".join(calib.notes) or "-"})
    return table_figure(rows, "Calibration", column_widths=[2, 3, 4])


def projection_table(res: Projection) -> go.Figure:
    rows = [{"accepted": res.accept_label(i), "low tok/s": f"{r['low']:.0f}", "central tok/s": f"{r['central']:.0f}",
             "high tok/s": f"{r['high']:.0f}"} for i, r in enumerate(res.tokens_per_s)]
    st = res.step_ms
    rows.append({"accepted": "step ms", "low tok/s": f"{st['low']:.2f}", "central tok/s": f"{st['central']:.2f}",
                 "high tok/s": f"{st['high']:.2f}"})
    s = res.shape
    return table_figure(rows, f"{res.gpu_name}: block {s.block}, budget {s.budget}, TP {s.tp}, "
                              f"context {s.context}, overhead {res.overhead_mode}")


def sensitivity_figure(res: Projection, top: int = 10) -> go.Figure:
    """Tornado: step time at each end of every ranged quantity (others central)."""
    sens = res.sensitivity[:top][::-1]
    base = res.step_ms["central"]
    names = [s["quantity"] for s in sens]
    fig = go.Figure()
    fig.add_bar(y=names, x=[s["step_ms_at_low"] - base for s in sens], orientation="h", name="at low end",
                base=base, marker_color="#6baed6")
    fig.add_bar(y=names, x=[s["step_ms_at_high"] - base for s in sens], orientation="h", name="at high end",
                base=base, marker_color="#fd8d3c")
    fig.update_layout(barmode="overlay", title=f"Which assumption moves the step ({res.gpu_name}, block "
                      f"{res.shape.block}, budget {res.shape.budget})", xaxis_title="step ms",
                      height=120 + 30 * len(sens), margin=dict(l=10, r=10, t=50, b=40))
    return fig


def breakdown_by_gpu(gpus: Iterable[str] = DEFAULT_GPUS, configs: Sequence[dict[str, Any]] | None = None,
                     calibration: Calibration | None = None, use_measurements: bool = False,
                     context: int = 1024) -> list[tuple[str, Projection]]:
    """Projections of each config on each GPU: (label, Projection) pairs.

    ``configs``: dicts of :func:`project` keyword arguments plus ``label``;
    default: the source's current drafter (block 8, budget 8, accepted 4.4) and
    the stronger drafter (block 16, budget 32, accepted 12).
    """
    calib = calibration or load_calibration(use_measurements=use_measurements)
    configs = configs or [{"label": "block 8, budget 8, acc 4.4", "block": 8, "budget": 8, "accept": (4.4,)},
                          {"label": f"block {DEFAULT.block}, budget {DEFAULT.budget}, acc 12", "block": DEFAULT.block,
                           "budget": DEFAULT.budget, "accept": (12,)}]
    out = []
    for cfg in configs:
        kw = {k: v for k, v in cfg.items() if k != "label"}
        for g in gpus:
            res = project(g, calibration=calib, context=context, **kw)
            out.append((f"{load_gpu(g).name.replace('NVIDIA ', '')}<br>{cfg['label']}", res))
    return out


def breakdown_figure(items: Sequence[tuple[str, Projection]], title: str | None = None) -> go.Figure:
    """Stacked bar of the central step breakdown, one bar per (label, projection), with the MoE
    share and the central tokens/s on top: the Amdahl shift as bandwidth grows."""
    labels = [lab for lab, _ in items]
    fig = go.Figure()
    for name in TERM_NAMES:
        fig.add_bar(x=labels, y=[r.breakdown["central"][name] for _, r in items], name=name,
                    marker_color=TERM_COLORS[name])
    for lab, r in items:
        step = r.step_ms["central"]
        moe_share = r.breakdown["central"]["moe"] / step * 100
        host = (r.breakdown["central"]["overhead"] + r.breakdown["central"]["tree_build"]) / step * 100
        fig.add_annotation(x=lab, y=step, yshift=22, showarrow=False,
                           text=f"{r.tokens_per_s[0]['central']:.0f} tok/s<br>MoE {moe_share:.0f}% | host {host:.0f}%")
    fig.update_layout(barmode="stack", yaxis_title="ms per step (central)", height=520,
                      title=title or "Step breakdown per GPU: as bandwidth grows the MoE term shrinks and the "
                                     "host overhead dominates (Amdahl)",
                      margin=dict(l=10, r=10, t=80, b=10), legend_traceorder="normal")
    return fig


def accept_sweep_figure(gpus: Iterable[str] = DEFAULT_GPUS, block: int = DEFAULT.block, budget: int = DEFAULT.budget,
                        calibration: Calibration | None = None, use_measurements: bool = False,
                        overhead_ms: float | None = None, overhead: str | float | None = None) -> go.Figure:
    """tokens/s against accepted length (1..block) per GPU, central line and low-high band (``overhead``,
    ``overhead_ms``: as :func:`workbench.projection.project.project`)."""
    calib = calibration or load_calibration(use_measurements=use_measurements)
    accepts = list(range(1, block + 1))
    fig = go.Figure()
    for g in gpus:
        res = project(g, block, budget, accepts, calibration=calib, overhead_ms=overhead_ms, overhead=overhead)
        name = load_gpu(g).name.replace("NVIDIA ", "")
        fig.add_scatter(x=accepts + accepts[::-1], y=[r["high"] for r in res.tokens_per_s] +
                        [r["low"] for r in res.tokens_per_s][::-1], fill="toself", opacity=0.2,
                        line=dict(width=0), showlegend=False, hoverinfo="skip", name=name)
        fig.add_scatter(x=accepts, y=[r["central"] for r in res.tokens_per_s], mode="lines+markers", name=name)
    fig.update_layout(title=f"tokens/s vs accepted length (block {block}, budget {budget}; bands = assumption ranges)",
                      xaxis_title="accepted length per step", yaxis_title="tokens/s (C=1)", height=450)
    return fig


def scenario_table(results: Sequence[Any], title: str = "The source's B300 scenarios beside this model") -> go.Figure:
    """Table of :func:`workbench.projection.scenarios.source_scenarios` results, reasons included."""
    rows = scenario_rows(list(results))
    # the reasons wrap: about 70 characters per line in their column at the default width
    height = 140 + sum(22 * (len(r["why they differ"]) // 70 + 1) for r in rows)
    return table_figure(rows, title, height=height, column_widths=[2.2, 0.8, 0.9, 1, 1, 0.7, 0.8, 6])


def source_arithmetic_table() -> go.Figure:
    """The source's own arithmetic and its MoE percentages, recomputed from its anchors."""
    a = source_step_arithmetic()
    rows = [{"quantity": "B300 step at the anchor (accepted / tok/s)", "value": f"{a['anchor_step_ms']:.2f} ms"},
            {"quantity": "MoE at M=9 on B300 (PRO 6000 anchor / bandwidth ratio)", "value": f"{a['moe_m9_ms']:.2f} ms"},
            {"quantity": "step - MoE = the source's 'overhead'",
             "value": f"{a['lumped_overhead_ms']:.2f} ms (source ~{a['source_overhead_ms']:g})"},
            {"quantity": "MoE at M=32 on B300", "value": f"{a['moe_m32_ms']:.2f} ms"}]
    for r in source_moe_percent():
        rows.append({"quantity": f"Marlin MoE at M={r['m']}: % of peak, INT4 payload only / with bf16 scales",
                     "value": f"{r['payload_pct_of_1_8']:.1f}% of 1.8 TB/s / {r['with_scales_pct_of_datasheet']:.1f}% of 1.79 TB/s"})
    for r in plateau_check():
        rows.append({"quantity": f"M={r['m']} on {r['gpu']}: byte time vs flop time per layer",
                     "value": f"{r['byte_ms']:.2f} ms vs {r['flop_ms']:.2f} ms "
                              f"({'bandwidth' if r['byte_ms'] > r['flop_ms'] else 'compute'}-bound)"})

    x = pro6000_cross_check()
    rows.append({"quantity": f"cross-check: 8x RTX PRO 6000 at block 8, budget 8, accepted {x['accept']:g} "
                             f"(source: {x['measured_tokens_per_s']:g} tok/s, accepted length not stated)",
                 "value": f"model {x['low']:.0f}-{x['central']:.0f}-{x['high']:.0f} tok/s, step {x['step_ms']:.1f} ms "
                          f"(source's verify forward: {x['source_verify_ms']:g} ms); 138.7 tok/s means accepted "
                          f"{x['implied_accept']:.1f} at this step"})
    return table_figure(rows, "The source's arithmetic, recomputed from its anchors", column_widths=[3, 2],
                        height=140 + 45 * len(rows))


def engine_step_table(calib: Calibration) -> go.Figure:
    """The committed H200 engine_step measurement beside the model's device terms for the same slice
    (:func:`workbench.projection.scenarios.engine_step_comparison`); not fitted."""
    rows = engine_step_comparison(calib)
    if rows is None:
        return table_figure([{"engine_step": "data/measurements/h200/engine_step.json is not committed yet"}],
                            "Measured engine step (H200)")
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    shown = [{"part": r["part"], "measured ms": fmt(r["measured ms"]), "model ms": fmt(r["model ms"]),
              "measured - model ms": fmt(r["measured - model ms"]), "note": r["note"]} for r in rows]
    return table_figure(shown, "Engine step measured on the H200 (K2.6-shaped slice, one GPU) beside the model's "
                               "device terms", column_widths=[2, 1, 1, 1.2, 4])


def structural_table(calibration: Calibration | None = None, **kw: Any) -> go.Figure:
    """:func:`workbench.projection.scenarios.structural_whatifs` as a table."""
    rows = structural_whatifs(calibration or load_calibration(use_measurements=False), **kw)
    return table_figure(rows, "Structural unknowns (not in the ranges): one change per row",
                        column_widths=[3, 1.2, 1, 1.2, 5], height=140 + 70 * len(rows))


def overhead_table(calib: Calibration, **kw: Any) -> go.Figure:
    """The overhead measured from the H200 engine step beside the source's ~12.5 ms
    (:func:`workbench.projection.scenarios.overhead_comparison`)."""
    rows = overhead_comparison(calib, **kw)
    return table_figure(rows, "Host overhead: the source's ~12.5 ms, the anchor calibration and the measured engine step",
                        column_widths=[2.2, 2.4, 1.3, 4, 2.6], height=160 + 75 * len(rows))


def overhead_breakdown_figure(items: Sequence[tuple[str, Projection]]) -> go.Figure:
    """Stacked central breakdown of the same projection under each overhead mode (label, Projection),
    with the overhead term split into host gaps and kernels below floor where it was measured."""
    labels = [f"overhead: {mode}" for mode, _ in items]
    fig = go.Figure()
    for name in TERM_NAMES:
        if name == "overhead":
            continue
        fig.add_bar(x=labels, y=[r.breakdown["central"][name] for _, r in items], name=name,
                    marker_color=TERM_COLORS[name])
    host, kern, other = [], [], []
    for _, r in items:
        mo = r.measured_overhead
        if mo is None:
            host.append(0.0), kern.append(0.0), other.append(r.breakdown["central"]["overhead"])
        else:
            t = mo["transfer"]["central"]
            host.append(t["host_ms"]), kern.append(t["kernel_ms"]), other.append(0.0)
    fig.add_bar(x=labels, y=other, name="overhead (calibrated / fixed)", marker_color=TERM_COLORS["overhead"])
    fig.add_bar(x=labels, y=host, name="overhead: host gaps (measured)", marker_color="#ff9896")
    fig.add_bar(x=labels, y=kern, name="overhead: kernels below floor (measured, scaled)", marker_color="#c49c94")
    for lab, (_, r) in zip(labels, items):
        fig.add_annotation(x=lab, y=r.step_ms["central"], yshift=14, showarrow=False,
                           text=f"{r.step_ms['central']:.2f} ms, {r.tokens_per_s[0]['central']:.0f} tok/s")
    s = items[0][1].shape
    fig.update_layout(barmode="stack", yaxis_title="ms per step (central)", height=480,
                      title=f"{items[0][1].gpu_name}, block {s.block}, budget {s.budget}, TP {s.tp}: the step with each "
                            f"overhead (measured mode: MoE, dense, attention at their floors)",
                      margin=dict(l=10, r=10, t=70, b=10))
    return fig
