"""Generated blocks of papers/moe_int4.md (the fused INT4 MoE kernel on the H200).

Every measured number in the paper comes from here, read from
``data/measurements/h200/moe_bandwidth.json`` (its earlier runs from git
history, :func:`workbench.papers.committed_json`), ``moe_small_v3.json``
(the one-launch kernel's version 3 against the four-launch path, M <= 16),
``moe_small_splitk.json`` (version 3, the split-K forms and the four-launch path, M <= 16: the run
today's dispatch was set from), ``moe_small_tma.json`` / ``moe_small_tma2.json`` (the producer / consumer
one-launch kernels beside the dispatched paths), ``moe_small_s4f.json`` (the -136 offset on the tensor
core), ``moe_small_s4g.json`` (the group-sum correction), ``moe_small_ctasplit.json`` (the CTA-split
kernel, once run) and the Nsight Compute text reports,
the Nsight Compute text report and the source's anchor points
(``data/anchors/rtx_pro_6000_moe.json``):

    python -m workbench.moe.report            # rewrite papers/moe_int4.md in place
    python -m workbench.moe.report --check    # exit 1 if the paper is stale
"""
from __future__ import annotations

import statistics

import sys
from typing import Any, Callable

from workbench import REPO_ROOT, papers
from workbench.moe.bench import flops
from workbench.moe import ceiling_report, plots
from workbench.moe.fused import SMALL_TABLE, variant_name
from workbench.moe.plots import PEERS, goal_rows, load_anchors, load_moe_bandwidth, summary_rows, tuning_rows
from workbench.papers import markdown_table

PAPER = REPO_ROOT / "papers" / "moe_int4.md"
MOE_FILE = "data/measurements/h200/moe_bandwidth.json"
# Committed runs of moe_bandwidth.json: (commit of the file, run number). The code commit each
# measured is in the file's provenance.
MOE_RUNS = (("9e008e4", 1), ("1a32b46", 2), ("8398986", 3), ("845b07e", 4))
# Nsight Compute text output (device run of code d90e78b): M = 16, the one-launch kernel and the
# four-launch l2 kernels, two calls each, clocks locked by ncu.
NCU_FILE = "data/measurements/h200/moe_small_fused_ncu_d90e78b.txt"
# Version 3 of the one-launch kernel against the four-launch path, M = 1-16 only (bench --small-compare).
SMALL_V3 = "moe_small_v3"
SMALL_SPLITK = "moe_small_splitk"
# Producer / consumer one-launch kernels (moe_small_tma_*) beside the dispatched paths: first run, second run.
SMALL_TMA = ("moe_small_tma", "moe_small_tma2")
# splitk_s4 with the -136 offset added on the tensor core (reverted code).
SMALL_S4F = "moe_small_s4f"
# splitk_s4 with the mma fed q + 136 and each group's sum started from -136 * sum(x) (reverted code).
SMALL_S4G = "moe_small_s4g"
# The CTA-split one-launch kernel (moe_small_ctasplit) beside splitk_s4 and four launches; run 11 (code dda6540,
# device script workbench/moe/h200_ctasplit_run.sh): the run fused.SMALL_TABLE is set from.
SMALL_CTASPLIT = "moe_small_ctasplit"
SMALL_CTASPLIT_SPLITS = "moe_small_ctasplit_splits"   # its split sweep (code ceda11e)
# Run 12: the split-barrier form (moe_small_ctasplit_sb, reverted) beside ctasplit, splitk_s4 and four launches,
# and the timelines of the -DMOE_TRACE build (workbench/moe/trace.py): ctasplit alone (code febc44b), then
# ctasplit and ctasplit_sb (code d2c515f).
SMALL_CTASPLIT_SB = "moe_small_ctasplit_sb"
# Run 13: the activations 4 steps of 64 K ahead (splitk_s4x4, ctasplit_x4, ...): two runs (codes 21b6b07, 0910f69).
SMALL_XPREFETCH = ("moe_small_xprefetch", "moe_small_xprefetch2")
# the x4 kernel at fixed splits, two runs (the second also the file SMALL_TABLE was set from)
SMALL_X4_SPLITS = ("moe_small_x4_splits", "moe_small_x4_splits2")
# run 15: the x4 CTA-split kernel at 4 CTAs per SM (reverted code), two runs; its profile at M = 1
SMALL_X4_B4 = ("moe_small_x4_b4", "moe_small_x4_b4_2")
X4_B4_PROFILE = "data/measurements/h200/moe_small_x4_b4_logs/sass_ctasplit_x4_b4_m1.csv"
# run 16: the XEND forms (dispatched), two runs; their profiles
SMALL_XEND = ("moe_small_xend", "moe_small_xend_2")
XEND_PROFILES = (("ctasplit_x4e", 1), ("ctasplit_x4e_g1d1", 16))
# run 17: ctasplit_x4e at fixed splits, M = 1-4, two runs; then every dispatched path in one process
SMALL_XEND_SPLITS = ("moe_small_xend_splits", "moe_small_xend_splits_2")
# run 18: ctasplit_x4eh (gate_up on fp16 activations; code c8de03a, reverted), two processes, and its profiles
SMALL_F16 = ("moe_small_f16", "moe_small_f16_2")
F16_LOGS = "data/measurements/h200/moe_small_f16_logs"
F16_PROFILES = (("ctasplit_x4e", 1), ("ctasplit_x4eh", 1), ("ctasplit_x4e_g1d1", 16), ("ctasplit_x4eh_g1d1", 16))
# the runs that timed ctasplit_x4e_g2d1 and splitk_s4x4e side by side at M = 3-4 (runs 17, 18, the dispatch check)
M34_RUNS = (*SMALL_XEND_SPLITS, *SMALL_F16, plots.SMALL_COMPARE)
# run 19: x4s / x4ec (code 709c28f, reverted) and x4e_r3 against x4e, two processes; then x4e_r3 at every split
SMALL_XS = ("moe_small_xs", "moe_small_xs_2")
XS_LOGS = "data/measurements/h200/moe_small_xs_logs"
SMALL_R3 = ("moe_small_r3", "moe_small_r3_2")
SMALL_R3F = ("moe_small_r3f", "moe_small_r3f_2")   # run 20: x4e_r3f (one fence per publish) against x4e_r3
SMALL_TIMINGS = ("moe_small_dispatch_494b598", plots.SMALL_COMPARE)   # run 21: one replay, queued, in-graph
SMALL_R3FS = ("moe_small_r3fs", "moe_small_r3fs_2")   # run 22: x4e_r3fs (relaxed h spin, one acquire) against x4e_r3f
# SMALL_TABLE's M ranges before run 19 and the split each ran x4e at: (first M, last M, split suffix)
R3_RANGES = ((1, 1, ""), (2, 2, "_g4d1"), (3, 4, "_g2d1"), (5, 16, "_g1d1"))
TRACE_FILES = ("moe_ctasplit_trace_febc44b", "moe_ctasplit_trace")
# Nsight Compute at M = 1 (clocks not locked): splitk_s4 and the four-launch kernels (code b8e1a33), then
# tma_w4 in each of its two runs.
NCU_M1_FILES = ("data/measurements/h200/moe_small_ncu_m1_b8e1a33.txt",
                "data/measurements/h200/moe_small_tma_logs/ncu_tma_m1.txt",
                "data/measurements/h200/moe_small_tma2_logs/ncu_tma2_m1.txt",
                "data/measurements/h200/moe_small_ctasplit_logs/ncu_ctasplit_m1.txt")
# Nsight Compute at M = 16 (clocks not locked; code f73ff6b): splitk_s4 and the four-launch kernels, and the source
# counters of splitk_s4 alone.
NCU_M16_FILE = "data/measurements/h200/moe_small_ncu_m16_f73ff6b.txt"
NCU_M16_SOURCE = "data/measurements/h200/moe_small_ncu_m16_source_f73ff6b.txt"
# The same kernel's per-SASS-instruction counters (ncu --page source --print-source sass --csv, code f73ff6b).
NCU_M16_SASS = "data/measurements/h200/moe_small_ncu_m16_sass_f73ff6b.csv"
__all__ = ["BLOCKS", "PAPER", "main", "render", "run_rows"]


def _doc() -> dict[str, Any]:
    doc = load_moe_bandwidth()
    if not doc:
        raise FileNotFoundError(f"{MOE_FILE} is not committed")
    return doc


def _f(v: Any, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) else str(v)


def block_provenance() -> str:
    doc = _doc()
    p, par, res = doc["provenance"], doc["parameters"], doc["results"]
    row = {"file": f"`{MOE_FILE}`", "GPU": p.get("gpu"), "code commit": str(p.get("git_commit"))[:7],
           "date (UTC)": p.get("date_utc"), "torch / CuPy / CUDA": f"{p.get('torch')} / {p.get('cupy')} / "
                                                                  f"{p.get('cuda_runtime')}"}
    return (markdown_table([row]) + f"\nShapes: {par['num_experts']} experts, hidden {par['hidden']}, intermediate "
            f"{par['intermediate']}, top-{par['topk']}, group {par['group_size']}; {par['bytes_per_expert']} bytes "
            f"per expert (INT4 weights and bf16 scales of gate, up and down). Measured in the same run: copy "
            f"bandwidth {res['copy_gb_per_s']:.0f} GB/s, bf16 matmul {res['bf16_matmul_tflops']:.0f} TFLOP/s. "
            f"Timing: {par['timing']}. Weights: {par['weights']}.\n")


def block_goals() -> str:
    """The goal rows of moe_bandwidth.json, then the two bandwidth rows of its repeat at the same dispatch
    (plots.load_moe_repeat) where one is committed."""
    met = {True: "yes", False: "**no**"}
    rep = plots.load_moe_repeat()
    rows = [(r, "moe_bandwidth") for r in goal_rows(_doc())] + [(r, plots.CURRENT_REPEAT)
                                                                 for r in (plots.bandwidth_goal_rows(rep) if rep else [])]
    return markdown_table([{"goal (issue 5)": r["goal"], "sweep": f"`{name}.json`", "target": r["target"],
                            "measured (worst)": _f(r["measured (worst)"], ".3g"), "met": met[bool(r["met"])]}
                           for r, name in rows])


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
    return "Uniform routing.\n\n" + markdown_table(rows)


def block_summary() -> str:
    keep = ["routing", "M", "experts", "ms", "GB/s", "% copy", "TFLOP/s", "ms/token", "kernel"]
    fmt = {"ms": ".4f", "GB/s": ".0f", "% copy": ".1f", "TFLOP/s": ".1f", "ms/token": ".4f"}
    rows = []
    for r in summary_rows(_doc()):
        row = {k: _f(r[k], fmt.get(k, "")) for k in keep}
        row.update({f"x {k}": _f(r[f"x vs {k}"], ".1f") for k in PEERS})
        rows.append(row)
    plateau = {r["routing"]: r["plateau M*"] for r in summary_rows(_doc())}
    peers = "; ".join(f"`{k}`: {v}" for k, v in PEERS.items())
    return (f"Peers (x = peer time / kernel time, same run): {peers}. Plateau M* (time per token stops "
            f"falling, within 10%): " + ", ".join(f"{k} {v}" for k, v in sorted(plateau.items())) + ".\n\n"
            + markdown_table(rows))


def block_checks() -> str:
    res = _doc()["results"]
    checks = res["checks"]
    ours = [c for c in checks if "kernel_config" in c]
    peers = [c for c in checks if "peer" in c]
    other = [c for c in checks if "kernel_config" not in c and "peer" not in c]
    errs = [c["rel_err"] for c in ours if isinstance(c.get("rel_err"), float)]
    kernels = {c.get("path") or _variant(c["kernel_config"]) for c in ours}
    if any("variant" in c for c in ours):
        kernels |= {_variant(c["variant"]) for c in ours if "variant" in c}
    text = (f"{len(ours)} kernel checks against the float32 reference (M in {sorted({c['m'] for c in ours})}, "
            f"routings {sorted({c['routing'] for c in ours})}, {len(kernels)} kernels "
            f"({', '.join(sorted(kernels))})): worst relative error {max(errs):.2e}, non-finite outputs "
            f"{sum(c.get('nonfinite', 0) for c in ours)}, all ok = {res['all_checks_ok']}. Variants failing a check "
            f"in the tuning step: {res['tuning'].get('variants_failing_checks') or 'none'}.")
    if peers:
        text += " Peers checked against the same reference: " + ", ".join(
            f"{c['peer']} (M={c['m']}, rel. error {c['rel_err']:.2e})" for c in peers) + "."
    if other:
        text += " Other checks: " + "; ".join(
            f"{c['routing']} M={c['m']}" + (f" ({c['path']})" if c.get("path") else "") + ": "
            + (c.get("note") or (f"worst rel. error {c['rel_err']:.2e}" if isinstance(c.get("rel_err"), float)
                                 else "")) + f" (ok = {c['ok']})" for c in other) + "."
    return text + "\n"


