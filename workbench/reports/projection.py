"""Generated tables of papers/b300_projection.md.

Every number in the paper's tables comes from here: the anchors
(data/anchors/), the assumptions (data/anchors/projection_assumptions.json,
data/hardware.json), the model config and the measurement files
(data/measurements/h200/). The paper holds blocks between
``<!-- BEGIN GENERATED: name -->`` and ``<!-- END GENERATED: name -->``;
regenerate them with

    python -m workbench.reports.projection            # rewrite papers/b300_projection.md in place
    python -m workbench.reports.projection --check    # exit 1 if the paper is stale
"""
from __future__ import annotations

import sys
from typing import Callable

from workbench import REPO_ROOT
from workbench.decode import DEFAULT
from workbench.hardware import gpu_table
from workbench.projection.calibration import load_calibration
from workbench.projection.figures import breakdown_by_gpu
from workbench.projection.model import TERMS, TERM_NAMES, default_model, load_assumptions
from workbench.projection.overhead import EXCESS_EXPONENT
from workbench.projection.project import project
from workbench.projection.scenarios import (engine_step_comparison, overhead_comparison, overhead_projections,
                                            overhead_reading, plateau_check, pro6000_cross_check, scenario_rows,
                                            source_moe_percent, source_scenarios, source_step_arithmetic,
                                            structural_whatifs)
from workbench.reports import papers
from workbench.reports.papers import markdown_table

PAPER = REPO_ROOT / "papers" / "b300_projection.md"
_BLOCK = papers.BLOCK
__all__ = ["BLOCKS", "PAPER", "main", "markdown_table", "render"]


def _scenarios(use_measurements: bool) -> str:
    cal = load_calibration(use_measurements=use_measurements)
    if use_measurements and not cal.files:
        return ("No H200 measurement file of this workbench (moe_bandwidth, ddtree_kernels, engine_step) is "
                "committed yet, so the recalibrated table equals the anchors-only one above.\n")
    rows = scenario_rows(source_scenarios(cal))
    head = ""
    if use_measurements:
        head = f"Calibrated from: {'; '.join(cal.files)}. MoE: {cal.moe_source}.\n\n"
        if cal.notes:
            head += "Notes: " + " ".join(cal.notes) + "\n\n"
    short = [{k: v for k, v in r.items() if k != "why they differ"} for r in rows]
    reasons = "\n".join(f"- **{r['scenario']}**: {r['why they differ']}" for r in rows)
    return head + markdown_table(short) + "\n" + reasons + "\n"


def block_scenarios() -> str:
    return _scenarios(False)


def block_scenarios_measured() -> str:
    return _scenarios(True)


