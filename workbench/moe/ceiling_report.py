"""Tables and a figure of run 24 (the streaming ceilings and diagnostic probes of the one-launch path).

Read from the committed measurement files of :mod:`workbench.moe.ceiling` and :mod:`workbench.moe.diag`:
``moe_stream_ceiling.json`` (the read kernel beside the dispatched path), ``moe_stream_ring.json`` and
``moe_stream_ring_sync.json`` (the CTA-split kernel's ring alone, and with a fence and a barrier added),
``moe_diag_decomposition.json`` and ``moe_diag_decomposition_act.json`` (the dispatched kernel in diagnostic
builds) and ``moe_clock_probe.json`` (SM clock and power with calls back to back). The paper blocks are
registered in :mod:`workbench.moe.report`; notebook 02 draws :func:`ceiling_figure`.
"""
from __future__ import annotations

from typing import Any

from workbench.measure import load_measurement
from workbench.papers import markdown_table

CEILING = "moe_stream_ceiling"
RINGS = ("moe_stream_ring", "moe_stream_ring_sync")
DECOMPOSITIONS = ("moe_diag_decomposition", "moe_diag_decomposition_act")
CLOCKS = "moe_clock_probe"
TIMINGS = (("one replay", ""), ("queued", "queued_"), ("in-graph", "ingraph_"))


def _load(name: str, gpu: str = "h200") -> dict[str, Any]:
    doc = load_measurement(name, gpu)
    if not doc:
        raise FileNotFoundError(f"data/measurements/{gpu}/{name}.json is not committed")
    return doc


def _source(doc: dict[str, Any], name: str) -> str:
    res = doc["results"]
    copy = f", copy {res['copy_gb_per_s']:.0f} GB/s in the same run" if "copy_gb_per_s" in res else ""
    return f"`{name}.json` (code {doc['provenance']['git_commit'][:7]}, {doc['provenance']['date_utc'][:10]}{copy})"


def _sources(names: tuple[str, ...]) -> tuple[list[dict[str, Any]], str]:
    """The committed files ``names`` and their provenance line (:func:`_source` each, joined)."""
    docs = [_load(n) for n in names]
    return docs, "; ".join(_source(d, n) for d, n in zip(docs, names))


def ceiling_rows(doc: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Per (routing, M): the dispatched path's and the fastest read shape's % of copy in each timing, and the
    dispatched path's share of the read kernel's rate (read time / its time)."""
    doc = doc or _load(CEILING)
    rows = []
    for r in doc["results"]["rows"]:
        row: dict[str, Any] = {"routing": r["routing"], "M": r["m"], "path": r["path"]}
        for lab, k in TIMINGS:
            row[f"ours % copy, {lab}"] = f"{r[f'ours_{k}pct_of_copy']:.1f}"
        for lab, k in TIMINGS:
            row[f"read % copy, {lab}"] = f"{r[f'read_best_{k}pct_of_copy']:.1f}"
        for lab, word in (("one replay", "one"), ("queued", "queued"), ("in-graph", "ingraph")):
            row[f"ours % of read, {lab}"] = f"{r[f'ours_pct_of_read_{word}']:.1f}"
        rows.append(row)
    return rows


def block_stream_ceiling() -> str:
    doc = _load(CEILING)
    shapes = ", ".join("({}, {}, {})".format(*c) for c in doc["parameters"]["configs"])
    return (f"From {_source(doc, CEILING)}; the read kernel at the launch shapes (loads in flight per thread, threads, "
            f"CTAs per SM) {shapes}, the fastest per row and timing; bytes counted as the fused path's for both; "
            f"checks (read kernel's XOR and word count, fused path's in-graph outputs) all ok = "
            f"{doc['results']['all_checks_ok']}:\n\n" + markdown_table(ceiling_rows(doc)))


def ring_rows(names: tuple[str, ...] = RINGS) -> list[dict[str, Any]]:
    """Per file, M and ring shape: its share of the read kernel's rate in each timing (the same process's)."""
    from workbench.moe.ceiling import _ring_label

    rows = []
    for name in names:
        doc = _load(name)
        labels = [_ring_label(tuple(c)) for c in doc["parameters"]["ring_configs"]]
        for r in doc["results"]["rows"]:
            for lab in labels:
                rows.append({"file": name, "M": r["m"], "ring": lab,
                             **{f"% of read, {t}": f"{r[f'{lab}_pct_of_read_{w}']:.1f}"
                                for t, w in (("one replay", "one"), ("queued", "queued"), ("in-graph", "ingraph"))},
                             "dispatched path, % of read in-graph": f"{r['ours_pct_of_read_ingraph']:.1f}"})
    return rows


def block_stream_ring() -> str:
    docs, src = _sources(RINGS)
    ok = all(d["results"]["all_checks_ok"] for d in docs)
    return (f"From {src}; uniform routing; `rr`: units handed out round robin as the kernel's static first tasks, "
            f"`flat`: equal contiguous shares; `_fence`: lane 0 fences after each unit; `_bar`: a block barrier every "
            f"7 stages; every ring and read check ok = {ok}:\n\n" + markdown_table(ring_rows()))


def decomposition_rows(names: tuple[str, ...] = DECOMPOSITIONS) -> list[dict[str, Any]]:
    """Per file, M and build: us per call in each timing and the in-graph time over the read kernel's."""
    rows = []
    for name in names:
        doc = _load(name)
        for r in doc["results"]["rows"]:
            builds = ["read", *doc["parameters"]["builds"]]
            for b in builds:
                rows.append({"file": name, "M": r["m"], "build": b,
                             **{f"{t} us": f"{r[f'{b}_{k}ms_median'] * 1e3:.1f}" for t, k in TIMINGS},
                             "in-graph % of copy": f"{r[f'{b}_ingraph_pct_of_copy']:.1f}",
                             "in-graph over read, us": "" if b == "read" else f"{r[f'{b}_ingraph_over_read_us']:.1f}"})
    return rows


