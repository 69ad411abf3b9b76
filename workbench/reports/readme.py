"""The README's generated blocks: the results table and the findings in words, from the committed data.

``python -m workbench.reports.readme`` prints both; ``--write-readme`` replaces the blocks between the
``results:begin`` / ``results:end`` and ``findings:begin`` / ``findings:end`` markers of README.md.
tests/test_reports_readme.py checks that the README's blocks equal what the files give, so no number in them
is typed by hand. The table's rows come from the areas' report code (:mod:`workbench.reports.ddtree`,
:mod:`workbench.reports.moe_plots`); a missing module raises rather than leaving a hole in the table. The
findings are short sentences, each naming its notebook, paper and data files, computed by the analyses
(:mod:`workbench.projection`, :mod:`workbench.capacity`) from ``data/measurements/h200/*.json``, the anchors and
the hardware facts; a sentence whose measurement is not committed is left out.
"""
from __future__ import annotations

import argparse
import re
from typing import Any, Callable

from workbench import REPO_ROOT
from workbench.acceptance.figures import DEFAULT_GPU as ACCEPTANCE_GPU, GOAL, goal, load_doc
from workbench.acceptance.measure import measured_rows
from workbench.capacity import SOURCE_CLAIMS, capacity
from workbench.measure import load_measurement
from workbench.projection import load_calibration, project
from workbench.projection.model import load_anchors
from workbench.projection.overhead import measured_steps
from workbench.projection.scenarios import dominant_term
from workbench.projection.speedup import scripted_speedup, trained_speedups
from workbench.reports import ddtree as ddtree_report, moe_plots as mplots, papers

README = REPO_ROOT / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
FINDINGS_BEGIN, FINDINGS_END = "<!-- findings:begin -->", "<!-- findings:end -->"
HEADLINE_CONCURRENCY = (1, 8)   # the concurrencies of the headline figure (DDTree over greedy)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def results_rows() -> list[dict[str, Any]]:
    """One row per issue goal measured on the H200: area, goal, measured, met, source file."""
    rows: list[dict[str, Any]] = [{"area": "DDTree tree kernels", **r, "file": "ddtree_kernels.json"}
                                  for r in ddtree_report.goal_rows()]
    vdoc = load_measurement("ddtree_verify")
    if vdoc:
        res = vdoc["results"]
        for g in res.get("goal", []) if isinstance(res.get("goal"), list) else []:
            rows.append({"area": "DDTree verify attention", "goal": g.get("goal"), "measured": g.get("measured"),
                         "met": g.get("met"), "file": "ddtree_verify.json"})
        if not isinstance(res.get("goal"), list):
            rows.append({"area": "DDTree verify attention", "goal": "faster than every peer at every point",
                         "measured": str(res.get("all_faster_than_peers")),
                         "met": bool(res.get("all_faster_than_peers")), "file": "ddtree_verify.json"})
            mp = res.get("min_percent_of_floor")
            rows.append({"area": "DDTree verify attention", "goal": ">= 50% of floor at every point",
                         "measured": f"min {mp:.1f}%" if isinstance(mp, (int, float)) else str(mp),
                         "met": isinstance(mp, (int, float)) and mp >= 50, "file": "ddtree_verify.json"})
    doc = mplots.load_moe_bandwidth()
    if doc:
        for r in mplots.goal_rows(doc):
            rows.append({"area": "INT4 MoE", "goal": f"{r['goal']} ({r['target']})",
                         "measured": _fmt(r["measured (worst)"]) + " (worst)", "met": r["met"],
                         "file": "moe_bandwidth.json"})
    rep = mplots.load_moe_repeat()
    if rep:   # the same sweep repeated at today's dispatch: its goal rows beside the sweep's
        for r in mplots.bandwidth_goal_rows(rep):
            rows.append({"area": "INT4 MoE", "goal": f"{r['goal']}, repeat of the sweep at the same dispatch "
                                                     f"({r['target']})",
                         "measured": _fmt(r["measured (worst)"]) + " (worst)", "met": r["met"],
                         "file": f"{mplots.CURRENT_REPEAT}.json"})
    small = mplots.load_moe_small()
    for column, what in (("dispatched span % copy", "the kernels' device time (profiler span)"),
                         ("dispatched % copy", "one graph replay per call (a lone call's latency)")):
        got = mplots.dispatched_worst_pct(small, column) if small else None
        if got:
            pct, row = got
            rows.append({"area": "INT4 MoE",
                         "goal": f"% of copy bandwidth at M <= 16, dispatched path today, {what} (>= 80)",
                         "measured": f"{pct:.1f} (worst: {row['routing']} M={row['M']}, {row['dispatched']})",
                         "met": pct >= 80, "file": f"{small['name']}.json"})
    edoc = load_measurement("engine_step")
    if edoc:
        par = edoc["parameters"]
        area = f"Engine step (K2.6 shape, {par['layers']} layers, {par['experts']} experts, prefix {par['prefix']})"
        for method in ("greedy", "ddtree"):
            r = edoc["results"].get(method)
            if r:
                rows.append({"area": area, "goal": f"{method}, C = 1, graph replay: step time vs its floor",
                             "measured": f"{r['median_ms']['total']:.2f} ms ({r['pct_of_floor']:.1f}% of floor), "
                                         f"{r['ms_per_token']:.2f} ms/token at {r['mean_accepted_length']:.2f} accepted",
                             "met": None, "file": "engine_step.json"})
        for g in edoc["results"].get("goals", []):
            rows.append({"area": area, "goal": f"{ENGINE_GOALS.get(g['goal'], g['goal'])} (>= {g['target']:g})",
                         "measured": f"{g['measured']:.1f}", "met": bool(g["met"]), "file": "engine_step.json"})
    sdoc = load_measurement("serving")
    if sdoc:
        par = sdoc["parameters"]
        area = (f"Serving (K2.6 shape, {par['layers']} layers, {par['experts']} experts, prompt {par['prompt']}, "
                f"{par['max_tokens']} tokens)")
        for g in sdoc["results"].get("goals", []):
            sign = "within" if g["unit"] == "ms" else "aggregate within"
            rows.append({"area": area, "goal": f"{g['goal']} ({sign} {100 * g['target']:g}%)",
                         "measured": f"{g['server']:.2f} vs {g['engine']:.2f} {g['unit']} ({100 * g['relative']:+.1f}%)",
                         "met": bool(g["met"]), "file": "serving.json"})
    rows += sweep_rows() + acceptance_rows()
    return rows


