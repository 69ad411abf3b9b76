"""Notebook 06's library side: a CPU demo of the pipeline and the figures and reading over an acceptance document.

:func:`cpu_demo` runs :func:`workbench.acceptance.run.run_pipeline` in seconds on a CPU (a tiny random Llama on byte
tokens, prompts from the Python standard library's functions, a few training steps) and returns a document shaped
like ``acceptance.json``; :func:`load_doc` reads the committed one. Figures: :func:`budget_figure` (accepted length
against budget per text type with bootstrap intervals, the chain and prompt lookup beside, the reference lines),
:func:`histogram_figure`, :func:`hit_rate_figure` (hit rate by depth), :func:`sibling_figure` (which child was
right, by depth), :func:`curves_figure` (training and validation curves of every drafter trained);
:func:`summary_rows` and :func:`reading` (the goals, met or missed by how much, and what the curves point to,
computed from the document).
"""
from __future__ import annotations

import json
from types import MappingProxyType

import numpy as np
import plotly.graph_objects as go

from workbench.acceptance.corpora import byte_tokenize, chat_prompt, stdlib_functions
from workbench.acceptance.drafters import DRAFTERS_DIR, drafter_info, drafter_names
from workbench.acceptance.measure import ACCEPTANCE_FILE
from workbench.acceptance.run import PipelineConfig, run_pipeline
from workbench.acceptance.target import tiny_llama
from workbench.hardware import gpu_ids
from workbench.measure import load_measurement
from workbench.validation import InvalidParameter, check_choice, check_int

__all__ = ["REFERENCES", "shipped_rows", "cpu_demo", "check_notebook", "load_doc", "measured_or_demo", "summary_rows", "budget_figure",
           "histogram_figure", "hit_rate_figure", "sibling_figure", "curves_figure", "reading", "GOAL", "goal",
           "DEFAULT_GPU"]

DEFAULT_GPU = "h100"
# (label, accepted length, where it comes from) - reference lines, quoted, not measured here
REFERENCES = (
    ("source: reasoning text", 2.9, "seed article, Kimi K2.6 + DFlash on 8 x RTX PRO 6000"),
    ("source: predictable text (low)", 7.0, "seed article"),
    ("DFlash, Qwen3-8B", 6.5, "DFlash paper"),
    ("DDTree paper, Qwen3-8B MATH-500, block 16", 10.7, "Ringel & Romano"),
)
GOAL = MappingProxyType({"budget": 32, "block": 16, "mean_accepted": {"math": 4.0, "code": 4.0, "chat": 3.0},
                         "first_position_hit": 0.7, "tree_over_chain": 1.3})


def check_notebook(demo_seconds: float, demo_prompts: int, budget: int, seed: int, gpu: str) -> None:
    """Notebook 06's input check (notebooks/parameters.yaml ``check``)."""
    if not isinstance(demo_seconds, (int, float)) or isinstance(demo_seconds, bool) or not 0 < demo_seconds <= 600:
        raise InvalidParameter("demo_seconds", demo_seconds, "a number in (0, 600]")
    check_int("demo_prompts", demo_prompts, lo=1, hi=64)
    check_int("budget", budget, lo=1, hi=512)
    check_int("seed", seed, lo=0)
    check_choice("gpu", gpu, gpu_ids())


def cpu_demo(demo_seconds: float = 4.0, demo_prompts: int = 3, seed: int = 0) -> dict:
    """The pipeline on a CPU in seconds: byte-tokenised prompts about the standard library's functions (always
    installed), a tiny random Llama target, two tiny drafters trained side by side for ``demo_seconds``, the
    replayed measurement on ``demo_prompts`` held-out prompts. Returns {"results": ..., "notes": ...}."""
    check_notebook(demo_seconds, demo_prompts, 32, seed, DEFAULT_GPU)
    fns = stdlib_functions(max_lines=8)
    order = np.random.default_rng(seed).permutation(len(fns))
    enc = [byte_tokenize(chat_prompt(fns[i].text[:60], system=None))[-60:] for i in order[:40 + demo_prompts]]
    sets = {"train": enc[:32], "validation": enc[32:40], "test_code": enc[40:40 + demo_prompts]}
    model = tiny_llama(vocab_size=256, hidden_size=64, layers=4, heads=4, kv_heads=2, intermediate=128, seed=seed)
    cfg = PipelineConfig(seed=seed, new_tokens=24, max_prompt=60, gen_batch=16, gen_seconds=None,
                         train_seconds=float(demo_seconds), batch=4, anchors=4, lr=3e-3, warmup=5, eval_every_s=1.0,
                         val_anchors=16, block=8, drafter_layers=1, target_layer_count=2, context_window=16,
                         mask_token_id=0, budgets=(8, 32), top_k=32, live_prompts=1, live_new=12, live_budget=8,
                         eos_token_id=None, amp=False)
    res, _, _ = run_pipeline(model, sets, cfg, progress=False,
                             dflash_kw={"num_heads": 4, "head_dim": 16, "intermediate_size": 128})
    res.pop("rounds")
    return {"results": res, "notes": "CPU demo: tiny random Llama and drafters on byte tokens, not measured data"}


