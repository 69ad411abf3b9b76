"""The captured step's terms (ms per step) by kernel family, from the CUDA profiler's records.

The captured engine step (:mod:`workbench.engine.runner`) is one device program; :func:`captured_step_terms`
splits its GPU time into the families of :data:`KERNEL_FAMILIES` (verify attention, MoE, tree build,
accept/commit), the drafter's program timed on its own (:func:`draft_ms`) and the rest. The eager
reference's per-phase times are :mod:`workbench.sweep.eager_phases`.
"""
from __future__ import annotations

import statistics
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from workbench.ddtree import topk_logprobs
from workbench.measure import busy_us

# The captured step's kernels by family (CUDA profiler records of graph replays; names from workbench/kernels/*.cu).
KERNEL_FAMILIES = (("verify_attention", ("ddtree_verify",)), ("moe", ("moe_",)),
                   ("tree_build", ("ddtree_build", "ddtree_visibility")),
                   ("accept_commit", ("ddtree_accept", "ddtree_commit")))
STEP_TERMS = ("draft", "tree_build", "verify_attention", "moe", "accept_commit", "rest")


def classify(name: str) -> str:
    """The family of a kernel name (:data:`KERNEL_FAMILIES`), else ``"other"``."""
    for fam, prefixes in KERNEL_FAMILIES:
        if name.startswith(prefixes):
            return fam
    return "other"


def captured_step_terms(session, steps: int, draft_ms: float = 0.0) -> dict[str, Any]:
    """Per-step terms (ms) of ``steps`` steps of a running :class:`~workbench.engine.decode_engine.Session` on CUDA, from
    the CUDA profiler's kernel records of the step it runs (the captured graph): GPU time of the verify-attention,
    MoE, tree-build and accept/commit kernels; ``draft`` (the drafter's device program, timed on its own by the
    caller, as its kernels are generic torch ones); ``rest`` = wall - those (dense and attention projections,
    norms, lm_head, the glue between kernels and the host's gaps). Also wall_ms and gpu_busy_ms."""
    walls = []
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            if session.done:
                break
            walls.append(session.step().ms)
        torch.cuda.synchronize()
    n = len(walls)
    if not n:
        raise ValueError("the session had no step left to profile")
    ev = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    fam: dict[str, float] = {}
    for e in ev:
        if not e.name.startswith(("Memcpy", "Memset")):
            k = classify(e.name)
            fam[k] = fam.get(k, 0.0) + (e.time_range.end - e.time_range.start) / 1e3 / n
    busy = busy_us((e.time_range.start, e.time_range.end) for e in ev)
    wall = statistics.fmean(walls)
    out = {"wall_ms": wall, "gpu_busy_ms": busy / 1e3 / n, "draft": draft_ms, "steps": n}
    for f, _ in KERNEL_FAMILIES:
        out[f] = fam.get(f, 0.0)
    out["rest"] = wall - sum(out[t] for t in STEP_TERMS if t != "rest")
    return out


def draft_ms(program, C: int, num_generated: int = 1, vocab_k: int = 32, repeats: int = 20) -> float:
    """Median ms (CUDA events) of a drafter's device program's ``draft`` and the top-K log-probs of its logits for
    C rows: the ``draft`` term of :func:`captured_step_terms`."""
    dev = program.floor.device if hasattr(program, "floor") else torch.device("cuda")
    ng = torch.full((C,), num_generated, dtype=torch.int64, device=dev)
    out = []
    for i in range(repeats + 1):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        topk_logprobs(program.draft(ng, ng, ng), vocab_k)
        b.record()
        b.synchronize()
        if i:
            out.append(a.elapsed_time(b))
    return statistics.median(out)
