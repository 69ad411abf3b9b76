"""INT4 MoE measurement: ``python -m workbench.bench.moe --out DIR`` (on the GPU).

Checks every kernel the dispatch reaches against the float32 reference, then times the dispatched path
(:func:`workbench.moe.fused.moe_plan`) at Kimi K2.6 shapes (384 experts, H 7168, I 2048, top-8) over M tokens and
two routings, beside: the copy bandwidth and bf16 matmul rate measured in the same run (the floors), the four-launch
path at M <= 16 (where a small-M kernel is dispatched), and torch peers (bf16 experts through cuBLAS per expert,
torch's int4 weight-only kernel per expert, dequantise-then-matmul). Writes ``DIR/moe_bandwidth.json`` with
provenance (:func:`workbench.measure.write_measurement`); ``--sanitize`` runs only the checks at a small shape (for
``compute-sanitizer``).

Routing: ``uniform`` draws each token's k experts as the top-k of i.i.d. uniform scores; ``skewed`` draws them
without replacement with probability proportional to 1 / rank^alpha (alpha = 1) over a fresh random ranking of
the experts per draw. Every timed repeat gets fresh routing, so the weights streamed rotate through all 384
experts (about 9.5 GB of INT4 per layer, far beyond the 60 MB L2).

Bytes counted per call: packed weights + scales of each distinct expert touched, hidden in (M x H bf16), out
(M x H bf16), topk ids and weights (int32 + f32). The kernels' own intermediates (h, per-pair y) are not part of
the floor.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from workbench.dispatch import dispatch_for
from workbench.kernels import cuda_errors
from workbench.measure import (capture_graphs, graph_launch_latency, measure_bf16_matmul_tflops, measure_copy_bandwidth,
                               time_cuda_queued, time_cuda_spans, time_in_graph, write_measurement)
from workbench.moe.fused import (FOUR_LAUNCH, FRAG_VARIANTS, LARGE_VARIANTS, SMALL_KERNELS, SMALL_MAX_PAIRS,
                                 fused_moe_int4, moe_plan, variant_name)
from workbench.moe.packing import Int4Experts, random_int4_experts
from workbench.moe.reference import moe_reference

M_VALUES = (1, 2, 4, 8, 9, 16, 32, 64, 128, 256, 512, 1024)
ROUTINGS = ("uniform", "skewed")
KIMI = {"num_experts": 384, "hidden": 7168, "intermediate": 2048, "topk": 8}
SKEW_ALPHA = 1.0
REL_TOL = 1e-2   # relative Frobenius error a check accepts (tests/tolerances.py holds the tests' bounds)
IN_GRAPH_CALLS = 16   # calls captured back to back in one graph by time_ours_in_graph
IN_GRAPH_CHECK_MAX_M = 16   # its outputs are checked against the reference up to this M


# ----------------------------------------------------------------------------- routing and counting

def make_routing(m: int, num_experts: int, topk: int, kind: str, gen: torch.Generator,
                 alpha: float = SKEW_ALPHA) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_ids int32 [m, topk], topk_weights f32 [m, topk] summing to 1 per token), on the CPU."""
    if topk > num_experts:
        raise ValueError(f"topk {topk} exceeds num_experts {num_experts}")
    if kind == "uniform":
        ids = torch.rand(m, num_experts, generator=gen).topk(topk, dim=1).indices
    elif kind == "skewed":
        perm = torch.randperm(num_experts, generator=gen)
        p = torch.empty(num_experts)
        p[perm] = 1.0 / torch.arange(1, num_experts + 1, dtype=torch.float32) ** alpha
        ids = torch.multinomial(p.expand(m, num_experts), topk, replacement=False, generator=gen)
    else:
        raise ValueError(f"routing must be one of {ROUTINGS}, got {kind!r}")
    w = torch.rand(m, topk, generator=gen) + 0.1
    return ids.to(torch.int32), w / w.sum(1, keepdim=True)


def distinct_experts(topk_ids: torch.Tensor) -> int:
    return int(torch.unique(topk_ids).numel())


def bytes_moved(distinct: int, bytes_per_expert: int, m: int, hidden: int, topk: int) -> int:
    """Fewest bytes a call must move: touched experts' weights + scales, activations in and out, routing."""
    return distinct * bytes_per_expert + 2 * m * hidden * 2 + m * topk * 8