def block_measured_findings() -> str:
    """Sentences generated from the measured calibration: what the H200 files change."""
    cal = load_calibration(use_measurements=True)
    if not cal.files:
        return "No H200 measurement is committed yet.\n"
    src = load_calibration(use_measurements=False)
    out = []
    r = project("b300", DEFAULT.block, DEFAULT.budget, (12, 16), calibration=cal)
    c = r.breakdown["central"]
    top = max(c, key=c.get)
    out.append(f"- With this workbench's H200 measurements, the B300 block-16 / budget-32 step is "
               f"{r.step_ms['central']:.2f} ms ({r.tokens_per_s[0]['central']:.0f}-{r.tokens_per_s[-1]['central']:.0f} "
               f"tok/s at accepted 12-16); its largest term is `{top}` ({c[top]:.2f} ms).")
    if cal.moe_measured:
        m9, m33 = cal.moe_fraction(9, {}), cal.moe_fraction(33, {})
        s9, s33 = src.moe_fraction(9, {}), src.moe_fraction(33, {})
        out.append(f"- MoE: this workbench's INT4 kernel reaches {m9:.0%} / {m33:.0%} of the copy bandwidth at "
                   f"M = 9 / 33 ({cal.moe_file}" + (f"; M <= 16: the path dispatched today, {cal.moe_small_file}"
                                                    if cal.moe_small_file else "") + "); the source's Marlin times on the PRO 6000 correspond to "
                   f"{s9:.0%} / {s33:.0%} (same byte count, central copy fraction). "
                   + ("The workbench kernel is the slower of the two at both sizes, so its MoE term is larger."
                      if m9 < s9 and m33 < s33 else
                      "The workbench kernel is the slower of the two at M = 33 (the block-16 step's M on this model "
                      "is 33 tokens) and not at M = 9." if m33 < s33 else
                      "The workbench kernel is at least as efficient at decode sizes."))
    if cal.attention_fit is not None:
        fixed, eff = cal.attention_fit
        share = c["attention"] / r.step_ms["central"]
        fixed_step = fixed * default_layers()
        if fixed_step / r.step_ms["central"] > 0.25:
            verdict = ("A per-call cost of that size, which does not shrink with the prefix, is the first thing to "
                       "fix before this kernel serves an engine.")
        elif fixed_step > 1.0:
            verdict = ("That per-call cost does not shrink with the prefix or with more bandwidth, so it weighs "
                       "more on faster GPUs.")
        else:
            verdict = ""
        out.append(f"- Verify attention: the fit over {cal.attention_file} gives a fixed {fixed * 1e3:.0f} us per "
                   f"call plus the floor at {eff:.0%} efficiency; over {default_layers()} layers that fixed part "
                   f"alone is {fixed_step:.2f} ms per step, and attention is {share:.0%} of the B300 step at a 1k "
                   f"context. " + verdict)
    if cal.tree_build_measured:
        g = cal.gpu_tree_build_ms({}, 32)
        cpu = cal.cpu_tree_us_per_node_measured
        txt = f"- Tree build at budget 32: {g * 1e3:.1f} us on the GPU (a batch-64 launch)"
        if cpu is not None:
            txt += f", {cpu * 32:.0f} us per request for the CPU heap reference ({cpu:.2f} us per node)"
        out.append(txt + ": either is small next to the host overhead at C=1, as the source's own "
                         "'470x faster, 1-2% end to end' found.")
    return "\n".join(out) + "\n"


def default_layers() -> int:
    return default_model().num_hidden_layers


def block_source_arithmetic() -> str:
    a = source_step_arithmetic()
    rows = [{"quantity": "bandwidth ratio B300 / PRO 6000 (datasheet)", "value": f"{a['bandwidth_ratio']:.2f}"},
            {"quantity": "B300 step at the anchor (4.4 / 303 tok/s)", "value": f"{a['anchor_step_ms']:.2f} ms"},
            {"quantity": "MoE at M=9 on B300 (1.18 ms/layer x MoE layers / TP / ratio)",
             "value": f"{a['moe_m9_ms']:.2f} ms"},
            {"quantity": "step - MoE (the source's 'overhead')", "value": f"{a['lumped_overhead_ms']:.2f} ms "
                                                                          f"(source: ~{a['source_overhead_ms']:g})"},
            {"quantity": "MoE at M=32 on B300", "value": f"{a['moe_m32_ms']:.2f} ms"},
            {"quantity": "overhead + MoE at M=32 (no draft growth)",
             "value": f"{a['strong_step_without_draft_ms']:.2f} ms"}]
    moe = [{"M": r["m"], "ms/layer (source)": r["ms_per_layer"], "experts touched E(M)": f"{r['experts']:.1f}",
            "INT4 payload GB": f"{r['payload_bytes'] / 1e9:.3f}", "payload % of 1.8 TB/s": f"{r['payload_pct_of_1_8']:.1f}",
            "with bf16 scales GB": f"{r['bytes_with_scales'] / 1e9:.3f}",
            "with scales % of 1.79 TB/s": f"{r['with_scales_pct_of_datasheet']:.1f}"} for r in source_moe_percent()]
    plateau = [{"GPU": r["gpu"], "M": r["m"], "experts touched": f"{r['experts']:.1f}",
                "GB/layer": f"{r['bytes'] / 1e9:.2f}", "byte time ms": f"{r['byte_ms']:.2f}",
                "flop time ms": f"{r['flop_ms']:.2f}",
                "bound": "bandwidth" if r["byte_ms"] > r["flop_ms"] else "compute",
                "source ms": "~" + format(r["source_ms"], "g") if r["source_ms"] else "-"} for r in plateau_check()]
    x = pro6000_cross_check()
    cross = [{"check": f"8x RTX PRO 6000, block 8, budget 8, accepted {x['accept']:g}",
              "model": f"{x['low']:.0f}-{x['central']:.0f}-{x['high']:.0f} tok/s (low-central-high), step "
                       f"{x['step_ms']:.1f} ms ({x['step_low_ms']:.1f}-{x['step_high_ms']:.1f})",
              "source": f"{x['measured_tokens_per_s']:g} tok/s (accepted length not stated); verify forward "
                        f"{x['source_verify_ms']:g} ms at a 13-token context",
              "reading": f"138.7 tok/s at the model's central step means accepted {x['implied_accept']:.1f}"}]
    return (markdown_table(rows) + "\n" + markdown_table(moe) + "\n" + markdown_table(plateau) + "\n"
            + markdown_table(cross))


