"""INT4 weight packing in the compressed-tensors ``pack-quantized`` form.

This is the storage form of Kimi K2.x routed experts:

- ``weight_packed``: int32 ``[out, in // 8]``; eight signed 4-bit values per
  int32 along the input dimension, value ``j`` of a word in bits ``4j..4j+3``,
  each stored as ``q + 8`` (unsigned 0..15).
- ``weight_scale``: bf16 ``[out, in // group_size]``; symmetric, no zero point.
- ``weight_shape``: int ``[2]`` = ``(out, in)``.

Dequantised weight = ``q * scale`` with ``q`` in ``[-8, 7]``. Quantisation
follows compressed-tensors' symmetric rule: ``scale = max|w| / 7.5`` per group,
``q = clamp(round(w / scale), -8, 7)``.
"""
from __future__ import annotations

import torch

PACK = 8  # int4 values per int32


def _check_shape(out_f: int, in_f: int, group_size: int) -> None:
    if group_size < 1 or group_size % PACK:
        raise ValueError(f"group_size must be a positive multiple of {PACK}, got {group_size}")
    if in_f % group_size:
        raise ValueError(f"input dimension {in_f} is not a multiple of group_size {group_size}")


def quantize_int4(w: torch.Tensor, group_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``w`` [out, in] (any float dtype) to (weight_packed int32, weight_scale bf16)."""
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight [out, in], got shape {tuple(w.shape)}")
    out_f, in_f = w.shape
    _check_shape(out_f, in_f, group_size)
    if not torch.isfinite(w).all():
        raise ValueError("weight holds NaN or inf; cannot quantise")
    wg = w.detach().float().reshape(out_f, in_f // group_size, group_size)
    scale = (wg.abs().amax(dim=-1) / 7.5).to(torch.bfloat16)
    s = scale.float().clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(-1)
    q = torch.clamp(torch.round(wg / s), -8, 7).to(torch.int32).reshape(out_f, in_f)
    return pack_int4(q), scale


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Pack signed int4 values ``q`` [out, in] (int, in [-8, 7]) into int32 [out, in // 8]."""
    if q.dim() != 2 or q.shape[1] % PACK:
        raise ValueError(f"expected [out, in] with in a multiple of {PACK}, got {tuple(q.shape)}")
    if q.numel() and (q.min() < -8 or q.max() > 7):
        raise ValueError("int4 values must lie in [-8, 7]")
    u = (q.to(torch.int64) + 8).reshape(q.shape[0], -1, PACK)
    shifts = torch.arange(PACK, device=q.device, dtype=torch.int64) * 4
    word = (u << shifts).sum(dim=-1)
    word = torch.where(word >= 2**31, word - 2**32, word)  # two's complement into int32
    return word.to(torch.int32)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: int32 [out, in // 8] -> int8 [out, in] in [-8, 7]."""
    if packed.dtype != torch.int32 or packed.dim() != 2:
        raise ValueError(f"expected int32 [out, in // 8], got {packed.dtype} {tuple(packed.shape)}")
    shifts = torch.arange(PACK, device=packed.device, dtype=torch.int64) * 4
    u = (packed.to(torch.int64).unsqueeze(-1) >> shifts) & 0xF
    return (u - 8).to(torch.int8).reshape(packed.shape[0], -1)


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, shape: tuple[int, int] | torch.Tensor | None = None,
                    group_size: int | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantise to ``dtype`` [out, in]. ``shape`` (weight_shape) is checked when given."""
    q = unpack_int4(packed)
    out_f, in_f = q.shape
    if shape is not None:
        want = tuple(int(x) for x in (shape.tolist() if isinstance(shape, torch.Tensor) else shape))
        if want != (out_f, in_f):
            raise ValueError(f"weight_shape {want} disagrees with weight_packed, which holds {(out_f, in_f)}")
    if scale.dim() != 2 or scale.shape[0] != out_f or in_f % scale.shape[1]:
        raise ValueError(f"weight_scale {tuple(scale.shape)} does not fit a weight of {(out_f, in_f)}")
    g = in_f // scale.shape[1]
    if group_size is not None and g != group_size:
        raise ValueError(f"weight_scale implies group size {g}, config says {group_size}")
    w = q.to(torch.float32).reshape(out_f, -1, g) * scale.to(torch.float32).unsqueeze(-1)
    return w.reshape(out_f, in_f).to(dtype)
