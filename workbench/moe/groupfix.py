"""CPU model of the group-sum correction of ``moe_small_splitk_s4g`` (workbench/kernels/moe_int4.cu).

The kernel feeds the tensor core the int4 weights as bf16 ``q + 136`` (what the nibble trick gives,
exact) instead of ``q`` and starts each quantisation group's fp32 partial sum from
``-136 * sum(x over the group)``, so the mma returns ``sum(q * x)`` without one subtraction per
weight pair. These functions replay that arithmetic in float32 (and the exact value in float64),
so the cancellation error can be checked without a GPU (tests/test_moe_groupfix.py).
"""
from __future__ import annotations

import torch

OFFSET = 136      # bf16 (128 + u) with u = q + 8: the value the nibble trick puts in an A register
GROUP = 32        # quantisation group (weights per bf16 scale, along K)


def _check_k(x: torch.Tensor) -> int:
    if x.dim() < 1 or x.shape[-1] % GROUP:
        raise ValueError(f"last dimension must be a multiple of {GROUP}, got shape {tuple(x.shape)}")
    return x.shape[-1] // GROUP


def group_sums(x: torch.Tensor) -> torch.Tensor:
    """The kernel's correction terms: float32 [..., K/32] = -136 * (sum of each group of 32 along K).

    x [..., K] (bf16 or float; values taken as float32); the sum is accumulated in float32 in K
    order, one rounding per addition, then multiplied by -136 (one rounding), as the sum tasks do.
    """
    g = _check_k(x)
    xs = x.to(torch.float32).reshape(*x.shape[:-1], g, GROUP)
    s = torch.zeros(xs.shape[:-1], dtype=torch.float32)
    for k in range(GROUP):
        s = s + xs[..., k]
    return s * torch.tensor(-float(OFFSET), dtype=torch.float32)


def corrected_dot(q: torch.Tensor, x: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 [R, N]: the group-sum form's result for weights q [R, K] (integers in [-8, 7]),
    activations x [N, K] (bf16) and scales [R, K/32] (bf16).

    Per group: tmp = -136 * sum(x) + sum((q + 136) * x), accumulated in float32 (the products are
    exact: 8-bit by 8-bit significands), then acc += scale * tmp in float32, groups in K order.
    """
    g = _check_k(q)
    if x.shape[-1] != q.shape[-1] or scales.shape != (q.shape[0], g):
        raise ValueError(f"shapes q {tuple(q.shape)}, x {tuple(x.shape)}, scales {tuple(scales.shape)} "
                         f"do not match (want x [N, K], scales [R, K/32])")
    if q.min() < -8 or q.max() > 7:
        raise ValueError("q must lie in [-8, 7]")
    a = (q.to(torch.float32) + OFFSET).reshape(q.shape[0], 1, g, GROUP)     # exact in bf16 and fp32
    xf = x.to(torch.bfloat16).to(torch.float32)
    xg = xf.reshape(1, x.shape[0], g, GROUP)
    tmp = group_sums(xf).reshape(1, x.shape[0], g).expand(q.shape[0], -1, -1).clone()
    for k in range(GROUP):                                                 # fp32 accumulation, K order
        tmp = tmp + a[..., k] * xg[..., k]
    s = scales.to(torch.float32).reshape(q.shape[0], 1, g)
    acc = torch.zeros(q.shape[0], x.shape[0], dtype=torch.float32)
    for j in range(g):
        acc = acc + s[..., j] * tmp[..., j]
    return acc


def exact_dot(q: torch.Tensor, x: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float64 [R, N]: sum over K of scale * q * x for the bf16 values of x and scales (the exact value)."""
    g = _check_k(q)
    w = q.to(torch.float64).reshape(q.shape[0], g, GROUP) * scales.to(torch.float64).reshape(q.shape[0], g, 1)
    return w.reshape(q.shape[0], -1) @ x.to(torch.bfloat16).to(torch.float64).T
