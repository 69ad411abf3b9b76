"""Timing the dispatched INT4 MoE path (:mod:`workbench.bench.moe`): one graph replay per call with fresh routing
per repeat (:func:`time_ours`, also queued behind a sleep kernel and as profiler spans), many calls in one graph
(:func:`time_ours_in_graph`), and the percent of copy bandwidth each reaches (:func:`pct_of_copy`,
:func:`in_graph_pct_of_copy`). Times in ms (CUDA events); hidden bf16 [M, H].
"""
from __future__ import annotations

import itertools
import statistics
from typing import Any, Callable

import torch

from workbench.bench.moe_counts import KIMI, REL_TOL, bytes_moved, distinct_experts, make_routing, rel_error
from workbench.kernels import cuda_errors
from workbench.measure import capture_graphs, time_cuda_queued, time_cuda_spans, time_in_graph
from workbench.moe.fused import fused_moe_int4
from workbench.moe.packing import Int4Experts
from workbench.moe.reference import moe_reference

IN_GRAPH_CALLS = 16   # calls captured back to back in one graph by time_ours_in_graph
IN_GRAPH_CHECK_MAX_M = 16   # its outputs are checked against the reference up to this M


def events_ms(fn: Callable[[], Any]) -> float:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e)


def capture_graph(fn: Callable[[], Any]) -> torch.cuda.CUDAGraph:
    return capture_graphs([fn])[0]




class RoutingRotation:
    """``n`` fresh routings made up front (:func:`make_routing`, moved to the GPU) and the static tensors ``ids`` /
    ``weights`` a captured call reads: :meth:`setup` copies the next routing into them before each timed call
    (rotating), records its index in ``used``; ``distinct[j]``: the experts routing j touches."""

    def __init__(self, m: int, num_experts: int, topk: int, routing: str, gen: torch.Generator, n: int):
        rts = [make_routing(m, num_experts, topk, routing, gen) for _ in range(n)]
        self.ids_all = torch.stack([r[0] for r in rts]).cuda()
        self.w_all = torch.stack([r[1] for r in rts]).cuda()
        self.distinct = [distinct_experts(r[0]) for r in rts]
        self.ids, self.weights = self.ids_all[0].clone(), self.w_all[0].clone()
        self.used: list[int] = []
        self._counter = itertools.count()

    def setup(self, _: int = 0) -> None:
        j = next(self._counter) % len(self.distinct)
        self.used.append(j)
        self.ids.copy_(self.ids_all[j])
        self.weights.copy_(self.w_all[j])




def time_ours(experts: Int4Experts, m: int, routing: str, gen: torch.Generator, reps: int,
              eager_reps: int = 10, topk: int = 8, queued: bool = False, spans: bool = False,
              kernel: str | None = None) -> dict[str, Any]:
    """CUDA-graph replays of fused_moe_int4 (``kernel``: as its argument; None: the dispatch's) with fresh routing per
    repeat (+ eager calls). ``ms``: one
    replay between two events on an idle GPU, so the host's graph-launch latency is inside each sample;
    with ``queued``, also ``queued_ms``: the same replays with a sleep kernel queued ahead of the start
    event (measure.time_cuda_queued), the device time of one call without that latency; with ``spans``, also
    ``span_ms``: the same replays, one at a time, timed by the CUDA profiler's kernel records
    (measure.time_cuda_spans: first kernel start to last kernel end, no events), ``span_kernels`` kernels a call,
    or ``span_error`` when the profiler could not time them."""
    e, h = experts.num_experts, experts.hidden
    warm = 3   # warm-up calls of the one-replay, queued and span timings (each call draws a routing)
    rot = RoutingRotation(m, e, topk, routing, gen,
                          reps + eager_reps + 4 + (reps + warm) * (int(queued) + int(spans)))
    distinct, used, setup = rot.distinct, rot.used, rot.setup
    x = torch.randn(m, h, device="cuda").to(torch.bfloat16)

    def call() -> torch.Tensor:
        return fused_moe_int4(x, rot.ids, rot.weights, experts, validate=False, kernel=kernel)

    graph_err = None
    ms: list[float] = []
    rep_idx: list[int] = []
    queued_ms: list[float] = []
    queued_idx: list[int] = []
    span_ms: list[float] = []
    span_idx: list[int] = []
    span_kernels, span_error = None, None

    def rotated(timer: Callable[..., Any], replay: Callable[[], Any]) -> tuple[Any, list[int]]:
        """``timer``'s result for ``replay`` (the graph's), and the routings of its timed (not warm-up) calls."""
        start = len(used)
        res = timer(replay, warmup=warm, reps=reps, setup=setup)
        return res, used[start + warm:]

    try:
        g = capture_graph(call)
        for r in range(reps + warm):
            setup()
            t = events_ms(g.replay)
            if r >= warm:
                ms.append(t)
        rep_idx = used[warm:]
        if queued:
            queued_ms, queued_idx = rotated(time_cuda_queued, g.replay)
        if spans:
            try:
                (span_ms, span_kernels), span_idx = rotated(time_cuda_spans, g.replay)
            except (RuntimeError, ValueError) as exc:  # the profiler's failure is recorded, the other timings stand
                span_error = repr(exc)[:300]
        del g
    except cuda_errors() as exc:   # capture or replay failed: recorded, the eager times stand
        graph_err = repr(exc)[:300]
    eager = []
    n_eager = eager_reps if ms else max(eager_reps, reps)
    for _ in range(n_eager):
        setup()
        eager.append(events_ms(call))
    if not ms:  # graph capture failed: report eager times
        ms, rep_idx = eager, used[-n_eager:]
    return {"ms": ms, "distinct": [distinct[j] for j in rep_idx], "eager_ms": eager, "graph_error": graph_err,
            "queued_ms": queued_ms, "queued_distinct": [distinct[j] for j in queued_idx],
            "span_ms": span_ms, "span_distinct": [distinct[j] for j in span_idx], "span_kernels": span_kernels,
            "span_error": span_error,
            "x": x, "ids_all": rot.ids_all, "w_all": rot.w_all, "rep_idx": rep_idx}