def sweep_rows() -> list[dict[str, Any]]:
    """The context sweep's goals from context_sweep.json: rates within 5% of accepted / step; fragmentation's cost at 64k."""
    doc = load_measurement("context_sweep")
    if not doc or doc["provenance"].get("gpu") is None:
        return []
    par, res = doc["parameters"], doc["results"]
    area = f"Context sweep (K2.6 shape, {par['layers']} layers, {par['experts']} experts, {min(par['contexts'])}-" \
           f"{max(par['contexts'])} tokens)"
    checks = [r["check_sustained"] for r in res["contexts"]]
    worst = max(checks, key=lambda c: abs(c["disagreement"]))
    two = [r["check_two_point"] for r in res["contexts"] if r.get("check_two_point")]
    two_worst = max(two, key=lambda c: abs(c["disagreement"])) if two else None
    rows = [{"area": area, "goal": "sustained tokens/s = mean accepted / mean step time within 5%, every point",
             "measured": f"{sum(c['within'] for c in checks)}/{len(checks)} points, worst "
                         f"{100 * worst['disagreement']:+.1f}%" + (
                             f" (the two-point rate: {sum(c['within'] for c in two)}/{len(two)}, worst "
                             f"{100 * two_worst['disagreement']:+.1f}%)" if two else ""),
             "met": all(c["within"] for c in checks), "file": "context_sweep.json"}]
    lay = {r["layout"]: r["attention_ms"] for r in res["layout"] if r["context"] == 65536}
    if "contiguous" in lay and "scattered" in lay:
        rel = {k: v / lay["contiguous"] - 1 for k, v in lay.items() if k != "contiguous"}
        rows.append({"area": area, "goal": "fragmentation's cost at 64k, one layer's verify attention (measured)",
                     "measured": ", ".join(f"{k} {100 * v:+.1f}%" for k, v in rel.items()) + " vs contiguous",
                     "met": None, "file": "context_sweep.json"})
    return rows