def flops(m: int, topk: int, hidden: int, intermediate: int) -> int:
    """Multiply-adds x 2 of gate_up (2I x H) and down (H x I) for every (token, expert) pair."""
    return 2 * m * topk * 3 * hidden * intermediate


def plateau_m(m_values: list[int], ms: list[float], tol: float = 0.10) -> int | None:
    """Smallest M whose time per token is within ``tol`` of the sweep's lowest time per token.

    This is where time per token stops falling (bigger batches buy < tol). None when
    that M is the largest one swept and time per token still fell by more than ``tol``
    on the way there: the plateau lies beyond the sweep.
    """
    pts = [(m, t / m) for m, t in zip(m_values, ms) if t is not None and math.isfinite(t)]
    if not pts:
        return None
    best = min(v for _, v in pts)
    for idx, (m, v) in enumerate(pts):
        if v <= best * (1 + tol):
            if idx == len(pts) - 1 and idx > 0 and pts[idx - 1][1] > v * (1 + tol):
                return None
            return m
    return None


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (inf when out holds NaN/inf)."""
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("inf")
    return float((o - r).norm() / r.norm().clamp_min(1e-300))


# ----------------------------------------------------------------------------- peers

def dequantize_gpu(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Vectorised dequantisation [out, in//8] int32 + [out, in//32] -> [out, in] ``dtype`` (any device)."""
    out_f = packed.shape[0]
    shifts = torch.arange(0, 32, 4, device=packed.device, dtype=torch.int32)
    q = ((packed.unsqueeze(-1) >> shifts) & 15) - 8
    w = q.reshape(out_f, scale.shape[1], -1).to(dtype) * scale.to(dtype).unsqueeze(-1)
    return w.reshape(out_f, -1)


