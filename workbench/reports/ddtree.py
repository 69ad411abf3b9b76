"""Generated blocks of papers/ddtree_kernels.md, and the tables and figures notebook 01 and the README show.

Every measured number comes from ``data/measurements/h200/ddtree_kernels.json``, ``ddtree_verify.json``
(written by ``python -m workbench.bench.ddtree``) and the ddtree part of ``engine_step.json``:

    python -m workbench.reports.ddtree            # rewrite papers/ddtree_kernels.md's generated blocks
    python -m workbench.reports.ddtree --check    # exit 1 if they are stale
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import plotly.graph_objects as go

from workbench import REPO_ROOT
from workbench.measure import load_measurement
from workbench.reports import papers
from workbench.reports.papers import markdown_table

PAPER = REPO_ROOT / "papers" / "ddtree_kernels.md"
KEPT_BUILDERS = ("small", "heap")  # the builders the dispatch runs (ddtree_tree.cu); the others are in git
__all__ = ["BLOCKS", "PAPER", "main", "render", "goal_rows", "kernel_results_rows", "build_rows", "verify_rows",
           "tree_floor_rows", "build_sweep_figure", "verify_figure", "load_tree", "load_verify"]


def _us(ms: float | None) -> str:
    return "-" if ms is None else f"{ms * 1e3:.1f}"


def _ms(ms: float | None, digits: int = 3) -> str:
    return "-" if ms is None else f"{ms:.{digits}f}"


def load_tree(gpu: str = "h200") -> dict[str, Any] | None:
    """The committed ``data/measurements/<gpu>/ddtree_kernels.json`` or None."""
    return load_measurement("ddtree_kernels", gpu)


def load_verify(gpu: str = "h200") -> dict[str, Any] | None:
    """The committed ``data/measurements/<gpu>/ddtree_verify.json`` or None."""
    return load_measurement("ddtree_verify", gpu)


def _need(doc: dict[str, Any] | None, name: str) -> dict[str, Any]:
    if not doc:
        raise FileNotFoundError(f"data/measurements/h200/{name}.json is not committed")
    return doc


def _tree() -> dict[str, Any]:
    return _need(load_tree(), "ddtree_kernels")


def _verify() -> dict[str, Any]:
    return _need(load_verify(), "ddtree_verify")


# ----------------------------------------------------------------------------- rows (notebook, README, paper)

def goal_rows(doc: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The tree kernels' goals against a ddtree_kernels measurement: ``{goal, measured, met}``."""
    doc = doc if doc is not None else load_tree()
    if not doc:
        return []
    r, rows = doc["results"], []
    b = r.get("build_B64_L15_budget32")
    if b:
        rows.append(dict(goal="build B=64 L=15 budget=32 under 50 us (graph replay)",
                         measured=f"{b['gpu_graph_ms'] * 1e3:.1f} us", met=b["gpu_graph_ms"] * 1e3 < 50))
        rows.append(dict(goal="build >= 300x the CPU reference (same run)",
                         measured=f"{b['speedup_graph']:.0f}x (eager call: {b['speedup_eager']:.0f}x)",
                         met=b["speedup_graph"] >= 300))
    acc = next((v for k, v in r.items() if k.startswith("accept_B64")), None)
    if acc:
        rows.append(dict(goal="accept B=64 under 10 us (graph replay)", measured=f"{acc['gpu_graph_ms'] * 1e3:.1f} us",
                         met=acc["gpu_graph_ms"] * 1e3 < 10))
    for v, x in r.get("round", {}).items():
        if v.startswith("verify_"):
            rows.append(dict(goal=f"round ({v}): no host sync, CUDA graph equals eager",
                             measured=f"sync-free={x.get('no_host_sync')}, graph==eager={x.get('graph_matches_eager')}, "
                                      f"graph {x.get('graph_ms', float('nan')):.2f} ms",
                             met=bool(x.get("no_host_sync") and x.get("graph_matches_eager"))))
    if "parity_all_passed" in r:
        rows.append(dict(goal="GPU parity grid bit-exact", measured=f"{len(r.get('parity', []))} rows",
                         met=bool(r["parity_all_passed"])))
    return rows