def acceptance_goals(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The drafter issue's goals per text type (:data:`workbench.acceptance.figures.GOAL`): the file's own
    ``results.goals`` (:func:`workbench.acceptance.figures.goal`), or for a file of the older layout, which has
    none, the same figures from its rows: the mean accepted length at the goal's block and budget, the depth-1
    hit rate and the tree over the chain (budget 1 in that layout), for the text types the goal names."""
    got = goal(doc)
    if got:
        return got
    at = {(r["text_type"], r["budget"]): r for r in doc["results"]["rows"] if r["block"] == GOAL["block"]}
    out = {}
    for t, target in GOAL["mean_accepted"].items():
        tree, chain = at.get((t, GOAL["budget"])), at.get((t, 1))
        if tree is None or chain is None:
            continue
        ratio, first = tree["mean_accepted"] / chain["mean_accepted"], tree["hit_spine"][0]
        out[t] = {"mean_accepted": tree["mean_accepted"], "goal": target, "met": tree["mean_accepted"] >= target,
                  "first_position_hit": first, "first_position_met": first is not None and
                  first >= GOAL["first_position_hit"], "tree_over_chain": ratio,
                  "tree_over_chain_met": ratio >= GOAL["tree_over_chain"]}
    return out


def acceptance_measurement() -> tuple[dict[str, Any] | None, str]:
    """The trained drafter's acceptance document and its file as the README names it (relative to
    data/measurements/h200/): the current layout that notebook 06 plots
    (:func:`workbench.acceptance.figures.load_doc`) where it is committed, else the H200 file of the older layout."""
    doc = load_doc()
    if doc is not None:
        return doc, f"../{ACCEPTANCE_GPU}/acceptance.json"
    return load_measurement("acceptance"), "acceptance.json"


def acceptance_rows() -> list[dict[str, Any]]:
    """The trained drafter's goals from its acceptance file (:func:`acceptance_goals`): per text type its accepted
    length, depth-1 hit rate and tree over chain at the goal's block and budget."""
    doc, file = acceptance_measurement()
    if not doc or doc["provenance"].get("gpu") is None:
        return []
    area = f"Trained drafter ({doc['results']['target']['name']})"
    at = f"block {GOAL['block']}, budget {GOAL['budget']}"
    out = []
    for t, g in acceptance_goals(doc).items():
        ci = f" [{g['ci95'][0]:.2f}, {g['ci95'][1]:.2f}]" if g.get("ci95") else ""
        first = g["first_position_hit"]
        target = "" if g["goal"] is None else f" (>= {g['goal']:g})"
        out += [{"area": area, "goal": f"{t}, {at}: mean accepted length{target}",
                 "measured": f"{g['mean_accepted']:.2f}{ci}", "met": g["met"] if target else None,
                 "file": file},
                {"area": area, "goal": f"{t}, {at}: depth-1 hit rate (>= {GOAL['first_position_hit']:g})",
                 "measured": "-" if first is None else f"{first:.2f}", "met": g["first_position_met"],
                 "file": file},
                {"area": area, "goal": f"{t}, {at}: accepted length over the chain's (>= {GOAL['tree_over_chain']:g}x)",
                 "measured": "-" if g["tree_over_chain"] is None else f"{g['tree_over_chain']:.2f}x",
                 "met": g["tree_over_chain_met"], "file": file}]
    return out


ENGINE_GOALS = {   # goal keys of bench/engine.py -> what the README says
    "greedy_pct_of_floor_c1": "greedy C = 1, % of the step's floor",
    "ddtree_pct_of_floor_c1": "DDTree C = 1, % of the step's floor",
    "graph_over_eager_tokens_per_s_c1": "greedy C = 1 tokens/s, captured step over generate()'s (same run)",
    "greedy_c8_over_c1_tokens_per_s": "greedy aggregate tokens/s, C = 8 over C = 1",
}


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The results rows as the README's markdown table."""
    met = {True: "yes", False: "**no**", None: "-"}
    return papers.markdown_table([{"area": r["area"], "goal": r["goal"], "measured on the H200": r["measured"],
                                   "met": met[r["met"]], "data/measurements/h200/": f"`{r['file']}`"}
                                  for r in rows]).rstrip("\n")


# ----------------------------------------------------------------------------- the findings in words

def _span(values: list[float], fmt: str = ".2f") -> str:
    """``lo-hi`` of ``values`` as formatted, or one value where both ends print alike."""
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


