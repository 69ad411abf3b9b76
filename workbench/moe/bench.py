"""INT4 MoE bandwidth benchmark: ``python -m workbench.moe.bench --out DIR``.

Writes ``DIR/moe_bandwidth.json`` (see :func:`run_benchmark`). On the device
machine ``DIR`` is ``$OUT``; the file is then committed under
``data/measurements/h200/``. ``--sanitize`` instead runs a small parity check
meant to be wrapped in ``compute-sanitizer --tool memcheck``.

Routing: ``uniform`` draws each token's k experts as the top-k of i.i.d.
uniform scores; ``skewed`` draws them without replacement with probability
proportional to 1 / rank^alpha (alpha = 1) over a fresh random ranking of the
experts per draw. Every timed repeat gets fresh routing, so the weights
streamed rotate through all 384 experts (about 9.5 GB of INT4 per layer,
far beyond the 60 MB L2).

Bytes counted per call: packed weights + scales of each distinct expert
touched, hidden in (M x H bf16), out (M x H bf16), topk ids and weights
(int32 + f32). The kernel's own intermediates (h, per-pair y) are recorded
separately and not part of the floor.
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

from workbench.moe.fused import (DEFAULT_SMALL_VARIANT, KERNEL_TABLE, SMALL_MAX_PAIRS, SMALL_PATH, SMALL_TABLE,
                                 SMALL_VARIANT, SMALL_VARIANTS, VARIANTS, forced_small_variant, fused_moe_int4,
                                 kernel_config,
                                 set_kernel_table, set_small_path, set_small_table, set_small_variant, small_grid,
                                 small_variant_for, splitk_splits, table_small_kernel, uses_small_path,
                                 variant_name, work_items)
from workbench.moe.ctasplit import ctasplit_splits
from workbench.moe.packing import Int4Experts, random_int4_experts
from workbench.measure import capture_graphs, time_cuda_queued, time_cuda_spans, time_in_graph
from workbench.moe.reference import moe_reference

M_VALUES = (1, 2, 4, 8, 9, 16, 32, 64, 128, 256, 512, 1024)
ROUTINGS = ("uniform", "skewed")
KIMI = {"num_experts": 384, "hidden": 7168, "intermediate": 2048, "topk": 8}
SKEW_ALPHA = 1.0
REL_TOL = 1e-2


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


# ----------------------------------------------------------------------------- timing helpers

def _events_ms(fn: Callable[[], Any]) -> float:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e)


def _capture(fn: Callable[[], Any]) -> torch.cuda.CUDAGraph:
    return capture_graphs([fn])[0]


# ----------------------------------------------------------------------------- correctness

def _poison_allocator(nbytes_list: list[int]) -> None:
    """Fill cached blocks of these sizes with NaN so unwritten outputs show up."""
    ts = [torch.full((max(1, n // 4),), float("nan"), device="cuda") for n in nbytes_list]
    del ts


def check_case(experts: Int4Experts, m: int, routing: str, gen: torch.Generator, topk: int,
               ids: torch.Tensor | None = None, ref_on_cpu: bool = False) -> dict[str, Any]:
    """One parity check of fused_moe_int4 against the float32 reference on fresh random inputs."""
    h, i, e = experts.hidden, experts.intermediate, experts.num_experts
    if ids is None:
        ids, w = make_routing(m, e, topk, routing, gen)
    else:
        w = torch.rand(ids.shape, generator=gen) + 0.1
    x = torch.randn(m, h, generator=gen).to(torch.bfloat16)
    xd, idsd, wd = x.cuda(), ids.cuda(), w.cuda()
    p = m * topk
    _poison_allocator([p * h * 4, p * i * 2, m * h * 2])
    out = fused_moe_int4(xd, idsd, wd, experts, validate=False)
    torch.cuda.synchronize()
    if ref_on_cpu:
        ref = moe_reference(x, ids, w, experts.to("cpu"))
    else:
        ref = moe_reference(xd, idsd, wd, experts).cpu()
    out = out.cpu()
    err = rel_error(out, ref)
    nan = int((~torch.isfinite(out)).sum())
    counts = torch.bincount(ids.reshape(-1).long(), minlength=e)
    return {"m": m, "routing": routing, "hidden": h, "intermediate": i, "experts": e,
            "kernel_config": list(kernel_config(m)), "path": path_name(m, topk),
            "max_tokens_per_expert": int(counts.max()),
            "rel_err": err, "nonfinite": nan, "ok": bool(nan == 0 and err <= REL_TOL)}


def path_name(m: int, topk: int) -> str:
    """The path ``fused_moe_int4`` takes for M tokens: ``small_fused`` (one launch, version 3),
    ``small_<variant>`` (another one-launch kernel, e.g. ``small_splitk_s4``, ``small_ctasplit``) or the
    four-launch variant's name."""
    v = small_variant_for(m, topk)
    if v is not None:
        return "small_fused" if v == "v3" else f"small_{v}"
    return variant_name(kernel_config(m))


def check_graph_replay(experts: Int4Experts, m: int, gen: torch.Generator, topk: int,
                       replays: int = 3) -> dict[str, Any]:
    """One CUDA graph of fused_moe_int4 replayed with fresh routing each time; every replay checked."""
    e, h = experts.num_experts, experts.hidden
    rts = [make_routing(m, e, topk, "uniform", gen) for _ in range(replays)]
    x = torch.randn(m, h, generator=gen).to(torch.bfloat16).cuda()
    s_ids, s_w = rts[0][0].cuda(), rts[0][1].cuda()
    held: dict[str, torch.Tensor] = {}

    def call() -> None:
        held["out"] = fused_moe_int4(x, s_ids, s_w, experts, validate=False)

    g = _capture(call)
    errs = []
    for ids, w in rts:
        s_ids.copy_(ids)
        s_w.copy_(w)
        g.replay()
        torch.cuda.synchronize()
        ref = moe_reference(x, s_ids, s_w, experts).cpu()
        errs.append(rel_error(held["out"].cpu(), ref))
    del g
    return {"m": m, "routing": "graph-replay", "path": path_name(m, topk), "rel_err": max(errs),
            "ok": all(er <= REL_TOL for er in errs)}


def small_path_edge_checks(small: Int4Experts, gen: torch.Generator, topk: int) -> list[dict[str, Any]]:
    """moe_small_fused edge cases (H = I = 1024, 16 experts): experts with more pairs than one item's
    8 slots (split into several items), one invalid id, every id invalid (whatever SMALL_TABLE says)."""
    saved = list(SMALL_TABLE)
    set_small_table([(SMALL_MAX_PAIRS, True)])
    try:
        return _small_path_edge_checks(small, gen, topk)
    finally:
        set_small_table(saved)


def _small_path_edge_checks(small: Int4Experts, gen: torch.Generator, topk: int) -> list[dict[str, Any]]:
    res = []
    ids = torch.randint(0, 4, (16, topk), generator=gen, dtype=torch.int32)   # 32 pairs per expert: 2 items each
    res.append(check_case(small, 16, "duplicates", gen, topk, ids=ids))
    ids = torch.randint(0, 16, (12, topk), generator=gen, dtype=torch.int32)
    ids[:, :3] = 5                                                              # expert 5: 36 pairs, 3 items
    res.append(check_case(small, 12, "duplicates", gen, topk, ids=ids))
    for path in (True, False):
        saved = SMALL_PATH["enabled"]
        set_small_path(path)
        try:
            bad = torch.randint(0, 16, (5, topk), generator=gen, dtype=torch.int32)
            bad[2, 3] = 99
            xb = torch.randn(5, small.hidden, generator=gen).to(torch.bfloat16).cuda()
            ob = fused_moe_int4(xb, bad.cuda(), torch.full((5, topk), 0.125).cuda(), small, validate=False).cpu()
            ok = bool(torch.isnan(ob[2]).all() and torch.isfinite(ob[[0, 1, 3, 4]]).all())
            res.append({"m": 5, "routing": "invalid-id", "path": path_name(5, topk), "ok": ok,
                        "note": "row 2 must be NaN, others finite"})
        finally:
            set_small_path(saved)
    allbad = torch.full((3, topk), -1, dtype=torch.int32).cuda()
    xb = torch.randn(3, small.hidden, generator=gen).to(torch.bfloat16).cuda()
    ob = fused_moe_int4(xb, allbad, torch.full((3, topk), 0.125).cuda(), small, validate=False).cpu()
    res.append({"m": 3, "routing": "all-invalid", "path": path_name(3, topk), "ok": bool(torch.isnan(ob).all()),
                "note": "every row NaN"})
    return res


def run_sanitize_checks(seed: int = 1, variants=VARIANTS, small_variants=("v3",)) -> list[dict[str, Any]]:
    """Small config for compute-sanitizer: H=1024, I=1024, E=16: each one-launch kernel in ``small_variants``
    (keys of fused.SMALL_VARIANTS; parity at M = 1, 2, 9, its edge cases and a graph replay), then every
    four-launch variant in ``variants``."""
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator().manual_seed(seed)
    ex = random_int4_experts(16, 1024, 1024, device="cuda", seed=seed)
    res = []
    for sv in small_variants:
        with forced_small_variant(sv):   # the one-launch kernel whatever SMALL_TABLE says
            res += [check_case(ex, m, r, gen, topk=8, ref_on_cpu=True)
                    for m, r in ((1, "uniform"), (2, "uniform"), (9, "skewed"))]
            res += small_path_edge_checks(ex, gen, 8)
            res.append(check_graph_replay(ex, 4, gen, 8))
    saved = list(KERNEL_TABLE)
    set_small_path(False)
    try:
        for var in variants:
            set_kernel_table([(1 << 30, var)])
            for m, routing in ((1, "uniform"), (40, "skewed"), (300, "skewed")):
                res.append({**check_case(ex, m, routing, gen, topk=8, ref_on_cpu=True), "variant": list(var)})
    finally:
        set_kernel_table(saved)
        set_small_path(True)
    return res


# ----------------------------------------------------------------------------- the benchmark

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


def kimi_run(seed: int) -> tuple[torch.Generator, Int4Experts, list[Int4Experts], int, dict[str, Any]]:
    """The start of a comparison run at Kimi K2.6 shapes: torch seeded, a routing generator, the experts and the
    in-graph timing's two weight sets (:func:`kimi_banks`), bytes per expert, and the copy bandwidth measured now
    (measure.measure_copy_bandwidth)."""
    from workbench.measure import measure_copy_bandwidth

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    experts, banks = kimi_banks(seed)
    return gen, experts, banks, experts.bytes_per_expert(), measure_copy_bandwidth()


def time_ours(experts: Int4Experts, m: int, routing: str, gen: torch.Generator, reps: int,
              eager_reps: int = 10, topk: int = 8, queued: bool = False, spans: bool = False) -> dict[str, Any]:
    """CUDA-graph replays of fused_moe_int4 with fresh routing per repeat (+ eager calls). ``ms``: one
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
        return fused_moe_int4(x, rot.ids, rot.weights, experts, validate=False)

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
            except Exception as exc:  # noqa: BLE001 - the profiler's failure is recorded, the other timings stand
                span_error = repr(exc)[:300]
        del g
    except Exception as exc:  # noqa: BLE001
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


IN_GRAPH_CALLS = 16   # calls captured back to back in one graph by time_ours_in_graph
IN_GRAPH_CHECK_MAX_M = 16   # its outputs are checked against the reference up to this M


def second_bank(experts: Int4Experts, seed: int) -> Int4Experts:
    """Another random weight set of ``experts``' shapes (fragments packed): the in-graph timing alternates the
    two, as consecutive MoE layers of a model read different weights, so no call finds the previous call's
    weights in L2."""
    bank = random_int4_experts(experts.num_experts, experts.hidden, experts.intermediate, device="cuda", seed=seed)
    bank.fragments()
    return bank


def kimi_banks(seed: int) -> tuple[Int4Experts, list[Int4Experts]]:
    """Random INT4 experts at Kimi K2.6 shapes (fragments packed) and the in-graph timing's two weight sets
    (those experts and :func:`second_bank`)."""
    experts = random_int4_experts(KIMI["num_experts"], KIMI["hidden"], KIMI["intermediate"], device="cuda", seed=seed)
    experts.fragments()
    return experts, [experts, second_bank(experts, seed + 101)]


def in_graph_pct_of_copy(distinct: list[int], ms: float, bpe: int, m: int, copy_gbps: float, topk: int = 8,
                         hidden: int = KIMI["hidden"]) -> float:
    """% of the copy bandwidth of an in-graph per-call time ``ms``: the mean bytes of the graph's calls
    (``distinct`` experts each) over that time."""
    mean_bytes = statistics.mean(bytes_moved(d, bpe, m, hidden, topk) for d in distinct)
    return 100 * mean_bytes / (ms * 1e-3) / 1e9 / copy_gbps


def time_ours_in_graph(banks: list[Int4Experts], m: int, routing: str, gen: torch.Generator, reps: int,
                       calls: int = IN_GRAPH_CALLS, topk: int = 8, gap_cycles: int = 0) -> dict[str, Any]:
    """Device time per call of ``calls`` fused_moe_int4 calls captured back to back in ONE CUDA graph
    (measure.time_in_graph), as the MoE layers of a captured decode step run: call i reads its own fresh
    routing and the weights ``banks[i % len(banks)]``. No host launch latency is inside a sample; each
    call still pays its launch inside the graph and its start on an idle GPU after the previous call's
    tail. For M <= IN_GRAPH_CHECK_MAX_M the first and the last call's outputs of the final replay are
    checked against the float32 reference (``check``). ``gap_cycles`` > 0 puts a sleep kernel of that many SM cycles
    after every call inside the graph (a diagnostic: the calls no longer back to back; subtract
    :func:`time_sleep_in_graph`). ``distinct``: per call, in call order."""
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
            if gap_cycles:
                torch.cuda._sleep(gap_cycles)
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


def time_sleep_in_graph(gap_cycles: int, reps: int, calls: int = IN_GRAPH_CALLS) -> list[float]:
    """Per-call samples (ms) of ``calls`` sleep kernels of ``gap_cycles`` back to back in one graph: what
    :func:`time_ours_in_graph`'s ``gap_cycles`` adds per call."""
    samples, _ = time_in_graph([lambda: torch.cuda._sleep(gap_cycles)], reps, min_calls=calls)
    return samples


