"""``workbench project``: tokens/s on another GPU from the calibrated step-cost model.

    workbench project --gpu b300 --block 16 --budget 32 --accept 12 16 [trained:math ...]
                      [--overhead measured|source-anchor|MS] [--calibration FILE...] [--acceptance-file FILE] [--json]

``--accept`` takes numbers and ``trained:<type>`` (prose, code, math): the trained drafter's mean accepted
length measured on that text type at this block and budget (data/measurements/h200/acceptance.json, or
``--acceptance-file``; :mod:`workbench.projection.trained`). Not measured there: exit 2 with what was.

``--overhead``: ``source-anchor`` (default) calibrates the host overhead on the source's B300
anchor; ``measured`` takes it from this workbench's H200 engine step (wall - floor of the C=1
DDTree graph replay in data/measurements/h200/engine_step.json, host gaps unchanged, the
kernels-below-floor part scaled with the floor); a number fixes it in ms (as ``--overhead-ms``).

Also: ``--context`` (tokens, default 1024), ``--tp`` (default 8),
``--tree-builder cpu|gpu``, ``--bandwidth-tbs`` (what-if datasheet bandwidth),
``--overhead-cut-ms`` (subtract from the calibrated host overhead) and
``--anchors-only`` (ignore data/measurements: the source's own stack).
"""
from __future__ import annotations

import argparse
import json
import sys

from workbench.decode import MAX_BUDGET, MAX_L
from workbench.projection.model import TREE_BUILDERS, StepShape
from workbench.projection.project import project
from workbench.projection.trained import is_trained
from workbench.validation import InvalidParameter, check_float, load_json_file, parse_text

ROW_KEYS = ("text_type", "block", "budget", "mean_accepted")  # what a row of acceptance.json must carry


def register(subparsers) -> None:
    """The ``project`` verb."""
    p = subparsers.add_parser(
        "project", help="project DDTree decode tokens/s onto a GPU (B300, ...) from the calibrated step model",
        description="Per-step cost model of DDTree decode at concurrency 1, calibrated on this workbench's H200 "
                    "measurements where present and on the source's anchors (data/anchors/). Prints tokens/s "
                    "low / central / high and the step breakdown.")
    p.add_argument("--gpu", required=True, metavar="GPU",
                   help="GPU id of data/hardware.json (b300, h200, rtx-pro-6000, ...)")
    p.add_argument("--block", type=parse_text, required=True, metavar="N",
                   help=f"drafter block size (bonus token + drafted positions), 2..{MAX_L + 1}")
    p.add_argument("--budget", type=parse_text, required=True, metavar="N",
                   help=f"tree budget: non-root nodes (verify width budget+1), 1..{MAX_BUDGET}")
    p.add_argument("--accept", type=parse_text, nargs="+", action="extend", required=True, metavar="A|trained:TYPE",
                   help="accepted length(s) per step, root included (1 <= a <= block), or trained:<type> "
                        "(prose, code, math): the trained drafter's measured accepted length at this block and "
                        "budget")
    p.add_argument("--acceptance-file", default=None, metavar="FILE",
                   help="acceptance measurement read for trained:<type> in place of "
                        "data/measurements/h200/acceptance.json")
    p.add_argument("--overhead", type=parse_text, default=None, metavar="measured|source-anchor|MS",
                   help="the host overhead term: 'source-anchor' (default: calibrated on the source's B300 anchor), "
                        "'measured' (the H200 engine step's cost beyond its floor, data/measurements/h200/"
                        "engine_step.json) or a fixed number of ms")
    p.add_argument("--overhead-ms", type=parse_text, default=None, metavar="MS",
                   help="fix the host overhead per step (the same as --overhead MS)")
    p.add_argument("--overhead-cut-ms", type=parse_text, default=None, metavar="MS",
                   help="subtract this much from the calibrated host overhead")
    p.add_argument("--calibration", nargs="+", action="extend", default=None, metavar="FILE",
                   help="measurement files (moe_bandwidth / ddtree_kernels / engine_step JSON) that replace the "
                        "committed data/measurements/h200 ones")
    p.add_argument("--anchors-only", action="store_true",
                   help="ignore data/measurements; calibrate on the source's anchors only")
    p.add_argument("--context", type=parse_text, default=StepShape.context, metavar="TOKENS",
                   help=f"context length in tokens, 1 .. the model's YaRN limit (default {StepShape.context})")
    p.add_argument("--tp", type=parse_text, default=StepShape.tp, metavar="N",
                   help=f"tensor-parallel GPUs, dividing the attention heads (default {StepShape.tp})")
    p.add_argument("--tree-builder", default=StepShape.tree_builder, metavar="|".join(TREE_BUILDERS),
                   help=f"where the draft tree is built: {' or '.join(TREE_BUILDERS)} "
                        f"(default {StepShape.tree_builder}, as in SGLang)")
    p.add_argument("--bandwidth-tbs", type=parse_text, default=None, metavar="TBS",
                   help="what-if datasheet memory bandwidth of the GPU in TB/s")
    p.add_argument("--json", action="store_true", help="print the full result as JSON")
    p.set_defaults(func=run)


def check_files(args: argparse.Namespace) -> None:
    """The files named on the command line, read before anything is projected: each ``--calibration`` file
    JSON, and ``--acceptance-file`` an acceptance measurement given with a ``trained:<type>`` entry (the only
    entries it is read for)."""
    for f in args.calibration or ():
        load_json_file("calibration", f, "a measurement JSON file (moe_bandwidth, ddtree_kernels or engine_step)")
    if args.acceptance_file is None:
        return
    what = ("an acceptance measurement: JSON with results.rows of " + ", ".join(ROW_KEYS)
            + " (as python -m workbench.bench.acceptance writes it)")
    doc = load_json_file("acceptance_file", args.acceptance_file, what)
    rows = (doc.get("results") or {}).get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and set(ROW_KEYS) <= set(r) for r in rows):
        raise InvalidParameter("acceptance_file", args.acceptance_file, f"the path of {what}; it has no such rows")
    if not any(is_trained(a) for a in args.accept):
        raise InvalidParameter("acceptance_file", args.acceptance_file,
                               "given only with a trained:<type> entry in --accept (the file is read for those "
                               f"alone; --accept is {' '.join(map(str, args.accept))})")


def run(args: argparse.Namespace) -> int:
    """``workbench project``: the files read, then the projection printed as a table or JSON."""
    check_files(args)
    bandwidth = None
    if args.bandwidth_tbs is not None:
        bandwidth = check_float("bandwidth_tbs", args.bandwidth_tbs, lo=0, lo_open=True) * 1e12
    try:
        res = project(args.gpu, args.block, args.budget, list(args.accept), overhead=args.overhead,
                      overhead_ms=args.overhead_ms,
                      overhead_cut_ms=args.overhead_cut_ms, context=args.context, tp=args.tp,
                      tree_builder=args.tree_builder,
                      bandwidth_bytes_per_s=bandwidth,
                      calibration=args.calibration, use_measurements=not args.anchors_only,
                      acceptance_file=args.acceptance_file)
    except (KeyError, TypeError) as e:  # a malformed calibration file
        raise ValueError(f"could not read the calibration: {type(e).__name__}: {e}") from None
    if args.json:
        json.dump(res.to_dict(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(res.table())
    return 0
