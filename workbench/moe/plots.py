"""Tables and plotly figures for notebooks/02_moe_bandwidth.ipynb.

Everything reads the committed measurements (``data/measurements/<gpu>/moe_bandwidth.json``,
the full sweep; ``moe_small_dispatch.json`` (:data:`SMALL_COMPARE`), the one-launch small-M kernels against the four-launch path
at M <= 16 in one run, the file :data:`workbench.moe.fused.SMALL_TABLE` was set from) and the source's anchor points (``data/anchors/rtx_pro_6000_moe.json``); nothing
here holds a measured number.
"""
from __future__ import annotations

import json
from typing import Any

import torch

from workbench import DATA_DIR
from workbench.kernels import resolve_device
from workbench.measure import load_measurement
from workbench.moe.bench import IN_GRAPH_CALLS, dispatched_path, make_routing, plateau_m, rel_error
from workbench.moe.fused import fused_moe_int4, gpu_supported, variant_name
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


CURRENT_REPEAT = "moe_bandwidth_repeat34"   # the full sweep again at moe_bandwidth.json's dispatch (run 34)


def load_moe_repeat(gpu: str = "h200") -> dict[str, Any] | None:
    """:data:`CURRENT_REPEAT`, the full sweep repeated at today's dispatch, or None when it is not committed or its
    small-M table differs from ``moe_bandwidth``'s (then it repeats an older dispatch and says nothing of today's)."""
    doc, rep = load_moe_bandwidth(gpu), load_measurement(CURRENT_REPEAT, gpu)
    if not doc or not rep or rep["parameters"].get("small_table") != doc["parameters"].get("small_table"):
        return None
    return rep


def parity_rows(hidden: int, intermediate: int, num_experts: int, topk: int, m_values: list[int],
                device: str = "auto", seed: int = 0) -> list[dict[str, Any]]:
    """fused_moe_int4 against the float32 reference on fresh random inputs, one row per (M, routing)."""
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
            rows.append({"M": m, "routing": routing, "distinct experts": int(torch.unique(ids).numel()),
                         "rel err": rel_error(out, ref), "non-finite": int((~torch.isfinite(out)).sum()),
                         "path": path})
    return rows


def table_figure(rows: list[dict[str, Any]], title: str = ""):
    """A plotly go.Table of a list of dicts (:func:`workbench.display.table`); an empty figure for no rows."""
    import plotly.graph_objects as go

    from workbench import display

    if not rows:
        fig = go.Figure()
        fig.update_layout(title=title + " (no rows)")
        return fig
    return display.table(rows, title=title)


def _rows(doc: dict[str, Any], routing: str) -> list[dict[str, Any]]:
    return sorted((r for r in doc["results"]["rows"] if r["routing"] == routing), key=lambda r: r["m"])


def ms_figure(doc: dict[str, Any] | None, anchors: dict[str, Any] | None = None):
    """ms per layer against M: ours (uniform, skewed), the peers, the floor, the source's RTX PRO 6000 points."""
    import plotly.graph_objects as go

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
    import plotly.graph_objects as go

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
            if sp:   # run 34 on: the kernels' device time, what the goal is judged on
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


SMALL_COMPARE = "moe_small_dispatch"   # every path fused.SMALL_TABLE dispatches, timed in one process


def load_moe_small(gpu: str = "h200", name: str = SMALL_COMPARE) -> dict[str, Any] | None:
    """A committed comparison of the paths at M <= 16 (``bench --small-compare NAME``), or None."""
    return load_measurement(name, gpu)


def one_launch_paths(small: dict[str, Any]) -> list[str]:
    """Labels of the one-launch paths a comparison timed ("small_fused" is version 3, then split-K names)."""
    return [p for p in small["parameters"].get("paths", ["small_fused", "four_launch"]) if p != "four_launch"]


dispatched_label = dispatched_path   # the comparison-file label of the path fused_moe_int4 runs today for M


