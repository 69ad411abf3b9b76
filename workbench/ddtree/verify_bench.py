"""Parity grid and benchmark of the tree-verify attention (:mod:`workbench.ddtree.verify`).

- :func:`default_parity_cases` / :func:`verify_parity_rows` - parity table rows against the float64
  reference on fresh random inputs.
- :func:`benchmark_verify` - timings of the kernel (and its ``-D`` variants, :data:`WGMMA_VARIANTS`)
  against the peers (:mod:`workbench.ddtree.verify_peers`) and the floor
  ``max(bytes / copy bandwidth, flops / bf16 matrix rate)``, both measured in the same process.
- ``python -m workbench.ddtree.verify_bench --out DIR`` writes ``DIR/ddtree_verify.json``;
  ``--smoke`` runs the small cases compute-sanitizer checks.
"""
from __future__ import annotations

import argparse
import math
import time
from typing import Any, Iterable, Sequence

import numpy as np

from workbench.ddtree.verify import (D_KV, D_LATENT, auto_impl, random_verify_inputs, verify_attention,
                                     verify_attention_batched, verify_attention_reference, wgmma_unavailable_reason)
from workbench.ddtree.verify_peers import verify_attention_flex, verify_attention_naive, verify_attention_sdpa
from workbench.measure import capture_graphs, time_in_graph
from workbench.sanitizer import read_logs, stated_count, summary_lines

__all__ = ["default_parity_cases", "verify_parity_rows", "verify_floor", "benchmark_verify", "verify_table",
           "verify_benchmark_rows", "read_sanitizer_logs", "graph_launch_floor", "WGMMA_VARIANTS"]


# ----------------------------------------------------------------------------- parity

def default_parity_cases(device: Any = "cpu") -> list[dict[str, Any]]:
    """The parity grid: small on a CPU; on a GPU heads 8/64, prefix 0..128k, bf16 and float32, batched."""
    import torch

    on_gpu = torch.device(device).type == "cuda"
    if not on_gpu:
        return [dict(kernel="verify_attention", nodes=5, heads=2, prefix=p, dtype=d, repeats=2)
                for d in ("float32", "bfloat16") for p in (0, 37)] + [
            dict(kernel="verify_attention_batched", nodes=5, heads=2, prefix=[0, 19, 40], dtype="float32",
                 repeats=2)]
    cases = []
    for dt in ("bfloat16", "float32"):
        for heads in (8, 64):
            for p in (0, 1, 100, 4096 + 37, 131072):
                cases.append(dict(kernel="verify_attention", nodes=33, heads=heads, prefix=p, dtype=dt,
                                  repeats=3 if p < 100000 else 1))
        cases.append(dict(kernel="verify_attention_batched", nodes=33, heads=8, prefix=[0, 5000, 70, 20000],
                          dtype=dt, repeats=2))
    for tag in ("wgmma", "mma"):
        if tag == "wgmma" and wgmma_unavailable_reason() is not None:
            continue
        for heads in (8, 64):
            for p in (100, 4096 + 37, 131072):
                cases.append(dict(kernel=f"verify_attention[{tag}]", nodes=33, heads=heads, prefix=p,
                                  dtype="bfloat16", repeats=2 if p < 100000 else 1))
        cases.append(dict(kernel=f"verify_attention_batched[{tag}]", nodes=33, heads=8,
                          prefix=[0, 5000, 70, 20000], dtype="bfloat16", repeats=1))
    if wgmma_unavailable_reason() is None:
        # the default's single-request form without the prepare launch (T <= 128): blocks of many nodes
        # (H = 1: 64 per block, 4 mask words), nodes split across blocks (H = 3), the tail split across
        # chunks (chunk_len 64), T = 128 (the largest) and T = 129 (prepare launch again)
        cases += [dict(kernel="verify_attention[wgmma]", nodes=n, heads=h, prefix=p, dtype="bfloat16", repeats=2,
                       chunk_len=c) for n, h, p, c in ((100, 1, 500, None), (70, 3, 1000, 64), (33, 8, 1000, 64),
                                                       (128, 2, 300, None), (129, 2, 300, 128), (17, 64, 0, None))]
        for name in WGMMA_VARIANTS:  # the variants timed beside the default
            cases += [dict(kernel="verify_attention[wgmma]", nodes=33, heads=h, prefix=4096 + 37, dtype="bfloat16",
                           repeats=1, variant=name) for h in (8, 64)]
            cases.append(dict(kernel="verify_attention_batched[wgmma]", nodes=33, heads=8,
                              prefix=[0, 5000, 70, 20000], dtype="bfloat16", repeats=1, variant=name))
    cases += [
        dict(kernel="verify_attention[simple]", nodes=33, heads=8, prefix=4096 + 37, dtype="bfloat16", repeats=2),
        dict(kernel="verify_attention", nodes=65, heads=8, prefix=3000, dtype="bfloat16", repeats=2),
        dict(kernel="verify_attention", nodes=17, heads=64, prefix=777, dtype="float32", repeats=2),
        dict(kernel="verify_attention_naive", nodes=33, heads=8, prefix=4096, dtype="bfloat16", repeats=1),
        dict(kernel="verify_attention_sdpa", nodes=33, heads=8, prefix=4096, dtype="bfloat16", repeats=1),
    ]
    return cases


def _tolerances(dtype: str) -> tuple[float, float]:
    """(relative output error by norm, absolute lse error)."""
    return (1e-2, 2e-3) if dtype == "bfloat16" else (2e-5, 1e-4)


