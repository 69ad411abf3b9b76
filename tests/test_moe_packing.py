"""CPU tests of the stacked INT4 expert layout and its dequantisation."""
import pytest
import torch

from workbench.int4 import dequantize_int4, quantize_int4
from workbench.bench.moe_peers import dequantize_gpu, to_tinygemm  # noqa: F401  (import check)
from workbench.moe.packing import (Int4Experts, experts_from_state_dict, quantize_experts,
                                   random_int4_experts, stack_experts)


def _float_experts(e=3, h=64, i=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(e, i, h, generator=g), torch.randn(e, i, h, generator=g), torch.randn(e, h, i, generator=g))


def test_quantize_experts_layout_and_dequant():
    wg, wu, wd = _float_experts()
    ex = quantize_experts(wg, wu, wd)
    assert (ex.num_experts, ex.hidden, ex.intermediate) == (3, 64, 32)
    assert ex.gate_up_packed.shape == (3, 64, 8) and ex.gate_up_scale.shape == (3, 64, 2)
    assert ex.down_packed.shape == (3, 64, 4) and ex.down_scale.shape == (3, 64, 1)
    for e in range(3):
        gu, dn = ex.dequantize(e)
        # gate rows first, then up rows, each equal to the per-matrix compressed-tensors dequantisation
        pg, sg = quantize_int4(wg[e])
        pu, su = quantize_int4(wu[e])
        assert torch.equal(gu[:32], dequantize_int4(pg, sg))
        assert torch.equal(gu[32:], dequantize_int4(pu, su))
        # int4 with group 32: within one quantisation step of the float weights
        step = sg.float().repeat_interleave(32, 1)
        assert ((gu[:32] - wg[e]).abs() <= step * 0.55 + 1e-6).all()
        assert dn.shape == (64, 32)


def test_vectorised_dequant_matches_int4_module():
    ex = random_int4_experts(2, 128, 64, seed=3)
    for e in range(2):
        want = dequantize_int4(ex.gate_up_packed[e], ex.gate_up_scale[e])
        assert torch.equal(dequantize_gpu(ex.gate_up_packed[e], ex.gate_up_scale[e], torch.float32), want)


def test_state_dict_round_trip():
    wg, wu, wd = _float_experts(e=2)
    sd = {}
    for e in range(2):
        for name, w in (("gate_proj", wg[e]), ("up_proj", wu[e]), ("down_proj", wd[e])):
            p, s = quantize_int4(w)
            base = f"model.layers.1.mlp.experts.{e}.{name}"
            sd[f"{base}.weight_packed"], sd[f"{base}.weight_scale"] = p, s
            sd[f"{base}.weight_shape"] = torch.tensor(list(w.shape))
    ex = experts_from_state_dict(sd, "model.layers.1.mlp.experts", 2)
    ref = quantize_experts(wg[:2], wu[:2], wd[:2])
    assert torch.equal(ex.gate_up_packed, ref.gate_up_packed) and torch.equal(ex.down_scale, ref.down_scale)
    bad = dict(sd)
    bad["model.layers.1.mlp.experts.0.down_proj.weight_shape"] = torch.tensor([64, 16])
    with pytest.raises(ValueError, match="weight_shape"):
        experts_from_state_dict(bad, "model.layers.1.mlp.experts", 2)
    with pytest.raises(ValueError, match="lacks"):
        experts_from_state_dict(sd, "model.layers.1.mlp.experts", 3)


def test_bad_layouts_raise():
    ex = random_int4_experts(2, 64, 32)
    with pytest.raises(ValueError, match="down_packed"):
        Int4Experts(ex.gate_up_packed, ex.gate_up_scale, ex.down_packed[:, :8], ex.down_scale)
    with pytest.raises(ValueError, match="int32"):
        Int4Experts(ex.gate_up_packed.float(), ex.gate_up_scale, ex.down_packed, ex.down_scale)
    with pytest.raises(ValueError, match="group_size"):
        Int4Experts(ex.gate_up_packed, ex.gate_up_scale, ex.down_packed, ex.down_scale, group_size=64)
    with pytest.raises(ValueError, match="same non-zero"):
        stack_experts([], [], [])
    with pytest.raises(ValueError, match="multiples"):
        random_int4_experts(2, 60, 32)


def test_bytes_per_expert_kimi_formula():
    ex = random_int4_experts(1, 512, 256)
    h, i = 512, 256
    assert ex.bytes_per_expert() == 3 * h * i // 2 + 3 * h * i // 32 * 2
