"""The stage loops of a one-launch MoE kernel, read from its SASS.

Nsight Compute's source page (``ncu --page source --print-source sass --csv``, as
``h200_profile_dispatched.sh`` writes it) lists every SASS instruction of the kernel as the device's NVRTC
build made it, with its address. :func:`stage_loops` finds the loops (a branch to a lower address) whose
body holds one stage of the kernel's stream (``hmma`` tensor-core instructions: 16 per 2304-byte stage of
16 rows x 256 K) and says where the activation loads sit in them and how many register moves follow the
last ``HMMA``: the facts behind runs 14-16 of papers/moe_int4.md (ptxas at 96 registers sinks a stage's
activation loads to its end and rotates the buffers with moves that wait for them).
"""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

_MOVE = re.compile(r"^(@!?U?P\w+\s+)?(MOV|IMAD\.MOV)(\.U32)?\b")
_TARGET = re.compile(r"0x([0-9a-fA-F]+)\s*$")


def read_source_table(path: str | Path) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of an ncu ``--page source --print-source sass --csv`` file: the table from its
    ``"Address"`` header row on (ncu's log lines before it skipped), rows of the header's length only.

    Raises ValueError when the file has no ``"Address"`` header row (not a source-page CSV)."""
    lines = Path(path).read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"Address"')), None)
    if start is None:
        raise ValueError(f"{path}: no '\"Address\"' header row; expected ncu --page source --print-source sass --csv")
    table = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    return table[0], [r for r in table[1:] if len(r) == len(table[0])]


def read_source_csv(path: str | Path) -> list[tuple[int, str]]:
    """(address, SASS text) of every instruction of an ncu source-page CSV (:func:`read_source_table`)."""
    hdr, rows = read_source_table(path)
    ia, isrc = hdr.index("Address"), hdr.index("Source")
    return [(int(r[ia], 16), r[isrc].strip()) for r in rows]


def _loops(instructions: list[tuple[int, str]], hmma: int, max_len: int) -> list[tuple[int, dict[str, Any]]]:
    """(index of the loop's first instruction, :func:`stage_loops` entry) of every stage loop."""
    addrs = {a: i for i, (a, _) in enumerate(instructions)}
    out = []
    for i, (a, text) in enumerate(instructions):
        if "BRA" not in text:
            continue
        m = _TARGET.search(text)
        if not m:
            continue
        j = addrs.get(int(m.group(1), 16))
        if j is None or j >= i:
            continue
        body = [t for _, t in instructions[j:i + 1]]
        hm = [k for k, t in enumerate(body) if "HMMA" in t]
        if len(hm) != hmma or len(body) >= max_len:
            continue
        loads = [k for k, t in enumerate(body) if re.search(r"\bLDG\.E\b|\bLDG\.E\.", t) and "LDGSTS" not in t]
        ops = sorted({body[k].split()[0] if not body[k].startswith("@") else body[k].split()[1] for k in loads})
        out.append((j, {"instructions": len(body), "load": "/".join(ops) or "-", "loads": loads,
                        "first_hmma": hm[0], "last_hmma": hm[-1],
                        "loads_after_last_hmma": sum(k > hm[-1] for k in loads),
                        "moves_after_last_hmma": sum(1 for t in body[hm[-1] + 1:] if _MOVE.match(t))}))
    return out


def stage_loops(instructions: list[tuple[int, str]], hmma: int = 16, max_len: int = 700) -> list[dict[str, Any]]:
    """Loops whose body has exactly ``hmma`` HMMA instructions and fewer than ``max_len`` instructions.

    Per loop: ``instructions`` (static count of the body), ``load`` (the SASS opcode of its global activation
    loads: ``.CONSTANT`` for the layer input, ``.STRONG.GPU`` for h written by the same launch),
    ``loads`` (their positions in the body), ``first_hmma`` / ``last_hmma`` (positions), ``loads_after_last_hmma``
    and ``moves_after_last_hmma`` (MOV / IMAD.MOV after the last HMMA)."""
    return [loop for _, loop in _loops(instructions, hmma, max_len)]


def stage_loop_costs(path: str | Path, hmma: int = 16, max_len: int = 700) -> list[dict[str, Any]]:
    """What each stage loop of one profiled launch cost, from an ncu source-page CSV with its counters
    (``h200_profile_dispatched.sh``): per loop (as :func:`stage_loops` finds them), ``stages`` (executions of its
    first HMMA), ``instructions per stage`` (warp instructions executed in the body / stages), ``samples per
    stage`` (warp-stall samples in the body / stages: time spent in the loop, per stage), ``share of samples``
    (of the launch's) and the largest stall reasons' shares of the loop's samples (``<reason> %``)."""
    hdr, rows = read_source_table(path)
    ia, isrc = hdr.index("Address"), hdr.index("Source")
    iex, ism = hdr.index("Instructions Executed"), hdr.index("Warp Stall Sampling (All Samples)")
    reasons = [(h, i) for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]

    def num(r: list[str], i: int) -> float:
        return float(r[i] or 0)

    instructions = [(int(r[ia], 16), r[isrc].strip()) for r in rows]
    total = sum(num(r, ism) for r in rows) or 1.0
    out = []
    for j, loop in _loops(instructions, hmma, max_len):
        body = rows[j:j + loop["instructions"]]
        stages = num(body[loop["first_hmma"]], iex) or 1.0
        samples = sum(num(r, ism) for r in body)
        by_reason = {h: sum(num(r, i) for r in body) for h, i in reasons}
        top = sorted(by_reason.items(), key=lambda kv: -kv[1])[:3]
        out.append({"load": loop["load"], "stages": int(stages),
                    "instructions per stage": sum(num(r, iex) for r in body) / stages,
                    "samples per stage": samples / stages, "share of samples": samples / total,
                    **{f"{h.removeprefix('stall_')} %": 100 * v / (samples or 1) for h, v in top}})
    return out