def verify_parity_rows(cases: Iterable[dict[str, Any]] | None = None, device: Any = "cpu",
                       seed: int = 0) -> list[dict[str, Any]]:
    """Parity rows: each case on fresh random inputs against the float64 reference.

    A case is a dict: ``kernel`` (``verify_attention``, ``verify_attention_batched``,
    either with an impl tag such as ``verify_attention[mma]`` or ``[simple]``;
    ``verify_attention_naive``, ``verify_attention_sdpa``),
    ``nodes``, ``heads``, ``prefix`` (int, or a list for the batched kernel),
    ``dtype`` (``"bfloat16"``/``"float32"``), ``repeats`` (random cases), optionally
    ``chunk_len`` (keys per thread block, passed to the kernel), ``options`` (``-D``
    options of the kernel build, a tuning variant) and ``variant`` (a name of
    :data:`WGMMA_VARIANTS`); the last two on CUDA tensors only.
    ``None`` takes :func:`default_parity_cases`. Outputs are poisoned (NaN)
    before each run and every element is checked. Returns rows
    ``{kernel, shapes, cases, max_abs_err, max_rel_err, lse_max_abs_err,
    bit_exact (None: float), tolerance, pass}``; ``max_rel_err`` is
    ``||out - ref|| / ||ref||``, the worst over the cases.
    """
    import torch

    dev = torch.device(device)
    rows = []
    for ci, case in enumerate(cases if cases is not None else default_parity_cases(dev)):
        kernel = case.get("kernel", "verify_attention")
        dtype = case.get("dtype", "bfloat16")
        rel_tol, lse_tol = _tolerances(dtype)
        max_abs = max_rel = lse_err = 0.0
        finite = True
        n = int(case.get("repeats", 1))
        for rep in range(n):
            inp = random_verify_inputs(case["nodes"], case["heads"], case["prefix"], dtype, dev,
                                       seed=seed + 1000 * ci + rep)
            base, _, tag = kernel.partition("[")
            impl = tag.rstrip("]") or "auto"
            extra = {"chunk_len": int(case["chunk_len"])} if case.get("chunk_len") else {}
            if case.get("options"):  # -D options of the kernel build (tuning variants; CUDA only)
                extra["_options"] = tuple(case["options"])
            if case.get("variant"):  # a named variant (_named_variants(); CUDA only)
                extra.update({k: v for k, v in _named_variants()[case["variant"]].items() if k != "impl"})
            if base == "verify_attention_batched":
                out = torch.full(inp["q_latent"].shape, float("nan"), dtype=inp["q_latent"].dtype, device=dev)
                lse = torch.full(inp["q_latent"].shape[:-1], float("nan"), dtype=torch.float32, device=dev)
                kw = dict(_poison_workspace=True) if dev.type == "cuda" else {}
                o, l = verify_attention_batched(**inp, out=out, lse=lse, impl=impl, **kw, **extra)
                offs = inp["prefix_offsets"].tolist()
                refs = [verify_attention_reference(inp["q_latent"][b], inp["q_rope"][b], inp["kv_cache"],
                                                   inp["prefix_slots"][offs[b]:offs[b + 1]], inp["tail_kv"][b],
                                                   inp["parents"][b], inp["scale"]) for b in range(len(offs) - 1)]
                ro, rl = torch.stack([r[0] for r in refs]), torch.stack([r[1] for r in refs])
            else:
                if base == "verify_attention":
                    out = torch.full(inp["q_latent"].shape, float("nan"), dtype=inp["q_latent"].dtype, device=dev)
                    lse = torch.full(inp["q_latent"].shape[:-1], float("nan"), dtype=torch.float32, device=dev)
                    o, l = verify_attention(**inp, out=out, lse=lse, impl=impl, **extra)
                elif base == "verify_attention_naive":
                    o, l = verify_attention_naive(**inp)
                elif base == "verify_attention_sdpa":
                    o, l = verify_attention_sdpa(**inp)
                else:
                    raise ValueError(f"unknown kernel {kernel!r}")
                ro, rl = verify_attention_reference(**inp)
            o64 = o.double()
            finite &= bool(torch.isfinite(o64).all())
            diff = (o64 - ro).abs()
            max_abs = max(max_abs, float(diff.max()))
            max_rel = max(max_rel, float(torch.linalg.vector_norm(o64 - ro) / torch.linalg.vector_norm(ro)))
            if l is not None:
                finite &= bool(torch.isfinite(l).all())
                lse_err = max(lse_err, float((l.double() - rl).abs().max()))
        p = case["prefix"]
        pstr = f"P={p}" if isinstance(p, (int, np.integer)) else f"B={len(p)} P={list(p)}"
        cstr = (f" chunk={case['chunk_len']}" if case.get("chunk_len") else "") + \
            (f" {' '.join(case['options'])}" if case.get("options") else "") + \
            (f" [{case['variant']}]" if case.get("variant") else "")
        rows.append(dict(kernel=kernel,
                         shapes=f"T={case['nodes']} H={case['heads']} {pstr} {dtype}{cstr}",
                         cases=n, max_abs_err=max_abs, max_rel_err=max_rel,
                         lse_max_abs_err=lse_err if kernel != "verify_attention_sdpa" else None,
                         bit_exact=None, tolerance=rel_tol,
                         **{"pass": bool(finite and max_rel <= rel_tol and lse_err <= lse_tol)}))
    return rows


