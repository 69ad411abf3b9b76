"""Notebook 06's library side: a CPU demo run and the plotly figures over an acceptance document.

:func:`cpu_demo` runs issue 28's pipeline in seconds on a CPU (tiny random Llama, byte tokens, a few
training steps) and returns a document shaped like ``acceptance.json`` (:func:`load_doc` reads the
committed one). Figures: :func:`budget_figure` (accepted length against budget per text type and
block, with the source's and the papers' reference lines), :func:`histogram_figure`,
:func:`hit_rate_figure`, :func:`loss_figure`; :func:`summary_rows` and :func:`reading` (what the
curves say, computed from the rows).
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Sequence

from workbench.validation import check_choice, check_int, check_list

__all__ = ["REFERENCES", "cpu_demo", "check_notebook", "load_doc", "measured_or_demo", "summary_rows", "budget_figure",
           "histogram_figure", "hit_rate_figure", "loss_figure", "reading", "training_data"]

# (label, accepted length, where it comes from) - reference lines, quoted, not measured here
REFERENCES = (
    ("source: reasoning text", 2.9, "seed article, Kimi K2.6 + DFlash on 8 x RTX PRO 6000"),
    ("source: predictable text (low)", 5.0, "seed article"),
    ("source: predictable text (high)", 8.0, "seed article"),
    ("DDTree paper, Qwen3-8B MATH-500, block 16", 10.7, "Ringel & Romano, arXiv 2604.12989"),
)


def check_notebook(text_types, train_steps: int, prompts: int, max_new: int, block: int, blocks, budgets,
                   seed: int, gpu: str) -> None:
    """Notebook 06's input check (notebooks/parameters.yaml ``check``)."""
    from workbench.acceptance.textdata import TEXT_TYPES

    check_list("text_types", text_types, lambda n, v: check_choice(n, v, TEXT_TYPES), "text types: " + ", ".join(TEXT_TYPES))
    check_int("block", block, lo=2, hi=16)
    check_list("blocks", blocks, lambda n, v: check_int(n, v, lo=2, hi=block), f"integers in [2, block={block}]")
    check_list("budgets", budgets, lambda n, v: check_int(n, v, lo=1, hi=512), "integers in [1, 512]")
    check_int("train_steps", train_steps, lo=1)
    check_int("prompts", prompts, lo=1)
    check_int("max_new", max_new, lo=2)
    check_int("seed", seed, lo=0)


def cpu_demo(text_types: Sequence[str] = ("code",), train_steps: int = 20, prompts: int = 2, max_new: int = 24,
             block: int = 8, blocks: Sequence[int] = (4, 8), budgets: Sequence[int] = (1, 8, 32), seed: int = 0,
             prompt_tokens: int = 32) -> dict:
    """The pipeline on a CPU in seconds: byte-tokenised splits of ``text_types`` (their packages must be
    installed), a tiny random Llama target, a tiny drafter trained ``train_steps`` steps on the target's
    greedy continuations, greedy and DDTree on held-out prompts. Returns {"results": ..., "notes": ...}."""
    import torch

    from workbench.acceptance.measure import measure
    from workbench.acceptance.target import HFTarget, tiny_llama
    from workbench.acceptance.textdata import build_splits, byte_tokenize
    from workbench.acceptance.train import TrainConfig, greedy_continuations, train
    from workbench.engine.drafters import DFlashConfig

    check_notebook(list(text_types), train_steps, prompts, max_new, block, list(blocks), list(budgets), seed, "h200")
    torch.manual_seed(seed)
    splits = {t: build_splits(t, byte_tokenize, seed=seed, chunk=prompt_tokens, max_train_tokens=64 * prompt_tokens,
                              max_heldout_tokens=8 * prompt_tokens) for t in text_types}
    target = HFTarget(tiny_llama(vocab_size=256, hidden_size=64, layers=2, heads=4, kv_heads=2, intermediate=128,
                                 seed=seed), capture_layers=(0, 1))
    seqs = greedy_continuations(target, torch.cat([s.train for s in splits.values()]), 24, batch=64)
    cfg = DFlashConfig(hidden_size=64, num_layers=1, num_heads=4, head_dim=16, intermediate_size=128, block=block,
                       target_layers=(0, 1), mask_token_id=0, context_window=prompt_tokens)
    drafter, state = train(target, cfg, seqs, TrainConfig(max_steps=train_steps, batch=8, anchors=4,
                                                          prompt_len=prompt_tokens, lr=3e-3, warmup=5, seed=seed),
                           progress=False)
    held = {t: s.heldout[:prompts] for t, s in splits.items()}
    res = measure(target, drafter, held, blocks, budgets, max_new)
    res["drafter"] = {"steps": state["steps"], "final_loss": state["final_loss"], "loss_curve": state["loss_curve"],
                      "config": cfg.to_json()}
    return {"results": res, "notes": "CPU demo: tiny random Llama and drafter on byte tokens, not H200 data"}


