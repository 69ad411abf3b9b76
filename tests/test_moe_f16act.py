"""CPU tests of the fp16-activation form's two pieces (workbench/moe/f16act.py mirrors moe_int4.cu)."""
import numpy as np
import pytest
import torch

from workbench.moe.f16act import activations_f16, f16_exponent, weights_bf16, weights_f16


def test_weight_extractions_agree_and_give_q():
    rng = np.random.default_rng(0)
    words = rng.integers(0, 2**32, size=4096, dtype=np.uint64).astype(np.uint32)
    a, b = weights_bf16(words), weights_f16(words)
    assert np.array_equal(a, b)
    nib = np.stack([(words >> np.uint32(4 * j)) & np.uint32(15) for j in range(8)], axis=-1).astype(np.float32)
    for r in range(4):   # register r holds (nibble r, nibble r + 4), each minus 8
        assert np.array_equal(b[:, r, 0], nib[:, r] - 8)
        assert np.array_equal(b[:, r, 1], nib[:, r + 4] - 8)


def test_every_nibble_value():
    words = np.array([sum(u << (4 * j) for j in range(8)) for u in range(16)], dtype=np.uint32)
    q = weights_f16(words)
    for u in range(16):
        assert (q[u] == u - 8).all()


@pytest.mark.parametrize("amax,e", [(1.0, 14), (0.999, 15), (2.0**14, 0), (65504.0, -1), (3.0e38, -113),
                                    (1e-30, 114), (1e-40, 126), (0.0, 0), (float("inf"), 0), (float("nan"), 0)])
def test_exponent_rule(amax, e):
    assert f16_exponent(amax) == e
    if e and np.isfinite(amax) and e < 126:
        assert 2.0**14 <= np.float32(amax) * 2.0**e < 2.0**15


def test_activations_exact_over_scales():
    g = torch.Generator().manual_seed(1)
    rows = [torch.randn(512, generator=g) * s for s in (1.0, 1e-30, 1e30, 3e4, 7e4, 1e-6)]
    x = torch.stack(rows).to(torch.bfloat16)
    x16, xinv = activations_f16(x)
    assert torch.isfinite(x16).all()
    back = x16.float() * xinv[:, None]
    big = x.float().abs() >= x.float().abs().amax(dim=1, keepdim=True) * 2.0**-28
    assert torch.equal(back[big], x.float()[big])   # exact wherever fp16 is normal
    assert (x16.float().abs().amax(dim=1) >= 2.0**14).all() and (x16.float().abs().amax(dim=1) < 2.0**15).all()


def test_activations_special_rows():
    x = torch.tensor([[0.0, 0.0], [1.0, float("inf")], [float("nan"), 2.0]], dtype=torch.bfloat16)
    x16, xinv = activations_f16(x)
    assert torch.equal(xinv, torch.ones(3))
    assert x16[0].eq(0).all() and torch.isinf(x16[1, 1]) and torch.isnan(x16[2, 0]) and x16[2, 1] == 2


def test_activations_bad_input():
    with pytest.raises(ValueError, match="bf16"):
        activations_f16(torch.zeros(2, 4))