def small_path_rows(small: dict[str, Any], topk: int | None = None) -> list[dict[str, Any]]:
    """Per (routing, M): every timed path's ms and % of copy from one run, the fastest, and the path
    ``fused_moe_int4`` dispatches today (:func:`dispatched_label`; its % of copy is None when this file
    did not time that path)."""
    k = topk or small["parameters"]["topk"]
    paths = one_launch_paths(small) + ["four_launch"]
    has_in_graph = any("dispatched" in r for r in small["results"]["rows"])
    out = []
    for r in sorted(small["results"]["rows"], key=lambda r: (r["routing"], r["m"])):
        row: dict[str, Any] = {"routing": r["routing"], "M": r["m"]}
        timed = {p: r[f"{p}_pct_of_copy"] for p in paths if f"{p}_pct_of_copy" in r}
        for p in paths:
            row[f"{p} ms"] = r.get(f"{p}_ms_median")
            row[f"{p} % copy"] = timed.get(p)
        row["fastest"] = max(timed, key=timed.get)
        d = dispatched_label(r["m"], k)
        row["dispatched"] = f"four_launch ({r['four_launch_variant']})" if d == "four_launch" else d
        row["dispatched % copy"] = timed.get(d)
        if has_in_graph:   # queued / in-graph columns (files from run 21 on), when they are of today's path
            same = r.get("dispatched") == d
            row["dispatched queued % copy"] = r.get(f"{d}_queued_pct_of_copy") if same else None
            row["dispatched in-graph % copy"] = r.get(f"{d}_ingraph_pct_of_copy") if same else None
            if any(k.endswith("_span_pct_of_copy") for k in r):   # the profiler's span (files from run 34 on)
                row["dispatched span % copy"] = r.get(f"{d}_span_pct_of_copy") if same else None
        out.append(row)
    return out


