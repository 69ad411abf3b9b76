"""The README's results table, generated from the committed measurements.

``python -m workbench.reports.readme`` prints the table; ``--write-readme`` replaces
the block between the ``results:begin`` / ``results:end`` markers of
README.md. tests/test_report.py checks that the README's block equals what
the measurements give, so no number in it is typed by hand. The rows come
from the areas' report code (:mod:`workbench.reports.ddtree`,
:mod:`workbench.reports.moe_plots`); a missing module raises rather than leaving a
hole in the table.
"""
from __future__ import annotations

import argparse
import re
from typing import Any

from workbench import REPO_ROOT
from workbench.acceptance.figures import GOAL, goal
from workbench.measure import load_measurement
from workbench.reports import ddtree as ddtree_report, moe_plots as mplots, papers

README = REPO_ROOT / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


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


def acceptance_rows() -> list[dict[str, Any]]:
    """The trained drafter's goal from acceptance.json (:func:`workbench.acceptance.figures.goal`), per measured block."""
    doc = load_measurement("acceptance")
    if not doc or doc["provenance"].get("gpu") is None:
        return []
    area = f"Trained drafter ({doc['results']['target']['name']})"
    out = []
    for block in sorted({r["block"] for r in doc["results"]["rows"]}):
        g = goal(doc, block)
        if g:
            out.append({"area": area, "goal": f"{GOAL['text_type']}, block {block}: accepted length at budget "
                                              f"{GOAL['budget']} over the chain (>= {GOAL['over_chain']}x)",
                        "measured": f"{g['ratio']:.2f}x ({g['tree']:.2f} vs {g['chain']:.2f}, {g['prompts']} prompts)",
                        "met": g["met"], "file": "acceptance.json"})
    return out


ENGINE_GOALS = {   # goal keys of bench/engine.py -> what the README says
    "greedy_pct_of_floor_c1": "greedy C = 1, % of the step's floor",
    "ddtree_pct_of_floor_c1": "DDTree C = 1, % of the step's floor",
    "graph_over_eager_tokens_per_s_c1": "greedy C = 1 tokens/s, captured step over generate()'s (same run)",
    "greedy_c8_over_c1_tokens_per_s": "greedy aggregate tokens/s, C = 8 over C = 1",
}


def markdown_table(rows: list[dict[str, Any]]) -> str:
    met = {True: "yes", False: "**no**", None: "-"}
    return papers.markdown_table([{"area": r["area"], "goal": r["goal"], "measured on the H200": r["measured"],
                                   "met": met[r["met"]], "data/measurements/h200/": f"`{r['file']}`"}
                                  for r in rows]).rstrip("\n")


def readme_block() -> str:
    return f"{BEGIN}\n{markdown_table(results_rows())}\n{END}"


def write_readme() -> None:
    text = README.read_text()
    pat = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pat.search(text):
        raise ValueError(f"README.md lacks the {BEGIN} ... {END} markers")
    README.write_text(pat.sub(lambda _: readme_block(), text))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.reports.readme", description=__doc__)
    p.add_argument("--write-readme", action="store_true")
    a = p.parse_args(argv)
    if a.write_readme:
        write_readme()
    print(markdown_table(results_rows()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