def shipped_rows() -> list[dict]:
    """One row per shipped drafter (:mod:`workbench.acceptance.drafters`): name, block, layers, parameters, target,
    training steps and seconds, best validation loss, how it was initialised."""

    rows = []
    for n in drafter_names():
        info = drafter_info(n)
        tr = json.loads((DRAFTERS_DIR / n / "training.json").read_text())
        c = info["dflash_config"]
        rows.append({"name": n, "block": c["block"], "layers": c["num_layers"], "parameters": info.get("parameters"),
                     "target": info["target"]["name"], "steps": tr.get("steps"),
                     "seconds": round(tr.get("seconds") or 0.0), "init": tr.get("init"),
                     "best validation loss": round((tr.get("best") or {}).get("loss", float("nan")), 3)})
    return rows


def load_doc(gpu: str = DEFAULT_GPU) -> dict | None:
    """The committed ``data/measurements/<gpu>/acceptance.json`` or None (or a file of the older issue-28 layout,
    which these figures do not read: None too)."""

    doc = load_measurement(ACCEPTANCE_FILE, gpu)
    if doc is None or not doc["results"].get("rows") or "method" not in doc["results"]["rows"][0]:
        return None
    return doc


def measured_or_demo(gpu: str, demo: dict) -> dict:
    """The committed measurement for ``gpu`` when there is one, else ``demo`` (its notes say which)."""
    return load_doc(gpu) or demo


def _best(doc: dict) -> str:
    return doc["results"]["best_drafter"]


def _rows(doc: dict, method: str | None = None, drafter: str | None = "best") -> list[dict]:
    best = _best(doc)
    out = []
    for r in doc["results"]["rows"]:
        if method is not None and r["method"] != method:
            continue
        if r["method"] != "lookup" and drafter is not None and r["drafter"] != (best if drafter == "best" else drafter):
            continue
        out.append(r)
    return out


def summary_rows(doc: dict) -> list[dict]:
    """One row per (text type, drafter, method, budget): accepted length with its 95% interval, first-position hit
    rate, rounds and prompts."""
    return [{"text type": r["text_type"], "drafter": r["drafter"] or "-", "method": r["method"],
             "budget": r["budget"], "accepted length": round(r["mean_accepted"], 3),
             "95% interval": f"{r['ci95'][0]:.2f}-{r['ci95'][1]:.2f}",
             "depth-1 hit": (round(r["hit_by_depth"][0], 3) if r.get("hit_by_depth") else "-"),
             "rounds": r["rounds"], "prompts": r["prompts"]} for r in doc["results"]["rows"]]


def budget_figure(doc: dict, title: str = "Accepted length against budget (best drafter)"):
    """Mean accepted length (root included) against budget (log axis) per text type with 95% bootstrap intervals;
    the chain (one child per node) and prompt lookup as dashed / dotted lines; :data:`REFERENCES` in gray."""
    fig = go.Figure()
    tree = _rows(doc, "tree")
    for t in dict.fromkeys(r["text_type"] for r in tree):
        pts = sorted((r["budget"], r["mean_accepted"], r["ci95"]) for r in tree if r["text_type"] == t)
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=f"{t}: tree",
                                 error_y=dict(type="data", symmetric=False, array=[p[2][1] - p[1] for p in pts],
                                              arrayminus=[p[1] - p[2][0] for p in pts])))
        for m, dash in (("chain", "dash"), ("lookup", "dot")):
            r = next((r for r in _rows(doc, m) if r["text_type"] == t), None)
            if r:
                fig.add_trace(go.Scatter(x=[pts[0][0], pts[-1][0]], y=[r["mean_accepted"]] * 2, mode="lines",
                                         line=dict(dash=dash, width=1), name=f"{t}: {m}"))
    for label, y, _ in REFERENCES:
        fig.add_hline(y=y, line=dict(dash="dot", width=1, color="gray"), annotation_text=f"{label}: {y}",
                      annotation_position="top left", annotation_font_size=10)
    fig.update_xaxes(type="log", title="budget (tree nodes below the root)")
    fig.update_yaxes(title="mean accepted length per round (root included)", rangemode="tozero")
    fig.update_layout(title=title, height=520)
    return fig