def in_graph_pct_of_copy(distinct: list[int], ms: float, bpe: int, m: int, copy_gbps: float, topk: int = 8,
                         hidden: int = KIMI["hidden"]) -> float:
    """% of the copy bandwidth of an in-graph per-call time ``ms``: the mean bytes of the graph's calls
    (``distinct`` experts each) over that time."""
    mean_bytes = statistics.mean(bytes_moved(d, bpe, m, hidden, topk) for d in distinct)
    return 100 * mean_bytes / (ms * 1e-3) / 1e9 / copy_gbps


def time_ours_in_graph(banks: list[Int4Experts], m: int, routing: str, gen: torch.Generator, reps: int,
                       calls: int = IN_GRAPH_CALLS, topk: int = 8) -> dict[str, Any]:
    """Device time per call of ``calls`` fused_moe_int4 calls captured back to back in ONE CUDA graph
    (measure.time_in_graph), as the MoE layers of a captured decode step run: call i reads its own fresh
    routing and the weights ``banks[i % len(banks)]``. No host launch latency is inside a sample; each
    call still pays its launch inside the graph and its start on an idle GPU after the previous call's
    tail. For M <= IN_GRAPH_CHECK_MAX_M the first and the last call's outputs of the final replay are
    checked against the float32 reference (``check``). ``distinct``: per call, in call order."""
    if not banks:
        raise ValueError("banks must hold at least one Int4Experts")
    e, h = banks[0].num_experts, banks[0].hidden
    rts = [make_routing(m, e, topk, routing, gen) for _ in range(calls)]
    ids = [r[0].cuda() for r in rts]
    ws = [r[1].cuda() for r in rts]
    distinct = [distinct_experts(r[0]) for r in rts]
    x = torch.randn(m, h, device="cuda").to(torch.bfloat16)
    outs: list[torch.Tensor | None] = [None] * calls
    check: dict[str, Any] = {"m": m, "routing": routing, "in_graph_calls": calls, "checked": False, "ok": True}

    def make(i: int) -> Callable[[], None]:
        def call() -> None:
            outs[i] = fused_moe_int4(x, ids[i], ws[i], banks[i % len(banks)], validate=False)
        return call

    def after() -> None:
        if m > IN_GRAPH_CHECK_MAX_M:
            return
        torch.cuda.synchronize()
        errs = []
        for i in (0, calls - 1):
            ref = moe_reference(x, ids[i], ws[i], banks[i % len(banks)]).float().cpu()
            errs.append(rel_error(outs[i].float().cpu(), ref))
        check.update(checked=True, rel_err=max(errs), ok=all(err <= REL_TOL for err in errs))

    samples, n = time_in_graph([make(i) for i in range(calls)], reps, min_calls=calls, after=after)
    return {"ms": samples, "calls": n, "distinct": distinct, "check": check}




