"""Generated blocks of papers/serving.md from ``serving.json`` (the serving benchmark, ``workbench/bench/serve.py``).

Every number comes from the measurement file, default ``data/measurements/h200/serving.json``: its provenance, the
engine-step floors, the server's ITL / TTFT / aggregate rows, the goals it recorded, the lossless comparison and the
head-of-line sweep (when the run recorded one). The design and the limits are prose in the paper.

    python -m workbench.reports.serving [--data FILE]            # rewrite the paper's blocks
    python -m workbench.reports.serving [--data FILE] --check    # exit 1 if the paper is stale
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

from workbench import REPO_ROOT
from workbench.reports import papers
from workbench.reports.papers import json_or_none, markdown_table, number, signed_percent

PAPER = REPO_ROOT / "papers" / "serving.md"
DATA = REPO_ROOT / "data" / "measurements" / "h200" / "serving.json"
MISSING = ("Not measured yet: `data/measurements/h200/serving.json` is not committed "
           "(`python -m workbench.bench.serve --h200`).\n")


def load(path: Path | str | None = None) -> dict[str, Any] | None:
    """The measurement file at ``path`` (default :data:`DATA`), or None when it does not exist."""
    return json_or_none(path if path is not None else DATA)


def block_provenance(doc) -> str:
    """Where, when and at which commit the file was measured, and with which parameters."""
    if doc is None:
        return MISSING
    pv, par = doc["provenance"], doc["parameters"]
    return "\n".join([
        f"- Measured on one {pv.get('gpu')} (driver {pv.get('driver')}, CUDA runtime {pv.get('cuda_runtime')}, "
        f"torch {pv.get('torch')}) at commit `{str(pv.get('git_commit'))[:12]}`, {pv.get('date_utc')}.",
        f"- Model: synthetic {par['model']} shape, {par['layers']} layers, {par['experts']} routed experts per "
        f"layer, {par['dtype']}, fuse mode {par['fuse']}; DDTree block {par['block']}, budget {par['budget']}, "
        f"ScriptedDrafter p_top {par['p_top']}.",
        f"- Requests: prompts of {par['prompt']:,} tokens, max_tokens {par['max_tokens']}, concurrency "
        f"{par['concurrency']}; prefill chunk {par['prefill_chunk']}; KV pool of {par['kv_slots']:,} slots. Engine "
        f"step: {par['steps']} timed steps after {par['warmup']} warm-up; server at C = 1: {par['repeats']} repeats.",
        f"- Head-of-line parameters: a {par['hol_context']:,}-token prompt arriving while {par['hol_running']} "
        f"requests decode, chunk settings {par['hol_chunks']} (None: whole).",
    ]) + "\n"


def block_method(doc) -> str:
    """The file's own note on what is timed against what."""
    if doc is None:
        return MISSING
    return f"> {doc.get('notes', '').strip()}\n"


def engine_rows(doc) -> list[dict[str, Any]]:
    """One row per (method, C) engine-step measurement: the floors the server is measured against."""
    return [{"method": r["method"], "C": r["C"], "step (ms)": number(r["wall_ms"], 2),
             "tokens per step": number(r["tokens_per_step"], 2), "tokens/s": number(r["tokens_per_s"], 1)}
            for r in doc["results"]["engine"]]


def block_engine(doc) -> str:
    """The engine-step table."""
    return MISSING if doc is None else markdown_table(engine_rows(doc))


def server_rows(doc) -> list[dict[str, Any]]:
    """One row per server round: ITL, TTFT, accepted length and the steady aggregate rate."""
    return [{"method": r["method"], "C": r["C"], "repeat": r["repeat"], "ITL median (ms)": number(r["itl_ms_median"], 2),
             "ITL mean (ms)": number(r["itl_ms_mean"], 2), "TTFT median (ms)": number(r["ttft_ms_median"], 0),
             "accepted length": number(r["accept_length"], 2), "steady tokens/s": number(r["steady"]["tokens_per_s"], 1),
             "steady window (ms)": number(r["steady"]["window_ms"], 0)}
            for r in doc["results"]["server"]]


def block_server(doc) -> str:
    """The server-round table."""
    return MISSING if doc is None else markdown_table(server_rows(doc))


def goal_rows(doc) -> list[dict[str, Any]]:
    """The goals the run recorded: server vs engine, relative gap, target, met."""
    return [{"goal": g["goal"], "server": f"{number(g['server'], 2)} {g['unit']}",
             "engine": f"{number(g['engine'], 2)} {g['unit']}", "gap": signed_percent(g["relative"]),
             "target": f"within {100 * g['target']:.0f}%", "met": "yes" if g["met"] else "**no**"}
            for g in doc["results"]["goals"]]


