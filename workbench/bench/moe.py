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

The parts: :mod:`workbench.bench.moe_counts` (routing draws, distinct experts, bytes and FLOPs),
:mod:`workbench.bench.moe_timing` (timing the dispatched path, one replay and in one graph),
:mod:`workbench.bench.moe_peers` (the torch peers); this module checks the kernels and runs the benchmark.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from workbench.bench.moe_counts import (KIMI, REL_TOL, ROUTINGS, SKEW_ALPHA, bytes_moved, flops, make_routing,
                                        plateau_m, rel_error)
from workbench.bench.moe_peers import checked_peers, time_peer
from workbench.bench.moe_timing import IN_GRAPH_PARAMS, capture_graph, in_graph_fields, pct_of_copy, time_ours
from workbench.dispatch import dispatch_for
from workbench.measure import (graph_launch_latency, measure_bf16_matmul_tflops, measure_copy_bandwidth,
                               write_measurement)
from workbench.moe.fused import (FOUR_LAUNCH, FRAG_VARIANTS, LARGE_VARIANTS, SMALL_KERNELS, SMALL_MAX_PAIRS,
                                 fused_moe_int4, moe_plan, variant_name)
from workbench.moe.packing import Int4Experts, random_int4_experts
from workbench.moe.reference import moe_reference

M_VALUES = (1, 2, 4, 8, 9, 16, 32, 64, 128, 256, 512, 1024)


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
    g = capture_graph(lambda: held.__setitem__("out", fused_moe_int4(x, s_ids, s_w, experts, validate=False)))
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
    peers, peer_errors = checked_peers(packed, gen, checks) if include_peers else ({}, {})
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
            pms = time_peer(fg, fd, t["x"], t["ids_all"], t["w_all"], I, peer_reps if m <= 64 else
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
