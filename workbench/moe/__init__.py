"""INT4 (W4A16) mixture-of-experts for decode shapes.

- :mod:`workbench.moe.packing` - :class:`Int4Experts`, the stacked
  compressed-tensors expert weights the kernel reads (and how they are built
  from a checkpoint's per-expert tensors).
- :mod:`workbench.moe.reference` - dequantise-then-matmul in float32 (CPU or GPU).
- :mod:`workbench.moe.fused` - :func:`fused_moe_int4`, the fused CUDA path with
  the reference as its CPU path.
- :mod:`workbench.moe.bench` - the bandwidth benchmark
  (``python -m workbench.moe.bench --out DIR``) and its analysis helpers.
"""
from workbench.moe.fused import fused_moe_int4
from workbench.moe.packing import Int4Experts, experts_from_state_dict, quantize_experts, random_int4_experts
from workbench.moe.reference import moe_reference

__all__ = ["Int4Experts", "experts_from_state_dict", "fused_moe_int4", "moe_reference",
           "quantize_experts", "random_int4_experts"]
