"""Tables and plotly figures of the INT4 MoE measurements (notebook 02, papers/moe_int4.md, the README block).

Everything reads the committed measurements: ``data/measurements/<gpu>/moe_bandwidth.json`` (the sweep of the
dispatched path, ``python -m workbench.bench.moe``), :data:`CURRENT_REPEAT` (the same sweep repeated at the same
dispatch), :data:`SMALL_COMPARE` (the small-M kernels beside the four-launch path at M <= 16 in one process) and the
source's anchor points (``data/anchors/rtx_pro_6000_moe.json``); nothing here holds a measured number.
"""
from __future__ import annotations

import json
from typing import Any

import plotly.graph_objects as go
import torch

from workbench import DATA_DIR, display
from workbench.bench.moe_counts import make_routing, plateau_m, rel_error
from workbench.bench.moe_timing import IN_GRAPH_CALLS
from workbench.dispatch import dispatch_for
from workbench.kernels import resolve_device
from workbench.measure import load_measurement
from workbench.moe.dispatched import SMALL_COMPARE, small_path_rows
from workbench.moe.fused import (FOUR_LAUNCH, SMALL_KERNELS, fused_moe_int4, gpu_supported, large_variant, moe_plan,
                                 variant_name)
from workbench.moe.packing import random_int4_experts
from workbench.moe.reference import moe_reference

ANCHORS = DATA_DIR / "anchors" / "rtx_pro_6000_moe.json"
PEERS = {"bf16_cublas": "bf16 experts, cuBLAS per expert", "torch_int4pack": "torch int4 weight-only per expert",
         "dequant_matmul": "dequantise then matmul per expert"}


def load_anchors() -> dict[str, Any]:
    """The source's RTX PRO 6000 MoE points (with their quotes)."""
    return json.loads(ANCHORS.read_text())


def load_moe_bandwidth(gpu: str = "h200") -> dict[str, Any] | None:
    """The committed ``moe_bandwidth`` measurement for ``gpu``, or None."""
    return load_measurement("moe_bandwidth", gpu)


CURRENT_REPEAT = "moe_bandwidth_repeat"   # the full sweep again at moe_bandwidth.json's dispatch, a second process


def _dispatch_key(doc: dict[str, Any]) -> Any:
    """The small-M dispatch a sweep ran: its ``small_table`` (files before the dispatch was data) or
    ``dispatch.moe_small``."""
    par = doc["parameters"]
    return par["small_table"] if "small_table" in par else par.get("dispatch", {}).get("moe_small")


def load_moe_repeat(gpu: str = "h200") -> dict[str, Any] | None:
    """:data:`CURRENT_REPEAT`, the full sweep repeated at today's dispatch, or None when it is not committed or its
    small-M dispatch differs from ``moe_bandwidth``'s (then it repeats an older dispatch and says nothing of today's)."""
    doc, rep = load_moe_bandwidth(gpu), load_measurement(CURRENT_REPEAT, gpu)
    if not doc or not rep or _dispatch_key(rep) != _dispatch_key(doc):
        return None
    return rep


def parity_rows(hidden: int, intermediate: int, num_experts: int, topk: int, m_values: list[int],
                device: str = "auto", seed: int = 0) -> list[dict[str, Any]]:
    """fused_moe_int4 against the float32 reference on fresh random inputs, one row per (M, routing), with the kernel
    :func:`workbench.moe.fused.moe_plan` names (``moe_reference`` on the CPU)."""
    for name, v, lo in (("hidden", hidden, 1), ("intermediate", intermediate, 1), ("num_experts", num_experts, 1),
                        ("topk", topk, 1)):
        if not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    if topk > num_experts:
        raise ValueError(f"topk must be at most num_experts ({num_experts}), got {topk}")
    if not m_values or any(not isinstance(m, int) or not 1 <= m <= 65535 for m in m_values):
        raise ValueError(f"m_values must be a non-empty list of integers in [1, 65535], got {m_values!r}")
    dev = resolve_device(device)
    # experts are drawn where they will run (384 Kimi-sized experts are ~8.5 GB: seconds on a GPU)
    experts = random_int4_experts(num_experts, hidden, intermediate, device=dev, seed=seed)
    path = "CPU reference"
    if dev == "cuda":
        why = gpu_supported(experts)
        if why is None:
            path = "CUDA kernel"
        else:
            dev, path = "cpu", f"CPU reference (kernel: {why})"
            experts = experts.to("cpu")
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for m in m_values:
        for routing in ("uniform", "skewed"):
            ids, w = make_routing(m, num_experts, topk, routing, gen)
            x = torch.randn(m, hidden, generator=gen).to(torch.bfloat16)
            out = fused_moe_int4(x.to(dev), ids.to(dev), w.to(dev), experts).cpu()
            ref = moe_reference(x.to(dev), ids.to(dev), w.to(dev), experts).cpu()  # float32 dequantise-then-matmul
            plan = moe_plan(m, topk, dev, hidden=hidden, intermediate=intermediate)
            rows.append({"M": m, "routing": routing, "distinct experts": int(torch.unique(ids).numel()),
                         "rel err": rel_error(out, ref), "non-finite": int((~torch.isfinite(out)).sum()),
                         "path": path, "kernel": plan["kernel"]})
    return rows


