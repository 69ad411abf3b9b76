"""Measure the DDTree kernels on a GPU: each checked against its reference, then timed against its peers.

    python -m workbench.bench.ddtree [--part all|tree|verify] [--out DIR] [--quick]
    python -m workbench.bench.ddtree --sanitize          # every kernel once, small: the compute-sanitizer driver
    python -m workbench.bench.ddtree --sanitizer-logs D  # record D/memcheck.log, D/racecheck.log runs of the driver

``tree`` writes ``DIR/ddtree_kernels.json`` (default ``data/measurements/<gpu>``): the tree build
(the dispatched builder and the other one, budgets 8-1024) against the CPU heapq reference timed in the
same run, accept, both commits, visibility and top-k log-probs, each as a CUDA-graph replay and as an
eager call, every build output checked bit for bit against the reference first (``results.parity``),
and the composed round (no host sync, graph equals eager). ``verify`` writes ``DIR/ddtree_verify.json``:
verify attention (the dispatched kernel, and ``mma`` beside ``wgmma`` where that is the dispatch) at
heads x prefix points against naive torch, SDPA with a dense mask and FlexAttention, and against the floor
max(bytes / copy bandwidth, flops / bf16 matmul rate) measured in the same process; every point's output
is checked against the float64 reference first. Both files carry provenance (GPU, driver, CUDA, torch,
CuPy, commit, date), parameters and raw samples.
"""
from __future__ import annotations

import argparse
import math
import time
from typing import Any, Sequence

import numpy as np
import torch

from workbench.bench.verify_peers import PEERS
from workbench.ddtree.compose import capture_round, check_no_host_sync, ddtree_round, make_toy_problem
from workbench.ddtree.reference import accept_greedy, build_tree, topk_logprobs
from workbench.ddtree.tree_gpu import (SMALL_MAX_NODES, accept_greedy_batched, build_trees, commit_compact,
                                       commit_scattered, dispatched_build_method, tree_visibility)
from workbench.ddtree.verify import (D_KV, D_LATENT, dispatched_impl, random_verify_inputs, verify_attention,
                                     verify_attention_batched, verify_attention_reference)
from workbench.decode import DEFAULT
from workbench.kernels import cuda_errors, require_gpu
from workbench.measure import (capture_graphs, measure_bf16_matmul_tflops, measure_copy_bandwidth, median, time_cpu,
                               time_cuda, time_in_graph, write_measurement)
from workbench.sanitizer import read_logs, stated_count, summary_lines

__all__ = ["random_grid", "check_tree_kernels", "timing_rows", "benchmark_tree_kernels", "benchmark_round", "verify_floor",
           "check_verify", "benchmark_verify", "sanitize_driver", "read_sanitizer_logs", "main"]

# Output-vs-float64 bound of the verify check, ||out - ref|| / ||ref|| and max |lse - ref| (tests use
# tests/tolerances.py's per-element bounds).
VERIFY_CHECK = {"bfloat16": (1e-2, 2e-3), "float32": (2e-5, 1e-4)}
SANITIZER_TOOLS = ("memcheck", "racecheck")
SANITIZER_COMMAND = ("compute-sanitizer --tool {tool} --kernel-name kns=ddtree_ "
                     "python -m workbench.bench.ddtree --sanitize")


def _median(x) -> float:
    return float(np.median(np.asarray(x)))


def random_grid(rng: np.random.Generator, B: int, L: int, K: int, quant: int | None = None):
    """Fresh random tree inputs: float32 log-probs ``[B, L, K]`` in (-6, 0], rows sorted descending
    (``quant``: rounded to 1/quant so that ties occur; 0: all equal), int64 token ids in the K2.6 vocabulary."""
    lp = -rng.random((B, L, K)) * 6.0
    if quant == 0:
        lp = np.zeros_like(lp)
    elif quant:
        lp = np.round(lp * quant) / quant
    lp = -np.sort(-lp, axis=-1)
    return lp.astype(np.float32), rng.integers(0, 163840, size=(B, L, K)).astype(np.int64)


# ----------------------------------------------------------------------------- tree kernels

def _methods(n_nonroot: int) -> list[str]:
    return (["small"] if n_nonroot <= SMALL_MAX_NODES else []) + ["heap"]


