"""Which kernel runs where: the per-GPU dispatch tables, as data.

One JSON file per tuned GPU lives in ``data/dispatch/<gpu>.json`` and
``data/dispatch/generic.json`` holds the documented choice for any other GPU
(and the CPU). :func:`dispatch_for` reads them once per process and returns a
frozen :class:`Dispatch`; nothing here is mutable and there are no setters. A
test or benchmark that needs a particular kernel passes it explicitly to the
function that runs it (``variant=`` / ``impl=`` / ``method=``).

Fields of a dispatch file:

- ``match``: substrings of ``torch.cuda.get_device_name()`` that select it.
- ``moe_small``: ``[[largest M, small-M kernel], ...]`` in increasing M for
  ``M * topk <= MOE_SMALL_MAX_PAIRS`` (the kernels' own limit, below); beyond
  the last row (or when empty) the four-launch path runs.
- ``moe_large``: ``[[largest M, [NT, RT, D, S, LINE]], ...]``: the four-launch
  path's gate/up and down variant by M for experts in the packed layout; the
  last row covers every larger M.
- ``moe_large_frag``: ``[[largest M, NT], ...]``: the same for experts in the
  fragment layout (``frag_nt<NT>``), the layout held where ``moe_small`` is not
  empty (``workbench.moe.packing.default_layout``).
- ``verify_bf16`` / ``verify_fp32``: the verify-attention form by dtype.
- ``tree_build``: ``"small_or_heap"`` (the one-warp builder when the tree has at
  most 32 non-root nodes, else the shared-memory heap builder).
"""
from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import torch

from workbench import DATA_DIR

DISPATCH_DIR = DATA_DIR / "dispatch"
GENERIC = "generic"
# The small-M MoE kernels sort the (token, expert) pairs in one CTA's shared memory (moe_int4.cu): a property
# of the kernels, not of a GPU, so it is not in the per-GPU files.
MOE_SMALL_MAX_PAIRS = 128

Variant = tuple[int, int, int, int, int]


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """One GPU's kernel choices (see the module docstring for the fields)."""

    gpu: str
    source: str
    moe_small: tuple[tuple[int, str], ...]
    moe_large: tuple[tuple[int, Variant], ...]
    moe_large_frag: tuple[tuple[int, int], ...]
    verify_bf16: str
    verify_fp32: str
    tree_build: str
    generic: bool = False
    device_name: str = ""

    def moe_small_kernel(self, m: int, topk: int) -> str | None:
        """The small-M kernel for M tokens of ``topk`` experts, or None for the four-launch path."""
        if m <= 0 or m * topk > MOE_SMALL_MAX_PAIRS:
            return None
        for max_m, name in self.moe_small:
            if m <= max_m:
                return name
        return None

    def moe_large_variant(self, m: int) -> Variant:
        """The four-launch path's (NT, RT, D, S, LINE) variant for M tokens."""
        for max_m, var in self.moe_large:
            if m <= max_m:
                return var
        return self.moe_large[-1][1]

    def moe_large_frag_nt(self, m: int) -> int:
        """The fragment four-launch variant's NT (token tiles of 8 per work item) for M tokens."""
        for max_m, nt in self.moe_large_frag:
            if m <= max_m:
                return nt
        return self.moe_large_frag[-1][1]

    def verify_impl(self, dtype) -> str:
        """The verify-attention form for inputs of ``dtype`` (a torch dtype or its name)."""
        return self.verify_bf16 if str(dtype).replace("torch.", "") == "bfloat16" else self.verify_fp32

    def record(self) -> dict:
        """What a measurement file records about the dispatch that ran."""
        return {"gpu": self.gpu, "device_name": self.device_name, "generic": self.generic,
                "source": self.source,
                "moe_small": [list(r) for r in self.moe_small],
                "moe_large": [[m, list(v)] for m, v in self.moe_large],
                "moe_large_frag": [list(r) for r in self.moe_large_frag],
                "verify_bf16": self.verify_bf16, "verify_fp32": self.verify_fp32,
                "tree_build": self.tree_build}


def _parse(path: Path, device_name: str) -> Dispatch:
    raw = json.loads(path.read_text())
    try:
        moe_small = tuple((int(m), str(k)) for m, k in raw["moe_small"])
        moe_large = tuple((int(m), tuple(int(x) for x in v)) for m, v in raw["moe_large"])
        moe_large_frag = tuple((int(m), int(nt)) for m, nt in raw["moe_large_frag"])
        if not moe_large or not moe_large_frag:
            raise ValueError("moe_large and moe_large_frag must each have at least one row")
        for rows in (moe_small, moe_large, moe_large_frag):
            if [r[0] for r in rows] != sorted({r[0] for r in rows}):
                raise ValueError("rows must be in strictly increasing M")
        return Dispatch(gpu=str(raw["gpu"]), source=str(raw["source"]),
                        moe_small=moe_small, moe_large=moe_large, moe_large_frag=moe_large_frag,
                        verify_bf16=str(raw["verify_bf16"]), verify_fp32=str(raw["verify_fp32"]),
                        tree_build=str(raw["tree_build"]), generic=raw["gpu"] == GENERIC,
                        device_name=device_name)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"dispatch file {path} is malformed: {e}") from e


@functools.cache
def _tables() -> tuple[tuple[Path, tuple[str, ...]], ...]:
    out = []
    for path in sorted(DISPATCH_DIR.glob("*.json")):
        out.append((path, tuple(json.loads(path.read_text()).get("match", ()))))
    return tuple(out)


@functools.cache
def dispatch_for(device_name: str | None = None) -> Dispatch:
    """The dispatch for a device name (``torch.cuda.get_device_name()``), read once per name.

    ``None``: the current CUDA device, or the generic table when there is none.
    A device no file matches gets ``generic.json`` with ``generic=True``, so the
    record says the choice was not tuned for it.
    """
    if device_name is None:
        device_name = _current_device_name()
    for path, patterns in _tables():
        if any(p in device_name for p in patterns):
            return _parse(path, device_name)
    return _parse(DISPATCH_DIR / f"{GENERIC}.json", device_name)


def dispatch_for_device(device=None) -> Dispatch:
    """The dispatch for a torch device, its string or a CUDA index: a CUDA device's by its name (index None:
    the current device), the generic table for any other device; None: :func:`dispatch_for`'s default."""
    if device is None:
        return dispatch_for()
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda":
        return dispatch_for("cpu")
    return dispatch_for(torch.cuda.get_device_name(device.index if device.index is not None
                                                   else torch.cuda.current_device()))


def _current_device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