def block_diag_decomposition() -> str:
    docs, src = _sources(DECOMPOSITIONS)
    ok = all(d["results"]["all_required_checks_ok"] for d in docs)
    return (f"From {src}; uniform routing; the dispatched kernel of each M in each build (`read`: the read kernel at "
            f"(8, 512, 4)); the diagnostic builds' outputs are wrong by design; the default build's in-graph "
            f"checks ok = {ok}:\n\n" + markdown_table(decomposition_rows()))


def clock_rows(doc: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    doc = doc or _load(CLOCKS)
    return [{"phase": r["phase"], "replays": r["replays"],
             "us per call, first 5 replays": f"{r['first5_ms_per_call'] * 1e3:.1f}",
             "us per call, second half": f"{r['second_half_ms_per_call'] * 1e3:.1f}",
             "SM MHz, median (min)": f"{r['sm_mhz_median']:.0f} ({r['sm_mhz_min']:.0f})",
             "power W, median (max)": f"{r['power_w_median']:.0f} ({r['power_w_max']:.0f})",
             "clock-event reasons": ", ".join(r["reasons"]) or "none"} for r in doc["results"]["rows"]]


def block_clock_probe() -> str:
    doc = _load(CLOCKS)
    p = doc["parameters"]
    return (f"From {_source(doc, CLOCKS)}; each phase replays one graph of {p['in_graph_calls']} calls for "
            f"{p['seconds']:.0f} s (1 s idle between phases), `nvidia-smi` every {p['smi_period_ms']} ms (the phase's "
            f"first tenth left out); `_gap`: a sleep of {p['gap_cycles']} cycles after every call (inside the per-call "
            f"time); idle SM clock before the first phase {doc['results']['idle_sm_mhz_median']:.0f} MHz:\n\n"
            + markdown_table(clock_rows(doc)))


def committed(gpu: str = "h200") -> bool:
    """True when run 24's files are committed for ``gpu`` (the notebook shows them only then)."""
    return all(load_measurement(n, gpu) for n in (CEILING, *RINGS, *DECOMPOSITIONS, CLOCKS))


def ceiling_figure(routing: str = "uniform", gpu: str = "h200"):
    """Plotly figure: % of copy against M for the dispatched path and the read kernel, in-graph and one replay."""
    import plotly.graph_objects as go

    doc = _load(CEILING, gpu)
    rows = [r for r in doc["results"]["rows"] if r["routing"] == routing]
    ms = [r["m"] for r in rows]
    fig = go.Figure()
    for who, pre, dash in (("dispatched fused path", "ours_", "solid"), ("read kernel (ceiling)", "read_best_", "dot")):
        for lab, k in (("in-graph", "ingraph_"), ("one replay", "")):
            fig.add_trace(go.Scatter(x=ms, y=[r[f"{pre}{k}pct_of_copy"] for r in rows], mode="lines+markers",
                                     name=f"{who}, {lab}", line={"dash": dash}))
    fig.add_hline(y=80, line_dash="dash", annotation_text="goal: 80% of copy")
    fig.update_layout(title=f"One-launch MoE at M <= 16 against a kernel that only reads the same bytes ({routing})",
                      xaxis_title="M (tokens)", yaxis_title="% of copy bandwidth", xaxis_type="log")
    return fig