def block_anchors() -> str:
    a = load_anchors()
    rows_by_m = {r["m"]: r for r in _doc()["results"]["rows"] if r["routing"] == "uniform"}
    out = []
    for p in a["points"]:
        h = rows_by_m.get(p["m"])
        out.append({"M": p["m"], f"source {a['gpu']} ms/layer": f"{p['ms_per_layer']:g}",
                    "H200 ms/layer (uniform)": f"{h['ms_median']:.3f}" if h else "-",
                    "H200 % of copy": f"{h['pct_of_copy']:.1f}" if h else "-",
                    "ratio source / H200": f"{p['ms_per_layer'] / h['ms_median']:.1f}" if h else "-"})
    lo, hi = a["percent_of_peak"]["range"]
    bw = _doc()["results"]["copy_gb_per_s"] / 1e3 / a["peak_bandwidth_tb_per_s"]
    return (f"The source states {lo}-{hi}% of {a['peak_bandwidth_tb_per_s']} TB/s on the {a['gpu']} and a plateau "
            f"at M >= {a['plateau_m']['value']} ({a['source'].split(' (')[0]}). The H200's copy bandwidth measured "
            f"in this run is {bw:.2f}x that {a['peak_bandwidth_tb_per_s']} TB/s.\n\n" + markdown_table(out))


def _variant(config: list[int]) -> str:
    """Variant name of a kernel_config; earlier runs recorded (NT, RT, D) or (NT, RT, D, S)."""
    return variant_name(tuple(config) + (0,) * (5 - len(config)))


def run_rows() -> list[dict[str, Any]]:
    """One row per committed run of moe_bandwidth.json (from git history): code commit, % of copy at
    M = 1 and 16 and the speedup ranges over M <= 16."""
    rows = []
    for commit, run in MOE_RUNS:
        doc = papers.committed_json(commit, MOE_FILE)
        if doc is None:
            continue
        small = [r for r in doc["results"]["rows"] if r["m"] <= 16]
        at = {(r["routing"], r["m"]): r for r in small}
        sb = [r["speedup_vs_bf16_cublas"] for r in small if isinstance(r.get("speedup_vs_bf16_cublas"), float)]
        si = [r["speedup_vs_torch_int4pack"] for r in small
              if isinstance(r.get("speedup_vs_torch_int4pack"), float)]
        kc = {r.get("path") or _variant(r["kernel_config"]) for r in small}
        rows.append({"run": run, "file commit": commit, "code commit": doc["provenance"]["git_commit"][:7],
                     "kernel at M <= 16": ", ".join(sorted(kc)),
                     "% copy M=1 (uniform / skewed)": f"{at[('uniform', 1)]['pct_of_copy']:.1f} / "
                                                      f"{at[('skewed', 1)]['pct_of_copy']:.1f}",
                     "% copy M=16 (uniform / skewed)": f"{at[('uniform', 16)]['pct_of_copy']:.1f} / "
                                                       f"{at[('skewed', 16)]['pct_of_copy']:.1f}",
                     "x bf16 cuBLAS, M <= 16": f"{min(sb):.1f}-{max(sb):.1f}",
                     "x torch int4, M <= 16": f"{min(si):.1f}-{max(si):.1f}",
                     "checks ok": doc["results"]["all_checks_ok"]})
    return rows


def block_runs() -> str:
    rows = run_rows()
    if len(rows) < len(MOE_RUNS):
        return (f"git history with the runs' commits ({', '.join(c for c, _ in MOE_RUNS)}) is not available here; "
                f"{MOE_FILE} holds the last run.\n")
    return markdown_table(rows)


FAMILIES = {"d": "register prefetch", "s": "cp.async ring, fragment order", "l": "cp.async ring, whole lines"}


def family_rows(m_values: tuple[int, ...] = (1, 16)) -> list[dict[str, Any]]:
    """Per committed run and M: the fastest variant of each family (by the suffix of its name) in that
    run's tuning step (uniform routing), with its ms per layer."""
    rows = []
    for commit, run in MOE_RUNS:
        doc = papers.committed_json(commit, MOE_FILE)
        if doc is None:
            continue
        ms = doc["results"]["tuning"]["ms"]
        for m in m_values:
            row: dict[str, Any] = {"run": run, "M": m}
            for fam, label in FAMILIES.items():
                cand = {k: v[str(m)] for k, v in ms.items() if k.rsplit("_", 1)[-1].startswith(fam)}
                row[label] = (f"{min(cand.values()):.3f} ({min(cand, key=cand.get)})" if cand else "-")
            rows.append(row)
    return rows


def block_families() -> str:
    rows = family_rows()
    if len({r["run"] for r in rows}) < len(MOE_RUNS):
        return "git history with the runs' commits is not available here.\n"
    return "Fastest variant of each family, ms per layer (uniform routing; tuning step of each run).\n\n" + \
        markdown_table(rows)


def block_tuning() -> str:
    rows = tuning_rows(_doc())
    best = _doc()["results"]["tuning"].get("best", [])
    fmt = [{k: _f(v, ".3f") for k, v in r.items()} for r in rows]
    return ("ms per layer of every compiled variant (uniform routing, the run's tuning step); the fastest per M: "
            + ", ".join(f"M={m}: {_variant(v)}" for m, v in best) + ".\n\n" + markdown_table(fmt))


def small_rows() -> list[dict[str, Any]]:
    """Per routing and M <= 16: the one-launch kernel and the four-launch kernels, timed in the same run."""
    rows = []
    for r in _doc()["results"]["rows"]:
        if "small_fused_ms_median" not in r:
            continue
        rows.append({"routing": r["routing"], "M": r["m"], "experts": r["distinct_experts_median"],
                     "one launch ms": f"{r['small_fused_ms_median']:.4f}",
                     "one launch % copy": f"{r['small_fused_pct_of_copy']:.1f}",
                     f"four launches ({r['four_launch_variant']}) ms": f"{r['four_launch_ms_median']:.4f}",
                     "four launches % copy": f"{r['four_launch_pct_of_copy']:.1f}",
                     "dispatched": r["path"]})
    return rows


def block_small() -> str:
    rows = small_rows()
    if not rows:
        return "The last run has no timing of the one-launch kernel.\n"
    tun = _doc()["results"]["tuning"]
    spans, lo = [], 1
    m_cap = 128 // _doc()["parameters"]["topk"]
    for u, use in tun["small_table"]:   # merge neighbouring entries with the same choice
        u = min(u, m_cap)
        if spans and spans[-1][2] == use:
            spans[-1][1] = u
        else:
            spans.append([lo, u, use])
        lo = u + 1
    return ("Both paths, same run, CUDA-graph replays with fresh routing (the summary above shows the "
            "dispatched one). The run's tuning step (uniform routing) chose: "
            + ", ".join(f"M {a}-{b}: {'one launch' if use else 'four launches'}" for a, b, use in spans)
            + " (M x top-k <= 128: where the one-launch kernel can run).\n\n" + markdown_table(rows))


def small_v3_rows() -> list[dict[str, Any]]:
    """Rows of ``moe_small_v3.json``: per routing and M, both paths timed in one run (empty if not committed)."""
    from workbench.measure import load_measurement

    doc = load_measurement(SMALL_V3)
    if not doc:
        return []
    return [{"routing": r["routing"], "M": r["m"], "experts": r["distinct_experts_median"],
             "one launch (v3) ms": f"{r['small_fused_ms_median']:.4f}",
             "one launch % copy": f"{r['small_fused_pct_of_copy']:.1f}",
             f"four launches ({r['four_launch_variant']}) ms": f"{r['four_launch_ms_median']:.4f}",
             "four launches % copy": f"{r['four_launch_pct_of_copy']:.1f}",
             "speedup": f"{r['speedup_small_vs_four_launch']:.2f}"} for r in doc["results"]["rows"]]


def block_small_v3() -> str:
    from workbench.measure import load_measurement

    doc = load_measurement(SMALL_V3)
    if not doc:
        return f"data/measurements/h200/{SMALL_V3}.json is not committed.\n"
    p, par, res = doc["provenance"], doc["parameters"], doc["results"]
    checks = res["checks"]
    worst = _worst_rel_err(checks)
    wins = ", ".join(f"{r} M={m}" for r, m in res["small_faster_at"]) or "none"
    return (f"From `data/measurements/h200/{SMALL_V3}.json` (code {str(p.get('git_commit'))[:7]}, "
            f"{p.get('date_utc')}; `python -m workbench.moe.bench --small-compare {SMALL_V3} --reps {par['reps']}`): "
            f"both paths in one process, CUDA-graph replays with fresh routing per repeat, copy bandwidth "
            f"{res['copy_gb_per_s']:.0f} GB/s measured in the same run; one-launch grid "
            f"{par.get('small_path_grid_ctas')} CTAs. Parity of the one-launch kernel at every row: "
            f"{len(checks)} checks, worst rel. error {worst:.2e}, all ok = {res['all_checks_ok']}. "
            f"One launch faster at: {wins}.\n\n" + markdown_table(small_v3_rows()))


def small_run_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of one ``--small-compare`` run (:func:`workbench.moe.plots.small_path_rows`): % of copy to one
    decimal, "-" where a path was not timed, the ms columns left out."""
    return [{k: (f"{v:.1f}" if isinstance(v, float) else ("-" if v is None else v))
             for k, v in r.items() if not k.endswith(" ms")} for r in plots.small_path_rows(doc)]


def _worst_rel_err(checks: list[dict[str, Any]]) -> float:
    """Largest relative error of a run's parity checks (NaN when it has none)."""
    return max(c["rel_err"] for c in checks) if checks else float("nan")


def pair_delta_rows(names: tuple[str, ...], pairs: tuple[tuple[str, str], ...]) -> list[dict[str, Any]]:
    """Per (routing, M): for each (new, old) pair of paths, new minus old in points of % of copy, in each run of
    ``names`` (one column per pair and run, "-" where a run did not time both), then each pair's minimum and
    maximum over the runs: the differences the outcome paragraphs describe, computed from the files."""
    docs = [(n, plots.load_moe_small(name=n)) for n in names]
    table: dict[tuple[str, int], dict[str, Any]] = {}
    for i, (_, doc) in enumerate(docs):
        if not doc:
            continue
        for r in doc["results"]["rows"]:
            row = table.setdefault((r["routing"], r["m"]), {"routing": r["routing"], "M": r["m"]})
            for new, old in pairs:
                a, b = r.get(f"{new}_pct_of_copy"), r.get(f"{old}_pct_of_copy")
                row[f"{new} - {old}, run {i + 1}"] = a - b if a is not None and b is not None else None
    out = []
    for key in sorted(table):
        row = table[key]
        for new, old in pairs:
            vals = [v for k, v in row.items() if k.startswith(f"{new} - {old},") and v is not None]
            row[f"{new} - {old}, min..max"] = f"{min(vals):+.1f}..{max(vals):+.1f}" if vals else "-"
        out.append({k: (f"{v:+.1f}" if isinstance(v, float) else ("-" if v is None else v)) for k, v in row.items()})
    return out


def _two_runs_block(names: tuple[str, str], pairs: tuple[tuple[str, str], ...],
                    second: str = "The second process:") -> str:
    """Two --small-compare runs of the same paths (separate processes), then their difference table."""
    return (_small_run_block(names[0]) + f"\n{second}\n\n" + _small_run_block(names[1])
            + _pair_delta_block(names, pairs))


def _stall_block(variant: str, m: int, path: str, top: int) -> str:
    """The ``top`` instructions by warp-stall samples of one profiled launch (:func:`ncu_sass_rows`), titled."""
    hot, _ = ncu_sass_rows(path, top=top)
    return (f"\n`{variant}` at M = {m} (`{path.split('/')[-1]}`), the instructions with the most warp-stall "
            "samples:\n\n" + markdown_table(hot))


def _pair_delta_block(names: tuple[str, ...], pairs: tuple[tuple[str, str], ...]) -> str:
    return ("\nDifferences in points of % of copy, new minus old, in each run (computed from the files above):\n\n"
            + markdown_table([{k: v for k, v in r.items() if ", run " not in k} for r in pair_delta_rows(names, pairs)]))


def _small_run_block(name: str) -> str:
    """One --small-compare run: every path's % of copy per row, the fastest and today's dispatch."""
    doc = plots.load_moe_small(name=name)
    if not doc:
        return f"data/measurements/h200/{name}.json is not committed.\n"
    p, par, res = doc["provenance"], doc["parameters"], doc["results"]
    checks = res["checks"]
    return (f"From `data/measurements/h200/{name}.json` (code {str(p.get('git_commit'))[:7]}, {p.get('date_utc')}; "
            f"`--small-compare {name} --reps {par['reps']} --small-paths {' '.join(par['paths'])}`, M = "
            f"{', '.join(map(str, par['m_values']))}): copy {res['copy_gb_per_s']:.0f} GB/s in the same run; grids "
            f"(CTAs): {', '.join(f'{k} {v}' for k, v in (par.get('grid_ctas') or {}).items())}; parity "
            f"{len(checks)} checks, worst rel. error {_worst_rel_err(checks):.2e}, all ok = {res['all_checks_ok']}. "
            f"% of copy per path; `dispatched` is today's dispatch.\n\n" + markdown_table(small_run_rows(doc)))