def dispatch_rows(device_name: str = "NVIDIA H200", hidden: int = 7168, intermediate: int = 2048
                  ) -> list[dict[str, Any]]:
    """The MoE dispatch of ``device_name`` (data/dispatch) as rows: M range, path, kernel, its launches, for the
    experts' layout there (fragments where a small-M kernel runs: ``moe_large_frag`` beyond; else ``moe_large``)."""
    d = dispatch_for(device_name)
    rows, lo = [], 1
    for max_m, name in d.moe_small:
        rows.append({"M": f"{lo}-{max_m}", "path": "small-M", "kernel": name, "launches": ", ".join(SMALL_KERNELS[name][:2])})
        lo = max_m + 1
    if d.moe_small:
        for max_m, nt in d.moe_large_frag:
            name = f"frag_nt{nt}"
            rows.append({"M": f"{lo}-{max_m}" if max_m < 1 << 20 else f">= {lo}", "path": FOUR_LAUNCH,
                         "kernel": name, "launches": f"moe_align, moe_gate_up_{name}, moe_down_{name}, moe_combine"})
            lo = max_m + 1
        return rows
    for max_m, var in d.moe_large:
        name = variant_name(large_variant(var, hidden, intermediate))
        rows.append({"M": f"{lo}-{max_m}" if max_m < 1 << 20 else f">= {lo}", "path": FOUR_LAUNCH,
                     "kernel": f"{name} {tuple(var)}",
                     "launches": f"moe_align, moe_gate_up_{name}, moe_down_{name}, moe_combine"})
        lo = max_m + 1
    return rows


def anchor_rows(doc: dict[str, Any], anchors: dict[str, Any]) -> list[dict[str, Any]]:
    """The source's RTX PRO 6000 points beside the sweep's H200 rows at the same M (uniform routing)."""
    by_m = {r["m"]: r for r in doc["results"]["rows"] if r["routing"] == "uniform"}
    out = []
    for p in anchors["points"]:
        h = by_m.get(p["m"])
        out.append({"M": p["m"], f"source {anchors['gpu']} ms/layer": p["ms_per_layer"],
                    "H200 ms/layer (uniform)": h["ms_median"] if h else None,
                    "H200 % of copy": h["pct_of_copy"] if h else None,
                    "ratio source / H200": p["ms_per_layer"] / h["ms_median"] if h else None})
    return out


def table_figure(rows: list[dict[str, Any]], title: str = ""):
    """A plotly go.Table of a list of dicts (:func:`workbench.display.table`); an empty figure for no rows."""
    if not rows:
        fig = go.Figure()
        fig.update_layout(title=title + " (no rows)")
        return fig
    return display.table(rows, title=title)


def _rows(doc: dict[str, Any], routing: str) -> list[dict[str, Any]]:
    return sorted((r for r in doc["results"]["rows"] if r["routing"] == routing), key=lambda r: r["m"])


