"""Float32 reference for the routed-expert MoE: dequantise, then matmul.

For each token m and each of its k routed experts e = topk_ids[m, j]:
``gu = x_m @ W_gate_up[e]^T`` (2I outputs: gate then up),
``h = SiLU(gate) * up``, ``y = h @ W_down[e]^T`` (H outputs), and
``out_m = sum_j topk_weights[m, j] * y_j``. Everything in float32 after
dequantising the INT4 weights; tokens routed to the same expert are computed
together (one dequantisation per touched expert).
"""
from __future__ import annotations

import torch

from workbench.moe.packing import Int4Experts


def check_moe_inputs(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                     experts: Int4Experts) -> None:
    """Shape/dtype checks shared by the reference and the fused path (no device sync)."""
    if not isinstance(experts, Int4Experts):
        raise TypeError(f"experts must be an Int4Experts, got {type(experts).__name__}")
    if hidden.dim() != 2 or hidden.shape[1] != experts.hidden:
        raise ValueError(f"hidden must be [M, {experts.hidden}], got {tuple(hidden.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != hidden.shape[0]:
        raise ValueError(f"topk_ids must be [M, k] with M = {hidden.shape[0]}, got {tuple(topk_ids.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_weights {tuple(topk_weights.shape)} must match topk_ids {tuple(topk_ids.shape)}")
    if not topk_weights.is_floating_point():
        raise ValueError(f"topk_weights must be floating point, got {topk_weights.dtype}")
    if hidden.device != topk_ids.device or hidden.device != topk_weights.device:
        raise ValueError("hidden, topk_ids and topk_weights must be on one device")


def check_ids_range(topk_ids: torch.Tensor, num_experts: int) -> None:
    """Raise if an expert id lies outside [0, num_experts) (synchronises on a GPU)."""
    if topk_ids.numel():
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        if lo < 0 or hi >= num_experts:
            raise ValueError(f"topk_ids must lie in [0, {num_experts}), found values in [{lo}, {hi}]")


def moe_reference(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                  experts: Int4Experts) -> torch.Tensor:
    """float32 [M, H]: the routed-expert output, computed on ``hidden``'s device.

    hidden [M, H] (any float dtype), topk_ids [M, k] int, topk_weights [M, k] float.
    """
    check_moe_inputs(hidden, topk_ids, topk_weights, experts)
    check_ids_range(topk_ids, experts.num_experts)
    dev = hidden.device
    x = hidden.float()
    m, k = topk_ids.shape
    out = torch.zeros(m, experts.hidden, dtype=torch.float32, device=dev)
    flat_ids = topk_ids.reshape(-1).long()
    flat_w = topk_weights.reshape(-1).float()
    tokens = torch.arange(m, device=dev).repeat_interleave(k)
    inter = experts.intermediate
    for e in torch.unique(flat_ids).tolist():
        sel = (flat_ids == e).nonzero().squeeze(1)
        tok = tokens[sel]
        w_gu, w_dn = experts.dequantize(e, torch.float32)
        gu = x[tok] @ w_gu.to(dev).T
        h = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        y = h @ w_dn.to(dev).T
        out.index_add_(0, tok, y * flat_w[sel, None])
    return out