def block_breakdown() -> str:
    items = breakdown_by_gpu(use_measurements=False)
    rows = []
    for label, r in items:
        c = r.breakdown["central"]
        step = r.step_ms["central"]
        row = {"GPU, config": label.replace("<br>", ", ")}
        row.update({n: f"{c[n]:.2f}" for n in TERM_NAMES})
        row["step ms"] = f"{step:.2f}"
        row["MoE %"] = f"{c['moe'] / step * 100:.0f}"
        row["host %"] = f"{(c['overhead'] + c['tree_build']) / step * 100:.0f}"
        row["tok/s (low-central-high)"] = (f"{r.tokens_per_s[0]['low']:.0f}-{r.tokens_per_s[0]['central']:.0f}-"
                                           f"{r.tokens_per_s[0]['high']:.0f}")
        rows.append(row)
    return markdown_table(rows)


def block_sensitivity() -> str:
    r = project("b300", DEFAULT.block, DEFAULT.budget, (12, 16), use_measurements=False)
    rows = [{"quantity": s["quantity"], "kind": s["kind"], "range": f"{s['low']:g} .. {s['high']:g}",
             "step ms at ends": f"{s['step_ms_at_low']:.2f} / {s['step_ms_at_high']:.2f}",
             "swing ms": f"{s['swing_ms']:.2f}"} for s in r.sensitivity[:10]]
    return (f"B300, block 16, budget 32, anchors only; central step {r.step_ms['central']:.2f} ms.\n\n"
            + markdown_table(rows))


def block_structural() -> str:
    rows = structural_whatifs(use_measurements=False)
    return ("B300, block 16, budget 32, accepted 12-16, anchors only; each row changes one structural "
            "assumption.\n\n" + markdown_table(rows))


def block_engine_step() -> str:
    cal = load_calibration(use_measurements=True)
    rows = engine_step_comparison(cal)
    if rows is None:
        return "data/measurements/h200/engine_step.json is not committed yet.\n"
    p = cal.engine_step.get("parameters", {})
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    table = markdown_table([{k: (fmt(v) if k.endswith("ms") else v) for k, v in r.items()} for r in rows])
    prov = cal.engine_step.get("provenance", {})
    return (f"Step: {p.get('layers')} layers, {p.get('experts')} experts, prefix {p.get('prefix')}, block "
            f"{p.get('block')}, budget {p.get('budget')}, DDTree at C=1 as a CUDA-graph replay "
            f"(data/measurements/h200/engine_step.json, measured at {prov.get('git_commit', '?')}).\n\n" + table)