def ms_figure(doc: dict[str, Any] | None, anchors: dict[str, Any] | None = None):
    """ms per layer against M: ours (uniform, skewed), the peers, the floor, the source's RTX PRO 6000 points."""
    fig = go.Figure()
    if doc is not None:
        gpu = doc["provenance"].get("gpu", "GPU")
        for routing, dash in (("uniform", "solid"), ("skewed", "dot")):
            rr = _rows(doc, routing)
            ms = [r["m"] for r in rr]
            fig.add_trace(go.Scatter(x=ms, y=[r["ms_median"] for r in rr], mode="lines+markers",
                                     name=f"fused W4A16, {routing} ({gpu})", line={"dash": dash, "width": 3}))
            ig = [r for r in rr if r.get("ingraph_ms_median") is not None]
            if ig:
                fig.add_trace(go.Scatter(x=[r["m"] for r in ig], y=[r["ingraph_ms_median"] for r in ig],
                                         mode="lines+markers", line={"dash": dash, "width": 1},
                                         name=f"fused W4A16, {routing}, in-graph ({IN_GRAPH_CALLS} calls in one graph)"))
            fig.add_trace(go.Scatter(x=ms, y=[r["floor_ms"] for r in rr], mode="lines",
                                     name=f"floor (bytes / copy BW, flops / bf16 rate), {routing}",
                                     line={"dash": dash, "color": "black", "width": 1}))
            if routing == "uniform":
                for key, label in PEERS.items():
                    pts = [(r["m"], r[f"{key}_ms_median"]) for r in rr if f"{key}_ms_median" in r]
                    if pts:
                        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts],
                                                 mode="lines+markers", name=f"peer: {label}, uniform",
                                                 line={"width": 1}))
    if anchors is not None:
        pts = anchors["points"]
        fig.add_trace(go.Scatter(x=[p["m"] for p in pts], y=[p["ms_per_layer"] for p in pts], mode="markers",
                                 marker={"symbol": "star", "size": 14},
                                 name=f"source: {anchors['gpu']} INT4 Marlin MoE (seed article)"))
    fig.update_layout(title="INT4 MoE layer time vs tokens M (Kimi K2.6 experts: 384 x 7168 x 2048, top-8)",
                      xaxis={"title": "tokens M", "type": "log"}, yaxis={"title": "ms per layer", "type": "log"},
                      legend={"font": {"size": 10}})
    return fig


def pct_figure(doc: dict[str, Any] | None, anchors: dict[str, Any] | None = None,
               small: dict[str, Any] | None = None):
    """Achieved bandwidth as % of the copy bandwidth measured in the same run (one replay, in-graph and, where the file
    has it, the profiler's kernel span), with the source's 67-73% band;
    ``small`` (:func:`load_moe_small`) adds, from its own run, the points of the path dispatched today at
    each M <= 16 (:func:`dispatched_label`)."""
    fig = go.Figure()
    if small is not None:
        for routing in ("uniform", "skewed"):
            rr = [r for r in small_path_rows(small) if r["routing"] == routing]
            fig.add_trace(go.Scatter(x=[r["M"] for r in rr], y=[r["dispatched % copy"] for r in rr],
                                     mode="markers", marker={"symbol": "diamond", "size": 10},
                                     text=[r["dispatched"] for r in rr],
                                     name=f"dispatched path at M <= 16, {routing} ({small['name']}.json)"))
            ig = [r for r in rr if r.get("dispatched in-graph % copy") is not None]
            if ig:
                fig.add_trace(go.Scatter(x=[r["M"] for r in ig], y=[r["dispatched in-graph % copy"] for r in ig],
                                         mode="markers", marker={"symbol": "diamond-open", "size": 10},
                                         text=[r["dispatched"] for r in ig],
                                         name=f"same, in-graph ({IN_GRAPH_CALLS} calls in one graph), {routing}"))
    if doc is not None:
        for routing in ("uniform", "skewed"):
            rr = _rows(doc, routing)
            fig.add_trace(go.Scatter(x=[r["m"] for r in rr], y=[r["pct_of_copy"] for r in rr],
                                     mode="lines+markers", name=f"fused W4A16, {routing}: % of copy bandwidth"))
            ig = [r for r in rr if r.get("ingraph_pct_of_copy") is not None]
            if ig:
                fig.add_trace(go.Scatter(x=[r["m"] for r in ig], y=[r["ingraph_pct_of_copy"] for r in ig],
                                         mode="lines+markers", line={"dash": "dash"},
                                         name=f"fused W4A16, {routing}: in-graph % of copy"))
            sp = [r for r in rr if r.get("span_pct_of_copy") is not None]
            if sp:   # the kernels' device time, what the goal is judged on
                fig.add_trace(go.Scatter(x=[r["m"] for r in sp], y=[r["span_pct_of_copy"] for r in sp],
                                         mode="lines+markers", line={"dash": "dashdot"},
                                         name=f"fused W4A16, {routing}: kernels' device time (profiler span) % of copy"))
            fig.add_trace(go.Scatter(x=[r["m"] for r in rr], y=[r["pct_of_floor"] for r in rr],
                                     mode="lines", line={"dash": "dot"}, name=f"{routing}: % of floor (time)"))
    if anchors is not None:
        lo, hi = anchors["percent_of_peak"]["range"]
        fig.add_hrect(y0=lo, y1=hi, opacity=0.15, line_width=0,
                      annotation_text=f"source {anchors['gpu']}: {lo}-{hi}% of {anchors['peak_bandwidth_tb_per_s']} TB/s")
    fig.add_hline(y=80, line_dash="dash", annotation_text="goal at M <= 16: 80%")
    fig.update_layout(title="Achieved bandwidth vs M", xaxis={"title": "tokens M", "type": "log"},
                      yaxis={"title": "% of measured peak", "range": [0, 105]})
    return fig


