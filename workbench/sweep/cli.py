"""``workbench sweep``: the throughput diagnosis on the engine, or on any OpenAI-compatible server.

    workbench sweep --engine --synthetic tiny [--layers N] --contexts 32 128 512 --concurrency 1 2 4
                    [--method greedy ddtree-high ddtree-low trained:math] [--generate 64] [--two-point 8 40]
                    [--block 8] [--budget 16] [--repeats 3] [--device cpu|cuda] [--threads N] [--json]
    workbench sweep --endpoint URL --model NAME --contexts 128 1024 --concurrency 1 4 [--two-point 8 264]
                    [--sustained 1500] [--max-tokens N] [--timeout S] [--api-key KEY] [--json]

``--endpoint`` measures any OpenAI-compatible server through :func:`workbench.client.sweep` (TTFT, ITL,
TPOT, output tokens/s per request and aggregate, two-point and sustained rates, accepted length where the server
reports it; timeouts and failures counted, never dropped). The server is reached before anything is measured
(and, where it lists its models, ``--model`` must be one of them); a sweep in which every request failed exits 1
with the failures' reasons.

Prints a table per part (contexts, concurrency, KV layout) or, with ``--json``, the whole document.
Bad inputs exit 2 with the parameter, the value and what is allowed (workbench.validation); an option of
the other target (``--block`` with ``--endpoint``, ``--sustained`` with ``--engine``, ...) is one of them.
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys

import httpx

from workbench.capacity import check_fits_memory, host_memory_bytes
from workbench.client import summary
from workbench.client import sweep as endpoint_sweep
from workbench.config import available_models
from workbench.display import text_table
from workbench.environment import has_cuda
from workbench.sweep.engine import METHODS, method_choices, model_config
from workbench.sweep.run import sweep as engine_sweep
from workbench.sweep.tables import tables
from workbench.validation import (
    InvalidParameter, check_choice, check_float, check_int, check_list, check_reachable, check_str, check_two_point,
    check_url, parse_text,
)

ENGINE_TWO_POINT = (8, 40)   # the engine sweep's default two-point request lengths (CPU-sized)
ENGINE_DEFAULTS = {k: v.default for k, v in inspect.signature(engine_sweep).parameters.items()}
# the options of one target only (dest -> the default filled in when that target runs)
ENGINE_ONLY = {"synthetic": "tiny", "layers": None, "method": list(METHODS), "block": ENGINE_DEFAULTS["block"],
               "budget": ENGINE_DEFAULTS["budget"], "repeats": ENGINE_DEFAULTS["repeats"], "device": "cpu",
               "threads": None}
ENDPOINT_ONLY = {"model": None, "max_tokens": 64, "sustained": None, "timeout": 120.0, "api_key": None}
SHARED = {"contexts": [32, 128, 512], "concurrency": [1, 2, 4]}  # both targets; a repeated option adds to it
CONNECT_S = 5.0  # how long the up-front reachability check waits for the server
ENDPOINT_CONCURRENCY = 1024  # requests in flight at once against a server (workbench.client.sweep's bound)


def register(sub) -> None:
    """The ``sweep`` verb; numbers are parsed by :func:`~workbench.validation.parse_text` and checked by name."""
    p = sub.add_parser("sweep", help="decode rates over context, method, KV layout and concurrency",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--engine", action="store_true", help="measure this workbench's engine")
    target.add_argument("--endpoint", default=None, metavar="URL",
                        help="measure a live OpenAI-compatible server at this base URL")
    p.add_argument("--model", metavar="NAME", help="--endpoint: the model name the server serves")
    p.add_argument("--max-tokens", type=parse_text, metavar="N",
                   help="--endpoint: max tokens of each measured request (default 64)")
    p.add_argument("--sustained", type=parse_text, metavar="N", help="--endpoint: tokens of the sustained request")
    p.add_argument("--timeout", type=parse_text, metavar="S", help="--endpoint: seconds per request (default 120)")
    p.add_argument("--api-key", metavar="KEY", help="--endpoint: bearer token")
    p.add_argument("--synthetic", metavar="NAME", help="--engine: 'tiny' (default) or a shipped model name (kimi-k2.6)")
    p.add_argument("--layers", type=parse_text, metavar="N",
                   help="--engine: layers of the synthetic model (default: all)")
    p.add_argument("--contexts", type=parse_text, nargs="+", action="extend", metavar="TOKENS",
                   help="prompt lengths (tokens; default " + " ".join(map(str, SHARED["contexts"])) + ")")
    p.add_argument("--concurrency", type=parse_text, nargs="+", action="extend", metavar="C",
                   help="requests decoded together (default " + " ".join(map(str, SHARED["concurrency"])) + ")")
    p.add_argument("--method", nargs="+", action="extend", metavar="METHOD",
                   help="--engine: one or more of " + ", ".join(method_choices()) + " (default: " + " ".join(METHODS)
                        + "; trained:<type>: DDTree with a scripted drafter calibrated to the trained drafter's "
                          "accepted length measured on that text type at --block and --budget, "
                          "data/measurements/h200/acceptance.json)")
    p.add_argument("--generate", type=parse_text, default=64, metavar="N",
                   help="tokens of the long (sustained) generation")
    p.add_argument("--two-point", type=parse_text, nargs=2, default=None, metavar=("A", "B"),
                   help="max tokens of the two requests of the two-point rate")
    p.add_argument("--block", type=parse_text, metavar="N",
                   help=f"--engine: drafter block (default {ENGINE_ONLY['block']})")
    p.add_argument("--budget", type=parse_text, metavar="N",
                   help=f"--engine: tree budget (default {ENGINE_ONLY['budget']})")
    p.add_argument("--repeats", type=parse_text, metavar="N",
                   help=f"--engine: runs of each two-point request, fastest kept (default {ENGINE_ONLY['repeats']})")
    p.add_argument("--device", metavar="cpu|cuda", help="--engine: cpu (default) or cuda")
    p.add_argument("--threads", type=parse_text, metavar="N", help="--engine: torch CPU threads (default: torch's)")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Check the options of the chosen target, then sweep it."""
    check_target_options(args)
    if args.endpoint is not None:
        return run_endpoint(args)
    check_engine_options(args)
    doc = engine_sweep(args.synthetic, args.layers, args.contexts, args.concurrency, args.method, args.generate,
                       list(args.two_point or ENGINE_TWO_POINT), args.block, args.budget, args.repeats,
                       device=args.device, threads=args.threads)
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
        return 0
    for title, rows in tables(doc).items():
        print(f"\n{title}\n{text_table(rows)}")
    return 0


