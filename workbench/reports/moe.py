"""Generated blocks of papers/moe_int4.md: ``python -m workbench.reports.moe [--check]``.

Every block is computed from committed files: ``data/measurements/h200/moe_bandwidth.json`` (the sweep of the
dispatched path), its repeat :data:`workbench.reports.moe_plots.CURRENT_REPEAT`,
:data:`workbench.moe.dispatched.SMALL_COMPARE` (the small-M kernels beside the four-launch path, one process),
``moe_copy_probe.json`` (the copy ceiling timed three ways), ``data/dispatch/h200.json``,
``data/anchors/rtx_pro_6000_moe.json``, and, for the versions table (``data/moe_versions.json``), the measurement
files of earlier runs as committed at :data:`HISTORY` (read from git; the block says so where git history is missing).
"""
from __future__ import annotations

import json
import statistics
import sys
from typing import Any, Callable

from workbench import DATA_DIR, REPO_ROOT
from workbench.reports import papers
from workbench.bench.moe_counts import flops
from workbench.dispatch import MOE_SMALL_MAX_PAIRS, dispatch_for
from workbench.measure import load_measurement
from workbench.reports import moe_plots as plots
from workbench.moe.dispatched import SMALL_COMPARE, one_launch_paths, small_path_rows
from workbench.moe.fused import FOUR_LAUNCH, moe_plan, variant_name
from workbench.reports.papers import markdown_table

PAPER = REPO_ROOT / "papers" / "moe_int4.md"
GPU_NAME = "NVIDIA H200"
MEASURED = "data/measurements/h200"
COPY_PROBE = "moe_copy_probe"
VERSIONS_FILE = DATA_DIR / "moe_versions.json"   # the versions table: each run's change, prediction, file, outcome


def _load_versions() -> tuple[str, tuple, tuple, tuple]:
    """:data:`VERSIONS_FILE` as (history, earlier runs, versions, later versions), each row a tuple: runs (file commit,
    run); versions (version, change, prediction, measurement file, (new path, incumbent path, the M its outcome was
    decided at or None for every M), outcome, code commit), later versions with the commit their file is read at."""
    doc = json.loads(VERSIONS_FILE.read_text())

    def row(v: dict[str, Any]) -> tuple:
        m = v["compare"]["m"]
        out = (v["version"], v["change"], v["prediction"], v["file"],
               (v["compare"]["new"], v["compare"]["incumbent"], None if m is None else tuple(m)), v["outcome"], v["code"])
        return out + ((v["read_at"],) if "read_at" in v else ())

    return (doc["history"], tuple((r["commit"], r["run"]) for r in doc["earlier_runs"]),
            tuple(row(v) for v in doc["versions"]), tuple(row(v) for v in doc["later_versions"]))


# HISTORY: the commit holding every removed kernel, module and measurement file; MOE_RUNS: the earlier
# moe_bandwidth.json files; VERSIONS / LATER_VERSIONS: the versions table's runs (:func:`_load_versions`).
HISTORY, MOE_RUNS, VERSIONS, LATER_VERSIONS = _load_versions()


