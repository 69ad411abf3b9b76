"""Parity and timing of the DDTree tree kernels (and verify, when present).

``python -m workbench.ddtree.bench --out DIR`` checks the kernels against the
references on fresh random inputs, times them against the CPU references in
the same run, proves the composed round free of host syncs and captures it in
a CUDA graph, then writes ``DIR/ddtree_kernels.json`` and prints a short
table. ``--sanitize`` instead runs every tree kernel once at small sizes (the
driver for ``compute-sanitizer``); ``--with-sanitizers`` first runs
compute-sanitizer memcheck and racecheck on that driver, ``--sanitizer-logs DIR``
reads such runs made beforehand, and either records them under ``sanitizer``.
``WORKBENCH_RUN_NOTE`` (environment), when set, is appended to the notes.

Library functions (used by notebook 01): :func:`tree_parity_rows`,
:func:`benchmark_tree_kernels`, :func:`load_kernel_results`,
:func:`default_parity_cases`.
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

from workbench.ddtree.reference import accept_greedy, build_tree, topk_logprobs
from workbench.ddtree.tree_gpu import (GpuAccepted, GpuTrees, accept_greedy_batched, build_trees,
                                       commit_compact, commit_scattered, tree_visibility)
from workbench.kernels import resolve_device
from workbench.sanitizer import read_logs, stated_count, summary_lines

__all__ = ["default_parity_cases", "tree_parity_rows", "benchmark_tree_kernels", "run_sanitizers", "sanitizer_command", "parse_sanitizer_log",
           "read_sanitizer_logs",
           "benchmark_round", "load_kernel_results", "resolve_device", "tree_timing_rows",
           "verify_timing_rows",
           "kernel_results_rows", "goal_rows", "build_sweep_figure", "main"]

MEASUREMENT = "ddtree_kernels"


def default_parity_cases(device: str = "auto") -> list[dict[str, Any]]:
    """The parity grid: batch 1-64, L 7 and 15, budget 8-1024, some cases with
    quantised log-probs (forced ties). Smaller on a CPU."""
    if resolve_device(device) == "cpu":
        return [dict(batch=2, L=7, K=8, budget=8, quant=None),
                dict(batch=2, L=15, K=16, budget=32, quant=4)]
    cases = []
    for batch in (1, 8, 64):
        for L in (7, 15):
            for budget in (8, 32, 128, 512, 1024):
                if batch == 64 and budget > 128:
                    continue  # keeps the CPU reference side short
                for quant in (None, 4):
                    cases.append(dict(batch=batch, L=L, K=min(budget, 64), budget=budget,
                                      quant=quant))
    cases.append(dict(batch=4, L=32, K=1024, budget=1024, quant=8))
    cases.append(dict(batch=6, L=4, K=50, budget=20, quant=2))  # K_in > K: strided rows
    cases.append(dict(batch=5, L=32, K=16, budget=3, quant=None))  # L > n
    cases.append(dict(batch=3, L=7, K=4, budget=1024, quant=0))  # all-equal log-probs
    return cases


def _random_grid(rng: np.random.Generator, B: int, L: int, K: int, quant):
    lp = -rng.random((B, L, K)) * 6.0
    if quant == 0:
        lp = np.zeros_like(lp)
    elif quant:
        lp = np.round(lp * quant) / quant
    lp = -np.sort(-lp, axis=-1)
    ids = rng.integers(0, 163840, size=(B, L, K))
    return lp.astype(np.float32), ids.astype(np.int64)


def tree_parity_rows(cases: list[dict[str, Any]] | None = None, device: str = "auto",
                     seed: int = 0) -> list[dict[str, Any]]:
    """One row per (kernel, case): build, visibility, accept, commit (scattered
    and compact) against the references on fresh random inputs. Integer
    outputs must match exactly; scores compare as float32 bits."""
    import torch

    dev = resolve_device(device)
    cases = cases if cases is not None else default_parity_cases(dev)
    rng = np.random.default_rng(seed)
    rows = []
    for c in cases:
        B, L, K, budget, quant = c["batch"], c["L"], c["K"], c["budget"], c.get("quant")
        lp, ids = _random_grid(rng, B, L, K, quant)
        roots = rng.integers(0, 163840, size=B)
        refs = [build_tree(lp[b], ids[b], budget, root_token=int(roots[b])) for b in range(B)]
        n = refs[0].n
        shape = f"B={B} L={L} K={K} budget={budget}" + (" ties" if quant is not None else "")
        methods = ("auto",)
        if dev == "cuda":
            methods = (("small", "small_br", "small_v1") if n - 1 <= 32 else ()) + ("warp", "heap")
        for method in methods:
            out = None
            if dev == "cuda":  # poisoned outputs: every element must be written
                out = GpuTrees(*(torch.full((B, n), -7, dtype=torch.int64, device=dev)
                                 for _ in range(4)),
                               torch.full((B, n), float("nan"), device=dev))
            trees = build_trees(torch.from_numpy(lp).to(dev), torch.from_numpy(ids).to(dev),
                                budget, root_tokens=torch.from_numpy(roots).to(dev),
                                method=method, out=out)
            got = {f: getattr(trees, f).cpu().numpy() for f in
                   ("tokens", "parents", "depths", "ranks", "scores")}
            exact = all(np.array_equal(got[f][b], getattr(refs[b], f)) for b in range(B)
                        for f in ("tokens", "parents", "depths", "ranks"))
            sbits = all(got["scores"][b].tobytes() == refs[b].scores.tobytes() for b in range(B))
            serr = max(float(np.max(np.abs(got["scores"][b].astype(np.float64) - refs[b].scores)))
                       for b in range(B))
            rows.append(dict(kernel=f"build_trees[{method}]", shapes=shape, cases=B,
                             max_abs_err=serr, max_rel_err=0.0 if serr == 0 else float("nan"),
                             bit_exact=bool(exact and sbits), passed=bool(exact and sbits)))
        vis = tree_visibility(trees.parents).cpu().numpy()
        vis_ok = all(np.array_equal(vis[b], refs[b].visibility()) for b in range(B))
        rows.append(dict(kernel="tree_visibility", shapes=f"B={B} n={n}", cases=B,
                         max_abs_err=0.0 if vis_ok else 1.0, max_rel_err=0.0, bit_exact=vis_ok,
                         passed=vis_ok))
        # accept on a small vocabulary so paths are long and children may share tokens
        small = rng.integers(0, 3, size=(B, L, K))
        trees_s = build_trees(torch.from_numpy(lp).to(dev), torch.from_numpy(small).to(dev),
                              budget)
        am = rng.integers(0, 3, size=(B, n))
        out_a = None
        if dev == "cuda":
            out_a = GpuAccepted(torch.full((B, n), -7, dtype=torch.int64, device=dev),
                                torch.full((B,), -7, dtype=torch.int64, device=dev),
                                torch.full((B,), -7, dtype=torch.int64, device=dev))
        acc = accept_greedy_batched(trees_s, torch.from_numpy(am).to(dev), out=out_a)
        nodes, lens, bonus = (acc.nodes.cpu().numpy(), acc.lengths.cpu().numpy(),
                              acc.bonus.cpu().numpy())
        acc_ok = True
        slots = rng.permutation(B * n * 2)[: B * n].reshape(B, n).astype(np.int64)
        keep, freed, nfree = (t.cpu().numpy() for t in
                              commit_scattered(torch.from_numpy(slots).to(dev), acc))
        com_ok = True
        for b in range(B):
            t_s = build_tree(lp[b], small[b], budget)
            a = accept_greedy(t_s, am[b])
            acc_ok &= (lens[b] == a.length and bonus[b] == a.bonus
                       and nodes[b, :a.length].tolist() == a.nodes.tolist()
                       and bool(np.all(nodes[b, a.length:] == -1)))
            kept = slots[b, a.nodes]
            rest = np.delete(slots[b], a.nodes)
            com_ok &= (keep[b, :a.length].tolist() == kept.tolist()
                       and bool(np.all(keep[b, a.length:] == -1))
                       and nfree[b] == rest.size and freed[b, :rest.size].tolist() == rest.tolist()
                       and bool(np.all(freed[b, rest.size:] == -1)))
        acc_ok, com_ok = bool(acc_ok), bool(com_ok)
        rows.append(dict(kernel="accept_greedy_batched", shapes=f"B={B} n={n}", cases=B,
                         max_abs_err=0.0 if acc_ok else 1.0, max_rel_err=0.0, bit_exact=acc_ok,
                         passed=acc_ok))
        rows.append(dict(kernel="commit_scattered", shapes=f"B={B} n={n}", cases=B,
                         max_abs_err=0.0 if com_ok else 1.0, max_rel_err=0.0, bit_exact=com_ok,
                         passed=com_ok))
        # compaction in place: each request's tree at contiguous slots, compact to its start
        if B * n <= 65536:
            planes, row = 2, 576
            kv = torch.from_numpy(rng.standard_normal((planes, B * n, row)).astype(np.float32))
            kv = kv.to(torch.bfloat16)
            before = kv.clone()
            kv = kv.to(dev)
            cslots = torch.arange(B * n, dtype=torch.int64).view(B, n)
            commit_compact(kv, cslots.to(dev), acc, cslots[:, 0].contiguous().to(dev), slot_dim=1)
            kv = kv.cpu()
            cp_ok = True
            for b in range(B):
                ln = int(lens[b])
                src = cslots[b, torch.from_numpy(nodes[b, :ln])]
                cp_ok &= bool(torch.equal(kv[:, b * n: b * n + ln], before[:, src]))
                cp_ok &= bool(torch.equal(kv[:, b * n + ln: (b + 1) * n],
                                          before[:, b * n + ln: (b + 1) * n]))
            rows.append(dict(kernel="commit_compact", shapes=f"B={B} n={n} 2x576 bf16", cases=B,
                             max_abs_err=0.0 if cp_ok else 1.0, max_rel_err=0.0,
                             bit_exact=cp_ok, passed=cp_ok))
    for r in rows:
        r["device"] = dev
    return rows


class _small_warps:
    """Temporarily set tree_gpu.SMALL_WARPS_PER_BLOCK (requests per block of "small")."""

    def __init__(self, warps: int):
        self.warps = warps

    def __enter__(self):
        from workbench.ddtree import tree_gpu

        self.old = tree_gpu.SMALL_WARPS_PER_BLOCK
        tree_gpu.SMALL_WARPS_PER_BLOCK = self.warps

    def __exit__(self, *exc):
        from workbench.ddtree import tree_gpu

        tree_gpu.SMALL_WARPS_PER_BLOCK = self.old


def _median(x):
    return float(np.median(np.asarray(x)))


def _graph_time_ms(fn, inner: int = 20, reps: int = 30) -> list[float]:
    """Per-call device time: ``inner`` calls captured in one CUDA graph, replayed."""
    import torch

    from workbench.measure import time_cuda

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
    samples = time_cuda(g.replay, warmup=3, reps=reps)
    return [t / inner for t in samples]


def benchmark_tree_kernels(batch: int = 64, L: int = 15, budget: int = 32,
                           budgets: tuple[int, ...] = (8, 32, 128, 512, 1024),
                           vocab: int = 163840, seed: int = 0) -> dict[str, Any]:
    """Time build / accept / topk / the composed round on the GPU against the
    CPU references in the same run. Returns a dict (results, samples)."""
    import torch

    from workbench.measure import time_cpu, time_cuda

    rng = np.random.default_rng(seed)
    res: dict[str, Any] = {}
    samples: dict[str, Any] = {}

    def both(key, gpu_fn, cpu_fn=None, cpu_reps=5):
        e = time_cuda(gpu_fn, warmup=10, reps=50)
        gtime = _graph_time_ms(gpu_fn)
        samples[key] = {"gpu_eager_ms": e, "gpu_graph_ms": gtime}
        out = {"gpu_eager_ms": _median(e), "gpu_graph_ms": _median(gtime)}
        if cpu_fn is not None:
            c = time_cpu(cpu_fn, warmup=1, reps=cpu_reps)
            samples[key]["cpu_ms"] = c
            out["cpu_ms"] = _median(c)
            out["speedup_graph"] = out["cpu_ms"] / out["gpu_graph_ms"]
            out["speedup_eager"] = out["cpu_ms"] / out["gpu_eager_ms"]
        res[key] = out
        return out

    # build: the headline point and a budget sweep, both kernels, CPU reference once each
    for bud in sorted(set(budgets) | {budget}):
        K = min(bud, 64) if bud != budget else bud
        lp, ids = _random_grid(rng, batch, L, K, None)
        lpg, idg = torch.from_numpy(lp).cuda(), torch.from_numpy(ids).cuda()
        cpu = (lambda lp=lp, ids=ids, bud=bud:
               [build_tree(lp[b], ids[b], bud) for b in range(batch)])
        reps = 5 if bud <= 128 else 2
        base = f"build_B{batch}_L{L}_budget{bud}"
        # the CPU reference is timed once per budget, on the key of "auto" (what
        # build_trees runs by default); every variant gets speedups against it
        auto = "small" if bud <= 32 else "heap"
        methods = (["small", "small_br", "small_v1"] if bud <= 32 else []) + ["warp", "heap"]
        variants = [(m, 1) for m in [auto] + [m for m in methods if m != auto]]
        if bud <= 32:
            variants.append(("small", 4))  # four requests per block
        cpu_ms = None
        for method, warps in variants:
            key = base if method == auto and warps == 1 else f"{base}_{method}"
            if warps != 1:
                key += f"_{warps}w"
            with _small_warps(warps):
                out = both(key, lambda lpg=lpg, idg=idg, bud=bud, m=method:
                           build_trees(lpg, idg, bud, method=m), cpu if cpu_ms is None else None,
                           reps)
            if cpu_ms is None:
                cpu_ms = out["cpu_ms"]
            else:
                out["cpu_ms"] = cpu_ms
                out["speedup_graph"] = cpu_ms / out["gpu_graph_ms"]
                out["speedup_eager"] = cpu_ms / out["gpu_eager_ms"]
            out.update(batch=batch, L=L, K=K, budget=bud, method=method)
            if method == "small":
                out["warps_per_block"] = warps

    # pops sweep at a fixed [L, K] grid: the time against the number of pops gives the fixed
    # part (intercept) and the cost of one pop (slope) of the small kernels
    lp, ids = _random_grid(rng, batch, L, 32, None)
    lpg, idg = torch.from_numpy(lp).cuda(), torch.from_numpy(ids).cuda()
    sweep = []
    for bud in (1, 2, 4, 8, 16, 32):
        for method in ("small", "small_br", "small_v1"):
            g = _graph_time_ms(lambda bud=bud, m=method: build_trees(lpg, idg, bud, method=m))
            sweep.append(dict(method=method, budget=bud, K=min(bud, 32), pops=bud,
                              gpu_graph_ms=_median(g)))
    res[f"build_pops_sweep_B{batch}_L{L}"] = sweep
    for method in ("small", "small_br", "small_v1"):
        pts = [(r["pops"], r["gpu_graph_ms"] * 1e3) for r in sweep if r["method"] == method]
        slope, icpt = np.polyfit([p for p, _ in pts], [t for _, t in pts], 1)
        res[f"build_pops_fit_{method}"] = {"us_per_pop": float(slope), "fixed_us": float(icpt),
                                           "ns_per_pop": float(slope * 1e3)}
    # the floor of one graph node: a tiny torch kernel, timed the same way
    tiny = torch.zeros(64, device="cuda")
    res["graph_node_floor"] = {"graph_us_per_call": _median(_graph_time_ms(tiny.zero_)) * 1e3,
                               "what": "torch zero_ of 64 floats, per call in a CUDA graph"}

    # accept and commit at the headline point
    lp, ids = _random_grid(rng, batch, L, budget, None)
    small = rng.integers(0, 2, size=ids.shape)
    trees = build_trees(torch.from_numpy(lp).cuda(), torch.from_numpy(small).cuda(), budget)
    n = trees.n
    am = torch.from_numpy(rng.integers(0, 2, size=(batch, n))).cuda()
    cpu_trees = [trees.tree(b) for b in range(batch)]
    am_np = am.cpu().numpy()
    out = both(f"accept_B{batch}_n{n}", lambda: accept_greedy_batched(trees, am),
               lambda: [accept_greedy(cpu_trees[b], am_np[b]) for b in range(batch)], 20)
    acc = accept_greedy_batched(trees, am)
    res[f"accept_B{batch}_n{n}"]["mean_accepted_length"] = float(acc.lengths.float().mean())
    slots = torch.randperm(batch * n * 2, device="cuda")[: batch * n].view(batch, n)
    both(f"commit_scattered_B{batch}_n{n}", lambda: commit_scattered(slots, acc))
    kv = torch.randn(61, batch * n, 576, device="cuda").to(torch.bfloat16)
    cs = torch.arange(batch * n, device="cuda").view(batch, n)
    start = cs[:, 0].contiguous()
    both(f"commit_compact_B{batch}_n{n}_61x576bf16", lambda: commit_compact(kv, cs, acc, start, 1))
    both(f"visibility_B{batch}_n{n}", lambda: tree_visibility(trees.parents))

    # top-k log-probs over the full K2.6 vocabulary
    logits = torch.randn(batch, L, vocab, device="cuda")
    lg_np = logits[:1].cpu().numpy()
    out = both(f"topk_logprobs_B{batch}_L{L}_V{vocab}_k{budget}",
               lambda: topk_logprobs(logits, budget))
    c = time_cpu(lambda: topk_logprobs(lg_np, budget), warmup=1, reps=3)
    out["cpu_ms_per_request_B1"] = _median(c)
    samples[f"topk_logprobs_B{batch}_L{L}_V{vocab}_k{budget}"]["cpu_ms_B1"] = c
    return {"results": res, "samples": samples}


def benchmark_round(batch: int = 64, L: int = 15, budget: int = 32, prefix: int = 4096,
                    heads: int = 8, vocab: int = 4096) -> dict[str, Any]:
    """The composed round: no-sync check, graph capture, eager vs graph replay."""
    import torch

    from workbench.ddtree.compose import capture_round, check_no_host_sync, ddtree_round, make_toy_problem
    from workbench.measure import time_cuda

    prob = make_toy_problem(batch=batch, L=L, budget=budget, prefix=prefix, heads=heads,
                            vocab=vocab, dtype="bfloat16", device="cuda")
    out: dict[str, Any] = {"batch": batch, "L": L, "budget": budget, "prefix": prefix,
                           "heads": heads, "vocab": vocab}
    variants = ["torch", "kernel"]
    for v in variants:
        r: dict[str, Any] = {}
        try:
            ddtree_round(prob, v)
            torch.cuda.synchronize()
            try:
                check_no_host_sync(prob, v)
                torch.cuda.synchronize()
                r["no_host_sync"] = True
            except RuntimeError as exc:
                r["no_host_sync"] = False
                r["sync_error"] = str(exc)[:300]
            g, cap = capture_round(prob, v)
            g.replay()
            eager = ddtree_round(prob, v)
            torch.cuda.synchronize()
            r["graph_matches_eager"] = bool(torch.equal(cap.accepted.nodes, eager.accepted.nodes)
                                            and torch.equal(cap.trees.tokens, eager.trees.tokens))
            r["eager_ms"] = _median(time_cuda(lambda: ddtree_round(prob, v), warmup=3, reps=20))
            r["graph_ms"] = _median(time_cuda(g.replay, warmup=3, reps=20))
            r["mean_accepted_length"] = float(eager.accepted.lengths.float().mean())
        except Exception as exc:  # report, keep the rest of the benchmark
            r["error"] = f"{type(exc).__name__}: {exc}"[:500]
        out[f"verify_{v}"] = r
    return out


def tree_timing_rows(device: str = "auto", batch: int = 8, L: int = 7, budget: int = 32,
                     seed: int = 0) -> list[dict[str, Any]]:
    """Tree build and accept timed in this process: the CPU references (heapq
    builder, accept), and on a GPU every build kernel and the batched accept
    (median of CUDA-event timings around the Python call, launch included)."""
    import torch

    from workbench.measure import time_cpu, time_cuda

    dev = resolve_device(device)
    rng = np.random.default_rng(seed)
    lp, ids = _random_grid(rng, batch, L, budget, None)
    small = rng.integers(0, 2, size=ids.shape)
    shape = f"B={batch} L={L} K={budget} budget={budget}"
    rows = []
    cpu_build = _median(time_cpu(lambda: [build_tree(lp[b], ids[b], budget) for b in range(batch)],
                                 warmup=1, reps=5))
    rows.append(dict(op="build", impl="CPU reference (heapq)", shapes=shape, median_ms=cpu_build,
                     speedup_vs_cpu=1.0))
    trees_cpu = [build_tree(lp[b], small[b], budget) for b in range(batch)]
    n = trees_cpu[0].n
    am = rng.integers(0, 2, size=(batch, n))
    cpu_acc = _median(time_cpu(lambda: [accept_greedy(trees_cpu[b], am[b]) for b in range(batch)],
                               warmup=1, reps=20))
    rows.append(dict(op="accept", impl="CPU reference", shapes=f"B={batch} n={n}",
                     median_ms=cpu_acc, speedup_vs_cpu=1.0))
    if dev == "cuda":
        lpg, idg = torch.from_numpy(lp).cuda(), torch.from_numpy(ids).cuda()
        for m in ((["small", "small_br", "small_v1"] if budget <= 32 else []) + ["warp", "heap"]):
            t = _median(time_cuda(lambda m=m: build_trees(lpg, idg, budget, method=m)))
            rows.append(dict(op="build", impl=f"GPU build_trees[{m}]", shapes=shape, median_ms=t,
                             speedup_vs_cpu=cpu_build / t))
        trees = build_trees(lpg, torch.from_numpy(small).cuda(), budget)
        amg = torch.from_numpy(am).cuda()
        t = _median(time_cuda(lambda: accept_greedy_batched(trees, amg)))
        rows.append(dict(op="accept", impl="GPU accept_greedy_batched", shapes=f"B={batch} n={n}",
                         median_ms=t, speedup_vs_cpu=cpu_acc / t))
    return rows


def verify_timing_rows(device: str = "auto", nodes: int = 9, heads: int = 2, prefix: int = 256,
                       dtype: str = "float32", seed: int = 0) -> list[dict[str, Any]]:
    """Tree-verify attention and its peers timed in this process at one small
    point: the float64 reference (CPU), the kernel (or its CPU torch path), naive
    torch, SDPA with a dense mask, FlexAttention (status recorded if it fails)."""
    import torch

    from workbench.ddtree import verify as vmod, verify_peers

    from workbench.measure import time_cpu, time_cuda

    dev = resolve_device(device)
    inp = vmod.random_verify_inputs(nodes, heads, prefix, dtype=dtype, device=dev, seed=seed)
    shape = f"T={nodes} H={heads} P={prefix} {dtype}"
    impls = [("verify_attention_reference (float64, CPU)", "verify_attention_reference"),
             ("verify_attention", "verify_attention"), ("naive torch", "verify_attention_naive"),
             ("SDPA dense mask", "verify_attention_sdpa"), ("FlexAttention", "verify_attention_flex")]
    rows = []
    for label, name in impls:
        fn = getattr(vmod, name, None) or getattr(verify_peers, name)
        if name == "verify_attention_flex" and dev == "cpu":
            rows.append(dict(op="verify", impl=label, shapes=shape, median_ms=None,
                             status="not run on a CPU (torch.compile of FlexAttention)"))
            continue
        args = inp
        if name == "verify_attention_reference":
            args = {k: (v.detach().float().cpu().numpy() if isinstance(v, torch.Tensor)
                        and v.is_floating_point() else
                        v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v)
                    for k, v in inp.items()}
        try:
            call = (lambda fn=fn, args=args: fn(**args))
            if dev == "cuda" and name != "verify_attention_reference":
                t = _median(time_cuda(call, warmup=3, reps=20))
            else:
                t = _median(time_cpu(call, warmup=1, reps=5))
            rows.append(dict(op="verify", impl=label, shapes=shape, median_ms=t, status="ok"))
        except Exception as exc:  # a peer that does not accept these shapes
            rows.append(dict(op="verify", impl=label, shapes=shape, median_ms=None,
                             status=f"{type(exc).__name__}: {str(exc)[:80]}"))
    return rows


def kernel_results_rows(doc: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Timing rows of a ddtree_kernels measurement (default: the committed H200 file)."""
    doc = doc if doc is not None else load_kernel_results()
    if not doc:
        return []
    rows = []
    for key, v in doc["results"].items():
        if not isinstance(v, dict) or "gpu_graph_ms" not in v:
            continue
        rows.append(dict(kernel=key, gpu_graph_us=v["gpu_graph_ms"] * 1e3,
                         gpu_eager_us=v["gpu_eager_ms"] * 1e3, cpu_ref_ms=v.get("cpu_ms"),
                         speedup_graph=v.get("speedup_graph")))
    return rows