# ----------------------------------------------------------------------------- benchmark

def verify_floor(nodes: int, heads: int, prefix: int, elem_bytes: int, copy_gbps: float,
                 matmul_tflops: float) -> dict[str, float]:
    """Bytes, flops and floor (ms) of one verify call: max(bytes / bandwidth, flops / matrix rate).

    Bytes: prefix + tail KV rows read once, queries read, output written
    (input dtype), lse (float32) and slots (int64). Flops: 2 * rows * keys * (576 + 512).
    """
    rows = nodes * heads
    keys = prefix + nodes
    nbytes = keys * D_KV * elem_bytes + rows * D_KV * elem_bytes + rows * D_LATENT * elem_bytes + rows * 4 + prefix * 8
    flops = 2.0 * rows * keys * (D_KV + D_LATENT)
    t_mem = nbytes / (copy_gbps * 1e9) * 1e3
    t_cmp = flops / (matmul_tflops * 1e12) * 1e3
    return dict(bytes=float(nbytes), flops=flops, memory_ms=t_mem, compute_ms=t_cmp, floor_ms=max(t_mem, t_cmp),
                bound="compute" if t_cmp >= t_mem else "memory")


_PEERS = {"naive_torch": verify_attention_naive, "sdpa_dense_mask": verify_attention_sdpa,
          "flex_attention": verify_attention_flex}

# -D variants of the wgmma kernel that ``--variants`` may name (timed beside the default in one process)
WGMMA_VARIANTS: dict[str, dict[str, Any]] = {
    # the default of 5de266b..1e272c7: each warpgroup its 32-key half of S and a row-max exchange, the
    # prepare launch, the two-pass merge
    "wgmma_5de266b": {"impl": "wgmma", "_options": ("-DVERIFY_WG_S1=0",), "_prepare": True,
                      "_merge_options": ("-DVERIFY_MERGE_V1=1",)},
    # + S by warpgroup 0 alone (VERIFY_WG_S1, m64n64k16)
    "s1_prepare_merge1": {"impl": "wgmma", "_options": ("-DVERIFY_WG_SLOTRING=0",), "_prepare": True,
                          "_merge_options": ("-DVERIFY_MERGE_V1=1",)},
    # + no prepare launch for one request (T <= 128)
    "s1_merge1": {"impl": "wgmma", "_options": ("-DVERIFY_WG_SLOTRING=0",), "_merge_options": ("-DVERIFY_MERGE_V1=1",)},
    # + the one-pass merge: the default of e95fa7b..98aa2b5; the default adds the slot ring (version 14)
    "wgmma_98aa2b5": {"impl": "wgmma", "_options": ("-DVERIFY_WG_SLOTRING=0",)},
    # (versions 18 / 18b, pdl_merge / pdl_merge_late, the merge under programmatic dependent launch, were not faster:
    # reverted, in git history at 6f5017e; ddtree_verify_pdl*.json; their predictions below)
}
PDL_MERGE_PREDICTION = (
    "Version 18, written before its run, after the MoE kernel's run 28b (the down launch under programmatic dependent "
    "launch saved ~3 us a call): pdl_merge launches the merge with PDL; the attention kernel lets it be scheduled from "
    "its start, and the merge waits on griddepcontrol before reading the partials. The in-graph breakdown "
    "(ddtree_verify_probe_ingraph.json) put the merge at 6-12 us of a call, of which its own reads are a few us. "
    "Predicted: 1-4 us less per call in-graph and in one replay at every point, outputs bit-identical; no point crosses "
    "50% of the floor. Refuted if it is not faster in-graph on average over the eight points.")
PDL_MERGE_LATE_PREDICTION = (
    "Version 18b, written before its run, after version 18 (ddtree_verify_pdl.json: slower in-graph at 6 of 8 points, "
    "by up to 5 us at H = 64 64k): with the trigger at the attention kernel's start, merge CTAs, scheduled from the "
    "first wave on, sit on the SMs and can keep later waves of attention CTAs (232 KB of shared memory each) off them. "
    "pdl_merge_late triggers after the tile loop, so the merge is scheduled once every attention CTA is in its "
    "epilogue. Predicted: not slower than the default at any point beyond noise (+-1 us), 0.5-2 us faster in-graph "
    "where a call is short (H = 8 4k-16k, H = 64 4k); outputs bit-identical. Refuted if it is slower in-graph on "
    "average over the eight points.")


def _time_rotating(fns: Sequence[Any], reps: int, warmup: int, graph: bool) -> tuple[list[float], str]:
    """CUDA-event samples (ms) of ``fns[i % len(fns)]``; replayed CUDA graphs when ``graph``
    (falls back to eager launches, saying so, when capture fails)."""
    import torch

    from workbench.measure import time_cuda

    mode = "eager"
    calls = list(fns)
    if graph:
        try:
            graphs = capture_graphs(fns)
            calls = [g.replay for g in graphs]
            mode = "cuda_graph"
        except Exception as e:  # noqa: BLE001 - recorded in the mode string
            torch.cuda.synchronize()
            mode = f"eager (graph capture failed: {type(e).__name__})"
    cur = {"i": 0}

    def setup(i):
        cur["i"] = i % len(calls)

    samples = time_cuda(lambda: calls[cur["i"]](), warmup=warmup, reps=reps, setup=setup)
    return samples, mode


