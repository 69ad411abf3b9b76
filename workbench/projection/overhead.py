"""The host-overhead term measured from the captured engine step, and its transfer to another GPU.

``data/measurements/h200/engine_step.json`` (written by :mod:`workbench.bench.engine`) times the
engine's decode step as a CUDA-graph replay at full K2.6 depth on one H200 and records, per
configuration, its wall time, its floor (the larger of bytes touched / copy bandwidth and matrix
FLOPs / bf16 rate, both measured in the same run) and the GPU-busy time of the profiled steps.
What the step costs beyond its floor splits in two:

- **host / launch gaps** = wall - GPU busy: time the GPU waits on the host (graph launch, the one
  device-to-host copy of the accepted tokens, gaps between kernels);
- **kernels below their floors** = GPU busy - floor: the kernels' time beyond the bytes (or FLOPs)
  they must move, glue kernels (norms, rope, elementwise, top-k, tree build, accept, commit) included.

:func:`measured_steps` reads the C = 1 rows (path ``graph``, the fuse mode the engine dispatches by
default: the last of ``parameters.fuses``; DDTree at the first ``parameters.p_tops``) with the file's
provenance. No measured number is typed here.

Transfer to another GPU (:func:`transfer`; the ``overhead="measured"`` mode of
:func:`workbench.projection.project.project`). Assumptions:

1. the host part carries over unchanged (the same engine on a host of the same speed: a graph replay
   and one copy per step, under tensor parallelism one replay per rank in parallel);
2. the kernels-below-floor part scales with the step's floor, ``excess x (floor_target /
   floor_H200) ** exponent``: at the central exponent 1 every kernel keeps the percent of its floor it
   reached on the H200; at exponent 0 (the range's slow end) it is per-launch latency that a faster or
   less loaded GPU does not shorten;
3. ``floor_target`` is the projected step's own floor per GPU (MoE, dense and attention at their bytes
   or FLOP floors, the terms the engine's floor counts), so in this mode the device terms are their
   floors and the overhead term carries everything beyond them; all-reduce (absent at TP = 1), the
   drafter's weights and the tree build keep the model's terms.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from workbench.decode import METHODS
from workbench.projection.model import Range

ENGINE_STEP = "engine_step"
# assumption 2 above: the exponent of the floor ratio that scales the kernels-below-floor part
EXCESS_EXPONENT = Range(0.0, 1.0, 1.0, "assumption: the engine step's kernels-below-floor time scales with the "
                        "floor (exponent 1, each kernel keeps its H200 percent of floor) down to not at all "
                        "(exponent 0, per-launch latency)", kind="assumption")
EXPONENT_KEY = "measured_excess_floor_exponent"


@dataclasses.dataclass(frozen=True)
class MeasuredStep:
    """One C = 1 row of an engine_step measurement and what it costs beyond its floor (ms)."""

    method: str
    p_top: float | None
    fuse: str
    path: str
    C: int
    wall_ms: float
    floor_ms: float
    bytes_floor_ms: float | None
    flops_floor_ms: float | None
    gpu_busy_ms: float | None
    launches_per_step: float | None
    mean_accepted: float | None
    tokens_per_request_step: int | None
    file: str
    git_commit: str
    gpu: str
    date_utc: str

    @property
    def overhead_ms(self) -> float:
        """wall - floor: what the step costs beyond its floor."""
        return self.wall_ms - self.floor_ms

    @property
    def host_ms(self) -> float | None:
        """wall - GPU busy: host / launch gaps (None without a profile)."""
        return None if self.gpu_busy_ms is None else self.wall_ms - self.gpu_busy_ms

    @property
    def kernel_excess_ms(self) -> float | None:
        """GPU busy - floor: the kernels' time beyond their floors (None without a profile)."""
        return None if self.gpu_busy_ms is None else self.gpu_busy_ms - self.floor_ms

    @property
    def pct_of_floor(self) -> float:
        return 100.0 * self.floor_ms / self.wall_ms

    @property
    def label(self) -> str:
        p = "" if self.p_top is None else f", p_top {self.p_top:g}"
        return f"{self.method} C={self.C} ({self.path}, fuse {self.fuse}{p})"

    @property
    def provenance(self) -> str:
        return f"{self.file} (measured at {self.git_commit}, {self.gpu}, {self.date_utc})"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(overhead_ms=self.overhead_ms, host_ms=self.host_ms, kernel_excess_ms=self.kernel_excess_ms,
                 pct_of_floor=self.pct_of_floor)
        return d