def goal_rows(doc: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The issue's performance goals against a ddtree_kernels measurement."""
    doc = doc if doc is not None else load_kernel_results()
    if not doc:
        return []
    r = doc["results"]
    rows = []
    b = r.get("build_B64_L15_budget32")
    if b:
        rows.append(dict(goal="build B=64 L=15 budget=32 under 50 us (graph replay)",
                         measured=f"{b['gpu_graph_ms'] * 1e3:.1f} us",
                         met=b["gpu_graph_ms"] * 1e3 < 50))
        rows.append(dict(goal="build >= 300x the CPU reference (same run)",
                         measured=f"{b['speedup_graph']:.0f}x (eager call: "
                                  f"{b['speedup_eager']:.0f}x)",
                         met=b["speedup_graph"] >= 300))
    acc = next((v for k, v in r.items() if k.startswith("accept_B64")), None)
    if acc:
        rows.append(dict(goal="accept B=64 under 10 us (graph replay)",
                         measured=f"{acc['gpu_graph_ms'] * 1e3:.1f} us",
                         met=acc["gpu_graph_ms"] * 1e3 < 10))
    rnd = r.get("round", {})
    for v in ("verify_torch", "verify_kernel"):
        if v in rnd:
            rows.append(dict(goal=f"round ({v}): no host sync, CUDA graph equals eager",
                             measured=f"sync-free={rnd[v].get('no_host_sync')}, "
                                      f"graph==eager={rnd[v].get('graph_matches_eager')}, "
                                      f"graph {rnd[v].get('graph_ms', float('nan')):.2f} ms",
                             met=bool(rnd[v].get("no_host_sync")
                                      and rnd[v].get("graph_matches_eager"))))
    if "parity_all_passed" in r:
        rows.append(dict(goal="GPU parity grid bit-exact", measured=f"{len(r.get('parity', []))} rows",
                         met=bool(r["parity_all_passed"])))
    return rows


def build_sweep_figure(doc: dict[str, Any] | None = None):
    """Build time against budget (B=64, L=15): each kernel (graph replay) and the CPU reference."""
    import plotly.graph_objects as go

    doc = doc if doc is not None else load_kernel_results()
    fig = go.Figure()
    if not doc:
        fig.update_layout(title="no ddtree_kernels measurement committed")
        return fig
    series: dict[str, list[tuple[int, float]]] = {}
    cpu: dict[int, float] = {}
    for key, v in doc["results"].items():
        if not key.startswith("build_") or not isinstance(v, dict) or "budget" not in v:
            continue
        w = v.get("warps_per_block", 1)
        label = v.get("method", "auto") + (f"[{w}w]" if w > 1 else "")
        series.setdefault(label, []).append((v["budget"], v["gpu_graph_ms"] * 1e3))
        if v.get("cpu_ms") is not None:
            cpu[v["budget"]] = v["cpu_ms"] * 1e3
    for name, pts in sorted(series.items()):
        pts.sort()
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers",
                                 name=f"GPU {name}"))
    if cpu:
        xs = sorted(cpu)
        fig.add_trace(go.Scatter(x=xs, y=[cpu[x] for x in xs], mode="lines+markers",
                                 name="CPU reference (heapq)", line=dict(dash="dash")))
    fig.update_layout(title="Tree build, batch 64, L=15 (GPU: per call in a CUDA graph)",
                      xaxis=dict(title="budget", type="log"),
                      yaxis=dict(title="microseconds", type="log"))
    return fig


