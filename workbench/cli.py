"""The ``workbench`` command line (also ``python -m workbench``).

Verbs: ``run`` and ``list`` (the notebook pipeline), ``env``, ``capacity``, ``project``, ``sweep``, ``serve``,
``tp`` and ``drafter``; each module of :data:`VERBS` has ``register(subparsers)`` that adds its parser, whose
``func(args)`` returns the exit code. A value outside what a verb allows (``ValueError``, of which
:class:`~workbench.validation.InvalidParameter`) exits 2 with ``workbench <verb>: error: <message>``.
"""
from __future__ import annotations

import argparse
import sys

from workbench import capacity, environment, pipeline
from workbench.acceptance import cli as drafter_cli
from workbench.parallel import launch
from workbench.projection import cli as projection_cli
from workbench.serve import cli as serve_cli
from workbench.sweep import cli as sweep_cli

VERBS = (pipeline, environment, capacity, projection_cli, sweep_cli, serve_cli, launch, drafter_cli)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every verb."""
    parser = argparse.ArgumentParser(prog="workbench", description="DDTree Workbench")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for verb in VERBS:
        verb.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, run the verb; exit code 2 with one line naming what is not allowed, 130 on Ctrl-C."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as e:
        print(f"workbench {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"workbench {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