IN_GRAPH_PROBE_PREDICTION = (
    "Run 21's probe, written before it ran: in-graph timing was 3-5 us per call faster than queued at M = 1-3 and "
    "20-75 us slower at M = 8-16 (and 3-8 points of copy lower at M >= 32 in the full sweep). Three explanations for "
    "the slower side, told apart in one process at M = 1, 4, 16, 64: (a) the two weight sets double the memory the "
    "sequence touches (TLB reach): then one set back to back is as fast as queued; (b) sustained streaming lowers "
    "the clocks or the DRAM rate: then a sleep between the calls (its own time subtracted) recovers queued's time "
    "with two sets; (c) neither. Predicted: (a), one set within 2% of queued at M = 16 and 64.")


IN_GRAPH_PROBE_2_PREDICTION = (
    "Second process of run 21's probe (written after the first, b66b9c3, before this one), M = 1, 8, 16, 32, 64: "
    "as in the first, one weight set no faster than two at every M; a sleep between calls within 3% of queued's "
    "time at M = 1-16 (the one-launch kernel) and not at M = 32-64 (the four-launch path, in-graph > 5% slower "
    "than queued with or without the sleep).")


def run_in_graph_probe(out_dir: str | Path | None, m_values=(1, 4, 16, 64), reps: int = 10, seed: int = 0,
                       name: str = "moe_in_graph_probe", gap_cycles: int = 400_000,
                       prediction: str | None = None) -> Path:
    """Run 21's diagnostic of the in-graph timing, uniform routing, the dispatched path: per M, one replay and
    queued (``time_ours``), in-graph over two weight sets (the benchmark's), over one set, and over two sets with a
    sleep of ``gap_cycles`` after every call (its sleep time, measured alone in a graph, subtracted). Writes
    ``<name>.json`` with ``prediction`` (default :data:`IN_GRAPH_PROBE_PREDICTION`) as its notes."""
    from workbench.measure import write_measurement

    E, H, I, K = KIMI["num_experts"], KIMI["hidden"], KIMI["intermediate"], KIMI["topk"]
    gen, experts, banks, bpe, copy = kimi_run(seed)
    copy_gbps = copy["gb_per_s"]
    sleep = time_sleep_in_graph(gap_cycles, reps)
    sleep_ms = statistics.median(sleep)
    rows, samples, checks = [], {"sleep_per_call_ms": sleep}, []

    for m in m_values:
        t = time_ours(experts, m, "uniform", gen, 2 * reps, eager_reps=0, queued=True)
        row: dict[str, Any] = {"m": m, "path": path_name(m, K), "ms_median": statistics.median(t["ms"]),
                               "queued_ms_median": statistics.median(t["queued_ms"]),
                               "pct_of_copy": pct_of_copy(t["distinct"], t["ms"], bpe, m, copy_gbps),
                               "queued_pct_of_copy": pct_of_copy(t["queued_distinct"], t["queued_ms"], bpe, m,
                                                                 copy_gbps)}
        samples[f"m{m}/one"] = {"ms": t["ms"], "distinct": t["distinct"]}
        samples[f"m{m}/queued"] = {"ms": t["queued_ms"], "distinct": t["queued_distinct"]}
        for key, bk, gap in (("two_sets", banks, 0), ("one_set", banks[:1], 0), ("two_sets_gap", banks, gap_cycles)):
            ig = time_ours_in_graph(bk, m, "uniform", gen, reps, gap_cycles=gap)
            med = statistics.median(ig["ms"]) - (sleep_ms if gap else 0.0)
            row[f"{key}_ms_median"] = med
            row[f"{key}_pct_of_copy"] = in_graph_pct_of_copy(ig["distinct"], med, bpe, m, copy_gbps, K, H)
            checks.append({**ig["check"], "label": key})
            samples[f"m{m}/{key}"] = {"ms_per_call": ig["ms"], "distinct": ig["distinct"]}
        rows.append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    params = {"num_experts": E, "hidden": H, "intermediate": I, "topk": K, "m_values": list(m_values),
              "routing": "uniform", "reps": reps, "seed": seed, "gap_cycles": gap_cycles,
              "in_graph_calls": IN_GRAPH_CALLS, "small_table": [[u, v] for u, v in SMALL_TABLE]}
    return write_measurement(name, parameters=params,
                             results={"copy_gb_per_s": copy_gbps, "sleep_per_call_ms": sleep_ms, "rows": rows,
                                      "checks": checks, "all_checks_ok": all(c["ok"] for c in checks)},
                             samples={"ceilings": {"copy": copy}, "timings": samples},
                             notes=prediction or IN_GRAPH_PROBE_PREDICTION, out_dir=out_dir)


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


def tune_variants(experts: Int4Experts, gen: torch.Generator, m_values, reps: int = 10,
                  variants=VARIANTS) -> dict[str, Any]:
    """Median ms of each variant at each M (uniform routing); picks the fastest per M."""
    saved = list(KERNEL_TABLE)
    timings: dict[str, dict[int, float]] = {}
    by_name = {variant_name(v): v for v in variants}
    set_small_path(False)   # the four-launch variants at every M
    try:
        for var in variants:
            set_kernel_table([(1 << 30, var)])
            key = variant_name(var)
            timings[key] = {m: statistics.median(time_ours(experts, m, "uniform", gen, reps, eager_reps=0)["ms"])
                            for m in m_values}
    finally:
        set_kernel_table(saved)
        set_small_path(True)
    # the one-launch path at each M with the kernel SMALL_TABLE names there (the default kernel where the
    # table runs four launches)
    small_ms: dict[int, float] = {}
    small_kernel = {m: table_small_kernel(m) or DEFAULT_SMALL_VARIANT for m in m_values
                    if 0 < m * KIMI["topk"] <= SMALL_MAX_PAIRS}
    saved_small = list(SMALL_TABLE)
    try:
        for m, kern in small_kernel.items():
            set_small_table([(SMALL_MAX_PAIRS, kern)])
            small_ms[m] = statistics.median(time_ours(experts, m, "uniform", gen, reps, eager_reps=0)["ms"])
    finally:
        set_small_table(saved_small)
    best = []
    for m in sorted(m_values):
        k = min(timings, key=lambda kk: timings[kk][m])
        best.append((m, by_name[k]))
    small_use = [(m, small_kernel[m] if small_ms[m] < timings[min(timings, key=lambda kk: timings[kk][m])][m]
                  else None) for m in sorted(small_ms)]
    small_table = [((small_use[idx + 1][0] - 1) if idx + 1 < len(small_use) else SMALL_MAX_PAIRS, use)
                   for idx, (m, use) in enumerate(small_use)]
    # table: each swept M up to the next swept M uses the variant measured best at that M
    table = []
    for idx, (m, var) in enumerate(best):
        upper = best[idx + 1][0] - 1 if idx + 1 < len(best) else 1 << 30
        table.append((upper, var))
    return {"ms": {k: {str(m): v for m, v in d.items()} for k, d in timings.items()},
            "best": [[m, list(v)] for m, v in best], "table": [[u, list(v)] for u, v in table],
            "small_fused_ms": {str(m): v for m, v in small_ms.items()},
            "small_kernel": {str(m): v for m, v in small_kernel.items()},
            "small_table": [[u, use] for u, use in small_table]}


SMALL_PATH_PREDICTION = (
    "Small-M kernel (moe_small_fused, M * topk <= 128): one persistent launch instead of four, weights in "
    "a fragment layout (576-byte blocks per 16 rows x 64 K, step-major; 1 shift + 1 LOP3 + 1 bf16x2 sub per "
    "two weights, group scale on fp32 partial sums). Its first version (commit 19fba40: tile-major blocks, "
    "-136 subtracted by a second mma) was predicted at ~82% of copy at M = 1 and ~86% at M = 16 and "
    "measured 29-30% and 53-54% (four-launch kernels 53% and 70-74% in that run): slower everywhere. "
    "Prediction for this version (step-major blocks so the warps on one expert sweep adjacent memory, "
    "half the dependent mma chain, relaxed polling): back to at least the four-launch kernels' ~70-75% at "
    "M >= 8 and above them at M <= 4; 80% not assured. SMALL_TABLE takes the faster path per M from the "
    "tuning in this run, so each row's ms_median is the better of the two.")


def small_path_outcome(rows: list[dict[str, Any]]) -> str:
    """One sentence: measured % of copy of the small-M kernel against the four-launch path, per M."""
    parts = [f"{r['routing']} M={r['m']}: {r['small_fused_pct_of_copy']:.0f}% "
             f"({r['four_launch_pct_of_copy']:.0f}%)" for r in rows if "small_fused_pct_of_copy" in r]
    return ("Measured, % of copy of the one-launch kernel (four-launch kernels in brackets): " + "; ".join(parts)
            + "; each row's ms_median is the path SMALL_TABLE dispatches (the faster one at tuning)."
            if parts else "")


