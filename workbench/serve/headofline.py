"""Head-of-line cost of admitting a long prompt: the inter-token latency of the requests already decoding.

The scheduler runs, between two engine steps, the prefill of what was admitted (:meth:`Batch.prefill`) and then one
batched decode step (:meth:`Batch.decode`); the requests already decoding get their next tokens only after both. So
the gap between two of their token events (their ITL) is one boundary's wall time: prefill + step. Without chunking
a prompt of P tokens is prefilled in one forward at one boundary (one long gap); with ``prefill_chunk=K`` it takes
ceil(P / K) boundaries of one K-token forward each (more, shorter gaps).

:func:`head_of_line` measures exactly that on a :class:`~workbench.engine.batch.Batch` (no HTTP): ``running``
requests decode; after ``warm`` boundaries (the baseline ITL) the long prompt is admitted and every boundary is
timed until it has its first token, then ``after`` more. :func:`head_of_line_sweep` does it per chunk setting.
Times ms; on CUDA each boundary ends with the step's device-to-host copy, so its wall covers the prefill's kernels.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Any, Sequence

from workbench.engine.batch import Batch
from workbench.measure import prompts_for
from workbench.validation import InvalidParameter, check_int


def head_of_line(engine, long_prompt: Sequence[int], running_prompts: Sequence[Sequence[int]],
                 chunk: int | None = None, config=None, drafter=None, warm: int = 3, after: int = 3
                 ) -> dict[str, Any]:
    """ITL of ``running_prompts`` (token-id lists, decoding) while ``long_prompt`` (token ids) is admitted, with
    ``prefill_chunk=chunk`` (None: whole). ``config``/``drafter``: the batch's method (default greedy; a DDTree
    drafter's request ids are the running prompts' 0..R-1, then the long prompt's R).

    Returns {chunk, long_prompt (tokens), running, boundaries (admission to the long prompt's first token),
    baseline_itl_ms (median of the ``warm`` boundaries before), admission_itl_ms (each boundary during the
    admission), max_itl_ms, stall_ms (sum over the admission's boundaries of their excess over the baseline),
    after_itl_ms (median of the ``after`` boundaries once it decodes), long_ttft_ms (admission to its first token),
    tokens_each_boundary (every running request got a token at every boundary)}."""
    warm, after = check_int("warm", warm, lo=1), check_int("after", after, lo=1)
    if not running_prompts:
        raise InvalidParameter("running_prompts", running_prompts, "at least one request decoding")
    P = len(long_prompt)
    boundaries = 1 if chunk is None else math.ceil(P / check_int("chunk", chunk, lo=1))
    b = Batch(engine, config, drafter, prefill_chunk=chunk)
    per_step = b.config.depth + 1 if b.config.method == "ddtree" else 1
    need = (1 + warm + boundaries + after + 1) * per_step
    if need > engine.max_generated:
        raise InvalidParameter("chunk", chunk, f"a chunk that admits the {P}-token prompt in at most "
                                              f"{engine.max_generated // per_step - warm - after - 2} boundaries "
                                              f"(the engine's max_generated {engine.max_generated})")
    run = [b.add(list(p), need) for p in running_prompts]
    got = {id(r): 0 for r in run}

    def boundary() -> float:
        t0 = time.perf_counter()
        ev = b.step()
        ms = (time.perf_counter() - t0) * 1e3
        for r in run:
            got[id(r)] = len(ev.get(r, []))
        return ms

    boundary()  # the running requests' prefill and first step
    boundary()  # a second step: warm buckets (capture on CUDA) before timing
    base = [boundary() for _ in range(warm)]
    t_add = time.perf_counter()
    long = b.add(list(long_prompt), after + 1)
    during, each = [], True
    while not long.tokens:
        during.append(boundary())
        each &= all(got[id(r)] > 0 for r in run)
        if len(during) > boundaries + 1:
            raise RuntimeError(f"the long prompt took more than {boundaries + 1} boundaries to its first token")
    ttft = (time.perf_counter() - t_add) * 1e3
    rest = [boundary() for _ in range(after)]
    for r in run + [long]:
        b.cancel(r)
    if any(r.error for r in run):
        raise RuntimeError(f"a running request failed: {next(r.error for r in run if r.error)}")
    bl = statistics.median(base)
    return {"chunk": chunk, "long_prompt": P, "running": len(run), "boundaries": len(during),
            "baseline_itl_ms": bl, "admission_itl_ms": during, "max_itl_ms": max(during),
            "stall_ms": sum(max(0.0, d - bl) for d in during), "after_itl_ms": statistics.median(rest),
            "long_ttft_ms": ttft, "tokens_each_boundary": bool(each)}


def head_of_line_sweep(engine, long_context: int, running: int = 1, running_context: int = 16,
                       chunks: Sequence[int | None] = (None, 256), config=None, drafter=None, warm: int = 3,
                       after: int = 3, seed: int = 0) -> list[dict[str, Any]]:
    """:func:`head_of_line` for each chunk setting (None: whole-prompt prefill) with seeded random prompts:
    ``running`` requests of ``running_context`` tokens and one of ``long_context``. One row per chunk."""
    check_int("long_context", long_context, lo=1)
    check_int("running", running, lo=1)
    V = engine.model.config.vocab_size
    long_prompt = prompts_for(long_context, 1, V, seed + 1)[0]
    short = prompts_for(check_int("running_context", running_context, lo=1), running, V, seed)
    return [head_of_line(engine, long_prompt, short, c, config, drafter, warm, after) for c in chunks]
