"""``workbench sweep``: the throughput diagnosis on the engine (issue 26).

    workbench sweep --engine --synthetic tiny --contexts 32 128 512 --concurrency 1 2 4 [--json]

Prints a table per part (contexts, concurrency, KV layout) or, with ``--json``, the whole document.
Bad inputs exit 2 with the parameter, the value and what is allowed (workbench.validation).
"""
from __future__ import annotations

import argparse
import json
import sys


def register(sub) -> None:
    from workbench.sweep.engine import METHODS

    p = sub.add_parser("sweep", help="decode rates over context, method, KV layout and concurrency (issue 26)")
    p.add_argument("--engine", action="store_true", required=True,
                   help="measure this workbench's DecodeEngine (the endpoint sweep is not written yet)")
    p.add_argument("--synthetic", default="tiny", help="'tiny' or a shipped model name (kimi-k2.6)")
    p.add_argument("--layers", type=int, default=None, help="layers of the synthetic model (default: all)")
    p.add_argument("--contexts", type=int, nargs="+", default=[32, 128, 512], help="prompt lengths (tokens)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4], help="requests decoded together")
    p.add_argument("--method", nargs="+", default=list(METHODS), help="one or more of " + ", ".join(METHODS))
    p.add_argument("--generate", type=int, default=64, help="tokens of the long (sustained) generation")
    p.add_argument("--two-point", type=int, nargs=2, default=[8, 40], metavar=("A", "B"),
                   help="max tokens of the two requests of the two-point rate")
    p.add_argument("--block", type=int, default=8)
    p.add_argument("--budget", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3, help="runs of each two-point request (fastest kept)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from workbench.display import text_table
    from workbench.sweep.run import sweep
    from workbench.sweep.tables import tables

    doc = sweep(args.synthetic, args.layers, args.contexts, args.concurrency, args.method, args.generate,
                args.two_point, args.block, args.budget, args.repeats, device=args.device,
                threads=args.threads)
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
        return 0
    for title, rows in tables(doc).items():
        print(f"\n{title}\n{text_table(rows)}")
    return 0
