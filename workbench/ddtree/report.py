"""Generated blocks of papers/ddtree_kernels.md (tree build / accept / commit, verify attention).

Every measured number in the paper comes from here, read from
``data/measurements/h200/ddtree_kernels.json`` and ``ddtree_verify.json`` (the
verify file's earlier run from git history, :func:`workbench.papers.committed_json`),
and the ddtree part of ``engine_step.json``:

    python -m workbench.ddtree.report            # rewrite papers/ddtree_kernels.md in place
    python -m workbench.ddtree.report --check    # exit 1 if the paper is stale
"""
from __future__ import annotations

import re
import sys
from typing import Any, Callable, Sequence

from workbench import REPO_ROOT, papers
from workbench.ddtree.bench import goal_rows, kernel_results_rows, load_kernel_results
from workbench.ddtree.verify import D_KV, D_LATENT, _plan
from workbench.ddtree.verify_bench import verify_benchmark_rows
from workbench.measure import load_measurement
from workbench.papers import markdown_table

PAPER = REPO_ROOT / "papers" / "ddtree_kernels.md"
VERIFY_FILE = "data/measurements/h200/ddtree_verify.json"
# Committed runs of ddtree_verify.json: (commit of the file, commit of the code it measured, version).
VERIFY_RUNS = (("3f244a8", "b971816", "first mma kernel, timed per eager call"),
               ("32bdb2b", "62fb1b2", "mma kernel after the warp-specialised variant was dropped, CUDA-graph timed"),
               ("a26b7c4", "ba63b37", "wgmma kernel (sm_90a) the default, CUDA-graph timed"),
               ("82e9399", "5de266b", "wgmma kernel with pair barriers and lazy rescale, CUDA-graph timed"),
               ("5731fb7", "1e272c7", "the same wgmma default, ping-pong kernels measured beside it"),
               ("9ebc967", "98aa2b5", "S by warpgroup 0 alone, no prepare launch, one-pass merge (versions 8-10)"))
# Which commit introduced each tree-build method (git log workbench/kernels/ddtree_tree.cu);
# "small_v1" is the kernel that was "small" until e108f3c; "small_br" is e108f3c's "small" (its per-pop
# lane updates as branches), "small" since 712d5f0 the same kernel with those updates as selects.
BUILD_METHOD_COMMITS = {"heap": "adddc5e", "warp": "54d0b0b", "small_v1": "9ddfd1c", "small_br": "e108f3c",
                        "small": "712d5f0"}
TREE_FILE = "data/measurements/h200/ddtree_kernels.json"
# Earlier committed runs of ddtree_kernels.json: (commit of the file, commit of the code, what "small" was).
TREE_RUNS = (("5101690", "0d28105", "small = today's small_v1 (sorted list in registers)"),
             ("dcbcfd7", "575d26d", "small = today's small_br (lane per node, branching updates)"))
__all__ = ["BLOCKS", "PAPER", "main", "render", "tree_floor_rows"]


def _us(ms: float | None) -> str:
    return "-" if ms is None else f"{ms * 1e3:.1f}"


def _ms(ms: float | None, digits: int = 3) -> str:
    return "-" if ms is None else f"{ms:.{digits}f}"


def _need(doc: dict[str, Any] | None, name: str) -> dict[str, Any]:
    if not doc:
        raise FileNotFoundError(f"data/measurements/h200/{name}.json is not committed")
    return doc


def _tree() -> dict[str, Any]:
    return _need(load_kernel_results(), "ddtree_kernels")


def _verify() -> dict[str, Any]:
    return _need(load_measurement("ddtree_verify"), "ddtree_verify")


def block_provenance() -> str:
    rows = []
    for name, doc in (("ddtree_kernels", _tree()), ("ddtree_verify", _verify())):
        p = doc["provenance"]
        rows.append({"file": f"`data/measurements/h200/{name}.json`", "GPU": p.get("gpu"),
                     "code commit": str(p.get("git_commit", "-"))[:7], "date (UTC)": p.get("date_utc"),
                     "torch / CuPy / CUDA": f"{p.get('torch')} / {p.get('cupy')} / {p.get('cuda_runtime')}",
                     "driver": p.get("driver")})
    return markdown_table(rows)


def block_tree_goals() -> str:
    met = {True: "yes", False: "**no**"}
    return markdown_table([{"goal (issue 3)": r["goal"], "measured": r["measured"], "met": met[bool(r["met"])]}
                           for r in goal_rows(_tree())])


def block_tree_kernels() -> str:
    rows = [r for r in kernel_results_rows(_tree()) if not r["kernel"].startswith("build_")]
    out = [{"kernel": r["kernel"], "graph us / call": _us(r["gpu_graph_us"] / 1e3),
            "eager us / call": _us(r["gpu_eager_us"] / 1e3),
            "CPU reference ms": _ms(r["cpu_ref_ms"]),
            "x CPU (graph)": "-" if r["speedup_graph"] is None else f"{r['speedup_graph']:.0f}"} for r in rows]
    p = _tree()["parameters"]
    return (f"Batch {p['accept']['batch']}; trees of 33 nodes (budget 32). {p['timing']}.\n\n"
            + markdown_table(out))


