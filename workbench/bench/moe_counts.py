"""The INT4 MoE benchmark's routing draws and what its floors count (:mod:`workbench.bench.moe`).

- :func:`make_routing` - top-k expert ids (int64 [M, k]) and weights (float32 [M, k]) of M tokens, ``uniform`` or
  ``skewed`` (probability 1 / rank^alpha over a fresh random ranking per draw).
- :func:`distinct_experts`, :func:`bytes_moved`, :func:`flops` - the experts a call touches and the bytes and
  FLOPs of the floor; :func:`plateau_m` - where ms per call stops being flat; :func:`rel_error` - the relative
  Frobenius error a check compares with :data:`REL_TOL`.
"""
from __future__ import annotations

import math

import torch

ROUTINGS = ("uniform", "skewed")
KIMI = {"num_experts": 384, "hidden": 7168, "intermediate": 2048, "topk": 8}
SKEW_ALPHA = 1.0
REL_TOL = 1e-2   # relative Frobenius error a check accepts (tests/tolerances.py holds the tests' bounds)


def make_routing(m: int, num_experts: int, topk: int, kind: str, gen: torch.Generator,
                 alpha: float = SKEW_ALPHA) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_ids int32 [m, topk], topk_weights f32 [m, topk] summing to 1 per token), on the CPU."""
    if topk > num_experts:
        raise ValueError(f"topk {topk} exceeds num_experts {num_experts}")
    if kind == "uniform":
        ids = torch.rand(m, num_experts, generator=gen).topk(topk, dim=1).indices
    elif kind == "skewed":
        perm = torch.randperm(num_experts, generator=gen)
        p = torch.empty(num_experts)
        p[perm] = 1.0 / torch.arange(1, num_experts + 1, dtype=torch.float32) ** alpha
        ids = torch.multinomial(p.expand(m, num_experts), topk, replacement=False, generator=gen)
    else:
        raise ValueError(f"routing must be one of {ROUTINGS}, got {kind!r}")
    w = torch.rand(m, topk, generator=gen) + 0.1
    return ids.to(torch.int32), w / w.sum(1, keepdim=True)


def distinct_experts(topk_ids: torch.Tensor) -> int:
    return int(torch.unique(topk_ids).numel())


def bytes_moved(distinct: int, bytes_per_expert: int, m: int, hidden: int, topk: int) -> int:
    """Fewest bytes a call must move: touched experts' weights + scales, activations in and out, routing."""
    return distinct * bytes_per_expert + 2 * m * hidden * 2 + m * topk * 8


def flops(m: int, topk: int, hidden: int, intermediate: int) -> int:
    """Multiply-adds x 2 of gate_up (2I x H) and down (H x I) for every (token, expert) pair."""
    return 2 * m * topk * 3 * hidden * intermediate


def plateau_m(m_values: list[int], ms: list[float], tol: float = 0.10) -> int | None:
    """Smallest M whose time per token is within ``tol`` of the sweep's lowest time per token.

    This is where time per token stops falling (bigger batches buy < tol). None when
    that M is the largest one swept and time per token still fell by more than ``tol``
    on the way there: the plateau lies beyond the sweep.
    """
    pts = [(m, t / m) for m, t in zip(m_values, ms) if t is not None and math.isfinite(t)]
    if not pts:
        return None
    best = min(v for _, v in pts)
    for idx, (m, v) in enumerate(pts):
        if v <= best * (1 + tol):
            if idx == len(pts) - 1 and idx > 0 and pts[idx - 1][1] > v * (1 + tol):
                return None
            return m
    return None


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (inf when out holds NaN/inf)."""
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("inf")
    return float((o - r).norm() / r.norm().clamp_min(1e-300))