def to_tinygemm(packed: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Our [n, k//8] int32 + [n, k//32] bf16 -> torch._weight_int4pack_mm operands (symmetric: zero = 0).

    torch's format: uint8 [n, k//2] with element 2j in the high nibble, values q + 8,
    then _convert_weight_to_int4pack(., innerKTiles=8); scales_and_zeros [k//32, n, 2],
    dequantised as (u - 8) * scale + zero.
    """
    b = packed.contiguous().view(torch.uint8)
    b = ((b & 0xF) << 4) | (b >> 4)
    w = torch._convert_weight_to_int4pack(b.contiguous(), 8)
    sz = torch.stack([scale, torch.zeros_like(scale)], -1).transpose(0, 1).contiguous()
    return w, sz


def group_pairs(topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """Host-side grouping [(expert, token idx, weight)] on the ids' device (peers only; needs a sync)."""
    m, k = topk_ids.shape
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    fe = flat[order]
    experts, counts = torch.unique_consecutive(fe, return_counts=True)
    tokens = (order // k)
    w = topk_weights.reshape(-1)[order].float()
    out, start = [], 0
    for e, c in zip(experts.tolist(), counts.tolist()):
        out.append((e, tokens[start:start + c], w[start:start + c]))
        start += c
    return out


def peer_moe(x: torch.Tensor, groups, gate_up: Callable[[int, torch.Tensor], torch.Tensor],
             down: Callable[[int, torch.Tensor], torch.Tensor], inter: int) -> torch.Tensor:
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for e, tok, w in groups:
        gu = gate_up(e, x[tok])
        h = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        y = down(e, h)
        out.index_add_(0, tok, y.float() * w[:, None])
    return out.to(torch.bfloat16)




def _events_ms(fn: Callable[[], Any]) -> float:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e)


def _capture(fn: Callable[[], Any]) -> torch.cuda.CUDAGraph:
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
        g = _capture(call)
        for r in range(reps + warm):
            setup()
            t = _events_ms(g.replay)
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
        eager.append(_events_ms(call))
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




# ----------------------------------------------------------------------------- correctness

def check_case(experts: Int4Experts, m: int, routing: str, gen: torch.Generator, topk: int = 8,
               ids: torch.Tensor | None = None, kernel: str | tuple | None = None) -> dict[str, Any]:
    """One parity check of fused_moe_int4 (``kernel`` as its argument) against the float32 reference on fresh
    random inputs, outputs poisoned first (unwritten rows show as NaN)."""
    h, i, e = experts.hidden, experts.intermediate, experts.num_experts
    if ids is None:
        ids, w = make_routing(m, e, topk, routing, gen)
    else:
        w = torch.rand(ids.shape, generator=gen) + 0.1
    x = torch.randn(m, h, generator=gen).to(torch.bfloat16).cuda()
    ids, w = ids.cuda(), w.cuda()
    p = m * topk
    for n in (p * h * 4, p * i * 2, m * h * 2):   # NaN into cached blocks of the sizes the call allocates
        torch.full((max(1, n // 4),), float("nan"), device="cuda")
    plan = moe_plan(m, topk, x.device, hidden=h, intermediate=i, kernel=kernel, layout=experts.layout)
    out = fused_moe_int4(x, ids, w, experts, validate=False, kernel=kernel).cpu()
    ref = moe_reference(x, ids, w, experts).cpu()
    err = rel_error(out, ref)
    nan = int((~torch.isfinite(out)).sum())
    return {"m": m, "routing": routing, "hidden": h, "intermediate": i, "experts": e, "path": plan["kernel"],
            "rel_err": err, "nonfinite": nan, "ok": bool(nan == 0 and err <= REL_TOL)}


def kernel_checks(experts: Int4Experts, gen: torch.Generator, topk: int = 8,
                  packed: Int4Experts | None = None) -> list[dict[str, Any]]:
    """On ``experts`` (fragment layout): every small-M kernel at M = 1, 2, 16 (uniform and skewed), every fragment
    four-launch variant at M = 1, 9, 40 and 300, the dispatched path at larger M; on ``packed`` (the same experts in
    the packed layout, when given) every packed four-launch variant at M = 1, 9, 40; an invalid id in each path (its
    token's row NaN, the others finite) and a graph replay."""
    res = []
    for kern, m, routing in itertools.product(SMALL_KERNELS, (1, 2, 16), ROUTINGS):
        res.append(check_case(experts, m, routing, gen, topk, kernel=kern))
    for kern, m in itertools.product(FRAG_VARIANTS, (1, 9, 40, 300)):
        res.append(check_case(experts, m, "skewed", gen, topk, kernel=kern))
    for var, m in itertools.product(LARGE_VARIANTS if packed is not None else (), (1, 9, 40)):
        res.append(check_case(packed, m, "skewed", gen, topk, kernel=var))
    for m in (17, 33, 256):
        res.append(check_case(experts, m, "uniform", gen, topk))
    e = experts.num_experts
    for kern in (*SMALL_KERNELS, *FRAG_VARIANTS):
        bad = torch.randint(0, e, (5, topk), generator=gen, dtype=torch.int32)
        bad[2, 3] = e + 7
        xb = torch.randn(5, experts.hidden, generator=gen).to(torch.bfloat16).cuda()
        ob = fused_moe_int4(xb, bad.cuda(), torch.full((5, topk), 0.125).cuda(), experts, validate=False,
                            kernel=kern).cpu()
        res.append({"m": 5, "routing": "invalid-id", "path": kern, "note": "row 2 NaN, the others finite",
                    "ok": bool(torch.isnan(ob[2]).all() and torch.isfinite(ob[[0, 1, 3, 4]]).all())})
    rts = [make_routing(4, e, topk, "uniform", gen) for _ in range(3)]
    x = torch.randn(4, experts.hidden, generator=gen).to(torch.bfloat16).cuda()
    s_ids, s_w = rts[0][0].cuda(), rts[0][1].cuda()
    held: dict[str, torch.Tensor] = {}
    g = _capture(lambda: held.__setitem__("out", fused_moe_int4(x, s_ids, s_w, experts, validate=False)))
    errs = []
    for ids, w in rts:
        s_ids.copy_(ids)
        s_w.copy_(w)
        g.replay()
        errs.append(rel_error(held["out"].cpu(), moe_reference(x, s_ids, s_w, experts).cpu()))
    res.append({"m": 4, "routing": "graph-replay", "path": moe_plan(4, topk, x.device, hidden=experts.hidden,
                                                                     intermediate=experts.intermediate,
                                                                     layout=experts.layout)["kernel"],
                "rel_err": max(errs), "ok": all(er <= REL_TOL for er in errs)})
    return res


# ----------------------------------------------------------------------------- the benchmark

def _peers(experts: Int4Experts, gen: torch.Generator, checks: list[dict[str, Any]]) -> tuple[dict, dict]:
    """The torch peers' (gate_up, down) per-expert callables, each checked at M = 4 first; and their errors."""
    E, H, I, K = experts.num_experts, experts.hidden, experts.intermediate, KIMI["topk"]
    peers: dict[str, Any] = {}
    errors: dict[str, str] = {}
    try:
        gu_bf16 = torch.stack([dequantize_gpu(experts.gate_up_packed[e], experts.gate_up_scale[e]) for e in range(E)])
        dn_bf16 = torch.stack([dequantize_gpu(experts.down_packed[e], experts.down_scale[e]) for e in range(E)])
        peers["bf16_cublas"] = (lambda e, x: x @ gu_bf16[e].T, lambda e, h: h @ dn_bf16[e].T)
    except RuntimeError as err:  # a peer that cannot run (out of memory, ...) is recorded, the others stand
        errors["bf16_cublas"] = repr(err)
    try:
        tg = [to_tinygemm(experts.gate_up_packed[e], experts.gate_up_scale[e]) for e in range(E)]
        td = [to_tinygemm(experts.down_packed[e], experts.down_scale[e]) for e in range(E)]
        peers["torch_int4pack"] = (lambda e, x: torch._weight_int4pack_mm(x, tg[e][0], 32, tg[e][1]),
                                   lambda e, h: torch._weight_int4pack_mm(h.to(torch.bfloat16), td[e][0], 32,
                                                                          td[e][1]))
    except (RuntimeError, AttributeError, NotImplementedError) as err:   # this torch lacks the int4pack ops
        errors["torch_int4pack"] = repr(err)
    peers["dequant_matmul"] = (
        lambda e, x: x @ dequantize_gpu(experts.gate_up_packed[e], experts.gate_up_scale[e]).T,
        lambda e, h: h @ dequantize_gpu(experts.down_packed[e], experts.down_scale[e]).T)
    ids4, w4 = make_routing(4, E, K, "uniform", gen)
    x4 = torch.randn(4, H, generator=gen).to(torch.bfloat16).cuda()
    ref4 = moe_reference(x4, ids4.cuda(), w4.cuda(), experts).cpu()
    groups4 = group_pairs(ids4.cuda(), w4.cuda())
    for name, (fg, fd) in list(peers.items()):
        err = rel_error(peer_moe(x4, groups4, fg, fd, I).cpu(), ref4)
        checks.append({"m": 4, "routing": "uniform", "peer": name, "rel_err": err, "ok": err <= REL_TOL})
    return peers, errors


def _time_peer(fg, fd, x: torch.Tensor, ids_all: torch.Tensor, w_all: torch.Tensor, inter: int, reps: int) -> list:
    """ms of a peer: fresh routing per repeat, host-side grouping outside the timed region, one graph per routing."""
    pms = []
    for r in range(reps):
        j = (r * 7 + 1) % ids_all.shape[0]
        groups = group_pairs(ids_all[j], w_all[j])
        gp = _capture(lambda: peer_moe(x, groups, fg, fd, inter))
        gp.replay()
        pms.append(_events_ms(gp.replay))
        del gp
    return pms


def time_variants(experts: Int4Experts, packed: Int4Experts, gen: torch.Generator, m_values,
                  reps: int) -> dict[str, Any]:
    """Median ms of each four-launch variant (forced) at each M, uniform routing: the fragment variants on
    ``experts``, the packed ones on ``packed`` (the same weights); the data the dispatch's ``moe_large_frag`` and
    ``moe_large`` rows are set from (``results.tuning``)."""
    def med(ex: Int4Experts, m: int, kern) -> float:
        return statistics.median(time_ours(ex, m, "uniform", gen, reps, eager_reps=0, kernel=kern)["ms"])

    ms = {name: {str(m): med(experts, m, name) for m in m_values} for name in FRAG_VARIANTS}
    ms.update({variant_name(v): {str(m): med(packed, m, v) for m in m_values} for v in LARGE_VARIANTS})
    return {"ms": ms}


def layout_ab(out_dir: str | Path | None, m_values=(17, 33, 66, 132, 264, 528, 1024), experts_values=(384, 64),
              reps: int = 10, seed: int = 0, name: str = "moe_layout_ab") -> Path:
    """The four-launch path on the fragment layout (each ``frag_nt<NT>``) against the packed layout (each packed
    variant) at K2.6 shapes, M tokens beyond the small-M range, for each expert count (uniform routing, fresh per
    repeat, CUDA-graph replays): whether the experts can be held once, in the fragment layout, without losing speed
    where the small-M kernels do not run. Checks every variant against the reference first."""
    gen = torch.Generator().manual_seed(seed)
    H, I, K = KIMI["hidden"], KIMI["intermediate"], KIMI["topk"]
    rows, checks = [], []
    copy = measure_copy_bandwidth()
    for e in experts_values:
        frag = random_int4_experts(e, H, I, device="cuda", seed=seed, layout="fragments")
        packed = random_int4_experts(e, H, I, device="cuda", seed=seed, layout="packed")
        bpe = packed.bytes_per_expert()
        for kern in FRAG_VARIANTS:
            checks.append({**check_case(frag, 40, "skewed", gen, K, kernel=kern), "kernel": kern})
        for var in LARGE_VARIANTS:
            checks.append({**check_case(packed, 40, "skewed", gen, K, kernel=var), "kernel": variant_name(var)})
        for m in m_values:
            row: dict[str, Any] = {"experts": e, "m": m,
                                   "dispatched_frag": moe_plan(m, K, "cuda", hidden=H, intermediate=I,
                                                               layout="fragments")["kernel"],
                                   "dispatched_packed": moe_plan(m, K, "cuda", hidden=H, intermediate=I,
                                                                 layout="packed")["kernel"]}
            for label, ex, kern in [*((k, frag, k) for k in FRAG_VARIANTS),
                                    *((variant_name(v), packed, v) for v in LARGE_VARIANTS)]:
                t = time_ours(ex, m, "uniform", gen, reps, eager_reps=0, kernel=kern)
                row[f"{label}_ms"] = statistics.median(t["ms"])
                row[f"{label}_pct_of_copy"] = pct_of_copy(t["distinct"], t["ms"], bpe, m, copy["gb_per_s"], K, H)
            frag_best = min(FRAG_VARIANTS, key=lambda k: row[f"{k}_ms"])
            packed_best = min((variant_name(v) for v in LARGE_VARIANTS), key=lambda k: row[f"{k}_ms"])
            row.update({"frag_best": frag_best, "packed_best": packed_best,
                        "frag_best_over_packed_best": row[f"{frag_best}_ms"] / row[f"{packed_best}_ms"]})
            rows.append(row)
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        del frag, packed
        torch.cuda.empty_cache()

    params = {"hidden": H, "intermediate": I, "topk": K, "m_values": list(m_values),
              "experts_values": list(experts_values), "reps": reps, "seed": seed, "routing": "uniform",
              "dispatch": dispatch_for().record(),
              "timing": "median of CUDA-event timed CUDA-graph replays of one call, fresh routing per repeat"}
    return write_measurement(name, parameters=params,
                             results={"copy_gb_per_s": copy["gb_per_s"], "rows": rows, "checks": checks,
                                      "all_checks_ok": all(c["ok"] for c in checks)},
                             samples={"copy": copy}, notes=layout_ab.__doc__.split("\n\n")[0], out_dir=out_dir)


def run_benchmark(out_dir: str | Path | None, m_values=M_VALUES, reps: int = 30, peer_reps: int = 8, seed: int = 0,
                  include_peers: bool = True, spans: bool = True, name: str = "moe_bandwidth",
                  tune_reps: int = 10) -> Path:
    """Checks, ceilings, the four-launch variants' timings (``tune_reps`` > 0), then the sweep over ``m_values`` x
    routings; returns the path of ``name``.json."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    E, H, I, K = KIMI["num_experts"], KIMI["hidden"], KIMI["intermediate"], KIMI["topk"]
    experts = random_int4_experts(E, H, I, device="cuda", seed=seed)   # the layout the engine holds here
    packed = (experts if experts.layout == "packed" else
              random_int4_experts(E, H, I, device="cuda", seed=seed, layout="packed"))   # the same weights, packed
    bpe = experts.bytes_per_expert()
    checks = kernel_checks(experts, gen, K, packed=packed if packed is not experts else None)
    copy, mm = measure_copy_bandwidth(), measure_bf16_matmul_tflops()
    copy_gbps, tflops_peak = copy["gb_per_s"], mm["tflops"]
    latency = graph_launch_latency() if spans else None
    banks = [experts, random_int4_experts(E, H, I, device="cuda", seed=seed + 101)]   # in-graph: two weight sets
    peers, peer_errors = _peers(packed, gen, checks) if include_peers else ({}, {})
    tuning = (time_variants(experts, packed, gen, m_values, tune_reps)
              if tune_reps > 0 and experts.layout == "fragments" else None)
    rows: list[dict[str, Any]] = []
    samples: dict[str, Any] = {}
    for routing, m in itertools.product(ROUTINGS, m_values):
        t = time_ours(experts, m, routing, gen, reps, queued=True, spans=spans)
        ms, distinct = t["ms"], t["distinct"]
        byts = [bytes_moved(d, bpe, m, H, K) for d in distinct]
        gbps = [b / (tt * 1e-3) / 1e9 for b, tt in zip(byts, ms)]
        med, med_bytes, fl = statistics.median(ms), statistics.median(byts), flops(m, K, H, I)
        floor = max(med_bytes / (copy_gbps * 1e9), fl / (tflops_peak * 1e12)) * 1e3
        plan = moe_plan(m, K, "cuda", hidden=H, intermediate=I, layout=experts.layout)
        row = {"routing": routing, "m": m, "path": plan["kernel"], "launches": plan["launches"],
               "distinct_experts_median": statistics.median(distinct), "bytes_median": med_bytes, "ms_median": med,
               "ms_eager_median": statistics.median(t["eager_ms"]) if t["eager_ms"] else None,
               "gb_per_s_median": statistics.median(gbps), "pct_of_copy": 100 * statistics.median(gbps) / copy_gbps,
               "tflops": fl / (med * 1e-3) / 1e12, "floor_ms": floor, "pct_of_floor": 100 * floor / med,
               "ms_per_token": med / m, "timing": "cuda_graph" if t["graph_error"] is None else "eager",
               "graph_error": t["graph_error"]}
        row.update(in_graph_fields("", t, banks, m, routing, gen, max(10, reps // 2), bpe, copy_gbps, checks,
                                   samples))
        samples[f"{routing}/m{m}/ours"] = {"ms": ms, "bytes": byts, "eager_ms": t["eager_ms"]}
        if plan["path"] == "small":   # the four-launch path at the same M, in the same run
            t4 = time_ours(experts, m, routing, gen, reps, eager_reps=0, kernel=FOUR_LAUNCH)
            row["four_launch_ms_median"] = statistics.median(t4["ms"])
            row["four_launch_pct_of_copy"] = pct_of_copy(t4["distinct"], t4["ms"], bpe, m, copy_gbps, K, H)
            row["speedup_vs_four_launch"] = row["four_launch_ms_median"] / med
            samples[f"{routing}/m{m}/four_launch"] = {"ms": t4["ms"], "distinct": t4["distinct"]}
        for pname, (fg, fd) in peers.items():
            pms = _time_peer(fg, fd, t["x"], t["ids_all"], t["w_all"], I, peer_reps if m <= 64 else
                             max(3, peer_reps // 2))
            row[f"{pname}_ms_median"] = statistics.median(pms)
            row[f"speedup_vs_{pname}"] = statistics.median(pms) / med
            samples[f"{routing}/m{m}/{pname}"] = pms
        rows.append(row)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    for routing in ROUTINGS:
        rr = [r for r in rows if r["routing"] == routing]
        pm = plateau_m([r["m"] for r in rr], [r["ms_median"] for r in rr])
        for r in rr:
            r["plateau_m"] = pm

    params = {"num_experts": E, "hidden": H, "intermediate": I, "topk": K, "group_size": 32,
              "m_values": list(m_values), "routings": list(ROUTINGS), "skew_alpha": SKEW_ALPHA, "reps": reps,
              "peer_reps": peer_reps, "bytes_per_expert": bpe, "seed": seed, "dispatch": dispatch_for().record(),
              "small_max_pairs": SMALL_MAX_PAIRS,
              "weights": "random packed int4 (uniform nibbles), scales 0.02*U(0.5,1.5) bf16",
              "timing": "median of CUDA-event timed CUDA-graph replays, fresh routing per repeat; peers and "
                        "speedups on this timing", **IN_GRAPH_PARAMS}
    results = {"copy_gb_per_s": copy_gbps, "bf16_matmul_tflops": tflops_peak, "rows": rows, "checks": checks,
               "all_checks_ok": all(c.get("ok", False) for c in checks), "peer_errors": peer_errors,
               "graph_launch_latency": latency, "tuning": tuning}
    notes = ("Fused W4A16 MoE (workbench/kernels/moe_int4.cu), the path data/dispatch names for each M. Peers: bf16 "
             "weights through a per-expert torch/cuBLAS loop; torch._weight_int4pack_mm per expert; per-expert "
             "dequantise then bf16 matmul; host-side grouping outside the timed region, timed as CUDA-graph replays. "
             "floor_ms = max(bytes / copy bandwidth, flops / bf16 matmul rate), both measured in this run.")
    return write_measurement(name, parameters=params, results=results,
                             samples={"ceilings": {"copy": copy, "matmul": mm}, "timings": samples},
                             notes=notes, out_dir=out_dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.bench.moe", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for NAME.json (default data/measurements/<gpu>)")
    ap.add_argument("--name", default="moe_bandwidth", help="measurement name (default moe_bandwidth)")
    ap.add_argument("--m", type=int, nargs="+", default=list(M_VALUES), help="token counts to sweep (1 to 65535)")
    ap.add_argument("--reps", type=int, default=30, help="timed repeats per row (>= 3)")
    ap.add_argument("--peer-reps", type=int, default=8, help="timed repeats per peer and row (>= 1)")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--no-spans", action="store_true", help="no profiler kernel-span timing of the rows")
    ap.add_argument("--tune-reps", type=int, default=10, help="repeats per four-launch variant and M (0: none)")
    ap.add_argument("--layout-ab", action="store_true",
                    help="only the fragment-against-packed four-launch A/B (moe_layout_ab.json)")
    ap.add_argument("--sanitize", action="store_true",
                    help="only the kernel checks at H = I = 1024, 16 experts (for compute-sanitizer)")
    args = ap.parse_args(argv)
    bad = [m for m in args.m if not 1 <= m <= 65535]
    if bad or args.reps < 3 or args.peer_reps < 1 or args.tune_reps < 0:
        ap.error(f"--m values must lie in [1, 65535] (got {bad}), --reps >= 3 (got {args.reps}), --peer-reps >= 1 "
                 f"(got {args.peer_reps}), --tune-reps >= 0 (got {args.tune_reps})")
    if not torch.cuda.is_available():
        print("the MoE benchmark needs a CUDA GPU; the CPU path is workbench.moe.moe_reference", file=sys.stderr)
        return 2
    if args.layout_ab:
        path = layout_ab(args.out)
        ok = json.loads(Path(path).read_text())["results"]["all_checks_ok"]
        print(f"wrote {path}; every check ok: {ok}")
        return 0 if ok else 1
    if args.sanitize:
        ex = random_int4_experts(16, 1024, 1024, device="cuda", seed=1, layout="fragments")
        res = kernel_checks(ex, torch.Generator().manual_seed(1),
                            packed=random_int4_experts(16, 1024, 1024, device="cuda", seed=1, layout="packed"))
        for r in res:
            print(r)
        ok = all(r["ok"] for r in res)
        print("checks ok" if ok else "checks FAILED")
        return 0 if ok else 1
    path = run_benchmark(args.out, m_values=tuple(args.m), reps=args.reps, peer_reps=args.peer_reps,
                         include_peers=not args.no_peers, spans=not args.no_spans, name=args.name,
                         tune_reps=args.tune_reps)
    doc = json.loads(Path(path).read_text())
    print(f"wrote {path}; every check ok: {doc['results']['all_checks_ok']}")
    return 0 if doc["results"]["all_checks_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