def _words(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _shape(engine: dict[str, Any]) -> str:
    """The engine step's model shape in words."""
    par = engine["parameters"]
    return f"{par['layers']} layers, {par['experts']} routed experts per layer, prefix {par['prefix']}"


def _verdict(per_c: dict[int, list[Any]]) -> str:
    """DDTree against greedy decoding in words, per concurrency: faster where every text type's ratio is above 1,
    slower where every one is below, on a par otherwise."""
    def word(ratios: list[float]) -> str:
        return "faster than" if min(ratios) > 1 else "slower than" if max(ratios) < 1 else "on a par with"

    said = {c: word([s.ratio for s in v]) for c, v in per_c.items()}
    if len(set(said.values())) == 1:
        return f"DDTree is {next(iter(said.values()))} greedy decoding on this engine"
    return "DDTree is " + " and ".join(f"{w} greedy decoding at C={c}" for c, w in said.items())


def finding_headline(engine: dict[str, Any], acceptance: dict[str, Any], file: str) -> str:
    """DDTree's tokens/s over greedy's at the trained drafter's measured acceptance, at C = 1 and C = 8
    (:func:`workbench.projection.speedup.trained_speedups`)."""
    per_c = {c: trained_speedups(engine, acceptance, c) for c in HEADLINE_CONCURRENCY}
    first = per_c[HEADLINE_CONCURRENCY[0]]
    steps = " and ".join(f"{s[0].break_even:.2f}" + (" greedy steps" if i == 0 else "") + f" at C={c} "
                         f"({s[0].ddtree.wall_ms:.2f} vs {s[0].greedy.wall_ms:.2f} ms)"
                         for i, (c, s) in enumerate(per_c.items()))
    ratios = " and ".join(f"{_span([x.ratio for x in s])}x" + (" greedy's" if i == 0 else "") + f" at C={c}"
                          for i, (c, s) in enumerate(per_c.items()))
    return (f"**With the drafter trained so far, {_verdict(per_c)}: its tokens/s are {ratios}.** At block "
            f"{first[0].block} and budget {first[0].budget} the trained drafter "
            f"({acceptance['results']['target']['name']}) accepts {_span([s.accepted for s in first])} tokens per "
            f"step on held-out {_words([s.source for s in first])} text (`{file}`, its rows at that block "
            f"and budget), while a DDTree step of the K2.6 shape ({_shape(engine)}) costs as much as {steps} "
            f"(`engine_step.json`, its graph-replay rows, fuse mode {first[0].ddtree.fuse}); DDTree pays only "
            f"above that many accepted tokens per step (notebooks 04 and 06; `papers/b300_projection.md`, section 6).")


def finding_scripted(engine: dict[str, Any]) -> str:
    """The same captured step at the scripted drafter's highest acceptance, and the lossless check."""
    s = scripted_speedup(engine, HEADLINE_CONCURRENCY[0])
    checks = engine["results"].get("lossless") or []
    same = sum(c.get("first_divergence") is None for c in checks)
    return (f"The step itself is ready for a better drafter: with a {s.source} accepting {s.accepted:.2f} tokens "
            f"per step, the same captured step decodes {s.ratio:.2f}x greedy's tokens/s at C={s.C}, and its tokens "
            f"equal greedy decoding's in " + (f"all {same}" if same == len(checks) else f"{same} of {len(checks)}")
            + " compared requests "
            f"(`engine_step.json`; notebook 04, `papers/b300_projection.md`).")


def finding_floor(engine: dict[str, Any]) -> str:
    """Why a tree step costs more: its floor (bytes it must read) against greedy's, and how close each runs to it."""
    res = engine["results"]
    g, d = res["greedy"], res["ddtree"]
    c1 = measured_steps(engine, C=HEADLINE_CONCURRENCY[0])
    c8 = measured_steps(engine, C=HEADLINE_CONCURRENCY[-1])
    experts = d["bytes_by_part"]["routed_experts"] / g["bytes_by_part"]["routed_experts"]
    return (f"A tree step costs more because it must read more: at prefix {engine['parameters']['prefix']} its "
            f"{d['tree_size']} nodes touch {experts:.1f}x greedy's routed-expert bytes, so its floor is "
            f"{d['floor_ms'] / g['floor_ms']:.2f}x greedy's ({d['floor_ms']:.2f} vs {g['floor_ms']:.2f} ms); at "
            f"C={c1['ddtree'].C} the captured DDTree "
            f"step runs at {c1['ddtree'].pct_of_floor:.0f}% of its floor and greedy's at "
            f"{c1['greedy'].pct_of_floor:.0f}%, at C={c8['ddtree'].C} at {c8['ddtree'].pct_of_floor:.0f}% and "
            f"{c8['greedy'].pct_of_floor:.0f}% (`engine_step.json`; notebook 04, `papers/b300_projection.md`, "
            f"`papers/ddtree_kernels.md`).")


def _ddtree_method(sweep: dict[str, Any]) -> str:
    """The context sweep's first DDTree method (its step time does not depend on the scripted acceptance)."""
    return next(m for m in sweep["parameters"]["methods"] if m.startswith("ddtree"))


def finding_context(sweep: dict[str, Any]) -> str:
    """A DDTree step in greedy steps over the context sweep, and the verify attention's share at about 64k."""
    rows = sweep["results"]["contexts"]
    dd = _ddtree_method(sweep)
    step = {(r["context"], r["method"]): r for r in rows}
    ctxs = sorted({r["context"] for r in rows})
    ratio = {c: step[c, dd]["mean_step_ms"] / step[c, "greedy"]["mean_step_ms"] for c in ctxs}
    shown = sorted({ctxs[0], max(ctxs, key=ratio.get), ctxs[-1]})
    near64 = min(ctxs, key=lambda c: abs(c - 65536))
    t = step[near64, dd].get("terms") or {}
    share = f" ({t['verify_attention'] / t['wall_ms']:.0%} of the step at {near64:,} tokens)" if t else ""
    greedy = [step[c, "greedy"]["mean_step_ms"] for c in ctxs]
    par = sweep["parameters"]
    return (f"Long context makes a tree step costlier still: on the K2.6 shape with {par['experts']} routed experts "
            f"a DDTree step costs " + _words([f"{ratio[c]:.2f} greedy steps at {c:,} tokens" if i == 0 else
                                              f"{ratio[c]:.2f} at {c:,}" for i, c in enumerate(shown)])
            + f", because the verify attention of its tree over the prefix turns compute-bound{share}, while "
            f"greedy's step stays within {_span(greedy, '.1f')} ms (`context_sweep.json`; notebook 03, "
            f"`papers/context_diagnosis.md`).")


def finding_rates(sweep: dict[str, Any]) -> str:
    """The sustained rate against accepted / step time, and the two-point method's overstatement."""
    rows = sweep["results"]["contexts"]
    inside = sum(r["check_sustained"]["within"] for r in rows)
    at = [r for r in rows if r["context"] in sweep["parameters"]["sustained_at"] and r["two_point"]]
    worst = max(at, key=lambda r: abs(r["two_point"] / r["sustained"] - 1))
    a, b = sweep["parameters"]["two_point"]
    return (f"Measure a rate as mean accepted length over mean step time, or sustained: the sustained rate matched "
            f"it within 5% at {inside} of {len(rows)} points, while the two-point method (max_tokens {a} and {b}) "
            f"overstated the sustained {worst['generated']:,}-token rate by "
            f"{100 * (worst['two_point'] / worst['sustained'] - 1):+.1f}% at {worst['context']:,} tokens "
            f"(`{worst['method']}`): a window of few DDTree steps misreports the rate even when nothing slows down "
            f"(`context_sweep.json`; notebook 03, `papers/context_diagnosis.md`).")


def finding_fragmentation(sweep: dict[str, Any]) -> str:
    """KV fragmentation's measured cost at about 64k, and whether its sign holds across contexts."""
    lay = sweep["results"]["layout"]
    rel = {(r["context"], r["layout"]): r["attention_ms"] for r in lay}
    ctxs = sorted({r["context"] for r in lay})
    c = min(ctxs, key=lambda x: abs(x - 65536))
    d = {k: rel[c, k] / rel[c, "contiguous"] - 1 for k in ("scattered", "compacted")}
    slower = sum(rel[x, "scattered"] > rel[x, "contiguous"] for x in ctxs)
    return (f"KV fragmentation costs nothing this engine can resolve: at {c:,} tokens one layer's verify attention "
            f"took {100 * d['scattered']:+.1f}% over scattered slots and {100 * d['compacted']:+.1f}% over compacted "
            f"ones against contiguous slots, and scattered slots were slower at only {slower} of {len(ctxs)} "
            f"contexts; the kernel gathers whole latent rows by slot (`context_sweep.json`; notebook 03, "
            f"`papers/context_diagnosis.md`).")


def finding_tree_kernels(tree: dict[str, Any], verify: dict[str, Any]) -> str:
    """The GPU tree stage's cost and the verify attention against its peers and its floor."""
    res = tree["results"]
    b = res["build_B64_L15_budget32"]
    acc = next(v for k, v in res.items() if k.startswith("accept_B64"))
    sync_free = all(x.get("no_host_sync") for k, x in res.get("round", {}).items() if k.startswith("verify_"))
    pts = verify["results"]["points"]
    return (f"The tree stage is cheap on the GPU: building {b['batch']} trees of budget {b['budget']} takes "
            f"{b['gpu_graph_ms'] * 1e3:.1f} us ({b['speedup_graph']:.0f}x the CPU heap in the same run) and accepting "
            f"them {acc['gpu_graph_ms'] * 1e3:.1f} us, inside a CUDA graph{' with no host sync' if sync_free else ''}; the "
            f"tree-verify MLA attention is {_span([p['speedup_vs_best_peer'] for p in pts], '.1f')}x faster than the "
            f"best peer but reaches {_span([p['percent_of_floor'] for p in pts], '.0f')}% of its floor "
            f"(`ddtree_kernels.json`, `ddtree_verify.json`; notebook 01, `papers/ddtree_kernels.md`).")


def finding_moe(bandwidth: dict[str, Any], small: dict[str, Any], engine: dict[str, Any]) -> str:
    """The fused INT4 MoE at decode sizes (M <= 16) and at the engine step's tree width (its MoE's M)."""
    span, _ = mplots.dispatched_worst_pct(small, "dispatched span % copy")
    lone, _ = mplots.dispatched_worst_pct(small, "dispatched % copy")
    cublas = next(r["measured (worst)"] for r in mplots.goal_rows(bandwidth) if "bf16 cuBLAS" in r["goal"])
    m = int(engine["results"]["ddtree"]["tree_size"])
    at_m = load_calibration(use_measurements=True).moe_fraction(m, {})
    return (f"The fused INT4 MoE streams its experts at {span:.0f}% or more of the copy bandwidth at M <= 16 tokens "
            f"in device time ({lone:.0f}% as a lone call's latency, host launch included) and at least "
            f"{cublas:.1f}x bf16 cuBLAS per expert, but at {at_m:.0%} at M = {m}, the engine step's tree of "
            f"budget {engine['parameters']['budget']} (`moe_small_dispatch.json`, `moe_bandwidth.json`; notebook 02, "
            f"`papers/moe_int4.md`).")


def finding_b300(acceptance: dict[str, Any] | None) -> str:
    """The B300 projection of the source's stronger-drafter scenario, with the overhead fitted on the source's anchor
    and measured on this engine, and at the trained drafter's acceptance."""
    sc = next(s for s in load_anchors()["scenarios"] if s["id"] == "strong_drafter")
    acc = tuple(float(a) for a in sc["accept"])
    runs = {mode: project(sc["gpu"], sc["block"], sc["budget"], acc, overhead=mode)
            for mode in ("source-anchor", "measured")}
    tps = {m: "-".join(f"{t['central']:.0f}" for t in r.tokens_per_s) for m, r in runs.items()}
    top, ms, share = dominant_term(runs["source-anchor"])
    trained = sorted(r["mean_accepted"] for r in measured_rows(acceptance)
                     if (r["block"], r["budget"]) == (sc["block"], sc["budget"])) if acceptance else []
    tail = ""
    if trained:
        t = project(sc["gpu"], sc["block"], sc["budget"], (trained[0], trained[-1])).tokens_per_s
        tail = f", and {_span([x['central'] for x in t], '.0f')} at the trained drafter's {_span(trained)}"
    src = "-".join(f"{v:g}" for v in sc["source_tokens_per_s"])
    base = runs["source-anchor"]
    return (f"On {base.shape.tp} x {base.gpu_name.replace('NVIDIA ', '')} at block {sc['block']} and budget "
            f"{sc['budget']}, the step model calibrated on these measurements projects {tps['source-anchor']} "
            f"tokens/s for a drafter accepting {'-'.join(f'{a:g}' for a in acc)} with the host overhead fitted on "
            f"the source's B300 anchor (the source said {src}), {tps['measured']} with the overhead measured on this "
            f"engine's H200 step{tail}; the step's largest term is `{top}` ({ms:.2f} ms, {share:.0%}) "
            f"(notebook 04, `papers/b300_projection.md`).")


def finding_capacity() -> str:
    """Whether one 200k-token request fits on 8 x RTX PRO 6000, H200 and B300 (:func:`workbench.capacity.capacity`)."""
    pro = {kv: capacity(gpu="rtx-pro-6000", kv_dtype=kv) for kv in ("bf16", "fp8")}
    bf = pro["bf16"]
    others = [capacity(gpu=g) for g in ("h200", "b300")]
    fits = "fits" if bf.fits else "does not fit"
    fp8 = (f"with fp8 KV {pro['fp8'].concurrent_requests} fits" if pro["fp8"].fits else "nor with fp8 KV")
    more = _words([f"{a.tp} x {a.gpu_name.replace('NVIDIA ', '')} hold {a.concurrent_requests}" for a in others])
    return (f"A {bf.context:,}-token request {fits} on {bf.tp} x {bf.gpu_name.replace('NVIDIA ', '')} with "
            f"{bf.kv_dtype} KV: MLA's latent KV ({bf.kv_bytes_per_token:,} B per token) is replicated on every "
            f"tensor-parallel rank, not sharded as the source's {SOURCE_CLAIMS['kv_bytes_per_token'] / 1e3:g} KB per "
            f"token assumed, so each GPU's {bf.kv_pool_bytes / 1e9:.2f} GB pool holds {bf.pool_tokens:,} tokens; "
            f"{fp8}, and at {bf.kv_dtype} {more} such requests at once (notebook 05, `workbench capacity`).")


def findings() -> list[str]:
    """The findings as sentences, those whose measurements are committed, in reading order."""
    docs = {n: load_measurement(n) for n in ("engine_step", "context_sweep", "ddtree_kernels", "ddtree_verify",
                                             "moe_bandwidth")}
    small = mplots.load_moe_small()
    e, s = docs["engine_step"], docs["context_sweep"]
    a, a_file = acceptance_measurement()
    plan: list[tuple[bool, Callable[[], str]]] = [
        (bool(e and a), lambda: finding_headline(e, a, a_file)),
        (bool(e), lambda: finding_scripted(e)),
        (bool(e), lambda: finding_floor(e)),
        (bool(s), lambda: finding_context(s)),
        (bool(s), lambda: finding_rates(s)),
        (bool(s), lambda: finding_fragmentation(s)),
        (bool(docs["ddtree_kernels"] and docs["ddtree_verify"]),
         lambda: finding_tree_kernels(docs["ddtree_kernels"], docs["ddtree_verify"])),
        (bool(docs["moe_bandwidth"] and small and e), lambda: finding_moe(docs["moe_bandwidth"], small, e)),
        (True, lambda: finding_b300(a)),
        (True, finding_capacity),
    ]
    return [make() for present, make in plan if present]


def findings_block() -> str:
    """The README's findings block, markers included: one bullet per sentence."""
    return FINDINGS_BEGIN + "\n" + "\n".join(f"- {f}" for f in findings()) + "\n" + FINDINGS_END


def readme_block() -> str:
    """The README's results block, markers included."""
    return f"{BEGIN}\n{markdown_table(results_rows())}\n{END}"


def replace_block(text: str, begin: str, end: str, block: str) -> str:
    """``text`` with the span from ``begin`` to ``end`` (markers included) replaced by ``block``; ValueError when
    the markers are missing."""
    pat = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if not pat.search(text):
        raise ValueError(f"README.md lacks the {begin} ... {end} markers")
    return pat.sub(lambda _: block, text)


def write_readme() -> None:
    """Rewrite README.md's results and findings blocks from the committed data."""
    text = replace_block(README.read_text(), BEGIN, END, readme_block())
    README.write_text(replace_block(text, FINDINGS_BEGIN, FINDINGS_END, findings_block()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.reports.readme", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write-readme", action="store_true", help="rewrite README.md's two blocks in place")
    a = p.parse_args(argv)
    if a.write_readme:
        write_readme()
    print(markdown_table(results_rows()) + "\n\n" + findings_block())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