def kernel_results_rows(doc: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Accept, commit, visibility and top-k timings (us per call, graph and eager; CPU reference ms)."""
    doc = doc if doc is not None else load_tree()
    if not doc:
        return []
    return [dict(kernel=k, gpu_graph_us=v["gpu_graph_ms"] * 1e3, gpu_eager_us=v["gpu_eager_ms"] * 1e3,
                 cpu_ref_ms=v.get("cpu_ms"), speedup_graph=v.get("speedup_graph"))
            for k, v in doc["results"].items()
            if isinstance(v, dict) and "gpu_graph_ms" in v and not k.startswith("build_")]


def build_rows(doc: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Tree build per budget: each kept builder's time per call in a graph, the CPU reference, the ratio."""
    doc = doc if doc is not None else load_tree()
    if not doc:
        return []
    pts = [v for k, v in doc["results"].items() if k.startswith("build_") and isinstance(v, dict)
           and v.get("method") in KEPT_BUILDERS and v.get("warps_per_block", 1) == 1 and "gpu_graph_ms" in v]
    rows = []
    for b in sorted({v["budget"] for v in pts}):
        at = {v["method"]: v for v in pts if v["budget"] == b}
        best = min(at.values(), key=lambda v: v["gpu_graph_ms"])
        rows.append({"budget": b, "K": best["K"], **{f"{m} us": _us(at[m]["gpu_graph_ms"]) if m in at else "-"
                                                     for m in KEPT_BUILDERS},
                     "fastest": best["method"], "CPU heapq ms": _ms(best["cpu_ms"]),
                     "x CPU (graph)": f"{best['speedup_graph']:.0f}", "x CPU (eager)": f"{best['speedup_eager']:.0f}"})
    return rows


def verify_rows(doc: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per (heads, prefix) point of a ddtree_verify measurement: times, floor, peers."""
    doc = doc if doc is not None else load_verify()
    if not doc:
        return []
    res = doc["results"]
    rows = []
    for p in res["points"]:
        peers = {n: (v["median_ms"] if v["status"] == "ok" else None) for n, v in p["peers"].items()}
        rows.append({"H": p["heads"], "prefix": p["prefix"], "kernel ms": p["median_ms"],
                     "mma ms": p.get("variants", {}).get("mma", {}).get("median_ms"),
                     "in-graph ms": p.get("batched_ms"), "eager ms": p.get("eager_median_ms"),
                     "floor ms": p["floor_ms"], "bound": p["floor_bound"], "% of floor": p["percent_of_floor"],
                     "in-graph % of floor": p.get("percent_of_floor_batched"),
                     "naive torch ms": peers.get("naive_torch"), "SDPA ms": peers.get("sdpa_dense_mask"),
                     "x best peer": p["speedup_vs_best_peer"]})
    return rows


def tree_floor_rows(tree: dict[str, Any] | None = None, verify: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Bytes each tree kernel must move (inputs read once, outputs written once) over the copy bandwidth
    measured in the ddtree_verify run, beside the measured graph-replay time. These kernels do a few
    operations per node, so the bytes term is the floor."""
    tree, verify = tree or _tree(), verify or _verify()
    gbps, res = verify["results"]["copy_gb_per_s"], tree["results"]
    b = res["build_B64_L15_budget32"]
    B, L, K, n = b["batch"], b["L"], b["K"], b["budget"] + 1
    rows = [("build B=64 L=15 budget=32", B * L * K * (4 + 8) + B * n * (4 * 8 + 4), b["gpu_graph_ms"]),
            # in: tokens, parents, target argmax int64 [B, n]; out: nodes [B, n], length, bonus
            ("accept B=64 n=33", B * n * 8 * 3 + B * n * 8 + B * 2 * 8, res["accept_B64_n33"]["gpu_graph_ms"]),
            ("visibility B=64 n=33", B * n * 8 + B * n * n, res["visibility_B64_n33"]["gpu_graph_ms"])]
    tk = next((k for k in res if k.startswith("topk_logprobs_")), None)
    if tk:
        V = tree["parameters"]["topk_vocab"]  # in: float32 logits [B, L, V]; out: log-probs f32 + ids int64
        rows.append((f"topk_logprobs B=64 L=15 V={V} k={K}", B * L * V * 4 + B * L * K * 12, res[tk]["gpu_graph_ms"]))
    out = []
    for name, nbytes, ms in rows:
        floor_ms = nbytes / (gbps * 1e9) * 1e3
        out.append({"kernel": name, "bytes": nbytes, "bytes / copy BW us": f"{floor_ms * 1e3:.3f}",
                    "measured us (graph)": _us(ms), "% of floor": f"{floor_ms / ms * 100:.1f}"})
    return out


# ----------------------------------------------------------------------------- figures (notebook 01)

def build_sweep_figure(doc: dict[str, Any] | None = None):
    """Tree build time against budget (B=64, L=15): each kept builder (graph replay) and the CPU reference."""
    fig = go.Figure()
    rows = build_rows(doc)
    if not rows:
        return fig.update_layout(title="no ddtree_kernels measurement committed")
    xs = [r["budget"] for r in rows]
    for m in KEPT_BUILDERS:
        pts = [(r["budget"], float(r[f"{m} us"])) for r in rows if r[f"{m} us"] != "-"]
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=f"GPU {m}"))
    fig.add_trace(go.Scatter(x=xs, y=[float(r["CPU heapq ms"]) * 1e3 for r in rows], mode="lines+markers",
                             name="CPU reference (heapq)", line=dict(dash="dash")))
    return fig.update_layout(title="Tree build, batch 64, L = 15 (GPU: per call in a CUDA graph)",
                             xaxis=dict(title="budget", type="log"), yaxis=dict(title="microseconds", type="log"))


