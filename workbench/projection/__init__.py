"""Per-step cost model and projection of DDTree decode speed onto other GPUs (B300, ...).

- :mod:`workbench.projection.model`: the terms (formula, source, scaling rule), byte counts.
- :mod:`workbench.projection.calibration`: measured H200 files or the source's anchors.
- :mod:`workbench.projection.project`: :func:`project` -> low / central / high tokens/s.
- :mod:`workbench.projection.overhead`: the host-overhead term measured from the H200 engine step
  (``project(..., overhead="measured")``) and how it moves to another GPU.
- :mod:`workbench.projection.scenarios`: the source's three scenarios, reproduced.
- :mod:`workbench.projection.trained`: ``trained:<type>``, the shipped drafter's measured acceptance (its
  per-step histogram) as a projection and sweep input.
- :mod:`workbench.projection.speedup`: DDTree's tokens/s over greedy's from measured step times and acceptance,
  and the break-even accepted length.
- :mod:`workbench.projection.figures`, :mod:`workbench.projection.widgets`: notebook 04's figures and explorer.
- :mod:`workbench.projection.cli`: ``workbench project``.
"""
from workbench.projection.calibration import Calibration, load_calibration
from workbench.projection.model import TERMS, GpuSpec, Range, StepShape, available_gpus, load_gpu, step_terms
from workbench.projection.project import Projection, calibrate_overhead, project

__all__ = ["Calibration", "GpuSpec", "Projection", "Range", "StepShape", "TERMS", "available_gpus",
           "calibrate_overhead", "load_calibration", "load_gpu", "project", "step_terms"]