def load_moe_small(gpu: str = "h200", name: str = SMALL_COMPARE) -> dict[str, Any] | None:
    """The committed comparison of the paths at M <= 16 (:data:`SMALL_COMPARE`), or None."""
    return load_measurement(name, gpu)


def dispatched_worst_pct(small: dict[str, Any], column: str = "dispatched % copy"
                         ) -> tuple[float, dict[str, Any]] | None:
    """Worst % of copy of the dispatched path over the comparison's rows, with that row; None if empty.
    ``column``: "dispatched % copy" (one replay), "dispatched queued % copy", "dispatched in-graph % copy" or
    "dispatched span % copy" (None when the file has no such column for today's path)."""
    rows = small_path_rows(small)
    missing = [(r["routing"], r["M"], r["dispatched"]) for r in rows if r["dispatched % copy"] is None]
    if missing:
        raise ValueError(f"{small['name']}.json did not time the dispatched path at {missing}: measure it again "
                         "(`python -m workbench.bench.moe`)")
    if not rows or any(r.get(column) is None for r in rows):
        return None
    worst = min(rows, key=lambda r: r[column])
    return worst[column], worst


def summary_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (routing, M): experts touched, ms, GB/s, % of copy, TFLOP/s, speedups over the peers."""
    out = []
    rows = doc["results"]["rows"]
    pm = {}
    for routing in {r["routing"] for r in rows}:
        rr = sorted((r for r in rows if r["routing"] == routing), key=lambda r: r["m"])
        p = plateau_m([r["m"] for r in rr], [r["ms_median"] for r in rr])
        pm[routing] = p if p is not None else f"> {rr[-1]['m']} (still falling)"
    for r in rows:
        row = {"routing": r["routing"], "M": r["m"], "experts": r["distinct_experts_median"],
               "ms": r["ms_median"], "GB/s": r["gb_per_s_median"], "% copy": r["pct_of_copy"],
               "in-graph ms": r.get("ingraph_ms_median"), "in-graph % copy": r.get("ingraph_pct_of_copy"),
               "TFLOP/s": r["tflops"], "ms/token": r["ms_per_token"], "plateau M*": pm[r["routing"]],
               "kernel": r.get("path", "-")}
        for key in PEERS:
            row[f"x vs {key}"] = r.get(f"speedup_vs_{key}", "-")
        out.append(row)
    return out


def goal_rows(doc: dict[str, Any], m_max: int = 16) -> list[dict[str, Any]]:
    """The issue's H200 goals against the measurement (uniform and skewed routing, M <= m_max)."""
    res = doc["results"]
    small = [r for r in res["rows"] if r["m"] <= m_max]

    def worst(key: str) -> float | None:
        vals = [r[key] for r in small if isinstance(r.get(key), (int, float))]
        return min(vals) if vals else None

    pct, sb, si = worst("pct_of_copy"), worst("speedup_vs_bf16_cublas"), worst("speedup_vs_torch_int4pack")
    ig, q, sp = worst("ingraph_pct_of_copy"), worst("queued_pct_of_copy"), worst("span_pct_of_copy")
    errs = [c["rel_err"] for c in res["checks"] if isinstance(c.get("rel_err"), float) and "peer" not in c]
    rows = []
    if sp is not None:   # the kernels' device time: what the bandwidth goal is judged on
        rows.append({"goal": f"% of copy bandwidth at M <= {m_max}, the kernels' device time (profiler: first kernel "
                             "start to last kernel end)", "target": ">= 80",
                     "measured (worst)": sp, "met": sp >= 80})
    rows.append({"goal": f"% of copy bandwidth at M <= {m_max}, in-graph ({IN_GRAPH_CALLS} calls back to back in one "
                         "graph)", "target": ">= 80", "measured (worst)": ig, "met": ig is not None and ig >= 80})
    if q is not None:
        rows.append({"goal": f"% of copy bandwidth at M <= {m_max}, one call's device time (queued behind a sleep "
                             "kernel)", "target": ">= 80", "measured (worst)": q, "met": q >= 80})
    rows.append({"goal": f"% of copy bandwidth at M <= {m_max}, one graph replay per call on an idle GPU (a lone "
                         "call's latency, host launch inside)", "target": ">= 80",
                 "measured (worst)": pct, "met": pct is not None and pct >= 80})
    rows += [
        {"goal": f"speedup over bf16 cuBLAS per expert, M <= {m_max}", "target": ">= 3", "measured (worst)": sb,
         "met": sb is not None and sb >= 3},
        {"goal": f"speedup over torch int4 per expert, M <= {m_max}", "target": ">= 2.5", "measured (worst)": si,
         "met": si is not None and si >= 2.5},
        {"goal": "rel. error vs float32 reference, every check", "target": "<= 1e-2, no NaN",
         "measured (worst)": max(errs) if errs else None, "met": bool(res["all_checks_ok"])},
    ]
    return rows


