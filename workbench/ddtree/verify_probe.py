"""Where the time of one tree-verify call goes: per-launch timings, the cost of a graph node, chunking.

:func:`verify_attention` is three launches (prepare: offsets, chunk starts and ancestor masks; the
attention kernel; the log-sum-exp merge of the chunk partials). This probe answers, on the GPU,
how much of a call each launch takes and how much is the graph itself:

- :func:`record_launches` - the launches of one call, recorded (kernel, grid, block, arguments,
  shared memory) while they run, so that each can be replayed alone.
- :func:`launch_breakdown` - CUDA-graph replay times (medians, KV rotated over several input sets as
  the benchmark does) of each launch alone and of the whole call, for the default kernel and for
  any ``-D`` variants; plus the replay time of a graph of one and of three minimal kernel nodes
  (a one-element add), the floor a launch cannot go under.
- :func:`chunk_sweep` - whole-call times over chunk lengths (keys per thread block): more chunks
  mean more fp32 partials written and merged, fewer mean more tiles per block.

``python -m workbench.ddtree.verify_probe --out DIR`` writes ``DIR/ddtree_verify_probe.json`` (``--name``
another name; rewritten after every point, so a run cut short keeps its points) and prints a table
last; ``--ncu`` instead runs each point's call once between ``cudaProfilerStart`` / ``Stop`` (for
``ncu --profile-from-start off``: per-kernel ``gpu__time_duration``).
"""
from __future__ import annotations

import argparse
import math
from typing import Any, Sequence

from workbench.ddtree import verify as V
from workbench.ddtree import verify_bench as VB

__all__ = ["record_launches", "launch_breakdown", "chunk_sweep", "probe_table"]

_STAGES = ("prepare", "attention", "merge")


def record_launches(inputs: dict[str, Any], **kw) -> dict[str, tuple]:
    """Run ``verify_attention(**inputs, check=False, **kw)`` once (CUDA tensors) and return its
    launches as ``{stage: (kernel, grid, block, args, shared_mem)}`` (stages ``prepare`` (absent in the
    single-request form without it), ``attention``, ``merge``); the tuples keep the workspace tensors
    alive, so each launch can be replayed alone afterwards."""
    from workbench.kernels import launch

    rec: list[tuple] = []
    real = V._launch

    def recorder(kernel, grid, block, args, shared_mem=0):
        rec.append((kernel, grid, block, args, shared_mem))
        return launch(kernel, grid, block, args, shared_mem=shared_mem)

    V._launch = recorder
    try:
        V.verify_attention(**inputs, check=False, **kw)
    finally:
        V._launch = real
    if len(rec) not in (2, 3):
        raise RuntimeError(f"expected 2 or 3 launches ([prepare,] attention, merge), recorded {len(rec)}")
    return dict(zip(_STAGES[3 - len(rec):], rec))


def _replay_ms(fns: Sequence[Any], reps: int) -> list[float]:
    samples, mode = VB._time_rotating(fns, reps, 5, graph=True)
    if mode != "cuda_graph":
        raise RuntimeError(f"graph capture failed: {mode}")
    return samples


def _input_sets(heads: int, prefix: int, nodes: int, seed: int, n_sets: int | None = None) -> list[dict[str, Any]]:
    """Fresh random bf16 inputs; by default enough sets that a rotation reads 3x the 60 MB L2."""
    import torch

    kv_bytes = (prefix + nodes) * V.D_KV * 2
    if n_sets is None:
        n_sets = int(min(16, max(2, math.ceil(3 * (60 << 20) / max(kv_bytes, 1)))))
    return [V.random_verify_inputs(nodes, heads, prefix, torch.bfloat16, "cuda", seed=seed + 7919 * s, cache_factor=1.0)
            for s in range(n_sets)]


