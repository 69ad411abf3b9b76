"""Timeline of the CTA-split one-launch MoE kernel (``moe_small_ctasplit``, dispatched at M = 1).

A diagnostic build of workbench/kernels/moe_int4.cu (``-DMOE_TRACE``; the default build's SASS is unchanged)
writes ``%globaltimer`` (ns) into the module global ``moe_trace``: per CTA (thread 0) kernel entry, end of the
prologue, exit; per task (up to :data:`TASKS`) the task number, warp 0's wait for h (down tasks), when its
stages begin and when the task's block barrier releases, each warp's arrival at that barrier, and the epilogue
warp's epilogue begin, fence begin, counter published (fence + atomic done) and epilogue end. :func:`decode`
turns the raw words into per-CTA records and :func:`summarize` into the numbers that say where a call's time
goes: how long until every CTA has started, the prologue, task durations per phase, how far apart the warps
arrive at each barrier and whether the last one is the previous task's epilogue warp, the epilogue and fence
durations, the waits of down tasks for their item's h, when the last gate/up task ended, and the tail.

Run on the device (writes ``moe_ctasplit_trace.json``)::

    python -m workbench.moe.trace --m 1 2 --out DIR

``decode`` and ``summarize`` are plain NumPy and run anywhere (tests/test_moe_trace.py).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from workbench.kernels import KERNEL_DIR

TRACE_OPTIONS = ("-DMOE_TRACE",)
TASKS = 64            # MOE_TRACE_TASKS in moe_int4.cu
TW = 12               # MOE_TRACE_TW: words per task
HEADER = 4
WORDS = HEADER + TW * TASKS
MAX_CTAS = 2048       # MOE_TRACE_CTAS
BIN_US = 1.0          # width of the busy-CTA histogram bins


def check_constants(source: Path = KERNEL_DIR / "moe_int4.cu") -> None:
    """Fail loudly if the kernel's trace layout differs from this module's (TASKS, WORDS, MAX_CTAS)."""
    text = source.read_text()
    want = {"MOE_TRACE_TASKS": TASKS, "MOE_TRACE_TW": TW, "MOE_TRACE_CTAS": MAX_CTAS}
    for name, value in want.items():
        line = f"#define {name} {value}"
        if line not in text:
            raise RuntimeError(f"{source.name} does not define '{line}': workbench/moe/trace.py is out of date")
    if "#define MOE_TRACE_WORDS (4 + MOE_TRACE_TW * MOE_TRACE_TASKS)" not in text:
        raise RuntimeError(f"{source.name}: MOE_TRACE_WORDS is no longer 4 + MOE_TRACE_TW * MOE_TRACE_TASKS")


def decode(raw: np.ndarray, ctas: int, gate_up_tasks: int) -> list[dict[str, Any]]:
    """Per-CTA records from the raw trace words.

    raw: uint64 [>= ctas * WORDS] (the module global after one launch, zeroed before it); ctas: the launch's
    grid; gate_up_tasks: task numbers below it are gate/up tasks (the kernel's ``t_gu``). Returns, per CTA,
    ``entry``, ``prologue_end``, ``exit`` (ns), ``tasks_taken`` and ``tasks``: dicts with ``task``, ``phase``
    ("gate_up" / "down"), ``wait_begin``, ``stages_begin``, ``barrier``, ``arrive`` (4 warps), ``epi_begin``,
    ``fence_begin``, ``published``, ``epi_end`` (ns). Raises if a CTA left a word unwritten (a launch that did
    not run, or more tasks than the trace holds).
    """
    if not 0 < ctas <= MAX_CTAS:
        raise ValueError(f"ctas must be in 1..{MAX_CTAS}, got {ctas}")
    words = np.asarray(raw, dtype=np.uint64).reshape(-1)
    if words.size < ctas * WORDS:
        raise ValueError(f"raw trace has {words.size} words, {ctas} CTAs need {ctas * WORDS}")
    w = words[: ctas * WORDS].reshape(ctas, WORDS).astype(np.int64)
    out = []
    for c in range(ctas):
        entry, pro, ex, taken = (int(v) for v in w[c, :HEADER])
        if min(entry, pro, ex) <= 0:
            raise ValueError(f"CTA {c}: header words unwritten (entry {entry}, prologue {pro}, exit {ex})")
        if taken > TASKS:
            raise ValueError(f"CTA {c} took {taken} tasks; the trace holds {TASKS} (raise MOE_TRACE_TASKS)")
        tasks = []
        for j in range(taken):
            v = [int(x) for x in w[c, HEADER + TW * j: HEADER + TW * (j + 1)]]
            if min(v[1:]) <= 0:
                raise ValueError(f"CTA {c} task slot {j}: times unwritten")
            tasks.append({"task": v[0], "phase": "gate_up" if v[0] < gate_up_tasks else "down",
                          "wait_begin": v[1], "stages_begin": v[2], "barrier": v[3], "arrive": v[4:8],
                          "epi_begin": v[8], "fence_begin": v[9], "published": v[10], "epi_end": v[11]})
        out.append({"entry": entry, "prologue_end": pro, "exit": ex, "tasks_taken": taken, "tasks": tasks})
    return out


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Where one call's time went, in microseconds from the first CTA's entry (t = 0).

    span: first entry to last exit; entry_spread: last CTA's entry; prologue_median / _max: entry to the end
    of the prologue; first_stages_median: when CTAs begin their first task's stages; task_us_median per
    phase (stages begin to barrier, warp 0's view); down_wait_us: total and per-CTA-max time warp 0 waited
    for an item's h; last_gate_up_barrier / first_down_stages; exit_median and tail (last exit - median exit);
    busy_fraction: CTA-time inside a task's stages / (CTAs x span); busy_ctas: CTAs inside a task per BIN_US bin;
    per phase: arrive_spread_us_median (last minus first warp at a task's barrier), last_is_prev_epilogue
    (fraction of tasks j >= 1 whose last warp to arrive did task j - 1's epilogue), epilogue_us_median and
    fence_us_median (fence begin to counter published).
    """
    if not records:
        raise ValueError("no CTA records")
    t0 = min(r["entry"] for r in records)

    def us(t: int) -> float:
        return (t - t0) / 1e3

    span = max(us(r["exit"]) for r in records)
    dur: dict[str, list[float]] = {"gate_up": [], "down": []}
    waits_per_cta, busy = [], 0.0
    nbins = int(np.ceil(span / BIN_US)) + 1
    busy_ctas = np.zeros(nbins)
    for r in records:
        wsum = 0.0
        for t in r["tasks"]:
            a, b = us(t["stages_begin"]), us(t["barrier"])
            dur[t["phase"]].append(b - a)
            busy += b - a
            if t["phase"] == "down":
                wsum += us(t["stages_begin"]) - us(t["wait_begin"])
            lo, hi = int(a // BIN_US), int(b // BIN_US)
            busy_ctas[lo:hi + 1] += 1
        waits_per_cta.append(wsum)
    spread: dict[str, list[float]] = {"gate_up": [], "down": []}
    epi: dict[str, list[float]] = {"gate_up": [], "down": []}
    fence: dict[str, list[float]] = {"gate_up": [], "down": []}
    lastprev: dict[str, list[bool]] = {"gate_up": [], "down": []}
    for r in records:
        for j, t in enumerate(r["tasks"]):
            ph = t["phase"]
            spread[ph].append((max(t["arrive"]) - min(t["arrive"])) / 1e3)
            epi[ph].append((t["epi_end"] - t["epi_begin"]) / 1e3)
            fence[ph].append((t["published"] - t["fence_begin"]) / 1e3)
            if j >= 1:
                lastprev[ph].append(int(np.argmax(t["arrive"])) == (j - 1) % 4)
    gu_bar = [us(t["barrier"]) for r in records for t in r["tasks"] if t["phase"] == "gate_up"]
    dn_start = [us(t["stages_begin"]) for r in records for t in r["tasks"] if t["phase"] == "down"]
    exits = [us(r["exit"]) for r in records]
    firsts = [us(r["tasks"][0]["stages_begin"]) for r in records if r["tasks"]]
    return {
        "ctas": len(records), "span_us": span,
        "entry_spread_us": max(us(r["entry"]) for r in records),
        "prologue_us_median": _med([(r["prologue_end"] - r["entry"]) / 1e3 for r in records]),
        "prologue_us_max": max((r["prologue_end"] - r["entry"]) / 1e3 for r in records),
        "first_stages_us_median": _med(firsts),
        "tasks": {ph: len(v) for ph, v in dur.items()},
        "tasks_per_cta_max": max(r["tasks_taken"] for r in records),
        "task_us_median": {ph: _med(v) for ph, v in dur.items()},
        "task_us_p90": {ph: (float(np.percentile(v, 90)) if v else None) for ph, v in dur.items()},
        "down_wait_us_total": float(sum(waits_per_cta)), "down_wait_us_cta_max": max(waits_per_cta),
        "last_gate_up_barrier_us": max(gu_bar) if gu_bar else None,
        "first_down_stages_us": min(dn_start) if dn_start else None,
        "exit_us_median": _med(exits), "tail_us": span - statistics.median(exits),
        "busy_fraction": busy / (len(records) * span) if span > 0 else None,
        "arrive_spread_us_median": {ph: _med(v) for ph, v in spread.items()},
        "last_is_prev_epilogue": {ph: (sum(v) / len(v) if v else None) for ph, v in lastprev.items()},
        "epilogue_us_median": {ph: _med(v) for ph, v in epi.items()},
        "fence_us_median": {ph: _med(v) for ph, v in fence.items()},
        "bin_us": BIN_US, "busy_ctas": busy_ctas.tolist(),
    }


# ----------------------------------------------------------------------------- on the device

def trace_call(experts, m: int, routing: str, gen, topk: int = 8,
               variant: str = "ctasplit") -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One traced call of a CTA-split kernel (a fused.SMALL_VARIANTS key of that form) at M tokens, fresh
    routing; (records, call facts)."""
    import cupy
    import torch

    from workbench.kernels import load_module
    from workbench.moe import fused
    from workbench.moe.bench import make_routing
    from workbench.moe.ctasplit import ctasplit_splits

    check_constants()
    ids, w = make_routing(m, experts.num_experts, topk, routing, gen)
    x = torch.randn(m, experts.hidden, generator=gen).to(torch.bfloat16).cuda()
    mod = load_module(fused.FAMILY, options=TRACE_OPTIONS)
    buf = cupy.ndarray((MAX_CTAS * WORDS,), dtype=cupy.uint64, memptr=mod.get_global("moe_trace"))
    with fused.forced_small_variant(variant):
        torch.cuda.synchronize()
        buf.fill(0)
        cupy.cuda.Device().synchronize()
        out = torch.empty(m, experts.hidden, dtype=torch.bfloat16, device="cuda")
        fused._fused_small(x, ids.cuda(), w.cuda(), experts, out, options=TRACE_OPTIONS)
        torch.cuda.synchronize()
        raw = cupy.asnumpy(buf)
    kname, spec = fused.SMALL_VARIANTS[variant]
    ctas = fused.small_grid(kname + "".join(TRACE_OPTIONS))
    items = fused.work_items(ids, experts.num_experts)
    sgu, sdn = ctasplit_splits(experts.hidden, experts.intermediate, spec[1])
    t_gu = items * (experts.intermediate // 8) * sgu // 4
    t_dn = items * (experts.hidden // 16) * sdn // 4
    recs = decode(raw, ctas, t_gu)
    taken = sum(r["tasks_taken"] for r in recs)
    if taken != t_gu + t_dn:
        raise RuntimeError(f"trace holds {taken} tasks, the call has {t_gu} + {t_dn}")
    facts = {"items": items, "splits": [sgu, sdn], "gate_up_tasks": t_gu, "down_tasks": t_dn, "ctas": ctas,
             "distinct_experts": int(torch.unique(ids).numel()), "output_finite": bool(torch.isfinite(out).all())}
    return recs, facts


def _time_kernel(experts, m: int, routing: str, gen, options: tuple[str, ...], reps: int,
                 per_graph: int = 10, variant: str = "ctasplit") -> list[float]:
    """ms per call of a CTA-split kernel alone: a CUDA graph of ``per_graph`` calls back to back (one routing),
    replayed ``reps`` times with CUDA events; each sample is a replay's time / ``per_graph``."""
    import torch

    from workbench.moe import fused
    from workbench.moe.bench import make_routing

    ids, w = make_routing(m, experts.num_experts, 8, routing, gen)
    ids, w = ids.cuda(), w.cuda()
    x = torch.randn(m, experts.hidden, generator=gen).to(torch.bfloat16).cuda()
    out = torch.empty(m, experts.hidden, dtype=torch.bfloat16, device="cuda")
    with fused.forced_small_variant(variant):
        fused._fused_small(x, ids, w, experts, out, options=options)   # warm: compile, grid, workspace
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side), torch.cuda.graph(g, stream=side):
            for _ in range(per_graph):
                fused._fused_small(x, ids, w, experts, out, options=options)
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        ms = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b) / per_graph)
    return ms