def check_tree_kernels(points: Sequence[tuple[int, int, int, int]], seed: int = 0,
                       device: str = "cuda") -> list[dict[str, Any]]:
    """Rows ``{kernel, shapes, cases, bit_exact, passed}``: at each (batch, L, K, budget) point every
    applicable builder against :func:`build_tree`, then visibility, accept and both commits against the
    references. Integer outputs and the float32 scores must match bit for bit. ``device="cpu"``: the
    wrappers' CPU path (``build_trees[auto]`` only)."""
    rng = np.random.default_rng(seed)
    dev = torch.device(device)
    rows = []
    for B, L, K, budget in points:
        lp, ids = random_grid(rng, B, L, K, 4)
        roots = rng.integers(0, 163840, size=B)
        refs = [build_tree(lp[b], ids[b], budget, root_token=int(roots[b])) for b in range(B)]
        n = refs[0].n
        shape = f"B={B} L={L} K={K} budget={budget} ties"
        lpg, idg = torch.from_numpy(lp).to(dev), torch.from_numpy(ids).to(dev)
        for method in _methods(n - 1) if dev.type == "cuda" else ["auto"]:
            trees = build_trees(lpg, idg, budget, root_tokens=torch.from_numpy(roots).to(dev), method=method)
            got = {f: getattr(trees, f).cpu().numpy() for f in ("tokens", "parents", "depths", "ranks", "scores")}
            ok = all(np.array_equal(got[f][b], getattr(refs[b], f)) for b in range(B)
                     for f in ("tokens", "parents", "depths", "ranks"))
            ok &= all(got["scores"][b].tobytes() == refs[b].scores.tobytes() for b in range(B))
            rows.append(dict(kernel=f"build_trees[{method}]", shapes=shape, cases=B, bit_exact=ok, passed=ok))
        vis = tree_visibility(trees.parents).cpu().numpy()
        ok = all(np.array_equal(vis[b], refs[b].visibility()) for b in range(B))
        rows.append(dict(kernel="tree_visibility", shapes=f"B={B} n={n}", cases=B, bit_exact=ok, passed=ok))
        small = rng.integers(0, 3, size=(B, L, K))  # a tiny vocabulary: long accepts, children sharing tokens
        trees_s = build_trees(lpg, torch.from_numpy(small).to(dev), budget)
        am = rng.integers(0, 3, size=(B, n))
        acc = accept_greedy_batched(trees_s, torch.from_numpy(am).to(dev))
        slots = rng.permutation(B * n * 2)[: B * n].reshape(B, n).astype(np.int64)
        keep, freed, nfree = (t.cpu().numpy() for t in commit_scattered(torch.from_numpy(slots).to(dev), acc))
        nodes, lens, bonus = acc.nodes.cpu().numpy(), acc.lengths.cpu().numpy(), acc.bonus.cpu().numpy()
        acc_ok = com_ok = True
        for b in range(B):
            a = accept_greedy(build_tree(lp[b], small[b], budget), am[b])
            acc_ok &= (lens[b] == a.length and bonus[b] == a.bonus and nodes[b, :a.length].tolist() == a.nodes.tolist()
                       and bool(np.all(nodes[b, a.length:] == -1)))
            rest = np.delete(slots[b], a.nodes)
            com_ok &= (keep[b, :a.length].tolist() == slots[b, a.nodes].tolist() and bool(np.all(keep[b, a.length:] == -1))
                       and nfree[b] == rest.size and freed[b, :rest.size].tolist() == rest.tolist())
        rows.append(dict(kernel="accept_greedy_batched", shapes=f"B={B} n={n}", cases=B, bit_exact=bool(acc_ok),
                         passed=bool(acc_ok)))
        rows.append(dict(kernel="commit_scattered", shapes=f"B={B} n={n}", cases=B, bit_exact=bool(com_ok),
                         passed=bool(com_ok)))
        kv = torch.randn(2, B * n, 576, device=dev).to(torch.bfloat16)
        before = kv.cpu().clone()
        cs = torch.arange(B * n, device=dev).view(B, n)
        commit_compact(kv, cs, acc, cs[:, 0].contiguous(), slot_dim=1)
        after, ok = kv.cpu(), True
        for b in range(B):
            ln = int(lens[b])
            ok &= bool(torch.equal(after[:, b * n: b * n + ln], before[:, b * n + torch.from_numpy(nodes[b, :ln])]))
            ok &= bool(torch.equal(after[:, b * n + ln: (b + 1) * n], before[:, b * n + ln: (b + 1) * n]))
        rows.append(dict(kernel="commit_compact", shapes=f"B={B} n={n} 2x576 bf16", cases=B, bit_exact=ok, passed=ok))
    return rows