def _build_points(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Build timings of one run, each with a ``label``: the method, plus ``[4w]`` for "small" with
    several requests per block."""
    out = []
    for k, v in res.items():
        if k.startswith("build_") and isinstance(v, dict) and "budget" in v and "gpu_graph_ms" in v:
            w = v.get("warps_per_block", 1)
            out.append({**v, "label": v.get("method", "auto") + (f"[{w}w]" if w > 1 else "")})
    return out


def block_tree_build() -> str:
    res = _tree()["results"]
    allpts = _build_points(res)
    budgets = sorted({v["budget"] for v in allpts})
    labels = {v["label"] for v in allpts}
    methods = [m for m in BUILD_METHOD_COMMITS if m in labels] + sorted(labels - set(BUILD_METHOD_COMMITS))
    rows = []
    for b in budgets:
        pts = {v["label"]: v for v in allpts if v["budget"] == b}
        cpu = next(iter(pts.values()))["cpu_ms"]
        row: dict[str, Any] = {"budget": b, "K": next(iter(pts.values()))["K"]}
        for m in methods:
            row[f"{m} us"] = _us(pts[m]["gpu_graph_ms"]) if m in pts else "-"
        best = min(pts.values(), key=lambda v: v["gpu_graph_ms"])
        row["fastest"] = best["label"]
        row["CPU heapq ms"] = _ms(cpu)
        row["x CPU (fastest, graph)"] = f"{best['speedup_graph']:.0f}"
        row["x CPU (fastest, eager)"] = f"{best['speedup_eager']:.0f}"
        rows.append(row)
    names = [f"`{m}` ({BUILD_METHOD_COMMITS[m]})" if m in BUILD_METHOD_COMMITS else f"`{m}`" for m in methods]
    return ("Batch 64, L = 15; GPU times per call inside a replayed CUDA graph; the CPU reference builds the "
            "whole batch with heapq. Methods: " + ", ".join(names)
            + ("; `small[4w]`: `small` with four requests per thread block" if "small[4w]" in labels else "")
            + ".\n\n" + markdown_table(rows))


def block_tree_pops() -> str:
    """Small kernels' time against the number of pops (same run), the linear fit, the graph-node
    floor, and the headline of the earlier committed run(s)."""
    res = _tree()["results"]
    sweep = next((v for k, v in res.items() if k.startswith("build_pops_sweep_")), None)
    if not sweep:
        return "This run has no pops sweep (it predates e108f3c).\n"
    methods = sorted({r["method"] for r in sweep}, key=lambda m: (m != "small", m))
    rows = []
    for pops in sorted({r["pops"] for r in sweep}):
        row: dict[str, Any] = {"pops (= budget)": pops,
                               "K": next(r["K"] for r in sweep if r["pops"] == pops)}
        for m in methods:
            r = next((r for r in sweep if r["pops"] == pops and r["method"] == m), None)
            row[f"{m} us"] = _us(r["gpu_graph_ms"]) if r else "-"
        rows.append(row)
    fits = []
    for m in methods:
        f = res.get(f"build_pops_fit_{m}")
        if f:
            fits.append(f"`{m}` {f['fixed_us']:.2f} us + {f['ns_per_pop']:.0f} ns per pop")
    text = ("Batch 64, L = 15, K = min(budget, 32); per call in a replayed CUDA graph. Least-squares line "
            "time = fixed + pops x per-pop: " + "; ".join(fits) + ".")
    floor = res.get("graph_node_floor")
    if floor:
        text += (f" One graph node of a tiny torch kernel ({floor['what']}) takes "
                 f"{floor['graph_us_per_call']:.1f} us in the same run.")
    earlier, cpus = [], []
    for fc, cc, what in TREE_RUNS:
        doc = papers.committed_json(fc, TREE_FILE)
        h = doc and doc["results"].get("build_B64_L15_budget32")
        if h:
            earlier.append(f"code {cc} (file {fc}; {what}): {_us(h['gpu_graph_ms'])} us, "
                           f"{h['speedup_graph']:.0f}x the CPU reference of that run ({_ms(h['cpu_ms'])} ms)")
            cpus.append(h["cpu_ms"])
    if earlier:
        text += " Headline (budget 32) in earlier committed runs: " + "; ".join(earlier) + "."
    head = res.get("build_B64_L15_budget32")
    if head and cpus:
        fastest = min(cpus + [head["cpu_ms"]])
        text += (f" This run's CPU reference took {_ms(head['cpu_ms'])} ms; against the fastest CPU time of "
                 f"the committed runs ({_ms(fastest)} ms) this run's headline is "
                 f"{fastest / head['gpu_graph_ms']:.0f}x.")
    return text + "\n\n" + markdown_table(rows)


def block_tree_sanitizer() -> str:
    san = _tree()["results"].get("sanitizer")
    if not san:
        return "This run recorded no sanitizer result.\n"
    if "error" in san:
        return f"Sanitizers not run: {san['error']}.\n"
    rows = []
    for tool, r in san.items():
        rows.append({"tool": tool, "command": f"`{r.get('command', '-')}`",
                     "driver ran to its end": r.get("driver_done"), "exit code": r.get("returncode"),
                     "summary": "; ".join(x.lstrip("= ") for x in r.get("summary") or []) or "-",
                     "errors / hazards": "-" if r.get("errors") is None else r["errors"]})
    return markdown_table(rows)


def tree_floor_rows(tree: dict[str, Any] | None = None, verify: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Bytes each tree kernel must move (inputs read once, outputs written once) over the copy bandwidth
    measured in the ddtree_verify run, beside the measured graph-replay time. The flops of these
    kernels are a few per node, so the bytes term is the floor."""
    tree = tree or _tree()
    verify = verify or _verify()
    gbps = verify["results"]["copy_gb_per_s"]
    res = tree["results"]
    rows = []
    b = res["build_B64_L15_budget32"]
    B, L, K, n = b["batch"], b["L"], b["K"], b["budget"] + 1
    # in: float32 log-probs and int64 token ids [B, L, K]; out: tokens, parents, depths, ranks int64 + scores f32
    rows.append(("build B=64 L=15 budget=32", B * L * K * (4 + 8) + B * n * (4 * 8 + 4), b["gpu_graph_ms"]))
    acc = res["accept_B64_n33"]
    # in: tokens, parents int64 and target argmax int64 [B, n]; out: accepted nodes [B, n], length, bonus
    rows.append(("accept B=64 n=33", B * n * 8 * 3 + B * n * 8 + B * 2 * 8, acc["gpu_graph_ms"]))
    vis = res["visibility_B64_n33"]
    rows.append(("visibility B=64 n=33", B * n * 8 + B * n * n, vis["gpu_graph_ms"]))
    tk = next((k for k in res if k.startswith("topk_logprobs_")), None)
    if tk:
        V = tree["parameters"]["topk_vocab"]
        # in: float32 logits [B, L, V]; out: float32 log-probs and int64 ids [B, L, K]
        rows.append((f"topk_logprobs B=64 L=15 V={V} k={K}", B * L * V * 4 + B * L * K * 12,
                     res[tk]["gpu_graph_ms"]))
    out = []
    for name, nbytes, ms in rows:
        floor_ms = nbytes / (gbps * 1e9) * 1e3
        out.append({"kernel": name, "bytes": nbytes, "bytes / copy BW us": f"{floor_ms * 1e3:.3f}",
                    "measured us (graph)": _us(ms), "% of floor": f"{floor_ms / ms * 100:.1f}"})
    return out


def block_tree_floor() -> str:
    gbps = _verify()["results"]["copy_gb_per_s"]
    return (f"Copy bandwidth {gbps:.0f} GB/s (measured in the ddtree_verify run; ddtree_kernels.json has none).\n\n"
            + markdown_table(tree_floor_rows()))


def block_round() -> str:
    rnd = _tree()["results"]["round"]
    rows = []
    for v in ("verify_torch", "verify_kernel"):
        if v in rnd:
            r = rnd[v]
            rows.append({"verify": v, "no host sync": r["no_host_sync"], "graph == eager": r["graph_matches_eager"],
                         "eager ms": _ms(r["eager_ms"], 2), "graph ms": _ms(r["graph_ms"], 2),
                         "mean accepted length": f"{r['mean_accepted_length']:.3f}"})
    return (f"Batch {rnd['batch']}, L {rnd['L']}, budget {rnd['budget']}, prefix {rnd['prefix']}, {rnd['heads']} "
            f"heads, toy vocabulary {rnd['vocab']}.\n\n" + markdown_table(rows))


def block_parity() -> str:
    tree = _tree()["results"]
    par = tree.get("parity", [])
    kernels = sorted({r["kernel"] for r in par})
    t = [{"kernel": k, "rows": sum(r["kernel"] == k for r in par),
          "bit-exact": sum(bool(r.get("bit_exact")) for r in par if r["kernel"] == k),
          "passed": sum(bool(r.get("passed")) for r in par if r["kernel"] == k)} for k in kernels]
    vpar = _verify()["results"]["parity"]
    vk = sorted({r["kernel"] for r in vpar})
    v = [{"kernel": k, "rows": sum(r["kernel"] == k for r in vpar),
          "passed": sum(bool(r["pass"]) for r in vpar if r["kernel"] == k),
          "max rel. error": f"{max(r['max_rel_err'] for r in vpar if r['kernel'] == k):.2e}",
          "max lse error": f"{max((r['lse_max_abs_err'] or 0) for r in vpar if r['kernel'] == k):.2e}"} for k in vk]
    failed = [f"`{r['kernel']}` at {r['shapes']} (rel. error {r['max_rel_err']:.2e}, lse error "
              f"{r['lse_max_abs_err']:.2e}, tolerance {r['tolerance']:g})" for r in vpar if not r["pass"]]
    text = ("Tree kernels (ddtree_kernels.json, all-passed flag: "
            f"{tree.get('parity_all_passed')}):\n\n" + markdown_table(t)
            + "\nVerify attention against the float64 reference (ddtree_verify.json):\n\n" + markdown_table(v))
    if failed:
        text += "\nRows that failed: " + "; ".join(failed) + ".\n"
    return text


def block_verify_points() -> str:
    doc = _verify()
    res = doc["results"]
    pts = {(p["heads"], p["prefix"]): p for p in res["points"]}
    variants = sorted({v for p in res["points"] for v in p.get("variants", {})})
    rows = []
    for r in verify_benchmark_rows(doc):
        p = pts[(r["heads"], r["prefix"])]
        rows.append({"H": r["heads"], "prefix": r["prefix"], "MB read": f"{p['bytes'] / 1e6:.1f}",
                     "GFLOP": f"{p['flops'] / 1e9:.1f}",
                     "bytes time ms": f"{p['bytes'] / (res['copy_gb_per_s'] * 1e9) * 1e3:.4f}",
                     "flops time ms": f"{p['flops'] / (res['bf16_matmul_tflops'] * 1e12) * 1e3:.4f}",
                     "bound": r["floor_bound"], "kernel ms": _ms(r["kernel_ms"], 4),
                     **{f"{v} ms": _ms(r.get(f"{v}_ms"), 4) for v in variants},
                     **({"mma / kernel": f"{r['mma_ms'] / r['kernel_ms']:.2f}"} if r.get("mma_ms") else {}),
                     **({"5de266b / kernel": f"{r['wgmma_5de266b_ms'] / r['kernel_ms']:.2f}"}
                        if r.get("wgmma_5de266b_ms") else {}),
                     "% of floor": f"{r['percent_of_floor']:.1f}", "TFLOP/s": f"{r['achieved_tflops']:.0f}",
                     **({"pipelined ms": _ms(p["pipelined_ms"], 4),
                         "pipelined % of floor": f"{100 * p['floor_ms'] / p['pipelined_ms']:.1f}"}
                        if p.get("pipelined_ms") else {}),
                     **({"in-graph ms": _ms(p["batched_ms"], 4),
                         "in-graph % of floor": f"{p['percent_of_floor_batched']:.1f}"}
                        if p.get("batched_ms") else {}),
                     "naive torch ms": _ms(r.get("naive_torch_ms")), "SDPA ms": _ms(r.get("sdpa_dense_mask_ms")),
                     "x best peer": f"{r['speedup_vs_best_peer']:.1f}"})
    flex = {p["peers"]["flex_attention"]["status"] for p in res["points"] if "flex_attention" in p["peers"]}
    gfloor = res.get("graph_launch_floor_ms")
    gtext = (f" A CUDA graph of one minimal kernel node, timed the same way: {gfloor * 1e3:.1f} us."
             if gfloor else "")
    if res.get("graph_node_ms"):
        calls = sorted({p["batched_calls"] for p in res["points"] if p.get("batched_calls")})
        gtext += (f" `in-graph`: the calls captured back to back in one graph ({'/'.join(map(str, calls))} calls "
                  "over the rotated KV sets), per call: the device time with no host launch latency, as inside an "
                  f"engine's captured decode step; one minimal node costs {res['graph_node_ms'] * 1e3:.1f} us that "
                  "way.")
    return (f"{res['points'][0]['nodes']} tree nodes, bf16. Measured in the same run: copy bandwidth "
            f"{res['copy_gb_per_s']:.0f} GB/s, bf16 matmul {res['bf16_matmul_tflops']:.0f} TFLOP/s.{gtext} "
            f"FlexAttention status at every point: {', '.join(sorted(flex)) or '-'}.\n\n" + markdown_table(rows))


def block_verify_goals() -> str:
    res = _verify()["results"]
    mp = res["min_percent_of_floor"]
    sp = [p["speedup_vs_best_peer"] for p in res["points"]]
    worst = min(res["points"], key=lambda p: p["percent_of_floor"])
    rows = [{"goal (issue 3)": "faster than every peer at every point",
             "measured": f"{min(sp):.1f}x-{max(sp):.1f}x the best peer", "met": "yes" if res["all_faster_than_peers"]
             else "**no**"},
            {"goal (issue 3)": ">= 50% of floor at every point",
             "measured": f"min {mp:.1f}% (H={worst['heads']}, prefix {worst['prefix']}), max "
                         f"{max(p['percent_of_floor'] for p in res['points']):.1f}%",
             "met": "yes" if mp >= 50 else "**no**"}]
    if res.get("min_percent_of_floor_batched") is not None:
        pts = res["points"]
        wb = min(pts, key=lambda p: p["percent_of_floor_batched"])
        rows.append({"goal (issue 3)": ">= 50% of floor at every point, in-graph time (calls back to back in one graph)",
                     "measured": f"min {wb['percent_of_floor_batched']:.1f}% (H={wb['heads']}, prefix {wb['prefix']}), "
                                 f"max {max(p['percent_of_floor_batched'] for p in pts):.1f}%; "
                                 f"{sum(p['percent_of_floor_batched'] >= 50 for p in pts)} of {len(pts)} points",
                     "met": "yes" if wb["percent_of_floor_batched"] >= 50 else "**no**"})
        if any(p.get("faster_than_all_peers_batched") is not None for p in pts):
            ok = all(p.get("faster_than_all_peers_batched") is not False for p in pts)
            rows.append({"goal (issue 3)": "faster than every peer, in-graph time",
                         "measured": "at every point" if ok else "not at every point", "met": "yes" if ok else "**no**"})
    return markdown_table(rows)


def block_verify_sanitizer() -> str:
    san = _verify()["results"].get("sanitizer")
    if not san:
        return "The committed ddtree_verify.json recorded no sanitizer result.\n"
    rows = [{"tool": tool, "command": f"`{r.get('command', '-')}`", "smoke cases": r.get("smoke_verdict"),
             "exit code": r.get("returncode"), "summary": "; ".join(r.get("summary") or []) or r.get("error", "-"),
             "errors / hazards": "-" if r.get("errors") is None else r["errors"]} for tool, r in san.items()]
    return (f"Verify kernels (code {_verify()['provenance']['git_commit'][:7]}, `results.sanitizer` of "
            "ddtree_verify.json):\n\n" + markdown_table(rows))


def block_verify_versions() -> str:
    runs = []
    for file_commit, code_commit, what in VERIFY_RUNS:
        doc = papers.committed_json(file_commit, VERIFY_FILE)
        if doc is None:
            return (f"git history with commit {file_commit} is not available here; the runs are commits "
                    + ", ".join(c for c, _, _ in VERIFY_RUNS) + ".\n")
        runs.append((file_commit, code_commit, what, {(p["heads"], p["prefix"]): p for p in doc["results"]["points"]}))
    rows = []
    for key in runs[-1][3]:
        row: dict[str, Any] = {"H": key[0], "prefix": key[1]}
        for fc, cc, _, pts in runs:
            p = pts.get(key)
            row[f"{cc} ms"] = _ms(p["median_ms"], 4) if p else "-"
            if p and p.get("mode") == "cuda_graph":
                row[f"{cc} eager ms"] = _ms(p.get("eager_median_ms"), 4)
            row[f"{cc} % floor"] = f"{p['percent_of_floor']:.1f}" if p else "-"
            row[f"{cc} x best peer"] = f"{p['speedup_vs_best_peer']:.1f}" if p else "-"
        rows.append(row)
    legend = "; ".join(f"`{cc}`: {what} (file committed in {fc})" for fc, cc, what, _ in runs)
    return legend + ".\n\n" + markdown_table(rows)


# The run that measured the ping-pong kernels (version 7): (commit of the file, commit of the code).
PINGPONG_RUN = ("5731fb7", "1e272c7")
# Written before that run (commit cea4701, papers/ddtree_kernels.md version 7): predicted ms of pingpong and
# pingpong_rem per (H, prefix); None where no prediction was made.
PINGPONG_PREDICTED = {(8, 4096): (0.032, 0.032), (8, 16384): (0.046, 0.045), (8, 65536): (0.109, 0.100),
                      (8, 131072): (0.192, 0.171), (64, 4096): (0.066, None), (64, 16384): (0.167, None),
                      (64, 65536): (0.570, None), (64, 131072): (1.108, None)}
# Measurement files of the probes (workbench.ddtree.verify_probe) and ncu reports, by the code they measured.
PROBE_FILES = (("ddtree_verify_probe_d33d069", "d33d069"), ("ddtree_verify_probe", "0929e2e"),
               ("ddtree_verify_probe_g1_f9c5bfa", "f9c5bfa"), ("ddtree_verify_probe_8c7598f", "8c7598f"),
               ("ddtree_verify_probe_98aa2b5", "98aa2b5"), ("ddtree_verify_probe_f0061e9", "f0061e9"))
NCU_LAUNCHES = "data/measurements/h200/ddtree_verify_ncu_d33d069.txt"
NCU_SECTIONS = "data/measurements/h200/ddtree_verify_ncu_e95fa7b.txt"
G1_FILE = "ddtree_verify_g1_f9c5bfa"
TILE_BYTES = 64 * 576 * 2  # one 64-key tile of bf16 KV rows, gathered by every thread block


def _need_file(name: str) -> dict[str, Any]:
    return _need(load_measurement(name), name)


def block_verify_pingpong() -> str:
    doc = papers.committed_json(PINGPONG_RUN[0], VERIFY_FILE)
    if doc is None:
        return f"git history with commit {PINGPONG_RUN[0]} is not available here.\n"
    rows = []
    for p in doc["results"]["points"]:
        v = {k: x["median_ms"] for k, x in p["variants"].items()}
        pp, pr = PINGPONG_PREDICTED[(p["heads"], p["prefix"])]
        rows.append({"H": p["heads"], "prefix": p["prefix"], "default ms": _ms(p["median_ms"], 4),
                     "pingpong predicted ms": _ms(pp), "pingpong ms": _ms(v["pingpong"], 4),
                     "pingpong / default": f"{v['pingpong'] / p['median_ms']:.2f}",
                     "slot_late ms": _ms(v["pingpong_slot_late"], 4), "bar_sync ms": _ms(v["pingpong_bar_sync"], 4),
                     "pingpong_rem predicted ms": _ms(pr), "pingpong_rem ms": _ms(v["pingpong_rem"], 4),
                     "pingpong_rem / default": f"{v['pingpong_rem'] / p['median_ms']:.2f}",
                     "pingpong_rem2 ms": _ms(v["pingpong_rem2"], 4)})
    san = doc["results"].get("sanitizer", {})
    hz = san.get("racecheck", {}).get("errors")
    return (f"Code {PINGPONG_RUN[1]}, file committed in {PINGPONG_RUN[0]} (all kernels in one process); racecheck "
            f"of the ping-pong smoke cases: {hz} hazards, memcheck: {san.get('memcheck', {}).get('errors')} "
            "errors.\n\n" + markdown_table(rows))


def block_verify_chain() -> str:
    """Each step from the previous default to today's, in us, from the variants timed in one process."""
    doc = _verify()
    rows = []
    for p in doc["results"]["points"]:
        v = {k: x["median_ms"] for k, x in p.get("variants", {}).items()}
        if not {"wgmma_5de266b", "s1_prepare_merge1", "s1_merge1", "wgmma_98aa2b5"} <= set(v):
            return "The committed ddtree_verify.json has no chain of variants.\n"
        rows.append({"H": p["heads"], "prefix": p["prefix"], "wgmma_5de266b ms": _ms(v["wgmma_5de266b"], 4),
                     "S1 (us)": f"{(v['s1_prepare_merge1'] - v['wgmma_5de266b']) * 1e3:+.1f}",
                     "no prepare (us)": f"{(v['s1_merge1'] - v['s1_prepare_merge1']) * 1e3:+.1f}",
                     "one-pass merge (us)": f"{(v['wgmma_98aa2b5'] - v['s1_merge1']) * 1e3:+.1f}",
                     "slot ring (us)": f"{(p['median_ms'] - v['wgmma_98aa2b5']) * 1e3:+.1f}",
                     "default ms": _ms(p["median_ms"], 4),
                     "default / wgmma_5de266b": f"{p['median_ms'] / v['wgmma_5de266b']:.2f}"})
    return (f"Code {doc['provenance']['git_commit'][:7]}, ddtree_verify.json; each step's change of the median "
            "graph-replay time (negative: faster).\n\n" + markdown_table(rows))


GATHER_FILE = "ddtree_gather_probe"
GATHER_FIRST_FILE = "ddtree_gather_probe_50b6293"   # the run that led to version 14 (a fill kernel in every timed call)
SLOTRING_FILE = "ddtree_verify_slotring"
WS_FILE = "ddtree_verify_ws"
WS16_FILE = "ddtree_verify_ws16"


def block_verify_gather_probe() -> str:
    """The gather alone by three ways of issuing it, at one and two tiles in flight (workbench.ddtree.gather_probe)."""
    from workbench.ddtree.gather_probe import gather_rows_table

    doc = _need_file(GATHER_FILE)
    res = doc["results"]
    bad = res["layout_check"]
    return (f"From `{GATHER_FILE}.json` (code {doc['provenance']['git_commit'][:7]}, {doc['provenance']['date_utc']}; "
            "`python -m workbench.ddtree.gather_probe`): in-graph time per call; `d1` / `d2`: one / two tiles in "
            "flight; `verify_diag_gather` and `verify_attention`: the verify kernel's gather-alone build and its "
            "attention launch at the same point, same process. Layout check (mismatching 16-byte chunks, every "
            f"method and depth): {', '.join(f'{k} {v}' for k, v in bad.items())}. The run that led to version 14 "
            f"(`{GATHER_FIRST_FILE}.json`) timed a fill kernel of the probe's unused check counter inside every "
            "gather call; this file is the re-run without it (`verify_*` paths: today's default kernel).\n\n"
            + markdown_table(gather_rows_table(res)))


def _variant_rows(doc: dict[str, Any], names: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    for p in doc["results"]["points"]:
        row: dict[str, Any] = {"H": p["heads"], "prefix": p["prefix"], "default one replay us": _us(p["median_ms"]),
                               "default in-graph us": _us(p["batched_ms"])}
        for n in names:
            v = p["variants"].get(n, {})
            row[f"{n} one replay us"] = _us(v.get("median_ms"))
            row[f"{n} in-graph us"] = _us(v.get("batched_ms"))
            row[f"{n} / default, one replay"] = _ratio(v.get("median_ms"), p["median_ms"])
        rows.append(row)
    return rows


def block_verify_slotring() -> str:
    doc = _need_file(SLOTRING_FILE)
    names = ("slotring", "diag_gather", "slotring_diag_gather")
    return (f"From `{SLOTRING_FILE}.json` (code {doc['provenance']['git_commit'][:7]}, all in one process; `default` "
            "was then the kernel without the slot ring; `diag_gather` / `slotring_diag_gather`: the gathers alone "
            "(`-DVERIFY_WG_DIAG=1`) without / with it).\n\n" + markdown_table(_variant_rows(doc, names)))


def _ws_block(name: str, names: Sequence[str], legend: str) -> str:
    doc = _need_file(name)
    san = {}
    for tool in ("memcheck", "racecheck"):
        path = REPO_ROOT / "data/measurements/h200" / f"{name}_logs" / f"{tool}.txt"
        if path.exists():
            m = re.search(r"(ERROR|RACECHECK) SUMMARY: (\d+)", path.read_text())
            san[tool] = m.group(2) if m else "-"
    return (f"From `{name}.json` (code {doc['provenance']['git_commit'][:7]}, all in one process; {legend}); memcheck "
            f"errors {san.get('memcheck', '-')}, racecheck hazards {san.get('racecheck', '-')} (`{name}_logs/`).\n\n"
            + markdown_table(_variant_rows(doc, names)))


def block_verify_ws() -> str:
    return _ws_block(WS_FILE, ("ws", "wgmma_98aa2b5"), "`ws`: version 15, `wgmma_98aa2b5`: the default before the slot "
                                                       "ring, `default`: the slot ring")


def block_verify_ws16() -> str:
    return _ws_block(WS16_FILE, ("ws16",), "`ws16`: version 16, `default`: the slot ring")


INGRAPH_PROBE_FILE = "ddtree_verify_probe_ingraph"


def block_verify_ingraph_breakdown() -> str:
    """The call's launches in-graph (verify_probe --in-graph): attention and merge alone, the call, and the attention
    launch without its partial-output stores (-DVERIFY_WG_NOSTORE=1, a diagnostic build)."""
    doc = _need_file(INGRAPH_PROBE_FILE)
    rows = []
    for b in doc["results"]["breakdown"]:
        d, n = b["points"]["default"], b["points"].get("nostore", {})
        rows.append({"H": b["heads"], "prefix": b["prefix"], "attention us": _us(d.get("attention_in_graph")),
                     "merge us": _us(d.get("merge_in_graph")), "call us": _us(d.get("call_in_graph")),
                     "merge / call": _ratio(d.get("merge_in_graph"), d.get("call_in_graph")),
                     "attention without the partial stores us": _us(n.get("attention_in_graph")),
                     "stores us": f"{(d['attention_in_graph'] - n['attention_in_graph']) * 1e3:+.1f}"
                     if n.get("attention_in_graph") else "-"})
    mn = doc["results"]["minimal_nodes"]
    return (f"From `{INGRAPH_PROBE_FILE}.json` (code {doc['provenance']['git_commit'][:7]}; `python -m "
            "workbench.ddtree.verify_probe --in-graph`): each launch alone and the whole call, each captured back to "
            "back in one graph over the rotated KV sets, per call; `stores`: the attention launch's time minus that of "
            f"its build without the partial-output stores. A graph of one minimal node replayed alone: "
            f"{mn['nodes_1_ms'] * 1e3:.1f} us in this process.\n\n" + markdown_table(rows))


MERGE3_FILES = ("ddtree_verify_probe_merge3", "ddtree_verify_merge3")


def block_verify_merge3() -> str:
    """Version 17: the one-pass merge beside the default, in-graph per launch and per call (both files one process each)."""
    probe, bench = (_need_file(n) for n in MERGE3_FILES)
    rows = []
    for b in probe["results"]["breakdown"]:
        d, m = b["points"]["default"], b["points"]["merge3"]
        rows.append({"H": b["heads"], "prefix": b["prefix"], "merge alone us (default)": _us(d["merge_in_graph"]),
                     "merge alone us (merge3)": _us(m["merge_in_graph"]),
                     "call - attention us (default)": _us(d["call_in_graph"] - d["attention_in_graph"]),
                     "call us (default)": _us(d["call_in_graph"]), "call us (merge3)": _us(m["call_in_graph"])})
    text = (f"`{MERGE3_FILES[0]}.json` (code {probe['provenance']['git_commit'][:7]}, `verify_probe --in-graph`; each "
            "launch alone and the call back to back in one graph, KV rotated over input sets):\n\n" + markdown_table(rows))
    return (text + f"\n\n`{MERGE3_FILES[1]}.json` (the benchmark of both in one process):\n\n"
            + markdown_table(_variant_rows(bench, ("merge3",))))


PDL_FILES = (("ddtree_verify_pdl", ("pdl_merge",)), ("ddtree_verify_pdl_late", ("pdl_merge", "pdl_merge_late")))


def block_verify_pdl() -> str:
    """Versions 18 / 18b: the merge under programmatic dependent launch beside the default, one process per file."""
    parts = []
    for name, variants in PDL_FILES:
        doc = _need_file(name)
        parts.append(f"`{name}.json` (code {doc['provenance']['git_commit'][:7]}, all in one process):\n\n"
                     + markdown_table(_variant_rows(doc, variants)))
    return "\n\n".join(parts)


def _fastest_gather(probe: dict[str, Any]) -> tuple[float, str]:
    """(L2 -> SM TB/s, path) of the fastest gather the gather probe timed (its own paths, not the verify kernel's)."""
    return max((p["l2_to_sm_tb_s"], name) for pt in probe["results"]["points"] for name, p in pt["paths"].items()
               if not name.startswith("verify"))


KV_ROW_BYTES = D_KV * 2  # one bf16 KV row (latent 512 + rope 64), also one bf16 query row
PARTIAL_VALUE_BYTES = 2  # the narrowest partial output a merge could read (bf16; the kernel writes float32)


def split_merge_bound(rows: int, keys: int, launches: int, *, sms: int, gather_bytes_per_s: float,
                      matmul_flops_per_s: float, node_s: float, pad_rows: bool = True) -> dict[str, float]:
    """The least time, in seconds, of a split-prefix verify kernel at one point, over every chunk count C.

    The key range is cut into C chunks and every block of 64 query rows (``rows`` of them, padded up to 64 when
    ``pad_rows``, the wgmma form) is a thread block per chunk: n = blocks x C thread blocks share ``sms`` SMs, so the
    busiest SM carries at least 1 / min(n, sms) of the work. Into the SMs go each block's query rows and every key row
    of its chunk (``KV_ROW_BYTES`` each) at ``gather_bytes_per_s`` over all SMs; the tensor work is
    2 x rows x keys x (576 + 512) flops at ``matmul_flops_per_s``; the SM time is the larger of the two (perfect
    overlap). With C > 1 the merge then reads C partial outputs of 512 values per row at ``PARTIAL_VALUE_BYTES``
    each, at the gather rate. ``launches`` graph nodes of ``node_s`` each (2: a merge launch, 1: the merge inside the
    attention kernel, its grid-wide wait not counted). Nothing is counted for prologue, pipeline fill, softmax,
    partial writes or tail. Returns the minimum over C of the total and its parts."""
    if rows < 1 or keys < 1 or launches not in (1, 2) or sms < 1:
        raise ValueError(f"need rows >= 1, keys >= 1, launches 1 or 2 and sms >= 1; got {rows}, {keys}, "
                         f"{launches}, {sms}")
    blocks = -(-rows // 64)
    q_rows = blocks * 64 if pad_rows else rows
    best: dict[str, float] | None = None
    for chunks in range(1, max(2, -(-2 * sms // blocks)) + 1):  # beyond two waves only the merge grows
        share = sms / min(blocks * chunks, sms)  # busiest SM's share of the GPU's work, over 1 / sms
        bytes_s = (chunks * q_rows + blocks * keys) * KV_ROW_BYTES / gather_bytes_per_s * share
        tensor_s = 2.0 * q_rows * keys * (D_KV + D_LATENT) / matmul_flops_per_s * share
        merge_s = chunks * rows * D_LATENT * PARTIAL_VALUE_BYTES / gather_bytes_per_s if chunks > 1 else 0.0
        total = launches * node_s + max(bytes_s, tensor_s) + merge_s
        if best is None or total < best["total_s"]:
            best = {"total_s": total, "chunks": chunks, "bytes_s": bytes_s, "tensor_s": tensor_s,
                    "merge_s": merge_s, "nodes_s": launches * node_s}
    assert best is not None
    return best


def verify_bound_rows(doc: dict[str, Any] | None = None, probe: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Per headline point, the least in-graph time of a split-prefix kernel (``split_merge_bound``) at the measured
    rates: the file's matmul rate and graph node, the gather probe's fastest L2 -> SM rate. Two forms: the built
    family (64 query rows per tensor-core block, a merge launch), the same with the merge inside the attention
    launch, and that with no padding rows either; each against what 50% of the floor allows."""
    doc, probe = doc or _verify(), probe or _need_file(GATHER_FILE)
    res = doc["results"]
    rates = {"sms": doc["provenance"].get("gpu_sm_count", 132), "gather_bytes_per_s": _fastest_gather(probe)[0] * 1e12,
             "matmul_flops_per_s": res["bf16_matmul_tflops"] * 1e12, "node_s": res["graph_node_ms"] * 1e-3}
    rows = []
    for p in res["points"]:
        q_rows, keys = p["nodes"] * p["heads"], p["prefix"] + p["nodes"]
        two = split_merge_bound(q_rows, keys, 2, **rates)
        one = split_merge_bound(q_rows, keys, 1, **rates)
        loose = split_merge_bound(q_rows, keys, 1, pad_rows=False, **rates)
        allow = 2 * p["floor_ms"] * 1e-3
        rows.append({"H": p["heads"], "prefix": p["prefix"], "50% of floor allows us": f"{allow * 1e6:.1f}",
                     "chunks": two["chunks"], "bytes into SMs us": f"{two['bytes_s'] * 1e6:.1f}",
                     "tensor work us": f"{two['tensor_s'] * 1e6:.1f}", "merge reads us": f"{two['merge_s'] * 1e6:.2f}",
                     "two nodes us": f"{two['nodes_s'] * 1e6:.1f}",
                     "bound, merge launch us": f"{two['total_s'] * 1e6:.1f}",
                     "/ allowance": f"{two['total_s'] / allow:.2f}",
                     "bound, one launch us": f"{one['total_s'] * 1e6:.1f}",
                     "/ allowance (one launch)": f"{one['total_s'] / allow:.2f}",
                     "/ allowance (one launch, rows unpadded)": f"{loose['total_s'] / allow:.2f}",
                     "in-graph now us": _us(p.get("batched_ms"))})
    return rows


def block_verify_bound() -> str:
    doc, probe = _verify(), _need_file(GATHER_FILE)
    best = _fastest_gather(probe)
    return (f"Code {doc['provenance']['git_commit'][:7]} (ddtree_verify.json: floor, matmul rate "
            f"{doc['results']['bf16_matmul_tflops']:.0f} TFLOP/s, graph node {doc['results']['graph_node_ms'] * 1e3:.1f} "
            f"us) and `{GATHER_FILE}.json` (fastest gather: {best[1]}, {best[0]:.2f} TB/s L2 -> SMs); "
            "`report.verify_bound_rows`, `report.split_merge_bound` (the chunk count that gives the least bound with "
            "a merge launch; bytes, tensor work and merge reads at that count).\n\n"
            + markdown_table(verify_bound_rows(doc, probe)))


def _ncu_launch_rows() -> list[dict[str, Any]]:
    path = REPO_ROOT / NCU_LAUNCHES
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        parts = [x.strip() for x in line.split("|")]
        if len(parts) == 5 and parts[0].startswith("H="):
            rows.append({"point": parts[0], "variant": parts[1], "kernel": parts[2].replace("ddtree_verify_", ""),
                         "grid": parts[3], "us": f"{int(parts[4].split()[0].replace(',', '')) / 1e3:.1f}"})
    return rows


def block_verify_fixed() -> str:
    """The graph floor, the launches one by one, and the chunk-length sweep."""
    res = _verify()["results"]
    floors = [f"{res['graph_launch_floor_ms'] * 1e3:.1f} us at the start of the benchmark process "
              f"(code {_verify()['provenance']['git_commit'][:7]})"] if res.get("graph_launch_floor_ms") else []
    for name, code in PROBE_FILES:
        doc = load_measurement(name)
        if doc and doc["results"].get("minimal_nodes"):
            mn = doc["results"]["minimal_nodes"]
            floors.append(f"{mn['nodes_1_ms'] * 1e3:.1f} us (three nodes: {mn['nodes_3_ms'] * 1e3:.1f} us) in the "
                          f"probe process of {code}")
    text = ("A CUDA graph of one minimal kernel node (a one-element add), timed as the kernel is: "
            + "; ".join(floors) + ".\n\n")
    pipe = [(p["heads"], p["prefix"], p["median_ms"] - p["pipelined_ms"]) for p in res["points"] if p.get("pipelined_ms")]
    if pipe:
        text += ("One replay at a time minus ten back to back (`pipelined ms`, per call): "
                 + ", ".join(f"H={h} {pr}: {d * 1e3:+.1f} us" for h, pr, d in pipe) + ".\n\n")
    nrows = _ncu_launch_rows()
    if nrows:
        text += ("Each launch alone (ncu `gpu__time_duration`, caches flushed before each kernel, "
                 f"`{NCU_LAUNCHES.split('/')[-1]}`; s1 = `-DVERIFY_WG_S1=1`, before it was the default):\n\n"
                 + markdown_table(nrows) + "\n")
    d = load_measurement(PROBE_FILES[0][0])
    if d:
        sweep = [{"H": r["heads"], "prefix": r["prefix"], "chunk_len": r["chunk_len"], "chunks": r["chunks"],
                  "tiles per block": r["tiles_per_block"], "ms": _ms(r["median_ms"], 4),
                  "planner": "yes" if r["planner"] else ""} for r in d["results"]["chunk_sweep"]]
        text += f"Chunk length (whole call, code {PROBE_FILES[0][1]}):\n\n" + markdown_table(sweep)
    return text


def _tiles_per_block(heads: int, prefix: int, nodes: int, sms: int) -> int:
    _, clen, _ = _plan(prefix, 1, nodes, nodes * heads, 64, sms, None)
    return -(-min(clen, prefix + nodes) // 64)


def _per_tile(doc: dict[str, Any], nodes: int = 33) -> dict[tuple[int, str], float]:
    """us per 64-key tile of the attention launch alone: (t(longest) - t(shortest above 4k)) / tile difference,
    from the probe's breakdowns of ``nodes`` tree nodes."""
    sms = doc["provenance"].get("gpu_sm_count", 132)
    by: dict[int, dict[int, dict[str, Any]]] = {}
    for b in doc["results"]["breakdown"]:
        if b.get("nodes", 33) == nodes:
            by.setdefault(b["heads"], {})[b["prefix"]] = b
    out = {}
    for h, pts in by.items():
        ps = sorted(p for p in pts if p > 4096)
        if len(ps) < 2:
            continue
        lo, hi = pts[ps[0]], pts[ps[-1]]
        dt = _tiles_per_block(h, hi["prefix"], hi["nodes"], sms) - _tiles_per_block(h, lo["prefix"], lo["nodes"], sms)
        for name in hi["points"]:
            out[(h, name)] = (hi["points"][name]["attention"] - lo["points"][name]["attention"]) / dt * 1e3
    return out


def block_verify_tiles() -> str:
    """Per-tile cost of the default and of the diagnostic builds; what perfect overlap would reach."""
    rows = []
    tiles: dict[str, dict[tuple[int, str], float]] = {}
    for name, code in PROBE_FILES[1:]:
        doc = load_measurement(name)
        if not doc:
            continue
        pt = _per_tile(doc)
        tiles[code] = pt
        sms = doc["provenance"].get("gpu_sm_count", 132)
        for (h, var), us in sorted(pt.items()):
            rows.append({"code": code, "H": h, "build": var, "us per 64-key tile": f"{us:.2f}",
                         "L2 to SMs, TB/s (gathers alone)": f"{TILE_BYTES * sms / (us * 1e-6) / 1e12:.1f}"
                         if var == "diag_gather" else ""})
    text = ("Attention launch alone, (time at the longest prefix - time at 16k) / (tiles per block between "
            "them); diag_gather = `-DVERIFY_WG_DIAG=1` (the gathers alone), diag_compute = `-DVERIFY_WG_DIAG=2` "
            "(the compute alone); at f9c5bfa `default` is version 11's build (warpgroup 1 gathers).\n\n"
            + markdown_table(rows))
    code = _verify()["provenance"]["git_commit"][:7]
    pt = tiles.get(code)
    if pt:
        res = _verify()["results"]
        orows = []
        for p in res["points"]:
            h = p["heads"]
            if (h, "default") not in pt:
                continue
            n = _tiles_per_block(h, p["prefix"], p["nodes"], 132)
            fixed = p["median_ms"] - n * pt[(h, "default")] * 1e-3
            best = max(pt[(h, "diag_gather")], pt[(h, "diag_compute")])
            t_ideal = fixed + n * best * 1e-3
            orows.append({"H": h, "prefix": p["prefix"], "tiles per block": n, "fixed part us": f"{fixed * 1e3:.1f}",
                          "% of floor now": f"{p['percent_of_floor']:.1f}",
                          "% of floor at max(gathers, compute) per tile": f"{100 * p['floor_ms'] / t_ideal:.1f}"})
        text += (f"\nIf gathers and compute overlapped perfectly (code {code}; the fixed part is each point's time "
                 "less its tiles at the default's cost per tile):\n\n" + markdown_table(orows))
    return text


def block_verify_ingraph() -> str:
    """One graph replay per call against calls back to back in one graph (``batched_ms``), per point; what 50% of
    the floor leaves, and the tiles' compute alone at the default's probe rate (diag_compute, same code)."""
    doc = _verify()
    res, code = doc["results"], doc["provenance"]["git_commit"][:7]
    pts = [p for p in res["points"] if p.get("batched_ms")]
    if not pts:
        return "The committed ddtree_verify.json has no in-graph times.\n"
    pdoc = next((load_measurement(n) for n, c in PROBE_FILES if c == code), None)
    per_tile = _per_tile(pdoc) if pdoc else {}
    rows = []
    for p in pts:
        n = _tiles_per_block(p["heads"], p["prefix"], p["nodes"], 132)
        comp = per_tile.get((p["heads"], "diag_compute"))
        rows.append({"H": p["heads"], "prefix": p["prefix"], "one replay us": f"{p['median_ms'] * 1e3:.1f}",
                     "in-graph us": f"{p['batched_ms'] * 1e3:.1f}",
                     "one replay - in-graph us": f"{(p['median_ms'] - p['batched_ms']) * 1e3:+.1f}",
                     "floor us": f"{p['floor_ms'] * 1e3:.1f}", "50% of floor allows us": f"{2 * p['floor_ms'] * 1e3:.1f}",
                     "in-graph % of floor": f"{p['percent_of_floor_batched']:.1f}", "tiles per block": n,
                     "tiles x compute alone us": f"{n * comp:.1f}" if comp else "-"})
    return (f"Code {code} (ddtree_verify.json; the compute-alone rate per tile from the probe of the same code, "
            f"block `verify-tiles`). A graph of one minimal node: {res['graph_launch_floor_ms'] * 1e3:.1f} us "
            f"replayed alone, {res['graph_node_ms'] * 1e3:.1f} us per node inside a graph of 64.\n\n"
            + markdown_table(rows))


def block_verify_ncu() -> str:
    path = REPO_ROOT / NCU_SECTIONS
    if not path.exists():
        return f"{NCU_SECTIONS} is not committed.\n"
    text = path.read_text()
    keys = ("SM Frequency", "Duration", "Compute (SM) Throughput", "L2 Cache Throughput", "DRAM Throughput",
            "L2 Hit Rate", "Issued Warp Per Scheduler", "Eligible Warps Per Scheduler", "Active Warps Per Scheduler")
    points = re.findall(r"ncu point (H=\d+ P=\d+)", text)
    parts = re.split(r"\n  ddtree_verify_wgmma_bf16 ", text)[1:]
    rows = []
    for pt, body in zip(points, parts):
        row = {"point": pt}
        for k in keys:
            m = re.search(rf"\n\s+{re.escape(k)}\s+(\S+)?\s+([\d.,]+)\n", body)
            row[k] = (m.group(2) + (f" {m.group(1)}" if m.group(1) and m.group(1) != "%" else "")
                      + ("%" if m.group(1) == "%" else "")) if m else "-"
        m = re.search(r"This stall type represents about ([\d.]+)% of the total", body)
        row["barrier stalls"] = f"{m.group(1)}%" if m else "-"
        rows.append(row)
    return (f"Attention kernel of the default (`{NCU_SECTIONS.split('/')[-1]}`, sections SpeedOfLight, "
            "WarpStateStats, SchedulerStats, MemoryWorkloadAnalysis; 'barrier stalls': share of the cycles between "
            "two issued instructions that a warp waits at a CTA barrier):\n\n" + markdown_table(rows))


def block_verify_g1() -> str:
    doc = _need_file(G1_FILE)
    rows = []
    for p in doc["results"]["points"]:
        old = p["variants"]["wgmma_0929e2e"]["median_ms"]
        rows.append({"H": p["heads"], "prefix": p["prefix"], "G1 (default then) ms": _ms(p["median_ms"], 4),
                     "0929e2e default ms": _ms(old, 4), "G1 / 0929e2e": f"{p['median_ms'] / old:.2f}"})
    return (f"Code {doc['provenance']['git_commit'][:7]} ({G1_FILE}.json; both in one process).\n\n"
            + markdown_table(rows))


# Version 13 (merge with early loads, reverted): its run at dcd209c, the previous merge ('merge_late') in the same process
MERGE_EARLY_FILE = "ddtree_verify_merge_early_dcd209c"


def block_verify_merge_early() -> str:
    """Version 13: the merge that loads the partials before its lse pass (then the default) against the previous
    merge, one process, both timings."""
    doc = _need_file(MERGE_EARLY_FILE)
    rows = []
    for p in doc["results"]["points"]:
        late = p["variants"]["merge_late"]
        rows.append({"H": p["heads"], "prefix": p["prefix"], "early ms": _ms(p["median_ms"], 4),
                     "late ms": _ms(late["median_ms"], 4), "early / late": _ratio(p["median_ms"], late["median_ms"]),
                     "in-graph early us": f"{p['batched_ms'] * 1e3:.1f}",
                     "in-graph late us": f"{late['batched_ms'] * 1e3:.1f}",
                     "in-graph early - late us": f"{(p['batched_ms'] - late['batched_ms']) * 1e3:+.1f}"})
    return (f"Code {doc['provenance']['git_commit'][:7]} ({MERGE_EARLY_FILE}.json; both merges in one process, the "
            "attention kernel the same).\n\n" + markdown_table(rows))


# Version 12 (impl="cluster", reverted): the run of h200_verify_cluster.sh at ceda11e, whose verify code is
# next/verify-cluster's; that code is in git history at CLUSTER_CODE (the merge into vc-outcome).
CLUSTER_FILES = ("ddtree_verify_cluster", "ddtree_verify_cluster_t32")
CLUSTER_PROBE = "ddtree_verify_cluster_probe"
CLUSTER_CODE = "a87f500"
# Written before that run (verify_cluster.PREDICTION, commit 4981061; also in the files' notes): predicted
# variant / default per (H, T, prefix), (cluster, cluster_bal); at H = 64 cluster_bal runs cluster's plan.
CLUSTER_PREDICTED = {(8, 33, 4096): (1.00, 1.00), (8, 33, 16384): (1.00, 0.94), (8, 33, 65536): (0.93, 0.88),
                     (8, 33, 131072): (0.93, 0.87), (64, 33, 4096): (0.97, 0.97), (64, 33, 16384): (0.97, 0.97),
                     (64, 33, 65536): (0.93, 0.93), (64, 33, 131072): (0.93, 0.93), (64, 32, 16384): (0.88, None),
                     (64, 32, 131072): (0.85, None)}
CLUSTER_BUILDS = ("default", "cluster", "diag_gather", "cluster_diag_gather", "cluster_diag_half")


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}"


def block_verify_cluster() -> str:
    """Version 12's whole calls: the default and the cluster variants in one process, with the predictions."""
    docs = [_need_file(name) for name in CLUSTER_FILES]
    rows = []
    for doc in docs:
        for p in doc["results"]["points"]:
            v = p["variants"]
            cl, bal = (v.get(k, {}).get("median_ms") for k in ("cluster", "cluster_bal"))
            pred = CLUSTER_PREDICTED.get((p["heads"], p["nodes"], p["prefix"]), (None, None))
            rows.append({"H": p["heads"], "T": p["nodes"], "prefix": p["prefix"], "default ms": _ms(p["median_ms"], 4),
                         "cluster ms": _ms(cl, 4), "cluster_bal ms": _ms(bal, 4),
                         "cluster / default predicted": _ms(pred[0], 2),
                         "cluster / default": _ratio(cl, p["median_ms"]),
                         "cluster_bal / default predicted": _ms(pred[1], 2),
                         "cluster_bal / default": _ratio(bal, p["median_ms"]),
                         "cluster / default, pipelined": _ratio(v.get("cluster", {}).get("pipelined_ms"),
                                                                p.get("pipelined_ms"))})
    san = docs[0]["results"].get("sanitizer", {})
    return (f"Code {docs[0]['provenance']['git_commit'][:7]} (reverted since; in git history at {CLUSTER_CODE}), "
            f"{' and '.join(f'{n}.json' for n in CLUSTER_FILES)}: each variant timed in one process with the "
            "default; medians of graph replays, `pipelined`: ten back to back. Cluster smoke cases: memcheck "
            f"{san.get('memcheck', {}).get('errors')} errors, racecheck {san.get('racecheck', {}).get('errors')} "
            "hazards. Predicted ratios: written before the run.\n\n"
            + markdown_table(rows))


def _cluster_l2_bytes(heads: int, prefix: int, nodes: int, sms: int, half: bool) -> float:
    """Bytes gathered from L2 per tile step across the grid: every CTA a whole tile, or (``half``) the CTAs of
    region A (row blocks rounded down to even) half a tile and the odd last row block's CTAs a whole one."""
    rb, _, n = _plan(prefix, 1, nodes, nodes * heads, 64, sms, None)
    if not half:
        return rb * n * TILE_BYTES
    return (rb & ~1) * n * TILE_BYTES / 2 + (rb & 1) * n * TILE_BYTES


def block_verify_cluster_probe() -> str:
    """Version 12's probe: the attention launch of each build per point, and per 64-key tile."""
    doc = _need_file(CLUSTER_PROBE)
    sms = doc["provenance"].get("gpu_sm_count", 132)
    rows = []
    for b in doc["results"]["breakdown"]:
        a = {k: b["points"][k]["attention"] for k in CLUSTER_BUILDS}
        rows.append({"H": b["heads"], "T": b["nodes"], "prefix": b["prefix"], **{f"{k} ms": _ms(a[k], 4) for k in a},
                     "half / whole gathers": _ratio(a["cluster_diag_half"], a["diag_gather"]),
                     "saved by halving us": f"{(a['diag_gather'] - a['cluster_diag_half']) * 1e3:.1f}",
                     "copies us": f"{(a['cluster_diag_gather'] - a['cluster_diag_half']) * 1e3:.1f}",
                     "cluster / default": _ratio(a["cluster"], a["default"])})
    tiles = []
    for nodes in sorted({b["nodes"] for b in doc["results"]["breakdown"]}):
        pt = _per_tile(doc, nodes)
        for h in sorted({h for h, _ in pt}):
            us = {k: pt[(h, k)] for k in CLUSTER_BUILDS}
            tb = {k: _cluster_l2_bytes(h, 131072, nodes, sms, k == "cluster_diag_half") / (us[k] * 1e-6) / 1e12
                  for k in ("diag_gather", "cluster_diag_half")}
            tiles.append({"H": h, "T": nodes, **{f"{k} us": f"{us[k]:.2f}" for k in CLUSTER_BUILDS},
                          "half / whole gathers": _ratio(us["cluster_diag_half"], us["diag_gather"]),
                          "saved by halving us": f"{us['diag_gather'] - us['cluster_diag_half']:.2f}",
                          "copies us": f"{us['cluster_diag_gather'] - us['cluster_diag_half']:.2f}",
                          "L2 to SMs TB/s, diag_gather": f"{tb['diag_gather']:.1f}",
                          "L2 to SMs TB/s, cluster_diag_half": f"{tb['cluster_diag_half']:.1f}"})
    return (f"Code {doc['provenance']['git_commit'][:7]} ({CLUSTER_PROBE}.json, one process): the attention launch "
            "alone, replayed in a graph. diag_gather = `-DVERIFY_WG_DIAG=1` (the default's whole-tile gathers "
            "alone), cluster_diag_gather = the cluster build with the same option (half tiles gathered and copied "
            "to the partner, no compute), cluster_diag_half = that without the copies (`-DVERIFY_CL_NOPUSH=1`). "
            "`saved by halving` = diag_gather - cluster_diag_half, `copies` = cluster_diag_gather - "
            "cluster_diag_half.\n\n" + markdown_table(rows)
            + "\nPer 64-key tile ((time at 128k - time at 16k) / tiles per block between them; L2 to SMs: the "
            "bytes every CTA gathers per tile step over that time):\n\n" + markdown_table(tiles))


def block_engine_share() -> str:
    doc = load_measurement("engine_step")
    if not doc or "ddtree" not in doc["results"]:
        return "data/measurements/h200/engine_step.json is not committed.\n"
    r = doc["results"]["ddtree"]
    m = r["median_ms"]
    p = doc["parameters"]
    rows = [{"part": k, "median ms": _ms(v), "% of step": f"{v / m['total'] * 100:.1f}"} for k, v in m.items()]
    return (f"K2.6 slice of {p['layers']} layers, prefix {p['prefix']}, block {p['block']}, budget {p['budget']}, "
            f"batch {p['batch']} (engine_step.json, code {doc['provenance']['git_commit'][:7]}; tree path "
            f"`{doc['results'].get('tree_impl')}`, verify path `{doc['results'].get('verify_path')}`).\n\n"
            + markdown_table(rows))


def block_verify_clocks() -> str:
    """The clock probe (verify_probe.run_clock_probe): the floor's bf16 GEMM and the verify kernel, each back to back
    for seconds, with SM clock and power from nvidia-smi; against the short-run rate the floor uses."""
    doc = load_measurement("ddtree_verify_clock_probe", "h200")
    if not doc:
        return "data/measurements/h200/ddtree_verify_clock_probe.json is not committed.\n"
    res, par = doc["results"], doc["parameters"]
    head = load_measurement("ddtree_verify", "h200")
    rows = []
    for r in res["rows"]:
        rows.append({"phase": r["phase"], "replays": r["replays"], "s": f"{r['seconds']:.1f}",
                     "first 5 ms / call": f"{r['first5_ms_per_call']:.4f}",
                     "second half ms / call": f"{r['second_half_ms_per_call']:.4f}",
                     "slower by %": f"{r['slowdown_pct']:.1f}", "SM MHz median (min)": f"{r['sm_mhz_median']:.0f} "
                     f"({r['sm_mhz_min']:.0f})", "power W median (max)": f"{r['power_w_median']:.0f} "
                     f"({r['power_w_max']:.0f})", "throttle reasons": ", ".join(r["reasons"]) or "-",
                     "TFLOP/s first 5 / second half": (f"{r['first5_tflops']:.0f} / {r['second_half_tflops']:.0f}"
                                                       if "first5_tflops" in r else "-")})
    short = res.get("short_run_bf16_tflops")
    ref = (f"; the headline file's floor rate: {head['results']['bf16_matmul_tflops']:.0f} TFLOP/s "
           f"(code {head['provenance']['git_commit'][:7]})") if head else ""
    return (f"From `data/measurements/h200/ddtree_verify_clock_probe.json` (code {doc['provenance']['git_commit'][:7]}, "
            f"{doc['provenance']['date_utc']}; `python -m workbench.ddtree.verify_probe --clocks`): each phase "
            f"{par['seconds']:.0f} s back to back (GEMM {par['gemm_n']}^3, {par['gemm_per_graph']} per graph; verify "
            f"{par['verify_calls_per_graph']} calls per graph, prefix {par['prefix']}), nvidia-smi every "
            f"{par['smi_period_ms']} ms; idle SM clock {res['idle_sm_mhz_median']:.0f} MHz; the floor's short-run "
            f"rate measured in the same process: {short:.0f} TFLOP/s{ref}.\n\n" + markdown_table(rows))


BLOCKS: dict[str, Callable[[], str]] = {
    "provenance": block_provenance,
    "tree-goals": block_tree_goals,
    "tree-build": block_tree_build,
    "tree-pops": block_tree_pops,
    "tree-sanitizer": block_tree_sanitizer,
    "tree-kernels": block_tree_kernels,
    "tree-floor": block_tree_floor,
    "round": block_round,
    "parity": block_parity,
    "verify-goals": block_verify_goals,
    "verify-points": block_verify_points,
    "verify-versions": block_verify_versions,
    "verify-sanitizer": block_verify_sanitizer,
    "verify-pingpong": block_verify_pingpong,
    "verify-chain": block_verify_chain,
    "verify-fixed": block_verify_fixed,
    "verify-tiles": block_verify_tiles,
    "verify-ingraph": block_verify_ingraph,
    "verify-ncu": block_verify_ncu,
    "verify-g1": block_verify_g1,
    "verify-merge-early": block_verify_merge_early,
    "verify-cluster": block_verify_cluster,
    "verify-cluster-probe": block_verify_cluster_probe,
    "engine-share": block_engine_share,
    "verify-clocks": block_verify_clocks,
    "verify-gather-probe": block_verify_gather_probe,
    "verify-slotring": block_verify_slotring,
    "verify-ws": block_verify_ws,
    "verify-ws16": block_verify_ws16,
    "verify-bound": block_verify_bound,
    "verify-pdl": block_verify_pdl,
    "verify-ingraph-breakdown": block_verify_ingraph_breakdown,
    "verify-merge3": block_verify_merge3,
}


def render(text: str) -> str:
    """``text`` with every generated block rewritten; unknown block names are an error."""
    return papers.render(text, BLOCKS)


def main(argv: list[str] | None = None) -> int:
    return papers.main(argv, paper=PAPER, blocks=BLOCKS, prog="python -m workbench.ddtree.report",
                       description=__doc__.split("\n")[0])


if __name__ == "__main__":
    sys.exit(main())