IN_GRAPH_PARAMS = {
    "timing_queued": "<path>_queued_*: the same one-replay samples with a sleep kernel queued ahead of the start "
                     "event (measure.time_cuda_queued): one call's device time without the host's launch latency",
    "timing_span": "<path>_span_*: the same replays, one at a time on an idle GPU, timed by the CUDA profiler's "
                   "kernel records (measure.time_cuda_spans: first kernel start to last kernel end, no CUDA events); "
                   "results.graph_launch_latency: one replay minus queued of a graph holding one tiny kernel",
    "timing_in_graph": f"<path>_ingraph_*: {IN_GRAPH_CALLS} calls captured back to back in ONE graph, fresh routing "
                       "per call, alternating two weight sets (no call finds the previous call's weights in L2); "
                       "per-call time = replay time / calls; % of copy from the calls' mean bytes",
    "in_graph_calls": IN_GRAPH_CALLS}


def pct_of_copy(distinct: list[int], ms: list[float], bpe: int, m: int, copy_gbps: float, topk: int = 8,
                hidden: int = KIMI["hidden"]) -> float:
    """% of the copy bandwidth of one-call samples: median over samples of (bytes of that call's routing /
    its time)."""
    gb = [bytes_moved(d, bpe, m, hidden, topk) / (t * 1e-3) / 1e9 for d, t in zip(distinct, ms)]
    return 100 * statistics.median(gb) / copy_gbps


def in_graph_fields(label: str, t: dict[str, Any], banks: list[Int4Experts], m: int, routing: str,
                    gen: torch.Generator, reps: int, bpe: int, copy_gbps: float, checks: list[dict[str, Any]],
                    samples: dict[str, Any], topk: int = 8) -> dict[str, Any]:
    """A row's queued, profiler-span and in-graph columns for path ``label`` (``<label>_queued_ms_median`` /
    ``_pct_of_copy`` from ``time_ours(..., queued=True)``'s ``t``, ``<label>_span_*`` where ``t`` has spans,
    ``<label>_ingraph_*`` from :func:`time_ours_in_graph` over ``banks``; no prefix for ``label`` ""); appends the
    in-graph output check to ``checks`` and the raw samples to ``samples``."""
    hidden = banks[0].hidden
    pre = f"{label}_" if label else ""
    out: dict[str, Any] = {}
    if t["queued_ms"]:
        out[f"{pre}queued_ms_median"] = statistics.median(t["queued_ms"])
        out[f"{pre}queued_pct_of_copy"] = pct_of_copy(t["queued_distinct"], t["queued_ms"], bpe, m, copy_gbps,
                                                      topk, hidden)
    if t.get("span_ms"):   # the profiler's kernel spans (time_ours(..., spans=True))
        out[f"{pre}span_ms_median"] = statistics.median(t["span_ms"])
        out[f"{pre}span_pct_of_copy"] = pct_of_copy(t["span_distinct"], t["span_ms"], bpe, m, copy_gbps, topk, hidden)
        out[f"{pre}span_kernels"] = t["span_kernels"]
    if t.get("span_error"):
        out[f"{pre}span_error"] = t["span_error"]
    ig = time_ours_in_graph(banks, m, routing, gen, reps, topk=topk)
    med = statistics.median(ig["ms"])
    out[f"{pre}ingraph_ms_median"] = med
    out[f"{pre}ingraph_pct_of_copy"] = in_graph_pct_of_copy(ig["distinct"], med, bpe, m, copy_gbps, topk, hidden)
    checks.append({**ig["check"], "label": label or "dispatched"})
    key = f"{routing}/m{m}/{label or 'ours'}"
    samples[f"{key}/queued"] = {"ms": t["queued_ms"], "distinct": t["queued_distinct"]}
    if t.get("span_ms"):
        samples[f"{key}/span"] = {"ms": t["span_ms"], "distinct": t["span_distinct"]}
    samples[f"{key}/in_graph"] = {"ms_per_call": ig["ms"], "distinct": ig["distinct"], "calls": ig["calls"]}
    return out
