"""``workbench sweep``: the throughput diagnosis on the engine (issue 26).

    workbench sweep --engine --synthetic tiny --contexts 32 128 512 --concurrency 1 2 4
                    [--method greedy ddtree-high ddtree-low trained:math] [--json]
    workbench sweep --endpoint URL --model NAME --contexts 128 1024 --concurrency 1 4 [--two-point 8 264]
                    [--sustained 1500] [--max-tokens N] [--timeout S] [--api-key KEY] [--json]

``--endpoint`` measures any OpenAI-compatible server through :func:`workbench.serve.client.sweep` (TTFT, ITL,
TPOT, output tokens/s per request and aggregate, two-point and sustained rates, accepted length where the server
reports it; timeouts and failures counted, never dropped).

Prints a table per part (contexts, concurrency, KV layout) or, with ``--json``, the whole document.
Bad inputs exit 2 with the parameter, the value and what is allowed (workbench.validation).
"""
from __future__ import annotations

import argparse
import json
import sys


def register(sub) -> None:
    from workbench.sweep.engine import METHODS, method_choices

    p = sub.add_parser("sweep", help="decode rates over context, method, KV layout and concurrency (issue 26)")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--engine", action="store_true", help="measure this workbench's DecodeEngine")
    target.add_argument("--endpoint", default=None, help="measure a live OpenAI-compatible server at this base URL")
    p.add_argument("--model", default=None, help="--endpoint: the model name the server serves")
    p.add_argument("--max-tokens", type=int, default=64, help="--endpoint: max tokens of each measured request")
    p.add_argument("--sustained", type=int, default=None, help="--endpoint: tokens of the sustained request")
    p.add_argument("--timeout", type=float, default=120.0, help="--endpoint: seconds per request")
    p.add_argument("--api-key", default=None, help="--endpoint: bearer token")
    p.add_argument("--synthetic", default="tiny", help="'tiny' or a shipped model name (kimi-k2.6)")
    p.add_argument("--layers", type=int, default=None, help="layers of the synthetic model (default: all)")
    p.add_argument("--contexts", type=int, nargs="+", default=[32, 128, 512], help="prompt lengths (tokens)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4], help="requests decoded together")
    p.add_argument("--method", nargs="+", default=list(METHODS),
                   help="one or more of " + ", ".join(method_choices()) + " (default: " + " ".join(METHODS)
                        + "; trained:<type>: DDTree with a scripted drafter calibrated to the trained drafter's "
                          "accepted length measured on that text type at --block and --budget, "
                          "data/measurements/h200/acceptance.json)")
    p.add_argument("--generate", type=int, default=64, help="tokens of the long (sustained) generation")
    p.add_argument("--two-point", type=int, nargs=2, default=None, metavar=("A", "B"),
                   help="max tokens of the two requests of the two-point rate")
    p.add_argument("--block", type=int, default=8)
    p.add_argument("--budget", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3, help="runs of each two-point request (fastest kept)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    p.set_defaults(func=run)


ENGINE_TWO_POINT = (8, 40)   # the engine sweep's default two-point request lengths (CPU-sized)


def run(args: argparse.Namespace) -> int:
    if args.endpoint is not None:
        return run_endpoint(args)
    from workbench.display import text_table
    from workbench.sweep.run import sweep
    from workbench.sweep.tables import tables

    doc = sweep(args.synthetic, args.layers, args.contexts, args.concurrency, args.method, args.generate,
                list(args.two_point or ENGINE_TWO_POINT), args.block, args.budget, args.repeats, device=args.device,
                threads=args.threads)
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
        return 0
    for title, rows in tables(doc).items():
        print(f"\n{title}\n{text_table(rows)}")
    return 0


def run_endpoint(args: argparse.Namespace) -> int:
    """``workbench sweep --endpoint``: the measuring client of workbench.serve against a live server."""
    from workbench.client import summary, sweep
    from workbench.validation import InvalidParameter

    if not args.model:
        raise InvalidParameter("model", args.model, "the served model's name (required with --endpoint)")
    res = sweep(args.endpoint, args.model, args.contexts, args.concurrency, args.max_tokens, args.two_point,
                args.sustained, args.timeout, args.api_key)
    print(json.dumps(res, indent=1) if args.json else summary(res))
    return 0