def _num(row: Mapping[str, Any], key: str) -> float | None:
    v = row.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def measured_steps(doc: Mapping[str, Any], file: str = f"data/measurements/h200/{ENGINE_STEP}.json", *,
                   fuse: str | None = None, p_top: float | None = None, C: int = 1,
                   path: str = "graph") -> dict[str, MeasuredStep]:
    """The greedy and DDTree rows of an engine_step document at concurrency ``C`` (default 1), as
    :class:`MeasuredStep` by method. ``fuse``: default the last of ``parameters.fuses`` (the mode the
    engine dispatches by default); ``p_top``: DDTree's, default the first of ``parameters.p_tops``.
    Raises ValueError naming what is missing."""
    try:
        params, rows = doc.get("parameters") or {}, doc["results"]["rows"]
    except (KeyError, TypeError):
        raise ValueError(f"{file}: no results.rows (not an engine_step measurement of workbench.bench.engine)") \
            from None
    fuses = params.get("fuses") or []
    fuse = fuse if fuse is not None else (fuses[-1] if fuses else None)
    p_tops = params.get("p_tops") or []
    p_top = p_top if p_top is not None else (p_tops[0] if p_tops else None)
    prov = doc.get("provenance") or {}
    out = {}
    for method in METHODS:
        want = None if method == "greedy" else p_top
        got = [r for r in rows if isinstance(r, dict) and r.get("method") == method and r.get("C") == C
               and r.get("path") == path and (fuse is None or r.get("fuse") == fuse)
               and (method == "greedy" or want is None or r.get("p_top") == want)]
        if not got:
            raise ValueError(f"{file}: no {method} row at C={C}, path {path!r}, fuse {fuse!r}"
                             + ("" if method == "greedy" else f", p_top {want!r}")
                             + f" (rows: {len(rows)}; fuses measured: {fuses})")
        r = got[0]
        wall, floor = _num(r, "wall_ms"), _num(r, "floor_ms")
        if not wall or not floor:
            raise ValueError(f"{file}: the {method} row at C={C} ({path}, {fuse}) lacks wall_ms or floor_ms "
                             f"(a run without the copy bandwidth and matrix rate has no floor)")
        out[method] = MeasuredStep(
            method=method, p_top=r.get("p_top"), fuse=str(r.get("fuse")), path=path, C=C, wall_ms=wall,
            floor_ms=floor, bytes_floor_ms=_num(r, "bytes_floor_ms"), flops_floor_ms=_num(r, "flops_floor_ms"),
            gpu_busy_ms=_num(r, "gpu_busy_ms_per_step"), launches_per_step=_num(r, "launches_per_step"),
            mean_accepted=_num(r, "mean_accepted"),
            tokens_per_request_step=(int(r["tokens_per_request_step"]) if "tokens_per_request_step" in r else None),
            file=file, git_commit=str(prov.get("git_commit", "?")), gpu=str(prov.get("gpu", "?")),
            date_utc=str(prov.get("date_utc", "?")))
    return out


def engine_step_file(calib: Any) -> str:
    """The label under which a :class:`~workbench.projection.calibration.Calibration` read its
    engine_step document."""
    return next((f for f in calib.files if ENGINE_STEP in str(f)), f"data/measurements/h200/{ENGINE_STEP}.json")


def from_calibration(calib: Any, **kw: Any) -> dict[str, MeasuredStep]:
    """:func:`measured_steps` of the engine_step document a calibration holds; ValueError when it holds none."""
    if calib.engine_step is None:
        raise ValueError("overhead='measured' needs data/measurements/h200/engine_step.json (or an engine_step "
                         "file in calibration=...); none is loaded (use_measurements=False reads none)")
    return measured_steps(calib.engine_step, engine_step_file(calib), **kw)


def transfer(step: MeasuredStep, target_floor_ms: float, exponent: float) -> dict[str, float]:
    """The measured step's overhead moved onto a step whose floor is ``target_floor_ms``: host part
    unchanged, kernels-below-floor part x (target floor / measured floor) ** ``exponent``."""
    if step.gpu_busy_ms is None:
        raise ValueError(f"{step.file}: the {step.label} row has no GPU-busy time (no profile), so its "
                         f"overhead cannot be split into host and kernel parts")
    host, excess = step.host_ms, step.kernel_excess_ms
    if host < 0 or excess < 0:
        raise ValueError(f"{step.file}: the {step.label} row has wall {step.wall_ms:.3f} ms, GPU busy "
                         f"{step.gpu_busy_ms:.3f} ms and floor {step.floor_ms:.3f} ms: a negative part "
                         f"(host {host:.3f}, kernels {excess:.3f} ms) cannot be transferred")
    if not target_floor_ms > 0:
        raise ValueError(f"target floor must be > 0 ms, got {target_floor_ms}")
    ratio = target_floor_ms / step.floor_ms
    kernels = excess * ratio ** exponent
    return {"host_ms": host, "kernel_ms": kernels, "overhead_ms": host + kernels, "floor_ratio": ratio,
            "exponent": exponent, "target_floor_ms": target_floor_ms}