def _time_pipelined(fns: Sequence[Any], reps: int, per_sample: int = 10) -> list[float]:
    """CUDA-event samples (ms per call) of ``per_sample`` CUDA-graph replays issued back to back
    (``fns`` rotated): the GPU stays busy, so the host's graph-launch latency overlaps the previous
    replay, as it does when a verify step runs inside a longer stream of work."""
    import torch

    graphs = capture_graphs(fns)
    for g in graphs[:3]:
        g.replay()
    torch.cuda.synchronize()
    out = []
    for i in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for j in range(per_sample):
            graphs[(i * per_sample + j) % len(graphs)].replay()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / per_sample)
    return out


def graph_launch_floor(reps: int = 200) -> dict[str, Any]:
    """Replay time (ms, median; samples) of a CUDA graph holding one minimal kernel node (a one-element
    add), timed as the benchmark times a verify call: what any one-graph call costs at least."""
    import torch

    from workbench.measure import median

    x = torch.zeros(1, device="cuda")
    s, mode = _time_rotating([lambda: x.add_(1.0)], reps, 5, graph=True)
    b, calls = time_in_graph([lambda: x.add_(1.0)], max(10, reps // 4), min_calls=64)
    return {"median_ms": median(s), "mode": mode, "samples_ms": s,
            "node_ms": median(b), "node_samples_ms": b, "nodes_per_graph": calls}


def benchmark_verify(heads: Sequence[int] = (8, 64), nodes: int = 33,
                     prefixes: Sequence[int] = (4096, 16384, 65536, 131072), dtype: Any = "bfloat16",
                     out: Any = None, reps: int = 50, peer_reps: int = 10,
                     peers: Sequence[str] = ("naive_torch", "sdpa_dense_mask", "flex_attention"),
                     variants: dict[str, dict[str, Any]] | None = None, seed: int = 0,
                     on_point: Any = None) -> dict[str, Any]:
    """Time :func:`verify_attention` against peers and its floor on the current GPU.

    For every (heads, prefix) point: fresh random inputs, the KV rotated over
    several caches so that more than L2 is read; every callable (the kernel,
    its ``variants`` (name -> extra keyword arguments of :func:`verify_attention`,
    e.g. ``{"simple": {"impl": "simple"}}``), each peer) timed as replayed CUDA graphs (launch
    overhead out; eager where capture fails, recorded in ``mode``) with CUDA
    events, the kernel also eagerly (``eager_median_ms``, Python launch
    overhead in); medians over ``reps`` (peers: ``peer_reps``); FlexAttention
    recorded as unsupported, with the reason, where it fails; the floor from
    :func:`verify_floor` with the copy bandwidth and bf16 matrix rate measured
    in this process; percent of floor and the speedup over the best peer.
    ``out``: a folder to write ``ddtree_verify.json`` into; ``on_point``: called
    with the results so far (``complete`` False) after every point. The kernel and
    its variants are also timed back to back (``pipelined_ms``: ten graph replays
    per sample, per call), and the replay time of a graph of one minimal kernel
    node is recorded (``graph_launch_floor_ms``): the part of every headline time
    that is the graph launch itself. Returns the results dict (raw samples under
    ``samples``, ``complete`` True).
    """
    import torch

    from workbench.kernels import require_gpu
    from workbench.measure import measure_bf16_matmul_tflops, measure_copy_bandwidth, median, time_cuda

    require_gpu("benchmark_verify")
    dev = torch.device("cuda")
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    dname = str(dt).replace("torch.", "")
    bw = measure_copy_bandwidth()
    mm = measure_bf16_matmul_tflops()
    floor_graph = graph_launch_floor()
    l2 = 60 << 20
    points, samples = [], {}
    flex_reason = None

    def _results(pts):
        return dict(points=pts, copy_gb_per_s=bw["gb_per_s"], bf16_matmul_tflops=mm["tflops"],
                    graph_launch_floor_ms=floor_graph["median_ms"],
                    goal="faster than every peer at every point and >= 50% of floor",
                    all_faster_than_peers=all(p["faster_than_all_peers"] for p in pts),
                    min_percent_of_floor=min(p["percent_of_floor"] for p in pts) if pts else None,
                    min_percent_of_floor_batched=(min(p["percent_of_floor_batched"] for p in pts)
                                                  if pts and all("percent_of_floor_batched" in p for p in pts)
                                                  else None),
                    graph_node_ms=floor_graph["node_ms"],
                    parameters=dict(heads=list(heads), nodes=nodes, prefixes=list(prefixes), dtype=dname,
                                    reps=reps, peer_reps=peer_reps, peers=list(peers),
                                    variants={k: {a: list(b) if isinstance(b, tuple) else b for a, b in v.items()}
                                              for k, v in (variants or {}).items()}),
                    samples=dict(kernels=samples, copy_ms=bw["samples_ms"], matmul_ms=mm["samples_ms"],
                                 graph_launch_floor_ms=floor_graph["samples_ms"],
                                 graph_node_ms=floor_graph["node_samples_ms"]))

    for H in heads:
        for P in prefixes:
            kv_bytes = (P + nodes) * D_KV * torch.tensor([], dtype=dt).element_size()
            n_sets = int(min(16, max(2, math.ceil(3 * l2 / max(kv_bytes, 1)))))
            sets = [random_verify_inputs(nodes, H, P, dt, dev, seed=seed + 7919 * s + P + H, cache_factor=1.0)
                    for s in range(n_sets)]
            key = f"H{H}_P{P}"
            samples[key] = {}

            def fns_for(kw):
                return [lambda st=st: verify_attention(**st, check=False, **kw) for st in sets]

            ks, kmode = _time_rotating(fns_for({}), reps, 5, graph=True)
            samples[key]["verify_attention"] = ks
            kp = _time_pipelined(fns_for({}), reps)
            samples[key]["verify_attention_pipelined"] = kp
            kb, kcalls = time_in_graph(fns_for({}), max(10, reps // 2))
            samples[key]["verify_attention_batched"] = kb
            cur = {"i": 0}
            eager = time_cuda(lambda: verify_attention(**sets[cur["i"]], check=False), warmup=3, reps=20,
                              setup=lambda i: cur.__setitem__("i", i % n_sets))
            samples[key]["verify_attention_eager"] = eager
            var_res = {}
            for vname, kw in (variants or {}).items():
                try:
                    vs, vmode = _time_rotating(fns_for(kw), reps, 3, graph=True)
                    vp = _time_pipelined(fns_for(kw), reps)
                    vb, _ = time_in_graph(fns_for(kw), max(10, reps // 2))
                except Exception as e:  # noqa: BLE001 - a variant that fails is recorded, the run goes on
                    torch.cuda.synchronize()
                    msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
                    var_res[vname] = {"status": "failed", "reason": f"{type(e).__name__}: {msg}"}
                    continue
                samples[key][f"verify_attention[{vname}]"] = vs
                samples[key][f"verify_attention[{vname}]_pipelined"] = vp
                samples[key][f"verify_attention[{vname}]_batched"] = vb
                var_res[vname] = {"median_ms": median(vs), "mode": vmode, "pipelined_ms": median(vp),
                                  "batched_ms": median(vb)}
            fl = verify_floor(nodes, H, P, sets[0]["kv_cache"].element_size(), bw["gb_per_s"], mm["tflops"])
            kmed = median(ks)
            peer_res = {}
            for name in peers:
                fn = _PEERS[name]
                if name == "flex_attention" and flex_reason is not None:
                    peer_res[name] = {"status": "unsupported", "reason": flex_reason}
                    continue
                try:
                    t0 = time.perf_counter()
                    fn(**sets[0])
                    torch.cuda.synchronize()
                    first_s = time.perf_counter() - t0
                    pfns = [lambda st=st: fn(**st) for st in sets]
                    ps, pmode = _time_rotating(pfns, peer_reps, 2, graph=name != "flex_attention")
                    samples[key][name] = ps
                    peer_res[name] = {"status": "ok", "median_ms": median(ps), "mode": pmode,
                                      "first_call_s": first_s}
                    if pmode == "cuda_graph":   # the same in-graph timing as the kernel's batched_ms
                        pb, _ = time_in_graph(pfns, peer_reps)
                        samples[key][f"{name}_batched"] = pb
                        peer_res[name]["batched_ms"] = median(pb)
                except Exception as e:  # noqa: BLE001 - recorded, not hidden
                    msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
                    reason = f"{type(e).__name__}: {msg}"
                    if name == "flex_attention":
                        flex_reason = reason
                    peer_res[name] = {"status": "unsupported" if name == "flex_attention" else "failed",
                                      "reason": reason}
                    torch.cuda.synchronize()
                torch.cuda.empty_cache()
            ok = [v["median_ms"] for v in peer_res.values() if v["status"] == "ok"]
            best = min(ok) if ok else None
            okb = [v["batched_ms"] for v in peer_res.values() if v.get("batched_ms")]
            kbmed = median(kb)
            points.append(dict(heads=H, nodes=nodes, prefix=P, dtype=dname, kv_sets=n_sets, mode=kmode,
                               impl=auto_impl(dt),
                               median_ms=kmed, eager_median_ms=median(eager), pipelined_ms=median(kp),
                               batched_ms=kbmed, batched_calls=kcalls,
                               percent_of_floor_batched=100.0 * fl["floor_ms"] / kbmed,
                               faster_than_all_peers_batched=all(kbmed < v for v in okb) if okb else None,
                               variants=var_res,
                               floor_ms=fl["floor_ms"], floor_bound=fl["bound"],
                               percent_of_floor=100.0 * fl["floor_ms"] / kmed, bytes=fl["bytes"], flops=fl["flops"],
                               achieved_tflops=fl["flops"] / (kmed * 1e-3) / 1e12, peers=peer_res,
                               best_peer_ms=best, speedup_vs_best_peer=(best / kmed) if best else None,
                               faster_than_all_peers=all(kmed < v for v in ok)))
            del sets
            torch.cuda.empty_cache()
            if on_point is not None:  # e.g. write the file after every point: a run cut short keeps them
                on_point(dict(_results(points), complete=False))
    results = dict(_results(points), complete=True)
    if out is not None:
        _write(results, out)
    return results


def _write(results: dict[str, Any], out: Any, name: str = "ddtree_verify", extra_notes: str = ""):
    from workbench.measure import write_measurement

    body = {k: v for k, v in results.items() if k not in ("samples", "parameters")}
    return write_measurement(name, out_dir=out, parameters=results["parameters"], results=body,
                             samples=results["samples"],
                             notes=VERIFY_NOTES + (" " + extra_notes if extra_notes else ""))


VERIFY_NOTES = (
    "verify_attention, bf16 default = impl 'wgmma' (Hopper warpgroup MMA, sm_90a via nvcc; 2 warpgroups, 64 query "
    "rows x 64 keys per tile, flash-decoding split + log-sum-exp merge launch). Since 0929e2e: S of a tile by "
    "warpgroup 0 alone (VERIFY_WG_S1, m64n64k16: Q read from shared memory once per tile, no row-max exchange); "
    "the single-request form (T <= 128) without the prepare launch (prefix length as an argument, ancestor masks "
    "built in shared memory by the blocks whose chunk reaches the tail); the merge's two passes over the chunks' "
    "lse values fused into one and its weighted sum 8 loads deep. Variants in the same process, a chain from the "
    "previous default to today's: 'wgmma_5de266b' = the default of 5de266b..1e272c7 (-DVERIFY_WG_S1=0, prepare "
    "launch, -DVERIFY_MERGE_V1=1 merge); 's1_prepare_merge1' = + S1; 's1_merge1' = + no prepare launch; the "
    "default = + one-pass merge; 'mma' = the mma.sync kernel (62fb1b2's design). (Predictions and outcomes of each "
    "step: papers/ddtree_kernels.md section 3 and the notes of the committed runs.) pipelined_ms: graph replays "
    "back to back (ten per sample); batched_ms: the calls captured back to back in ONE graph (batched_calls "
    "of them over the rotated KV sets), per call: device time with no host launch latency, as inside an engine's "
    "captured decode step (percent_of_floor_batched from it; peers that capture timed the same way); "
    "graph_launch_floor_ms: a graph of one minimal kernel node timed as the kernel is; graph_node_ms: per node "
    "of a graph of 64 such nodes. Peers: naive torch, SDPA with a dense mask, FlexAttention attempt. All timed as replayed CUDA graphs "
    "(eager_median_ms: the default with Python launch overhead); floor = max(bytes / measured copy bandwidth, "
    "flops / measured bf16 matmul rate); results.parity: rows against the float64 reference; results.sanitizer: "
    "compute-sanitizer logs of the smoke cases; results.complete: false while the run was cut short.")


def verify_benchmark_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Flat rows (one per heads x prefix point) of :func:`benchmark_verify` results, or of the
    committed measurement (``load_measurement("ddtree_verify")``, its ``results`` or the whole file)."""
    res = results.get("results", results)
    rows = []
    for p in res["points"]:
        row = dict(heads=p["heads"], nodes=p["nodes"], prefix=p["prefix"], kernel_ms=p["median_ms"],
                   eager_ms=p.get("eager_median_ms"), pipelined_ms=p.get("pipelined_ms"),
                   batched_ms=p.get("batched_ms"), percent_of_floor_batched=p.get("percent_of_floor_batched"),
                   floor_ms=p["floor_ms"],
                   floor_bound=p["floor_bound"],
                   percent_of_floor=p["percent_of_floor"], achieved_tflops=p["achieved_tflops"])
        for name, v in p.get("variants", {}).items():
            row[f"{name}_ms"] = v.get("median_ms")  # None: the variant failed (v["reason"])
        for name, v in p["peers"].items():
            row[f"{name}_ms"] = v["median_ms"] if v["status"] == "ok" else None
            if v["status"] != "ok":
                row[f"{name}_status"] = f"{v['status']}: {v.get('reason', '')}"
        row["speedup_vs_best_peer"] = p["speedup_vs_best_peer"]
        row["faster_than_all_peers"] = p["faster_than_all_peers"]
        rows.append(row)
    return rows


def verify_table(results: dict[str, Any]) -> str:
    """Plain-text table of :func:`benchmark_verify` results (or of the committed measurement)."""
    res = results.get("results", results)
    variants = sorted({v for p in res["points"] for v in p.get("variants", {})})
    lines = [f"{'H':>3} {'P':>7} {'kernel ms':>10} {'pipe ms':>8} {'batch ms':>9} {'eager ms':>9} {'floor ms':>9} "
             f"{'%floor':>7} {'%fl bat':>7} "
             + " ".join(f"{v + ' ms':>11}" for v in variants)
             + f" {'naive ms':>9} {'sdpa ms':>9} {'flex':>12} {'xbest':>6}"]
    for p in res["points"]:
        def pm(name):
            r = p["peers"].get(name)
            if r is None:
                return "-"
            return f"{r['median_ms']:.3f}" if r["status"] == "ok" else r["status"]
        sp = p["speedup_vs_best_peer"]
        var = " ".join(f"{p['variants'][v]['median_ms']:>11.4f}" if "median_ms" in p.get("variants", {}).get(v, {})
                       else f"{('failed' if v in p.get('variants', {}) else '-'):>11}" for v in variants)
        lines.append(f"{p['heads']:>3} {p['prefix']:>7} {p['median_ms']:>10.4f} {p.get('pipelined_ms') or 0:>8.4f} "
                     f"{p.get('batched_ms') or 0:>9.4f} {p.get('eager_median_ms') or 0:>9.4f} "
                     f"{p['floor_ms']:>9.4f} {p['percent_of_floor']:>6.1f}% {p.get('percent_of_floor_batched') or 0:>6.1f}% {var} {pm('naive_torch'):>9} "
                     f"{pm('sdpa_dense_mask'):>9} {pm('flex_attention'):>12} {(f'{sp:.1f}x' if sp else '-'):>6}")
    return "\n".join(lines)


def _rows_table(rows: list[dict[str, Any]]) -> str:
    out = [f"{'kernel':<26} {'shapes':<40} {'n':>2} {'max_abs':>9} {'max_rel':>9} {'lse_err':>9} pass"]
    for r in rows:
        le = r["lse_max_abs_err"]
        out.append(f"{r['kernel']:<26} {r['shapes']:<40} {r['cases']:>2} {r['max_abs_err']:>9.2e} "
                   f"{r['max_rel_err']:>9.2e} {(f'{le:.2e}' if le is not None else '-'):>9} {r['pass']}")
    return "\n".join(out)


SANITIZER_COMMAND = "compute-sanitizer --tool {tool} --kernel-name kns=ddtree_verify python -m workbench.ddtree.verify_bench --smoke"


def read_sanitizer_logs(folder: Any, tools: Sequence[str] = ("memcheck", "racecheck")) -> dict[str, Any]:
    """Parse ``<folder>/<tool>.log``: runs of ``SANITIZER_COMMAND`` (the ``--smoke`` parity cases of
    every verify kernel under compute-sanitizer; a last line ``exit=N`` gives the exit code). Returns
    per tool: the SUMMARY lines, the errors (memcheck) or hazards (racecheck) they state, whether the
    smoke cases ran to their verdict, the exit code and the command (the log's first line when it
    reads ``# command: ...``, else ``SANITIZER_COMMAND``)."""
    def parse(tool: str, text: str, rc: int | None) -> dict[str, Any]:
        lines = text.strip().splitlines()
        summary = [ln.strip("= ").strip() for ln in summary_lines(text.strip())]
        # a first line "# command: ..." records the command actually run (e.g. with --smoke-only)
        cmd = lines[0][len("# command: "):].strip() if lines and lines[0].startswith("# command: ") else \
            SANITIZER_COMMAND.format(tool=tool)
        return {"summary": summary, "errors": stated_count(summary),
                "smoke_verdict": "PASS" if "SMOKE PASS" in text else ("FAIL" if "SMOKE FAIL" in text else None),
                "returncode": rc, "command": cmd}

    return read_logs(folder, tools, parse)


def _named_variants() -> dict[str, dict[str, Any]]:
    """Variants ``--variants`` may name (name -> keyword arguments of :func:`verify_attention`)."""
    return {"mma": {"impl": "mma"}, **WGMMA_VARIANTS,
            "wgmma_prefetch": {"impl": "wgmma", "_options": ("-DVERIFY_WG_PREFETCH=1",)},
            "wgmma_a26b7c4": {"impl": "wgmma", "_options": ("-DVERIFY_WG_PAIR_BAR=0", "-DVERIFY_WG_LAZY_RESCALE=0")},
            **SLOTRING_VARIANTS}


# The slot indices of the next tile through shared memory (VERIFY_WG_SLOTRING, ddtree_verify.cu), and its
# gather-alone build; run by workbench/ddtree/h200_slotring.sh beside the default.
SLOTRING_VARIANTS = {
    "slotring": {"impl": "wgmma", "_options": ("-DVERIFY_WG_SLOTRING=1",)},
    "slotring_diag_gather": {"impl": "wgmma", "_options": ("-DVERIFY_WG_SLOTRING=1", "-DVERIFY_WG_DIAG=1")},
    # the gathers alone of the default before the slot ring (ddtree_verify_slotring.json's diag_gather)
    "diag_gather": {"impl": "wgmma", "_options": ("-DVERIFY_WG_DIAG=1", "-DVERIFY_WG_SLOTRING=0")},
}
SLOTRING_PREDICTION = (
    "Written before the first run (code of this commit): the gather probe (ddtree_gather_probe.json) put the "
    "verify kernel's gather at 1.7-1.9 us per 64-key tile with one tile in flight and 1.2-1.3 us with two, so a "
    "tile's gather is bound by its round trip, of which the dependent load of the tile's slot indices from "
    "global memory is one part (about 0.5-0.8 us under load). With the slot indices in shared memory a tile "
    "ahead (slotring), the gather-alone build takes 1.1-1.5 us per tile, and the kernel 2.2-2.4 us per tile "
    "instead of 2.6-2.7: 5-15% less per call at prefix 64k-128k, little change at 4k. Outputs bit-identical "
    "to the default's.")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.ddtree.verify_bench",
                                 description="tree-verify attention: parity against the float64 reference and "
                                             "benchmark against peers (writes DIR/ddtree_verify.json)")
    ap.add_argument("--out", default=None, help="folder for ddtree_verify.json (default: data/measurements/<gpu>)")
    ap.add_argument("--heads", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--prefixes", type=int, nargs="+", default=[4096, 16384, 65536, 131072])
    ap.add_argument("--nodes", type=int, default=33)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--peer-reps", type=int, default=10)
    ap.add_argument("--unroll-variants", type=int, nargs="*", default=[],
                    help="also time the mma.sync kernel compiled with these score-loop unroll factors (default 4)")
    ap.add_argument("--no-mma-variant", action="store_true",
                    help="do not time the other bf16 kernel (mma.sync) beside the default one")
    ap.add_argument("--old-wgmma-variants", action="store_true",
                    help="also time the wgmma variants of the previous runs (wgmma_prefetch, wgmma_a26b7c4)")
    ap.add_argument("--variants", nargs="*", default=None,
                    help=f"time exactly these variants beside the default (names: {sorted(_named_variants())}); "
                         "default: mma and WGMMA_VARIANTS")
    ap.add_argument("--peers", nargs="*", default=list(_PEERS),
                    help=f"peers to time (default: all of {list(_PEERS)}; none: --peers with no names)")
    ap.add_argument("--smoke", action="store_true", help="small parity cases only (for compute-sanitizer)")
    ap.add_argument("--smoke-only", default=None,
                    help="with --smoke: only the cases whose kernel name, -D options or variant hold this")
    ap.add_argument("--no-parity", action="store_true", help="skip the parity grid")
    ap.add_argument("--name", default="ddtree_verify",
                    help="measurement name: writes DIR/NAME.json (default ddtree_verify)")
    ap.add_argument("--extra-notes", default="",
                    help="text appended to the file's notes (e.g. the prediction written before the run)")
    ap.add_argument("--sanitizer-logs", default=None,
                    help="folder with memcheck.log / racecheck.log of SANITIZER_COMMAND runs made before this one, "
                         "recorded under results.sanitizer")
    args = ap.parse_args(argv)

    import torch

    if args.variants is not None:  # names checked before any work, also on a CPU
        bad = [v for v in args.variants if v not in _named_variants()]
        if bad:
            raise SystemExit(f"unknown variants {bad}; known: {sorted(_named_variants())}")
    bad_peers = [p for p in args.peers if p not in _PEERS]
    if bad_peers:
        raise SystemExit(f"unknown peers {bad_peers}; known: {list(_PEERS)}")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if args.smoke:
        cases = [dict(kernel=k, nodes=9, heads=8, prefix=p, dtype=d, repeats=1)
                 for k, d in (("verify_attention[wgmma]", "bfloat16"), ("verify_attention[mma]", "bfloat16"),
                              ("verify_attention", "float32"), ("verify_attention[simple]", "bfloat16"))
                 for p in (0, 150)]
        cases += [dict(kernel=f"verify_attention_batched[{t}]", nodes=9, heads=8, prefix=[0, 70, 130],
                       dtype="bfloat16", repeats=1) for t in ("wgmma", "mma")]
        # the default's single-request form without the prepare launch: many nodes per block, nodes split
        # across blocks, the tail split across chunks
        cases += [dict(kernel="verify_attention[wgmma]", nodes=n, heads=h, prefix=p, dtype="bfloat16", repeats=1,
                       chunk_len=c) for n, h, p, c in ((70, 1, 200, None), (40, 3, 300, 64), (9, 8, 300, 128))]
        # the variants timed beside the default
        for name in WGMMA_VARIANTS:
            cases += [dict(kernel="verify_attention[wgmma]", nodes=9, heads=8, prefix=p, dtype="bfloat16",
                           repeats=1, chunk_len=c, variant=name) for p, c in ((0, None), (300, 128))]
            cases += [dict(kernel="verify_attention_batched[wgmma]", nodes=9, heads=8, prefix=[0, 70, 130],
                           dtype="bfloat16", repeats=1, chunk_len=64, variant=name)]
        if args.smoke_only:
            cases = [c for c in cases if args.smoke_only in " ".join([c["kernel"], *c.get("options", ()),
                                                                      c.get("variant", "")])]
        rows = verify_parity_rows(cases, dev)
        print(_rows_table(rows))
        print("SMOKE", "PASS" if all(r["pass"] for r in rows) else "FAIL")
        return 0 if all(r["pass"] for r in rows) else 1
    rows = None
    if not args.no_parity:
        t0 = time.perf_counter()
        rows = verify_parity_rows(None, dev)
        print(_rows_table(rows))
        print(f"parity: {sum(r['pass'] for r in rows)}/{len(rows)} pass in {time.perf_counter() - t0:.1f} s",
              flush=True)
    if dev != "cuda":
        print("no CUDA GPU: benchmark skipped")
        return 0
    variants = {}
    if args.variants is not None:
        variants = {v: _named_variants()[v] for v in args.variants}
    elif not args.no_mma_variant and auto_impl("bfloat16") == "wgmma":
        variants["mma"] = {"impl": "mma"}  # the previous kernel, same process
        variants.update(WGMMA_VARIANTS)  # the previous default and the steps from it to today's
        if args.old_wgmma_variants:
            variants["wgmma_prefetch"] = {"impl": "wgmma", "_options": ("-DVERIFY_WG_PREFETCH=1",)}
            # the wgmma kernel as measured in a26b7c4: block-wide row-max barrier, O rescaled every tile
            variants["wgmma_a26b7c4"] = {"impl": "wgmma",
                                         "_options": ("-DVERIFY_WG_PAIR_BAR=0", "-DVERIFY_WG_LAZY_RESCALE=0")}
    variants.update({f"mma_unroll{u}": {"impl": "mma", "_options": (f"-DVERIFY_S_UNROLL={u}",)}
                     for u in args.unroll_variants})
    extra: dict[str, Any] = {}
    if rows is not None:
        extra["parity"] = rows
    if args.sanitizer_logs:
        extra["sanitizer"] = read_sanitizer_logs(args.sanitizer_logs)
    res = benchmark_verify(heads=tuple(args.heads), nodes=args.nodes, prefixes=tuple(args.prefixes),
                           reps=args.reps, peer_reps=args.peer_reps, variants=variants, peers=tuple(args.peers),
                           on_point=lambda r: _write(dict(r, **extra), args.out, args.name, args.extra_notes))
    res.update(extra)
    path = _write(res, args.out, args.name, args.extra_notes)
    print(f"wrote {path}")
    print(verify_table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