def load_doc(gpu: str = "h200") -> dict | None:
    """The committed ``data/measurements/<gpu>/acceptance.json`` or None."""
    from workbench.acceptance.measure import ACCEPTANCE_FILE
    from workbench.measure import load_measurement

    return load_measurement(ACCEPTANCE_FILE, gpu)


def measured_or_demo(gpu: str, demo: dict) -> dict:
    """The committed measurement for ``gpu`` when there is one, else ``demo`` (its notes say which)."""
    return load_doc(gpu) or demo


def summary_rows(doc: dict) -> list[dict]:
    """One row per (text type, block, budget): accepted length, tokens per forward, speedup, lossless."""
    return [{"text type": r["text_type"], "block": r["block"], "budget": r["budget"],
             "accepted length": r["mean_accepted"], "tokens / forward": r["tokens_per_forward"],
             "rounds": r["rounds"], "speedup vs greedy": r["speedup"], "lossless": f"{r['lossless']}/{r['prompts']}"}
            for r in doc["results"]["rows"]]


def budget_figure(doc: dict, title: str = "Accepted length against budget"):
    """Accepted length (root included) against budget (log axis), a line per text type and block, with
    :data:`REFERENCES` as dotted horizontal lines."""
    import plotly.graph_objects as go

    rows = doc["results"]["rows"]
    fig = go.Figure()
    for t in dict.fromkeys(r["text_type"] for r in rows):
        for b in sorted({r["block"] for r in rows if r["text_type"] == t}):
            pts = sorted((r["budget"], r["mean_accepted"]) for r in rows if r["text_type"] == t and r["block"] == b)
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers",
                                     name=f"{t}, block {b}", line=dict(dash="solid" if b == max(r["block"] for r in rows) else "dash")))
    for label, y, _ in REFERENCES:
        fig.add_hline(y=y, line=dict(dash="dot", width=1, color="gray"), annotation_text=f"{label}: {y}",
                      annotation_position="top left", annotation_font_size=10)
    fig.update_xaxes(type="log", title="budget (tree nodes below the root; 1 = the chain)")
    fig.update_yaxes(title="mean accepted length per round (root included)", rangemode="tozero")
    fig.update_layout(title=title, height=520)
    return fig


def histogram_figure(doc: dict, budget: int, block: int | None = None):
    """Share of rounds per accepted length at ``budget`` (and ``block``, default the largest), per text type."""
    import plotly.graph_objects as go

    rows = doc["results"]["rows"]
    block = block or max(r["block"] for r in rows)
    fig = go.Figure()
    for r in rows:
        if r["budget"] == budget and r["block"] == block:
            n = max(1, sum(r["histogram"]))
            fig.add_trace(go.Bar(x=list(range(1, block + 1)), y=[h / n for h in r["histogram"]], name=r["text_type"]))
    fig.update_layout(title=f"Accepted length per round, block {block}, budget {budget}", barmode="group",
                      xaxis_title="accepted length (root included)", yaxis_title="share of rounds", height=420)
    return fig


def hit_rate_figure(doc: dict, budget: int, block: int | None = None):
    """Rank-0 hit rate by depth along the spine (solid) and after an accepted sibling (dotted)."""
    import plotly.graph_objects as go

    rows = doc["results"]["rows"]
    block = block or max(r["block"] for r in rows)
    fig = go.Figure()
    for r in rows:
        if r["budget"] == budget and r["block"] == block:
            d = list(range(1, block))
            fig.add_trace(go.Scatter(x=d, y=r["hit_spine"], mode="lines+markers", name=f"{r['text_type']}: spine"))
            if any(v is not None for v in r["hit_sibling"]):
                fig.add_trace(go.Scatter(x=d, y=r["hit_sibling"], mode="lines+markers", line=dict(dash="dot"),
                                         name=f"{r['text_type']}: after a sibling"))
    fig.update_layout(title=f"Drafter's rank-0 hit rate by depth, block {block}, budget {budget}", height=420,
                      xaxis_title="depth", yaxis=dict(title="P(rank 0 = target's token)", range=[0, 1.02]))
    return fig


