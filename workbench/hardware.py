"""GPU facts from ``data/hardware.json`` (datasheet leads plus measured values)."""
from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

from workbench import DATA_DIR
from workbench.validation import check_choice

HARDWARE_FILE = DATA_DIR / "hardware.json"


@dataclasses.dataclass(frozen=True)
class GPU:
    """One GPU kind. Bytes and bytes/s; ``usable_memory_bytes`` wins over the datasheet when known."""

    id: str
    name: str
    memory_bytes: int
    bandwidth_bytes_per_s: float
    interconnect: str
    link_bytes_per_s: float | None
    dense_bf16_flops: float | None
    usable_memory_bytes: int | None = None
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def memory(self) -> int:
        """Memory the capacity arithmetic uses: usable when read, else the datasheet value."""
        return self.usable_memory_bytes or self.memory_bytes


@functools.cache
def _load() -> dict[str, Any]:
    return json.loads(HARDWARE_FILE.read_text())["gpus"]


def gpu_table() -> dict[str, Any]:
    """The raw ``gpus`` entries of data/hardware.json, by id (shared: do not modify)."""
    return _load()


def gpu_ids() -> list[str]:
    return list(_load())


def get_gpu(gpu_id: str) -> GPU:
    """The GPU called ``gpu_id`` (``rtx-pro-6000``, ``h100``, ``h200``, ``b200``, ``b300``)."""
    gpus = _load()
    check_choice("gpu", gpu_id, gpus)
    g = gpus[gpu_id]
    return GPU(id=gpu_id, name=g["name"], memory_bytes=int(g["memory_bytes"]),
               bandwidth_bytes_per_s=float(g["bandwidth_bytes_per_s"]),
               interconnect=g.get("interconnect", ""), link_bytes_per_s=g.get("link_bytes_per_s"),
               dense_bf16_flops=g.get("dense_bf16_flops"),
               usable_memory_bytes=g.get("usable_memory_bytes"), raw=g)
