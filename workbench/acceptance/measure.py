"""Acceptance of a drafter on held-out text: accepted length per text type, block and budget.

:func:`measure` runs greedy decoding and DDTree (:func:`workbench.acceptance.target.ddtree_generate`)
on the same held-out prompts and returns one row per (text type, block, budget):

- ``mean_accepted``: accepted length per round, root (bonus) included - the DDTree paper's tau;
- ``tokens_per_forward``: generated tokens per target forward after the prefill (DDTree's rounds
  against greedy's one per token);
- ``histogram``: rounds per accepted length 1..block;
- ``hit_spine[d-1]`` / ``hit_sibling[d-1]``: how often the drafter's rank-0 token at depth d was the
  target's token there, over rounds that reached depth d along the all-rank-0 spine, or through at
  least one accepted non-zero-rank sibling (``*_n``: how many rounds each rate counts);
- ``seconds`` / ``greedy_seconds`` / ``speedup``: wall time of the decode loops (after prefill, CUDA
  synchronised) and greedy / DDTree;
- ``lossless``: prompts whose DDTree output equals greedy's, of ``prompts``.

``block`` 8 with a block-16 drafter uses its first 7 drafted positions (``depth``).

Order and time box: greedy runs first on every text type (the baseline, always measured), then the
(block, budget) points in the order of ``blocks``, then ``budgets``, each over every text type, so that
a cut keeps whole (block, budget) columns; put first what matters most. With ``seconds`` a point is
measured only when the time spent so far plus its estimate (:func:`point_estimate`) fits; one that does
not is listed in ``skipped`` with that estimate, and the loop goes on to the next (a cheaper one may fit).
``on_row`` is called with the result so far after every point (the bench writes its file there).
The returned rows are in (text type, block, budget) order whatever the measuring order.
:func:`acceptance_for` reads the committed ``data/measurements/h200/acceptance.json``: the input the
context sweep and the B300 projection take as "the trained drafter on text type T".
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from workbench.acceptance.target import HFTarget, ddtree_generate, greedy_generate
from workbench.measure import load_measurement
from workbench.validation import InvalidParameter, check_float, check_int, check_list

__all__ = ["summarize", "measure", "point_estimate", "measurement_order", "acceptance_for", "histogram_for",
           "measured_rows", "ACCEPTANCE_FILE"]

ACCEPTANCE_FILE = "acceptance"


def summarize(steps, block: int, depth: int) -> dict:
    """Per-round records (:class:`workbench.acceptance.target.StepRecord`) -> accepted-length mean,
    histogram [block] and rank-0 hit counts by depth [depth] along the spine / after a sibling."""
    acc = np.array([s.accepted for s in steps], dtype=np.int64)
    hist = np.bincount(acc, minlength=block + 1)[1:block + 1]
    spine_hit, spine_n = np.zeros(depth, np.int64), np.zeros(depth, np.int64)
    sib_hit, sib_n = np.zeros(depth, np.int64), np.zeros(depth, np.int64)
    for s in steps:
        for d in range(1, min(s.accepted, depth) + 1):  # depths whose true token is known
            hit = s.top_tokens[d - 1] == s.true_tokens[d - 1]
            if all(r == 0 for r in s.path_ranks[:d - 1]):
                spine_n[d - 1] += 1
                spine_hit[d - 1] += hit
            else:
                sib_n[d - 1] += 1
                sib_hit[d - 1] += hit
    rate = lambda h, n: [float(a / b) if b else None for a, b in zip(h, n)]  # noqa: E731
    return {"mean_accepted": float(acc.mean()) if acc.size else None, "rounds": int(acc.size),
            "histogram": hist.tolist(),
            "hit_spine": rate(spine_hit, spine_n), "hit_spine_n": spine_n.tolist(),
            "hit_sibling": rate(sib_hit, sib_n), "hit_sibling_n": sib_n.tolist()}


def measurement_order(text_types: Sequence[str], blocks: Sequence[int], budgets: Sequence[int]) -> list[tuple]:
    """The (text type, block, budget) points in measuring order: blocks as given, then budgets, each over every
    text type (module docstring)."""
    return [(t, b, k) for b in blocks for k in budgets for t in text_types]


def point_estimate(point: tuple, done: dict, greedy_seconds: dict) -> float:
    """A guess of one point's seconds: the mean of the measured points of the same (block, budget), else the
    slowest point measured so far or the text type's greedy baseline, whichever is larger (a new budget is
    guessed no cheaper than what was seen). ``done``: point -> seconds; ``greedy_seconds``: type -> seconds."""
    t, b, k = point
    same = [v for (_, b2, k2), v in done.items() if (b2, k2) == (b, k)]
    if same:
        return sum(same) / len(same)
    return max([greedy_seconds[t], *done.values()])


def measure(target: HFTarget, drafter, prompts: dict[str, torch.Tensor], blocks: Sequence[int],
            budgets: Sequence[int], max_new: int, progress: bool = False, seconds: float | None = None,
            on_row: Callable[[dict], None] | None = None) -> dict:
    """Greedy and DDTree on every prompt (``prompts``: text type -> int64 [M, P]) for every block
    (<= the drafter's) and budget, within ``seconds`` when given. Returns {"greedy": {type: {...}}, "rows": [...],
    "skipped": [...], "complete": bool, "seconds_limit", "estimate_seconds"} (module docstring)."""
    check_int("max_new", max_new, lo=2)
    blocks = check_list("blocks", list(blocks), lambda n, v: check_int(n, v, lo=2, hi=drafter.block),
                        f"integers in [2, {drafter.block}] (the drafter's block)")
    budgets = check_list("budgets", list(budgets), lambda n, v: check_int(n, v, lo=1), "integers >= 1")
    if seconds is not None:
        check_float("seconds", seconds, lo=0, lo_open=True)
    greedy, gens, rows, skipped, done = {}, {}, [], [], {}
    jobs = measurement_order(list(prompts), blocks, budgets)
    res = {"greedy": greedy, "rows": rows, "skipped": skipped, "complete": False, "seconds_limit": seconds,
           "estimate_seconds": None}
    bar = tqdm(total=len(jobs) + len(prompts), desc="acceptance", disable=not progress)
    t0 = time.perf_counter()
    greedy_s = {}  # each type's greedy wall (prefill included, as a point's is)
    for t, P in prompts.items():
        t1 = time.perf_counter()
        gens[t] = [greedy_generate(target, p.tolist(), max_new) for p in P]
        greedy_s[t] = time.perf_counter() - t1
        greedy[t] = {"prompts": int(P.shape[0]), "prompt_tokens": int(P.shape[1]), "max_new": max_new,
                     "seconds": [g.seconds for g in gens[t]], "forwards": sum(g.forwards for g in gens[t])}
        bar.update(1)
    res["estimate_seconds"] = time.perf_counter() - t0 + sum(greedy_s[t] for t, _, _ in jobs)
    msg = (f"acceptance: greedy took {time.perf_counter() - t0:.1f} s; {len(jobs)} points, about "
           f"{res['estimate_seconds']:.0f} s in all if a point costs what greedy did")
    print(msg + (f" (limit {seconds:g} s)" if seconds is not None else ""), flush=True)
    for point in jobs:
        t, b, k = point
        est = point_estimate(point, done, greedy_s)
        elapsed = time.perf_counter() - t0
        if seconds is not None and elapsed + est > seconds:
            skipped.append({"text_type": t, "block": b, "budget": k, "estimate_seconds": est,
                            "elapsed_seconds": elapsed})
            bar.update(1)
            continue
        P, t1 = prompts[t], time.perf_counter()
        runs = [ddtree_generate(target, drafter, p.tolist(), max_new, k, depth=b - 1) for p in P]
        done[point] = time.perf_counter() - t1
        steps = [s for r in runs for s in r.steps]
        row = {"text_type": t, "block": b, "budget": k, "prompts": int(P.shape[0])}
        row.update(summarize(steps, b, b - 1))
        fw = sum(r.forwards for r in runs)
        row["tokens_per_forward"] = sum(len(r.tokens) - 1 for r in runs) / fw if fw else None
        row["seconds"] = [r.seconds for r in runs]
        row["greedy_seconds"] = greedy[t]["seconds"]
        row["speedup"] = sum(g.seconds for g in gens[t]) / max(1e-12, sum(r.seconds for r in runs))
        row["lossless"] = sum(r.tokens == g.tokens for r, g in zip(runs, gens[t]))
        rows.append(row)
        bar.update(1)
        bar.set_postfix(type=t, block=b, budget=k, tau=f"{row['mean_accepted']:.2f}")
        if on_row is not None:
            on_row(res)
    bar.close()
    order = {t: i for i, t in enumerate(prompts)}
    rows.sort(key=lambda r: (order[r["text_type"]], r["block"], r["budget"]))
    res["complete"] = not skipped
    if skipped:
        print(f"acceptance: {len(skipped)} of {len(jobs)} points skipped to stay within {seconds:g} s", flush=True)
    return res


def measured_rows(doc: dict | None = None, gpu: str = "h200", path: str | Path | None = None) -> list[dict]:
    """The tree rows of the committed acceptance measurement (or of ``doc``, or of the file at ``path``, read in
    place of ``data/measurements/<gpu>/acceptance.json``); [] when there is none. In a file of the chat / math /
    code layout (rows with ``method``) these are the best drafter's tree rows (``results.best_drafter``)."""
    if doc is None and path is not None:
        p = Path(path)
        doc = json.loads(p.read_text()) if p.exists() else None
    elif doc is None:
        doc = load_measurement(ACCEPTANCE_FILE, gpu)
    if doc is None:
        return []
    rows = list(doc["results"]["rows"])
    if rows and "method" in rows[0]:
        best = doc["results"].get("best_drafter")
        rows = [r for r in rows if r["method"] == "tree" and r["drafter"] == best]
    return rows