def check_target_options(args: argparse.Namespace) -> None:
    """An option of the other target is an error (it would be ignored); the chosen target's unset options get
    their defaults (a list option given twice holds both: ``--contexts 8 --contexts 16`` is 8 16)."""
    mine, other, flag = ((ENDPOINT_ONLY, ENGINE_ONLY, "--engine") if args.endpoint is not None
                         else (ENGINE_ONLY, ENDPOINT_ONLY, "--endpoint"))
    for dest in other:
        if getattr(args, dest) is not None:
            raise InvalidParameter(dest, getattr(args, dest), f"given only with {flag} (the "
                                   f"{'engine' if flag == '--engine' else 'endpoint'} sweep's option)")
    for dest, default in {**SHARED, **mine}.items():
        if getattr(args, dest) is None:
            setattr(args, dest, list(default) if isinstance(default, list) else default)


def check_engine_options(args: argparse.Namespace) -> None:
    """What the engine sweep itself does not check before its first point: the model, the repeats and where
    it runs (the contexts, methods, block, budget, ... are checked by the sweep before it starts)."""
    check_choice("synthetic", args.synthetic, ("tiny", *available_models()))
    check_int("repeats", args.repeats, lo=1)
    check_choice("device", args.device, ("cpu", "cuda"))
    if args.device == "cuda" and not has_cuda():
        raise InvalidParameter("device", args.device, "'cpu' on this machine (no CUDA GPU found)")
    if args.device == "cpu":  # on CUDA the sweep keeps the routed experts that fit (sweep.run.build_model)
        check_fits_memory(model_config(args.synthetic, args.layers), host_memory_bytes(), "this machine's RAM",
                          float32=True)
    if args.threads is not None:
        check_int("threads", args.threads, lo=1)


def run_endpoint(args: argparse.Namespace) -> int:
    """``workbench sweep --endpoint``: the measuring client against a live server, reached first."""
    check_endpoint_options(args)
    res = endpoint_sweep(args.endpoint, args.model, args.contexts, args.concurrency, args.max_tokens,
                         args.two_point, args.sustained, args.timeout, args.api_key)
    print(json.dumps(res, indent=1) if args.json else summary(res))
    errors = [e for p in res["points"] for e in p["aggregate"]["errors"]]
    total = sum(p["aggregate"]["requests"] for p in res["points"])
    if total and len(errors) == total:
        print(f"workbench sweep: error: every request failed ({total} of {total}); the reasons: "
              + "; ".join(sorted(set(map(str, errors)))), file=sys.stderr)
        return 1
    return 0


def check_endpoint_options(args: argparse.Namespace) -> None:
    """The URL, the model name and the numbers checked, then the server reached (and its model list read,
    where it serves one) before anything is measured."""
    check_url("endpoint", args.endpoint)
    if args.model is None:
        raise InvalidParameter("model", args.model, "the served model's name (required with --endpoint)")
    check_str("model", args.model)
    check_list("contexts", args.contexts, lambda n, v: check_int(n, v, lo=1), "integers >= 1")
    check_list("concurrency", args.concurrency, lambda n, v: check_int(n, v, lo=1, hi=ENDPOINT_CONCURRENCY),
               f"integers in [1, {ENDPOINT_CONCURRENCY}]")
    check_int("max_tokens", args.max_tokens, lo=1)
    if args.two_point is not None:
        check_two_point("two_point", args.two_point)
    check_float("timeout", args.timeout, lo=0.0, lo_open=True)
    if args.sustained is not None:
        check_int("sustained", args.sustained, lo=2)
    if args.api_key is not None:
        check_str("api_key", args.api_key)
    check_reachable("endpoint", args.endpoint, timeout=min(CONNECT_S, args.timeout))
    check_served_model(args.endpoint, args.model, args.api_key)


def check_served_model(endpoint: str, model: str, api_key: str | None) -> None:
    """``model`` among the models the server lists at /v1/models, and ``api_key`` accepted there; a server
    that lists none (no such route, not JSON) is not checked."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(endpoint.rstrip("/") + "/v1/models", headers=headers, timeout=CONNECT_S)
        listed = r.json().get("data") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):  # unreachable route, not JSON, not an object
        return
    if r.status_code in (401, 403):
        raise InvalidParameter("api_key", api_key, f"a key {endpoint} accepts (it answered {r.status_code})")
    ids = [m.get("id") for m in listed or () if isinstance(m, dict)]
    if ids and model not in ids:
        raise InvalidParameter("model", model, f"one of the models {endpoint} serves: " + ", ".join(map(repr, ids)))