def loss_figure(doc: dict):
    """The drafter's training loss against step."""
    import plotly.graph_objects as go

    curve = doc["results"]["drafter"]["loss_curve"]
    fig = go.Figure(go.Scatter(x=[c[0] for c in curve], y=[c[2] for c in curve], mode="lines", name="loss"))
    fig.update_layout(title="Drafter training loss (weighted cross-entropy)", xaxis_title="step",
                      yaxis_title="loss", height=380)
    return fig


def training_data(doc: dict) -> tuple[dict | None, str]:
    """The description of the data that trained the document's drafter (sequences, generation seconds, ...) and,
    when it is not known, why: a file whose drafter record keeps training segments
    (:func:`workbench.acceptance.train.training_segments`) says it; an older one whose run resumed a checkpoint
    and trained no step recorded its own regenerated data instead, so the training data is unknown there."""
    dr = doc["results"].get("drafter") or {}
    if "segments" in dr:
        return (dr.get("data") or None), ("" if dr.get("data") else "no training segment recorded")
    if dr.get("resumed_from") is not None and dr.get("resumed_from") == dr.get("steps"):
        return None, (f"not recorded in this file: its run resumed a checkpoint at step {dr['steps']} and trained "
                      "no step, so its data block describes that run's regenerated data, not the training data")
    return (dr.get("data") or None), ("" if dr.get("data") else "not recorded")


def _span(values) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}"


GOAL = MappingProxyType({"text_type": "math", "budget": 32, "over_chain": 1.25})   # issue 28's goal


def goal(doc: dict, block: int) -> dict | None:
    """Issue 28's goal at ``block``: the tree's accepted length at :data:`GOAL`'s budget over the chain's (budget 1)
    on its text type, with the sample it rests on; None when either point is missing."""
    at = {r["budget"]: r for r in doc["results"]["rows"]
          if r["text_type"] == GOAL["text_type"] and r["block"] == block}
    tree, chain = at.get(GOAL["budget"]), at.get(1)
    if not tree or not chain or not chain["mean_accepted"]:
        return None
    ratio = tree["mean_accepted"] / chain["mean_accepted"]
    return {"block": block, "tree": tree["mean_accepted"], "chain": chain["mean_accepted"], "ratio": ratio,
            "met": ratio >= GOAL["over_chain"], "prompts": tree["prompts"], "rounds": tree["rounds"]}