def _f(v: Any, spec: str = "") -> str:
    return format(v, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def _doc() -> dict[str, Any]:
    doc = plots.load_moe_bandwidth()
    if doc is None:
        raise FileNotFoundError(f"{MEASURED}/moe_bandwidth.json is not committed")
    return doc


def block_provenance() -> str:
    """The files the results read, with their provenance, and the run's shapes and ceilings."""
    rows = []
    for name in ("moe_bandwidth", plots.CURRENT_REPEAT, SMALL_COMPARE, COPY_PROBE):
        d = load_measurement(name)
        if d is None:
            continue
        p = d["provenance"]
        rows.append({"file": f"`{MEASURED}/{name}.json`", "GPU": p.get("gpu"), "code commit": str(p.get("git_commit"))[:7],
                     "date (UTC)": p.get("date_utc"), "driver": p.get("driver"),
                     "torch / CuPy / CUDA": f"{p.get('torch')} / {p.get('cupy')} / {p.get('cuda_runtime')}"})
    par, res = _doc()["parameters"], _doc()["results"]
    return (markdown_table(rows) + f"\nShapes: {par['num_experts']} experts, hidden {par['hidden']}, intermediate "
            f"{par['intermediate']}, top-{par['topk']}, group {par['group_size']}; {par['bytes_per_expert']} bytes per "
            f"expert (INT4 weights and bf16 scales of gate, up and down). Measured in the sweep's run: copy bandwidth "
            f"{res['copy_gb_per_s']:.0f} GB/s, bf16 matmul {res['bf16_matmul_tflops']:.0f} TFLOP/s. Weights: "
            f"{par['weights']}.\n")


def block_dispatch() -> str:
    d = dispatch_for(GPU_NAME)
    g = dispatch_for("a GPU without a table")
    return (f"`data/dispatch/{d.gpu}.json` (top-{8}, small-M kernels while M x top-k <= {MOE_SMALL_MAX_PAIRS}, the experts in the fragment layout):\n\n"
            + markdown_table([{**r, "kernel": f"`{r['kernel']}`", "launches": ", ".join(f"`{x}`" for x in
                                                                             r["launches"].split(", "))}
                              for r in plots.dispatch_rows(GPU_NAME)]) + f"\nAny other GPU gets `data/dispatch/{g.gpu}.json`: "
            + ("no small-M kernel, " if not g.moe_small else "") + "the four-launch variants "
            + ", ".join(f"{list(v)} to M = {m}" if m < 1 << 20 else f"{list(v)} beyond" for m, v in g.moe_large)
            + ".\n")


def sweep_vs_dispatch_rows() -> list[dict[str, Any]]:
    """Rows of the sweep whose kernel differs from what data/dispatch names for that M today (the sweep's own tuning
    chose its table), with that M's same-run comparison of the two where the committed files have one."""
    doc, small = _doc(), plots.load_moe_small()
    gpu = doc["provenance"].get("gpu", GPU_NAME)
    d = dispatch_for(gpu)
    tuning = (doc["results"].get("tuning") or {}).get("ms", {})
    srows = {(r["routing"], r["M"]): r for r in small_path_rows(small)} if small else {}
    out = []
    for r in sorted(doc["results"]["rows"], key=lambda r: (r["routing"], r["m"])):
        ran = r["path"].removeprefix("small_")
        want = d.moe_small_kernel(r["m"], doc["parameters"]["topk"]) or variant_name(d.moe_large_variant(r["m"]))
        if ran == want:
            continue
        if (r["routing"], r["m"]) in srows:
            s = srows[(r["routing"], r["m"])]
            note = (f"`{small['name']}.json`, one replay: {want} {s[f'{want} % copy']:.1f}, {ran} "
                    f"{s[f'{ran} % copy']:.1f} % of copy")
        elif want in tuning and ran in tuning:
            note = (f"the sweep's tuning, uniform: {want} {tuning[want][str(r['m'])]:.3f} ms, {ran} "
                    f"{tuning[ran][str(r['m'])]:.3f} ms")
        else:
            note = "no same-run comparison committed"
        out.append({"routing": r["routing"], "M": r["m"], "the sweep ran": ran, "dispatched today": want,
                    "comparison": note})
    return out


def block_sweep_vs_dispatch() -> str:
    rows = sweep_vs_dispatch_rows()
    if not rows:
        return "Every row of the sweep ran the kernel the dispatch names today.\n"
    return markdown_table(rows)


def block_floor() -> str:
    doc = _doc()
    par, res = doc["parameters"], doc["results"]
    rows = []
    for r in sorted((r for r in res["rows"] if r["routing"] == "uniform"), key=lambda r: r["m"]):
        fl = flops(r["m"], par["topk"], par["hidden"], par["intermediate"])
        bt = r["bytes_median"] / (res["copy_gb_per_s"] * 1e9) * 1e3
        ft = fl / (res["bf16_matmul_tflops"] * 1e12) * 1e3
        rows.append({"M": r["m"], "experts touched": r["distinct_experts_median"],
                     "GB moved": f"{r['bytes_median'] / 1e9:.3f}", "bytes time ms": f"{bt:.4f}",
                     "GFLOP": f"{fl / 1e9:.1f}", "flops time ms": f"{ft:.4f}",
                     "floor": "bytes" if bt >= ft else "flops", "measured ms": f"{r['ms_median']:.4f}",
                     "% of floor": f"{r['pct_of_floor']:.1f}"})
    probe = load_measurement(COPY_PROBE)
    text = ""
    if probe:
        ratio = statistics.median(r["span_over_one"] for r in probe["results"]["rows"])
        text = (f"\nThe copy ceiling is one 2 GiB copy between two CUDA events. Timed by the profiler's kernel span "
                f"instead (`{COPY_PROBE}.json`, {len(probe['results']['rows'])} rounds), it is {ratio:.4f}x that, so "
                f"a span-timed % of copy below reads that much lower against a span-timed ceiling.\n")
    return "Uniform routing.\n\n" + markdown_table(rows) + text


def block_summary() -> str:
    keep = ["routing", "M", "experts", "ms", "% copy", "in-graph % copy", "TFLOP/s", "kernel"]
    fmt = {"ms": ".4f", "% copy": ".1f", "in-graph % copy": ".1f", "TFLOP/s": ".1f"}
    rows = []
    for r in plots.summary_rows(_doc()):
        row = {k: _f(r[k], fmt.get(k, "")) for k in keep}
        row.update({f"x {k}": _f(r[f"x vs {k}"], ".1f") for k in plots.PEERS})
        rows.append(row)
    plateau = {r["routing"]: r["plateau M*"] for r in plots.summary_rows(_doc())}
    peers = "; ".join(f"`{k}`: {v}" for k, v in plots.PEERS.items())
    return (f"Peers (x = peer time / kernel time, same run): {peers}. Plateau M* (time per token stops falling, "
            f"within 10%): " + ", ".join(f"{k} {v}" for k, v in sorted(plateau.items())) + ".\n\n"
            + markdown_table(rows))


def block_small() -> str:
    """The small-M kernels beside the four-launch path and the earlier split-K kernels, one process."""
    small = plots.load_moe_small()
    if small is None:
        return f"{MEASURED}/{SMALL_COMPARE}.json is not committed.\n"
    paths = one_launch_paths(small) + [FOUR_LAUNCH]
    rows = [{"routing": r["routing"], "M": r["M"], **{f"{p} % copy": _f(r[f"{p} % copy"], ".1f") for p in paths},
             "dispatched": r["dispatched"], "dispatched span % copy": _f(r["dispatched span % copy"], ".1f"),
             "dispatched in-graph % copy": _f(r["dispatched in-graph % copy"], ".1f")}
            for r in small_path_rows(small)]
    return (f"`{SMALL_COMPARE}.json` (code {small['provenance']['git_commit'][:7]}; one graph replay per call, "
            f"% of the copy bandwidth of the same run; `splitk_*` are run 6's and 16's one-launch kernels, timed as "
            f"controls):\n\n" + markdown_table(rows))


def block_call_time() -> str:
    parts = []
    for name in ("moe_bandwidth", plots.CURRENT_REPEAT):
        doc = load_measurement(name)
        rows = plots.call_time_rows(doc) if doc else []
        lat = doc["results"].get("graph_launch_latency") if doc else None
        if not rows or not lat:
            parts.append(f"`{name}.json` is not committed or has no profiler spans.\n")
            continue
        parts.append(f"`{name}.json` (code {doc['provenance']['git_commit'][:7]}; graph launch latency of the same "
                     f"process {1e3 * lat['latency_ms']:.1f} us):\n\n" + markdown_table(rows))
    return "\n".join(parts)


def block_goals() -> str:
    met = {True: "yes", False: "**no**"}
    rep = plots.load_moe_repeat()
    rows = [(r, "moe_bandwidth") for r in plots.goal_rows(_doc())]
    rows += [(r, plots.CURRENT_REPEAT) for r in (plots.bandwidth_goal_rows(rep) if rep else [])]
    small = plots.load_moe_small()
    out = [{"goal": r["goal"], "file": f"`{name}.json`", "target": r["target"],
            "measured (worst)": _f(r["measured (worst)"], ".3g"), "met": met[bool(r["met"])]} for r, name in rows]
    for column in ("dispatched span % copy", "dispatched % copy"):
        got = plots.dispatched_worst_pct(small, column) if small else None
        if got:
            out.append({"goal": f"% of copy bandwidth at M <= 16, {column.replace('dispatched ', '')} (one replay "
                                "where not named), the dispatched kernel at each M",
                        "file": f"`{small['name']}.json`", "target": ">= 80",
                        "measured (worst)": f"{got[0]:.3g} ({got[1]['routing']} M={got[1]['M']}, {got[1]['dispatched']})",
                        "met": met[got[0] >= 80]})
    return markdown_table(out)


def block_anchors() -> str:
    a = plots.load_anchors()
    rows = [{k: _f(v, ".3g") if v is not None else "-" for k, v in r.items()} for r in plots.anchor_rows(_doc(), a)]
    lo, hi = a["percent_of_peak"]["range"]
    bw = _doc()["results"]["copy_gb_per_s"] / 1e3 / a["peak_bandwidth_tb_per_s"]
    return (f"The source states {lo}-{hi}% of {a['peak_bandwidth_tb_per_s']} TB/s on the {a['gpu']} and a plateau at "
            f"M >= {a['plateau_m']['value']}. The H200's copy bandwidth measured in the sweep is {bw:.2f}x that "
            f"{a['peak_bandwidth_tb_per_s']} TB/s.\n\n" + markdown_table(rows))


def block_large() -> str:
    """The four-launch variants' tuning (the sweep whose tuning step set data/dispatch's moe_large rows)."""
    dispatched = {variant_name(v) for _, v in dispatch_for(GPU_NAME).moe_large}
    rows = [{**r, "variant (NT, RT, D)": f"**{r['variant (NT, RT, D)']}**" if r["variant (NT, RT, D)"] in dispatched
             else r["variant (NT, RT, D)"]} for r in plots.tuning_rows(_doc())]
    rows = [{k: _f(v, ".3f") for k, v in r.items()} for r in rows]
    return ("ms per layer of each four-launch variant (uniform routing, the sweep's tuning step; bold: dispatched at "
            "some M, the others are in git history at " + HISTORY + "):\n\n" + markdown_table(rows))


def block_checks() -> str:
    res = _doc()["results"]
    checks = res["checks"]
    ours = [c for c in checks if isinstance(c.get("rel_err"), float) and "peer" not in c]
    peers = [c for c in checks if "peer" in c]
    return (f"{len(ours)} checks of the sweep's run against the float32 reference (M in "
            f"{sorted({c['m'] for c in ours})}): worst relative error {max(c['rel_err'] for c in ours):.2e}, "
            f"non-finite outputs {sum(c.get('nonfinite', 0) for c in ours)}, every check ok = {res['all_checks_ok']}. "
            "Peers against the same reference: " + ", ".join(f"{c['peer']} {c['rel_err']:.2e}" for c in peers) + ".\n")


def _compare(doc: dict[str, Any], new: str, old: str, ms: tuple[int, ...] | None) -> str:
    """``new`` minus ``old`` in points of copy (one replay) over the file's rows at M in ``ms`` (None: every M)."""
    d = [r[f"{new}_pct_of_copy"] - r[f"{old}_pct_of_copy"] for r in doc["results"]["rows"]
         if f"{new}_pct_of_copy" in r and f"{old}_pct_of_copy" in r and (ms is None or r["m"] in ms)]
    if not d:
        raise ValueError(f"{doc['name']}.json has no rows of both {new} and {old} at M in {ms}")
    at = "every M" if ms is None else "M = " + ", ".join(map(str, ms))
    return f"mean {statistics.mean(d):+.1f}, worst {min(d):+.1f}, best {max(d):+.1f} ({len(d)} rows, {at})"


def version_rows() -> list[dict[str, Any]] | None:
    """:data:`VERSIONS` with the measured column read from each run's file at :data:`HISTORY` (:data:`LATER_VERSIONS`
    at their own commit); runs 1-3 from the earlier moe_bandwidth.json files; None where git history lacks them."""
    rows = []
    for commit, run in MOE_RUNS:
        doc = papers.committed_json(commit, f"{MEASURED}/moe_bandwidth.json")
        if doc is None:
            return None
        at = {(r["routing"], r["m"]): r for r in doc["results"]["rows"]}
        kern = sorted({r.get("path") or str(r.get("kernel_config")) for r in doc["results"]["rows"] if r["m"] <= 16})
        rows.append({"run": run, "change": "four launches: " + ", ".join(kern), "prediction": ">= 80% of copy at M <= 16",
                     "measured": f"% of copy, uniform M = 1 / 16: {at[('uniform', 1)]['pct_of_copy']:.1f} / "
                                 f"{at[('uniform', 16)]['pct_of_copy']:.1f}",
                     "outcome": "kept (the four-launch path)", "code": doc["provenance"]["git_commit"][:7]})
    for run, change, pred, name, (new, old, ms), outcome, code, at in (*((*v, HISTORY) for v in VERSIONS),
                                                                         *LATER_VERSIONS):
        doc = papers.committed_json(at, f"{MEASURED}/{name}.json")
        if doc is None:
            return None
        rows.append({"run": run, "change": change, "prediction": pred,
                     "measured": f"`{new}` - `{old}`, points of copy: {_compare(doc, new, old, ms)}; `{name}.json`",
                     "outcome": outcome, "code": code})
    return rows


def block_layout() -> str:
    """The fragment four-launch variants against the packed ones (moe_layout_ab.json): ms per call by experts and M."""
    path = REPO_ROOT / MEASURED / "moe_layout_ab.json"
    if not path.exists():
        return "moe_layout_ab.json is not committed.\n"
    doc = json.loads(path.read_text())
    rows = [{"experts": r["experts"], "M": r["m"],
             **{k: f"{r[k + '_ms']:.3f}" for k in ("frag_nt1", "frag_nt4", "nt1_rt2_l2", "nt2_rt2_d2", "nt4_rt2_d2")
                if k + "_ms" in r},
             "frag best / packed best": f"{r['frag_best_over_packed_best']:.2f}",
             "dispatched now": moe_plan(r["m"], doc["parameters"]["topk"], "cuda", dispatch=dispatch_for(GPU_NAME),
                                        layout="fragments")["kernel"]} for r in doc["results"]["rows"]]
    p = doc["provenance"]
    return (f"ms per call (median of CUDA-graph replays, uniform routing, fresh per repeat), K2.6 shapes; "
            f"`moe_layout_ab.json`, measured at {p.get('git_commit', '?')[:7]} on {p.get('gpu', '?')}"
            f"; every kernel checked against the reference first: {doc['results']['all_checks_ok']}. The "
            "`dispatched now` column is today's table for experts in the fragment layout.\n\n"
            + markdown_table(rows))


def block_versions() -> str:
    rows = version_rows()
    if rows is None:
        return f"git history at {HISTORY} is not available here (a shallow clone?); the table reads it.\n"
    return markdown_table(rows)


AB_FILE = "moe_consolidation_ab"   # the consolidation's check: the old tree and the new one alternated in one session
AB_MEASURES = (("pct_of_copy", "one replay"), ("queued_pct_of_copy", "queued"), ("span_pct_of_copy", "span"),
               ("ingraph_pct_of_copy", "in-graph"))


def block_consolidation_ab() -> str:
    """Old tree (before the consolidation) against the new, alternated in one session: % of copy per measure."""
    doc = load_measurement(AB_FILE)
    if doc is None:
        return f"{MEASURED}/{AB_FILE}.json is not committed.\n"
    runs = doc["results"]["runs"]
    rows = []
    for routing in ("uniform", "skewed"):
        for m in sorted({r["m"] for run in runs for r in run["rows"]}):
            row: dict[str, Any] = {"routing": routing, "M": m}
            for key, label in AB_MEASURES:
                vals = {lab: [r[key] for run in runs if run["label"] == lab for r in run["rows"]
                              if r["routing"] == routing and r["m"] == m and key in r] for lab in ("old", "new")}
                row[f"{label}: old"] = " / ".join(f"{v:.1f}" for v in vals["old"])
                row[f"{label}: new"] = " / ".join(f"{v:.1f}" for v in vals["new"])
                row[f"{label}: new - old"] = f"{statistics.mean(vals['new']) - statistics.mean(vals['old']):+.1f}"
            rows.append(row)
    codes = sorted({run["provenance"]["git_commit"][:7] + " (" + run["label"] + ")" for run in runs})
    return (f"`{AB_FILE}.json`: {len(runs)} processes in the order old, new, old, new on one GPU, codes "
            f"{', '.join(codes)}; % of copy bandwidth per process:\n\n" + markdown_table(rows))


BLOCKS: dict[str, Callable[[], str]] = {
    "provenance": block_provenance, "dispatch": block_dispatch, "floor": block_floor, "summary": block_summary,
    "small": block_small, "call_time": block_call_time, "goals": block_goals, "anchors": block_anchors,
    "large": block_large, "checks": block_checks, "versions": block_versions, "layout": block_layout,
    "sweep_vs_dispatch": block_sweep_vs_dispatch, "consolidation_ab": block_consolidation_ab,
}


def render(text: str) -> str:
    """``text`` with every generated block rewritten; unknown block names are an error."""
    return papers.render(text, BLOCKS)


def main(argv: list[str] | None = None) -> int:
    return papers.main(argv, paper=PAPER, blocks=BLOCKS, prog="python -m workbench.reports.moe",
                       description=__doc__.split("\n")[0])


if __name__ == "__main__":
    sys.exit(main())
