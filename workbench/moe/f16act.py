"""CPU model of the fp16-activation form of the one-launch MoE kernel (``moe_small_ctasplit_x4eh``).

Two pieces of moe_int4.cu, mirrored here so the CPU tests can check them bit for bit:

- :func:`activations_f16` is ``moe_x_to_f16``: each token's bf16 row scaled by a power of two 2^e that puts its
  largest |x| in [2^14, 2^15) and rounded to fp16. The scaling is exact, and so is the rounding for every
  element of at least 2^-28 of the row's max (bf16's 8 significant bits fit fp16's 11), so the kernel's gate_up
  sums are the bf16 path's times 2^e until its epilogue multiplies by ``xinv`` = 2^-e.
- :func:`weights_f16` / :func:`weights_bf16` are the two nibble extractions of one packed int32 word into the
  four mma A registers (pairs of 16-bit values): bf16 needs three shifts ((w >> 4r) & 0x000F000F | 0x43004300,
  minus 136); fp16 one (w and w >> 8, masks 0x000F000F and 0x00F000F0 | 0x64006400, minus 1032 or times 1/16
  minus 72), because fp16's 10-bit mantissa holds (1024 + 16 u) in place. Both give the same q = u - 8 in the
  same register slots.
"""
from __future__ import annotations

import numpy as np
import torch

E_MIN, E_MAX = -126, 126   # the kernel's clamp: xinv = 2^-e stays a normal float32


def f16_exponent(amax: float) -> int:
    """The power of two e of a token whose largest |x| is ``amax``: amax * 2^e in [2^14, 2^15), clamped to
    [E_MIN, E_MAX]; 0 when amax is 0, inf or NaN."""
    if not np.isfinite(amax) or amax <= 0.0:
        return 0
    _, ex = np.frexp(np.float32(amax))   # amax in [2^(ex - 1), 2^ex)
    return int(min(E_MAX, max(E_MIN, 15 - int(ex))))


def activations_f16(hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden bf16 [M, H] -> (x16 float16 [M, H] = hidden * 2^e, xinv float32 [M] = 2^-e), e per token from
    :func:`f16_exponent` (a row holding inf or NaN keeps e = 0); what ``moe_x_to_f16`` computes."""
    if hidden.dtype != torch.bfloat16 or hidden.dim() != 2:
        raise ValueError(f"hidden must be bf16 [M, H], got {hidden.dtype} {tuple(hidden.shape)}")
    x = hidden.float().cpu()
    finite = torch.isfinite(x).all(dim=1)
    amax = x.abs().amax(dim=1) if x.shape[1] else torch.zeros(x.shape[0])
    e = torch.tensor([f16_exponent(float(a)) if ok else 0 for a, ok in zip(amax.tolist(), finite.tolist())],
                     dtype=torch.int32)
    scale = torch.ldexp(torch.ones(len(e)), e.float())
    x16 = (x * scale[:, None]).to(torch.float16)
    return x16, torch.ldexp(torch.ones(len(e)), (-e).float())


def _pairs(words: np.ndarray, shifts: tuple[int, ...], masks: tuple[int, ...], magic: int) -> np.ndarray:
    w = words.astype(np.uint32)
    regs = [((w >> np.uint32(s)) & np.uint32(mk)) | np.uint32(magic) for s, mk in zip(shifts, masks)]
    return np.stack(regs, axis=-1)   # [..., 4] uint32 registers, each two 16-bit halves


def _halves(regs: np.ndarray, dtype: str) -> np.ndarray:
    lo = (regs & np.uint32(0xFFFF)).astype(np.uint16)
    hi = (regs >> np.uint32(16)).astype(np.uint16)
    if dtype == "bf16":   # bf16 -> float32: the 16 bits are float32's top half
        f = lambda h: (h.astype(np.uint32) << np.uint32(16)).view(np.float32)  # noqa: E731
    else:
        f = lambda h: h.view(np.float16).astype(np.float32)  # noqa: E731
    return np.stack([f(lo), f(hi)], axis=-1)   # [..., 4, 2]


def weights_bf16(words: np.ndarray) -> np.ndarray:
    """The bf16 kernels' registers a0..a3 of each int32 word as float32 [..., 4, 2] (register r = the pair
    (nibble r, nibble r + 4)): nib_pair(w >> 4r) - 136, exact."""
    regs = _pairs(words, (0, 4, 8, 12), (0x000F000F,) * 4, 0x43004300)
    return _halves(regs, "bf16") - 136.0


def weights_f16(words: np.ndarray) -> np.ndarray:
    """The F16 kernels' registers a0..a3 as float32 [..., 4, 2]: (1024 + u) - 1032 for a0 / a2 and
    (1024 + 16 u) / 16 - 72 for a1 / a3 (fp16, every step exact), from w and w >> 8."""
    regs = _pairs(words, (0, 0, 8, 8), (0x000F000F, 0x00F000F0, 0x000F000F, 0x00F000F0), 0x64006400)
    v = _halves(regs, "f16").astype(np.float64)
    v[..., 0, :] -= 1032.0
    v[..., 2, :] -= 1032.0
    v[..., 1, :] = v[..., 1, :] / 16.0 - 72.0
    v[..., 3, :] = v[..., 3, :] / 16.0 - 72.0
    return v.astype(np.float16).astype(np.float32)   # one fp16 rounding, as sub.rn / fma.rn (exact here)