def timing_rows(device: str = "cuda", batch: int = 8, L: int = 7, budget: int = DEFAULT.budget, verify_nodes: int = 9,
                verify_heads: int = 2, verify_prefix: int = 256, verify_dtype: str = "float32",
                seed: int = 0) -> list[dict[str, Any]]:
    """A quick look in this process (not a measurement file): tree build and accept against the CPU
    references, verify attention against its peers; medians of CUDA events (GPU) or wall time (CPU) around
    one Python call, launch included. Rows ``{op, impl, shapes, median_ms, x CPU reference, status}``."""
    dev = torch.device(device)
    clock = (lambda f, r=20: _median(time_cuda(f, warmup=3, reps=r))) if dev.type == "cuda" else \
        (lambda f, r=5: _median(time_cpu(f, warmup=1, reps=r)))
    rng = np.random.default_rng(seed)
    lp, ids = random_grid(rng, batch, L, budget)
    small = rng.integers(0, 2, size=ids.shape)
    shape = f"B={batch} L={L} K={budget} budget={budget}"
    cpu_build = _median(time_cpu(lambda: [build_tree(lp[b], ids[b], budget) for b in range(batch)], warmup=1, reps=5))
    lpg, idg = torch.from_numpy(lp).to(dev), torch.from_numpy(ids).to(dev)
    t = clock(lambda: build_trees(lpg, idg, budget))
    n = build_trees(lpg, idg, budget).n
    what = f"build_trees ({dispatched_build_method(n - 1) if dev.type == 'cuda' else 'CPU path'})"
    rows = [dict(op="build", impl="CPU reference (heapq)", shapes=shape, median_ms=cpu_build),
            dict(op="build", impl=what, shapes=shape, median_ms=t, **{"x CPU reference": cpu_build / t})]
    trees = build_trees(lpg, torch.from_numpy(small).to(dev), budget)
    am = torch.from_numpy(rng.integers(0, 2, size=(batch, trees.n))).to(dev)
    cpu_trees, am_np = [trees.tree(b) for b in range(batch)], am.cpu().numpy()
    cpu_acc = _median(time_cpu(lambda: [accept_greedy(cpu_trees[b], am_np[b]) for b in range(batch)], warmup=1, reps=20))
    t = clock(lambda: accept_greedy_batched(trees, am))
    rows += [dict(op="accept", impl="CPU reference", shapes=f"B={batch} n={trees.n}", median_ms=cpu_acc),
             dict(op="accept", impl="accept_greedy_batched", shapes=f"B={batch} n={trees.n}", median_ms=t,
                  **{"x CPU reference": cpu_acc / t})]
    inp = random_verify_inputs(verify_nodes, verify_heads, verify_prefix, verify_dtype, dev, seed=seed)
    shape = f"T={verify_nodes} H={verify_heads} P={verify_prefix} {verify_dtype}"
    for name, fn in [("verify_attention", verify_attention), *PEERS.items()]:
        if name == "flex_attention" and dev.type == "cpu":
            rows.append(dict(op="verify", impl=name, shapes=shape, status="not run on a CPU (torch.compile)"))
            continue
        try:
            rows.append(dict(op="verify", impl=name, shapes=shape, median_ms=clock(lambda fn=fn: fn(**inp)), status="ok"))
        except (*cuda_errors(), ValueError, NotImplementedError) as e:  # a peer that cannot run these shapes
            rows.append(dict(op="verify", impl=name, shapes=shape, status=f"{type(e).__name__}: {str(e)[:80]}"))
    return rows