def run(out_dir: str | Path | None, m_values=(1, 2), routings=("uniform", "skewed"), calls: int = 5,
        reps: int = 20, seed: int = 0, variants=("ctasplit",), name: str = "moe_ctasplit_trace") -> Path:
    """Trace ``calls`` calls per (routing, M) at Kimi shapes; time the traced and the default build beside them."""
    import torch

    from workbench.measure import write_measurement
    from workbench.moe.bench import KIMI
    from workbench.moe.packing import random_int4_experts

    ex = random_int4_experts(KIMI["num_experts"], KIMI["hidden"], KIMI["intermediate"], device="cuda", seed=seed)
    gen = torch.Generator().manual_seed(seed)
    rows, samples = [], {}
    for variant, routing, m in ((v, r, m) for v in variants for r in routings for m in m_values):
        trace_call(ex, m, routing, gen, variant=variant)   # warm: compile, grid, fragments
        sums, facts = [], []
        for _ in range(calls):
            recs, f = trace_call(ex, m, routing, gen, variant=variant)
            s = summarize(recs)
            sums.append(s)
            facts.append(f)
        plain = _time_kernel(ex, m, routing, gen, (), reps, variant=variant)
        traced = _time_kernel(ex, m, routing, gen, TRACE_OPTIONS, reps, variant=variant)
        keys = ("span_us", "entry_spread_us", "prologue_us_median", "first_stages_us_median",
                "down_wait_us_cta_max", "last_gate_up_barrier_us", "first_down_stages_us", "exit_us_median",
                "tail_us", "busy_fraction")
        row = {"variant": variant, "routing": routing, "m": m, "calls": calls,
               **{k: statistics.median([s[k] for s in sums if s[k] is not None]) for k in keys},
               "gate_up_task_us_median": statistics.median([s["task_us_median"]["gate_up"] for s in sums]),
               "down_task_us_median": statistics.median([s["task_us_median"]["down"] for s in sums]),
               **{f"{ph}_{k}": statistics.median([s[k][ph] for s in sums if s[k][ph] is not None])
                  for ph in ("gate_up", "down")
                  for k in ("arrive_spread_us_median", "last_is_prev_epilogue", "epilogue_us_median",
                            "fence_us_median")},
               "tasks_per_cta_max": max(s["tasks_per_cta_max"] for s in sums),
               "ctas": facts[0]["ctas"], "splits": facts[0]["splits"],
               "gate_up_tasks_median": statistics.median([f["gate_up_tasks"] for f in facts]),
               "down_tasks_median": statistics.median([f["down_tasks"] for f in facts]),
               "outputs_finite": all(f["output_finite"] for f in facts),
               "kernel_ms_median_default_build": statistics.median(plain),
               "kernel_ms_median_traced_build": statistics.median(traced)}
        rows.append(row)
        samples[f"{variant}/{routing}/m{m}"] = {"summaries": sums, "facts": facts, "default_ms": plain, "traced_ms": traced}
        print(f"{variant:12s} {routing:8s} M={m:2d} span {row['span_us']:.1f} us (graph, per call: default {1e3 * row['kernel_ms_median_default_build']:.1f}, "
              f"traced {1e3 * row['kernel_ms_median_traced_build']:.1f}); first stages {row['first_stages_us_median']:.1f}; "
              f"last gate_up {row['last_gate_up_barrier_us']:.1f}; exit median {row['exit_us_median']:.1f}, "
              f"tail {row['tail_us']:.1f}; busy {row['busy_fraction']:.2f}; arrive spread gu/dn "
              f"{row['gate_up_arrive_spread_us_median']:.2f}/{row['down_arrive_spread_us_median']:.2f}; last is prev "
              f"epilogue {row['gate_up_last_is_prev_epilogue']:.2f}/{row['down_last_is_prev_epilogue']:.2f}; epilogue "
              f"{row['gate_up_epilogue_us_median']:.2f}/{row['down_epilogue_us_median']:.2f}; fence "
              f"{row['gate_up_fence_us_median']:.2f}/{row['down_fence_us_median']:.2f}", flush=True)
    params = {**KIMI, "m_values": list(m_values), "routings": list(routings), "calls": calls, "reps": reps,
              "seed": seed, "variants": {v: fused_kernel(v) for v in variants}, "build": " ".join(TRACE_OPTIONS),
              "clock": "%globaltimer (ns), thread 0 of each CTA (warp 0's view of each task)",
              "timing": "kernel_ms_*: a CUDA graph of 10 calls back to back (one routing), replays timed with CUDA "
                        "events, per call = replay / 10; spans are %globaltimer, first CTA entry to last CTA exit"}
    return write_measurement(name, parameters=params, results={"rows": rows}, samples=samples,
                             notes=None, out_dir=out_dir)


