"""YaRN rotary embedding in the DeepSeek-V3 form.

``inv_freq`` blends interpolated and extrapolated frequencies with a linear
ramp between the correction dimensions of ``beta_fast`` and ``beta_slow``
(floor/ceil truncated, as DeepSeek-V3 and transformers do). cos/sin carry the
attention factor ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)``
(1 for DeepSeek-V3 and Kimi K2.x); the softmax scale carries
``mscale(factor, mscale_all_dim)^2`` (see ``ModelConfig.softmax_scale``).

``rope_interleave=True`` (DeepSeek checkpoints) rotates interleaved pairs
``(x0, x1), (x2, x3), ...`` and writes the result de-interleaved (all first
components, then all second ones), exactly as transformers does; queries and
keys are permuted alike, so attention scores are those of the interleaved
form. ``rope_interleave=False`` rotates halves (``rotate_half``).
"""
from __future__ import annotations

import math

import torch

from workbench.config import ModelConfig


def _get_mscale(scale: float, mscale: float = 1.0) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies float32 ``[qk_rope_head_dim // 2]`` and the cos/sin attention factor."""
    dim = config.qk_rope_head_dim
    base = config.rope_theta
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim)
    rs = config.rope_scaling
    if rs.type != "yarn":
        return 1.0 / pos_freqs, 1.0
    factor = rs.factor
    if rs.mscale and rs.mscale_all_dim:
        attention_factor = _get_mscale(factor, rs.mscale) / _get_mscale(factor, rs.mscale_all_dim)
    else:
        attention_factor = _get_mscale(factor)
    orig = rs.original_max_position_embeddings

    def corr_dim(rot: float) -> float:
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(corr_dim(rs.beta_fast)), 0)
    high = min(math.ceil(corr_dim(rs.beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1)
    extra = 1 - ramp  # weight of the extrapolated (unscaled) frequency
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
    return inv_freq, float(attention_factor)


class RotaryEmbedding(torch.nn.Module):
    """cos/sin tables on demand: ``forward(positions [N] int64) -> (cos, sin)`` float32 ``[N, rope_dim // 2]``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        # a plain attribute, not a buffer: models are built on the meta device and materialised later
        self.inv_freq, self.attention_factor = yarn_inv_freq(config)
        self.interleave = config.rope_interleave
        self.max_positions = config.yarn_limit

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.numel() and int(positions.max()) >= self.max_positions:
            raise ValueError(f"position {int(positions.max())} is beyond the rope limit of {self.max_positions} "
                             "(YaRN factor x original_max_position_embeddings, capped by max_position_embeddings)")
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq
        return freqs.cos() * self.attention_factor, freqs.sin() * self.attention_factor


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """Rotate ``x`` [..., N, (heads,) rope_dim]; ``cos``/``sin`` [N, rope_dim // 2] broadcast over heads.

    The caller reshapes cos/sin to broadcast (e.g. ``cos[:, None, :]`` for ``x`` [N, H, D]).
    Computed in float32, returned in ``x.dtype``.
    """
    dt = x.dtype
    xf = x.float()
    if interleave:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
    else:
        half = xf.shape[-1] // 2
        x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(dt)