def verify_figure(doc: dict[str, Any] | None = None):
    """Verify attention time against prefix length per head count: the kernel (graph replay and in-graph),
    its floor and the best peer."""
    fig = go.Figure()
    rows = verify_rows(doc)
    if not rows:
        return fig.update_layout(title="no ddtree_verify measurement committed")
    for h in sorted({r["H"] for r in rows}):
        pts = [r for r in rows if r["H"] == h]
        x = [r["prefix"] for r in pts]
        for col, dash in (("kernel ms", None), ("in-graph ms", "dot"), ("floor ms", "dash"), ("SDPA ms", "dashdot")):
            fig.add_trace(go.Scatter(x=x, y=[r[col] for r in pts], mode="lines+markers", name=f"H={h} {col[:-3]}",
                                     line=dict(dash=dash)))
    return fig.update_layout(title="Tree-verify attention, 33 nodes, bf16", xaxis=dict(title="prefix", type="log"),
                             yaxis=dict(title="ms per call", type="log"))


# ----------------------------------------------------------------------------- paper blocks

def _fmt_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Times (columns ending "ms") with 4 decimals, percentages and ratios with 1."""
    def f(k, v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.4f}" if k.endswith("ms") else f"{v:.1f}"
        return v
    return [{k: f(k, v) for k, v in r.items()} for r in rows]


def block_provenance() -> str:
    rows = []
    for name, doc in (("ddtree_kernels", _tree()), ("ddtree_verify", _verify())):
        p = doc["provenance"]
        rows.append({"file": f"`data/measurements/h200/{name}.json`", "GPU": p.get("gpu"),
                     "code commit": str(p.get("git_commit", "-"))[:7], "date (UTC)": p.get("date_utc"),
                     "torch / CuPy / CUDA": f"{p.get('torch')} / {p.get('cupy')} / {p.get('cuda_runtime')}",
                     "driver": p.get("driver")})
    return markdown_table(rows)


def block_tree_build() -> str:
    return ("Batch 64, L = 15; GPU times per call inside a replayed CUDA graph; the CPU reference builds the whole "
            "batch with heapq in the same run.\n\n" + markdown_table(build_rows(_tree())))


def block_tree_pops() -> str:
    res = _tree()["results"]
    f = res.get("build_pops_fit_small")
    node = res.get("graph_node_floor")
    if not f:
        return "This run has no pops fit of `small`.\n"
    return (f"`small`, batch 64, L = 15, budgets 1-32 (pops = budget), per call in a graph: least-squares line "
            f"{f['fixed_us']:.2f} us + {f['ns_per_pop']:.0f} ns per pop."
            + (f" One graph node of a tiny torch kernel ({node['what']}): {node['graph_us_per_call']:.1f} us in the "
               "same run." if node else "") + "\n")


def block_tree_kernels() -> str:
    out = [{"kernel": r["kernel"], "graph us / call": f"{r['gpu_graph_us']:.1f}",
            "eager us / call": f"{r['gpu_eager_us']:.1f}", "CPU reference ms": _ms(r["cpu_ref_ms"]),
            "x CPU (graph)": "-" if r["speedup_graph"] is None else f"{r['speedup_graph']:.0f}"}
           for r in kernel_results_rows(_tree())]
    return f"Batch 64; trees of 33 nodes (budget 32). {_tree()['parameters']['timing']}.\n\n" + markdown_table(out)


def block_tree_floor() -> str:
    gbps = _verify()["results"]["copy_gb_per_s"]
    return (f"Copy bandwidth {gbps:.0f} GB/s (measured in the ddtree_verify run).\n\n" + markdown_table(tree_floor_rows()))


def block_round() -> str:
    rnd = _tree()["results"]["round"]
    rows = [{"verify": v, "no host sync": r["no_host_sync"], "graph == eager": r["graph_matches_eager"],
             "eager ms": _ms(r["eager_ms"], 2), "graph ms": _ms(r["graph_ms"], 2),
             "mean accepted length": f"{r['mean_accepted_length']:.3f}"}
            for v, r in rnd.items() if v.startswith("verify_")]
    return (f"Batch {rnd['batch']}, L {rnd['L']}, budget {rnd['budget']}, prefix {rnd['prefix']}, {rnd['heads']} "
            f"heads, toy vocabulary {rnd['vocab']}.\n\n" + markdown_table(rows))


def block_goals() -> str:
    met = {True: "yes", False: "**no**"}
    rows = [{"goal (issue 3)": r["goal"], "measured": r["measured"], "met": met[bool(r["met"])]}
            for r in goal_rows(_tree())]
    res = _verify()["results"]
    pts = res["points"]
    sp = [p["speedup_vs_best_peer"] for p in pts]
    rows.append({"goal (issue 3)": "verify faster than every peer at every point",
                 "measured": f"{min(sp):.1f}x-{max(sp):.1f}x the best peer", "met": met[bool(res["all_faster_than_peers"])]})
    for col, what in (("percent_of_floor", "one graph replay per call"),
                      ("percent_of_floor_batched", "in-graph, calls back to back")):
        if all(col in p for p in pts):
            w = min(pts, key=lambda p: p[col])
            rows.append({"goal (issue 3)": f"verify >= 50% of floor at every point ({what})",
                         "measured": f"min {w[col]:.1f}% (H={w['heads']}, prefix {w['prefix']}), max "
                                     f"{max(p[col] for p in pts):.1f}%; {sum(p[col] >= 50 for p in pts)} of {len(pts)} "
                                     "points", "met": met[w[col] >= 50]})
    return markdown_table(rows)


def block_verify_points() -> str:
    res = _verify()["results"]
    flex = sorted({p["peers"]["flex_attention"]["status"] for p in res["points"] if "flex_attention" in p["peers"]})
    return (f"{res['points'][0]['nodes']} tree nodes, bf16, dispatched kernel `{res['points'][0].get('impl', 'wgmma')}` "
            f"(`mma` timed beside it). Measured in the same run: copy bandwidth {res['copy_gb_per_s']:.0f} GB/s, "
            f"bf16 matmul {res['bf16_matmul_tflops']:.0f} TFLOP/s. `kernel`: one graph replay per call; `in-graph`: "
            "the calls captured back to back in one graph, per call (device time with no launch latency, as in a "
            f"captured decode step). FlexAttention at every point: {', '.join(flex) or '-'}.\n\n"
            + markdown_table(_fmt_rows(verify_rows())))


def block_parity() -> str:
    par = _tree()["results"].get("parity", [])
    t = [{"kernel": k, "rows": sum(r["kernel"] == k for r in par),
          "bit-exact": sum(bool(r.get("bit_exact")) for r in par if r["kernel"] == k)}
         for k in sorted({r["kernel"] for r in par})]
    vpar = _verify()["results"].get("parity", [])
    ours = [r for r in vpar if r["kernel"].startswith("verify_attention") and not r["kernel"].endswith(("naive", "sdpa"))]
    v = [{"kernel": k, "rows": sum(r["kernel"] == k for r in ours), "passed": sum(bool(r["pass"]) for r in ours
                                                                                  if r["kernel"] == k),
          "max rel. error": f"{max(r['max_rel_err'] for r in ours if r['kernel'] == k):.2e}"}
         for k in sorted({r["kernel"] for r in ours})]
    return ("Tree kernels against the NumPy reference (ddtree_kernels.json; rows of builders since removed "
            "included):\n\n" + markdown_table(t) + "\nVerify attention against the float64 reference "
            "(ddtree_verify.json; `[tag]`: an explicit kernel, untagged: the dispatched one):\n\n" + markdown_table(v))


def block_sanitizer() -> str:
    rows = []
    for name, doc in (("ddtree_kernels", _tree()), ("ddtree_verify", _verify())):
        for tool, r in (doc["results"].get("sanitizer") or {}).items():
            rows.append({"file": name, "code": doc["provenance"]["git_commit"][:7], "tool": tool,
                         "command": f"`{r.get('command', '-')}`", "exit code": r.get("returncode"),
                         "summary": "; ".join(x.lstrip("= ") for x in r.get("summary") or []) or "-",
                         "errors / hazards": "-" if r.get("errors") is None else r["errors"]})
    return markdown_table(rows)


def block_engine_share() -> str:
    """The DDTree kernels' share of the captured engine step (DDTree, C = 1, the sweep's last fuse mode, first
    p_top), from the per-kernel profile ``python -m workbench.bench.engine`` records."""
    doc = load_measurement("engine_step")
    if not doc or not doc["results"].get("rows"):
        return "data/measurements/h200/engine_step.json is not committed.\n"
    p = doc["parameters"]
    row = next(r for r in doc["results"]["rows"] if r["method"] == "ddtree" and r["C"] == 1
               and r["path"] == "graph" and r["fuse"] == p["fuses"][-1] and r["p_top"] == p["p_tops"][0])
    top, busy = row["top_kernels"], row["gpu_busy_ms_per_step"]
    rows = [{"kernel": k["name"], "launches per step": int(k["per_step"]), "ms per step": _ms(k["ms_per_step"]),
             "% of GPU busy": f"{k['ms_per_step'] / busy * 100:.1f}"} for k in top if k["name"].startswith("ddtree_")]
    smallest = min(k["ms_per_step"] for k in top)
    return (f"K2.6 shape, {p['layers']} layers, {p['experts']} routed experts per layer, prefix {p['prefix']}, block "
            f"{p['block']}, budget {p['budget']}, C = 1, one graph replay per step (engine_step.json, code "
            f"{doc['provenance']['git_commit'][:7]}): GPU busy {_ms(busy)} ms of a {_ms(row['wall_ms'])} ms step. "
            f"The DDTree kernels among the step's {len(top)} costliest kernels; tree build, accept and commit are "
            f"not among them (each under {_ms(smallest)} ms per step):\n\n" + markdown_table(rows))


BLOCKS: dict[str, Callable[[], str]] = {
    "provenance": block_provenance, "tree-build": block_tree_build, "tree-pops": block_tree_pops,
    "tree-kernels": block_tree_kernels, "tree-floor": block_tree_floor, "round": block_round,
    "goals": block_goals, "verify-points": block_verify_points, "parity": block_parity,
    "sanitizer": block_sanitizer, "engine-share": block_engine_share,
}


def render(text: str) -> str:
    """``text`` with every generated block rewritten; unknown block names are an error."""
    return papers.render(text, BLOCKS)


def main(argv: list[str] | None = None) -> int:
    return papers.main(argv, paper=PAPER, blocks=BLOCKS, prog="python -m workbench.reports.ddtree",
                       description=__doc__.split("\n")[0])


if __name__ == "__main__":
    sys.exit(main())
