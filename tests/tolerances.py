"""Per-tensor tolerances and the parity check every kernel test uses (FlashMLA's tests are the model).

:data:`TOLERANCES` names each compared tensor's absolute, relative and
cosine-similarity bounds in one place; :func:`assert_close` checks every
element, prints the worst errors, and fails on NaN. Integer outputs are
compared bit for bit with :func:`assert_equal`.
"""
from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class Tol:
    atol: float
    rtol: float
    min_cos: float


# name -> bounds. The reference is float32/float64; the kernel's output dtype sets the bound.
TOLERANCES: dict[str, Tol] = {
    "moe_bf16": Tol(atol=3e-2, rtol=2e-2, min_cos=0.9999),            # fused INT4 MoE out, bf16 [M, H], both
    # divided by the reference's RMS: h is rounded to bf16 between the two GEMMs, so every element's error scales
    # with the output's size, not its own; atol leaves several sigma of that rounding over ~10^7 elements
    "verify_bf16": Tol(atol=1e-2, rtol=2e-2, min_cos=0.99995),        # verify attention out, bf16 [T, h, 512]
    "verify_fp32": Tol(atol=1e-4, rtol=1e-4, min_cos=0.9999999),      # verify attention out, float32
    "verify_lse_bf16": Tol(atol=2e-3, rtol=0.0, min_cos=0.9999999),   # verify log-sum-exp (float32) from bf16 inputs
    "verify_lse_fp32": Tol(atol=1e-5, rtol=1e-6, min_cos=0.9999999),  # verify log-sum-exp, float32 inputs
    "logits_fp32": Tol(atol=1e-4, rtol=1e-4, min_cos=0.9999999),      # engine logits vs transformers, float32
    "logits_bf16": Tol(atol=5e-2, rtol=5e-2, min_cos=0.999),          # engine logits, bf16 model
}


def assert_close(name: str, out: torch.Tensor, ref: torch.Tensor, tol: Tol | None = None) -> dict:
    """Every element of ``out`` within ``atol + rtol * |ref|`` of ``ref`` and cosine >= ``min_cos``.

    Returns the worst errors (also printed, shown by pytest on failure)."""
    tol = tol or TOLERANCES[name]
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    assert not torch.isnan(o).any(), f"{name}: NaN in the output"
    err = (o - r).abs()
    bound = tol.atol + tol.rtol * r.abs()
    cos = torch.nn.functional.cosine_similarity(o.flatten(), r.flatten(), dim=0).item() if r.numel() else 1.0
    worst = int(torch.argmax(err - bound)) if r.numel() else 0
    stats = {"max_abs": float(err.max()) if r.numel() else 0.0,
             "max_rel": float((err / r.abs().clamp_min(1e-12)).max()) if r.numel() else 0.0,
             "cos": cos, "worst_index": worst, "bad": int((err > bound).sum())}
    print(f"{name}: {stats}")
    assert stats["bad"] == 0, (f"{name}: {stats['bad']} of {r.numel()} elements outside atol {tol.atol} + rtol "
                               f"{tol.rtol}; worst at flat index {worst}: out {o.flatten()[worst]:.6g} "
                               f"ref {r.flatten()[worst]:.6g}")
    assert cos >= tol.min_cos, f"{name}: cosine similarity {cos:.8f} < {tol.min_cos}"
    return stats


def assert_equal(name: str, out, ref) -> None:
    """Integer outputs: equal bit for bit, with the first mismatch named."""
    o, r = torch.as_tensor(out).cpu(), torch.as_tensor(ref).cpu()
    assert o.shape == r.shape, f"{name}: shape {tuple(o.shape)} != reference {tuple(r.shape)}"
    diff = (o != r).nonzero()
    assert diff.numel() == 0, f"{name}: {diff.shape[0]} mismatches, first at {diff[0].tolist()}: {o[tuple(diff[0])]} != {r[tuple(diff[0])]}"