def reading(doc: dict) -> str:
    """What the curves say, computed from the document: per text type at the largest block, the chain's and the
    best tree's accepted length, the tree/chain ratio at budget 32 and where the curve stops gaining 5% per
    budget step; the issue's goal (math, budget 32 >= 1.25 x chain) and the sample it rests on; the absolute level
    against :data:`REFERENCES`; the drafter's training loss and data, and the over-fitting reading where a
    near-zero training loss meets a held-out acceptance below every reference; the wall-clock speedups' spread
    and how much of it is noise (the same accepted rounds at two blocks timed twice); the points a time box
    skipped; the file's ``provenance_note`` when it has one."""
    res = doc["results"]
    rows = res["rows"]
    block = max(r["block"] for r in rows)
    greedy = res.get("greedy") or {}
    new_tokens = sorted({g.get("max_new") for g in greedy.values()} - {None})
    prompts = sorted({r["prompts"] for r in rows})
    sample = (f"{'/'.join(map(str, prompts))} held-out prompt(s)"
              + (f" x {'/'.join(map(str, new_tokens))} new tokens" if new_tokens else "") + " per text type")
    lines = [f"Block {block}, accepted length per round (root included), on {sample}:"]
    for t in dict.fromkeys(r["text_type"] for r in rows):
        pts = sorted((r["budget"], r["mean_accepted"]) for r in rows if r["text_type"] == t and r["block"] == block)
        by = dict(pts)
        chain, at32 = by.get(1), by.get(32)
        best_k, best = max(pts, key=lambda p: p[1])
        sat = next((b for (b, a), (_, a2) in zip(pts, pts[1:]) if a2 < 1.05 * a), None)
        ratio = f"{at32 / chain:.2f}x the chain at budget 32" if chain and at32 else "no budget-32 or chain point"
        climb = (f"gains < 5% past budget {sat}" if sat is not None else
                 f"still gaining >= 5% per budget step at {pts[-1][0]} (no saturation in the range measured)")
        lines.append(f"- {t}: chain {chain:.2f}, best {best:.2f} at budget {best_k}; {ratio}; {climb}"
                     if chain else f"- {t}: best {best:.2f} at budget {best_k}; {ratio}; {climb}")
        g = goal(doc, block) if t == GOAL["text_type"] else None
        if g:
            lines.append(f"  goal ({GOAL['text_type']}, budget {GOAL['budget']} >= {GOAL['over_chain']} x chain): "
                         f"{'met' if g['met'] else 'not met'} ({g['ratio']:.2f}x), on {g['prompts']} prompt(s) and "
                         f"{g['rounds']} rounds at budget {GOAL['budget']} - a small sample")
    top = max(rows, key=lambda r: (r["mean_accepted"], r["block"]))
    longest = max((i + 1 for r in rows for i, h in enumerate(r["histogram"]) if h), default=0)
    refs = sorted(REFERENCES, key=lambda x: x[1])
    below = [f"{label} {y:g}" for label, y, _ in refs if top["mean_accepted"] < y]
    lines.append(f"Absolute level: the best point is {top['mean_accepted']:.2f} ({top['text_type']}, block "
                 f"{top['block']}, budget {top['budget']}); the longest accepted run was {longest} token(s)"
                 + (f"; below every reference line ({'; '.join(below)})" if len(below) == len(refs) else
                    f"; below {'; '.join(below)}" if below else "; at or above every reference line") + ".")
    dr = res.get("drafter") or {}
    curve = dr.get("loss_curve") or []
    if dr.get("final_loss") is not None and curve:
        data, why = training_data(doc)
        batch = (dr.get("train_config") or {}).get("batch")
        draws = f" x {batch} sequences" if batch else ""
        if data and data.get("sequences"):
            seen = f"on {data['sequences']} sequences"
            if data.get("generation_seconds") is not None:
                seen += f" from {data['generation_seconds']:.0f} s of generation"
            if batch:
                seen += f" (about {dr['steps'] * batch / data['sequences']:.0f} passes over them)"
        else:
            seen = f"training data {why}" if why else "training data not recorded"
        lines.append(f"Training: final loss {dr['final_loss']:.3f} (first logged {curve[0][2]:.2f}) after "
                     f"{dr['steps']} steps{draws}; {seen}.")
        if dr["final_loss"] < 0.1 * curve[0][2] and len(below) == len(refs):
            lines.append("  A training loss this close to zero beside a held-out acceptance this low reads as "
                         "over-fitting of a small self-distillation set: the likely cause of the low acceptance "
                         "(no held-out loss was recorded to confirm it).")
    speed = [r["speedup"] for r in rows if r.get("speedup") is not None]
    if speed:
        pairs = {}
        for r in rows:  # the same rounds measured at two blocks: their speedup gap is timing noise
            h = list(r["histogram"])
            while h and not h[-1]:
                h.pop()
            pairs.setdefault((r["text_type"], r["budget"], r["rounds"], tuple(h)), []).append(r["speedup"])
        gaps = [max(v) - min(v) for v in pairs.values() if len(v) > 1]
        tpf = [r["tokens_per_forward"] for r in rows if r.get("tokens_per_forward") is not None]
        lines.append(f"Wall clock: speedup over greedy {_span(speed)} across points, on {sample}"
                     + (f"; the same accepted rounds timed at two blocks differ by up to {max(gaps):.2f} in "
                        "speedup: timing noise of that size" if gaps else "")
                     + (f"; tokens per target forward ({_span(tpf)}) is the steadier measure" if tpf else "") + ".")
    skipped = res.get("skipped") or []
    if skipped:
        lines.append(f"Not measured: {len(skipped)} point(s) skipped by the measurement's time box ("
                     + ", ".join(f"{k['text_type']} {k['block']}/{k['budget']}" for k in skipped) + ").")
    if doc.get("provenance_note"):
        lines.append("Provenance: " + doc["provenance_note"])
    return "\n".join(lines)