def fused_kernel(variant: str) -> str:
    """Kernel name of a one-launch variant."""
    from workbench.moe.fused import SMALL_VARIANTS

    return SMALL_VARIANTS[variant][0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.moe.trace", description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--variants", nargs="+", default=["ctasplit"], help="CTA-split kernels (fused.SMALL_VARIANTS keys)")
    ap.add_argument("--name", default="moe_ctasplit_trace", help="measurement name (file NAME.json)")
    ap.add_argument("--out", default=None, help="folder for moe_ctasplit_trace.json (default data/measurements/<gpu>)")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("the trace needs a CUDA GPU (it runs the kernel's diagnostic build)", file=sys.stderr)
        return 2
    for m in args.m:
        if not 0 < m * 8 <= 128:
            print(f"--m {m}: the one-launch kernel takes M * 8 <= 128", file=sys.stderr)
            return 2
    from workbench.moe.fused import SMALL_VARIANTS

    for v in args.variants:
        if v not in SMALL_VARIANTS or SMALL_VARIANTS[v][1] is None or SMALL_VARIANTS[v][1][0] != "cta":
            print(f"--variants {v}: not a CTA-split kernel; choose from "
                  f"{sorted(k for k, s in SMALL_VARIANTS.items() if s[1] and s[1][0] == 'cta')}", file=sys.stderr)
            return 2
    print(f"wrote {run(args.out, tuple(args.m), calls=args.calls, reps=args.reps, variants=tuple(args.variants), name=args.name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
