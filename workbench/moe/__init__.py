"""INT4 (W4A16) mixture-of-experts for decode shapes.

- :mod:`workbench.moe.packing` - :class:`Int4Experts`, the stacked
  compressed-tensors expert weights and the fragment layout the small-M
  kernels read (and how they are built from a checkpoint's per-expert tensors).
- :mod:`workbench.moe.reference` - dequantise-then-matmul in float32 (CPU or GPU).
- :mod:`workbench.moe.fused` - :func:`fused_moe_int4`, the CUDA kernels that
  data/dispatch names, with the reference as its CPU path; :func:`moe_plan`.
- :mod:`workbench.moe.dispatched` - the path the dispatch names at M tokens and the small-M
  comparison file read by path.

Measurement: ``python -m workbench.bench.moe``; tables and figures of the
committed results: :mod:`workbench.reports.moe_plots`; the paper's blocks:
``python -m workbench.reports.moe``.
"""
from workbench.moe.fused import fused_moe_int4
from workbench.moe.packing import Int4Experts, experts_from_state_dict, quantize_experts, random_int4_experts
from workbench.moe.reference import moe_reference

__all__ = ["Int4Experts", "experts_from_state_dict", "fused_moe_int4", "moe_reference",
           "quantize_experts", "random_int4_experts"]
