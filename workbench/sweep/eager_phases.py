"""Per-step phase times (ms) at each context from the eager reference decode.

The captured engine step (:mod:`workbench.engine.runner`) is one device program and records only its
total; :func:`workbench.engine.generate` (its eager, token-for-token equal reference) times each phase
of a step: draft, tree_build, verify (the target's forward over the tree: attention and MoE together,
not split), accept, commit. :func:`phase_breakdown` runs it with the sweep's ScriptedDrafter at each
context and reports the mean ms per phase per step, so the notebook can say which phase grows with
context. The captured step's split by kernel family is :mod:`workbench.sweep.phases`.
"""
from __future__ import annotations

import statistics
from typing import Any, Sequence

from workbench.engine.generate import PHASES
from workbench.engine.generate import generate as eager
from workbench.measure import prompts_for
from workbench.sweep import engine as es


def phase_breakdown(model, contexts: Sequence[int], methods: Sequence[str] = ("ddtree-high",), generate: int = 32,
                    block: int = 8, budget: int = 16, seed: int = 0) -> list[dict[str, Any]]:
    """One row per (context, method): mean ms per step of each phase in ``PHASES`` and ``total``, the mean
    accepted length and the steps counted (the first step, which warms the path, is left out when there are
    more)."""
    es.check_sweep(contexts, [1], generate, [1, generate], methods, model.rotary.max_positions, block, budget)
    vocab = model.config.vocab_size
    rows = []
    for c in contexts:
        prompt = prompts_for(c, 1, vocab, seed)
        cont = eager(model, prompt, generate)[0].tokens if any(m != "greedy" for m in methods) else None
        for m in methods:
            drafter = es.drafter_for(m, [cont], vocab, block, seed, budget=budget)
            res = eager(model, prompt, generate, config=es.decode_config(m, block, budget), drafter=drafter)[0]
            steps = res.steps[1:] if len(res.steps) > 1 else res.steps
            row = {"context": c, "method": m, "steps": len(steps),
                   "mean_accepted": statistics.fmean(s.accepted_length for s in steps)}
            for p in PHASES + ("total",):
                row[p] = statistics.fmean(s.times_ms.get(p, 0.0) for s in steps)
            rows.append(row)
    return rows