def launch_breakdown(heads: int, prefix: int, nodes: int = 33, variants: dict[str, dict[str, Any]] | None = None,
                     reps: int = 40, seed: int = 0, in_graph: bool = False) -> dict[str, Any]:
    """Replay times (ms, medians) of each launch of one call alone and of the whole call.

    ``variants``: name -> keyword arguments of :func:`verify_attention` (default ``{"default": {}}``).
    ``in_graph``: also each launch alone and the whole call captured back to back in one graph
    (:func:`workbench.measure.time_in_graph`, keys ``<stage>_in_graph``, ``call_in_graph``): their device time
    without the replay's own cost.
    Returns ``{"points": {variant: {"prepare" (None without that launch), "attention", "merge", "sum",
    "call"} medians},
    "samples": {...}}``."""
    from workbench.kernels import launch
    from workbench.measure import median, time_in_graph

    variants = variants or {"default": {}}
    sets = _input_sets(heads, prefix, nodes, seed)
    res: dict[str, Any] = {}
    samples: dict[str, Any] = {}
    for name, kw in variants.items():
        try:
            recs = [record_launches(st, **kw) for st in sets]
        except Exception as e:  # noqa: BLE001 - a variant that fails is recorded, the probe goes on
            import torch

            torch.cuda.synchronize()
            res[name] = {k: None for k in (*_STAGES, "call", "sum")}
            res[name]["failed"] = f"{type(e).__name__}: {str(e).strip()[:300]}"
            continue
        per: dict[str, float | None] = {}

        def timed(key: str, fns: list) -> None:  # one replay per sample, and back to back in one graph if asked
            s = _replay_ms(fns, reps)
            samples[f"{name}.{key}"] = s
            per[key] = median(s)
            if in_graph:
                s, _ = time_in_graph(fns, max(10, reps // 2))
                samples[f"{name}.{key}_in_graph"] = s
                per[f"{key}_in_graph"] = median(s)

        for stage in _STAGES:
            if stage not in recs[0]:
                per[stage] = None  # no such launch (single request without prepare)
                continue
            timed(stage, [lambda r=r[stage]: launch(r[0], r[1], r[2], r[3], shared_mem=r[4]) for r in recs])
        timed("call", [lambda st=st: V.verify_attention(**st, check=False, **kw) for st in sets])
        per["sum"] = sum(per[k] or 0.0 for k in _STAGES)
        res[name] = per
    return {"heads": heads, "prefix": prefix, "nodes": nodes, "kv_sets": len(sets), "points": res,
            "samples": samples}


def minimal_nodes(reps: int = 200) -> dict[str, Any]:
    """Replay time of a CUDA graph of 1 and of 3 dependent minimal kernel nodes (a one-element add)."""
    import torch

    from workbench.measure import median

    x = torch.zeros(1, device="cuda")
    out = {}
    for n in (1, 3):
        def fn(n=n):
            for _ in range(n):
                x.add_(1.0)
        s = _replay_ms([fn], reps)
        out[f"nodes_{n}_ms"] = median(s)
        out[f"nodes_{n}_samples"] = s
    return out


def chunk_sweep(heads: int, prefix: int, chunk_lens: Sequence[int | None], nodes: int = 33, reps: int = 40,
                seed: int = 0, **kw) -> list[dict[str, Any]]:
    """Whole-call replay times over chunk lengths (``None``: the planner's choice), with the grid."""
    import torch

    from workbench.measure import median

    sets = _input_sets(heads, prefix, nodes, seed)
    M = nodes * heads
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for cl in chunk_lens:
        rb, clen, n_chunks = V._plan(prefix, 1, nodes, M, 64, sms, cl)
        s = _replay_ms([lambda st=st: V.verify_attention(**st, check=False, chunk_len=cl, **kw) for st in sets], reps)
        rows.append(dict(heads=heads, prefix=prefix, chunk_len=clen, planner=cl is None, row_blocks=rb,
                         chunks=-(-(prefix + nodes) // clen), tiles_per_block=-(-clen // 64),
                         median_ms=median(s), samples=s))
    return rows


def probe_table(results: dict[str, Any]) -> str:
    """Plain-text table of the breakdown and the chunk sweep."""
    ig = ("attention_in_graph", "merge_in_graph", "call_in_graph")
    lines = [f"{'H':>3} {'P':>7} {'variant':<18} {'prepare':>8} {'attn':>8} {'merge':>8} {'sum':>8} {'call':>8}"
             f" {'attn ig':>8} {'merge ig':>8} {'call ig':>8}  (ms; ig: in-graph)"]
    for b in results.get("breakdown", []):
        for name, v in b["points"].items():
            cells = " ".join(f"{v[k]:>8.4f}" if v.get(k) is not None else f"{'-':>8}"
                             for k in ("prepare", "attention", "merge", "sum", "call", *ig))
            if v.get("failed"):
                cells += f"  FAILED: {v['failed'][:80]}"
            label = name if b.get("nodes", 33) == 33 else f"{name} T={b['nodes']}"
            lines.append(f"{b['heads']:>3} {b['prefix']:>7} {label:<18} {cells}")
    mn = results.get("minimal_nodes")
    if mn:
        lines.append(f"graph of 1 minimal node {mn['nodes_1_ms']:.4f} ms, of 3 nodes {mn['nodes_3_ms']:.4f} ms")
    sweep = results.get("chunk_sweep", [])
    if sweep:
        lines.append(f"{'H':>3} {'P':>7} {'chunk':>6} {'chunks':>6} {'tiles':>5} {'ms':>8}")
        for r in sweep:
            lines.append(f"{r['heads']:>3} {r['prefix']:>7} {r['chunk_len']:>6} {r['chunks']:>6} "
                         f"{r['tiles_per_block']:>5} {r['median_ms']:>8.4f}{'  (planner)' if r['planner'] else ''}")
    return "\n".join(lines)


def _parse_variants(specs: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``name=-DX=1,-DY=0`` -> {name: {"_options": (...)}}; a token ``impl:KIND`` among the options picks
    the kernel (``m=impl:mma,-DX=1``); a bare name of the benchmark's named variants
    (``verify_bench._named_variants()``: ``WGMMA_VARIANTS``, ``mma``...) -> its keywords; any other bare
    name (``default``) -> {}."""
    out: dict[str, dict[str, Any]] = {}
    named = VB._named_variants()
    for spec in specs:
        name, _, opts = spec.partition("=")
        if not name:
            raise SystemExit(f"bad variant {spec!r}: want NAME or NAME=-DX=1,-DY=2")
        if opts:
            toks = [o for o in opts.split(",") if o]
            kw: dict[str, Any] = {"_options": tuple(o for o in toks if not o.startswith("impl:"))}
            impls = [o[len("impl:"):] for o in toks if o.startswith("impl:")]
            if len(impls) > 1:
                raise SystemExit(f"bad variant {spec!r}: at most one impl:KIND")
            if impls:
                kw["impl"] = impls[0]
            out[name] = kw
        else:
            out[name] = dict(named.get(name, {}))
    return out


CLOCK_PREDICTION = (
    "Written before the run: the MoE kernel's clock probe (moe_clock_probe.json) found the H200 at its 700 W cap with "
    "any kernel back to back for seconds. The verify kernel is compute-bound from H = 64; its in-graph figure (25 "
    "replays of 16 calls, about half a second at H = 64 128k) runs under that cap, while the floor's bf16 rate "
    "(measure_bf16_matmul_tflops: 10 GEMMs, about 15 ms) does not. Predicted: back to back for 3 s, the cuBLAS GEMM's "
    "rate in the second half is at least 10% below its first replays' and its SM clock below 1800 MHz; the verify "
    "kernel at H = 64, P = 128k slows by at least 5% from its first replays to the second half, at H = 8 by less. "
    "Refuted if the GEMM's second-half rate is within 5% of its first replays'.")


def run_clock_probe(out_dir: Any = None, heads: Sequence[int] = (64, 8), prefix: int = 131072, nodes: int = 33,
                    seconds: float = 3.0, n: int = 8192, name: str = "ddtree_verify_clock_probe",
                    prediction: str = CLOCK_PREDICTION) -> Any:
    """SM clock, power and per-call time with one kind of call back to back for ``seconds`` (measure.clock_phases):
    the floor's bf16 GEMM (n x n x n, 4 per graph) and :func:`verify_attention` at each H of ``heads`` at ``prefix``
    (16 calls per graph, rotating input sets as the benchmark does). Rows add the GEMM's TFLOP/s (first replays and
    second half) and the committed short-run rate for comparison. Writes ``<name>.json``."""
    import torch

    from workbench.measure import capture_graphs, clock_phases, measure_bf16_matmul_tflops, write_measurement

    mm = measure_bf16_matmul_tflops(n)
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    phases_fn = [(f"gemm_bf16_{n}", lambda: [torch.matmul(a, b, out=c) for _ in range(4)], 4)]
    sets = {}
    for H in heads:
        sets[H] = _input_sets(H, prefix, nodes, 0)

        def calls(H=H):
            for i in range(16):
                V.verify_attention(**sets[H][i % len(sets[H])], check=False)
        phases_fn.append((f"verify_h{H}_p{prefix}", calls, 16))
    graphs = capture_graphs([fn for _, fn, _ in phases_fn])
    rows, raw = clock_phases([(label, g.replay, k) for (label, _, k), g in zip(phases_fn, graphs)], seconds)
    flop = 2 * n ** 3
    for r in rows:
        if r["phase"].startswith("gemm"):
            r["first5_tflops"] = flop / (r["first5_ms_per_call"] * 1e-3) / 1e12
            r["second_half_tflops"] = flop / (r["second_half_ms_per_call"] * 1e-3) / 1e12
        r["slowdown_pct"] = 100 * (r["second_half_ms_per_call"] / r["first5_ms_per_call"] - 1)
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}, flush=True)
    params = {"heads": list(heads), "prefix": prefix, "nodes": nodes, "seconds": seconds, "gemm_n": n,
              "gemm_per_graph": 4, "verify_calls_per_graph": 16, "smi_period_ms": 20}
    return write_measurement(name, parameters=params, out_dir=out_dir,
                             results={"rows": rows, "idle_sm_mhz_median": raw["idle_sm_mhz_median"],
                                      "short_run_bf16_tflops": mm["tflops"]},
                             samples={**{k: raw[k] for k in ("smi", "windows", "per_call_ms")},
                                      "short_run_matmul_ms": mm["samples_ms"]},
                             notes=prediction)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.ddtree.verify_probe", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for ddtree_verify_probe.json (default: data/measurements/<gpu>)")
    ap.add_argument("--points", nargs="+", default=["8:4096", "8:131072", "64:4096", "64:131072"],
                    help="H:P (or H:P:T, T tree nodes; default 33) points of the breakdown")
    ap.add_argument("--variants", nargs="+", default=["default"],
                    help="NAME=-DX=1,-DY=2 (kernel -D options; a token impl:KIND picks the kernel), a named "
                         "variant of verify_bench (WGMMA_VARIANTS, mma, ...), or default")
    ap.add_argument("--sweep", nargs="*", default=["8:4096:128,256,384,512,1024", "8:16384:384,1024,2048",
                                                     "64:4096:256,512,2112,4160"],
                    help="H:P:chunk,chunk,... (the planner's choice is always added)")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--name", default="ddtree_verify_probe", help="measurement name (DIR/NAME.json)")
    ap.add_argument("--extra-notes", default="", help="text appended to the file's notes")
    ap.add_argument("--ncu", action="store_true", help="one call per point and variant inside cudaProfilerStart/Stop")
    ap.add_argument("--clocks", action="store_true", help="run_clock_probe instead (ddtree_verify_clock_probe.json)")
    ap.add_argument("--in-graph", action="store_true",
                    help="also time each launch and the call back to back in one graph (launch_breakdown in_graph)")
    args = ap.parse_args(argv)
    if args.clocks:
        print(run_clock_probe(args.out))
        return 0

    import torch

    from workbench.kernels import require_gpu
    from workbench.measure import write_measurement

    require_gpu("verify_probe")
    variants = _parse_variants(args.variants)
    points = [tuple(int(x) for x in p.split(":")) for p in args.points]  # H:P or H:P:T (T tree nodes, default 33)
    if any(len(p) not in (2, 3) for p in points):
        raise SystemExit(f"--points are H:P or H:P:T, got {args.points}")
    if args.ncu:
        for H, P, *nt in points:
            for name, kw in variants.items():
                st = _input_sets(H, P, nt[0] if nt else 33, 0, n_sets=1)[0]
                V.verify_attention(**st, check=False, **kw)  # compile, warm
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
                V.verify_attention(**st, check=False, **kw)
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
                print(f"ncu point H={H} P={P} variant={name}", flush=True)
        return 0
    results: dict[str, Any] = {"minimal_nodes": minimal_nodes(), "breakdown": [], "chunk_sweep": []}

    def key(b):
        return f"H{b['heads']}_P{b['prefix']}" + (f"_T{b['nodes']}" if b.get("nodes", 33) != 33 else "")

    def write(complete: bool):
        """The file as it stands (rewritten after every point: a run cut short keeps its points)."""
        res = {k: v for k, v in results.items() if k not in ("breakdown", "chunk_sweep", "minimal_nodes")}
        res["minimal_nodes"] = {k: v for k, v in results["minimal_nodes"].items() if not k.endswith("samples")}
        res["breakdown"] = [{k: v for k, v in b.items() if k != "samples"} for b in results["breakdown"]]
        res["chunk_sweep"] = [{k: v for k, v in r.items() if k != "samples"} for r in results["chunk_sweep"]]
        res["complete"] = complete
        samples = {"minimal_nodes": {k: v for k, v in results["minimal_nodes"].items() if k.endswith("samples")},
                   "breakdown": {key(b): b["samples"] for b in results["breakdown"]},
                   "chunk_sweep": [r["samples"] for r in results["chunk_sweep"]]}
        return write_measurement(args.name, out_dir=args.out,
                                 parameters=dict(points=args.points, variants=args.variants, sweep=args.sweep,
                                                 reps=args.reps, in_graph=args.in_graph),
                                 results=res, samples=samples,
                                 notes=PROBE_NOTES + (" " + args.extra_notes if args.extra_notes else ""))

    for H, P, *nt in points:
        results["breakdown"].append(launch_breakdown(H, P, nodes=nt[0] if nt else 33, variants=variants,
                                                     reps=args.reps, in_graph=args.in_graph))
        print(probe_table({"breakdown": results["breakdown"][-1:]}), flush=True)
        write(False)
    for spec in args.sweep:
        H, P, cl = spec.split(":")
        lens = [None] + [int(c) for c in cl.split(",") if c]
        results["chunk_sweep"] += chunk_sweep(int(H), int(P), lens, reps=args.reps)
    path = write(True)
    print(f"wrote {path}")
    print(probe_table(results))
    return 0


PROBE_NOTES = (
    "Breakdown of one verify_attention call (bf16, 33 nodes) into its launches, each captured alone in a CUDA graph "
    "and replayed (KV rotated over several input sets, as the benchmark does); 'call' is the whole call as one graph, "
    "'sum' the launches alone added (prepare null: the single-request form without that launch); minimal_nodes: a "
    "graph of 1 and of 3 one-element adds. chunk_sweep: whole-call times over chunk lengths (keys per thread block; "
    "planner = the default choice). Diagnostic builds (timing only, wrong outputs): -DVERIFY_WG_DIAG=1 the tile "
    "gathers alone (no S, softmax or P.V), -DVERIFY_WG_DIAG=2 the compute alone (no tile gathered after the first). "
    "Per 64-key tile = (attention at 128k - attention at 16k) / (tiles per block at 128k - at 16k).")


if __name__ == "__main__":
    raise SystemExit(main())
