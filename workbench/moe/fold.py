"""The folded dequantisation of run 31 (moe_int4.cu ``frag_gemm`` FOLD), modelled on the CPU.

The kernels turn a nibble u = q + 8 into the bf16 value 128 + u with one LOP3 and, by default, subtract 136 per value
pair. The folded form skips the subtraction: each quantisation group g of a row then contributes
``s_g * sum_k (q_k + 136) x_k = s_g * (q . x)_g + 136 * s_g * S_g`` with ``S_g`` the group's sum of activations, and one
mma per 256-wide stage adds ``sum_g s_g * C_g`` with ``C_g = -136 * S_g`` carried as two bf16 halves (``hi + lo``,
:func:`split_hi_lo`, the kernel's ``fold_pair``). This module computes that sum the same way in float64, so the
split's error can be bounded here rather than discovered on the device.
"""
from __future__ import annotations

import torch

OFFSET = 136.0   # (128 + u) - q with u = q + 8


def split_hi_lo(c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``c`` float32 -> (hi, lo) bfloat16 of the same shape: hi = bf16(c) (round to nearest even), lo = bf16(c - hi)."""
    if c.dtype != torch.float32:
        raise ValueError(f"c must be float32, got {c.dtype}")
    hi = c.to(torch.bfloat16)
    return hi, (c - hi.float()).to(torch.bfloat16)


def folded_matvec(q: torch.Tensor, scale: torch.Tensor, x: torch.Tensor, group: int = 32,
                  split: bool = True) -> torch.Tensor:
    """The folded form's result for weights ``q`` int [R, K] in [-8, 7], bf16 ``scale`` [R, K / group] and bf16
    activations ``x`` [K, N]: float64 [R, N] = sum_g s_g ((q + 136) . x)_g + sum_g s_g (hi_g + lo_g), with
    (hi, lo) = split_hi_lo(-136 x S_g) and S_g the float32 group sums of x (what the kernel's tensor cores add);
    ``split=False`` drops lo (one bf16 per group: what a single-operand fold would carry)."""
    r, k = q.shape
    if k % group or scale.shape != (r, k // group) or x.shape[0] != k or x.dim() != 2:
        raise ValueError(f"need q [R, K], scale [R, K/{group}], x [K, N]; got {tuple(q.shape)}, "
                         f"{tuple(scale.shape)}, {tuple(x.shape)}")
    if int(q.min()) < -8 or int(q.max()) > 7:
        raise ValueError(f"q must lie in [-8, 7], got [{int(q.min())}, {int(q.max())}]")
    s = scale.double()
    xg = x.double().reshape(k // group, group, -1)
    biased = (q.double() + OFFSET).reshape(r, k // group, group)
    part = torch.einsum("rgk,gkn->rgn", biased, xg)                    # per group, before its scale
    sums = x.float().reshape(k // group, group, -1).sum(1)             # S_g [G, N], float32
    hi, lo = split_hi_lo(-OFFSET * sums)
    return torch.einsum("rg,rgn->rn", s, part) + s @ (hi.double() + (lo.double() if split else 0.0))


def direct_matvec(q: torch.Tensor, scale: torch.Tensor, x: torch.Tensor, group: int = 32) -> torch.Tensor:
    """sum_g s_g (q . x)_g in float64: what the folded form must reproduce."""
    r, k = q.shape
    w = q.double().reshape(r, k // group, group) * scale.double().unsqueeze(-1)
    return w.reshape(r, k) @ x.double()
