"""The ``workbench`` command line (also ``python -m workbench``).

Subcommands: ``run`` (the notebook pipeline), ``list``, ``env``, ``capacity``,
and those registered by other modules listed in ``_PLUGINS``: each such
module has ``register(subparsers)`` that adds a parser whose ``func(args)``
returns the exit code.
"""
from __future__ import annotations

import argparse
import importlib
import sys

_PLUGINS = (
    "workbench.pipeline",
    "workbench.environment",
    "workbench.capacity",
    "workbench.projection.cli",
    "workbench.sweep.cli",
    "workbench.serve.cli",
    "workbench.parallel.launch",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbench", description="DDTree Workbench")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod_name in _PLUGINS:
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name and mod_name.startswith(e.name):
                continue  # not written yet
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
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


if __name__ == "__main__":
    raise SystemExit(main())
