"""Generated blocks of the markdown papers in ``papers/``.

A paper holds blocks between ``<!-- BEGIN GENERATED: name -->`` and
``<!-- END GENERATED: name -->``; a report module maps each name to a
function returning the block's markdown, computed from committed data, so no
measured number is typed by hand. Each report module's command is

    python -m workbench.<area>.report            # rewrite its paper's blocks in place
    python -m workbench.<area>.report --check    # exit 1 if the paper is stale

- :func:`render` - a paper's text with every block rewritten.
- :func:`is_current` - whether a paper file equals its rendering.
- :func:`main` - the command line shared by the report modules.
- :func:`json_or_none`, :func:`number`, :func:`signed_percent` - a measurement file where committed, and the
  number formats the papers share.
- :func:`markdown_table` - rows (dicts with the same keys) as a markdown table.
- :func:`committed_json` - a JSON file as committed at a git commit (earlier
  measurement runs that a later run replaced), or None where git lacks it.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from workbench import REPO_ROOT

Blocks = Mapping[str, Callable[[], str]]

BLOCK = re.compile(r"(<!-- BEGIN GENERATED: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- END GENERATED: (?P=name) -->)",
                   re.S)


def block_names(text: str) -> list[str]:
    """Names of the generated blocks of ``text``, in order."""
    return [m.group("name") for m in BLOCK.finditer(text)]


def render(text: str, blocks: Blocks) -> str:
    """``text`` with every generated block rewritten by ``blocks[name]()``.

    A block name missing from ``blocks`` is a ValueError naming the known ones.
    """
    def sub(m: re.Match) -> str:
        name = m.group("name")
        if name not in blocks:
            raise ValueError(f"unknown generated block {name!r}; known: {', '.join(blocks)}")
        return m.group(1) + blocks[name]() + m.group(4)
    return BLOCK.sub(sub, text)


def is_current(path: Path, blocks: Blocks) -> bool:
    """True when the paper at ``path`` equals its rendering."""
    text = Path(path).read_text()
    return render(text, blocks) == text


def main(argv: Sequence[str] | None, *, paper: Path, blocks: Blocks, prog: str, description: str = "") -> int:
    """``prog [--paper PATH] [--check]``: rewrite the paper's generated blocks, or with ``--check``
    exit 1 (printing how to regenerate) when they are stale."""
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("--paper", type=Path, default=paper)
    ap.add_argument("--check", action="store_true", help="exit 1 if the paper's generated blocks are stale")
    args = ap.parse_args(argv)
    text = args.paper.read_text()
    new = render(text, blocks)
    if args.check:
        stale = new != text
        print(f"{args.paper}: {f'stale, regenerate with {prog}' if stale else 'up to date'}")
        return 1 if stale else 0
    args.paper.write_text(new)
    print(f"wrote {args.paper} ({len(block_names(new))} generated blocks)")
    return 0


def json_or_none(path: Path | str) -> dict[str, Any] | None:
    """The JSON document at ``path``, or None where no file is (a paper then says what is not measured yet)."""
    p = Path(path)
    return json.loads(p.read_text()) if p.exists() else None


def number(v, d: int = 1) -> str:
    """``v`` with ``d`` decimals and thousands separators; ``-`` for None."""
    return "-" if v is None else f"{v:,.{d}f}"


def signed_percent(v) -> str:
    """The fraction ``v`` as a signed percentage with one decimal; ``-`` for None."""
    return "-" if v is None else f"{100 * v:+.1f}%"


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A markdown table of ``rows`` (columns: the first row's keys); ``|`` and newlines escaped."""
    if not rows:
        return "(none)\n"
    cols = list(rows[0])
    esc = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    lines += ["| " + " | ".join(esc(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def committed_json(commit: str, path: str) -> dict[str, Any] | None:
    """The JSON file ``path`` (relative to the repository root) as committed at ``commit``, or None
    when git or that object is unavailable (for example a shallow clone)."""
    try:
        out = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=REPO_ROOT, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)