def block_small_tma() -> str:
    """The producer / consumer kernels' two runs (reverted code), beside the dispatched paths."""
    return "\n".join(_small_run_block(name) for name in SMALL_TMA)


def block_small_s4f() -> str:
    """splitk_s4 with the -136 offset on the tensor core (reverted code), beside splitk_s4 and four launches."""
    return _small_run_block(SMALL_S4F)


def block_small_s4g() -> str:
    """splitk_s4 with the group-sum correction (reverted code), beside splitk_s4 and four launches."""
    return _small_run_block(SMALL_S4G)


def block_small_ctasplit() -> str:
    """Run 11: the CTA-split kernel beside splitk_s4 and four launches (the dispatch of M = 1 until run 13); then
    the split sweep of the CTA-split kernel."""
    return (_small_run_block(SMALL_CTASPLIT)
            + "\nThe split sweep (fixed (gate_up, down) splits of the CTA-split kernel, `ctasplit` = the rule's "
            "(4, 2)):\n\n" + _small_run_block(SMALL_CTASPLIT_SPLITS))


def dispatch_summary(name: str = plots.SMALL_COMPARE) -> str:
    """One sentence on the run ``fused.SMALL_TABLE`` was set from: the dispatched path's worst % of copy and the
    rows at and below 80%."""
    doc = plots.load_moe_small(name=name)
    if not doc:
        return f"data/measurements/h200/{name}.json is not committed.\n"
    pct, wrow = plots.dispatched_worst_pct(doc)
    rows = plots.small_path_rows(doc)
    at80 = ", ".join(f"{r['routing']} M={r['M']}" for r in rows if r["dispatched % copy"] >= 80) or "none"
    below = ", ".join(f"{r['routing']} M={r['M']} ({r['dispatched % copy']:.1f}%)" for r in rows
                      if r["dispatched % copy"] < 80) or "none"
    other = ""
    for column, what in (("dispatched in-graph % copy", "Timed in-graph (run 21)"),
                         ("dispatched span % copy", "By the profiler's kernel span (run 34)")):
        got = plots.dispatched_worst_pct(doc, column)
        if got:
            other += (f" {what}: worst {got[0]:.1f}% at {got[1]['routing']} M={got[1]['M']}; below 80%: "
                      + (", ".join(f"{r['routing']} M={r['M']} ({r[column]:.1f}%)" for r in rows if r[column] < 80)
                         or "none") + ".")
    return (f"Dispatched today (`fused.SMALL_TABLE` {SMALL_TABLE}), in `{name}.json`: one replay, worst {pct:.1f}% of "
            f"copy at {wrow['routing']} M={wrow['M']}; rows at >= 80%: {at80}; below 80%: {below}.{other}\n")


def block_small_xprefetch() -> str:
    """Run 13: the activation-prefetch variants, two runs (the first with the wrong-result XD = 3 build), and the
    dispatch they set."""
    return (_small_run_block(SMALL_XPREFETCH[0]) + "\nThe confirming run (the paths that could be dispatched):\n\n"
            + _small_run_block(SMALL_XPREFETCH[1]))


def block_small_x4_splits() -> str:
    """Run 14: the x4 CTA-split kernel at fixed splits, two runs in separate processes."""
    return _two_runs_block(SMALL_X4_SPLITS, (("ctasplit_x4_g1d1", "splitk_s4x4"), ("ctasplit_x4_g2d1", "splitk_s4")),
                           second="The confirming run (same paths, a second process):")


def block_small_xend() -> str:
    """Run 16: the XEND forms beside the x4 kernels, two processes, the dispatch they set, and where they wait."""
    text = _two_runs_block(SMALL_XEND, (("ctasplit_x4e", "ctasplit_x4"), ("splitk_s4x4e", "splitk_s4x4"),
                                        ("ctasplit_x4e_g1d1", "ctasplit_x4_g1d1"), ("ctasplit_x4e", "splitk_s4")))
    for variant, m in XEND_PROFILES:
        path = f"data/measurements/h200/moe_small_xend_logs/sass_{variant}_m{m}.csv"
        if (REPO_ROOT / path).exists():
            text += _stall_block(variant, m, path, top=4)
    return text


def block_small_ctasplit_sb() -> str:
    """Run 12: the split-barrier CTA-split kernel (reverted code) beside ctasplit, splitk_s4 and four launches."""
    return _small_run_block(SMALL_CTASPLIT_SB)


def _trace_table(name: str, note: str = "") -> str:
    """One committed trace run (``python -m workbench.moe.trace``): its provenance and command, then its rows
    (:func:`plots.trace_rows`); ``note`` is appended to the sentence before the table."""
    doc = plots.load_moe_trace(name=name)
    if not doc:
        return f"data/measurements/h200/{name}.json is not committed.\n"
    p, par = doc["provenance"], doc["parameters"]
    return (f"From `data/measurements/h200/{name}.json` (code {str(p.get('git_commit'))[:7]}, "
            f"{p.get('date_utc')}; `python -m workbench.moe.trace --m {' '.join(map(str, par['m_values']))}"
            + (f" --variants {' '.join(par['variants'])}" if "variants" in par else "")
            + f"`, {par['calls']} traced calls per row, medians): times in us from the first CTA's "
            "entry; `task`, `arrive spread`, `last = prev. epilogue warp`, `epilogue`, `fence` as "
            f"gate_up / down{note}.\n\n" + markdown_table(plots.trace_rows(doc)))


def block_ctasplit_trace() -> str:
    """Timelines of the CTA-split kernels from the -DMOE_TRACE build, one table per committed run."""
    return "\n".join(_trace_table(name) for name in TRACE_FILES)


_NCU_M1_KEYS = {"Duration": "us", "DRAM Throughput": "DRAM % peak", "smsp__inst_executed.sum": "instructions (M)",
                "Issued Warp Per Scheduler": "issue / scheduler-cycle", "No Eligible": "no eligible %",
                "Achieved Occupancy": "achieved occupancy %"}
_STALLS = ("long_scoreboard", "membar", "wait", "barrier", "math_pipe_throttle", "not_selected")


def _ncu_launches(path: str) -> dict[str, tuple[str, dict[str, tuple[str, float]]]]:
    """Per kernel name (its last launch) of an Nsight Compute printout (``ncu --section ... --metrics ...``): its grid
    ("X x Y") and every "name [unit] value" line as (unit, value); {} when the file is not committed."""
    import re

    f = REPO_ROOT / path
    if not f.exists():
        return {}
    out: dict[str, tuple[str, dict[str, tuple[str, float]]]] = {}
    cur = None
    for line in f.read_text().splitlines():
        head = re.match(r"^  (moe_\w+) \((\d+), (\d+), \d+\)x\(", line)
        if head:
            cur = head.group(1)
            out[cur] = (f"{head.group(2)} x {head.group(3)}", {})
            continue
        m = re.match(r"^\s{4}(\S.*?)\s{2,}(\S+\s+)?([\d.,]+)\s*$", line)
        if cur and m:
            out[cur][1][m.group(1).strip()] = ((m.group(2) or "").strip(), float(m.group(3).replace(",", "")))
    return out


def ncu_kernel_metrics(path: str) -> dict[str, dict[str, float]]:
    """Per kernel name (its last launch) of an Nsight Compute printout: every metric as a float, byte counts in bytes
    and times in us; {} when the file is not committed."""
    return {k: {key: val * _NCU_UNITS.get(unit, 1.0) for key, (unit, val) in mt.items()}
            for k, (_, mt) in _ncu_launches(path).items()}


# ncu's units -> the factor to bytes (byte counts) or to us (times)
_NCU_UNITS = {"Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12, "ns": 1e-3, "ms": 1e3, "msecond": 1e3,
              "usecond": 1.0, "nsecond": 1e-3}