def histogram_figure(doc: dict, budget: int = 32):
    """Share of rounds per accepted length at ``budget`` per text type (best drafter's tree)."""
    fig = go.Figure()
    for r in _rows(doc, "tree"):
        if r["budget"] == budget:
            n = max(1, sum(r["histogram"]))
            fig.add_trace(go.Bar(x=list(range(1, len(r["histogram"]) + 1)), y=[h / n for h in r["histogram"]],
                                 name=r["text_type"]))
    fig.update_layout(title=f"Accepted length per round, budget {budget}", barmode="group", height=420,
                      xaxis_title="accepted length (root included)", yaxis_title="share of rounds")
    return fig


def hit_rate_figure(doc: dict, budget: int = 32):
    """P(depth d accepted | depth d - 1 reached) by depth per text type: the tree at ``budget`` (solid) and the chain
    (dashed)."""
    fig = go.Figure()
    for m, dash in (("tree", "solid"), ("chain", "dash")):
        for r in _rows(doc, m):
            if m == "tree" and r["budget"] != budget:
                continue
            d = list(range(1, len(r["hit_by_depth"]) + 1))
            fig.add_trace(go.Scatter(x=d, y=r["hit_by_depth"], mode="lines+markers", line=dict(dash=dash),
                                     name=f"{r['text_type']}: {m}" + (f" {budget}" if m == "tree" else "")))
    fig.update_layout(title="Hit rate by depth (given the depth before was accepted)", height=420,
                      xaxis_title="depth", yaxis=dict(title="P(accepted at depth d | reached)", range=[0, 1.02]))
    return fig


def sibling_figure(doc: dict, budget: int = 32, text_type: str | None = None):
    """Of the rounds that reached depth d - 1: how often the right token was the accepted node's 1st, 2nd, 3rd, 4th+
    child (stacked), per depth, for ``text_type`` (default the first) at ``budget``."""
    rows = [r for r in _rows(doc, "tree") if r["budget"] == budget]
    r = next((x for x in rows if text_type in (None, x["text_type"])), None)
    fig = go.Figure()
    if r is None:
        return fig
    sib = r["hit_by_sibling_rank"]
    d = list(range(1, len(sib) + 1))
    for k, label in ((0, "1st child"), (1, "2nd child"), (2, "3rd child")):
        fig.add_trace(go.Bar(x=d, y=[(s[k] or 0) if s[k] is not None else 0 for s in sib], name=label))
    fig.add_trace(go.Bar(x=d, y=[sum(v or 0 for v in s[3:]) for s in sib], name="4th+ child"))
    fig.update_layout(barmode="stack", height=420, title=f"Which child was right, {r['text_type']}, budget {budget}",
                      xaxis_title="depth", yaxis=dict(title="share of rounds reaching depth d - 1", range=[0, 1.02]))
    return fig


