"""Generated blocks and figures of papers/context_diagnosis.md from ``context_sweep.json``.

Every number comes from the measurement file (``python -m workbench.bench.sweep --h200``), default
``data/measurements/h200/context_sweep.json``; the sentences here are computed from it ("the largest term at 64k is
X"); the interpretation is the lead's, in the paper's marked places. Figures are plotly HTML files (plotly.js from
its CDN, fixed div ids, so a regeneration is byte-identical) under ``papers/figures/context_diagnosis/``.

    python -m workbench.reports.context [--data FILE]            # rewrite the paper's blocks and its figures
    python -m workbench.reports.context [--data FILE] --check    # exit 1 if either is stale
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any, Callable

import plotly.graph_objects as go

from workbench import REPO_ROOT
from workbench.bench.engine import attention_flops
from workbench.engine.attention import verify_chunk_keys, verify_row_blocks
from workbench.hardware import get_gpu
from workbench.measure import load_measurement
from workbench.reports import papers
from workbench.reports.papers import json_or_none, markdown_table, number, signed_percent
from workbench.sweep import figures
from workbench.sweep.engine import model_config, reserve
from workbench.sweep.run import from_measurement, samples_of

PAPER = REPO_ROOT / "papers" / "context_diagnosis.md"
DATA = REPO_ROOT / "data" / "measurements" / "h200" / "context_sweep.json"
FIGURES = REPO_ROOT / "papers" / "figures" / "context_diagnosis"
TERMS = ("draft", "tree_build", "verify_attention", "moe", "accept_commit", "rest")
MISSING = ("Not measured yet: `data/measurements/h200/context_sweep.json` is not committed "
           "(`python -m workbench.bench.sweep --h200 --out data/measurements/h200`).\n")


def load(path: Path | str | None = None) -> dict[str, Any] | None:
    """The measurement file at ``path`` (default :data:`DATA`), or None when it does not exist."""
    return json_or_none(path if path is not None else DATA)


def nearest(values, target: int) -> int:
    return min(values, key=lambda v: (abs(v - target), v))


# ----------------------------------------------------------------------------- blocks

def block_provenance(doc) -> str:
    if doc is None:
        return MISSING
    pv, par, res = doc["provenance"], doc["parameters"], doc["results"]
    gpu = pv.get("gpu") or "CPU"
    est = res.get("estimate")
    lines = [f"- Measured on {gpu} at commit `{str(pv.get('git_commit'))[:12]}` ({pv.get('date_utc')}); torch "
             f"{pv.get('torch')}.",
             f"- Model: synthetic {par['synthetic']}, {par['layers']} layers, {par.get('experts')} routed experts per "
             f"layer; block {par['block']}, budget {par['budget']}; prefill: {par['prefill']}.",
             f"- Contexts {par['contexts']}; methods {par['methods']} (ScriptedDrafter p_top {par['p_top']}); "
             f"two-point {par['two_point']} (fastest of {par['repeats']}); full sustained run of {par['generate']} "
             f"tokens at {par['sustained_at']}, elsewhere over the two-point's B tokens; concurrency "
             f"{par['concurrency']} at context {par['concurrency_context']} for {par.get('concurrency_generate')} "
             "tokens each."]
    secs = par.get("part_seconds") or {}
    runs = secs if isinstance(secs, list) else [secs]
    if any(runs):
        said = "; ".join(", ".join(f"{k} {v:.0f} s" for k, v in r.items()) for r in runs if r)
        lines.append(f"- Measured run time: {sum(sum(r.values()) for r in runs):.0f} s in {len(runs)} process"
                     f"{'es' if len(runs) > 1 else ''} ({said}), model build and captures not counted.")
    if est and not par.get("merged_from"):   # a merged file's part estimates are in parameters.merged_from
        lines.append(f"- Plan estimate before the run: {est['total_s']:.0f} s ({est['basis']}).")
    if doc.get("notes"):
        lines.append(f"- Notes of the file: {doc['notes']}")
    return "\n".join(lines) + "\n"


def rate_rows(doc) -> list[dict[str, Any]]:
    out = []
    for r in doc["results"]["contexts"]:
        cs, ct = r["check_sustained"], r.get("check_two_point") or {}
        out.append({"context": r["context"], "method": r["method"], "TTFT ms": number(r.get("ttft_ms"), 0),
                    "step ms": number(r["mean_step_ms"], 2),
                    "accepted": number(r["mean_accepted"], 2), "sustained t/s (tokens)":
                        f"{number(r['sustained'])} ({r.get('sustained_tokens', r['generated'])})",
                    "two-point t/s": number(r["two_point"]), "accepted/step t/s": number(cs["identity"]),
                    "sustained vs identity": signed_percent(cs["disagreement"]),
                    "two-point vs identity": signed_percent(ct.get("disagreement")), "within 5%": cs["within"]})
    return out


def block_rates(doc) -> str:
    if doc is None:
        return MISSING
    rows = doc["results"]["contexts"]
    n_in = sum(r["check_sustained"]["within"] for r in rows)
    worst = max(rows, key=lambda r: abs(r["check_sustained"]["disagreement"]))
    return (markdown_table(rate_rows(doc)) + f"\nThe sustained rate agrees with mean accepted length / mean step time "
            f"within 5% at {n_in} of {len(rows)} points (issue 26's goal); the largest disagreement is "
            f"{signed_percent(worst['check_sustained']['disagreement'])} ({worst['method']} at {worst['context']}).\n")


def terms_at(doc, context: int) -> list[dict[str, Any]]:
    """Per method at ``context``: the per-step terms (ms) and the largest."""
    out = []
    for r in doc["results"]["contexts"]:
        t = r.get("terms")
        if r["context"] != context or not t:
            continue
        big = max(TERMS, key=lambda k: t[k])
        out.append({"method": r["method"], "wall ms": number(t["wall_ms"], 2), "GPU busy ms": number(t["gpu_busy_ms"], 2),
                    **{k: number(t[k], 2) for k in TERMS}, "largest": f"{big} ({100 * t[big] / t['wall_ms']:.0f}%)"})
    return out


def block_dominant(doc) -> str:
    if doc is None:
        return MISSING
    ctxs = sorted({r["context"] for r in doc["results"]["contexts"]})
    parts = []
    for target, label in ((5000, "about 5k (the source's point)"), (65536, "64k")):
        c = nearest(ctxs, target)
        rows = terms_at(doc, c)
        if not rows:
            parts.append(f"At {label} (context {c}): no per-step terms in this file (they come from the CUDA "
                         "profiler's records of the captured step; a CPU run has none).\n")
            continue
        said = "; ".join(f"{r['method']}: {r['largest']}" for r in rows)
        parts.append(f"At {label} (context {c}) the largest term of a step is, per method: {said}.\n\n"
                     + markdown_table(rows))
    return "\n".join(parts)


def floor_rows(doc, engine_step=None) -> list[dict[str, Any]]:
    """Per (context, method) of the sweep: the step's floor, from ``engine_step.json``'s C = 1 graph rows (same
    model shape; its measured copy bandwidth and bf16 matmul rate): the weight bytes it read outside the routed
    experts, the routed experts of this run's expert count (greedy: top-k per layer; DDTree: the distinct experts of
    the tree's nodes, the uniform-routing expectation scaled by the engine run's measured distinct / expected), the
    KV rows at this context, and the verify attention's FLOPs at this context; floor = max(bytes / bandwidth,
    FLOPs / matmul rate)."""
    es = engine_step if engine_step is not None else load_measurement("engine_step", "h200")
    par = doc["parameters"]
    if not es or (es["parameters"].get("model"), es["parameters"].get("layers")) != (par["synthetic"], par["layers"]):
        return []
    res = es["results"]
    bw, mm = res["copy_bandwidth_gbps"] * 1e9, res["bf16_matmul_tflops"] * 1e12
    cfg = model_config(par["synthetic"], par["layers"])
    E, k, L = par["experts"], cfg.num_experts_per_tok, par["layers"]
    E0 = res["experts"]
    moe_layers = sum(cfg.is_moe_layer(i) for i in range(L))
    out = []
    for r in doc["results"]["contexts"]:
        want = "greedy" if r["method"] == "greedy" else "ddtree"
        base = next((x for x in res["rows"] if x["C"] == 1 and x["method"] == want and x["path"] == "graph"
                     and x.get("fuse", "eager") == "eager"), None)
        if base is None:
            continue
        b = base["bytes_by_part"]
        T = base["tokens_per_request_step"]
        per_expert = b["routed_experts"] / (base["distinct_experts_median"] * moe_layers)
        if T == 1:
            distinct = k
        else:
            seen = base["distinct_experts_median"] / (E0 * (1 - (1 - k / E0) ** T))
            distinct = min(E, E * (1 - (1 - k / E) ** T) * seen)
        c = r["context"]
        weights = sum(b[p] for p in ("attention", "dense_mlp", "router", "shared_experts", "lm_head"))
        kv = c * cfg.kv_bytes_per_token("bf16")
        flops = base["flops"] + attention_flops(cfg, L, T, c - es["parameters"]["prefix"])
        nbytes = weights + distinct * per_expert * moe_layers + kv
        floor = max(nbytes / bw, flops / mm) * 1e3
        out.append({"context": c, "method": r["method"], "weights GB": number(weights / 1e9, 2),
                    "routed experts GB": number(distinct * per_expert * moe_layers / 1e9, 2),
                    "KV GB": number(kv / 1e9, 2), "bytes ms": number(nbytes / bw * 1e3, 2),
                    "FLOPs ms": number(flops / mm * 1e3, 2), "floor ms": number(floor, 2),
                    "step ms": number(r["mean_step_ms"], 2), "share of floor": f"{100 * floor / r['mean_step_ms']:.0f}%"})
    return out


def block_floors(doc) -> str:
    if doc is None:
        return MISSING
    rows = floor_rows(doc)
    if not rows:
        return ("No `engine_step.json` of this model shape (model and layers) for the floor's terms: the floors come "
                "from the engine benchmark's H200 rows.\n")
    return (markdown_table(rows) + "\nBandwidth and matmul rate: `engine_step.json`'s measured copy bandwidth and "
            "bf16 matmul rate on this H200; the routed experts and FLOPs are modelled as this function's docstring "
            "says (`workbench.reports.context.floor_rows`).\n")


def part_contexts(doc, context: int) -> list[int]:
    """The contexts of the run (one process) that measured ``context``: one engine, sized by its longest."""
    for m in doc["parameters"].get("merged_from") or []:
        ctxs = (m.get("plan") or {}).get("contexts") or []
        if context in ctxs:
            return ctxs
    return doc["parameters"]["contexts"]


def verify_rows(doc) -> list[dict[str, Any]]:
    """Per DDTree context (C = 1): the captured step's verify attention (kernel records, ms per step) against its
    FLOP floor (nodes x heads x keys x (576 + 512) multiply-adds per layer at the GPU's dense bf16 rate) and the
    keys each thread block streams (:func:`workbench.engine.attention.verify_chunk_keys`: the engine's capacity,
    not the live prefix, is split into chunks)."""
    par, pv = doc["parameters"], doc["provenance"]
    cfg = model_config(par["synthetic"], par["layers"])
    H = cfg.num_attention_heads
    T = par["budget"] + 1
    sms = int(pv.get("gpu_sm_count") or 132)
    peak = get_gpu("h200").dense_bf16_flops
    out = []
    for r in doc["results"]["contexts"]:
        t = r.get("terms")
        if not t or r["method"] != "ddtree-high":
            continue
        c = r["context"]
        cap = max(part_contexts(doc, c)) + par["generate"] + reserve(par["block"], par["budget"])
        keys = verify_chunk_keys(cap, T, H, 1, sms)
        rb = verify_row_blocks(T, H)
        live = -(-(c + T) // keys)
        floor_ms = attention_flops(cfg, par["layers"], T, c) / peak * 1e3
        out.append({"context": c, "engine capacity": cap, "keys per thread block": keys,
                    "thread blocks with keys": f"{rb * live} of {rb * (sms // rb)}",
                    "longest block (keys)": min(c + T, keys), "verify ms": number(t["verify_attention"], 2),
                    "FLOP floor ms": number(floor_ms, 2), "share of floor": f"{100 * floor_ms / t['verify_attention']:.0f}%",
                    "ms per 1k keys of the longest block": number(t["verify_attention"] / min(c + T, keys) * 1e3, 2)})
    return out


def block_verify(doc) -> str:
    if doc is None:
        return MISSING
    rows = verify_rows(doc)
    if not rows:
        return "No per-step terms in this file (CUDA profiler records of the captured step).\n"
    return (markdown_table(rows) + f"\nFLOP floor at the H200's datasheet dense bf16 rate "
            f"({doc['parameters']['budget'] + 1} nodes; both methods' verify terms are in the terms table above).\n")


def overstatement_rows(doc) -> list[dict[str, Any]]:
    """At each context with the full sustained run: two-point / sustained - 1, and its parts: the accepted length and
    step time of the first B tokens' steps against the whole run's (from the samples)."""
    par, out = doc["parameters"], []
    B = par["two_point"][1]
    for r in doc["results"]["contexts"]:
        if r["context"] not in par["sustained_at"] or r["two_point"] is None:
            continue
        s = samples_of(doc, r["context"], r["method"])
        row = {"context": r["context"], "method": r["method"], "two-point t/s": number(r["two_point"]),
               "sustained t/s": number(r["sustained"]), "overstatement": signed_percent(r["two_point"] / r["sustained"] - 1)}
        if s and s["accepted"]:
            n, tok = 0, 0
            while n < len(s["accepted"]) and tok < B:
                tok += s["accepted"][n]
                n += 1
            a_early, a_all = statistics.fmean(s["accepted"][:n]), statistics.fmean(s["accepted"])
            t_early, t_all = statistics.fmean(s["step_ms"][:n]), statistics.fmean(s["step_ms"])
            row.update({"accepted first B / all": f"{a_early:.2f} / {a_all:.2f}",
                        "step ms first B / all": f"{t_early:.2f} / {t_all:.2f}",
                        "rate ratio from accepted": f"{a_early / a_all:.3f}", "from step time": f"{t_all / t_early:.3f}"})
        out.append(row)
    return out


def block_two_point(doc) -> str:
    if doc is None:
        return MISSING
    rows = overstatement_rows(doc)
    if not rows:
        return "No context has both the full sustained run and a two-point rate in this file.\n"
    return (markdown_table(rows) + "\nThe two-point rate measures the steps of the B tokens after the first A; the "
            "sustained rate all steps of the long run. The two ratios on the right are how much of the overstatement "
            "each term explains (their product is the early window's rate over the whole run's).\n")


def layout_rows(doc, context: int) -> list[dict[str, Any]]:
    lay = [r for r in doc["results"]["layout"] if r["context"] == context]
    base = next((r["attention_ms"] for r in lay if r["layout"] == "contiguous"), None)
    return [{"layout": r["layout"], "runs/request": number(r["runs_per_request"], 1),
             "mean run (tokens)": number(r["mean_run_length"], 2), "runs at context": r["context_runs"],
             "attention ms": number(r["attention_ms"], 4),
             "vs contiguous": signed_percent(r["attention_ms"] / base - 1) if base else "-"} for r in lay]


def block_fragmentation(doc) -> str:
    if doc is None:
        return MISSING
    ctxs = sorted({r["context"] for r in doc["results"]["layout"]})
    c = nearest(ctxs, 65536)
    lay = {r["layout"]: r for r in doc["results"]["layout"] if r["context"] == c}
    text = f"At context {c}, one layer's verify attention over a request's slots laid out by each layout:\n\n"
    text += markdown_table(layout_rows(doc, c))
    if {"contiguous", "scattered", "compacted"} <= set(lay):
        cost = lay["scattered"]["attention_ms"] - lay["contiguous"]["attention_ms"]
        buys = lay["scattered"]["attention_ms"] - lay["compacted"]["attention_ms"]
        layers = doc["parameters"]["layers"]
        text += (f"\nFragmentation's cost at {c}: {cost * 1e3:+.1f} us per layer ({cost * layers:+.3f} ms per step over "
                 f"{layers} layers) for scattered against contiguous slots; compaction changes the scattered time by "
                 f"{-buys * 1e3:+.1f} us per layer and the mean run from {lay['scattered']['mean_run_length']:.2f} to "
                 f"{lay['compacted']['mean_run_length']:.2f} tokens.\n")
    text += "\nEach layout's attention time against contiguous slots at every context of the run:\n\n"
    return text + markdown_table(layout_spread_rows(doc))


def layout_spread_rows(doc) -> list[dict[str, Any]]:
    """Per context: each layout's attention time relative to contiguous slots (one row per context)."""
    rows = doc["results"]["layout"]
    out = []
    for c in sorted({r["context"] for r in rows}):
        at = {r["layout"]: r["attention_ms"] for r in rows if r["context"] == c}
        base = at.get("contiguous")
        out.append({"context": c, "contiguous ms": number(base, 4),
                    **{lay: signed_percent(ms / base - 1) if base else "-" for lay, ms in at.items() if lay != "contiguous"}})
    return out


def block_source(doc) -> str:
    if doc is None:
        return MISSING
    rows = doc["results"]["decomposition"]
    src = rows[0]
    c = nearest(sorted({r["context"] for r in rows[1:]}), src["context"])
    here = [r for r in rows[1:] if r["context"] == c]
    out = [{"source": r["source"], "context": r["context"], "method": r["method"], "accepted": number(r["mean_accepted"], 2),
            "step ms": number(r["mean_step_ms"], 2), "accepted/step t/s": number(r["accepted/step"]),
            "sustained t/s": number(r["sustained"]), "two-point t/s": number(r["two_point"])} for r in [src] + here]
    text = (f"The source: {src['mean_accepted']} tokens per step / {src['mean_step_ms'] / 1e3:.3f} s = "
            f"{src['accepted/step']:.1f} tokens/s (its sustained {src['sustained']}, two-point {src['two_point']}). "
            f"This run at context {c}:\n\n" + markdown_table(out))
    for r in here:
        if r["method"] != "greedy":
            text += (f"\n- {r['method']}: at the source's accepted length {src['mean_accepted']}, this run's step "
                     f"{r['mean_step_ms']:.2f} ms would give {src['mean_accepted'] / r['mean_step_ms'] * 1e3:.1f} "
                     f"tokens/s; at the source's step {src['mean_step_ms']} ms, this run's accepted "
                     f"{r['mean_accepted']:.2f} would give {r['mean_accepted'] / src['mean_step_ms'] * 1e3:.1f}.")
    return text + "\n"


def block_concurrency(doc) -> str:
    if doc is None:
        return MISSING
    rows = [{"C": r["concurrency"], "method": r["method"], "per-request t/s": number(r["per_request_mean"]),
             "aggregate t/s": number(r["aggregate"]), "step ms": number(r["mean_step_ms"], 2),
             "accepted": number(r["mean_accepted"], 2)} for r in doc["results"]["concurrency"]]
    return markdown_table(rows)


def block_figures(doc) -> str:
    if doc is None:
        return MISSING
    return "".join(f"- [{title}](figures/context_diagnosis/{name}.html)\n" for name, title, _ in FIGURE_SPECS)


# ----------------------------------------------------------------------------- figures

def _terms_figure(doc):
    rows = [r for r in doc["results"]["contexts"] if r.get("terms")]
    x = [f"{r['method']} @ {r['context']}" for r in rows]
    fig = go.Figure()
    for k in TERMS:
        fig.add_bar(x=x, y=[r["terms"][k] for r in rows], name=k)
    fig.update_layout(barmode="stack", title="Per-step terms of the captured step (kernel records)" +
                      ("" if rows else ": none in this file"), yaxis_title="ms per step")
    return fig


def _sweep_figure(name: str, **kw) -> Callable:
    """A figure of :mod:`workbench.sweep.figures` over the file's rows (``kw``: doc -> keyword arguments)."""
    def make(doc):
        return getattr(figures, name)(from_measurement(doc), **{k: f(doc) for k, f in kw.items()})
    return make


FIGURE_SPECS: tuple[tuple[str, str, Callable], ...] = (
    ("rate_vs_context", "Tokens/s against context: sustained, two-point, accepted / step",
     _sweep_figure("rate_vs_context")),
    ("step_vs_context", "Step time against context", _sweep_figure("step_vs_context")),
    ("over_generation", "Accepted length and step time over the long generation",
     _sweep_figure("accepted_over_generation", context=lambda d: nearest(d["parameters"]["sustained_at"], 5000))),
    ("terms", "Per-step terms per (method, context)", _terms_figure),
    ("layout", "KV layout: runs and attention time", _sweep_figure("layout_figure")),
    ("concurrency", "Concurrency: per-request and aggregate tokens/s", _sweep_figure("concurrency_figure")),
)


def figure_files(doc) -> dict[str, str]:
    """{file name: HTML} of every figure (plotly.js from its CDN, fixed div ids: deterministic)."""
    if doc is None:
        return {}
    return {f"{name}.html": spec(doc).to_html(include_plotlyjs="cdn", full_html=True, div_id=f"fig-{name}")
            for name, _, spec in FIGURE_SPECS}


# ----------------------------------------------------------------------------- the paper

BLOCK_FUNCS = {"provenance": block_provenance, "floors": block_floors, "rates": block_rates, "dominant": block_dominant,
               "verify": block_verify, "two-point": block_two_point, "fragmentation": block_fragmentation, "source-arithmetic": block_source,
               "concurrency": block_concurrency, "figures": block_figures}


def blocks(doc) -> dict[str, Callable[[], str]]:
    return {k: (lambda f=f: f(doc)) for k, f in BLOCK_FUNCS.items()}


BLOCKS = blocks(load())


def render(text: str, doc=None) -> str:
    return papers.render(text, blocks(doc if doc is not None else load()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.reports.context", description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--paper", type=Path, default=PAPER)
    ap.add_argument("--figures", type=Path, default=FIGURES)
    ap.add_argument("--check", action="store_true", help="exit 1 if the paper or its figures are stale")
    a = ap.parse_args(argv)
    doc = load(a.data)
    text = a.paper.read_text()
    new = papers.render(text, blocks(doc))
    figs = figure_files(doc)
    stale_figs = [n for n, h in figs.items() if not (a.figures / n).exists() or (a.figures / n).read_text() != h]
    if a.check:
        stale = new != text or bool(stale_figs)
        print(f"{a.paper}: {'stale, regenerate with python -m workbench.reports.context' if stale else 'up to date'}"
              + (f" (figures: {', '.join(stale_figs)})" if stale_figs else ""))
        return 1 if stale else 0
    a.paper.write_text(new)
    if figs:
        a.figures.mkdir(parents=True, exist_ok=True)
        for n, h in figs.items():
            (a.figures / n).write_text(h)
    print(f"wrote {a.paper} ({len(papers.block_names(new))} generated blocks, {len(figs)} figures)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