def call_time_rows(doc: dict[str, Any], m_max: int = 16) -> list[dict[str, Any]]:
    """One call timed four ways per row of a sweep with the profiler's spans (M <= ``m_max``): one replay on
    an idle GPU, queued, the profiler's kernel span and in-graph, in us, with one replay and queued minus the span;
    [] for a file without spans."""
    us = lambda v: f"{1e3 * v:.1f}"   # noqa: E731
    rows = [r for r in doc["results"]["rows"] if r["m"] <= m_max and "span_ms_median" in r]
    return [{"routing": r["routing"], "M": r["m"], "kernels": r["span_kernels"],
             "one replay us": us(r["ms_median"]), "queued us": us(r["queued_ms_median"]),
             "span us": us(r["span_ms_median"]), "in-graph us": us(r["ingraph_ms_median"]),
             "one - span us": f"{1e3 * (r['ms_median'] - r['span_ms_median']):+.1f}",
             "queued - span us": f"{1e3 * (r['queued_ms_median'] - r['span_ms_median']):+.1f}",
             "% copy one / queued / span / in-graph": " / ".join(
                 f"{r[k]:.1f}" for k in ("pct_of_copy", "queued_pct_of_copy", "span_pct_of_copy", "ingraph_pct_of_copy"))}
            for r in sorted(rows, key=lambda r: (r["routing"], r["m"]))]


def bandwidth_goal_rows(doc: dict[str, Any], m_max: int = 16) -> list[dict[str, Any]]:
    """The % of copy bandwidth rows of :func:`goal_rows`: the kernels' device time (the profiler's span, where the file
    has it), in-graph, queued (where the file has it), one replay."""
    return [r for r in goal_rows(doc, m_max) if r["goal"].startswith("% of copy bandwidth")]


def tuning_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """ms of each four-launch variant at each M (uniform routing), from the tuning step of the sweep the moe_large
    rows of data/dispatch/h200.json were set from (variants no longer compiled are in git history at
    :data:`workbench.reports.moe.HISTORY`)."""
    tun = doc["results"].get("tuning")
    if not tun:
        return []
    ms_keys = list(next(iter(tun["ms"].values())).keys())
    return [{"variant (NT, RT, D)": k, **{f"M={m}": v[m] for m in ms_keys}} for k, v in tun["ms"].items()]