def curves_figure(doc: dict):
    """Training loss (thin) and validation loss (markers) against step for every drafter trained."""
    fig = go.Figure()
    for name, st in doc["results"]["training"].items():
        c = st["loss_curve"]
        stride = max(1, len(c) // 400)
        fig.add_trace(go.Scatter(x=[p[0] for p in c[::stride]], y=[p[2] for p in c[::stride]], mode="lines",
                                 line=dict(width=1), name=f"{name}: train"))
        v = st["val_curve"]
        fig.add_trace(go.Scatter(x=[p["step"] for p in v], y=[p["loss"] for p in v], mode="lines+markers",
                                 name=f"{name}: validation"))
    fig.update_layout(title="Drafter training: CE + KL to the target, position-decayed", xaxis_title="step",
                      yaxis_title="loss", height=420)
    return fig


def goal(doc: dict) -> dict:
    """The issue's goals per text type from the document (``results.goals``)."""
    return doc["results"].get("goals") or {}


def reading(doc: dict) -> str:
    """What the measurement says, computed from the document: per text type the best drafter's accepted length at
    budget 32 with its interval against the goal (met, or short by how much), the first-position hit rate against
    0.7, the tree over the chain against 1.3x, prompt lookup beside; the predictable-vs-reasoning split; where the
    tree stops gaining; target-layer vs random initialisation; what the validation curve points to (still falling
    at the end: more data and steps; flat: capacity or recipe); the live loops (lossless, agreement with the
    replay, wall clock)."""
    res = doc["results"]
    g = goal(doc)
    lines = [f"Best drafter: {res['best_drafter']} (lowest validation loss); goals at block {GOAL['block']}, "
             f"budget {GOAL['budget']}:"]
    for t, v in g.items():
        lo, hi = v["ci95"]
        miss = "met" if v["met"] else f"short by {v['short_by']:.2f}"
        first = v["first_position_hit"]
        fshort = GOAL["first_position_hit"] - first
        lines.append(f"- {t}: {v['mean_accepted']:.2f} [{lo:.2f}, {hi:.2f}] vs goal {v['goal']} ({miss}); "
                     f"depth-1 hit (the drafter's first choice) {first:.2f} vs {GOAL['first_position_hit']} "
                     f"({'met' if v['first_position_met'] else f'short by {fshort:.2f}'}); "
                     f"tree/chain {v['tree_over_chain']:.2f}x vs {GOAL['tree_over_chain']}x "
                     f"({'met' if v['tree_over_chain_met'] else 'missed'})")
        r32 = next((r for r in _rows(doc, "tree") if r["text_type"] == t and r["budget"] == GOAL["budget"]), None)
        if r32 and r32.get("hit_by_depth"):
            lines.append(f"  {t}: depth 1 accepted by some child of the budget-{GOAL['budget']} tree in "
                         f"{r32['hit_by_depth'][0]:.2f} of rounds; given depth d - 1, depth d accepted: "
                         + ", ".join(f"{x:.2f}" for x in r32["hit_by_depth"][:6] if x is not None) + " (depths 1-6)")
    look = {r["text_type"]: r for r in _rows(doc, "lookup")}
    tree = _rows(doc, "tree")
    for t in g:
        pts = sorted((r["budget"], r["mean_accepted"]) for r in tree if r["text_type"] == t)
        sat = next((b for (b, a), (_, a2) in zip(pts, pts[1:]) if a2 < 1.05 * a), None)
        lk = look.get(t)
        lines.append(f"  {t}: tree {', '.join(f'{b}: {a:.2f}' for b, a in pts)}"
                     + (f"; gains < 5% past budget {sat}" if sat else "; still gaining >= 5% per step")
                     + (f"; prompt lookup {lk['mean_accepted']:.2f}" if lk else ""))
    if g:
        order = sorted(g, key=lambda t: g[t]["mean_accepted"])
        lines.append("Predictable vs reasoning: " + " < ".join(
            f"{t} {g[t]['mean_accepted']:.2f} [{g[t]['ci95'][0]:.2f}, {g[t]['ci95'][1]:.2f}]" for t in order)
            + ("; the intervals of the extremes do not overlap" if g[order[0]]["ci95"][1] < g[order[-1]]["ci95"][0]
               else "; the intervals overlap"))
    tr = res["training"]
    if len(tr) > 1:
        lines.append("Initialisation: " + "; ".join(
            f"{n} best validation loss {st['best']['loss']:.3f} (chain {st['best']['chain_accepted']:.2f} under "
            f"teacher forcing) at step {st['best']['step']} of {st['steps']}, {st['stopped']}" for n, st in tr.items()))
    st = tr[res["best_drafter"]]
    v = st["val_curve"]
    if len(v) >= 3:
        tail = v[-3:]
        drop = (tail[0]["loss"] - tail[-1]["loss"]) / max(1e-9, tail[0]["loss"])
        d = res.get("data", {}).get("train", {})
        seen = st["steps"] * res["train_config"]["batch"]
        lines.append(f"Curves: validation loss {v[0]['loss']:.3f} -> {v[-1]['loss']:.3f}, falling {100 * drop:.1f}% over "
                     f"the last {len(tail)} validations; {seen} sequence draws over {d.get('prompts', '?')} training "
                     f"sequences ({d.get('continuation_tokens_to_eos', '?')} continuation tokens)"
                     + ("; still falling at the end: the run is data- and step-limited (more device time would pay)"
                        if drop > 0.01 else "; flat at the end: more of the same data would not help much - "
                        "capacity or recipe (deeper drafter, longer context, branch-conditioned head) is the lever"))
    live = res.get("live") or {}
    if live:
        n = sum(len(v) for v in live.values())
        ok = sum(x["lossless_vs_hf_greedy"] for v in live.values() for x in v)
        agree = sum(x["rounds_agreeing_with_replay"] for v in live.values() for x in v)
        rounds = sum(x["live_rounds"] for v in live.values() for x in v)
        sp = [x["ddtree_tokens_per_s"] / x["greedy_tokens_per_s"] for v in live.values() for x in v
              if x["ddtree_tokens_per_s"] and x["greedy_tokens_per_s"]]
        lines.append(f"Live DDTree loops: lossless on {ok}/{n} prompts; {agree} of {rounds} live rounds equal the "
                     "replay's, in order, up to the first difference"
                     + (f"; wall clock {min(sp):.2f}-{max(sp):.2f}x greedy on the eager target (not a goal)" if sp else ""))
    return "\n".join(lines)