def ncu_m1_rows(files: tuple[str, ...] = NCU_M1_FILES) -> list[dict[str, Any]]:
    """Per kernel (the last launch of each name) of every Nsight Compute file in ``files`` (the M = 1 ones by
    default): duration, DRAM, instructions, issue rate, occupancy and the main stall reasons (cycles per issued
    instruction)."""
    import re

    out = []
    order = ["file", "kernel", *_NCU_M1_KEYS.values(), *(f"stall {k}" for k in _STALLS)]
    for path in files:
        for kernel, metrics in ncu_kernel_metrics(path).items():
            if kernel in ("moe_align", "moe_combine"):
                continue
            row: dict[str, Any] = {"file": path.rsplit("/", 1)[-1], "kernel": kernel}
            for key, val in metrics.items():
                if key in _NCU_M1_KEYS:
                    row[_NCU_M1_KEYS[key]] = f"{val / 1e6:.1f}" if key.startswith("smsp") else f"{val:.3g}"
                st = re.match(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio", key)
                if st and st.group(1) in _STALLS:
                    row[f"stall {st.group(1)}"] = f"{val:.2f}"
            out.append({k: row.get(k, "-") for k in order})
    return out


def ncu_balance_rows(files: tuple[str, ...]) -> list[dict[str, Any]]:
    """Per kernel of each Nsight Compute file (run 29's, with the SM-cycle metrics): duration, DRAM % of peak and
    bytes read, achieved occupancy, and how evenly the SMs are busy: the busiest SM's active cycles over the mean,
    and the mean SM's active cycles over the elapsed cycles (the rest is launch, ramp and tail)."""
    out = []
    for path in files:
        for kernel, mt in ncu_kernel_metrics(path).items():
            avg, mx, el = (mt.get(k) for k in ("sm__cycles_active.avg", "sm__cycles_active.max",
                                               "gpc__cycles_elapsed.max"))

            def val(key: str, scale: float = 1.0) -> str:
                return f"{mt[key] * scale:.1f}" if key in mt else "-"

            out.append({"file": path.rsplit("/", 1)[-1], "kernel": kernel, "us": val("Duration"),
                        "DRAM % peak": val("DRAM Throughput"), "MB read": val("dram__bytes_read.sum", 1e-6),
                        "achieved occupancy %": val("Achieved Occupancy"),
                        "SM active max / mean": f"{mx / avg:.3f}" if avg and mx else "-",
                        "SM active mean / elapsed": f"{avg / el:.3f}" if avg and el else "-"})
    return out


def block_ncu_m16() -> str:
    """splitk_s4 and the four-launch kernels at M = 16 (Nsight Compute), and the source counters' findings."""
    import re

    f = REPO_ROOT / NCU_M16_FILE
    if not f.exists():
        return f"{NCU_M16_FILE} is not committed.\n"
    src = (REPO_ROOT / NCU_M16_SOURCE).read_text() if (REPO_ROOT / NCU_M16_SOURCE).exists() else ""
    found = [" ".join(m.group(1).split()) for m in
             re.finditer(r"(This kernel has uncoalesced (?:global|shared) accesses resulting in a total of [\d,]+ "
                         r"excessive \w+ \(\d+% of the\s+total [\d,]+ \w+\))", src)]
    return (f"Nsight Compute at M = 16 (uniform; `--clock-control none`; `OUT=DIR MS=16 RACE=0 bash "
            f"workbench/moe/h200_ncu_m1.sh`): `{NCU_M16_FILE}`. Stalls in cycles per issued instruction.\n\n"
            + markdown_table(ncu_m1_rows((NCU_M16_FILE,)))
            + ("\n\nSource counters of `moe_small_splitk_s4` at M = 16 (`" + NCU_M16_SOURCE + "`): "
               + "; ".join(f'"{x}"' for x in found) + ".\n" if found else "\n"))


def ncu_sass_rows(path: str = NCU_M16_SASS, top: int = 8) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """From an ncu ``--page source --print-source sass --csv`` report: the ``top`` instructions by warp-stall
    samples (share of all samples, the stall reasons with the most samples there) and every instruction with
    excessive shared-memory wavefronts (executions, wavefronts, ideal, N-way conflicts)."""
    from workbench.moe.sass import read_source_table

    hdr, data = read_source_table(REPO_ROOT / path)
    col = {h: i for i, h in enumerate(hdr)}

    def num(r: list[str], key: str) -> float:
        try:
            return float(r[col[key]].replace(",", ""))
        except (KeyError, ValueError):
            return 0.0

    samples = "Warp Stall Sampling (All Samples)"
    total = sum(num(r, samples) for r in data) or 1.0
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    hot = []
    for r in sorted(data, key=lambda r: -num(r, samples))[:top]:
        reasons = sorted(stalls, key=lambda h: -num(r, h))[:2]
        hot.append({"instruction": f"`{r[col['Source']].strip()}`", "% of stall samples": f"{100 * num(r, samples) / total:.1f}",
                    "main stalls": ", ".join(f"{h[6:]} {100 * num(r, h) / max(num(r, samples), 1):.0f}%" for h in reasons)})
    conflicts = [{"instruction": f"`{r[col['Source']].strip()}`", "executed": f"{num(r, 'Instructions Executed'):.0f}",
                  "wavefronts": f"{num(r, 'L1 Wavefronts Shared'):.0f}", "ideal": f"{num(r, 'L1 Wavefronts Shared Ideal'):.0f}",
                  "N-way": r[col["L1 Conflicts Shared N-Way"]]}
                 for r in sorted(data, key=lambda r: -num(r, "L1 Wavefronts Shared Excessive"))
                 if num(r, "L1 Wavefronts Shared Excessive") > 0.01 * num(r, "L1 Wavefronts Shared") + 1e4]
    return hot, conflicts


PROFILE_DISPATCHED = "data/measurements/h200/moe_profile_8c7598f"
PROFILE_SPECS = (("ctasplit_x4", 1), ("splitk_s4", 2), ("ctasplit_x4_g1d1", 16))


def _ncu_summary_value(text: str, metric: str) -> str:
    """The value of one metric line ('Duration', 'DRAM Throughput', ...) of an ncu section printout, or '-'."""
    for line in text.splitlines():
        parts = line.split()
        if line.strip().startswith(metric) and parts:
            return parts[-1]
    return "-"


# table column -> the metric line of an ncu section printout it reads
NCU_SUMMARY_COLUMNS = {"duration us": "Duration", "DRAM % of peak": "DRAM Throughput",
                       "issued per scheduler-cycle": "Issued Warp Per Scheduler",
                       "achieved occupancy %": "Achieved Occupancy", "active warps per SM": "Achieved Active Warps",
                       "L2 hit %": "L2 Hit Rate", "grid": "Grid Size", "registers": "Registers Per Thread"}


def ncu_summary_row(text: str, kernel: str, m: int,
                    columns: tuple[str, ...] = ("duration us", "DRAM % of peak", "issued per scheduler-cycle")
                    ) -> dict[str, Any]:
    """One table row of an ncu summary printout ``text`` (h200_profile_dispatched.sh's summary_*.txt): the kernel,
    M and the ``columns`` (keys of :data:`NCU_SUMMARY_COLUMNS`), '-' where the printout lacks the metric."""
    unknown = [c for c in columns if c not in NCU_SUMMARY_COLUMNS]
    if unknown:
        raise ValueError(f"columns must be keys of NCU_SUMMARY_COLUMNS {sorted(NCU_SUMMARY_COLUMNS)}, got {unknown}")
    return {"kernel": f"`{kernel}`", "M": m, **{c: _ncu_summary_value(text, NCU_SUMMARY_COLUMNS[c]) for c in columns}}


def block_small_x4_b4() -> str:
    """Run 15: ctasplit_x4 at 4 CTAs per SM (reverted code) beside the dispatched paths, two processes, and where
    its M = 1 launch waits."""
    text = _two_runs_block(SMALL_X4_B4, (("ctasplit_x4_b4", "ctasplit_x4"), ("ctasplit_x4_b4_g1d1", "ctasplit_x4_g1d1"),
                                         ("ctasplit_x4_b4_g1d1", "splitk_s4")))
    if (REPO_ROOT / X4_B4_PROFILE).exists():
        text += _stall_block("ctasplit_x4_b4", 1, X4_B4_PROFILE, top=5)
    return text


def block_small_xend_splits() -> str:
    """Run 17: ctasplit_x4e at fixed splits at M = 1-4, two processes, against the rule's split and splitk_s4x4e."""
    return _two_runs_block(SMALL_XEND_SPLITS, (("ctasplit_x4e_g4d1", "ctasplit_x4e"), ("ctasplit_x4e_g2d1", "splitk_s4x4e"),
                                               ("ctasplit_x4e_g2d2", "splitk_s4x4e")))


def _loop_cost_cells(r: dict[str, Any], share: bool = False) -> dict[str, Any]:
    """The table cells of one :func:`workbench.moe.sass.stage_loop_costs` loop (with its share of the launch's stall
    samples when ``share``)."""
    return {"stages": r["stages"], "instructions per stage": f"{r['instructions per stage']:.1f}",
            "stall samples per stage": f"{r['samples per stage']:.4f}",
            **({"share of the launch's samples": f"{r['share of samples']:.2f}"} if share else {}),
            "top stall reasons, % of the loop's samples":
                ", ".join(f"{k[:-2]} {v:.0f}" for k, v in r.items() if k.endswith(" %"))}


def block_small_f16() -> str:
    """Run 18: ctasplit_x4eh against ctasplit_x4e at the same splits (two processes), and what their profiles say
    about the stage loops (sass.stage_loop_costs)."""
    from workbench.moe.sass import stage_loop_costs

    text = _two_runs_block(SMALL_F16, (("ctasplit_x4eh", "ctasplit_x4e"), ("ctasplit_x4eh_g4d1", "ctasplit_x4e_g4d1"),
                                       ("ctasplit_x4eh_g2d1", "ctasplit_x4e_g2d1"),
                                       ("ctasplit_x4eh_g1d1", "ctasplit_x4e_g1d1")))
    folder = REPO_ROOT / F16_LOGS
    if not folder.exists():
        return text + f"\n{F16_LOGS}/ is not committed.\n"
    summary, loops = [], []
    for variant, m in F16_PROFILES:
        summary.append(ncu_summary_row((folder / f"summary_{variant}_m{m}.txt").read_text(), variant, m))
        for r in stage_loop_costs(folder / f"sass_{variant}_m{m}.csv"):
            phase = "gate/up" if r["load"].endswith("CONSTANT") else "down"
            loops.append({"kernel": f"`{variant}`", "M": m, "loop": phase, **_loop_cost_cells(r, share=True)})
    return (text + "\nNsight Compute, one launch each in one call (`moe_small_f16_logs/summary_*.txt`; clocks not "
            "locked):\n\n" + markdown_table(summary) + "\nThe stage loops in the same launches (per-instruction "
            "counters of `sass_*.csv`, `workbench.moe.sass.stage_loop_costs`):\n\n" + markdown_table(loops))


def m34_rows(names: tuple[str, ...] = M34_RUNS, new: str = "ctasplit_x4e_g2d1",
             old: str = "splitk_s4x4e") -> list[dict[str, Any]]:
    """``new`` minus ``old`` in points of % of copy at M = 3-4 in every run of ``names`` that timed both, per
    (routing, M), with the mean over the runs; then one row per M with the mean over routings and runs."""
    rows = [r for r in pair_delta_rows(names, ((new, old),)) if r["M"] in (3, 4)]
    out, per_m = [], {}
    for r in rows:
        vals = {k.split(", ")[-1]: v for k, v in r.items() if ", run " in k}
        nums = [float(v) for v in vals.values() if v != "-"]
        per_m.setdefault(r["M"], []).extend(nums)
        out.append({"routing": r["routing"], "M": r["M"], **{names[int(k.split()[-1]) - 1]: v for k, v in vals.items()},
                    "mean": f"{sum(nums) / len(nums):+.1f}", "runs ahead": f"{sum(v > 0 for v in nums)} of {len(nums)}"})
    for m, nums in sorted(per_m.items()):
        out.append({"routing": "both", "M": m, **{n: "" for n in names}, "mean": f"{sum(nums) / len(nums):+.1f}",
                    "runs ahead": f"{sum(v > 0 for v in nums)} of {len(nums)}"})
    return out


def block_small_m34() -> str:
    """ctasplit_x4e_g2d1 against splitk_s4x4e at M = 3-4 over runs 17, 18 and the dispatch check."""
    return ("`ctasplit_x4e_g2d1` minus `splitk_s4x4e`, points of % of copy, in every process that timed both "
            "(columns: the files; computed from them):\n\n" + markdown_table(m34_rows()))


def block_small_xs() -> str:
    """Run 19: x4s (activation slice in the ring), x4e_r3 (3-stage ring) and x4ec (L2-only activation loads) against
    x4e at the same splits, two processes, and the stage loops of x4s's profiles beside run 18's x4e ones."""
    from workbench.moe.sass import stage_loop_costs

    pairs = tuple((f"ctasplit_{k}{sfx}", f"ctasplit_x4e{sfx}") for k, sfxs in
                  (("x4s", ("", "_g4d1", "_g2d1", "_g1d1")), ("x4e_r3", ("", "_g1d1")), ("x4ec", ("", "_g1d1")))
                  for sfx in sfxs)
    text = _two_runs_block(SMALL_XS, pairs)
    loops = []
    for folder, variant, m in ((F16_LOGS, "ctasplit_x4e", 1), (XS_LOGS, "ctasplit_x4s", 1),
                               (F16_LOGS, "ctasplit_x4e_g1d1", 16), (XS_LOGS, "ctasplit_x4s_g1d1", 16)):
        path = REPO_ROOT / folder / f"sass_{variant}_m{m}.csv"
        if not path.exists():
            continue
        for r in stage_loop_costs(path):
            if r["stages"] < 2:
                continue
            phase = {"LDG.E.128.CONSTANT": "gate/up, global x", "-": "gate/up, x from the ring"}.get(r["load"], "down")
            loops.append({"kernel": f"`{variant}`", "M": m, "file": f"`{folder.split('/')[-1]}`", "loop": phase,
                          **_loop_cost_cells(r)})
    return (text + "\nStage loops of the profiled launches (x4e: run 18's call; x4s: this call; "
            "`workbench.moe.sass.stage_loop_costs`):\n\n" + markdown_table(loops))


def _range_deltas(names: tuple[str, ...], new: str, old: str, lo: int,
                  hi: int) -> list[tuple[dict[str, Any], list[float]]]:
    """Per (routing, M) with lo <= M <= hi: the :func:`pair_delta_rows` row of ``new`` minus ``old`` and its values
    in the processes of ``names`` that timed both (rows no process timed are left out)."""
    out = []
    for r in pair_delta_rows(names, ((new, old),)):
        if lo <= r["M"] <= hi:
            vals = [float(v) for k, v in r.items() if ", run " in k and v != "-"]
            if vals:
                out.append((r, vals))
    return out


def _rule_replaces(mean: float, worst: float) -> bool:
    """The dispatch rule written before run 19 (bench.SMALL_R3_PREDICTION), used since: ahead on average, no row's
    mean behind by more than 1.5 points."""
    return mean > 0 and worst >= -1.5


def rule_rows(names: tuple[str, ...], new_prefix: str, old_prefix: str,
              ranges: tuple[tuple[int, int, str], ...] = R3_RANGES) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``new_prefix + split`` minus ``old_prefix + split`` (points of % of copy) at each SMALL_TABLE range's split, over
    every process of ``names`` that timed both: per (range, routing, M) the mean over the processes, and per range
    the mean over its rows, the worst row and the decision of the rule written before the runs
    (bench.SMALL_R3_PREDICTION: the new form replaces the old if the range's mean is > 0 and no row's mean is below
    -1.5)."""
    rows, out = [], []
    for lo, hi, sfx in ranges:
        new, old = f"{new_prefix}{sfx}", f"{old_prefix}{sfx}"
        means = []
        for r, vals in _range_deltas(names, new, old, lo, hi):
            mean = sum(vals) / len(vals)
            means.append(mean)
            rows.append({"M range": f"{lo}-{hi}", "split": sfx.lstrip("_") or "rule", "routing": r["routing"],
                         "M": r["M"], "processes": len(vals), "new - old, mean": f"{mean:+.1f}",
                         "min..max": f"{min(vals):+.1f}..{max(vals):+.1f}"})
        if means:
            avg, worst = sum(means) / len(means), min(means)
            out.append({"M range": f"{lo}-{hi}", "split": sfx.lstrip("_") or "rule", "mean": f"{avg:+.1f}",
                        "worst row mean": f"{worst:+.1f}",
                        f"{new_prefix.removeprefix('ctasplit_')} replaces {old_prefix.removeprefix('ctasplit_')}":
                            "yes" if _rule_replaces(avg, worst) else "no"})
    return rows, out


def split_rule_rows(names: tuple[str, ...], candidates: tuple[str, ...],
                    dispatched: tuple[tuple[int, int, str], ...]) -> list[dict[str, Any]]:
    """Run 23b's rule (bench.SMALL_R3FST_SPLITS_PREDICTION): per M range (lo, hi, dispatched path), each candidate
    path minus the dispatched one (points of % of copy), mean over the range's rows of the mean over the processes
    of ``names``; the candidate with the highest mean replaces the dispatched path if that mean is > 0 and no row's
    mean is below -1.5."""
    out = []
    for lo, hi, disp in dispatched:
        best = None
        for cand in candidates:
            if cand == disp:
                continue
            means = [sum(vals) / len(vals) for _, vals in _range_deltas(names, cand, disp, lo, hi)]
            if means and (best is None or sum(means) / len(means) > best[1]):
                best = (cand, sum(means) / len(means), min(means))
        if best is None:
            continue
        out.append({"M range": f"{lo}-{hi}", "dispatched": disp, "best candidate": best[0], "mean": f"{best[1]:+.1f}",
                    "worst row mean": f"{best[2]:+.1f}", "replaces": "yes" if _rule_replaces(best[1], best[2]) else "no"})
    return out


def r3_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """x4e_r3 against x4e over run 19's two processes and moe_small_r3*.json (:func:`rule_rows`)."""
    return rule_rows((*SMALL_XS, *SMALL_R3), "ctasplit_x4e_r3", "ctasplit_x4e")


def block_small_r3() -> str:
    """x4e_r3 against x4e at every dispatched split: the two processes, then the rule over all four processes."""
    pairs = tuple((f"ctasplit_x4e_r3{sfx}", f"ctasplit_x4e{sfx}") for _, _, sfx in R3_RANGES)
    rows, ranges = r3_rows()
    return (_two_runs_block(SMALL_R3, pairs) + "\nOver every process that timed both (run 19's two and these two), "
            "per row:\n\n" + markdown_table(rows) + "\nPer M range, the rule written before the run:\n\n"
            + markdown_table(ranges))


def block_small_r3f() -> str:
    """Run 20: x4e_r3f against x4e_r3 at every dispatched split, two processes, and the dispatch rule per M range."""
    pairs = tuple((f"ctasplit_x4e_r3f{sfx}", f"ctasplit_x4e_r3{sfx}") for _, _, sfx in R3_RANGES)
    rows, ranges = rule_rows(SMALL_R3F, "ctasplit_x4e_r3f", "ctasplit_x4e_r3")
    return (_two_runs_block(SMALL_R3F, pairs) + "\nPer row, the mean over the two processes:\n\n" + markdown_table(rows)
            + "\nPer M range, the rule written before the run:\n\n" + markdown_table(ranges))


def block_small_r3fs() -> str:
    """Run 22: x4e_r3fs against x4e_r3f at every dispatched split, two processes, and the dispatch rule per M range."""
    pairs = tuple((f"ctasplit_x4e_r3fs{sfx}", f"ctasplit_x4e_r3f{sfx}") for _, _, sfx in R3_RANGES)
    rows, ranges = rule_rows(SMALL_R3FS, "ctasplit_x4e_r3fs", "ctasplit_x4e_r3f")
    return (_two_runs_block(SMALL_R3FS, pairs) + "\nPer row, the mean over the two processes:\n\n" + markdown_table(rows)
            + "\nPer M range, the rule written before the run (at M = 5-16 x4e_r3, not x4e_r3f, is dispatched, so that "
            "range's row does not apply):\n\n" + markdown_table(ranges))


def block_small_timings() -> str:
    """Run 21: the dispatched path of each M timed three ways, in each process that did (SMALL_TIMINGS), then the full
    sweep's rows (moe_bandwidth.json) the same way."""
    parts = []
    for name in SMALL_TIMINGS:
        doc = plots.load_moe_small(name=name)
        if not doc:
            raise FileNotFoundError(f"data/measurements/h200/{name}.json is not committed")
        parts.append(f"`{name}.json` (code {doc['provenance']['git_commit'][:7]}, copy "
                     f"{doc['results']['copy_gb_per_s']:.0f} GB/s in the same run):\n\n" + markdown_table(plots.timing_rows(doc)))
    bw = _doc()
    rows = [{"routing": r["routing"], "M": r["m"], "path": r.get("path"), "% copy one replay": f"{r['pct_of_copy']:.1f}",
             "queued": f"{r['queued_pct_of_copy']:.1f}", "in-graph": f"{r['ingraph_pct_of_copy']:.1f}"}
            for r in sorted(bw["results"]["rows"], key=lambda r: (r["routing"], r["m"])) if "ingraph_pct_of_copy" in r]
    if rows:
        parts.append(f"The full sweep (`moe_bandwidth.json`, code {bw['provenance']['git_commit'][:7]}, the path its "
                     "tuning dispatched at each M):\n\n" + markdown_table(rows))
    return "\n".join(parts)


COPY_PROBE = "moe_copy_probe"   # run 34: the copy ceiling timed three ways, and the graph launch latency


def block_call_time_split() -> str:
    """Run 34: where one call's time goes, per full sweep with the profiler's spans (moe_bandwidth.json and its repeat
    :data:`plots.CURRENT_REPEAT`): per M <= 16 row, one replay on an idle GPU, queued, the profiler's kernel span and
    in-graph, one replay minus the span; the graph launch latency probe of the same process; then the copy ceiling
    timed three ways (:data:`COPY_PROBE`) and what the worst span row becomes against the span-timed copy."""
    from workbench.measure import load_measurement

    us = lambda v: f"{1e3 * v:.1f}"   # noqa: E731
    parts, worst_span = [], []   # worst span % of copy of each sweep
    for name in ("moe_bandwidth", plots.CURRENT_REPEAT):
        doc = load_measurement(name)
        lat = doc["results"].get("graph_launch_latency") if doc else None
        rows = [r for r in doc["results"]["rows"] if r["m"] <= 16 and "span_ms_median" in r] if doc else []
        if not rows or not lat:
            parts.append(f"`{name}.json` is not committed or has no profiler spans.\n")
            continue
        worst_span.append(min(r["span_pct_of_copy"] for r in rows))
        table = plots.call_time_rows(doc)
        raw = (f"; launched by cudaGraphLaunch through cupy instead of torch's replay(), one replay "
               f"{us(lat['raw_one_replay_ms_median'])} us, difference {us(lat['raw_latency_ms'])} us"
               if "raw_latency_ms" in lat else "")
        parts.append(f"`{name}.json` (code {doc['provenance']['git_commit'][:7]}, copy "
                     f"{doc['results']['copy_gb_per_s']:.0f} GB/s, {doc['parameters']['reps']} samples a timing). "
                     f"Graph launch latency in the same process (a graph of one 1-element add): one replay "
                     f"{us(lat['one_replay_ms_median'])} us, queued {us(lat['queued_ms_median'])} us, difference "
                     f"{us(lat['latency_ms'])} us{raw}.\n\n" + markdown_table(table) + "\n")
    probe = load_measurement(COPY_PROBE)
    if probe:
        pr = probe["results"]["rows"]
        ratio = statistics.median(r["span_over_one"] for r in pr)
        parts.append(f"The copy ceiling timed three ways (`{COPY_PROBE}.json`, code {probe['provenance']['git_commit'][:7]}, "
                     f"{len(pr)} rounds of {probe['parameters']['samples_per_timing']} samples of a 2 GiB copy):\n\n"
                     + markdown_table([{"round": r["round"], "events GB/s": f"{r['copy_one_gb_per_s']:.0f}",
                                        "queued GB/s": f"{r['copy_queued_gb_per_s']:.0f}",
                                        "span GB/s": f"{r['copy_span_gb_per_s']:.0f}",
                                        "span / events": f"{r['span_over_one']:.4f}",
                                        "launch latency us (torch / cupy)":
                                            f"{r['launch_latency_us']:.1f} / {_f(r['raw_launch_latency_us'], '.1f')}"}
                                       for r in pr])
                     + f"\n\nEvery % of copy divides by the events' ceiling. Timed the span's way the ceiling is "
                       f"{ratio:.4f}x (median over rounds), so the worst span rows above "
                       f"({', '.join(f'{w:.1f}' for w in worst_span)}) would read "
                       f"{', '.join(f'{w / ratio:.1f}' for w in worst_span)} against a span-timed copy.\n")
    return "\n".join(parts)


SMALL_R3FST = ("moe_small_r3fst", "moe_small_r3fst_2")   # run 23: x4e_r3fst (static first tasks) against x4e_r3fs
SMALL_R3FST_SPLITS = ("moe_small_r3fst_splits", "moe_small_r3fst_splits_2")   # run 23b: its split sweep
R3FST_CANDIDATES = tuple(f"ctasplit_x4e_r3fst{sfx}" for _, _, sfx in R3_RANGES)
R3FST_DISPATCHED = ((1, 1, "ctasplit_x4e_r3fst"), (2, 2, "ctasplit_x4e_r3f_g4d1"), (3, 4, "ctasplit_x4e_r3f_g2d1"),
                    (5, 16, "ctasplit_x4e_r3_g1d1"))   # the dispatch when run 23b ran


def block_small_r3fst() -> str:
    """Run 23: x4e_r3fst against x4e_r3fs at the four splits (two processes, run 19's rule), then the split sweep of
    run 23b with its own rule."""
    pairs = tuple((f"ctasplit_x4e_r3fst{sfx}", f"ctasplit_x4e_r3fs{sfx}") for _, _, sfx in R3_RANGES)
    rows, ranges = rule_rows(SMALL_R3FST, "ctasplit_x4e_r3fst", "ctasplit_x4e_r3fs")
    return (_two_runs_block(SMALL_R3FST, pairs) + "\nPer M range, run 19's rule (x4e_r3fs was dispatched at M = 1 "
            "only, so only that row decides):\n\n" + markdown_table(ranges)
            + "\nRun 23b, the split sweep (x4e_r3fst at every split beside the dispatched path of each M):\n\n"
            + _small_run_block(SMALL_R3FST_SPLITS[0]) + "\nThe second process:\n\n"
            + _small_run_block(SMALL_R3FST_SPLITS[1]) + "\nPer M range, the rule written before the sweep "
            "(bench.SMALL_R3FST_SPLITS_PREDICTION):\n\n"
            + markdown_table(split_rule_rows(SMALL_R3FST_SPLITS, R3FST_CANDIDATES, R3FST_DISPATCHED)))


SMALL_WSPLIT = ("moe_small_wsplit", "moe_small_wsplit_2")   # run 25: the warp-split kernel beside the dispatch
WSPLIT_CANDIDATES = ("wsplit_r3", "wsplit_r4", "wsplit_r3_g4d1", "wsplit_r3_g2d1", "wsplit_r3_g1d1")
WSPLIT_DISPATCHED = R3FST_DISPATCHED   # the dispatch when run 25 ran (run 23b's)


def block_small_wsplit() -> str:
    """Run 25: the warp-split kernel at five forms beside the dispatched paths, two processes, and run 23b's rule."""
    return (_small_run_block(SMALL_WSPLIT[0]) + "\nThe second process:\n\n" + _small_run_block(SMALL_WSPLIT[1])
            + "\nPer M range, run 23b's rule (the best candidate replaces the dispatched path if its mean over the "
            "range's rows of the mean over the processes is > 0 and no row's mean is below -1.5):\n\n"
            + markdown_table(split_rule_rows(SMALL_WSPLIT, WSPLIT_CANDIDATES, WSPLIT_DISPATCHED)))


SMALL_NB = ("moe_small_nb", "moe_small_nb_2")   # run 26: x4e_r3nb (no block barrier; reverted code, a62ea3b)
NB_CANDIDATES = tuple(f"ctasplit_x4e_r3nb{sfx}" for sfx in ("", "_g4d1", "_g2d1", "_g1d1"))
NB_DISPATCHED = ((1, 1, "ctasplit_x4e_r3fst"), (2, 2, "wsplit_r3_g2d1"), (3, 16, "wsplit_r3_g1d1"))   # run 25's


def block_small_nb() -> str:
    """Run 26: the CTA-split kernel without its block barrier beside today's dispatch, two processes, run 23b's rule."""
    return (_small_run_block(SMALL_NB[0]) + "\nThe second process:\n\n" + _small_run_block(SMALL_NB[1])
            + "\nPer M range, run 23b's rule:\n\n"
            + markdown_table(split_rule_rows(SMALL_NB, NB_CANDIDATES, NB_DISPATCHED)))


SMALL_RUN27 = ("moe_small_il", "moe_small_il_2", "moe_small_ew", "moe_small_ew_2", "moe_small_ew5", "moe_small_ew5_2")
SMALL_RUN27C = ("moe_small_sd", "moe_small_sd_2")   # run 27c, after the M = 2 dispatch change
TRACE_RUN27 = ("moe_ctasplit_trace_r3fst", "moe_ctasplit_trace_il", "moe_ctasplit_trace_moe_small_ew",
               "moe_ctasplit_trace_moe_small_ew5", "moe_ctasplit_trace_moe_small_sd")   # run 27: the dispatched M = 1
# kernel's timeline, then 27a's, 27b's and 27c's


RUN27_DISPATCHED = ((1, 1, "ctasplit_x4e_r3fst"), (2, 2, "wsplit_r3_g2d1"))   # the dispatch when run 27 ran (run 25's)


def run27_rule_rows() -> list[dict[str, Any]]:
    """Run 23b's rule over run 27's six processes at M = 1-2 with the paths every one of them timed (x4e_r3fst at (4, 2)
    and at (4, 1), wsplit_r3_g2d1): one replay, as the rule was written; then the same differences in-graph."""
    cands = ("ctasplit_x4e_r3fst", "ctasplit_x4e_r3fst_g4d1", "wsplit_r3_g2d1")
    rows = split_rule_rows(SMALL_RUN27, cands, RUN27_DISPATCHED)
    for r, (lo, hi, disp) in zip(rows, RUN27_DISPATCHED):
        deltas = []
        for name in SMALL_RUN27:
            doc = plots.load_moe_small(name=name)
            for row in (doc or {"results": {"rows": []}})["results"]["rows"]:
                a, b = row.get(f"{r['best candidate']}_ingraph_pct_of_copy"), row.get(f"{disp}_ingraph_pct_of_copy")
                if lo <= row["m"] <= hi and a is not None and b is not None:
                    deltas.append(a - b)
        r["in-graph: rows ahead / rows"] = f"{sum(d > 0 for d in deltas)} / {len(deltas)}"
        r["in-graph mean"] = f"{sum(deltas) / len(deltas):+.1f}" if deltas else "-"
    return rows


RUN27_PAIRS = {   # run 27's forms against x4e_r3fst at the same split
    "moe_small_il": (("ctasplit_x4e_r3fsti", "ctasplit_x4e_r3fst"), ("ctasplit_x4e_r3fsti2", "ctasplit_x4e_r3fst"),
                     ("ctasplit_x4e_r3fsti_g4d1", "ctasplit_x4e_r3fst_g4d1")),
    "moe_small_ew": (("ctasplit_x4e_r3fste", "ctasplit_x4e_r3fst"), ("ctasplit_x4e_r4fste", "ctasplit_x4e_r3fst"),
                     ("ctasplit_x4e_r3fste_g4d1", "ctasplit_x4e_r3fst_g4d1"),
                     ("ctasplit_x4e_r4fste_g4d1", "ctasplit_x4e_r3fst_g4d1")),
    "moe_small_ew5": (("ctasplit_x4e_r3fste5", "ctasplit_x4e_r3fst"),
                      ("ctasplit_x4e_r3fste5_g4d1", "ctasplit_x4e_r3fst_g4d1")),
    "moe_small_sd": (("ctasplit_x4e_r3fstd", "ctasplit_x4e_r3fst"), ("ctasplit_x4e_r3fstd_g4d1", "ctasplit_x4e_r3fst_g4d1")),
}
RUN27C_DISPATCHED = ((1, 1, "ctasplit_x4e_r3fst"), (2, 2, "ctasplit_x4e_r3fst_g4d1"))   # the dispatch when 27c ran


def run27_delta_rows() -> list[dict[str, Any]]:
    """Per run 27 form (against x4e_r3fst at its split) and M: the difference in points of % of copy, one replay and
    in-graph, as min .. max over the routings and the two processes."""
    out = []
    for base, pairs in RUN27_PAIRS.items():
        docs = [plots.load_moe_small(name=n) for n in (base, f"{base}_2")]
        for new, old in pairs:
            by_m: dict[int, dict[str, list[float]]] = {}
            for doc in docs:
                for r in (doc or {"results": {"rows": []}})["results"]["rows"]:
                    d = by_m.setdefault(r["m"], {"": [], "ingraph_": []})
                    for k in d:
                        a, b = r.get(f"{new}_{k}pct_of_copy"), r.get(f"{old}_{k}pct_of_copy")
                        if a is not None and b is not None:
                            d[k].append(a - b)
            for m in sorted(by_m):
                d = by_m[m]
                out.append({"runs": f"{base}, _2", "form": new, "against": old, "M": m, "rows": len(d[""]),
                            **{lab: (f"{min(v):+.1f} .. {max(v):+.1f}" if v else "-")
                               for lab, v in (("one replay", d[""]), ("in-graph", d["ingraph_"]))}})
    return out


def run27_wait_rows() -> list[dict[str, Any]]:
    """Run 27's timelines at M = 1: the down tasks' total wait for h (us, summed over the CTAs; median over the traced
    calls) per file, variant and routing."""
    out = []
    for name in TRACE_RUN27:
        doc = plots.load_moe_trace(name=name)
        if not doc:
            continue
        for key, smp in doc["samples"].items():
            variant, routing, m = key.split("/")
            waits = sorted(s["down_wait_us_total"] for s in smp["summaries"])
            out.append({"file": name, "variant": variant, "routing": routing, "M": m.lstrip("m"),
                        "down tasks' wait for h, us summed over CTAs": f"{waits[len(waits) // 2]:.0f}"})
    return out


def three_timing_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of a ``--small-compare --in-graph-all`` run: per (routing, M) and one-launch path, % of copy in one replay /
    queued / in-graph ("-" where a timing is missing)."""
    def f(r: dict[str, Any], key: str) -> str:
        return "-" if r.get(key) is None else f"{r[key]:.1f}"

    out = []
    for r in sorted(doc["results"]["rows"], key=lambda r: (r["routing"], r["m"])):
        row: dict[str, Any] = {"routing": r["routing"], "M": r["m"]}
        for path in plots.one_launch_paths(doc):
            row[path] = " / ".join(f(r, f"{path}_{k}pct_of_copy") for k in ("", "queued_", "ingraph_"))
        out.append(row)
    return out


def three_timing_sections(names: tuple[str, ...], grids: bool = True) -> list[str]:
    """Per comparison file: its header (code, copy rate, with ``grids`` the launch grids, parity) and
    :func:`three_timing_rows` (% of copy one replay / queued / in-graph), or a line saying it is not committed."""
    parts = []
    for name in names:
        doc = plots.load_moe_small(name=name)
        if not doc:
            parts.append(f"data/measurements/h200/{name}.json is not committed.\n")
            continue
        p, res = doc["provenance"], doc["results"]
        grid = (f"grids {', '.join(f'{k} {v}' for k, v in (doc['parameters'].get('grid_ctas') or {}).items())}; "
                if grids else "")
        parts.append(f"`{name}.json` (code {str(p.get('git_commit'))[:7]}; copy {res['copy_gb_per_s']:.0f} GB/s in the "
                     f"same run; {grid}parity {len(res['checks'])} checks, worst rel. error "
                     f"{_worst_rel_err(res['checks']):.2e}, all ok = {res['all_checks_ok']}), % of copy one replay / "
                     "queued / in-graph:\n\n" + markdown_table(three_timing_rows(doc)))
    return parts


def block_small_run27() -> str:
    """Run 27: the interleaved task order (27a) and the epilogue warp (27b) beside the dispatch at M = 1-2, every path
    timed three ways, two processes each; then the timelines at M = 1."""
    parts = three_timing_sections(SMALL_RUN27 + SMALL_RUN27C)
    parts += [_trace_table(name, "; for the epilogue-warp forms `last = prev. epilogue warp` has no meaning and the "
                                 "barrier time is warp 0's arrival") for name in TRACE_RUN27]
    parts.append("The down tasks' waits for h in those timelines:\n\n" + markdown_table(run27_wait_rows()))
    parts.append("Each form against x4e_r3fst at the same split, points of % of copy (min .. max over both routings and "
                 "both processes):\n\n" + markdown_table(run27_delta_rows()))
    parts.append("Run 23b's rule over the six processes of 27a and 27b (one replay; the in-graph columns compare the "
                 "same paths in-graph):\n\n" + markdown_table(run27_rule_rows()))
    parts.append("Run 23b's rule over 27c's two processes, against the dispatch it ran beside (one replay):\n\n"
                 + markdown_table(split_rule_rows(SMALL_RUN27C, ("ctasplit_x4e_r3fstd", "ctasplit_x4e_r3fstd_g4d1"),
                                                  RUN27C_DISPATCHED)))
    return "\n".join(parts)


SMALL_RUN28 = ("moe_small_phased", "moe_small_phased_2")        # run 28: the phased form at M = 1, 2, 4
SMALL_RUN28_HI = ("moe_small_phased_hi", "moe_small_phased_hi_2")   # ... at M = 3, 5, 8, 9, 16
SMALL_RUN28B = ("moe_small_pdl", "moe_small_pdl_2")             # run 28b: with programmatic dependent launch, M = 1-2
SMALL_RUN28B_HI = ("moe_small_pdl_hi", "moe_small_pdl_hi_2")    # ... at M = 3, 4, 5, 8, 9, 16
SMALL_RUN28C = ("moe_small_even", "moe_small_even_2")            # run 28c: gate/up warps in full rounds (reverted)
SMALL_RUN28D = ("moe_small_seq", "moe_small_seq_2")              # run 28d: one ring per warp across units (reverted)
SMALL_RUN28E = ("moe_small_dn4", "moe_small_dn4_2")              # run 28e: 4-stage rings with PDL (reverted)
RUN28_DISPATCHED = ((1, 1, "ctasplit_x4e_r3fst"), (2, 2, "ctasplit_x4e_r3fstd_g4d1"), (3, 16, "wsplit_r3_g1d1"))
RUN28_AFTER = ((1, 1, "phased_r3_pdl"), (2, 2, "phased_r3_pdl"), (3, 16, "phased_r3_pdl"))   # the dispatch since 1e009b4


def pairs_rule_rows(specs) -> list[dict[str, Any]]:
    """:func:`split_rule_rows` for each (pair of processes, candidates, dispatched ranges) of ``specs``, every row
    headed by the pair ("name, _2")."""
    return [{"processes": f"{names[0]}, _2", **r} for names, cands, disp in specs
            for r in split_rule_rows(names, cands, disp)]


def run28_rule_rows() -> list[dict[str, Any]]:
    """Run 23b's rule for run 28: each pair of processes against the dispatch of the time (at M = 2 the pdl processes
    timed x4e_r3fst at (4, 2), not the dispatched x4e_r3fstd at (4, 1): the phased processes compare with that), and
    phased_r3_pdl against phased_r3."""
    return pairs_rule_rows((
            (SMALL_RUN28, ("phased_r3", "phased_r4"), RUN28_DISPATCHED[:2] + ((4, 4, "wsplit_r3_g1d1"),)),
            (SMALL_RUN28_HI, ("phased_r3",), RUN28_DISPATCHED[2:]),
            (SMALL_RUN28B, ("phased_r3", "phased_r3_pdl"), ((1, 2, "ctasplit_x4e_r3fst"),)),
            (SMALL_RUN28B_HI, ("phased_r3", "phased_r3_pdl"), RUN28_DISPATCHED[2:]),
            (SMALL_RUN28B, ("phased_r3_pdl",), ((1, 2, "phased_r3"),)),
            (SMALL_RUN28B_HI, ("phased_r3_pdl",), ((3, 16, "phased_r3"),)),
            (SMALL_RUN28C, ("phased_r3_pdl_even",), RUN28_AFTER),
            (SMALL_RUN28D, ("phased_r3_pdl_seq",), RUN28_AFTER),
            (SMALL_RUN28E, ("phased_r3_pdl_dn4", "phased_r4_pdl"), RUN28_AFTER[:2] + ((4, 16, "phased_r3_pdl"),))))


def breakdown_sections(names: tuple[str, ...], lead: str, inside: str = "", tail: str = "") -> list[str]:
    """Per committed file of ``names`` (workbench.moe.phased's breakdowns): "``lead`` (`name.json`, code <sha>``inside``),
    us per call, one replay / in-graph``tail``:" and its table (:func:`workbench.moe.phased.table_rows`)."""
    from workbench.measure import load_measurement
    from workbench.moe.phased import table_rows

    parts = []
    for name in names:
        bd = load_measurement(name)
        if bd:
            parts.append(f"{lead} (`{name}.json`, code {str(bd['provenance'].get('git_commit'))[:7]}{inside}), us per "
                         f"call, one replay / in-graph{tail}:\n\n" + markdown_table(table_rows(bd["results"])))
    return parts


def block_small_run28() -> str:
    """Run 28: the phased form (two launches) and its PDL variant beside the dispatch, every path timed three ways, two
    processes per M range; where a call's time goes (moe_phased_breakdown.json); the rule."""
    parts = three_timing_sections(SMALL_RUN28 + SMALL_RUN28_HI + SMALL_RUN28B + SMALL_RUN28B_HI + SMALL_RUN28C
                                  + SMALL_RUN28D + SMALL_RUN28E, grids=False)
    parts += breakdown_sections(("moe_phased_breakdown", "moe_phased_breakdown_seq", "moe_phased_breakdown_dn4"),
                                "Each launch alone and both", "; `python -m workbench.moe.phased`",
                                "; `both - parts`: both launches minus the two alone (negative: a part alone pays a "
                                "launch and a ramp that both together hide, or, with PDL, the two overlap)")
    parts.append("Run 23b's rule (one replay), per pair of processes:\n\n" + markdown_table(run28_rule_rows()))
    return "\n".join(parts)


SMALL_RUN29 = ("moe_small_c2", "moe_small_c2_2")    # run 29: the down launch as two-CTA clusters (reverted)
SMALL_RUN29B = ("moe_small_g6", "moe_small_g6_2")   # run 29b: launch bounds 6 (gate/up) and 5 (down) (reverted)
SMALL_RUN29E = ("moe_small_cm", "moe_small_cm_2")   # run 29e: the correction mma (reverted)
SMALL_RUN29F = ("moe_small_k4", "moe_small_k4_2")   # run 29f: the K-split gate/up (dispatched at M = 2)
REPEAT_SWEEP = "moe_bandwidth_repeat"               # the full sweep again at unchanged dispatched SASS (run 29d)
PROFILE_RUN29G = "data/measurements/h200/moe_profile_baf7548"   # per-instruction counters of the pair at M = 1
NCU_RUN29 = tuple(f"data/measurements/h200/moe_phased_ncu_m{m}_7c79a85.txt" for m in (1, 2, 16))
RUN29_DISPATCHED = ((1, 1, "phased_r3_pdl"), (2, 2, "phased_r3_pdl"), (4, 16, "phased_r3_pdl"))


def run29_rule_rows() -> list[dict[str, Any]]:
    """Run 23b's rule for run 29's candidates against the dispatched phased_r3_pdl, per pair of processes."""
    return pairs_rule_rows(((SMALL_RUN29, ("phased_r3_pdl_c2",), RUN29_DISPATCHED),
                            (SMALL_RUN29B, ("phased_r3_pdl_g6", "phased_r3_pdl_g6d5"), RUN29_DISPATCHED),
                            (SMALL_RUN29E, ("phased_r3_pdl_cm",), RUN29_DISPATCHED),
                            (SMALL_RUN29F, ("phased_r3_pdl_k4",), RUN29_DISPATCHED[:2] + ((3, 16, "phased_r3_pdl"),))))


def block_small_run29() -> str:
    """Run 29: what bounds the down launch (the tile-balance probe, Nsight Compute of the dispatched pair), then the
    two-CTA-cluster down launch (29) and the launch-bounds pairs (29b) beside the dispatch, with the rule."""
    parts = breakdown_sections(("moe_phased_balance",), "The tile-balance probe",
                               "; `python -m workbench.moe.phased --hidden 7168 8448 --routings uniform`; H = 8448 "
                               "puts 4 down CTAs on every SM, H = 7168 4 on 52 SMs and 3 on 80")
    if any((REPO_ROOT / f).exists() for f in NCU_RUN29):
        parts.append("Nsight Compute of the dispatched pair (`--clock-control none`, uniform routing, each kernel "
                     "alone; `MS=\"1 2 16\" RACE=0 bash workbench/moe/h200_ncu_m1.sh`):\n\n"
                     + markdown_table(ncu_balance_rows(NCU_RUN29))
                     + "\n\nIssue rate and stalls (cycles per issued instruction):\n\n"
                     + markdown_table(ncu_m1_rows(NCU_RUN29)))
    for name, what in (("moe_phased_builds", "29c"), ("moe_phased_builds_split", "29d")):
        parts += breakdown_sections((name,), f"Run {what}: the pair in diagnostic builds",
                                    "; `python -m workbench.moe.phased --builds ...`; noact: no activation loads; "
                                    "nomath_frag: frag_gemm's math one add; nomma_frag: the dequantisation kept, the "
                                    "mma one add; nodeq_frag: the mma on the raw words; outputs wrong by design")
    parts += three_timing_sections(SMALL_RUN29 + SMALL_RUN29B + SMALL_RUN29E + SMALL_RUN29F, grids=False)
    parts += breakdown_sections(("moe_phased_breakdown_c2", "moe_phased_breakdown_g6", "moe_phased_breakdown_cm",
                                 "moe_phased_breakdown_k4"),
                                "Each launch alone and both")
    parts.append("Run 23b's rule (one replay) against the dispatched phased_r3_pdl, per pair of processes:\n\n"
                 + markdown_table(run29_rule_rows()))
    parts += run29g_sections()
    return "\n".join(parts)


RULE_LEAD = "Run 23b's rule (one replay) against the dispatched path of each M, per pair of processes"


def candidate_run_sections(processes: tuple[str, ...], breakdowns: tuple[str, ...], rule: list[dict[str, Any]],
                           rule_lead: str = RULE_LEAD) -> list[str]:
    """The sections of a candidate run (runs 30-33): every path of the comparison files ``processes`` timed three
    ways, each launch alone and both from the breakdown files ``breakdowns``, then run 23b's ``rule`` rows under
    ``rule_lead``."""
    parts = three_timing_sections(processes, grids=False)
    parts += breakdown_sections(breakdowns, "Each launch alone and both")
    parts.append(f"{rule_lead}:\n\n" + markdown_table(rule))
    return parts


SMALL_RUN30 = ("moe_small_pf", "moe_small_pf_2")   # run 30: L2 prefetches of the down weights (reverted)
SMALL_RUN30B = ("moe_small_ei", "moe_small_ei_2")   # run 30b: early issue before the gate/up prologue (reverted)
RUN30_DISPATCHED = ((1, 1, "phased_r3_pdl"), (2, 2, "phased_r3_pdl_k4"), (4, 16, "phased_r3_pdl"))


def run30_rule_rows() -> list[dict[str, Any]]:
    """Run 23b's rule for run 30's L2-prefetch pairs and run 30b's early-issue pairs against the dispatched path of
    each M (phased_r3_pdl, at M = 2 phased_r3_pdl_k4), per pair of processes."""
    return pairs_rule_rows(((SMALL_RUN30, ("phased_r3_pdl_pfg", "phased_r3_pdl_pfd", "phased_r3_pdl_pfgd",
                                           "phased_r3_pdl_k4_pfgd"), RUN30_DISPATCHED),
                            (SMALL_RUN30B, ("phased_r3_pdl_ei", "phased_r3_pdl_k4_ei"),
                             RUN30_DISPATCHED[:2] + ((4, 4, "phased_r3_pdl"),))))


def block_small_run30() -> str:
    """Run 30: the L2-prefetch pairs (pfg, pfd, pfgd, k4_pfgd) and run 30b's early-issue pairs (ei, k4_ei) beside the
    dispatch, every path timed three ways, two processes each; each launch alone and both; run 23b's rule against the
    dispatched path of each M."""
    return "\n".join(candidate_run_sections(SMALL_RUN30 + SMALL_RUN30B,
                                            ("moe_phased_breakdown_pf", "moe_phased_breakdown_ei"), run30_rule_rows()))


SMALL_RUN31 = ("moe_small_fo", "moe_small_fo_2")   # run 31: the dequantisation's -136 folded into one mma (reverted)
PROFILE_RUN31 = "data/measurements/h200/moe_profile_fo_d11ae6f"   # Nsight of the default and folded down kernels


def run31_rule_rows() -> list[dict[str, Any]]:
    """Run 23b's rule for run 31's folded pairs against the dispatched path of each M, per pair of processes."""
    return pairs_rule_rows(((SMALL_RUN31, ("phased_r3_pdl_fd", "phased_r3_pdl_fgd", "phased_r3_pdl_fg",
                                           "phased_r3_pdl_k4_fd"), RUN30_DISPATCHED),))


def block_small_run31() -> str:
    """Run 31: the folded pairs (fd, fgd, fg, k4_fd) beside the dispatch, every path timed three ways, two processes;
    each launch alone and both at M = 1 and 16; run 23b's rule against the dispatched path of each M."""
    parts = candidate_run_sections(SMALL_RUN31, ("moe_phased_breakdown_fo",), run31_rule_rows())
    for build, what in (("phased_r3_pdl", "default"), ("phased_r3_pdl_fd", "folded")):
        path = f"{PROFILE_RUN31}/sass_{build}_dn_m1.csv"
        if (REPO_ROOT / path).exists():
            hot, _ = ncu_sass_rows(path, top=6)
            parts.append(f"Nsight Compute, the {what} down kernel at M = 1 (`{build}`; one call with d11ae6f checked "
                         "out: `SPECS=\"phased_r3_pdl:1 phased_r3_pdl_fd:1\" PARTS=dn bash "
                         "workbench/moe/h200_profile_dispatched.sh`), the instructions with the most warp-stall "
                         "samples:\n\n" + markdown_table(hot))
    return "\n".join(parts)


SMALL_RUN32 = ("moe_small_ks", "moe_small_ks_2")     # run 32: the K-span gate/up form, ks6 / ks7 (reverted)
SMALL_RUN32B = ("moe_small_ksa", "moe_small_ksa_2")  # run 32b: ks6a, its stage-aligned split (reverted)
PROFILE_RUN32 = "data/measurements/h200/moe_profile_ks_16f99f9"   # Nsight of the three gate/up kernels at M = 1
PROFILE_RUN32_KERNELS = ("phased_r3_pdl", "phased_r3_pdl_ks6", "phased_r3_pdl_ks6a")


def run32_rule_rows() -> list[dict[str, Any]]:
    """Run 23b's rule for run 32's K-span pairs (ks6, ks7) and run 32b's (ks6, ks6a) against the dispatched path of
    each M, per pair of processes."""
    return pairs_rule_rows(((SMALL_RUN32, ("phased_r3_pdl_ks6", "phased_r3_pdl_ks7"), RUN30_DISPATCHED),
                            (SMALL_RUN32B, ("phased_r3_pdl_ks6", "phased_r3_pdl_ks6a"), RUN30_DISPATCHED)))


def block_small_run32() -> str:
    """Run 32: the K-span gate/up pairs beside the dispatch, every path timed three ways, two processes per run; each
    launch alone and both at M = 1 (and 2); run 23b's rule; Nsight of the three gate/up kernels at M = 1."""
    parts = candidate_run_sections(SMALL_RUN32 + SMALL_RUN32B, ("moe_phased_breakdown_ks", "moe_phased_breakdown_ksa"),
                                   run32_rule_rows())
    folder = REPO_ROOT / PROFILE_RUN32
    if not folder.exists():
        return "\n".join(parts + [f"{PROFILE_RUN32}/ is not committed.\n"])
    summary = [ncu_summary_row((folder / f"summary_{v}_m1.txt").read_text(), v, 1,
                               ("grid", "registers", "duration us", "DRAM % of peak", "L2 hit %",
                                "issued per scheduler-cycle", "active warps per SM"))
               for v in PROFILE_RUN32_KERNELS]
    parts.append("Nsight Compute, the gate/up kernel of each pair at M = 1, one launch each in one call (code 16f99f9; "
                 "`SPECS=\"phased_r3_pdl:1 phased_r3_pdl_ks6:1 phased_r3_pdl_ks6a:1\" PARTS=gu EXTRA_SECTIONS="
                 "\"--section MemoryWorkloadAnalysis --section LaunchStats\" bash "
                 "workbench/moe/h200_profile_dispatched.sh`; clocks not locked):\n\n" + markdown_table(summary))
    for v in PROFILE_RUN32_KERNELS:
        hot, _ = ncu_sass_rows(f"{PROFILE_RUN32}/sass_{v}_m1.csv", top=5)
        parts.append(f"`{v}`'s gate/up kernel at M = 1, the instructions with the most warp-stall samples:\n\n"
                     + markdown_table(hot))
    return "\n".join(parts)


SMALL_RUN33 = ("moe_small_r2", "moe_small_r2_2")   # run 33: two-stage rings (dispatched at M = 1 and 3-16)


def run33_rule_rows() -> list[dict[str, Any]]:
    """Run 23b's rule for run 33's two-stage-ring pairs against the path dispatched before it, per pair of
    processes."""
    return pairs_rule_rows(((SMALL_RUN33, ("phased_r2_pdl", "phased_r3_pdl_dn2", "phased_r3_pdl_gu2"),
                             RUN30_DISPATCHED),))


def block_small_run33() -> str:
    """Run 33: the two-stage-ring pairs (r2, dn2, gu2) beside the dispatch of the time, every path timed three ways,
    two processes; each launch alone and both at M = 1 and 16; run 23b's rule."""
    return "\n".join(candidate_run_sections(SMALL_RUN33, ("moe_phased_breakdown_r2",), run33_rule_rows(),
                                            "Run 23b's rule (one replay) against the path dispatched before run 33, "
                                            "per pair of processes"))


def run29g_sections() -> list[str]:
    """Run 29g: per-SASS-instruction Nsight counters of the dispatched pair at M = 1 (PROFILE_RUN29G): each kernel's
    stage loop (sass.stage_loop_costs) and its instructions with the most warp-stall samples (ncu_sass_rows)."""
    from workbench.moe.sass import stage_loop_costs

    parts = []
    for part in ("gu", "dn"):
        rel = f"{PROFILE_RUN29G}/sass_phased_r3_pdl_{part}_m1.csv"
        if not (REPO_ROOT / rel).exists():
            continue
        loops = [{k: _f(v, ".3g") for k, v in r.items()} for r in stage_loop_costs(REPO_ROOT / rel)]
        hot, _ = ncu_sass_rows(rel, top=6)
        parts.append(f"Run 29g, the {'gate/up' if part == 'gu' else 'down'} kernel at M = 1 (`{rel}`; "
                     "`SPECS=\"phased_r3_pdl:1\" PARTS=\"gu dn\" bash workbench/moe/h200_profile_dispatched.sh`): its "
                     "stage loops, then the instructions with the most warp-stall samples:\n\n" + markdown_table(loops)
                     + "\n\n" + markdown_table(hot))
    return parts


SWEEPS = ("moe_bandwidth_1e009b4", REPEAT_SWEEP, "moe_bandwidth_23c6794", "moe_bandwidth_7da04dc",
          "moe_bandwidth_35e022b", "moe_bandwidth_repeat33", "moe_bandwidth", plots.CURRENT_REPEAT)
# run 28, its repeat, 29f, 30, 33, 33's repeat (same SASS), 34 (same SASS, profiler spans), 34's repeat


def sweep_repeat_rows(names: tuple[str, ...] = SWEEPS) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The full sweeps ``names`` side by side (by default :data:`SWEEPS`: run 28's, its repeat at the same dispatched
    SASS, run 29f's, run 30's, today's moe_bandwidth and its repeat at the same SASS): the goal rows of each, and per
    (routing, M <= 16) the copy rate, the one-replay and in-graph ms and % of copy of each, "a / b / ..."; ([], [])
    unless every file is committed."""
    from workbench.measure import load_measurement

    return _sweep_rows(names, [load_measurement(n) for n in names])


def _sweep_rows(names: tuple[str, ...], docs: list[dict[str, Any] | None]
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """:func:`sweep_repeat_rows` on the loaded files ``docs`` of ``names``."""
    if not all(docs):
        return [], []
    per_doc = [{r["goal"]: r for r in goal_rows(d)} for d in docs]   # by goal: newer files have more timings
    order = list(dict.fromkeys(g for rows in reversed(per_doc) for g in rows))   # the newest file's order first
    goals = []
    for g in order:
        first = next(rows[g] for rows in per_doc if g in rows)
        goals.append({"goal": g, "target": first["target"],
                      **{n: (f"{_f(rows[g]['measured (worst)'], '.3g')} ({'met' if rows[g]['met'] else 'not met'})"
                             if g in rows else "-") for n, rows in zip(names, per_doc)}})
    by = [{(r["routing"], r["m"]): r for r in d["results"]["rows"]} for d in docs]

    def col(key: str, spec: str, rows: list[dict[str, Any]]) -> str:
        return " / ".join(_f(r.get(key), spec) for r in rows)

    out = []
    for r0 in docs[0]["results"]["rows"]:
        key = (r0["routing"], r0["m"])
        if r0["m"] > 16 or any(key not in b for b in by):
            continue
        rows = [b[key] for b in by]
        out.append({"routing": key[0], "M": key[1],
                    "copy GB/s": " / ".join(f"{d['results']['copy_gb_per_s']:.0f}" for d in docs),
                    "one replay ms": col("ms_median", ".4f", rows), "in-graph ms": col("ingraph_ms_median", ".4f", rows),
                    "% of copy one replay": col("pct_of_copy", ".1f", rows),
                    "% of copy in-graph": col("ingraph_pct_of_copy", ".1f", rows)})
    return goals, out


def block_sweep_repeat() -> str:
    """The goal rows and the M <= 16 rows of the full sweeps of :data:`SWEEPS` side by side."""
    from workbench.measure import load_measurement

    docs = [load_measurement(n) for n in SWEEPS]
    goals, rows = _sweep_rows(SWEEPS, docs)
    if not goals:
        return f"one of {', '.join(f'{n}.json' for n in SWEEPS)} is not committed.\n"
    heads = "; ".join(f"`{n}.json` (code {d['provenance']['git_commit'][:7]}, {d['provenance']['date_utc']}, "
                      f"small-M table {d['parameters'].get('small_table')})" for n, d in zip(SWEEPS, docs))
    return (f"{heads}. Goal rows (worst over M <= 16, both routings):\n\n" + markdown_table(goals)
            + "\n\nPer row, in that order:\n\n" + markdown_table(rows))


IN_GRAPH_PROBES = ("moe_in_graph_probe", "moe_in_graph_probe_2")   # run 21's probe, two processes


def block_in_graph_probe() -> str:
    """Run 21's probe: the dispatched path timed five ways, one table per process."""
    return "\n".join(_in_graph_probe_table(name) for name in IN_GRAPH_PROBES)


def _in_graph_probe_table(name: str) -> str:
    doc = plots.load_moe_small(name=name)
    if not doc:
        raise FileNotFoundError(f"data/measurements/h200/{name}.json is not committed")
    res = doc["results"]
    rows = [{"M": r["m"], "path": r["path"], **{f"{lab} us": f"{r[k + 'ms_median'] * 1e3:.1f}" for lab, k in
             (("one replay", ""), ("queued", "queued_"), ("in-graph, two sets", "two_sets_"),
              ("in-graph, one set", "one_set_"), ("in-graph, two sets, sleep between", "two_sets_gap_"))},
             "% copy: queued / two sets / one set / with sleep": " / ".join(
                 f"{r[k + 'pct_of_copy']:.1f}" for k in ("queued_", "two_sets_", "one_set_", "two_sets_gap_"))}
            for r in res["rows"]]
    return (f"`{name}.json` (code {doc['provenance']['git_commit'][:7]}, uniform routing, copy "
            f"{res['copy_gb_per_s']:.0f} GB/s; the sleep after each call, {res['sleep_per_call_ms'] * 1e3:.1f} us per "
            f"call measured alone in a graph, is subtracted; in-graph output checks ok = {res['all_checks_ok']}):\n\n"
            + markdown_table(rows))


def block_small_dispatch() -> str:
    """Every path SMALL_TABLE dispatches, in one process (plots.SMALL_COMPARE), and the dispatched path's worst row."""
    return _small_run_block(plots.SMALL_COMPARE) + "\n" + dispatch_summary()


def block_stage_loops() -> str:
    """The stage loops of the profiled kernels, from the SASS in their ncu source pages (plots.stage_loop_rows)."""
    rows = [{**r, "kernel": f"`{r['kernel']}`", "file": f"`{r['file']}`", "activation load": f"`{r['activation load']}`"}
            for r in plots.stage_loop_rows()]
    for r in rows:
        del r["M"]
    return ("Stage loops (a backward branch around 16 HMMA, one 2304-byte stage) of the kernels as the device's NVRTC "
            "built them, from the SASS in their Nsight Compute source pages (`workbench.moe.sass.stage_loops`; "
            "positions count instructions from the loop's top; `.CONSTANT` loads read the layer input (gate/up), "
            "`.STRONG.GPU` loads read h of the same launch (down)):\n\n" + markdown_table(rows))


def block_profile_dispatched() -> str:
    """Per-instruction stall samples of the dispatched one-launch kernels (h200_profile_dispatched.sh)."""
    folder = REPO_ROOT / PROFILE_DISPATCHED
    if not folder.exists():
        return f"{PROFILE_DISPATCHED}/ is not committed.\n"
    parts, summary = [], []
    for variant, m in PROFILE_SPECS:
        csv_path = f"{PROFILE_DISPATCHED}/sass_{variant}_m{m}.csv"
        summary.append(ncu_summary_row((folder / f"summary_{variant}_m{m}.txt").read_text(), variant, m,
                                       ("duration us", "DRAM % of peak", "issued per scheduler-cycle",
                                        "achieved occupancy %")))
        hot, conflicts = ncu_sass_rows(csv_path, top=6)
        parts.append(f"`{variant}` at M = {m} (`{csv_path.split('/')[-1]}`), the instructions with the most "
                     "warp-stall samples:\n\n" + markdown_table(hot)
                     + ("\nExcess shared-memory wavefronts:\n\n" + markdown_table(conflicts) if conflicts else ""))
    return ("Summary sections (`summary_<kernel>_m<M>.txt`, a second profiled launch):\n\n" + markdown_table(summary)
            + "\n" + "\n".join(parts))


def block_ncu_m16_sass() -> str:
    """Where splitk_s4 waits at M = 16, instruction by instruction, and which instruction has the bank conflicts."""
    if not (REPO_ROOT / NCU_M16_SASS).exists():
        return f"{NCU_M16_SASS} is not committed.\n"
    hot, conflicts = ncu_sass_rows()
    return (f"Per SASS instruction (`{NCU_M16_SASS}`; the kernel as NVRTC built it on the device), the instructions "
            "with the most warp-stall samples:\n\n" + markdown_table(hot)
            + "\n\nInstructions with excessive shared-memory wavefronts (more than 1% of their own and 10^4):\n\n"
            + markdown_table(conflicts))


def block_ncu_m1() -> str:
    rows = ncu_m1_rows()
    if not rows:
        return "No M = 1 Nsight Compute file is committed.\n"
    return ("Nsight Compute at M = 1 (uniform; `--clock-control none`, so durations compare with the sweeps; "
            "`python -m workbench.moe.bench --single 1 --small ...`, the last of two calls of each kernel): "
            + ", ".join(f"`{p}`" for p in NCU_M1_FILES if (REPO_ROOT / p).exists())
            + ". Stalls in cycles per issued instruction.\n\n" + markdown_table(rows))


def block_small_splitk() -> str:
    """Run 6 (the split-K forms): every path in one process, % of copy per path, the fastest and today's
    dispatch where this run timed it."""
    return _small_run_block(SMALL_SPLITK)


_NCU_KEYS = ("Duration", "SM Frequency", "DRAM Throughput", "L2 Cache Throughput", "Compute (SM) Throughput",
             "Warp Cycles Per Issued Instruction", "Achieved Occupancy", "dram__bytes_read.sum")


def ncu_rows(path: str = NCU_FILE) -> list[dict[str, Any]]:
    """Key metrics per kernel from an Nsight Compute text report (the last launch of each kernel name)."""
    rows = []
    for kernel, (grid, mt) in _ncu_launches(path).items():
        row = {"kernel": kernel, "grid": grid}
        for key, (unit, val) in mt.items():
            if key not in _NCU_KEYS:
                continue
            scale = {"us": 1e-3, "ms": 1.0, "Mbyte": 1e-3, "Gbyte": 1.0}.get(unit)
            if scale is not None:   # durations in ms, bytes in GB
                val, unit = val * scale, "ms" if unit.endswith("s") else "GB"
            row[key + (f" ({unit})" if unit else "")] = f"{val:.3g}"
        rows.append(row)
    return rows


def block_ncu() -> str:
    rows = ncu_rows()
    if not rows:
        return f"{NCU_FILE} is not committed.\n"
    return (f"From `{NCU_FILE}` (Nsight Compute, M = 16 uniform, `python -m workbench.moe.bench --single 16 "
            f"--small --variants 1,2,0,2,1`; ncu locks the SM clock, so durations are longer than in the sweep; "
            f"the last of two calls of each kernel).\n\n" + markdown_table(rows))


BLOCKS: dict[str, Callable[[], str]] = {
    "provenance": block_provenance,
    "goals": block_goals,
    "floor": block_floor,
    "summary": block_summary,
    "checks": block_checks,
    "anchors": block_anchors,
    "runs": block_runs,
    "small": block_small,
    "small_v3": block_small_v3,
    "small_splitk": block_small_splitk,
    "small_tma": block_small_tma,
    "small_s4f": block_small_s4f,
    "small_s4g": block_small_s4g,
    "small_ctasplit": block_small_ctasplit,
    "small_ctasplit_sb": block_small_ctasplit_sb,
    "ncu_m16": block_ncu_m16,
    "small_xprefetch": block_small_xprefetch,
    "small_x4_splits": block_small_x4_splits,
    "small_x4_b4": block_small_x4_b4,
    "small_xend": block_small_xend,
    "small_xend_splits": block_small_xend_splits,
    "small_f16": block_small_f16,
    "small_m34": block_small_m34,
    "small_xs": block_small_xs,
    "small_r3": block_small_r3,
    "small_r3f": block_small_r3f,
    "small_dispatch": block_small_dispatch,
    "small_timings": block_small_timings,
    "call_time_split": block_call_time_split,
    "in_graph_probe": block_in_graph_probe,
    "small_r3fst": block_small_r3fst,
    "small_r3fs": block_small_r3fs,
    "profile_dispatched": block_profile_dispatched,
    "stage_loops": block_stage_loops,
    "ncu_m16_sass": block_ncu_m16_sass,
    "ctasplit_trace": block_ctasplit_trace,
    "ncu_m1": block_ncu_m1,
    "ncu": block_ncu,
    "families": block_families,
    "tuning": block_tuning,
    "small_wsplit": block_small_wsplit,
    "small_nb": block_small_nb,
    "small_run27": block_small_run27,
    "small_run28": block_small_run28,
    "small_run29": block_small_run29,
    "small_run30": block_small_run30,
    "small_run31": block_small_run31,
    "small_run32": block_small_run32,
    "small_run33": block_small_run33,
    "sweep_repeat": block_sweep_repeat,
    "stream_ceiling": ceiling_report.block_stream_ceiling,
    "stream_ring": ceiling_report.block_stream_ring,
    "diag_decomposition": ceiling_report.block_diag_decomposition,
    "clock_probe": ceiling_report.block_clock_probe,
}


def render(text: str) -> str:
    """``text`` with every generated block rewritten; unknown block names are an error."""
    return papers.render(text, BLOCKS)


def main(argv: list[str] | None = None) -> int:
    return papers.main(argv, paper=PAPER, blocks=BLOCKS, prog="python -m workbench.moe.report",
                       description=__doc__.split("\n")[0])


if __name__ == "__main__":
    sys.exit(main())