def load_kernel_results(gpu: str = "h200") -> dict[str, Any] | None:
    """The committed ``data/measurements/<gpu>/ddtree_kernels.json`` or None."""
    from workbench.measure import load_measurement

    return load_measurement(MEASUREMENT, gpu)


def _sanitize_driver() -> None:
    """Every tree kernel once at small sizes (run under compute-sanitizer): each build method
    ("small" also with several requests per block, a partly empty last block), visibility,
    accept, both commits."""
    import torch

    rng = np.random.default_rng(1)
    for B, L, K, budget, q in ((3, 7, 8, 20, 4), (2, 32, 1024, 1024, 8), (5, 15, 32, 32, None),
                               (4, 6, 40, 24, 2), (3, 32, 16, 3, None)):
        lp, ids = _random_grid(rng, B, L, K, q)
        lpg, idg = torch.from_numpy(lp).cuda(), torch.from_numpy(ids % 3).cuda()
        for m in ("warp", "heap"):
            build_trees(lpg, idg, budget, method=m)
        t = build_trees(lpg, idg, budget)  # "small" where n - 1 <= 32
        if t.n - 1 <= 32:
            build_trees(lpg, idg, budget, method="small_v1")
            build_trees(lpg, idg, budget, method="small_br")
            with _small_warps(4):
                build_trees(lpg, idg, budget, method="small")
        tree_visibility(t.parents)
        am = torch.from_numpy(rng.integers(0, 3, size=(B, t.n))).cuda()
        acc = accept_greedy_batched(t, am)
        slots = torch.arange(B * t.n, device="cuda").view(B, t.n)
        commit_scattered(slots, acc)
        kv = torch.randn(2, B * t.n, 576, device="cuda").to(torch.bfloat16)
        commit_compact(kv, slots, acc, slots[:, 0].contiguous(), slot_dim=1)
        torch.cuda.synchronize()
    print("sanitize driver done")