def _row_for(text_type: str, block: int, budget: int, gpu: str, doc, path) -> dict:
    rows = measured_rows(doc, gpu, path)
    if not rows:
        where = path if path is not None else f"data/measurements/{gpu}/{ACCEPTANCE_FILE}.json"
        raise FileNotFoundError(f"no acceptance measurement for {gpu} ({where}; python -m "
                                f"workbench.bench.acceptance writes it)")
    for r in rows:
        if (r["text_type"], r["block"], r["budget"]) == (text_type, block, budget):
            return r
    have = sorted({(r["text_type"], r["block"], r["budget"]) for r in rows})
    types = sorted({h[0] for h in have})
    if text_type not in types:
        raise InvalidParameter("text_type", text_type, "one of the measured text types: " + ", ".join(types))
    raise InvalidParameter("block, budget", (block, budget), f"a measured (block, budget) for {text_type!r}: "
                           + ", ".join(f"({b}, {k})" for t, b, k in have if t == text_type))


def acceptance_for(text_type: str, block: int, budget: int, gpu: str = "h200", doc: dict | None = None,
                   path: str | Path | None = None) -> float:
    """Measured mean accepted length (root included) of the trained drafter on ``text_type`` at
    ``block`` and ``budget`` (from ``data/measurements/<gpu>/acceptance.json``, or ``doc``, or the file at
    ``path``). A combination that was not measured is an :class:`InvalidParameter` listing what was; no
    measurement at all is a FileNotFoundError naming the file."""
    return float(_row_for(text_type, block, budget, gpu, doc, path)["mean_accepted"])


def histogram_for(text_type: str, block: int, budget: int, gpu: str = "h200", doc: dict | None = None,
                  path: str | Path | None = None) -> list[int]:
    """The measured per-round histogram of accepted lengths (rounds with accepted length 1, 2, ...) of the trained
    drafter on ``text_type`` at ``block`` and ``budget`` ([] for a row that records none); errors as
    :func:`acceptance_for`."""
    return [int(h) for h in _row_for(text_type, block, budget, gpu, doc, path).get("histogram") or []]
