"""Generated blocks of papers/drafter_acceptance.md from the committed chat / math / code acceptance measurement.

Every number comes from ``data/measurements/<gpu>/acceptance.json`` (:func:`workbench.acceptance.figures.load_doc`,
default GPU :data:`workbench.acceptance.figures.DEFAULT_GPU`); the sentences are
:func:`workbench.acceptance.figures.reading`'s, computed from the file.

    python -m workbench.reports.acceptance            # rewrite the paper's blocks
    python -m workbench.reports.acceptance --check    # exit 1 if they are stale
"""
from __future__ import annotations

import sys

from workbench import REPO_ROOT
from workbench.acceptance.figures import DEFAULT_GPU, load_doc, reading
from workbench.reports import papers
from workbench.reports.papers import markdown_table

PAPER = REPO_ROOT / "papers" / "drafter_acceptance.md"


def _doc():
    return load_doc(DEFAULT_GPU)


def _none() -> str:
    return f"(no chat/math/code acceptance measurement committed for {DEFAULT_GPU})\n"


def block_provenance() -> str:
    doc = _doc()
    if doc is None:
        return _none()
    p, r = doc["provenance"], doc["results"]
    d = r["data"]["train"] if "train" in r["data"] else r["data"]
    rows = [{"what": "GPU / driver", "value": f"{p.get('gpu')} / {p.get('driver')}"},
            {"what": "torch / git commit / date", "value": f"{p.get('torch')} / {p.get('git_commit')} / {p.get('date_utc')}"},
            {"what": "target", "value": f"{r['target']['name']} ({r['target'].get('gguf')}, float32)"},
            {"what": "training data", "value": f"{d.get('prompts')} prompts, {d.get('tokens')} generated tokens "
             f"({d.get('continuation_tokens_to_eos')} up to end of turn) in {d.get('seconds', 0):.0f} s, "
             f"{d.get('tokens_per_s', 0):.0f} tokens/s, CUDA graph {d.get('graph')}"},
            {"what": "complete", "value": str(r.get("complete"))},
            {"what": "notes", "value": doc.get("notes") or ""}]
    return markdown_table(rows)


def block_goals() -> str:
    doc = _doc()
    if doc is None:
        return _none()
    rows = []
    for t, v in doc["results"]["goals"].items():
        rows.append({"text type": t, "accepted (budget 32)": f"{v['mean_accepted']:.2f}",
                     "95% interval": f"{v['ci95'][0]:.2f}-{v['ci95'][1]:.2f}", "goal": v["goal"],
                     "met": "yes" if v["met"] else f"no, short by {v['short_by']:.2f}",
                     "depth-1 hit (goal 0.7)": f"{v['first_position_hit']:.2f}",
                     "tree / chain (goal 1.3)": f"{v['tree_over_chain']:.2f}"})
    return markdown_table(rows)


def block_rows() -> str:
    doc = _doc()
    if doc is None:
        return _none()
    best = doc["results"]["best_drafter"]
    rows = [{"text type": r["text_type"], "drafter": r["drafter"] or "-", "method": r["method"], "budget": r["budget"],
             "accepted": f"{r['mean_accepted']:.2f}", "95% interval": f"{r['ci95'][0]:.2f}-{r['ci95'][1]:.2f}",
             "rounds": r["rounds"], "prompts": r["prompts"]}
            for r in doc["results"]["rows"] if r["drafter"] in (best, None) or r["budget"] == 32]
    return markdown_table(rows)


def block_reading() -> str:
    doc = _doc()
    return _none() if doc is None else "```\n" + reading(doc) + "\n```\n"


BLOCKS = {"provenance": block_provenance, "goals": block_goals, "rows": block_rows, "reading": block_reading}


def main(argv=None) -> int:
    return papers.main(argv, paper=PAPER, blocks=BLOCKS, prog="python -m workbench.reports.acceptance",
                       description=__doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main())
