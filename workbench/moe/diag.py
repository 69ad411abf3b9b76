"""Diagnostic probes of the one-launch MoE path: ``python -m workbench.moe.diag --out DIR``.

Two questions the streaming-read ceiling (:mod:`workbench.moe.ceiling`, ``moe_stream_ceiling.json``) left:

- **Where does M = 1 lose to the ceiling?** :func:`run_decomposition` times the dispatched kernel in diagnostic
  builds of moe_int4.cu beside the default build and the read kernel, in one process: ``-DMOE_DIAG_NOMATH``
  keeps every load of the stage loop (weights through the ring, scales, activations) and replaces its math
  by one add; ``-DMOE_DIAG_NOWAIT`` drops the down tasks' wait for their item's h; ``-DMOE_DIAG_NOACT``
  replaces the stage loop's activation loads (X for gate_up, h for down) by values made from their addresses. Their outputs are wrong by
  design (their in-graph checks are recorded, not required); only their times mean something.
- **Why are back-to-back calls slower in-graph at M >= 8** (the read kernel is not)? :func:`run_clock_probe`
  keeps one kind of call running for a few seconds per phase while ``nvidia-smi`` samples the SM clock, power
  and the clock-event reasons every 20 ms, and records every replay's time, so the per-call time over the
  phase can be read beside the clocks.

Both write a measurement file with the prediction written before the run as its notes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from workbench.moe import fused

BUILDS: dict[str, tuple[str, ...]] = {
    "default": (),
    "nomath": ("-DMOE_DIAG_NOMATH",),
    "nowait": ("-DMOE_DIAG_NOWAIT",),
    "nomath_nowait": ("-DMOE_DIAG_NOMATH", "-DMOE_DIAG_NOWAIT"),
    "noact": ("-DMOE_DIAG_NOACT",),
    "nomath_nowait_noact": ("-DMOE_DIAG_NOMATH", "-DMOE_DIAG_NOWAIT", "-DMOE_DIAG_NOACT"),
}
# builds of frag_gemm, the stage loop of version 3, the split-K and the phased kernels (run 29c: the phased pair's
# breakdown per build, workbench.moe.phased --builds): its math replaced by one add (the loads kept), and with "noact";
# run 29d splits the math: frag_step's dequantisation kept and its mma replaced by one add ("nomma_frag"), or the
# mma kept on the raw words ("nodeq_frag")
FRAG_BUILDS: dict[str, tuple[str, ...]] = {
    "nomath_frag": ("-DMOE_DIAG_NOMATH_FRAG",),
    "nomath_frag_noact": ("-DMOE_DIAG_NOMATH_FRAG", "-DMOE_DIAG_NOACT"),
    "nomma_frag": ("-DMOE_DIAG_NOMMA_FRAG",),
    "nodeq_frag": ("-DMOE_DIAG_NODEQ_FRAG",),
}
ALL_BUILDS = {**BUILDS, **FRAG_BUILDS}
# the decomposition's second run: which part of the task structure costs the 8 us the ring kernel does not pay
BUILDS_ACT = {k: BUILDS[k] for k in ("default", "nomath_nowait", "noact", "nomath_nowait_noact")}
# The kernel the NOMATH / NOWAIT builds change (the CTA-split kernel's stage loop and h wait; dispatched at M = 1 when
# runs 24-27 used them): the decomposition forces it, whatever fused.SMALL_TABLE dispatches now.
DIAG_VARIANT = "ctasplit_x4e_r3fst"
READ_CONFIG = (8, 512, 4)   # the read kernel's launch shape fastest at most rows of moe_stream_ceiling.json

DECOMPOSITION_PREDICTION = (
    "Written before the run (moe_stream_ceiling.json at 3800460: at M = 1, uniform, the dispatched kernel takes "
    "64.8 us per call in-graph, the read kernel 46.8 us): the stage loop's math costs most of the 18 us: the NOMATH "
    "build takes 50-56 us in-graph at M = 1 (9-15 us less than the default) and comes within 10% of the read "
    "kernel at M = 16 under queued timing; NOWAIT is within 2 us of the default at M = 1 and 2. Refuted if NOMATH "
    "saves less than 5 us at M = 1 (then the task structure, not the math, is what M = 1 pays for).")

DECOMPOSITION_ACT_PREDICTION = (
    "Written before the second decomposition run (moe_stream_ring_sync.json, 34d3c1d: the ring with a fence per unit "
    "and a block barrier every 7 stages is still at 94-96% of the read kernel, while the dispatched kernel without "
    "math and h wait is 10 us over it at M = 1 in-graph): the stage loop's activation loads (issued after a stage's "
    "last step, waited for at the next stage's first) are most of that: nomath_nowait_noact within 4 us of the read "
    "kernel at M = 1 in-graph (6+ us faster than nomath_nowait), noact alone 2-5 us faster than the default. "
    "Refuted if nomath_nowait_noact is less than 3 us faster than nomath_nowait.")

CLOCK_PREDICTION = (
    "Written before the run: the in-graph slowdown at M >= 8 (moe_stream_ceiling.json: M = 16 uniform at 94% of "
    "copy queued, 79% in-graph; the read kernel 108.5% / 108.8%) is the board's power limit: with the fused kernel "
    "at M = 16 back to back for seconds, the median SM clock falls at least 10% below the read kernel's phase and "
    "a power-related clock-event reason is active, and the per-call time of the first replays is within 5% of the "
    "queued time, rising over the first tenth of a second; with a sleep after every call the clock stays within 5% "
    "of the maximum. M = 1 back to back: clock within 5% of the maximum. Refuted if the SM clock of the fused "
    "phase at M = 16 is within 5% of the read phase's.")


# ----------------------------------------------------------------------------- decomposition

def run_decomposition(out_dir: str | Path | None, m_values=(1, 2, 16), routing: str = "uniform", reps: int = 20,
                      seed: int = 0, builds: dict[str, tuple[str, ...]] | None = None,
                      name: str = "moe_diag_decomposition", prediction: str = DECOMPOSITION_PREDICTION) -> Path:
    """Per M: the one-launch kernel :data:`DIAG_VARIANT` in each build of ``builds`` (default :data:`BUILDS`) and the read
    kernel (:data:`READ_CONFIG`), one replay / queued / in-graph, % of copy by bench.bytes_moved for all; each
    row also gives every build's in-graph time minus the read kernel's (``<build>_ingraph_over_read_us``)."""
    from workbench.measure import write_measurement
    from workbench.moe.bench import KIMI, kimi_run, time_ours, time_ours_in_graph
    from workbench.moe.ceiling import time_read, timing_fields

    builds = BUILDS if builds is None else builds
    K, H = KIMI["topk"], KIMI["hidden"]
    gen, experts, banks, bpe, copy = kimi_run(seed)
    copy_gbps = copy["gb_per_s"]
    rows, checks, samples = [], [], {}

    for m in m_values:
        row: dict[str, Any] = {"routing": routing, "m": m, "path": f"small_{DIAG_VARIANT}"}
        t = time_read(experts, banks, m, routing, gen, reps, READ_CONFIG, K)
        samples[f"m{m}/read"] = t
        row.update(timing_fields("read", t, bpe, m, copy_gbps, K, H))
        for build, options in builds.items():
            with fused.forced_small_variant(DIAG_VARIANT), fused.diagnostic_build(options):
                o = time_ours(experts, m, routing, gen, reps, eager_reps=0, queued=True)
                ig = time_ours_in_graph(banks, m, routing, gen, reps, topk=K)
            checks.append({**ig["check"], "build": build, "required": build == "default"})
            samples[f"m{m}/{build}"] = {"ms": o["ms"], "distinct": o["distinct"], "queued_ms": o["queued_ms"],
                                        "queued_distinct": o["queued_distinct"], "ingraph_ms": ig["ms"],
                                        "ingraph_distinct": ig["distinct"]}
            row.update(timing_fields(build, samples[f"m{m}/{build}"], bpe, m, copy_gbps, K, H))
            row[f"{build}_ingraph_over_read_us"] = 1e3 * (row[f"{build}_ingraph_ms_median"]
                                                          - row["read_ingraph_ms_median"])
        rows.append(row)
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items() if "median" in k or k == "m"},
              flush=True)
    params = {**KIMI, "m_values": list(m_values), "routing": routing, "reps": reps, "seed": seed,
              "builds": {k: list(v) for k, v in builds.items()}, "read_config": list(READ_CONFIG),
              "small_table": [[u, v] for u, v in fused.SMALL_TABLE]}
    required = [c for c in checks if c["required"]]
    return write_measurement(name, parameters=params,
                             results={"copy_gb_per_s": copy_gbps, "rows": rows, "checks": checks,
                                      "all_required_checks_ok": all(c["ok"] for c in required)},
                             samples={"ceilings": {"copy": copy}, "timings": samples}, notes=prediction,
                             out_dir=out_dir)


# ----------------------------------------------------------------------------- clocks

def run_clock_probe(out_dir: str | Path | None, m_hi: int = 16, seconds: float = 2.0, seed: int = 0,
                    gap_cycles: int = 400_000, name: str = "moe_clock_probe",
                    prediction: str = CLOCK_PREDICTION) -> Path:
    """Phases of about ``seconds`` each, 1 s idle between them, nvidia-smi sampling throughout: the fused path
    in-graph at M = ``m_hi`` (IN_GRAPH_CALLS calls back to back per replay over the two weight sets), the read
    kernel likewise, the fused path with a sleep of ``gap_cycles`` after every call, the fused path in-graph at
    M = 1. Per phase: per-call ms of the first 5 replays and of the second half, and the median SM clock, power,
    the union of the clock-event reasons over the samples inside the phase (its first 10% excluded)."""
    from workbench.measure import capture_graphs, clock_phases, write_measurement
    from workbench.moe.bench import IN_GRAPH_CALLS, KIMI, kimi_banks, make_routing
    from workbench.moe.ceiling import stream_touched

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    E, K, H = KIMI["num_experts"], KIMI["topk"], KIMI["hidden"]
    _, banks = kimi_banks(seed)

    def routed(m: int) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        rts = [make_routing(m, E, K, "uniform", gen) for _ in range(IN_GRAPH_CALLS)]
        return [r[0].cuda() for r in rts], [r[1].cuda() for r in rts], torch.randn(m, H, device="cuda").bfloat16()

    def fused_calls(m: int, gap: int = 0) -> Callable[[], None]:
        ids, ws, x = routed(m)

        def run() -> None:
            for i in range(IN_GRAPH_CALLS):
                fused.fused_moe_int4(x, ids[i], ws[i], banks[i % 2], validate=False)
                if gap:
                    torch.cuda._sleep(gap)
        return run

    def read_calls(m: int) -> Callable[[], None]:
        ids, _, _ = routed(m)

        def run() -> None:
            for i in range(IN_GRAPH_CALLS):
                stream_touched(ids[i], banks[i % 2], READ_CONFIG)
        return run

    phases = [(f"fused_m{m_hi}", fused_calls(m_hi)), (f"read_m{m_hi}", read_calls(m_hi)),
              (f"fused_m{m_hi}_gap", fused_calls(m_hi, gap_cycles)), ("fused_m1", fused_calls(1)),
              ("read_m1", read_calls(1))]
    graphs = capture_graphs([fn for _, fn in phases])
    rows, raw = clock_phases([(label, g.replay, IN_GRAPH_CALLS) for (label, _), g in zip(phases, graphs)], seconds)
    for r in rows:
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}, flush=True)
    params = {"m_hi": m_hi, "seconds": seconds, "seed": seed, "gap_cycles": gap_cycles,
              "in_graph_calls": IN_GRAPH_CALLS, "read_config": list(READ_CONFIG), "smi_period_ms": 20,
              "small_table": [[u, v] for u, v in fused.SMALL_TABLE]}
    return write_measurement(name, parameters=params,
                             results={"rows": rows, "idle_sm_mhz_median": raw["idle_sm_mhz_median"]},
                             samples={k: raw[k] for k in ("smi", "windows", "per_call_ms")},
                             notes=prediction, out_dir=out_dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the JSON files")
    ap.add_argument("--decompose", action="store_true", help="run_decomposition")
    ap.add_argument("--act", action="store_true", help="the decomposition at BUILDS_ACT (moe_diag_decomposition_act)")
    ap.add_argument("--clocks", action="store_true", help="run_clock_probe")
    ap.add_argument("--m", type=int, nargs="+", default=[1, 2, 16], help="M values of the decomposition")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=2.0, help="length of each clock-probe phase")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("the diagnostic probes need a CUDA GPU", file=sys.stderr)
        return 2
    if not (args.decompose or args.clocks):
        ap.error("choose --decompose and/or --clocks")
    if args.clocks:
        print(run_clock_probe(args.out, seconds=args.seconds))
    if args.decompose:
        if args.act:
            print(run_decomposition(args.out, m_values=tuple(args.m), reps=args.reps, builds=BUILDS_ACT,
                                    name="moe_diag_decomposition_act", prediction=DECOMPOSITION_ACT_PREDICTION))
        else:
            print(run_decomposition(args.out, m_values=tuple(args.m), reps=args.reps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
