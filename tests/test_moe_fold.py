"""Run 31's folded dequantisation (workbench.moe.fold), on the CPU: the hi/lo split and its error against the direct
dequantised product, for centred and for offset activations."""
import pytest
import torch

from workbench.moe.fold import direct_matvec, folded_matvec, split_hi_lo


def _case(seed: int, mean: float, k: int = 7168, r: int = 16, n: int = 8):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-8, 8, (r, k), generator=g)
    scale = (torch.rand(r, k // 32, generator=g) * 0.02 + 0.001).to(torch.bfloat16)
    x = (torch.randn(k, n, generator=g) + mean).to(torch.bfloat16)
    return q, scale, x


def test_split_hi_lo_carries_16_bits():
    c = torch.randn(10000, generator=torch.Generator().manual_seed(0)) * 1e3
    hi, lo = split_hi_lo(c)
    err = (hi.double() + lo.double() - c.double()).abs()
    assert (err <= c.double().abs() * 2.0 ** -16).all()
    assert torch.equal(hi, c.to(torch.bfloat16))   # hi alone is the ordinary rounding
    with pytest.raises(ValueError, match="float32"):
        split_hi_lo(c.double())


@pytest.mark.parametrize("mean", [0.0, 2.0])
def test_folded_matches_direct(mean):
    """The folded sum within 1e-3 of the direct one by norm (the kernels' output tolerance is 1e-2; the bf16
    rounding of the output alone is ~2e-3), also with every activation offset by 2 (group sums ~64x larger)."""
    q, scale, x = _case(1, mean)
    a, b = folded_matvec(q, scale, x), direct_matvec(q, scale, x)
    rel = float((a - b).norm() / b.norm())
    assert rel <= 1e-3, rel
    # and the split matters: hi alone (8 bits of each correction) is over 10x further off
    rel_hi = float((folded_matvec(q, scale, x, split=False) - b).norm() / b.norm())
    assert rel_hi > 10 * rel, (rel_hi, rel)


def test_folded_refuses_bad_shapes():
    q, scale, x = _case(2, 0.0, k=256)
    with pytest.raises(ValueError, match="scale"):
        folded_matvec(q, scale[:, :4], x)
    with pytest.raises(ValueError, match=r"\[-8, 7\]"):
        folded_matvec(q + 9, scale, x)
