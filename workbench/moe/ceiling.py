"""Streaming-read ceiling of the one-launch MoE path: ``python -m workbench.moe.ceiling --out DIR``.

The issue's goal for M <= 16 is a share of the copy bandwidth (a 2 GiB device-to-device copy). A call at
M = 1 streams about 200 MB, so a fixed cost per call (the launch, the DRAM ramp at the start, the drain at
the end) weighs far more in it than in the copy. :func:`stream_touched` runs ``moe_stream_touched_u<U>``
(moe_int4.cu): a kernel that reads exactly the fragment bytes of the experts a call touches, with nothing
else to do (no compute, no gate_up -> down dependency, no task queue). Its time is what any kernel that
must stream those bytes in one launch pays at least, in the same timings as the fused kernel (one replay,
queued, in-graph). :func:`run_stream_ceiling` times it at several launch shapes beside the dispatched fused
path in one process and writes ``moe_stream_ceiling.json``: how much of the gap to the copy rate is the
streaming itself and how much is the fused kernel's own.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from workbench.kernels import launch
from workbench.moe.packing import Int4Experts

# (16-byte loads in flight per thread, threads per CTA, CTAs per SM) of the read kernel's launch shapes timed
CONFIGS: tuple[tuple[int, int, int], ...] = ((2, 1024, 2), (4, 512, 4), (8, 512, 4), (8, 256, 8), (4, 1024, 2))
UNROLLS = (2, 4, 8)
NEVER = 0x9E3779B9   # the kernel writes sink[0] only where a thread's XOR equals this
_SINK: dict[int, torch.Tensor] = {}
_FIT: dict[tuple, int] = {}
RING_STAGES = (3, 4)
# (RS, CTAs per SM, rr) of the ring kernel timed by --ring: the CTA-split kernel's ring and occupancy with its
# static unit order, the same with equal flat shares, more CTAs per SM, a deeper ring
RING_CONFIGS: tuple[tuple[int, int, int], ...] = ((3, 5, 1), (3, 5, 0), (3, 7, 1), (4, 5, 1))
# row-key prefix per timing -> (samples key, distinct key, word in ours_pct_of_read_<word>)
TIMINGS = {"": ("ms", "distinct", "one"), "queued_": ("queued_ms", "queued_distinct", "queued"),
           "ingraph_": ("ingraph_ms", "ingraph_distinct", "ingraph")}

PREDICTION = (
    "Written before the first run (code of this commit): the read-only kernel at its best launch shape takes "
    "85-92% of the copy rate at M = 1 under one-replay timing and 90-97% in-graph, rising towards 95-100% by "
    "M = 16; so at M = 1 the fixed costs of streaming 200 MB in one launch explain at most a third of the "
    "dispatched kernel's gap to 80% of copy, and the fused kernel reaches 75-82% of the read ceiling's rate at "
    "M = 1 and 88-95% at M = 16. Refuted if the ceiling itself is below 80% of copy at M = 1 in-graph (then the "
    "goal is out of reach at M = 1 for any one-launch kernel) or if the fused kernel is within 5% of it.")

RING_PREDICTION = (
    "Written before the ring run (moe_diag_decomposition.json, c14a461: at M = 1 the dispatched kernel with its math "
    "and its h wait removed still takes 57.6 us in-graph against the read kernel's 47.5): the ring alone, at the "
    "CTA-split kernel's ring depth, occupancy and unit order (ring_rs3_b5_rr), runs at 95-100% of the read kernel's "
    "rate at M = 1-16, so the 10 us belong to the tasks (queue, block barriers, epilogues, fences, the prologue); "
    "equal flat shares (flat) gain at most 2% over rr. Refuted if ring_rs3_b5_rr is below 90% of the read kernel "
    "at M = 1 in-graph (then the ring itself is what the kernel must change).")

RING_SYNC_PREDICTION = (
    "Written before the run (moe_stream_ring.json, 8ca7468: the ring alone at 96-98% of the read kernel; "
    "moe_diag_decomposition.json: the dispatched kernel without math and h wait 10 us over the read kernel at M = 1 "
    "in-graph): a fence by lane 0 after each unit (_fence, about 5.8 per warp at M = 1) costs 3-6 us per call at "
    "M = 1 in-graph, a block barrier every 7 stages (_bar) 1-3 us; together (_fence_bar) 5-8 us, most of the 10. "
    "Refuted if _fence_bar costs under 3 us (then the tasks' cost lies elsewhere: the queue, the epilogue's stores "
    "and the activation loads).")


def timing_fields(label: str, t: dict[str, Any], bpe: int, m: int, copy_gbps: float, topk: int,
                  hidden: int) -> dict[str, float]:
    """A row's columns for one kernel timed three ways: ``<label>_ms_median`` / ``_queued_ms_median`` /
    ``_ingraph_ms_median`` and the matching ``_pct_of_copy`` (bench.pct_of_copy per sample, bench.in_graph_pct_of_copy
    of the in-graph median), from ``t`` holding the :data:`TIMINGS` keys (samples and the experts each touched)."""
    from workbench.moe.bench import in_graph_pct_of_copy, pct_of_copy

    out: dict[str, float] = {}
    for kind, (key, dist, _) in TIMINGS.items():
        med = statistics.median(t[key])
        out[f"{label}_{kind}ms_median"] = med
        out[f"{label}_{kind}pct_of_copy"] = (
            in_graph_pct_of_copy(t[dist], med, bpe, m, copy_gbps, topk, hidden) if kind == "ingraph_"
            else pct_of_copy(t[dist], t[key], bpe, m, copy_gbps, topk, hidden))
    return out


def _check_config(config: tuple[int, int, int]) -> None:
    u, threads, per_sm = config
    if u not in UNROLLS:
        raise ValueError(f"loads in flight per thread must be one of {UNROLLS}, got {u}")
    if threads % 32 or not 32 <= threads <= 1024:
        raise ValueError(f"threads per CTA must be a multiple of 32 in [32, 1024], got {threads}")
    if per_sm < 1 or per_sm * threads > 2048:
        raise ValueError(f"CTAs per SM x threads must be in [1, 2048] threads, got {per_sm} x {threads}")


def stream_touched(topk_ids: torch.Tensor, experts: Int4Experts, config: tuple[int, int, int] = (8, 512, 4),
                   check: bool = False) -> torch.Tensor:
    """Read every fragment word of the experts ``topk_ids`` touches, once; returns the sink, uint32 as int32 [3].

    topk_ids: int32 [M, k] (or any shape) on the GPU, entries in [0, E) (others ignored). ``config``: (16-byte
    loads in flight per thread, threads per CTA, CTAs per SM); the grid is CTAs per SM x SMs. With ``check``
    the sink is zeroed first and holds, after the kernel, [0 unless a thread's XOR hit NEVER, XOR of every word
    read, number of 16-byte words read] (tests compare them with the fragments); without it the sink is not
    touched (timing). No host synchronisation; capturable in a CUDA graph.
    """
    _check_config(config)
    if not topk_ids.is_cuda:
        raise ValueError("topk_ids must be a CUDA tensor")
    if experts.num_experts > 1024:
        raise ValueError(f"at most 1024 experts, got {experts.num_experts}")
    u, threads, per_sm = config
    gu, dn = experts.fragments()
    ngu, ndn = gu[0].numel() // 4, dn[0].numel() // 4   # uint4 per expert
    ids = topk_ids.reshape(-1)
    if ids.dtype != torch.int32:
        ids = ids.to(torch.int32)
    ids = ids.contiguous()
    dev = ids.device.index if ids.device.index is not None else torch.cuda.current_device()
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    grid = per_sm * sms
    most = min(ids.numel(), experts.num_experts) * (ngu + ndn) + grid * threads * u
    if most >= 1 << 32:
        raise ValueError(f"{ids.numel()} ids of experts of {ngu + ndn} words each exceed the kernel's 32-bit index")
    sink = _sink(ids)
    if check:
        sink.zero_()
    import numpy as np

    from workbench.moe.fused import _kernel

    launch(_kernel(f"moe_stream_touched_u{u}"), (grid,), (threads,),
           (gu, dn, ids, ids.numel(), experts.num_experts, np.uint32(ngu), np.uint32(ndn), np.uint32(NEVER),
            int(check), sink))
    return sink


RING_SPLITS_RULE = "ring"   # ctasplit_splits' rule for the ring kernel's units: the M = 1 kernel's split, (4, 2)


def _check_ring_config(config: tuple[int, ...]) -> None:
    if len(config) not in (3, 4):
        raise ValueError(f"a ring config is (RS, CTAs per SM, rr) or (RS, CTAs per SM, rr, sync), got {config}")
    rs, per_sm, rr = config[:3]
    sync = config[3] if len(config) == 4 else 0
    if sync not in (0, 1, 2, 3) or (sync & 1 and not rr):
        raise ValueError(f"sync must be 0-3 (bit 0: a fence per unit, rr only; bit 1: a block barrier every "
                         f"gate_up unit of stages), got {sync} with rr={rr}")
    if rs not in RING_STAGES:
        raise ValueError(f"ring stages must be one of {RING_STAGES}, got {rs}")
    if per_sm < 1:
        raise ValueError(f"CTAs per SM must be >= 1, got {per_sm}")
    if rr not in (0, 1):
        raise ValueError(f"rr must be 0 (equal flat shares) or 1 (units round robin), got {rr}")


def stream_ring(topk_ids: torch.Tensor, experts: Int4Experts, config: tuple[int, int, int] = (3, 5, 1),
                check: bool = False) -> torch.Tensor:
    """Read the touched experts' fragment words the way the CTA-split kernel does (``moe_stream_ring_rs<RS>``):
    per-warp rings of RS 2304-byte stages, in the kernel's units (K parts of a tile, split
    ``ctasplit_splits(H, I, RING_SPLITS_RULE)``), and nothing else. ``config``: (RS, CTAs per SM, rr: 1 = units
    round robin over the warps as the kernel's static first tasks, 0 = equal contiguous shares of stages[, sync:
    diagnostic costs added, bit 0 a fence by lane 0 after each unit (rr only), bit 1 a block barrier every gate_up
    unit's worth of stages]). Returns
    the sink as :func:`stream_touched`; at most 128 ids (the one-launch path's pairs)."""
    from workbench.moe.ctasplit import ctasplit_splits
    from workbench.moe.fused import SMALL_MAX_PAIRS, _kernel

    _check_ring_config(config)
    if not topk_ids.is_cuda:
        raise ValueError("topk_ids must be a CUDA tensor")
    if topk_ids.numel() > SMALL_MAX_PAIRS:
        raise ValueError(f"at most {SMALL_MAX_PAIRS} ids (the one-launch path's pairs), got {topk_ids.numel()}")
    rs, per_sm, rr = config[:3]
    sync = config[3] if len(config) == 4 else 0
    h, i = experts.hidden, experts.intermediate
    sgu, sdn = ctasplit_splits(h, i, RING_SPLITS_RULE)
    gu, dn = experts.fragments()
    ids = topk_ids.reshape(-1).to(torch.int32).contiguous()
    dev = ids.device.index if ids.device.index is not None else torch.cuda.current_device()
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    kern = _kernel(f"moe_stream_ring_rs{rs}")
    fits = _ring_fit(kern, rs)
    if per_sm > fits:
        raise ValueError(f"{per_sm} CTAs per SM of moe_stream_ring_rs{rs} do not fit (at most {fits})")
    sink = _sink(ids)
    if check:
        sink.zero_()
    import numpy as np

    launch(kern, (per_sm * sms,), (128,),
           (gu, dn, ids, ids.numel(), experts.num_experts, 2 * i // 16, h // 256, h // 256 // sgu, h // 16, i // 256,
            i // 256 // sdn, rr, sync, np.uint32(NEVER), int(check), sink))
    return sink


def _ring_fit(kern, rs: int) -> int:
    """CTAs per SM of the ring kernel that fit at once (CUDA occupancy API)."""
    key = ("ring", rs)
    if key not in _FIT:
        from cupy.cuda import driver

        fptr = getattr(kern, "ptr", None) or kern.kernel.ptr   # as fused._small_grid
        _FIT[key] = int(driver.occupancyMaxActiveBlocksPerMultiprocessor(fptr, 128, 0))
    return _FIT[key]


def _sink(ids: torch.Tensor) -> torch.Tensor:
    dev = ids.device.index if ids.device.index is not None else torch.cuda.current_device()
    sink = _SINK.get(dev)
    if sink is None:
        sink = _SINK[dev] = torch.zeros(3, dtype=torch.int32, device=ids.device)
    return sink


def expected_sink(topk_ids: torch.Tensor, experts: Int4Experts) -> tuple[int, int]:
    """(XOR of every 32-bit fragment word of the touched experts, their number of 16-byte words): what
    ``stream_touched(..., check=True)`` must leave in sink[1] and sink[2] (as uint32)."""
    import numpy as np

    gu, dn = experts.fragments()
    touched = sorted({int(e) for e in topk_ids.reshape(-1).tolist() if 0 <= int(e) < experts.num_experts})
    acc, words = 0, 0
    for e in touched:
        for t in (gu[e], dn[e]):
            a = t.reshape(-1).cpu().numpy().view(np.uint32)
            acc ^= int(np.bitwise_xor.reduce(a))
            words += a.size // 4
    return acc, words % (1 << 32)


# ----------------------------------------------------------------------------- timing

def _cfg_label(config: tuple[int, int, int]) -> str:
    return "read_u{}_t{}_b{}".format(*config)


def _ring_label(config: tuple[int, ...]) -> str:
    sync = config[3] if len(config) == 4 else 0
    return "ring_rs{}_b{}_{}".format(config[0], config[1], "rr" if config[2] else "flat") + \
        ("", "_fence", "_bar", "_fence_bar")[sync]


def time_read(experts: Int4Experts, banks: list[Int4Experts], m: int, routing: str, gen: torch.Generator,
              reps: int, config: tuple[int, int, int], topk: int = 8,
              kernel: Callable[..., torch.Tensor] | None = None) -> dict[str, Any]:
    """The read kernel (``kernel(ids, experts, config)``, default :func:`stream_touched`) as bench.time_ours times
    the fused path: one graph replay per sample with fresh routing
    (``ms``), the same with a sleep queued ahead (``queued_ms``), and IN_GRAPH_CALLS calls back to back in one
    graph over ``banks`` (``ingraph_ms``, per call), each call its own fresh routing. ``distinct`` lists per
    sample the experts touched."""
    from workbench.measure import capture_graphs, time_cuda, time_cuda_queued, time_in_graph
    from workbench.moe.bench import IN_GRAPH_CALLS, RoutingRotation, distinct_experts, make_routing

    e = experts.num_experts
    rot = RoutingRotation(m, e, topk, routing, gen, 2 * reps + 8)
    distinct, used, setup = rot.distinct, rot.used, rot.setup
    kernel = stream_touched if kernel is None else kernel
    [g] = capture_graphs([lambda: kernel(rot.ids, experts, config)])
    ms = time_cuda(g.replay, warmup=3, reps=reps, setup=setup)
    one_idx = used[3:]
    start = len(used)
    queued = time_cuda_queued(g.replay, warmup=3, reps=reps, setup=setup)
    queued_idx = used[start + 3:]
    del g
    ig_rts = [make_routing(m, e, topk, routing, gen)[0] for _ in range(IN_GRAPH_CALLS)]
    ig_ids = [r.cuda() for r in ig_rts]

    def make(i: int) -> Callable[[], None]:
        return lambda: kernel(ig_ids[i], banks[i % len(banks)], config)

    ig, calls = time_in_graph([make(i) for i in range(IN_GRAPH_CALLS)], reps, min_calls=IN_GRAPH_CALLS)
    return {"ms": ms, "distinct": [distinct[j] for j in one_idx], "queued_ms": queued,
            "queued_distinct": [distinct[j] for j in queued_idx], "ingraph_ms": ig,
            "ingraph_distinct": [distinct_experts(r) for r in ig_rts], "calls": calls}


def run_stream_ceiling(out_dir: str | Path | None, m_values=(1, 2, 4, 8, 16), routings=("uniform", "skewed"),
                       reps: int = 20, seed: int = 0, configs=CONFIGS, name: str = "moe_stream_ceiling",
                       prediction: str = PREDICTION, ring_configs=()) -> Path:
    """Per routing and M: the dispatched fused path (bench.time_ours with queued, bench.time_ours_in_graph) and
    the read kernel at every launch shape of ``configs`` (:func:`time_read`), in one process, with the copy
    bandwidth measured in the same run. Each row gives ms and % of copy (bench.bytes_moved, the fused path's
    byte count, for both) per timing, the fastest read shape per timing (``read_best_*``) and the fused path's
    share of it (``ours_pct_of_read_*``: read time / fused time). Checks: the read kernel's sink against
    :func:`expected_sink` once per M, the fused path's in-graph outputs against the reference. ``ring_configs``
    adds the ring kernel (:func:`stream_ring`) at those (RS, CTAs per SM, rr), columns ``ring_rs<RS>_b<n>_<rr|flat>_*``
    and ``<label>_pct_of_read_<timing>`` (the best read shape's time over its time), checked the same way. Writes
    ``<name>.json``."""
    from workbench.measure import write_measurement
    from workbench.moe.bench import KIMI, kimi_run, path_name, time_ours, time_ours_in_graph
    from workbench.moe.fused import SMALL_TABLE

    for c in configs:
        _check_config(tuple(c))
    for c in ring_configs:
        _check_ring_config(tuple(c))
    kernels = [(_cfg_label(tuple(c)), tuple(c), stream_touched) for c in configs]
    kernels += [(_ring_label(tuple(c)), tuple(c), stream_ring) for c in ring_configs]
    K, H = KIMI["topk"], KIMI["hidden"]
    gen, experts, banks, bpe, copy = kimi_run(seed)
    copy_gbps = copy["gb_per_s"]
    rows: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    samples: dict[str, Any] = {}


    for routing in routings:
        for m in m_values:
            row: dict[str, Any] = {"routing": routing, "m": m, "path": path_name(m, K)}
            ours = time_ours(experts, m, routing, gen, reps, eager_reps=0, queued=True)
            ig = time_ours_in_graph(banks, m, routing, gen, reps, topk=K)
            checks.append({**ig["check"], "label": "ours"})
            ours_t = {"ms": ours["ms"], "distinct": ours["distinct"], "queued_ms": ours["queued_ms"],
                      "queued_distinct": ours["queued_distinct"], "ingraph_ms": ig["ms"],
                      "ingraph_distinct": ig["distinct"]}
            samples[f"{routing}/m{m}/ours"] = ours_t
            row.update(timing_fields("ours", ours_t, bpe, m, copy_gbps, K, H))
            ids = ours["ids_all"][0].to(torch.int32)
            want = expected_sink(ids.cpu(), experts)
            for lab, c, kernel in kernels:
                sink = kernel(ids, experts, c, check=True).cpu().numpy().view("uint32")
                checks.append({"label": lab, "routing": routing, "m": m, "xor": int(sink[1]), "words": int(sink[2]),
                               "want_xor": want[0], "want_words": want[1],
                               "ok": int(sink[1]) == want[0] and int(sink[2]) == want[1]})
                t = time_read(experts, banks, m, routing, gen, reps, c, K, kernel=kernel)
                samples[f"{routing}/m{m}/{lab}"] = t
                row.update(timing_fields(lab, t, bpe, m, copy_gbps, K, H))
            for kind, (_, _, word) in TIMINGS.items():
                best = max((tuple(c) for c in configs), key=lambda c: row[f"{_cfg_label(c)}_{kind}pct_of_copy"])
                row[f"read_best_{kind}config"] = list(best)
                row[f"read_best_{kind}pct_of_copy"] = row[f"{_cfg_label(best)}_{kind}pct_of_copy"]
                for lab in ["ours"] + [_ring_label(tuple(c)) for c in ring_configs]:
                    row[f"{lab}_pct_of_read_{word}"] = (100 * row[f"{lab}_{kind}pct_of_copy"]
                                                        / row[f"read_best_{kind}pct_of_copy"])
            rows.append(row)
            print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()
                              if "best" in k or "_pct_of_read" in k or k in ("routing", "m")}), flush=True)
    params = {**KIMI, "m_values": list(m_values), "routings": list(routings), "reps": reps, "seed": seed,
              "configs": [list(c) for c in configs], "ring_configs": [list(c) for c in ring_configs],
              "ring_splits_rule": RING_SPLITS_RULE, "small_table": [[u, v] for u, v in SMALL_TABLE],
              "bytes_counted": "bench.bytes_moved (the fused path's count) for both kernels",
              "read_kernel": "moe_stream_touched_u<U> (moe_int4.cu), grid = CTAs per SM x SMs",
              "ring_kernel": "moe_stream_ring_rs<RS> (moe_int4.cu), 128 threads, grid = CTAs per SM x SMs"}
    return write_measurement(name, parameters=params,
                             results={"copy_gb_per_s": copy_gbps, "rows": rows, "checks": checks,
                                      "all_checks_ok": all(c["ok"] for c in checks)},
                             samples={"ceilings": {"copy": copy}, "timings": samples},
                             notes=prediction, out_dir=out_dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the JSON file")
    ap.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="moe_stream_ceiling")
    ap.add_argument("--configs", type=int, nargs="+", default=None,
                    help="read kernel shapes as flat triples U THREADS CTAS_PER_SM (default: CONFIGS)")
    ap.add_argument("--routings", nargs="+", default=["uniform", "skewed"])
    ap.add_argument("--ring", action="store_true", help="also time the ring kernel at RING_CONFIGS")
    ap.add_argument("--ring-configs", type=int, nargs="+", default=None,
                    help="ring kernel shapes as flat quads RS CTAS_PER_SM RR SYNC (implies --ring)")
    ap.add_argument("--prediction", default=None, help="notes of the file (default: PREDICTION)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("the streaming-read ceiling needs a CUDA GPU", file=sys.stderr)
        return 2
    configs = CONFIGS
    if args.configs:
        if len(args.configs) % 3:
            ap.error("--configs takes triples U THREADS CTAS_PER_SM")
        configs = tuple(tuple(args.configs[j:j + 3]) for j in range(0, len(args.configs), 3))
    ring_configs = RING_CONFIGS if args.ring else ()
    if args.ring_configs:
        if len(args.ring_configs) % 4:
            ap.error("--ring-configs takes quads RS CTAS_PER_SM RR SYNC")
        ring_configs = tuple(tuple(args.ring_configs[j:j + 4]) for j in range(0, len(args.ring_configs), 4))
        args.ring = True
    print(run_stream_ceiling(args.out, m_values=tuple(args.m), routings=tuple(args.routings), reps=args.reps, seed=args.seed, name=args.name,
                             configs=configs, ring_configs=ring_configs,
                             prediction=args.prediction or (RING_SYNC_PREDICTION if args.ring_configs else
                                                            RING_PREDICTION if args.ring else PREDICTION)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