def block_measured_overhead() -> str:
    """The overhead term measured from the H200 engine step beside the source's ~12.5 ms, the B300
    projection with each overhead, and which term dominates."""
    cal = load_calibration(use_measurements=True)
    if cal.engine_step is None:
        return "data/measurements/h200/engine_step.json is not committed yet.\n"
    items = overhead_projections(cal)
    rows = []
    for mode, r in items:
        c = r.breakdown["central"]
        row = {"overhead mode": mode}
        row.update({n: f"{c[n]:.2f}" for n in TERM_NAMES})
        row["step ms (range)"] = f"{r.step_ms['central']:.2f} ({r.step_ms['high']:.2f}-{r.step_ms['low']:.2f})"
        row["tok/s at 12 / 16 (central)"] = " / ".join(f"{t['central']:.0f}" for t in r.tokens_per_s)
        row["tok/s range"] = f"{r.tokens_per_s[0]['low']:.0f}-{r.tokens_per_s[-1]['high']:.0f}"
        rows.append(row)
    return (markdown_table(overhead_comparison(cal)) + "\n"
            + "B300, block 16, budget 32, TP 8, context 1024, accepted 12-16, this workbench's calibration; in the "
              "measured row MoE, dense and attention are their floors (the measured overhead holds the kernels' time "
              f"beyond them). Kernels-below-floor exponent: {EXCESS_EXPONENT.low:g} / {EXCESS_EXPONENT.central:g} / "
              f"{EXCESS_EXPONENT.high:g} ({EXCESS_EXPONENT.source}).\n\n"
            + markdown_table(rows) + "\n" + overhead_reading(items) + "\n")


def block_assumptions() -> str:
    a = load_assumptions()
    rows = []
    for k, v in a.items():
        if k.startswith("_") or not isinstance(v, dict):
            continue
        if "low" in v:
            val = f"{v['low']:g} / {v['central']:g} / {v['high']:g}"
        elif "value" in v:
            val = str(v["value"])
        else:
            val = "-"
        rows.append({"assumption": k, "low / central / high": val, "source": v.get("source", v.get("note", ""))})
    for gid, g in gpu_table().items():
        for k, v in (g.get("projection") or {}).items():
            rows.append({"assumption": f"{gid}.{k}", "low / central / high":
                         f"{v['low']:.3g} / {v['central']:.3g} / {v['high']:.3g}", "source": v.get("source", "")})
    return markdown_table(rows)


def block_terms() -> str:
    return markdown_table([{"term": t.name, "formula": t.formula, "source": t.source, "scaling": t.scaling}
                           for t in TERMS])


def block_calibration() -> str:
    cal = load_calibration(use_measurements=True)
    rows = cal.describe()
    text = markdown_table(rows)
    if cal.engine_step is not None:
        text += ("\ndata/measurements/h200/engine_step.json is committed: its measured step is shown beside the "
                 "model in section 6 and in notebook 04; it is not fitted, and with --overhead measured its cost "
                 "beyond its floor becomes the overhead term (section 6).\n")
    files = "; ".join(cal.files) if cal.files else "none yet (anchors only)"
    return f"Measurement files read: {files}.\n\n" + text


BLOCKS: dict[str, Callable[[], str]] = {
    "terms": block_terms,
    "assumptions": block_assumptions,
    "calibration": block_calibration,
    "source-arithmetic": block_source_arithmetic,
    "scenarios": block_scenarios,
    "scenarios-measured": block_scenarios_measured,
    "measured-findings": block_measured_findings,
    "breakdown": block_breakdown,
    "sensitivity": block_sensitivity,
    "structural": block_structural,
    "engine-step": block_engine_step,
    "measured-overhead": block_measured_overhead,
}


def render(text: str) -> str:
    """``text`` with every generated block rewritten; unknown block names are an error."""
    return papers.render(text, BLOCKS)


def main(argv: list[str] | None = None) -> int:
    return papers.main(argv, paper=PAPER, blocks=BLOCKS, prog="python -m workbench.reports.projection",
                       description=__doc__.split("\n")[0])


if __name__ == "__main__":
    sys.exit(main())