def run_benchmark(out_dir: str | Path, m_values=M_VALUES, reps: int = 30, peer_reps: int = 8,
                  seed: int = 0, include_peers: bool = True, tune_reps: int = 10, measurement: str = "moe_bandwidth",
                  spans: bool = True) -> Path:
    """Checks, ceilings, variant tuning, then the sweep over ``m_values`` x routings; returns the JSON path
    (``measurement``.json: moe_bandwidth, or another name for a repeat of the sweep kept beside it). ``spans``: every
    row also timed by the CUDA profiler's kernel records (``span_*``), and the host's graph launch latency measured
    once (results ``graph_launch_latency``)."""
    from workbench.measure import (graph_launch_latency, measure_bf16_matmul_tflops, measure_copy_bandwidth,
                                   write_measurement)

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    E, H, I, K = KIMI["num_experts"], KIMI["hidden"], KIMI["intermediate"], KIMI["topk"]
    log = print
    experts = random_int4_experts(E, H, I, device="cuda", seed=seed)
    bpe = experts.bytes_per_expert()
    log(f"experts: {E} x {bpe / 1e6:.2f} MB = {E * bpe / 1e9:.2f} GB INT4 (+scales)")

    # ---- correctness at Kimi shapes and at a small shape with hot experts
    checks = []
    for m in (1, 2, 9, 16, 17, 33, 128, 256, 1024):
        checks.append(check_case(experts, m, "uniform", gen, K))
    for m in (4, 16, 256, 1024):
        checks.append(check_case(experts, m, "skewed", gen, K))
    small = random_int4_experts(16, 1024, 1024, device="cuda", seed=seed + 1)
    for m in (1, 7, 40, 300):
        checks.append(check_case(small, m, "skewed", gen, K))
    for m in (1, 4, 8, 16):   # the small-M kernel on skewed routing at Kimi shapes, and graph replays
        checks.append(check_case(experts, m, "skewed", gen, K))
    checks += small_path_edge_checks(small, gen, K)
    checks.append(check_graph_replay(experts, 4, gen, K))
    checks.append(check_graph_replay(experts, 16, gen, K))
    saved = list(KERNEL_TABLE)
    set_small_path(False)   # the four-launch variants, also at the M the small kernel would take
    for var in VARIANTS:  # every compiled variant, whatever M would pick it
        set_kernel_table([(1 << 30, var)])
        for ex_, m, routing in ((small, 7, "skewed"), (small, 300, "skewed"), (experts, 9, "uniform")):
            checks.append({**check_case(ex_, m, routing, gen, K), "variant": list(var)})
    set_kernel_table(saved)
    set_small_path(True)
    dup = torch.randint(0, 16, (37, K), generator=gen, dtype=torch.int32)  # repeated experts per token
    checks.append(check_case(small, 37, "duplicates", gen, K, ids=dup))
    # out-of-range id -> NaN row for that token only
    bad = torch.randint(0, 16, (5, K), generator=gen, dtype=torch.int32)
    bad[2, 3] = 99
    xb = torch.randn(5, 1024, generator=gen).to(torch.bfloat16).cuda()
    ob = fused_moe_int4(xb, bad.cuda(), torch.full((5, K), 0.125).cuda(), small, validate=False).cpu()
    bad_ok = bool(torch.isnan(ob[2]).all() and torch.isfinite(ob[[0, 1, 3, 4]]).all())
    checks.append({"m": 5, "routing": "invalid-id", "ok": bad_ok, "note": "row 2 must be NaN, others finite"})
    del small
    for c in checks:
        log("check " + " ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in c.items()))

    # ---- ceilings in the same run
    copy = measure_copy_bandwidth()
    mm = measure_bf16_matmul_tflops()
    copy_gbps, tflops_peak = copy["gb_per_s"], mm["tflops"]
    log(f"copy {copy_gbps:.0f} GB/s, bf16 matmul {tflops_peak:.0f} TFLOP/s")
    latency = graph_launch_latency() if spans else None   # the host's share of a one-replay sample, this machine
    if latency is not None:
        log(f"graph launch latency {1e3 * latency['latency_ms']:.2f} us (one replay "
            f"{1e3 * latency['one_replay_ms_median']:.2f}, queued {1e3 * latency['queued_ms_median']:.2f})")

    banks = [experts, second_bank(experts, seed + 101)]   # the in-graph timing alternates two weight sets

    # ---- peers' weights
    peers: dict[str, Any] = {}
    peer_errors: dict[str, str] = {}
    if include_peers:
        try:
            gu_bf16 = torch.empty(E, 2 * I, H, dtype=torch.bfloat16, device="cuda")
            dn_bf16 = torch.empty(E, H, I, dtype=torch.bfloat16, device="cuda")
            for e in range(E):
                gu_bf16[e] = dequantize_gpu(experts.gate_up_packed[e], experts.gate_up_scale[e])
                dn_bf16[e] = dequantize_gpu(experts.down_packed[e], experts.down_scale[e])
            peers["bf16_cublas"] = (lambda e, x: x @ gu_bf16[e].T, lambda e, h: h @ dn_bf16[e].T)
        except Exception as err:  # noqa: BLE001 - record and go on
            peer_errors["bf16_cublas"] = repr(err)
        try:
            tg = [to_tinygemm(experts.gate_up_packed[e], experts.gate_up_scale[e]) for e in range(E)]
            td = [to_tinygemm(experts.down_packed[e], experts.down_scale[e]) for e in range(E)]
            peers["torch_int4pack"] = (lambda e, x: torch._weight_int4pack_mm(x, tg[e][0], 32, tg[e][1]),
                                       lambda e, h: torch._weight_int4pack_mm(h.to(torch.bfloat16), td[e][0], 32,
                                                                              td[e][1]))
        except Exception as err:  # noqa: BLE001
            peer_errors["torch_int4pack"] = repr(err)
        peers["dequant_matmul"] = (
            lambda e, x: x @ dequantize_gpu(experts.gate_up_packed[e], experts.gate_up_scale[e]).T,
            lambda e, h: h @ dequantize_gpu(experts.down_packed[e], experts.down_scale[e]).T)
        # peers' own parity at M = 4
        ids4, w4 = make_routing(4, E, K, "uniform", gen)
        x4 = torch.randn(4, H, generator=gen).to(torch.bfloat16).cuda()
        ref4 = moe_reference(x4, ids4.cuda(), w4.cuda(), experts).cpu()
        groups4 = group_pairs(ids4.cuda(), w4.cuda())
        for name, (fg, fd) in list(peers.items()):
            try:
                err = rel_error(peer_moe(x4, groups4, fg, fd, I).cpu(), ref4)
                checks.append({"m": 4, "routing": "uniform", "peer": name, "rel_err": err, "ok": err <= REL_TOL})
                log(f"peer {name} rel_err {err:.2e}")
            except Exception as exc:  # noqa: BLE001
                peer_errors[name] = repr(exc)
                del peers[name]

    # ---- variant tuning (uniform routing), then the sweep with the tuned table
    good = [v for v in VARIANTS if all(c["ok"] for c in checks if c.get("variant") == list(v))]
    tuning = tune_variants(experts, gen, m_values, reps=tune_reps, variants=good) if tune_reps > 0 else None
    if tuning is not None:
        tuning["variants_failing_checks"] = [list(v) for v in VARIANTS if v not in good]
    if tuning is not None:
        set_kernel_table([(u, tuple(v)) for u, v in tuning["table"]])
        if tuning["small_table"]:
            set_small_table([(u, use) for u, use in tuning["small_table"]])
        log(f"tuned table {tuning['table']}, small-M kernel {tuning['small_table']}")
        for m in (1, 9, 64, 256, 1024):  # parity again with the tuned table
            checks.append({**check_case(experts, m, "uniform", gen, K), "table": "tuned"})

    rows = []
    samples: dict[str, Any] = {}
    sweep_error = None
    for routing, m in itertools.product(ROUTINGS, m_values):
      try:
        t = time_ours(experts, m, routing, gen, reps, queued=True, spans=spans)
        ms, distinct, eager = t["ms"], t["distinct"], t["eager_ms"]
        x, ids_all, w_all = t["x"], t["ids_all"], t["w_all"]
        byts = [bytes_moved(d, bpe, m, H, K) for d in distinct]
        gbps = [b / (tt * 1e-3) / 1e9 for b, tt in zip(byts, ms)]
        fl = flops(m, K, H, I)
        med = statistics.median(ms)
        med_bytes = statistics.median(byts)
        floor = max(med_bytes / (copy_gbps * 1e9), fl / (tflops_peak * 1e12)) * 1e3
        row = {"routing": routing, "m": m, "path": path_name(m, K), "kernel_config": list(kernel_config(m)),
               "distinct_experts_median": statistics.median(distinct),
               "bytes_median": med_bytes, "ms_median": med,
               "ms_eager_median": statistics.median(eager) if eager else None,
               "gb_per_s_median": statistics.median(gbps), "pct_of_copy": 100 * statistics.median(gbps) / copy_gbps,
               "tflops": fl / (med * 1e-3) / 1e12, "floor_ms": floor, "pct_of_floor": 100 * floor / med,
               "ms_per_token": med / m, "timing": "cuda_graph" if t["graph_error"] is None else "eager",
               "graph_error": t["graph_error"],
               "intermediate_bytes": 2 * m * K * (I * 2 + H * 4)}
        row.update(in_graph_fields("", t, banks, m, routing, gen, max(10, reps // 2), bpe, copy_gbps, checks,
                                   samples))
        samples[f"{routing}/m{m}/ours"] = {"ms": ms, "bytes": byts, "eager_ms": eager}
        if m * K <= SMALL_MAX_PAIRS:   # both paths in the same run: the four-launch kernels (before) and
            small_now = uses_small_path(m, K)   # the one-launch kernel (after); ms_median is the dispatched one
            saved_small = list(SMALL_TABLE)
            set_small_table([(SMALL_MAX_PAIRS, not small_now)])
            try:
                t2 = time_ours(experts, m, routing, gen, reps, eager_reps=0)
            finally:
                set_small_table(saved_small)
            gb2 = [bytes_moved(d, bpe, m, H, K) / (tt * 1e-3) / 1e9 for d, tt in zip(t2["distinct"], t2["ms"])]
            ms4, pct4 = (statistics.median(t2["ms"]), 100 * statistics.median(gb2) / copy_gbps) if small_now else \
                (med, row["pct_of_copy"])
            ms1, pct1 = (med, row["pct_of_copy"]) if small_now else \
                (statistics.median(t2["ms"]), 100 * statistics.median(gb2) / copy_gbps)
            row["four_launch_variant"] = variant_name(kernel_config(m))
            row["four_launch_ms_median"], row["four_launch_pct_of_copy"] = ms4, pct4
            row["small_fused_ms_median"], row["small_fused_pct_of_copy"] = ms1, pct1
            row["speedup_vs_four_launch"] = ms4 / med
            samples[f"{routing}/m{m}/{'four_launch' if small_now else 'small_fused'}"] = {
                "ms": t2["ms"], "distinct": t2["distinct"]}
            del t2
        # peers: fresh routing per repeat, host-side grouping outside the timed region, one graph per routing
        for name, (fg, fd) in peers.items():
            pr = peer_reps if m <= 64 else max(3, peer_reps // 2)
            pms = []
            try:
                for r in range(pr):
                    j = (r * 7 + 1) % ids_all.shape[0]
                    groups = group_pairs(ids_all[j], w_all[j])
                    gp = _capture(lambda: peer_moe(x, groups, fg, fd, I))
                    gp.replay()
                    pms.append(_events_ms(gp.replay))
                    del gp
                row[f"{name}_ms_median"] = statistics.median(pms)
                row[f"speedup_vs_{name}"] = statistics.median(pms) / med
                samples[f"{routing}/m{m}/{name}"] = pms
            except Exception as exc:  # noqa: BLE001
                row[f"{name}_error"] = repr(exc)[:300]
        rows.append(row)
        log(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
                        if k not in ("graph_error",)}))
        del t, x, ids_all, w_all
      except Exception as exc:  # noqa: BLE001 - keep what was measured
        sweep_error = f"{routing} M={m}: {exc!r}"[:500]
        log(f"sweep stopped: {sweep_error}")
        break
    for routing in ROUTINGS:
        rr = [r for r in rows if r["routing"] == routing]
        pm = plateau_m([r["m"] for r in rr], [r["ms_median"] for r in rr])
        for r in rr:
            r["plateau_m"] = pm

    params = {"num_experts": E, "hidden": H, "intermediate": I, "topk": K, "group_size": 32,
              "m_values": list(m_values), "routings": list(ROUTINGS), "skew_alpha": SKEW_ALPHA,
              "reps": reps, "peer_reps": peer_reps, "tune_reps": tune_reps, "bytes_per_expert": bpe, "seed": seed,
              "kernel_table": [[u, list(v)] for u, v in KERNEL_TABLE],
              "small_path_max_pairs": SMALL_MAX_PAIRS, "small_path_grid_ctas": small_grid(),
              "small_table": [[u, use] for u, use in SMALL_TABLE],
              "weights": "random packed int4 (uniform nibbles), scales 0.02*U(0.5,1.5) bf16",
              "timing": "median of CUDA-event timed CUDA-graph replays, fresh routing per repeat; peers and "
                        "speedups on this timing", **IN_GRAPH_PARAMS}
    results = {"copy_gb_per_s": copy_gbps, "bf16_matmul_tflops": tflops_peak, "rows": rows, "tuning": tuning,
               "checks": checks, "all_checks_ok": all(c.get("ok", False) for c in checks),
               "peer_errors": peer_errors, "sweep_error": sweep_error, "graph_launch_latency": latency}
    notes = ("Fused W4A16 MoE (workbench/kernels/moe_int4.cu, mma.sync bf16 tensor cores, compressed-tensors "
             "int4 layout). Peers: bf16 weights through a per-expert torch/cuBLAS loop; torch._weight_int4pack_mm "
             "per expert; per-expert dequantise (torch ops) then bf16 matmul. Peers get host-side grouping "
             "outside the timed region and are timed as CUDA-graph replays. floor_ms = max(bytes / copy "
             "bandwidth, flops / bf16 matmul rate), both measured in this run. " + SMALL_PATH_PREDICTION
             + " " + small_path_outcome(rows) + " " + IN_GRAPH_PREDICTION)
    return write_measurement(measurement, parameters=params, results=results,
                             samples={"ceilings": {"copy": copy, "matmul": mm}, "timings": samples},
                             notes=notes, out_dir=out_dir)


COPY_PROBE_PREDICTION = (
    "Run 34's copy probe, written before it ran: the copy ceiling every % of copy divides by is one 2 GiB copy "
    "between two events, host launch latency inside (~1 ms a sample). Predicted: queued and the profiler's span give "
    "0.5-1.5% more GB/s than the event pair (10-13 us of latency in ~1 ms); so the % of copy of the span rows would "
    "fall by as much if the ceiling were timed the span's way.")


def run_copy_probe(out_dir: str | Path | None, rounds: int = 3, name: str = "moe_copy_probe",
                   prediction: str | None = None) -> Path:
    """``rounds`` rounds of measure.copy_timing_probe and measure.graph_launch_latency; one row per round (GB/s three
    ways, latency us), raw samples kept; written as ``name``.json."""
    from workbench.measure import copy_timing_probe, graph_launch_latency, write_measurement

    rows, samples = [], []
    for i in range(rounds):
        c, lat = copy_timing_probe(), graph_launch_latency()
        rows.append({"round": i, **{f"copy_{k}_gb_per_s": c[f"{k}_gb_per_s"] for k in ("one", "queued", "span")},
                     "span_over_one": c["span_gb_per_s"] / c["one_gb_per_s"],
                     "queued_over_one": c["queued_gb_per_s"] / c["one_gb_per_s"],
                     "launch_latency_us": 1e3 * lat["latency_ms"],
                     "raw_launch_latency_us": 1e3 * lat["raw_latency_ms"] if "raw_latency_ms" in lat else None})
        samples.append({"copy": c, "launch": lat})
    return write_measurement(name, parameters={"rounds": rounds, "copy_bytes": 2 << 30, "samples_per_timing": 20},
                             results={"rows": rows}, samples=samples,
                             notes=prediction or COPY_PROBE_PREDICTION, out_dir=out_dir)


SMALL_COMPARE_M = (1, 2, 4, 8, 9, 16)
SMALL_V3_PREDICTION = (
    "Version 3 of the one-launch kernel (moe_small_fused): one warp iteration moves one 16-row tile x 256 K "
    "(4096 weights, 2304 contiguous bytes, stage-major fragment layout) with one cp.async wait and one warp "
    "barrier, 3-stage ring (2 stages = 4.6 KB in flight per warp); nibble extraction as one LOP3 (ptxas had "
    "split it into AND + OR); 80 registers, no spills, 6 CTAs = 24 warps per SM (was 121 registers, 16 "
    "warps); items of <= 8 slots. SASS of the gate_up loop (nvdisasm, CPU): 321 instructions per 2304 "
    "bytes = 0.139 per byte, against 0.234 for version 2 (270 per 1152 bytes) and 0.173 for the four-launch "
    "nt1_rt2_l2 gate_up loop (797 per 4608 bytes). Run 4 gave % of copy x instructions per byte ~ 12.9 "
    "for both older kernels at M = 16 (55% x 0.234, 74% x 0.173: issue-bound), so 12.9 / 0.139 ~ 92% if "
    "still issue-bound; memory-bound before that. Predicted before the run: M = 16 uniform ~0.74 ms "
    "(~85% of copy), M = 1 ~0.066 ms (~70%: launch, prologue, the gate_up -> down dependency and a "
    "second, partial round of down tasks); faster than the four-launch path at every M; >= 80% from "
    "M ~ 8 on, not at M = 1-4.")


SMALL_SPLITK_PREDICTION = (
    "Split-K form of the one-launch kernel (moe_small_splitk_s3 / _s4, code in workbench/kernels/moe_int4.cu; "
    "NOT dispatched): a task is (item, K part, tile); the K range of a tile is cut into s parts (s in 1, 2, 4), "
    "chosen on the device per phase as the smallest s with items x tiles x s >= 2 x resident warps (Kimi: "
    "M = 1 -> gate_up 4, down 2; M = 2 -> 2, 1; M >= 4 -> 1, 1, i.e. version 3's work split); gate_up "
    "partials are summed by the part that arrives last (fixed part order, then SiLU), down partials are "
    "summed with the k sum by the tile's last warp. s3: 3-stage ring, 80 registers, 6 CTAs/SM, as version 3; "
    "s4: 4-stage ring (3 stages = 6.9 KB in flight per warp), 96 registers, 5 CTAs/SM; s3_max: always "
    "s = 4 in both phases (a control). SASS (cuobjdump, CPU): the stage loops are version 3's (gate_up 321 "
    "instructions per 2304 bytes, down 316); shorter tasks add per-task code (estimated, ~300-450 "
    "instructions executed per task outside the stage loop: ~0.164 instructions per byte for a 7-stage gate_up task "
    "against 0.145 for version 3's 28-stage task, ~0.18 for a 4-stage down task against 0.159). Hypothesis under test "
    "(not profiled): at M = 1-2 version 3 is bound by each warp's chain of 28 dependent ring stages with "
    "fewer tasks than warps (2048 gate_up tasks for 3168 warps at M = 1), not by bandwidth. Predicted before "
    "any run, from run 5 (same shapes): version 3 streams at a marginal ~3.4 TB/s (M 4 -> 16) and spends "
    "~52 us above that at M = 1-2 and ~22 us at M >= 4; the four-launch path spends ~28 / 31 us above its own "
    "marginal rate at M = 1 / 2, of which ~9 us are launch gaps a single launch avoids. So splitk_s3: "
    "M = 1 ~0.077 ms (~62% of copy; range 0.070-0.085), M = 2 ~0.139 ms (~69%; 0.125-0.150), faster than "
    "both version 3 and the four-launch path at M = 1-2; M = 4, 8, 9, 16 (s = 1) within 3% of version 3 "
    "(M = 16 uniform ~0.82 ms, ~80%). splitk_s4: at M = 1-2 within 5% of s3 (better if the chain's latency "
    "still dominates), at M >= 4 1-5% slower than s3 (20 instead of 24 warps per SM). splitk_s3_max: at "
    "M = 1 within 5% of s3, at M >= 4 5-10% slower than version 3 (more per-task code per byte). The goal "
    "(>= 80% of copy at every M <= 16) is NOT expected at M = 1-2 even if this holds: at M = 1, 80% leaves "
    "~2 us over streaming at 3.4 TB/s. If splitk_s3 is not faster than the four-launch path at M = 1, the "
    "chain hypothesis is refuted: profile version 3 at M = 1 (ncu) before building more.")
SMALL_CTASPLIT_PREDICTION = (
    "PREDICTION, written before any run (code NOT YET RUN ON A GPU). CTA-split form of the one-launch kernel "
    "(moe_small_ctasplit, workbench/kernels/moe_int4.cu, host side workbench/moe/ctasplit.py; a variant, NOT "
    "dispatched): a task is a CTA's (phase, item, group of 4/s tiles); its 4 warps take the tiles' K parts "
    "(Kimi: gate_up s = 4, one tile per task, 7 stages per warp; down s = 2, two tiles, 4 stages per warp), "
    "the partial sums are added in shared memory after one block barrier by a rotating epilogue warp, which "
    "alone fences and counts (done_gu / done_dn): no L2 partial sums, no reduction counters, one fence per CTA "
    "task instead of one per warp task; thread 0 grabs tasks one ahead (queue in shared memory, published by "
    "the task's barrier), so each warp's 4-stage ring (3 in flight, as splitk_s4) runs on into the next task "
    "and never drains until the end. SASS (nvcc 13.0 sm_90, cuobjdump): 96 registers, 0 spills, 44096 B static "
    "shared (5 CTAs per SM, as splitk_s4); stage loop 312 instructions per 2304-byte stage on the path taken "
    "(436 with the issuer's once-per-task switch block) against splitk_s4's 320 (gate_up) / 316 (down). "
    "Evidence it rests on (Nsight Compute, moe_small_ncu_m1_b8e1a33.txt): splitk_s4 at M = 1 is 88-90 us, "
    "46-47% DRAM, 0.43 issues per scheduler-cycle, stalls long scoreboard 3.8 + membar 2.1-2.3 + wait 1.3 "
    "cycles per issue, ~6 ring restarts, drains and fences per warp; at M >= 4 (28-stage tasks, few "
    "restarts) the same stage loop reaches 79-86% of copy. Predicted, same process, % of copy: M = 1 "
    "0.061-0.068 ms (69-77%; 198 MB at the M >= 4 streaming rate ~3.5 TB/s is ~57 us, plus ~6-10 us of launch, "
    "prologue, first DRAM round trip, the down tail and the last combines), i.e. 1.3-1.5x faster than "
    "splitk_s4 and the four-launch path; M = 2 ~0.115-0.125 ms (75-82%, ~7-17% faster than splitk_s4); "
    "M = 4 0-8% faster than splitk_s4; M = 8-16 from 6% slower to 4% faster than splitk_s4 (four barriers per "
    "28 gate_up stages instead of none; a continuous ring instead of a restart per 28 stages). ctasplit_max "
    "(down split 4 as well: 2 stages per warp, the queue 2 tasks ahead): M = 1-2 within +-5% of ctasplit, "
    "M >= 4 0-5% slower than ctasplit. Risk: 44096 B of static shared memory per CTA (splitk_s4: 39968; run 10's "
    "slower splitk_s4g had 44 KB too): 5 x (44096 + 1024 reserved) B fit in 228 KB, so 5 CTAs per SM are "
    "expected; the ncu Occupancy section of the same call checks it. The goal (>= 80% at every "
    "M <= 16) is NOT expected at M = 1. Refuted if ctasplit at M = 1 is not faster than the four-launch path; "
    "then the ncu profile of ctasplit at M = 1 in the same device call says whether the block barrier (stall "
    "'barrier'), the fences (membar) or the activation loads (long scoreboard) took the place of the ring "
    "restarts.")
SMALL_CTASPLIT_SB_PREDICTION = (
    "PREDICTION, written before any run (code NOT YET RUN ON A GPU). Split-barrier form of the CTA-split kernel "
    "(moe_small_ctasplit_sb): no block barrier in the task loop; the three non-epilogue warps bar.arrive a "
    "named FULL barrier per partial-sum buffer and stream on, the epilogue warp of task j does its epilogue one "
    "task later (after its part of task j + 1; earlier if it must wait for an item's h), freeing the buffer "
    "through a FREE named barrier before its fence; queue entries carry sequence numbers. Evidence "
    "(moe_ctasplit_trace.json, code febc44b, -DMOE_TRACE build): at M = 1-4 the last warp to reach a task's "
    "barrier is the previous task's epilogue warp in 95-100% of tasks, the warps arrive 2.5-3.1 us apart, "
    "and the epilogue takes 2.5-3.1 us (fence 1.3-2.0 us) against tasks of ~11 us (gate_up) / ~7.4 us (down): "
    "every task's critical path carries one epilogue. With the split, each warp carries one epilogue per "
    "four tasks. Predicted, same process, % of copy: M = 1 0.062-0.070 ms (68-76%; ctasplit ~0.079), "
    "1.1-1.25x over ctasplit; M = 2 1.1-1.25x over ctasplit, i.e. at or above splitk_s4 (72-80%); M >= 4 "
    "within 5% of splitk_s4 (ctasplit was 9-15% slower), the stage loop's DRAM rate bounding M >= 8. The goal "
    "(>= 80% at every M <= 16) is still not expected at M = 1. Refuted if ctasplit_sb is not faster than "
    "ctasplit at M = 1; a hang or a wrong result means a barrier generation or a queue entry raced "
    "(compute-sanitizer synccheck and racecheck run on it in the same call).")
SMALL_XPREFETCH_PREDICTION = (
    "PREDICTION, written before any run (code NOT YET RUN ON A GPU). The activations loaded further ahead of "
    "the HMMAs that consume them: splitk_s4x3 / splitk_s4x4 (3 / 4 steps of 64 K ahead instead of 2, still 96 "
    "registers, 0 spills, 5 CTAs per SM), splitk_s4x4_b4 and the control splitk_s4x2_b4 (4 CTAs per SM, 124-128 "
    "registers), ctasplit_x4 (the M = 1 kernel, 4 steps ahead, 96 registers). Evidence: Nsight Compute per SASS "
    "instruction of splitk_s4 at M = 16 (moe_small_ncu_m16_sass_f73ff6b.csv): ~26% of the warp-stall samples sit "
    "on two HMMAs waiting (long scoreboard) for the activation fragment loaded two steps earlier. Predicted, same "
    "process: splitk_s4x4 3-10% faster than splitk_s4 at M = 2-16 (M = 16 bounded by DRAM near 88-90% of copy), "
    "splitk_s4x3 between the two; ctasplit_x4 3-10% faster than ctasplit at M = 1; splitk_s4x2_b4 5-15% slower "
    "than splitk_s4 (fewer warps, same prefetch) and splitk_s4x4_b4 between it and splitk_s4x4. Refuted if "
    "splitk_s4x4 is not faster than splitk_s4 at M >= 4.")
SMALL_CTASPLIT_X4_SPLITS_PREDICTION = (
    "PREDICTION, written before any run (host-side variants of a kernel already run on the H200). ctasplit_x4 "
    "(the CTA-split kernel with the activations 4 steps ahead) at the fixed splits that were the CTA-split "
    "kernel's best in the split sweep (moe_small_ctasplit_splits.json, XD 2): (2, 1) at M = 2 (69.8 / 67.2% of "
    "copy uniform / skewed, against the rule's (4, 2) 64.2 / 64.1) and (1, 1) at M >= 4 (77.6-84.7 / 74.7-79.4). "
    "Run 13 measured +7-8% for XD 4 over XD 2 at M = 1 (moe_small_xprefetch*.json). Predicted, same process: "
    "ctasplit_x4_g2d1 at M = 2 3-8% faster than ctasplit_g2d1 would be, i.e. 71-75% of copy, at or above "
    "splitk_s4 (~69%); ctasplit_x4_g1d1 at M = 4-16 within 2% of splitk_s4x4 (its barrier per 28-stage task "
    "costs little there). Refuted for M = 2 if ctasplit_x4_g2d1 is not faster than splitk_s4 there.")
SMALL_X4_B4_PREDICTION = (
    "PREDICTION, written before any run (code change, reverted after the run: one kernel entry, "
    "moe_small_ctasplit_x4_b4, the x4 CTA-split "
    "kernel at __launch_bounds__(128, 4), 122 registers, 0 spills; every other kernel's SASS unchanged). Evidence "
    "(moe_profile_8c7598f, SASS): at 96 registers the x4 kernels issue a stage's 8 activation loads at its end and "
    "wait on them in register moves (ctasplit_x4 M = 1: 8.5% of stall samples on two MOVs, 3.4% on the first HMMA; "
    "ctasplit_x4_g1d1 M = 16: 15.5% on the MOVs); at 128 registers the loads sit before the stage's first HMMA, a "
    "full stage ahead, at the price of 32 register moves per stage and 16 instead of 20 warps per SM. The split-K "
    "analogue (splitk_s4x4_b4 against splitk_s4x4, moe_small_xprefetch.json) was +1.4-2.7 points of copy at M = "
    "1-2 and -0.4 to -2.2 at M >= 4. Predicted, same process: ctasplit_x4_b4 at M = 1 0-5% faster than ctasplit_x4 "
    "(61-63% -> 62-66% of copy); ctasplit_x4_b4_g1d1 at M = 8-16 0-4% slower than ctasplit_x4_g1d1. Refuted at M = 1 "
    "if ctasplit_x4_b4 is slower than ctasplit_x4 in either routing.")
SMALL_XEND_PREDICTION = (
    "PREDICTION, written before any run (code: template flag XEND in frag_gemm / cs_stages, new entries "
    "moe_small_splitk_s4x4e_b5 and moe_small_ctasplit_x4e, 96 registers, 0 spills; every other kernel's SASS "
    "unchanged). The x4 kernels' source refills each step's activations right after use; at 96 registers ptxas "
    "sinks those loads to the stage's end and rotates the buffers with moves that wait for them (nvcc SASS: 24 moves "
    "in splitk_s4x4's stage loop, 30 in ctasplit_x4's; profile moe_profile_8c7598f: 8.5% of ctasplit_x4's stall "
    "samples at M = 1 and 15.5% of ctasplit_x4_g1d1's at M = 16 on such moves). XEND loads the next stage's "
    "activations after the last step into the same registers: no moves (stage loops 345 -> 320 and 467 -> 437 "
    "instructions), the first step's activations issued ~50 instructions before their HMMA. Predicted, same "
    "process: ctasplit_x4e 0-5% faster than ctasplit_x4 at M = 1; ctasplit_x4e_g1d1 2-6% faster than "
    "ctasplit_x4_g1d1 at M = 8-16; splitk_s4x4e 0-4% faster than splitk_s4x4 at M = 2-4. Refuted if ctasplit_x4e "
    "is not faster than ctasplit_x4 at M = 1 and ctasplit_x4e_g1d1 not faster than ctasplit_x4_g1d1 at M = 16 "
    "in both runs.")
SMALL_XEND_SPLITS_PREDICTION = (
    "PREDICTION, written before any run (host-side variants of ctasplit_x4e, a kernel already run on the H200, at "
    "fixed (gate_up, down) splits; M = 1-4, M = 3 measured for the first time). From the CTA-split kernel's split "
    "sweep (moe_small_ctasplit_splits.json, XD 2): at M = 1 (4, 1) tied the rule's (4, 2) and (2, x) lost 8-18%; at "
    "M = 2 (2, 1) tied splitk_s4; at M >= 4 (1, 1) came within a few percent of splitk_s4. Predicted, same process: "
    "at M = 1 ctasplit_x4e_g4d1 within +-2% of ctasplit_x4e (the rule, (4, 2)), g2d1 / g2d2 5-15% slower; at M = 2 "
    "ctasplit_x4e_g2d1 within +-3% of ctasplit_x4e; at M = 3-4 ctasplit_x4e_g2d1 within +-3% of splitk_s4x4e and "
    "ctasplit_x4e_g1d1 0-5% slower than splitk_s4x4e; M = 3 between M = 2 and M = 4 in % of copy. The dispatch "
    "changes only where a path leads the dispatched one by more than 1.5 points of copy in both runs and both "
    "routings.")
SMALL_F16_PREDICTION = (
    "PREDICTION, written before any run (code: template flag F16 in frag_step / cs_stages / moe_small_ctasplit_body, "
    "new entries moe_small_ctasplit_x4eh and moe_x_to_f16; the gate_up activations converted once per call to fp16 "
    "scaled by a power of two per token, so the nibble extraction needs one shift per weight word instead of three; "
    "down unchanged; the SASS of the other 32 kernels unchanged, cuobjdump). The gate_up stage loop is 408 static "
    "SASS instructions against ctasplit_x4e's 437 (SHF 54 -> 26, HADD2 64 -> 32 + 32 HFMA2), about 9% fewer issued "
    "per gate_up stage (327 -> ~298), on the ALU pipe that the profiles show throttled (stall_math on SHF / LOP3). "
    "Gate_up is two thirds of the bytes; the conversion is a second launch (about 1-3 us). Predicted, same process, "
    "against ctasplit_x4e at the same split: M = 1 (rule split) 1-5% faster, M = 2 (4, 1) 2-6% faster, M = 3-4 "
    "x4eh_g2d1 2-7% faster than ctasplit_x4e_g2d1 and at or above splitk_s4x4e, M = 8-16 (1, 1) 3-7% faster; "
    "outputs bit-identical to ctasplit_x4e at the same split (same exact products, sums scaled by 2^e). The goal "
    "(>= 80% of copy at every M <= 16) is not expected at M = 1-2. Refuted if x4eh is not faster than x4e at "
    "M >= 4 in both runs.")
SMALL_XS_PREDICTION = (
    "PREDICTION, written before any run (code: template flags in cs_stages (SB, XSM) and the CTA-split body (XS); new "
    "entries moe_small_ctasplit_x4s, _x4e_r3 and _x4ec; the other kernels' SASS unchanged, cuobjdump). Run 18's "
    "profiles put the first HMMA of each gate/up stage on a long-scoreboard wait for that stage's activation loads "
    "(9% of the M = 1 launch's stall samples), although the loads are issued ~100 instructions earlier: they queue "
    "behind the weight stream's cp.async traffic in the same L1TEX path. x4s copies each gate/up stage's activation "
    "slice (512 bytes, the item's first column) with the stage's weights, 2 stages ahead, and items of one column "
    "read it from shared memory; to keep 5 CTAs per SM its ring has 3 stages (x4e has 4). Controls in the same "
    "process: x4e_r3 (x4e with a 3-stage ring) and x4ec (x4e with the gate/up activations read through L2 only, "
    "ld.global.cg). Predicted, against x4e at the same split: x4s 2-6% faster at M = 1, 1-4% at M = 2-4, 0-4% at "
    "M = 8-16 (most items have one column up to M = 16); x4e_r3 0-3% slower; x4ec within +-2%. Outputs of all three "
    "bit-identical to x4e's at the same split. Refuted if x4s is not ahead of x4e at M = 1 in both runs.")
SMALL_R3_PREDICTION = (
    "PREDICTION, written before the run (moe_small_ctasplit_x4e_r3, the kernel run 19 timed as its control; SASS "
    "identical to that build). In run 19's two processes x4e_r3 was at or ahead of x4e at the rule's split and at "
    "(1, 1) in most rows. Predicted, same process, against x4e at the same split: x4e_r3 0-3 points of copy ahead at "
    "M = 1-9 and within +-2 at M = 16, at each of the four dispatched splits. Dispatch rule, fixed before the run: "
    "over every process that timed both forms at a split (run 19's two and these two), x4e_r3 replaces x4e in "
    "SMALL_TABLE for an M range if it is ahead on average over the range's rows and routings and no row has it "
    "behind by more than 1.5 points in the mean over the processes.")
SMALL_R3F_PREDICTION = (
    "PREDICTION, written before the run (code: template flag F1 in cs_epilogue and the CTA-split body, entry "
    "moe_small_ctasplit_x4e_r3f; the other kernels' SASS unchanged, cuobjdump). Run 12's timeline had the previous "
    "task's epilogue warp arriving last at almost every task barrier, about half of its epilogue being the fence; "
    "the M = 1 profiles carry ~9% of their stall samples on membar. x4e_r3f publishes h / Y with one fence (lane "
    "0's, after __syncwarp) instead of a fence by every lane and then lane 0's, and waits for h with an acquire load "
    "instead of a relaxed load and a fence (static MEMBARs 7 -> 4). Predicted, same process, against x4e_r3 at the "
    "same split: 1-4% faster at M = 1-4 (short tasks, an epilogue per ~7 stages), within +-1.5% at M = 8-16; "
    "outputs equal to x4e's at the same split. Dispatched in a range only by the rule of bench.SMALL_R3_PREDICTION "
    "(ahead on average over the range, no row's mean behind by more than 1.5 points).")
SMALL_R3FS_PREDICTION = (
    "Run 22: x4e_r3fs is x4e_r3f with the h wait of a down task spinning on relaxed loads and then taking one "
    "acquire load, instead of an acquire per spin iteration: each ld.acquire.gpu compiles to LDG.STRONG.GPU + "
    "CCTL.IVALL (SASS), so a waiting down warp invalidated its SM's L1, where the gate/up activations of the other "
    "warps on the SM live, every ~128 ns of the gate/up -> down transition. The rest of the SASS is the same length "
    "(3256 instructions; the other kernels' SASS unchanged). Predicted, same process, against x4e_r3f at the same "
    "split: 0-2% faster at M = 1-2 (the transition is a larger share of the call), within +-1.5% at M = 3-16; "
    "outputs equal to x4e's. Dispatched in a range only by the rule of bench.SMALL_R3_PREDICTION.")
SMALL_R3FST_PREDICTION = (
    "Run 23: x4e_r3fst is x4e_r3fs with each CTA's first L + 1 tasks static (task q * grid + CTA) instead of taken by "
    "L + 1 atomicAdds on one counter, which 660 CTAs contend for before any of them issues its first weight load "
    "(two serialized round trips each, by thread 0, before the block barrier that releases the issuers); the counter "
    "then hands out tasks from (L + 1) * grid on. Other kernels' SASS unchanged. Predicted, same process, against "
    "x4e_r3fs at the same split: 1-2 us less per call, so +1.5-3% at M = 1, +0.5-1.5% at M = 2-4, within +-1% at "
    "M = 8-16; outputs equal to x4e's. Dispatched at M = 1 (where x4e_r3fs runs) only by run 19's rule.")
SMALL_R3FST_SPLITS_PREDICTION = (
    "Run 23b, written after run 23 and before this run: in run 23, x4e_r3fst at splits the table does not use gained "
    "far more than at the rule's split (at M = 1-2 with the split (1, 1), where the tasks are fewer than 2 x 660: the "
    "start's atomics had handed them out in contention order, so many CTAs got none; static first tasks give every "
    "CTA one). The split sweep: x4e_r3fst at the splits rule / (4, 1) / (2, 1) / (1, 1) beside the dispatched path of "
    "each M (x4e_r3fst at M = 1, x4e_r3f (4, 1) at M = 2, x4e_r3f (2, 1) at M = 3-4, x4e_r3 (1, 1) at M = 5-16), "
    "two processes. Rule, per M range {1, 2, 3-4, 5-16}: the candidate (x4e_r3fst at one split) with the highest "
    "mean over the range's rows and both processes replaces the dispatched path if it is ahead on average and no "
    "row's mean is behind by more than 1.5 points. Predicted: (1, 1) or (2, 1) wins at M = 2 under uniform routing, "
    "the rule replaces M = 2's path; no change at M = 3-16 beyond +-1 point.")
IN_GRAPH_PREDICTION = (
    "Run 21, a change of the measurement, not of a kernel: every % of copy so far timed ONE graph replay between "
    "two events on an idle GPU, so the host's cudaGraphLaunch latency sits inside each sample. The verify benchmark "
    "measured 4.5-10 us between its one-replay and in-graph times for the same calls. The dispatched path is now also "
    "timed queued (a sleep kernel ahead of the start event: device time of one call) and in-graph (16 calls back to "
    "back in one graph, fresh routing per call, two weight sets alternating so no call finds the previous call's "
    "weights in L2). Predicted before the run: queued and in-graph agree within 2 us per call; both 5-10 us below "
    "the one-replay time at every M; so M = 1 at 74-81% of copy in-graph (69% one-replay at 1370afb), M = 2 at "
    "77-82%, M >= 3 at or above 80% in both routings. If the two timings differ by under 2 us, the latency "
    "hypothesis is refuted and the gap at M = 1-2 is in the kernel.")
SMALL_WSPLIT_PREDICTION = (
    "Run 25, written before its first run: moe_small_wsplit (every warp on its own: units of one K part of one tile, "
    "the ring running on into the next unit, split-K partials reduced by the last part to arrive, no block barrier "
    "after the prologue) at the M = 1 split (4, 2) with a 3-stage ring takes 53-58 us per call in-graph at M = 1 "
    "(x4e_r3fst about 65), so 82-90% of copy in-graph and 76-84% in one replay, ahead of x4e_r3fst by at least 5% "
    "in every row of both processes; at M = 2-4 at the table's splits within 3% of the dispatched kernel either "
    "way; at M = 8-16, (1, 1), no reduction at all, within 3% as well. Outputs bit-identical to the CTA-split "
    "kernel at the same split. Dispatched where run 19's rule says so.")
SMALL_NB_PREDICTION = (
    "Run 26, written before its first run: x4e_r3nb (the CTA-split kernel with static tasks and no block barrier: each "
    "warp counts itself into its task's partial-sum buffer, the last to arrive runs the epilogue; outputs bit-identical "
    "to x4e_r3fst / x4e_r3f / x4e_r3 at the same split) is 3-8% faster than x4e_r3fst at M = 1 (the rule's split, "
    "(4, 2)) in every row of both processes, and at M = 2 at (4, 1) within 2 points of wsplit_r3_g2d1 either way. "
    "Refuted if it is not ahead of x4e_r3fst at M = 1 on average. Dispatched where run 23b's rule says so.")
SMALL_IL_PREDICTION = (
    "Run 27, written before its first run, from the timeline of x4e_r3fst (moe_ctasplit_trace_r3fst.json, 09a26fc: at "
    "M = 1 fewer than two thirds of the 660 CTAs are inside stages from the first down tasks on, ~36 us, to the end, "
    "~66 us; down tasks take 3.4 us of stages and arrive 2.8 us apart at their barriers): x4e_r3fsti (gate_up and "
    "down tasks interleaved, each item's down tasks a lag of ceil(grid / 256) = 3 items behind) is 3-8% faster than "
    "x4e_r3fst at M = 1 (split (4, 2)) in one replay and in-graph, in every row of both processes; x4e_r3fsti2 "
    "(one item more of lag: fewer h waits, a longer down-only end) within 2% of x4e_r3fsti either way. At M = 2, "
    "x4e_r3fsti at (4, 1) gains as much over x4e_r3fst at (4, 1) and comes within 2 points of wsplit_r3_g2d1. "
    "Outputs bit-identical to x4e_r3fst at the same split (gpu tests). Refuted if x4e_r3fsti is not faster than "
    "x4e_r3fst at M = 1 in-graph in both processes.")
SMALL_EW_PREDICTION = (
    "Run 27b, written before its first run, after 27a (the interleaved order, refuted): in x4e_r3fst's timeline "
    "(moe_ctasplit_trace_r3fst.json) the warp that ran the previous task's epilogue arrives last at 98-99% of the "
    "barriers, 2.3-2.8 us after the first, and the epilogue's fence waits behind that warp's own ring. x4e_r3fste "
    "(a fifth warp runs every epilogue and grabs the tasks; the four streaming warps hand their parts over through "
    "FULL / FREE named barriers and never wait for each other; 160 threads, 4 CTAs per SM, so 16 streaming warps per "
    "SM instead of 20) is 4-10% faster than x4e_r3fst at M = 1 (split (4, 2)) in one replay and in-graph in every "
    "row of both processes; x4e_r4fste (a 4-stage ring to make up the in-flight bytes of the fewer warps) at least as "
    "fast as x4e_r3fste; at M = 2, x4e_r3fste at (4, 1) ahead of x4e_r3fst at (4, 1) by as much and level with "
    "wsplit_r3_g2d1 or ahead. Outputs bit-identical to x4e_r3fst at the same split (gpu tests). Refuted if neither "
    "EW form is faster than x4e_r3fst at M = 1 in-graph in both processes. Addendum after the first process (both "
    "EW forms 2-4 points behind x4e_r3fst at M = 1 with 16 streaming warps per SM): x4e_r3fste5, the same at 5 CTAs "
    "per SM (72 registers, 16 bytes spilled), is ahead of x4e_r3fst at M = 1 if the warp count was what cost the "
    "EW forms; refuted if not.")
SMALL_SD_PREDICTION = (
    "Run 27c, written before its first run: in x4e_r3fst's timeline (moe_ctasplit_trace_r3fst.json) the first stages "
    "begin ~5.3 us after the first CTA's entry, ~4 us after the prologue ends, while every CTA's thread 0 issues the "
    "same contended returning atomic for its task L + 1 at task 0; in the epilogue-warp form, whose streaming warps "
    "grab nothing, they began at ~3 us. x4e_r3fstd (L + 2 static tasks per CTA, the first grab at task 1) starts its "
    "first stages 1.5-3 us earlier in its timeline and is 1-4% faster than x4e_r3fst at M = 1 (split (4, 2)) in one "
    "replay and in-graph in every row of both processes, and at M = 2 at (4, 1) ahead of x4e_r3fst at (4, 1) by "
    "0-3%. Outputs bit-identical to x4e_r3fst (gpu tests). Refuted if it is not ahead of x4e_r3fst at M = 1 on average "
    "in-graph.")
SMALL_PHASED_PREDICTION = (
    "Run 28, written before its first run. The phased form (two launches: gate/up with whole-K tiles, one task per "
    "warp at M = 1, then down with the sum over k in shared memory per 16-row tile; no counters, fences or atomics) "
    "streams like run 24's ring kernel (96-98% of the read kernel) in each launch, and pays one more launch boundary "
    "(~2-3 us in-graph) and its ramp. Predicted at M = 1 (Kimi, 198 MB): phased_r4 in-graph 53-58 us (80-88% of "
    "copy) against x4e_r3fst's ~64 us, one replay 57-62 us (76-82%); phased_r3 within 3% of phased_r4 (fewer bytes "
    "in flight per warp: 2048 warps x 2 stages = 9.4 MB). At M = 2 (4096 gate/up tasks on 2048-2640 warps, up to "
    "4 items per down warp) ahead of x4e_r3fstd at (4, 1) by 0-8% in-graph. At M = 4 behind the warp-split kernel "
    "(no split, about two tasks per warp with a drained ring between them). Outputs bit-identical to version 3 "
    "(gpu tests). Refuted if phased_r4 is not ahead of x4e_r3fst at M = 1 in-graph on average over both routings.")
SMALL_PDL_PREDICTION = (
    "Run 28b, written before its first run, after the first comparison of the phased form: phased_r3_pdl launches "
    "the down kernel with programmatic dependent launch, so its CTAs (one fits beside gate/up's on an SM at M = 1) "
    "group the pairs and issue their first weight stages while gate/up finishes, and griddepcontrol.wait holds "
    "them until h is complete. Predicted: 1.5-3 us less per call than phased_r3 at M = 1-2 in one replay and "
    "in-graph (2-4 points of copy at M = 1), outputs bit-identical. Refuted if it is not ahead of phased_r3 at "
    "M = 1 in-graph on average over both routings.")
SMALL_EVEN_PREDICTION = (
    "Run 28c, written before its first run, after the dispatch check at 1e009b4 (phased_r3_pdl one replay 78.1-78.4% "
    "at M = 2 skewed): its gate/up launch has 2640 warps and 14-15 items x 256 tasks there, so one round of 2640 and "
    "a second of ~1000-1200 with the rest idle. phased_r3_pdl_even lets only ceil(tasks / r) warps take tasks, r = "
    "ceil(tasks / warps) each: full rounds. Predicted: at M = 2 1-4% faster than phased_r3_pdl (both routings), at "
    "M = 1 the same kernel work (2048 tasks on 2048 warps) within noise, at M = 3-16 within +-2%. Outputs "
    "bit-identical. Refuted if it is not ahead of phased_r3_pdl at M = 2 on average over routings and processes.")
SMALL_SEQ_PREDICTION = (
    "Run 28d, written before its first run, after 28c: the phased breakdown (moe_phased_breakdown.json) has the down "
    "launch alone at ~3.0 TB/s in-graph at M = 1 against ~3.8 for gate/up; its warps take 2 items each at M = 1 (4 at "
    "M = 2) and drain their ring between them, as gate/up warps do between their tasks from M = 2. phased_r3_pdl_seq "
    "runs each warp's tasks and items through one ring (frag_gemm_units). Predicted: against phased_r3_pdl, 1-2 us "
    "less at M = 1 (+2-3 points one replay and in-graph), 2-5 us less at M = 2 (+2-4 points), 0-3% faster at M = "
    "3-16; outputs bit-identical. Refuted if it is not ahead at M = 1-2 on average over routings and processes.")
SMALL_DN4_PREDICTION = (
    "Run 28e, written before its first run, after 28d: the down launch alone runs at ~72% of the read kernel's rate "
    "in-graph at M = 1 (moe_phased_breakdown.json) with 2 items x 8 stages per warp and 2 stages in flight, so about "
    "8 dependent round trips per warp; a 4-stage ring (3 in flight, 4 CTAs per SM still hold all 448 tiles) cuts "
    "them to about 6. Predicted: phased_r3_pdl_dn4 1-3 us less per call than phased_r3_pdl at M = 1-2 (+1.5-4 "
    "points), the down launch alone 2-4 us less; phased_r4_pdl (gate/up at 4 stages too) behind phased_r3_pdl_dn4 "
    "(as run 28's r4 trailed r3). Outputs bit-identical. Refuted if phased_r3_pdl_dn4 is not ahead of "
    "phased_r3_pdl at M = 1-2 on average.")
SMALL_C2_PREDICTION = (
    "Run 29, written before its first run, after the profile and tile-balance probe (moe_phased_balance.json, "
    "logs in run29): the down launch alone is 21.9 us in-graph at M = 1 (66 MB, ~3.0 TB/s against gate/up's ~3.8), "
    "with 20% achieved occupancy (at most 16 warps an SM at 112 registers, 13.6 on average with 448 CTAs on 132 SMs) "
    "and long-scoreboard stalls first; at H = 8448 (4 CTAs on every SM) it reads 1.18x the bytes in 1.10x the time. "
    "phased_r3_pdl_c2 runs the down launch as clusters of two CTAs per tile (95 registers, up to five CTAs an SM, each "
    "warp half the items: one at M = 1). Predicted: the down launch alone 2-4 us faster in-graph at M = 1 and 3-6 us at "
    "M = 2; the pair 1.5-4 us less per call at M = 1-2 than phased_r3_pdl (+2-5 points of copy), at M = 4 no worse "
    "than -1 point; outputs bit-identical. Refuted if it is not ahead of phased_r3_pdl at M = 1-2 on average over "
    "routings, one replay and in-graph.")
SMALL_G6_PREDICTION = (
    "Run 29b, written before its first run, after 29 (c2 refuted: its down launch ~4 us slower at M = 1 in 1.4 waves "
    "of 8-stage chains; moe_small_c2*.json). The gate/up launch at M = 2 has 4096 tasks on 2640 warps (1.55 rounds; "
    "Nsight: SMs active 75% of its elapsed cycles against 89% at M = 1). phased_r3_pdl_g6: gate/up at launch bounds "
    "(128, 6), 79 registers, no spills, 3168 warps (1.29 rounds at M = 2); phased_r3_pdl_g6d5: also the down kernel at "
    "(128, 5), 96 registers, so more of its CTAs fit beside gate/up's under PDL. Predicted: g6 +1-3 points of copy at "
    "M = 2 (one replay and in-graph), within 1 point at M = 1, -0..-3 at M = 4 (2.5 rounds against 3.0); g6d5 a further "
    "+0.5-1.5 at M = 1-2. Outputs bit-identical. Refuted if neither is ahead of phased_r3_pdl at M = 2 on average over "
    "routings and processes.")
SMALL_CM_PREDICTION = (
    "Run 29e, written before its first run, after the diagnostic builds (moe_phased_builds*.json): without the "
    "dequantisation (nodeq_frag) the down launch alone is ~1.5 us faster at M = 1 and ~36 us (14%) at M = 16 in-graph, "
    "the gate/up launch ~48 us faster in-graph at M = 16 (the power cap); without the mma (nomma_frag) nothing moves. "
    "phased_r3_pdl_cm drops the four bf16x2 subtractions a word and adds one mma with A = -136 (64 HADD2 out, 16 HMMA "
    "and ~30 register moves in, per stage of the down kernel: about a quarter of what nodeq removes). Predicted: "
    "+0.3-1 point of copy at M = 1-2 (one replay and in-graph), +1-3 in-graph at M = 16, outputs within 2e-3 of "
    "version 3's by norm, rel. error <= 1e-2. Refuted if it is not ahead of phased_r3_pdl at M = 1-2 on average over "
    "routings and processes.")
SMALL_K4_PREDICTION = (
    "Run 29f, written before its first run. At M = 2 the gate/up launch has 4096 (skewed ~3800) whole-K tasks of 28 "
    "stages on 2640 warps: a second round half full, and Nsight has its SMs idle a quarter of its elapsed cycles "
    "(moe_phased_ncu_m2_7c79a85.txt). phased_r3_pdl_k4 gives each (item, tile) task to one CTA, its four warps a "
    "quarter of K each (7 stages), the parts added in shared memory in a fixed order: the same work in units a quarter "
    "as long, so the partial last round is short. Predicted: +2-5 points of copy at M = 2 one replay, +1-3 in-graph; "
    "M = 3-4 +0-3; M = 1 -1..-4 (2048 tasks on 660 CTAs: four rounds of quarter tasks with a block barrier each, "
    "against one round now); M = 16 within 1.5. Outputs within 2e-3 of version 3's by norm. Refuted if it is not "
    "ahead of phased_r3_pdl at M = 2 on average over routings and processes (one replay).")
SMALL_PF_PREDICTION = (
    "Run 30, written before its first run. Run 29g: the down kernel's warps wait on their weight ring (~11% of its "
    "stall samples at the warp barrier after cp.async.wait, gate/up ~2%), every item restarting the ring with two "
    "stages in flight; and between the down warps' first two stages (issued before griddepcontrol.wait) and the wait's "
    "return nothing more of the down weights is requested. L2 prefetches (cp.async.bulk.prefetch.L2: no shared memory, "
    "no registers held, bit-identical outputs): pfg, each gate/up warp with no task left prefetches its share of the "
    "down launch's first 4 stages of items 0-3 (16.5 MB at M = 1); pfd, each down item prefetches its stages past the "
    "ring's first two at its start (6 of 8 at Kimi's I); pfgd both; k4_pfgd both on the K-split gate/up. Predicted, "
    "one replay at M = 1 against phased_r3_pdl: pfg +1-3 points of copy, pfd +1-3, pfgd +2-5; in-graph each +1-3; "
    "at M = 2 k4_pfgd against phased_r3_pdl_k4 +1-3; at M = 4 and 16 each within 1.5 of its base. The down launch "
    "alone in-graph at M = 1 (22.0 us in run 29): pfd 19.5-21 us. Refuted if no pf pair is ahead of its base at "
    "M = 1 on average over routings and processes (one replay).")
SMALL_EI_PREDICTION = (
    "Run 30b, written before its first run. The one-replay time at M = 1 has been 57.7-59.0 us in all four full sweeps; "
    "80% of copy needs <= 58.4 us at 4247 GB/s, so a few tenths of a microsecond decide the goal row. In the gate/up "
    "kernel every warp waits for the CTA's prologue (ids, a sort through shared memory, five barriers) before it "
    "issues its first weight stage (Nsight 29g: ~4% of the gate/up kernel's stall samples before the first LDGSTS). "
    "phased_r3_pdl_ei / phased_r3_pdl_k4_ei: where M x topk <= 32, each warp builds the item table itself with "
    "shuffles (warp_item_expert), issues its first task's first two stages, and only then runs the prologue; "
    "bit-identical outputs. Predicted: one replay at M = 1 +0.3-1.5 points of copy against phased_r3_pdl (the "
    "prologue's sort, ~0.3-0.8 us, hidden behind the first stages' DRAM latency), in-graph +0.3-1.5; at M = 2 "
    "k4_ei against phased_r3_pdl_k4 +0-1; at M = 4 (32 pairs: the warp's two 32-step shuffle loops cost about what "
    "they save) -0.5..+0.5. Refuted if ei is not ahead of phased_r3_pdl at M = 1 on average over routings and "
    "processes (one replay).")
SMALL_FO_PREDICTION = (
    "Run 31, written before its first run. Run 29d: without the dequantisation (nodeq_frag) the down launch alone "
    "in-graph is 20.5 us against 22.0 at M = 1 and 219 against 256 at M = 16, the gate/up launch 34.4 against 35.2 "
    "(M = 1) and 418 against 467 (M = 16). The fold removes the four bf16x2 subtractions of a word (16 of the 44 "
    "dequantisation instructions of a 64-wide step) and adds per 256-wide stage one mma, two shared loads and two "
    "PRMT (gate/up: the group sums from a per-CTA table built in the prologue, ~0.3-1 us at M = 1, up to ~4 us at "
    "M = 16) or two L2 loads and ~11 ALU (down: from h's partial sums, stored by gate/up with three shuffles a tile). "
    "Predicted, against phased_r3_pdl in the same processes: the down launch alone in-graph at M = 1 (fd) 21.2-21.8 "
    "us, at M = 16 235-248 us; the gate/up launch alone with the fold (fgd) at M = 1 within 0.5 us of the default, at "
    "M = 16 440-460 us. One replay at M = 1: fd +0.3-1.2 points of copy, fgd +0-1.5, fg -0.5..+0.8; k4_fd against "
    "phased_r3_pdl_k4 at M = 2 +0.3-1.2; in-graph at M = 16 fd +1-3, fgd +2-5. Outputs within 2e-3 of version 3's by "
    "norm (workbench.moe.fold's CPU model: ~1e-4 from the bf16 hi + lo split). Refuted if no fold pair is ahead of "
    "its base at M = 1 on average over routings and processes (one replay).")
SMALL_KS_PREDICTION = (
    "Run 32, written before its first run. At M = 1 the whole-K gate/up launch runs 2048 (item, tile) tasks of 28 "
    "stages on 2048 warps (512 CTAs, 3.9 of 5 a SM), alone in-graph 35.1 us for 124.7 MB (~84% of copy, where the read "
    "kernel reaches ~100% in-graph). Run 28c found more warps in flight beat fewer in full rounds. The K-span form "
    "(phased_gate_up_ks) gives each CTA T = ceil(tasks bound / resident CTAs) consecutive tasks and its warps equal "
    "quarters of their T x 28 stages; at six or seven CTAs a SM (ks6: 80 registers, ks7: 72, both spill a few bytes "
    "outside the stage loop), M = 1 runs 683 CTAs, 2732 warps of 21 stages. Predicted, against phased_r3_pdl in the "
    "same processes: the gate/up launch alone in-graph at M = 1 31.5-33.5 us (ks6 and ks7 within 0.5 us of each "
    "other: the same T and grid); the PDL overlap of the pair (both - parts) up to 1.5 us smaller, the gate/up CTAs "
    "leaving less room for early down CTAs; one replay at M = 1 +2-5 points of copy, in-graph +2-5. M = 2 against "
    "phased_r3_pdl_k4 (7 rounds of 7 stages a warp): ks6 (T = 6, 42 stages) +0-2, ks7 (T = 5, 35 stages) +0.5-3. "
    "M = 4 and 16: within 1.5 of phased_r3_pdl. Outputs within 2e-3 of version 3 by norm. Refuted if neither ks pair "
    "is ahead of phased_r3_pdl at M = 1 on average over routings and processes (one replay), or if its gate/up launch "
    "alone is not at least 1 us faster in-graph at M = 1.")
SMALL_KSA_PREDICTION = (
    "Run 32b, written after run 32 and before this run. Run 32 refuted the K-span form: its gate/up launch alone "
    "in-graph at M = 1 took 41.0 us (ks6) and 45.7 (ks7) against 35.2 (moe_phased_breakdown_ks.json). Its quarters in "
    "task order put the four warps of every CTA at four different stage offsets (0, 21, 14, 7 of 28), each reading "
    "every third tile, where the whole-K form's warps read neighbouring tiles of one stage together (the stage-major "
    "packing's point). Hypothesis: DRAM locality. ks6a keeps ks6's grid (683 CTAs, 21 stages a warp) but splits a "
    "CTA's three tasks by stage: warps 0-2 stages 0-20 of one task each (neighbouring tiles at one stage across the "
    "grid), warp 3 stages 21-27 of all three. Predicted: its gate/up launch alone in-graph at M = 1 33-35 us (at least "
    "4 us faster than ks6, measured in the same process); one replay at M = 1 within -1..+3 points of phased_r3_pdl. "
    "Refuted (locality not the main cost of run 32) if ks6a's gate/up launch is not at least 3 us faster than ks6's.")
SMALL_R2_PREDICTION = (
    "Run 33, written before its first run. Run 32's profile: a quarter more gate/up warps in flight moved fewer bytes "
    "(DRAM 68-69% of peak against 78%), and run 28e's 4-stage rings (three stages in flight) were slower than the "
    "3-stage ones; with ~9.4 MB in flight at M = 1 (2048 warps x 2 stages x 2304 B) and ~3.7 TB/s, Little's law puts "
    "a stage's loaded latency near 2.5 us, several times an idle DRAM's. If the ring depth is past what the DRAM "
    "serves well, one stage in flight while a stage is computed (two-stage rings: phased_r2_pdl both launches, "
    "phased_r3_pdl_dn2 down only, phased_r3_pdl_gu2 gate/up only; bit-identical, same registers and grids) loses "
    "little bandwidth and shortens each warp's queue. Expected, against phased_r3_pdl in the same processes: level "
    "or slower; best case the down launch alone in-graph at M = 1 0.5-1.5 us faster with dn2 (21.9 us now), the pair "
    "+0.5-2 points one replay. Worst case, the ring depth is what carries the bandwidth: r2 10-25% slower at every M. "
    "Refuted (no gain from shallower rings) if no r2 pair is ahead of phased_r3_pdl at M = 1 on average over routings "
    "and processes (one replay).")
SMALL_PREDICTIONS = {"moe_small_r2": SMALL_R2_PREDICTION, "moe_small_ksa": SMALL_KSA_PREDICTION, "moe_small_ks": SMALL_KS_PREDICTION, "moe_small_fo": SMALL_FO_PREDICTION, "moe_small_ei": SMALL_EI_PREDICTION, "moe_small_pf": SMALL_PF_PREDICTION, "moe_small_k4": SMALL_K4_PREDICTION, "moe_small_cm": SMALL_CM_PREDICTION, "moe_small_g6": SMALL_G6_PREDICTION, "moe_small_c2": SMALL_C2_PREDICTION, "moe_small_dn4": SMALL_DN4_PREDICTION, "moe_small_seq": SMALL_SEQ_PREDICTION, "moe_small_even": SMALL_EVEN_PREDICTION, "moe_small_pdl": SMALL_PDL_PREDICTION, "moe_small_phased": SMALL_PHASED_PREDICTION, "moe_small_sd": SMALL_SD_PREDICTION, "moe_small_ew": SMALL_EW_PREDICTION, "moe_small_ew5": SMALL_EW_PREDICTION, "moe_small_il": SMALL_IL_PREDICTION, "moe_small_nb": SMALL_NB_PREDICTION, "moe_small_wsplit": SMALL_WSPLIT_PREDICTION, "moe_small_v3": SMALL_V3_PREDICTION, "moe_small_dispatch": IN_GRAPH_PREDICTION, "moe_small_splitk": SMALL_SPLITK_PREDICTION,
                     "moe_small_ctasplit": SMALL_CTASPLIT_PREDICTION,
                     "moe_small_ctasplit_sb": SMALL_CTASPLIT_SB_PREDICTION,
                     "moe_small_xprefetch": SMALL_XPREFETCH_PREDICTION,
                     "moe_small_x4_splits": SMALL_CTASPLIT_X4_SPLITS_PREDICTION,
                     "moe_small_x4_b4": SMALL_X4_B4_PREDICTION, "moe_small_xend": SMALL_XEND_PREDICTION,
                     "moe_small_xend_splits": SMALL_XEND_SPLITS_PREDICTION, "moe_small_f16": SMALL_F16_PREDICTION,
                     "moe_small_xs": SMALL_XS_PREDICTION, "moe_small_r3": SMALL_R3_PREDICTION,
                     "moe_small_r3f": SMALL_R3F_PREDICTION, "moe_small_r3fs": SMALL_R3FS_PREDICTION,
                     "moe_small_r3fst": SMALL_R3FST_PREDICTION, "moe_small_r3fst_splits": SMALL_R3FST_SPLITS_PREDICTION}
# labels of the paths --small-compare can time: the one-launch kernels (fused.SMALL_VARIANTS; "small_fused" is
# version 3) and "four_launch"
SMALL_COMPARE_PATHS = ("small_fused", "four_launch", *(v for v in SMALL_VARIANTS if v != "v3"))


def compare_label(variant: str) -> str:
    """The --small-compare label of a one-launch kernel (a fused.SMALL_VARIANTS key): "small_fused" for
    version 3 ("v3"), the variant's own name otherwise; :func:`label_variant` is the inverse."""
    return "small_fused" if variant == "v3" else variant


def label_variant(label: str) -> str:
    """The fused.SMALL_VARIANTS key of a one-launch --small-compare label (inverse of :func:`compare_label`)."""
    return "v3" if label == "small_fused" else label


def dispatched_path(m: int, topk: int) -> str:
    """The --small-compare label of the path ``fused_moe_int4`` runs today for M tokens ("four_launch" or a
    one-launch kernel's label)."""
    v = small_variant_for(m, topk)
    return "four_launch" if v is None else compare_label(v)


def _set_compare_path(label: str) -> None:
    """Dispatch every M * topk <= SMALL_MAX_PAIRS to the path ``label`` (a SMALL_COMPARE_PATHS entry)."""
    if label == "four_launch":
        set_small_table([(SMALL_MAX_PAIRS, False)])
        return
    set_small_table([(SMALL_MAX_PAIRS, True)])
    set_small_variant(label_variant(label))


def run_small_compare(out_dir: str | Path | None, m_values=SMALL_COMPARE_M, reps: int = 20, seed: int = 0,
                      name: str = "moe_small_v3", prediction: str | None = None,
                      paths: tuple[str, ...] = ("small_fused", "four_launch"), in_graph_all: bool = False) -> Path:
    """One-launch small-M kernels against the four-launch path at Kimi shapes, in one process.

    ``paths``: labels from :data:`SMALL_COMPARE_PATHS` ("small_fused" = version 3, "four_launch", and the
    split-K forms "splitk_s3", "splitk_s4", "splitk_s3_max", the CTA-split forms "ctasplit", "ctasplit_max").
    For each routing and M (M * topk <=
    SMALL_MAX_PAIRS): a parity check of every one-launch path (fresh inputs, poisoned buffers), then
    every path timed as CUDA-graph replays with fresh routing per repeat; the copy bandwidth is measured
    in the same run. Split-K rows also record the splits the kernel takes for each timed routing
    (``<label>_splits``: "gate_up,down" -> repeats). The dispatched path of each M is also timed queued, by the
    profiler's kernel spans (run 34) and in-graph (:func:`in_graph_fields`); with ``in_graph_all`` every one-launch
    path is. Writes ``<name>.json``, with the prediction
    (default: :data:`SMALL_PREDICTIONS` [name], or [name without a trailing "_2"] for a run's second process) as its
    notes; the dispatch tables are left as they were.
    """
    from workbench.measure import measure_copy_bandwidth, write_measurement

    unknown = [p for p in paths if p not in SMALL_COMPARE_PATHS]
    if unknown or "four_launch" not in paths or not paths:
        raise ValueError(f"paths must include 'four_launch' and come from {SMALL_COMPARE_PATHS}, got {paths}")
    if prediction is None:
        prediction = SMALL_PREDICTIONS.get(name, SMALL_PREDICTIONS.get(name.removesuffix("_2"), ""))
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    E, H, I, K = KIMI["num_experts"], KIMI["hidden"], KIMI["intermediate"], KIMI["topk"]
    bad = [m for m in m_values if m * K > SMALL_MAX_PAIRS]
    if bad:
        raise ValueError(f"M {bad} exceed the one-launch kernel's {SMALL_MAX_PAIRS} pairs at top-{K}")
    experts, banks = kimi_banks(seed)
    bpe = experts.bytes_per_expert()
    copy = measure_copy_bandwidth()
    copy_gbps = copy["gb_per_s"]
    print(f"copy {copy_gbps:.0f} GB/s")
    params = {"num_experts": E, "hidden": H, "intermediate": I, "topk": K, "group_size": 32,
              "m_values": list(m_values), "routings": list(ROUTINGS), "skew_alpha": SKEW_ALPHA, "reps": reps,
              "seed": seed, "bytes_per_expert": bpe, "paths": list(paths),
              "small_variants": {p: list(SMALL_VARIANTS[p][1] or []) for p in paths if p in SMALL_VARIANTS},
              "weights": "random packed int4 (uniform nibbles), scales 0.02*U(0.5,1.5) bf16",
              "timing": "median of CUDA-event timed CUDA-graph replays, fresh routing per repeat", **IN_GRAPH_PARAMS,
              "in_graph_paths": "every one-launch path" if in_graph_all else
                                "the dispatched path of each M, where among the paths (row field 'dispatched')"}
    saved_small = list(SMALL_TABLE)
    saved_variant = SMALL_VARIANT["name"]
    dispatched = {m: dispatched_path(m, K) for m in m_values}   # queued and in-graph too, where timed
    rows: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    samples: dict[str, Any] = {}
    one_launch = [p for p in paths if p != "four_launch"]

    def grids() -> dict[str, int | None]:
        return {p: small_grid(SMALL_VARIANTS[label_variant(p)][0]) for p in one_launch}

    def save() -> Path:   # after every row, so a run cut short keeps what it measured
        wins = {p: [[r["routing"], r["m"]] for r in rows if r[f"{p}_ms_median"] < r["four_launch_ms_median"]]
                for p in one_launch}
        results = {"copy_gb_per_s": copy_gbps, "rows": rows, "checks": checks,
                   "all_checks_ok": all(c["ok"] for c in checks), "faster_than_four_launch_at": wins,
                   "complete": len(rows) == len(ROUTINGS) * len(m_values)}
        if "small_fused" in paths:
            results["small_faster_at"] = wins["small_fused"]
        g = grids()
        return write_measurement(name, parameters={**params, "small_path_grid_ctas": g.get("small_fused"),
                                                   "grid_ctas": g},
                                 results=results, samples={"ceilings": {"copy": copy}, "timings": samples},
                                 notes=prediction, out_dir=out_dir)

    try:
        for routing, m in itertools.product(ROUTINGS, m_values):
            row: dict[str, Any] = {"routing": routing, "m": m}
            for label in paths:
                _set_compare_path(label)
                if label != "four_launch":
                    checks.append({**check_case(experts, m, routing, gen, K), "label": label})
                both = label == dispatched[m] or (in_graph_all and label != "four_launch")   # queued, in-graph too
                t = time_ours(experts, m, routing, gen, reps, eager_reps=0, queued=both, spans=both)
                row[f"{label}_ms_median"] = statistics.median(t["ms"])
                row[f"{label}_pct_of_copy"] = pct_of_copy(t["distinct"], t["ms"], bpe, m, copy_gbps)
                row["distinct_experts_median"] = statistics.median(t["distinct"])
                if label == dispatched[m]:
                    row["dispatched"] = label
                if both:
                    row.update(in_graph_fields(label, t, banks, m, routing, gen, max(10, reps // 2), bpe,
                                               copy_gbps, checks, samples))
                samples[f"{routing}/m{m}/{label}"] = {"ms": t["ms"], "distinct": t["distinct"]}
                if label.startswith(("ctasplit", "wsplit")):
                    sp = ctasplit_splits(H, I, SMALL_VARIANTS[label][1][1])
                    row[f"{label}_splits"] = {f"{sp[0]},{sp[1]}": len(t["rep_idx"])}
                if label.startswith("splitk"):
                    kname = SMALL_VARIANTS[label][0]
                    ids_cpu = t["ids_all"].cpu()
                    used: dict[str, int] = {}
                    for j in t["rep_idx"]:
                        sp = splitk_splits(work_items(ids_cpu[j], E), H, I, label, small_grid(kname) or 0)
                        used[f"{sp[0]},{sp[1]}"] = used.get(f"{sp[0]},{sp[1]}", 0) + 1
                    row[f"{label}_splits"] = used
                del t
            row["four_launch_variant"] = variant_name(kernel_config(m))
            for label in one_launch:
                row[f"speedup_{label}_vs_four_launch"] = row["four_launch_ms_median"] / row[f"{label}_ms_median"]
                if label != "small_fused" and "small_fused" in paths:
                    row[f"speedup_{label}_vs_small_fused"] = row["small_fused_ms_median"] / row[f"{label}_ms_median"]
            if "small_fused" in paths:
                row["speedup_small_vs_four_launch"] = row["speedup_small_fused_vs_four_launch"]
            rows.append(row)
            print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
            save()
    finally:
        set_small_table(saved_small)
        set_small_variant(saved_variant)
    return save()


def format_small_compare(doc: dict[str, Any]) -> str:
    """Short text table of a run_small_compare measurement: ms and % of copy of every path timed."""
    res = doc["results"]
    paths = doc.get("parameters", {}).get("paths", ["small_fused", "four_launch"])
    short = {"small_fused": "v3", "four_launch": "4-launch"}
    head = f"{'routing':8} {'M':>3} {'experts':>7} " + " ".join(f"{short.get(p, p):>13} {'%copy':>5}" for p in paths)
    lines = [f"copy {res['copy_gb_per_s']:.0f} GB/s, checks ok: {res['all_checks_ok']} (ms, % of copy per path)", head]
    for r in res["rows"]:
        d = r.get("dispatched")
        tail = (f"  dispatched {d}: queued {r[d + '_queued_pct_of_copy']:.1f}%, in-graph "
                f"{r[d + '_ingraph_pct_of_copy']:.1f}%" if d and f"{d}_ingraph_pct_of_copy" in r else "")
        lines.append(f"{r['routing']:8} {r['m']:>3} {r['distinct_experts_median']:>7.0f} " + " ".join(
            f"{r[p + '_ms_median']:>13.4f} {r[p + '_pct_of_copy']:>5.1f}" for p in paths) + tail)
    return "\n".join(lines)


def format_table(doc: dict[str, Any]) -> str:
    """Short text table of a moe_bandwidth measurement."""
    res = doc["results"]
    lines = [f"copy {res['copy_gb_per_s']:.0f} GB/s, bf16 {res['bf16_matmul_tflops']:.0f} TFLOP/s, "
             f"checks ok: {res['all_checks_ok']}",
             f"{'routing':8} {'M':>5} {'experts':>7} {'ms':>8} {'GB/s':>7} {'%copy':>6} {'queued':>6} {'span':>6} "
             f"{'graph':>6} "
             f"{'TF/s':>6} {'x bf16':>7} {'x int4pk':>8} {'x deq':>6}"]
    for r in res["rows"]:
        def sp(k: str) -> str:
            v = r.get(k)
            return f"{v:.2f}" if isinstance(v, float) else "-"
        lines.append(f"{r['routing']:8} {r['m']:>5} {r['distinct_experts_median']:>7.0f} {r['ms_median']:>8.4f} "
                     f"{r['gb_per_s_median']:>7.0f} {r['pct_of_copy']:>6.1f} {r.get('queued_pct_of_copy', 0):>6.1f} "
                     f"{r.get('span_pct_of_copy', 0):>6.1f} {r.get('ingraph_pct_of_copy', 0):>6.1f} {r['tflops']:>6.1f} "
                     f"{sp('speedup_vs_bf16_cublas'):>7} {sp('speedup_vs_torch_int4pack'):>8} "
                     f"{sp('speedup_vs_dequant_matmul'):>6}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for moe_bandwidth.json (default data/measurements/<gpu>)")
    ap.add_argument("--name", default="moe_bandwidth",
                    help="measurement name of the sweep (a repeat: moe_bandwidth_repeat, kept beside the dispatch's)")
    ap.add_argument("--m", type=int, nargs="*", default=list(M_VALUES), help="token counts to sweep")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--peer-reps", type=int, default=8)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--no-spans", action="store_true",
                    help="no profiler kernel-span timing of the rows and no graph launch latency probe")
    ap.add_argument("--tune-reps", type=int, default=10, help="repeats per variant and M when tuning (0: no tuning)")
    ap.add_argument("--sanitize", action="store_true", help="small parity checks only (for compute-sanitizer)")
    ap.add_argument("--single", type=int, default=None, metavar="M",
                    help="two calls (warm-up + one) per --variants at Kimi shapes and M tokens (for ncu)")
    ap.add_argument("--small", action="store_true", help="with --single: also the one-launch small-M kernel")
    ap.add_argument("--variants", nargs="*", default=[],
                    help="four-launch variants for --single / --sanitize (default: all; 'none': no variant), "
                         "e.g. 1,2,2,0,0 1,1,0,4,1")
    ap.add_argument("--small-compare", default=None, metavar="NAME",
                    help="only time the one-launch kernel against the four-launch path at --m (default "
                         "1 2 4 8 9 16 here) and write NAME.json")
    ap.add_argument("--in-graph-probe", default=None, metavar="NAME",
                    help="only run 21's diagnostic of the in-graph timing (two weight sets, one, two with gaps) at "
                         "--m (default 1 4 16 64) and write NAME.json")
    ap.add_argument("--copy-probe", default=None, metavar="NAME",
                    help="only time the copy ceiling three ways (one event pair, queued, profiler span) and the graph "
                         "launch latency, --reps rounds of 20 samples each, and write NAME.json (run 34)")
    ap.add_argument("--prediction", default=None,
                    help="with --small-compare: the prediction, stored as the measurement's notes "
                         "(default: the one written for NAME, if any)")
    ap.add_argument("--small-paths", nargs="*", default=["small_fused", "four_launch"],
                    help=f"with --small-compare: paths to time, from {list(SMALL_COMPARE_PATHS)}")
    ap.add_argument("--in-graph-all", action="store_true",
                    help="with --small-compare: every one-launch path also queued and in-graph (not only the dispatched)")
    ap.add_argument("--small-variants", nargs="*", default=["v3"],
                    help=f"with --sanitize / --single --small: one-launch kernels, from {sorted(SMALL_VARIANTS)}")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("the MoE benchmark needs a CUDA GPU; the CPU path is workbench.moe.moe_reference", file=sys.stderr)
        return 2
    if args.single is not None:
        ex = random_int4_experts(KIMI["num_experts"], KIMI["hidden"], KIMI["intermediate"], device="cuda")
        gen = torch.Generator().manual_seed(0)

        def two_calls() -> int:
            """Warm-up + one call at M = args.single, fresh uniform routing each; distinct experts of the last."""
            for _ in range(2):
                ids, w = make_routing(args.single, KIMI["num_experts"], KIMI["topk"], "uniform", gen)
                x = torch.randn(args.single, KIMI["hidden"], device="cuda").to(torch.bfloat16)
                fused_moe_int4(x, ids.cuda(), w.cuda(), ex, validate=False)
            torch.cuda.synchronize()
            return distinct_experts(ids)

        if args.small:   # the one-launch kernels first (two calls each), then the four-launch variants
            set_small_table([(SMALL_MAX_PAIRS, True)])
            for sv in args.small_variants:
                set_small_variant(sv)
                print(f"small {sv}: distinct experts {two_calls()}")
            set_small_variant(None)
        set_small_path(False)
        specs = args.variants or [",".join(map(str, kernel_config(args.single)))]
        for spec in [sp for sp in specs if sp != "none"]:
            set_kernel_table([(1 << 30, tuple(int(v) for v in spec.split(",")))])
            print(f"variant {spec}: distinct experts {two_calls()}")
        return 0
    if args.copy_probe:
        path = run_copy_probe(args.out, rounds=args.reps, name=args.copy_probe, prediction=args.prediction)
        print(f"wrote {path}")
        for r in json.loads(Path(path).read_text())["results"]["rows"]:
            print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
        return 0
    if args.in_graph_probe:
        ms = tuple(args.m) if args.m != list(M_VALUES) else (1, 4, 16, 64)
        path = run_in_graph_probe(args.out, m_values=ms, name=args.in_graph_probe,
                                  prediction=args.prediction or (IN_GRAPH_PROBE_2_PREDICTION
                                                                 if args.in_graph_probe.endswith("_2") else None))
        doc = json.loads(Path(path).read_text())
        print(f"wrote {path}")
        for r in doc["results"]["rows"]:
            print(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
        return 0 if doc["results"]["all_checks_ok"] else 1
    if args.small_compare:
        ms = tuple(args.m) if args.m != list(M_VALUES) else SMALL_COMPARE_M
        path = run_small_compare(args.out, m_values=ms, reps=args.reps, name=args.small_compare,
                                 prediction=args.prediction, paths=tuple(args.small_paths),
                                 in_graph_all=args.in_graph_all)
        doc = json.loads(Path(path).read_text())
        print(f"wrote {path}")
        print(format_small_compare(doc))
        return 0 if doc["results"]["all_checks_ok"] else 1
    if args.sanitize:
        res = run_sanitize_checks(variants=[tuple(int(v) for v in spec.split(",")) for spec in args.variants
                                            if spec != "none"] if args.variants else VARIANTS,
                                  small_variants=tuple(args.small_variants))
        for r in res:
            print(r)
        ok = all(r["ok"] for r in res)
        print("sanitize checks ok" if ok else "sanitize checks FAILED")
        return 0 if ok else 1
    path = run_benchmark(args.out, m_values=tuple(args.m), reps=args.reps, peer_reps=args.peer_reps,
                         include_peers=not args.no_peers, tune_reps=args.tune_reps, measurement=args.name,
                         spans=not args.no_spans)
    doc = json.loads(Path(path).read_text())
    print(f"wrote {path}")
    print(format_table(doc))
    return 0 if doc["results"]["all_checks_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
