"""Plotly figures of notebook 03 from a :func:`workbench.sweep.run.sweep` document (rates tokens/s, times ms)."""
from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.engine.generate import PHASES


def _by(rows, key):
    out: dict[Any, list] = {}
    for r in rows:
        out.setdefault(r[key], []).append(r)
    return out


def _per_method_vs_context(doc: dict[str, Any], series, title: str, yaxis: str):
    """One line per (method, series) against context; ``series``: (label, row -> y, extra scatter kwargs)."""
    fig = go.Figure()
    for m, rows in _by(doc["contexts"], "method").items():
        x = [r["context"] for r in rows]
        for label, y, style in series:
            fig.add_scatter(x=x, y=[y(r) for r in rows], name=f"{m} {label}", **style)
    fig.update_layout(title=title, xaxis_title="context (tokens)", yaxis_title=yaxis, xaxis_type="log")
    return fig


def rate_vs_context(doc: dict[str, Any]):
    """Tokens/s against context per method: sustained (solid), two-point (dashed), accepted / step time (x)."""
    return _per_method_vs_context(doc, [
        ("sustained", lambda r: r["sustained"], dict(mode="lines+markers")),
        ("two-point", lambda r: r["two_point"], dict(mode="lines+markers", line=dict(dash="dash"))),
        ("accepted / step", lambda r: r["check_sustained"]["identity"], dict(mode="markers", marker=dict(symbol="x"))),
    ], "Decode rate against context", "tokens/s")


def step_vs_context(doc: dict[str, Any]):
    """Mean step wall time (ms) and TTFT (ms) against context per method."""
    return _per_method_vs_context(doc, [
        ("step", lambda r: r["mean_step_ms"], dict(mode="lines+markers")),
        ("TTFT", lambda r: r["ttft_ms"], dict(mode="lines+markers", line=dict(dash="dot"))),
    ], "Step time and TTFT against context", "ms")


def accepted_over_generation(doc: dict[str, Any], context: int | None = None):
    """Accepted length and step time of every step of the long generation at ``context`` (default: the longest)."""
    c = context or max(r["context"] for r in doc["contexts"])
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=("accepted length", "step ms"))
    for r in doc["contexts"]:
        if r["context"] == c:
            x = list(range(len(r["accepted"])))
            fig.add_scatter(x=x, y=r["accepted"], name=f"{r['method']} accepted", row=1, col=1)
            fig.add_scatter(x=x, y=r["step_ms"], name=f"{r['method']} step ms", row=2, col=1)
    fig.update_layout(title=f"Over the generation at context {c}")
    fig.update_xaxes(title_text="step", row=2, col=1)
    return fig


def layout_figure(doc: dict[str, Any]):
    """Per KV layout: mean run length (tokens, log) and the attention time over a request's slots per context."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("mean contiguous run (tokens)", "attention ms"))
    by = _by(doc["layout"], "layout")
    fig.add_bar(x=list(by), y=[rows[0]["mean_run_length"] for rows in by.values()], name="mean run", row=1, col=1)
    for lay, rows in by.items():
        fig.add_scatter(x=[r["context"] for r in rows], y=[r["attention_ms"] for r in rows], name=lay,
                        mode="lines+markers", row=1, col=2)
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_xaxes(title_text="context (tokens)", type="log", row=1, col=2)
    fig.update_layout(title="KV layout under churn: contiguous, scattered, compacted, greedy"
                      + ("" if by else " (not measured: engine only)"))
    return fig


def concurrency_figure(doc: dict[str, Any]):
    """Per-request (dashed) and aggregate (solid) tokens/s against concurrency C per method."""
    fig = go.Figure()
    for m, rows in _by(doc["concurrency"], "method").items():
        x = [r["concurrency"] for r in rows]
        fig.add_scatter(x=x, y=[r["aggregate"] for r in rows], name=f"{m} aggregate", mode="lines+markers")
        fig.add_scatter(x=x, y=[r["per_request_mean"] for r in rows], name=f"{m} per request",
                        mode="lines+markers", line=dict(dash="dash"))
    fig.update_layout(title="Concurrency", xaxis_title="C (requests decoded together)", yaxis_title="tokens/s")
    return fig


def decomposition_figure(rows: list[dict[str, Any]]):
    """accepted / step time against the measured sustained and two-point rates, the source's row first."""
    names = [f"{r['source']}: {r['method']} @ {r['context']}" for r in rows]
    fig = go.Figure()
    for key in ("accepted/step", "sustained", "two_point"):
        fig.add_bar(x=names, y=[r[key] for r in rows], name=key)
    fig.update_layout(title="Decomposition: tokens/s = accepted length / step time", yaxis_title="tokens/s",
                      barmode="group")
    return fig


def phases_figure(doc: dict[str, Any]):
    """Stacked ms per step of each phase (eager reference: draft, tree build, verify, accept, commit) per
    (method, context)."""
    rows = doc["phases"]
    x = [f"{r['method']} @ {r['context']}" for r in rows]
    fig = go.Figure()
    for p in PHASES:
        fig.add_bar(x=x, y=[r[p] for r in rows], name=p)
    fig.update_layout(title="Step phases (eager reference decode; verify = attention + MoE)"
                      + ("" if rows else " (not measured: engine only)"), yaxis_title="ms per step", barmode="stack")
    return fig
