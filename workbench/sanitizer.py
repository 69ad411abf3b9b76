"""Reading compute-sanitizer output: its SUMMARY lines, the count they state, and logs on disk.

A benchmark runs its small driver under ``compute-sanitizer --tool <tool>`` (memcheck
counts errors, racecheck hazards) and keeps each run's output as ``<folder>/<tool>.log``,
optionally ending with a line ``exit=N`` (the run's exit code). These helpers turn such
text into the fields the measurement files record.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Sequence

_COUNT = re.compile(r"SUMMARY: (\d+) (?:errors?|hazards?)")


def summary_lines(text: str) -> list[str]:
    """The lines of ``text`` that hold a sanitizer SUMMARY, unstripped."""
    return [ln for ln in text.splitlines() if "SUMMARY" in ln]


def stated_count(summary: Sequence[str]) -> int | None:
    """Errors (memcheck) or hazards (racecheck) the SUMMARY lines state; None when none says."""
    m = _COUNT.search(" ".join(summary))
    return int(m.group(1)) if m else None


def read_logs(folder: Any, tools: Sequence[str],
              parse: Callable[[str, str, int | None], dict[str, Any]]) -> dict[str, Any]:
    """``parse(tool, text, exit_code)`` of ``<folder>/<tool>.log`` for each tool.

    ``exit_code`` is N when the log's last line is ``exit=N``, else None. A missing
    log gives ``{"error": "<path> missing"}`` for that tool.
    """
    out: dict[str, Any] = {}
    for tool in tools:
        f = Path(folder) / f"{tool}.log"
        if not f.exists():
            out[tool] = {"error": f"{f} missing"}
            continue
        text = f.read_text(errors="replace")
        lines = text.strip().splitlines()
        rc = int(lines[-1][5:]) if lines and lines[-1].startswith("exit=") else None
        out[tool] = parse(tool, text, rc)
    return out