def _graph_time_ms(fn, inner: int = 20, reps: int = 30) -> list[float]:
    """Per-call device time: ``inner`` calls captured in one CUDA graph, replayed."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    return [t / inner for t in time_cuda(g.replay, warmup=3, reps=reps)]


def benchmark_tree_kernels(batch: int = 64, L: int = DEFAULT.block - 1, budget: int = DEFAULT.budget,
                           budgets: Sequence[int] = (8, 32, 128, 512, 1024), vocab: int = 163840,
                           seed: int = 0) -> dict[str, Any]:
    """Build / accept / commit / visibility / top-k timed on the GPU (graph replay and eager call), the
    CPU references in the same run. Build keys: ``build_B{batch}_L{L}_budget{b}`` is the dispatched
    builder, ``..._{method}`` the other one. Returns ``{"results", "samples"}``."""
    rng = np.random.default_rng(seed)
    res: dict[str, Any] = {}
    samples: dict[str, Any] = {}

    def both(key, gpu_fn, cpu_ms=None, cpu_fn=None, cpu_reps=5):
        e, g = time_cuda(gpu_fn, warmup=10, reps=50), _graph_time_ms(gpu_fn)
        samples[key] = {"gpu_eager_ms": e, "gpu_graph_ms": g}
        out = {"gpu_eager_ms": _median(e), "gpu_graph_ms": _median(g)}
        if cpu_fn is not None:
            samples[key]["cpu_ms"] = c = time_cpu(cpu_fn, warmup=1, reps=cpu_reps)
            cpu_ms = _median(c)
        if cpu_ms is not None:
            out.update(cpu_ms=cpu_ms, speedup_graph=cpu_ms / out["gpu_graph_ms"],
                       speedup_eager=cpu_ms / out["gpu_eager_ms"])
        res[key] = out
        return out

    for bud in sorted(set(budgets) | {budget}):
        K = bud if bud == budget else min(bud, 64)
        lp, ids = random_grid(rng, batch, L, K)
        lpg, idg = torch.from_numpy(lp).cuda(), torch.from_numpy(ids).cuda()
        n = build_trees(lpg, idg, bud).n
        auto = dispatched_build_method(n - 1)
        cpu_ms = None
        for method in [auto] + [m for m in _methods(n - 1) if m != auto]:
            key = f"build_B{batch}_L{L}_budget{bud}" + ("" if method == auto else f"_{method}")
            cpu = (lambda lp=lp, ids=ids, bud=bud: [build_tree(lp[b], ids[b], bud) for b in range(batch)])
            out = both(key, lambda m=method, lpg=lpg, idg=idg, bud=bud: build_trees(lpg, idg, bud, method=m),
                       cpu_ms, None if cpu_ms is not None else cpu, 5 if bud <= 128 else 2)
            cpu_ms = out["cpu_ms"]
            out.update(batch=batch, L=L, K=K, budget=bud, method=method)

    # "small": time against the number of pops at a fixed grid (fixed part = intercept, one pop = slope)
    lp, ids = random_grid(rng, batch, L, 32)
    lpg, idg = torch.from_numpy(lp).cuda(), torch.from_numpy(ids).cuda()
    sweep = [dict(method="small", budget=b, K=b, pops=b,
                  gpu_graph_ms=_median(_graph_time_ms(lambda b=b: build_trees(lpg, idg, b, method="small"))))
             for b in (1, 2, 4, 8, 16, 32)]
    res[f"build_pops_sweep_B{batch}_L{L}"] = sweep
    slope, icpt = np.polyfit([r["pops"] for r in sweep], [r["gpu_graph_ms"] * 1e3 for r in sweep], 1)
    res["build_pops_fit_small"] = {"us_per_pop": float(slope), "fixed_us": float(icpt), "ns_per_pop": float(slope * 1e3)}
    tiny = torch.zeros(64, device="cuda")
    res["graph_node_floor"] = {"graph_us_per_call": _median(_graph_time_ms(tiny.zero_)) * 1e3,
                               "what": "torch zero_ of 64 floats, per call in a CUDA graph"}

    lp, ids = random_grid(rng, batch, L, budget)
    trees = build_trees(torch.from_numpy(lp).cuda(), torch.from_numpy(rng.integers(0, 2, size=ids.shape)).cuda(), budget)
    n = trees.n
    am = torch.from_numpy(rng.integers(0, 2, size=(batch, n))).cuda()
    cpu_trees, am_np = [trees.tree(b) for b in range(batch)], am.cpu().numpy()
    both(f"accept_B{batch}_n{n}", lambda: accept_greedy_batched(trees, am),
         cpu_fn=lambda: [accept_greedy(cpu_trees[b], am_np[b]) for b in range(batch)], cpu_reps=20)
    acc = accept_greedy_batched(trees, am)
    res[f"accept_B{batch}_n{n}"]["mean_accepted_length"] = float(acc.lengths.float().mean())
    slots = torch.randperm(batch * n * 2, device="cuda")[: batch * n].view(batch, n)
    both(f"commit_scattered_B{batch}_n{n}", lambda: commit_scattered(slots, acc))
    kv = torch.randn(61, batch * n, 576, device="cuda").to(torch.bfloat16)
    cs = torch.arange(batch * n, device="cuda").view(batch, n)
    start = cs[:, 0].contiguous()
    both(f"commit_compact_B{batch}_n{n}_61x576bf16", lambda: commit_compact(kv, cs, acc, start, 1))
    both(f"visibility_B{batch}_n{n}", lambda: tree_visibility(trees.parents))
    logits = torch.randn(batch, L, vocab, device="cuda")
    lg_np = logits[:1].cpu().numpy()
    key = f"topk_logprobs_B{batch}_L{L}_V{vocab}_k{budget}"
    out = both(key, lambda: topk_logprobs(logits, budget))
    samples[key]["cpu_ms_B1"] = c = time_cpu(lambda: topk_logprobs(lg_np, budget), warmup=1, reps=3)
    out["cpu_ms_per_request_B1"] = _median(c)
    return {"results": res, "samples": samples}


def benchmark_round(batch: int = 64, L: int = DEFAULT.block - 1, budget: int = DEFAULT.budget, prefix: int = 4096,
                    heads: int = 8, vocab: int = 4096) -> dict[str, Any]:
    """The composed round (:mod:`workbench.ddtree.compose`) with the torch and the kernel verify: no host
    sync (sync debug mode "error"), CUDA-graph outputs equal to eager ones, eager and graph times."""
    prob = make_toy_problem(batch=batch, L=L, budget=budget, prefix=prefix, heads=heads, vocab=vocab,
                            dtype="bfloat16", device="cuda")
    out: dict[str, Any] = {"batch": batch, "L": L, "budget": budget, "prefix": prefix, "heads": heads, "vocab": vocab}
    for v in ("torch", "kernel"):
        ddtree_round(prob, v)
        check_no_host_sync(prob, v)  # raises on a host sync
        g, cap = capture_round(prob, v)
        g.replay()
        eager = ddtree_round(prob, v)
        torch.cuda.synchronize()
        out[f"verify_{v}"] = {
            "no_host_sync": True,
            "graph_matches_eager": bool(torch.equal(cap.accepted.nodes, eager.accepted.nodes)
                                        and torch.equal(cap.trees.tokens, eager.trees.tokens)),
            "eager_ms": _median(time_cuda(lambda: ddtree_round(prob, v), warmup=3, reps=20)),
            "graph_ms": _median(time_cuda(g.replay, warmup=3, reps=20)),
            "mean_accepted_length": float(eager.accepted.lengths.float().mean())}
    return out


# ----------------------------------------------------------------------------- verify attention

def verify_floor(nodes: int, heads: int, prefix: int, elem_bytes: int, copy_gbps: float,
                 matmul_tflops: float) -> dict[str, float]:
    """Bytes, flops and floor (ms) of one verify call: max(bytes / bandwidth, flops / matrix rate).

    Bytes: prefix + tail KV rows read once, queries read, output written (input dtype), lse (float32)
    and slots (int64). Flops: 2 * rows * keys * (576 + 512)."""
    rows, keys = nodes * heads, prefix + nodes
    nbytes = keys * D_KV * elem_bytes + rows * D_KV * elem_bytes + rows * D_LATENT * elem_bytes + rows * 4 + prefix * 8
    flops = 2.0 * rows * keys * (D_KV + D_LATENT)
    t_mem, t_cmp = nbytes / (copy_gbps * 1e9) * 1e3, flops / (matmul_tflops * 1e12) * 1e3
    return dict(bytes=float(nbytes), flops=flops, memory_ms=t_mem, compute_ms=t_cmp, floor_ms=max(t_mem, t_cmp),
                bound="compute" if t_cmp >= t_mem else "memory")


def check_verify(inp: dict[str, Any], impl: str = "auto", label: str = "") -> dict[str, Any]:
    """One verify call on ``inp`` (:func:`random_verify_inputs`, one request) against the float64 reference:
    ``{kernel, shapes, max_abs_err, max_rel_err (by norm), lse_max_abs_err, tolerance, pass}``."""
    dt = str(inp["q_latent"].dtype).replace("torch.", "")
    o, l = verify_attention(**inp, impl=impl)
    ro, rl = verify_attention_reference(**inp)
    o64 = o.double()
    rel = float(torch.linalg.vector_norm(o64 - ro) / torch.linalg.vector_norm(ro))
    lse_err = float((l.double() - rl).abs().max())
    rel_tol, lse_tol = VERIFY_CHECK[dt]
    T, H = inp["q_latent"].shape[:2]
    return dict(kernel=f"verify_attention[{impl}]", shapes=f"T={T} H={H} P={inp['prefix_slots'].shape[0]} {dt}{label}",
                cases=1, max_abs_err=float((o64 - ro).abs().max()), max_rel_err=rel, lse_max_abs_err=lse_err,
                bit_exact=None, tolerance=rel_tol,
                **{"pass": bool(torch.isfinite(o64).all() and rel <= rel_tol and lse_err <= lse_tol)})


def _time_rotating(fns: Sequence[Any], reps: int, warmup: int) -> list[float]:
    """CUDA-event samples (ms) of one CUDA-graph replay per call, the calls rotating over ``fns``."""
    graphs = capture_graphs(fns)
    cur = {"i": 0}
    return time_cuda(lambda: graphs[cur["i"]].replay(), warmup=warmup, reps=reps,
                     setup=lambda i: cur.__setitem__("i", i % len(graphs)))


def benchmark_verify(heads: Sequence[int] = (8, 64), nodes: int = 33,
                     prefixes: Sequence[int] = (4096, 16384, 65536, 131072), reps: int = 50, peer_reps: int = 10,
                     seed: int = 0) -> dict[str, Any]:
    """Verify attention (bf16) at every (heads, prefix) point, checked against the float64 reference first,
    then timed: one graph replay per call (``median_ms``), calls captured back to back in one graph
    (``batched_ms``: device time with no launch latency, as in a captured decode step), an eager call; the
    KV rotated over enough caches to read more than L2. Beside the dispatched kernel: ``mma`` (where the
    dispatch is ``wgmma``) and the peers (naive torch, SDPA dense mask, FlexAttention: recorded as unsupported
    with the reason where it fails). Floor: :func:`verify_floor` with the copy bandwidth and bf16 matmul rate
    measured in this process. Returns the results dict (raw samples under ``samples``)."""
    dt = torch.bfloat16
    impl = dispatched_impl(dt)
    variants = {"mma": "mma"} if impl == "wgmma" else {}
    bw, mm = measure_copy_bandwidth(), measure_bf16_matmul_tflops()
    points, samples, checks, flex_reason = [], {}, [], None
    for H in heads:
        for P in prefixes:
            n_sets = int(min(16, max(2, math.ceil(3 * (60 << 20) / ((P + nodes) * D_KV * 2)))))
            sets = [random_verify_inputs(nodes, H, P, dt, "cuda", seed=seed + 7919 * s + P + H, cache_factor=1.0)
                    for s in range(n_sets)]
            for name in [impl, *variants]:
                checks.append(check_verify(sets[0], name))
            key = f"H{H}_P{P}"
            s = samples[key] = {}

            def calls(kind, sets=sets):
                return [lambda st=st: verify_attention(**st, check=False, impl=kind) for st in sets]

            s["verify_attention"] = ks = _time_rotating(calls(impl), reps, 5)
            kb, kcalls = time_in_graph(calls(impl), max(10, reps // 2))
            s["verify_attention_batched"] = kb
            cur = {"i": 0}
            s["verify_attention_eager"] = eager = time_cuda(
                lambda sets=sets: verify_attention(**sets[cur["i"]], check=False), warmup=3, reps=20,
                setup=lambda i: cur.__setitem__("i", i % n_sets))
            var_res = {}
            for vname, kind in variants.items():
                s[f"verify_attention[{vname}]"] = vs = _time_rotating(calls(kind), reps, 3)
                s[f"verify_attention[{vname}]_batched"] = vb = time_in_graph(calls(kind), max(10, reps // 2))[0]
                var_res[vname] = {"median_ms": median(vs), "mode": "cuda_graph", "batched_ms": median(vb)}
            peer_res = {}
            for name, fn in PEERS.items():
                if name == "flex_attention" and flex_reason is not None:
                    peer_res[name] = {"status": "unsupported", "reason": flex_reason}
                    continue
                try:
                    pfns = [lambda st=st, fn=fn: fn(**st) for st in sets]
                    if name == "flex_attention":
                        s[name] = ps = time_cuda(pfns[0], warmup=2, reps=peer_reps)
                        peer_res[name] = {"status": "ok", "median_ms": median(ps), "mode": "eager"}
                    else:
                        s[name] = ps = _time_rotating(pfns, peer_reps, 2)
                        s[f"{name}_batched"] = pb = time_in_graph(pfns, peer_reps)[0]
                        peer_res[name] = {"status": "ok", "median_ms": median(ps), "mode": "cuda_graph",
                                          "batched_ms": median(pb)}
                except (*cuda_errors(), ValueError, NotImplementedError) as e:  # a peer that cannot run these shapes
                    torch.cuda.synchronize()
                    reason = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
                    if name == "flex_attention":
                        flex_reason = reason
                    peer_res[name] = {"status": "unsupported" if name == "flex_attention" else "failed",
                                      "reason": reason}
                torch.cuda.empty_cache()
            fl = verify_floor(nodes, H, P, 2, bw["gb_per_s"], mm["tflops"])
            kmed, kbmed = median(ks), median(kb)
            ok = [v["median_ms"] for v in peer_res.values() if v["status"] == "ok"]
            okb = [v["batched_ms"] for v in peer_res.values() if v.get("batched_ms")]
            points.append(dict(heads=H, nodes=nodes, prefix=P, dtype="bfloat16", kv_sets=n_sets, mode="cuda_graph",
                               impl=impl, median_ms=kmed, eager_median_ms=median(eager), batched_ms=kbmed,
                               batched_calls=kcalls, percent_of_floor_batched=100.0 * fl["floor_ms"] / kbmed,
                               faster_than_all_peers_batched=all(kbmed < v for v in okb) if okb else None,
                               variants=var_res, floor_ms=fl["floor_ms"], floor_bound=fl["bound"],
                               percent_of_floor=100.0 * fl["floor_ms"] / kmed, bytes=fl["bytes"], flops=fl["flops"],
                               achieved_tflops=fl["flops"] / (kmed * 1e-3) / 1e12, peers=peer_res,
                               best_peer_ms=min(ok) if ok else None,
                               speedup_vs_best_peer=min(ok) / kmed if ok else None,
                               faster_than_all_peers=all(kmed < v for v in ok)))
            del sets
            torch.cuda.empty_cache()
    return dict(points=points, copy_gb_per_s=bw["gb_per_s"], bf16_matmul_tflops=mm["tflops"], parity=checks,
                goal="faster than every peer at every point and >= 50% of floor",
                all_faster_than_peers=all(p["faster_than_all_peers"] for p in points),
                min_percent_of_floor=min(p["percent_of_floor"] for p in points),
                min_percent_of_floor_batched=min(p["percent_of_floor_batched"] for p in points),
                parameters=dict(heads=list(heads), nodes=nodes, prefixes=list(prefixes), dtype="bfloat16", reps=reps,
                                peer_reps=peer_reps, peers=list(PEERS), variants=variants),
                samples=dict(kernels=samples, copy_ms=bw["samples_ms"], matmul_ms=mm["samples_ms"]))


# ----------------------------------------------------------------------------- sanitizer driver

def sanitize_driver() -> None:
    """Every kept kernel once at small sizes (run under compute-sanitizer): both builders, visibility,
    accept, both commits; verify with each kernel (single request with and without the prepare launch,
    batched) and float32."""
    rng = np.random.default_rng(1)
    for B, L, K, budget, q in ((3, 7, 8, 20, 4), (2, 32, 1024, 1024, 8), (5, 15, 32, 32, None), (3, 32, 16, 3, None)):
        lp, ids = random_grid(rng, B, L, K, q)
        lpg, idg = torch.from_numpy(lp).cuda(), torch.from_numpy(ids % 3).cuda()
        for m in _methods(build_trees(lpg, idg, budget).n - 1):
            t = build_trees(lpg, idg, budget, method=m)
        tree_visibility(t.parents)
        acc = accept_greedy_batched(t, torch.from_numpy(rng.integers(0, 3, size=(B, t.n))).cuda())
        slots = torch.arange(B * t.n, device="cuda").view(B, t.n)
        commit_scattered(slots, acc)
        kv = torch.randn(2, B * t.n, 576, device="cuda").to(torch.bfloat16)
        commit_compact(kv, slots, acc, slots[:, 0].contiguous(), slot_dim=1)
    bf16 = [k for k in ("wgmma", "mma") if k == "mma" or dispatched_impl("bfloat16") == "wgmma"]
    for kind in bf16:
        for nodes, heads, prefix in ((9, 8, 0), (9, 8, 150), (70, 1, 200), (129, 2, 300)):
            verify_attention(**random_verify_inputs(nodes, heads, prefix, "bfloat16", "cuda"), impl=kind)
        verify_attention_batched(**random_verify_inputs(9, 8, [0, 70, 130], "bfloat16", "cuda"), impl=kind)
    verify_attention(**random_verify_inputs(9, 8, 150, "float32", "cuda"))
    torch.cuda.synchronize()
    print("sanitize driver done")


def read_sanitizer_logs(folder: Any, tools: Sequence[str] = SANITIZER_TOOLS) -> dict[str, Any]:
    """``<folder>/<tool>.log`` (runs of ``SANITIZER_COMMAND``, optionally ending ``exit=N``): per tool the
    SUMMARY lines, the errors or hazards they state, whether the driver ran to its end, the exit code."""
    def parse(tool: str, text: str, rc: int | None) -> dict[str, Any]:
        summary = [ln.strip("= ").strip() for ln in summary_lines(text)]
        return {"summary": summary, "errors": stated_count(summary), "driver_done": "sanitize driver done" in text,
                "returncode": rc, "command": SANITIZER_COMMAND.format(tool=tool)}

    return read_logs(folder, tools, parse)


# ----------------------------------------------------------------------------- CLI

def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.bench.ddtree", description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("all", "tree", "verify"), default="all")
    ap.add_argument("--out", default=None, help="output folder (default data/measurements/<gpu>)")
    ap.add_argument("--quick", action="store_true", help="fewer points and repeats (a smoke run, not a result)")
    ap.add_argument("--sanitize", action="store_true", help="run the compute-sanitizer driver and exit")
    ap.add_argument("--sanitizer-logs", default=None, help="folder with memcheck.log / racecheck.log to record")
    args = ap.parse_args(argv)

    require_gpu("python -m workbench.bench.ddtree")
    if args.sanitize:
        sanitize_driver()
        return 0
    sanitizer = read_sanitizer_logs(args.sanitizer_logs) if args.sanitizer_logs else None
    if args.part in ("all", "tree"):
        t0 = time.time()
        points = [(8, 7, 8, 8), (64, 15, 32, 32), (4, 15, 64, 300), (2, 32, 1024, 1024), (6, 4, 50, 20)]
        rows = check_tree_kernels(points[:2] if args.quick else points)
        if not all(r["passed"] for r in rows):
            raise SystemExit(f"tree kernels differ from the reference: {[r for r in rows if not r['passed']]}")
        bench = benchmark_tree_kernels(budgets=(8, 32, 128) if args.quick else (8, 32, 128, 512, 1024))
        results = dict(bench["results"], parity=rows, parity_all_passed=True, round=benchmark_round())
        if sanitizer:
            results["sanitizer"] = sanitizer
        path = write_measurement(
            "ddtree_kernels", out_dir=args.out, results=results, samples=bench["samples"],
            parameters={"build": {"batch": 64, "L": DEFAULT.block - 1, "budget": DEFAULT.budget, "K": 32},
                        "accept": {"batch": 64},
                        "topk_vocab": 163840, "quick": args.quick,
                        "timing": "gpu_graph_ms: per call, 20 calls in one CUDA graph replayed; gpu_eager_ms: "
                                  "CUDA events around one Python call; cpu_ms: NumPy/heapq reference, whole batch"},
            notes=f"checked {len(rows)} rows bit-exact in {time.time() - t0:.1f} s before timing")
        print(f"wrote {path}")
    if args.part in ("all", "verify"):
        res = benchmark_verify(heads=(8,) if args.quick else (8, 64),
                               prefixes=(4096,) if args.quick else (4096, 16384, 65536, 131072),
                               reps=10 if args.quick else 50, peer_reps=3 if args.quick else 10)
        if not all(r["pass"] for r in res["parity"]):
            raise SystemExit(f"verify differs from the float64 reference: {[r for r in res['parity'] if not r['pass']]}")
        if sanitizer:
            res["sanitizer"] = sanitizer
        path = write_measurement("ddtree_verify", out_dir=args.out, parameters=dict(res.pop("parameters"), quick=args.quick),
                                 samples=res.pop("samples"), results=res,
                                 notes="median_ms: one CUDA-graph replay per call; batched_ms: calls back to back in "
                                       "one graph; floor = max(bytes / copy bandwidth, flops / bf16 matmul rate), "
                                       "both measured in this process")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