def timing_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Per row of a comparison file (:func:`load_moe_small`) from run 21 on: the dispatched path timed three ways
    (one replay on an idle GPU, queued behind a sleep kernel, in-graph) in microseconds, their differences and
    % of copy."""
    out = []
    for r in sorted(doc["results"]["rows"], key=lambda r: (r["routing"], r["m"])):
        d = r.get("dispatched")
        if not d or f"{d}_ingraph_ms_median" not in r:
            continue
        one, q, g = (r[f"{d}{k}_ms_median"] * 1e3 for k in ("", "_queued", "_ingraph"))
        out.append({"routing": r["routing"], "M": r["m"], "path": d, "one replay us": f"{one:.1f}",
                    "queued us": f"{q:.1f}", "in-graph us": f"{g:.1f}", "one - queued us": f"{one - q:+.1f}",
                    "queued - in-graph us": f"{q - g:+.1f}", "% copy one / queued / in-graph":
                        f"{r[d + '_pct_of_copy']:.1f} / {r[d + '_queued_pct_of_copy']:.1f} / "
                        f"{r[d + '_ingraph_pct_of_copy']:.1f}"})
    return out


def dispatched_worst_pct(small: dict[str, Any], column: str = "dispatched % copy"
                         ) -> tuple[float, dict[str, Any]] | None:
    """Worst % of copy of the dispatched path over the comparison's rows, with that row; None if empty.
    ``column``: "dispatched % copy" (one replay), "dispatched queued % copy", "dispatched in-graph % copy" or
    "dispatched span % copy" (None when the file has no such column for today's path)."""
    rows = small_path_rows(small)
    missing = [(r["routing"], r["M"], r["dispatched"]) for r in rows if r["dispatched % copy"] is None]
    if missing:
        raise ValueError(f"{small['name']}.json did not time the dispatched path at {missing}: re-run "
                         "`python -m workbench.moe.bench --small-compare` with that path")
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
               "kernel": r.get("path") or (variant_name(tuple(r["kernel_config"])) if len(r["kernel_config"]) == 5
                                          else str(r["kernel_config"]))}
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
    if sp is not None:   # the kernels' device time (run 34 on): what the issue's bandwidth goal is judged on
        rows.append({"goal": f"% of copy bandwidth at M <= {m_max}, the kernels' device time (profiler: first kernel "
                             "start to last kernel end; the goal's measure from run 34)", "target": ">= 80",
                     "measured (worst)": sp, "met": sp >= 80})
    rows.append({"goal": f"% of copy bandwidth at M <= {m_max}, in-graph ({IN_GRAPH_CALLS} calls back to back in one "
                         "graph)", "target": ">= 80", "measured (worst)": ig, "met": ig is not None and ig >= 80})
    if q is not None:   # files from run 21 on
        rows.append({"goal": f"% of copy bandwidth at M <= {m_max}, one call's device time (queued behind a sleep "
                             "kernel)", "target": ">= 80", "measured (worst)": q, "met": q >= 80})
    rows.append({"goal": f"% of copy bandwidth at M <= {m_max}, one graph replay per call on an idle GPU (a lone "
                         "call's latency, host launch inside; the goal's measure until run 34)", "target": ">= 80",
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
    """Run 34: one call timed four ways per row of a sweep with the profiler's spans (M <= ``m_max``): one replay on
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
    """ms of every compiled kernel variant at each M (uniform routing), from the run's tuning step."""
    tun = doc["results"].get("tuning")
    if not tun:
        return []
    ms_keys = list(next(iter(tun["ms"].values())).keys())
    return [{"variant (NT, RT, D)": k, **{f"M={m}": v[m] for m in ms_keys}} for k, v in tun["ms"].items()]


TRACE = "moe_ctasplit_trace"   # the timelines of the CTA-split kernels (workbench.moe.trace, -DMOE_TRACE build)


def load_moe_trace(gpu: str = "h200", name: str = TRACE) -> dict[str, Any] | None:
    """A committed ``python -m workbench.moe.trace`` run, or None."""
    return load_measurement(name, gpu)


def trace_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (variant, routing, M) of a trace run: where the call's time went (us from the first CTA's
    entry, medians over the traced calls; "a / b" pairs are gate_up / down)."""
    def pair(r: dict[str, Any], key: str, spec: str = ".2f") -> str:
        return f"{r[f'gate_up_{key}']:{spec}} / {r[f'down_{key}']:{spec}}"

    return [{"variant": r.get("variant", "ctasplit"), "routing": r["routing"], "M": r["m"],
             "per call us (default / traced build)": f"{1e3 * r['kernel_ms_median_default_build']:.1f} / "
                                                     f"{1e3 * r['kernel_ms_median_traced_build']:.1f}",
             "span": f"{r['span_us']:.1f}", "first stages": f"{r['first_stages_us_median']:.1f}",
             "last gate_up": f"{r['last_gate_up_barrier_us']:.1f}", "tail": f"{r['tail_us']:.1f}",
             "busy": f"{r['busy_fraction']:.2f}",
             "task": f"{r['gate_up_task_us_median']:.1f} / {r['down_task_us_median']:.1f}",
             "arrive spread": pair(r, "arrive_spread_us_median"),
             "last = prev. epilogue warp": pair(r, "last_is_prev_epilogue"),
             "epilogue": pair(r, "epilogue_us_median"), "fence": pair(r, "fence_us_median")}
            for r in doc["results"]["rows"]]


def trace_busy_figure(doc: dict[str, Any], m: int = 1, routing: str = "uniform"):
    """CTAs inside a task (warp 0's view) per microsecond of one traced call at M tokens, one line per variant."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for key, sample in doc["samples"].items():
        parts = key.split("/")
        variant, rt, mm = (parts if len(parts) == 3 else ["ctasplit", *parts])
        if rt != routing or mm != f"m{m}":
            continue
        s = sample["summaries"][0]
        fig.add_trace(go.Scatter(x=[i * s["bin_us"] for i in range(len(s["busy_ctas"]))], y=s["busy_ctas"],
                                 mode="lines", name=f"{variant} ({s['ctas']} CTAs)"))
    fig.update_layout(title=f"CTAs inside a task, {routing} routing, M = {m} (first traced call)",
                      xaxis={"title": "us from the first CTA's entry"}, yaxis={"title": "CTAs"})
    return fig


# The profiled one-launch kernels' ncu source pages (relative to data/measurements/<gpu>/): kernel, M, file.
STAGE_LOOP_PROFILES = (
    ("splitk_s4", 2, "moe_profile_8c7598f/sass_splitk_s4_m2.csv"),
    ("ctasplit_x4", 1, "moe_profile_8c7598f/sass_ctasplit_x4_m1.csv"),
    ("ctasplit_x4_b4", 1, "moe_small_x4_b4_logs/sass_ctasplit_x4_b4_m1.csv"),
    ("ctasplit_x4e", 1, "moe_small_xend_logs/sass_ctasplit_x4e_m1.csv"),
)


def stage_loop_rows(gpu: str = "h200") -> list[dict[str, Any]]:
    """The stage loops of the profiled kernels (:data:`STAGE_LOOP_PROFILES`, those committed), read from the SASS
    in their Nsight Compute source pages (:func:`workbench.moe.sass.stage_loops`): per loop its size, where the
    activation loads sit and how many register moves follow the last HMMA; [] when none is committed."""
    from workbench.moe.sass import read_source_csv, stage_loops

    rows = []
    for variant, m, rel in STAGE_LOOP_PROFILES:
        path = DATA_DIR / "measurements" / gpu / rel
        if not path.exists():
            continue
        for loop in stage_loops(read_source_csv(path)):
            rows.append({"kernel": variant, "M": m, "file": rel, "activation load": loop["load"],
                         "SASS instructions": loop["instructions"],
                         "HMMA at": f"{loop['first_hmma']}-{loop['last_hmma']}",
                         "activation loads at": ", ".join(map(str, loop["loads"])),
                         "loads after the last HMMA": loop["loads_after_last_hmma"],
                         "moves after the last HMMA": loop["moves_after_last_hmma"]})
    return rows