SANITIZER_TOOLS = ("memcheck", "racecheck")


def sanitizer_command(tool: str) -> list[str]:
    """``compute-sanitizer --tool <tool>`` on the ``--sanitize`` driver; only kernels whose name
    holds "ddtree_" are checked."""
    import sys

    return ["compute-sanitizer", "--tool", tool, "--kernel-name", "kns=ddtree_", sys.executable,
            "-m", "workbench.ddtree.bench", "--sanitize"]


def parse_sanitizer_log(text: str, returncode: int | None = None) -> dict[str, Any]:
    """The summary lines of a compute-sanitizer log, the number of errors (memcheck) or hazards
    (racecheck) they state, and whether the driver ran to its end."""
    summary = [ln.strip() for ln in summary_lines(text)]
    errors = stated_count(summary)
    done = "sanitize driver done" in text
    return {"returncode": returncode, "summary": summary, "errors": errors, "driver_done": done,
            "tail": "" if (errors is not None and done and not returncode) else text[-1500:]}


def run_sanitizers(tools: tuple[str, ...] = SANITIZER_TOOLS, timeout_s: int = 300) -> dict[str, Any]:
    """Run :func:`sanitizer_command` for each tool (in parallel) and parse the logs."""
    import shutil
    import subprocess

    if shutil.which("compute-sanitizer") is None:
        return {"error": "compute-sanitizer is not on the PATH"}
    procs = {t: subprocess.Popen(sanitizer_command(t), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for t in tools}
    out: dict[str, Any] = {}
    for tool, pr in procs.items():
        try:
            text, _ = pr.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pr.kill()
            text = pr.communicate()[0] + f"\ntimeout after {timeout_s} s"
        out[tool] = parse_sanitizer_log(text, pr.returncode)
        out[tool]["command"] = " ".join(sanitizer_command(tool)[:5]) + \
            " python -m workbench.ddtree.bench --sanitize"
    return out


def read_sanitizer_logs(folder: str, tools: tuple[str, ...] = SANITIZER_TOOLS) -> dict[str, Any]:
    """Parse ``<folder>/<tool>.log`` (a run of :func:`sanitizer_command` whose exit code, if
    known, is the last line ``exit=N``)."""
    def parse(tool: str, text: str, rc: int | None) -> dict[str, Any]:
        return {**parse_sanitizer_log(text, rc),
                "command": " ".join(sanitizer_command(tool)[:5]) + " python -m workbench.ddtree.bench --sanitize"}

    return read_logs(folder, tools, parse)


def _run_verify(results: dict[str, Any]) -> None:
    """Add verify's parity rows and benchmark (:mod:`workbench.ddtree.verify_bench`)."""
    from workbench.ddtree import verify_bench

    try:
        results["verify_parity"] = verify_bench.verify_parity_rows(None, "cuda")
        results["verify"] = verify_bench.benchmark_verify()
    except Exception as exc:  # their benchmark failing must not lose ours
        results["verify_error"] = f"{type(exc).__name__}: {exc}"[:500]


def _verify_only(out: str | None) -> int:
    from workbench.measure import write_measurement

    doc = load_kernel_results("h200") or {"parameters": {}, "results": {}, "samples": None,
                                          "notes": None}
    results = dict(doc.get("results") or {})
    _run_verify(results)
    path = write_measurement(MEASUREMENT, parameters=doc.get("parameters") or {},
                             results=results, samples=doc.get("samples"),
                             notes=(doc.get("notes") or "") + "; verify merged by --verify-only",
                             out_dir=out)
    print(f"wrote {path}")
    return 0


def _print_table(doc: dict[str, Any]) -> None:
    print(f"{'kernel':58s} {'gpu graph us':>12s} {'gpu eager us':>12s} {'cpu ms':>9s} {'x':>8s}")
    for k, v in doc["results"].items():
        if not isinstance(v, dict) or "gpu_graph_ms" not in v:
            continue
        cpu = v.get("cpu_ms")
        sp = v.get("speedup_graph")
        print(f"{k:58s} {v['gpu_graph_ms'] * 1e3:12.1f} {v['gpu_eager_ms'] * 1e3:12.1f} "
              f"{'' if cpu is None else f'{cpu:9.2f}':>9s} {'' if sp is None else f'{sp:8.0f}':>8s}")


# Predictions, each written before the run that first measured the kernel it is about (the
# earlier kernels are timed beside it in the same run).
BUILD_PREDICTIONS = (
    "prediction 1, for the lane-per-node kernel (e108f3c, now 'small_br'), written before its "
    "first run: B=64 L=15 budget=32 about 6 us per call in a graph (fixed part about 3.5 us as "
    "estimated for small_v1, plus 32 pops of about 120-150 cycles: one REDUX, one ballot, one round "
    "of shuffles, the log-prob loads overlapped with the reduction), i.e. about 2.5x faster than "
    "small_v1's 15.0 us and above 500x the CPU reference; its first run (code 575d26d) measured "
    "8.4 us (434x), 1.97 us + 203 ns per pop",
    "prediction 2, for 'small' (the same kernel with its per-pop lane updates as selects instead "
    "of branches taken by one lane each), written before its first run: 40-80 cycles less per pop "
    "of the about 400 measured, i.e. about 7-7.5 us against small_br's 8.4 us",
)


def _build_prediction_note(results: dict[str, Any]) -> str:
    """The predictions and what was measured in this run (headline, variants, pops fits)."""
    parts = list(BUILD_PREDICTIONS)
    meas = []
    for m in ("small", "small_br", "small_v1"):
        key = "build_B64_L15_budget32" + ("" if m == "small" else f"_{m}")
        v = results.get(key)
        if v:
            meas.append(f"{m} {v['gpu_graph_ms'] * 1e3:.1f} us ({v['speedup_graph']:.0f}x CPU)")
    if meas:
        parts.append("measured in this run at budget 32: " + ", ".join(meas))
    fits = [f"{m} {f['fixed_us']:.2f} us + {f['ns_per_pop']:.0f} ns/pop"
            for m in ("small", "small_br", "small_v1")
            if (f := results.get(f"build_pops_fit_{m}"))]
    if fits:
        parts.append("pops fit (time = fixed + pops x per-pop, budgets 1-32): " + ", ".join(fits))
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="output folder (default data/measurements/<gpu>)")
    ap.add_argument("--sanitize", action="store_true", help="run each kernel once (for compute-sanitizer)")
    ap.add_argument("--with-sanitizers", action="store_true",
                    help="first run compute-sanitizer memcheck and racecheck on the --sanitize "
                         "driver and record their results in the measurement")
    ap.add_argument("--sanitizer-logs", default=None,
                    help="record the results of sanitizer runs already made: DIR/memcheck.log, "
                         "DIR/racecheck.log (see sanitizer_command)")
    ap.add_argument("--skip-verify", action="store_true", help="do not call verify.benchmark_verify")
    ap.add_argument("--verify-only", action="store_true",
                    help="only run verify's parity and benchmark and merge them into the committed "
                         "ddtree_kernels.json (written to --out)")
    args = ap.parse_args(argv)
    from workbench.kernels import require_gpu
    from workbench.measure import write_measurement

    require_gpu("the DDTree kernel benchmark")
    if args.sanitize:
        _sanitize_driver()
        return 0
    if args.verify_only:
        return _verify_only(args.out)
    sanitizer = None
    if args.sanitizer_logs:
        sanitizer = read_sanitizer_logs(args.sanitizer_logs)
    elif args.with_sanitizers:
        sanitizer = run_sanitizers()
    if sanitizer is not None:
        for tool, r in sanitizer.items():
            print(f"compute-sanitizer {tool}:", r if isinstance(r, str) else
                  {k: r.get(k) for k in ("returncode", "summary", "errors", "seconds", "tail")})
    t0 = time.time()
    rows = tree_parity_rows(device="cuda")
    parity_s = time.time() - t0
    bench = benchmark_tree_kernels()
    rnd = benchmark_round()
    results: dict[str, Any] = dict(bench["results"])
    results["parity"] = rows
    results["parity_all_passed"] = all(r["passed"] for r in rows)
    results["round"] = rnd
    if sanitizer is not None:
        results["sanitizer"] = sanitizer
    if not args.skip_verify:
        _run_verify(results)
    head = results["build_B64_L15_budget32"]
    path = write_measurement(
        MEASUREMENT,
        parameters={"build": {"batch": 64, "L": 15, "budget": 32, "K": 32},
                    "accept": {"batch": 64}, "topk_vocab": 163840,
                    "timing": "gpu_graph_ms: per call, 20 calls in one CUDA graph replayed; "
                              "gpu_eager_ms: CUDA events around one Python call; "
                              "cpu_ms: NumPy/heapq reference, whole batch"},
        results=results, samples=bench["samples"],
        notes=f"parity grid {len(rows)} rows in {parity_s:.1f} s; build headline speedup "
              f"{head['speedup_graph']:.0f}x (graph) / {head['speedup_eager']:.0f}x (eager); "
              + _build_prediction_note(results)
              + (f"; {os.environ['WORKBENCH_RUN_NOTE']}" if os.environ.get("WORKBENCH_RUN_NOTE")
                 else ""),
        out_dir=args.out)
    print(f"parity: {sum(r['passed'] for r in rows)}/{len(rows)} rows pass")
    for v in ("verify_torch", "verify_kernel"):
        if v in rnd:
            print(v, {k: rnd[v].get(k) for k in ("no_host_sync", "graph_matches_eager",
                                                    "eager_ms", "graph_ms", "error")})
    print(f"wrote {path}")
    _print_table({"results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