def block_goals(doc) -> str:
    """The goals table and a sentence counting the goals met."""
    if doc is None:
        return MISSING
    gs = doc["results"]["goals"]
    missed = [g for g in gs if not g["met"]]
    said = "; missed: " + "; ".join(f"{g['goal']} ({signed_percent(g['relative'])} against {100 * g['target']:.0f}%)"
                                    for g in missed) if missed else ""
    return markdown_table(goal_rows(doc)) + f"\n{len(gs) - len(missed)} of {len(gs)} goals met{said}.\n"


def lossless_summary(doc) -> dict[str, Any]:
    """Counts of the DDTree requests whose served tokens equal greedy's for the same prompt, per concurrency."""
    rows = doc["results"]["lossless"]
    by_c: dict[int, list[bool]] = {}
    for r in rows:
        by_c.setdefault(r["C"], []).append(bool(r["equal"]))
    return {"equal": sum(r["equal"] for r in rows), "total": len(rows),
            "tokens": sorted({r["tokens"] for r in rows}),
            "by_c": {c: (sum(v), len(v)) for c, v in sorted(by_c.items())}}


def block_lossless(doc) -> str:
    """One sentence: how many DDTree requests served the very tokens greedy decoding served."""
    if doc is None:
        return MISSING
    s = lossless_summary(doc)
    if not s["total"]:
        return "No lossless comparison in this file.\n"
    per = ", ".join(f"{e} of {n} at C = {c}" for c, (e, n) in s["by_c"].items())
    return (f"DDTree's served tokens equal greedy decoding's for the same prompt in {s['equal']} of {s['total']} "
            f"requests ({per}; {', '.join(map(str, s['tokens']))} tokens each, temperature 0).\n")


def block_headline(doc) -> str:
    """The paper's headline: the C = 1 ITL and C = 8 aggregate of each method against its engine floor."""
    if doc is None:
        return MISSING
    gs = doc["results"]["goals"]
    s = lossless_summary(doc)
    parts = [f"{g['goal']}: {number(g['server'], 2)} vs {number(g['engine'], 2)} {g['unit']} ({signed_percent(g['relative'])}, "
             f"{'met' if g['met'] else 'missed'} the {100 * g['target']:.0f}% goal)" for g in gs]
    hol = "recorded" if doc["results"].get("head_of_line") else "not recorded (empty in this file)"
    return ("- " + "\n- ".join(parts) + f"\n- Lossless: {s['equal']} of {s['total']} DDTree requests equal greedy's "
            f"tokens.\n- Head-of-line: {hol}.\n")


def hol_rows(doc) -> list[dict[str, Any]]:
    """The head-of-line sweep's rows as recorded (each value formatted), or an empty list."""
    out = []
    for r in doc["results"].get("head_of_line") or []:
        out.append({k: (number(v, 2) if isinstance(v, float) else v) for k, v in r.items()
                    if not isinstance(v, (list, dict))})
    return out


def block_head_of_line(doc) -> str:
    """The head-of-line table, or a sentence saying this file has none."""
    if doc is None:
        return MISSING
    rows = hol_rows(doc)
    if not rows:
        err = doc["results"].get("error")
        return ("The file's `head_of_line` list is empty: this run recorded no head-of-line figures"
                + (f" (its recorded error: {err})" if err else "") + ".\n")
    return markdown_table(rows)


def blocks(doc) -> dict[str, Callable[[], str]]:
    """The paper's block names mapped to their renderers over ``doc``."""
    fns = {"headline": block_headline, "provenance": block_provenance, "method": block_method,
           "engine": block_engine, "server": block_server, "goals": block_goals, "lossless": block_lossless,
           "head-of-line": block_head_of_line}
    return {name: (lambda f=f: f(doc)) for name, f in fns.items()}


BLOCKS = blocks(load())


def render(text: str, doc=None) -> str:
    """``text`` with every block rewritten from ``doc`` (default: the committed file)."""
    return papers.render(text, blocks(doc if doc is not None else load()))


def main(argv: list[str] | None = None) -> int:
    """``[--data FILE] [--paper PATH] [--check]``: rewrite the paper's blocks, or exit 1 when stale."""
    ap = argparse.ArgumentParser(prog="python -m workbench.reports.serving", description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--paper", type=Path, default=PAPER)
    ap.add_argument("--check", action="store_true", help="exit 1 if the paper's generated blocks are stale")
    a = ap.parse_args(argv)
    return papers.main((["--check"] if a.check else []) + ["--paper", str(a.paper)], paper=a.paper,
                       blocks=blocks(load(a.data)), prog="python -m workbench.reports.serving")


if __name__ == "__main__":
    raise SystemExit(main())
