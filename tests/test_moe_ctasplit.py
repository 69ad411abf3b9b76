"""CPU tests of the CTA-split one-launch kernel (moe_small_ctasplit; dispatched at M = 1 on the H200).

The host's split rule and queue depth, the kernel source's constants against the model's, and the
task / queue / ring / barrier / counter protocol replayed by :func:`workbench.moe.ctasplit.simulate_protocol`
under random interleavings (and, as a check that the model can fail, with a queue or a partial-sum
buffer too small for the protocol).
"""
import re

import pytest

from workbench.kernels import KERNEL_DIR
from workbench.moe import ctasplit
from workbench.moe.ctasplit import ctasplit_splits, lookahead, phase_split, simulate_protocol, task_counts
from workbench.moe.fused import SMALL_TABLE, SMALL_VARIANT, SMALL_VARIANTS, splitk_splits


def test_variant_registered_and_dispatched_at_m1():
    """The CTA-split forms stay registered (dispatched at M = 1-2 until run 28) and every registered kernel exists."""
    assert SMALL_VARIANTS["ctasplit"] == ("moe_small_ctasplit", ("cta", "ring"))
    assert SMALL_VARIANTS["ctasplit_max"] == ("moe_small_ctasplit", ("cta", "max"))
    assert SMALL_VARIANTS["ctasplit_g2d1"] == ("moe_small_ctasplit", ("cta", (2, 1)))
    assert SMALL_VARIANTS["ctasplit_x4"] == ("moe_small_ctasplit_x4", ("cta", "ring"))
    assert SMALL_VARIANTS["ctasplit_x4e"] == ("moe_small_ctasplit_x4e", ("cta", "ring"))
    assert SMALL_VARIANT["name"] is None and SMALL_TABLE[-1] == (16, "phased_r3_pdl_gu2")   # since run 33
    src = (KERNEL_DIR / "moe_int4.cu").read_text()   # every registered kernel is defined in the source
    for kernel, _ in SMALL_VARIANTS.values():
        assert re.search(rf"\b{kernel}\(", src) or f"({kernel}," in src, kernel
    with pytest.raises(ValueError, match="CTA-split"):
        splitk_splits(8, 7168, 2048, "ctasplit", 660)


def test_fixed_splits_checked():
    assert ctasplit_splits(7168, 2048, (2, 1)) == (2, 1)
    with pytest.raises(ValueError, match="gate_up split must be 1, 2 or 4"):
        ctasplit_splits(7168, 2048, (3, 1))
    with pytest.raises(ValueError, match="down split must be 1, 2 or 4 and divide 2 stages"):
        ctasplit_splits(7168, 512, (1, 4))


def test_splits_kimi_and_small():
    # Kimi: gate_up 28 stages -> 4 parts of 7; down 8 stages -> 2 parts of 4 (4 parts would leave 2 < 3)
    assert ctasplit_splits(7168, 2048) == (4, 2)
    assert lookahead(7168, 2048, (4, 2)) == 1
    assert task_counts(8, 7168, 2048, (4, 2)) == (2048, 1792)       # M = 1: 8 items
    assert ctasplit_splits(7168, 2048, "max") == (4, 4)
    # the test shapes (H = I = 1024, 4 stages): "ring" -> whole K per warp, "max" -> 1 stage per warp, L = 3
    assert ctasplit_splits(1024, 1024) == (1, 1) and lookahead(1024, 1024, (1, 1)) == 1
    assert ctasplit_splits(1024, 1024, "max") == (4, 4) and lookahead(1024, 1024, (4, 4)) == 3
    assert phase_split(2) == 1 and phase_split(6) == 2 and phase_split(7) == 1 and phase_split(12) == 4


@pytest.mark.parametrize("bad", [(7000, 2048), (7168, 0), (7168, 2048, "fast")])
def test_splits_reject_bad_input(bad):
    with pytest.raises(ValueError):
        ctasplit_splits(*bad)


def test_kernel_constants_match_model():
    src = (KERNEL_DIR / "moe_int4.cu").read_text()
    assert int(re.search(r"#define CS_RS (\d+)", src).group(1)) == ctasplit.RING_STAGES
    assert int(re.search(r"#define CS_Q (\d+)", src).group(1)) == ctasplit.QUEUE
    assert 'extern "C" __global__ void __launch_bounds__(128, 5) moe_small_ctasplit(' in src
    # the queue must hold the task being computed, L ahead, and the one being grabbed, with the overwrite
    # distance the kernel's comment derives (QUEUE >= L + 2 for L <= 3)
    assert ctasplit.QUEUE >= ctasplit.RING_AHEAD + 2


@pytest.mark.parametrize("cfg", [
    dict(items=3, stages_gu=4, stages_dn=4, tiles_gu=8, tiles_dn=8, splits=(1, 1), ctas=3),
    dict(items=2, stages_gu=4, stages_dn=4, tiles_gu=8, tiles_dn=8, splits=(4, 4), ctas=2),      # L = 3
    dict(items=2, stages_gu=28, stages_dn=8, tiles_gu=4, tiles_dn=8, splits=(4, 2), ctas=3),     # Kimi-like
    dict(items=3, stages_gu=4, stages_dn=2, tiles_gu=8, tiles_dn=8, splits=(4, 2), ctas=4, resident=2),
    dict(items=5, stages_gu=2, stages_dn=2, tiles_gu=4, tiles_dn=4, splits=(2, 1), ctas=2),      # L = 3
    dict(items=0, stages_gu=4, stages_dn=4, tiles_gu=8, tiles_dn=8, splits=(1, 1), ctas=2),      # every id invalid
])
@pytest.mark.parametrize("seed", [0, 1])
def test_protocol_clean(cfg, seed):
    res = simulate_protocol(seed=seed, **cfg)
    assert res.finished and res.errors == [], res.errors


@pytest.mark.parametrize("kw,pattern", [({"queue": 4}, "queue entry|slot"), ({"part_buffers": 1}, "partial buffer")])
def test_protocol_model_catches_races(kw, pattern):
    """A queue of 4 (< L + 2 at L = 3) or a single partial-sum buffer must show up as violations."""
    cfg = dict(items=2, stages_gu=4, stages_dn=4, tiles_gu=8, tiles_dn=8, splits=(4, 4), ctas=2)
    seen = []
    for seed in range(4):
        seen += simulate_protocol(seed=seed, max_steps=100_000, **cfg, **kw).errors
    assert any(re.search(pattern, e) for e in seen), seen[:3]


def test_protocol_rejects_bad_split():
    with pytest.raises(ValueError, match="split"):
        simulate_protocol(items=1, stages_gu=6, stages_dn=4, tiles_gu=8, tiles_dn=8, splits=(4, 1), ctas=1)


def test_host_launch_matches_kernel_signature(monkeypatch):
    """fused._fused_small's argument tuple for ctasplit against the kernel's parameter list (CPU: launch mocked)."""
    import torch

    from workbench.moe import fused
    from workbench.moe.packing import random_int4_experts

    src = (KERNEL_DIR / "moe_int4.cu").read_text()
    sig = re.search(r"moe_small_ctasplit\((.*?)\)\s*\{", src, re.S).group(1)
    params = [p.strip().split()[-1].lstrip("*") for p in sig.split(",")]
    assert params[:4] == ["Fgu", "Fdn", "X", "ids"] and params[10:12] == ["sgu", "sdn"]
    seen = {}
    monkeypatch.setattr(fused, "_kernel", lambda name, options=(): name)
    monkeypatch.setattr(fused, "_small_grid", lambda kern, dev, name: 660)
    monkeypatch.setattr(fused, "_ctasplit_workspace", lambda dev, h: torch.zeros(2 + 128 + h // 16, dtype=torch.int32))
    monkeypatch.setattr(fused, "launch", lambda k, grid, block, args: seen.update(k=k, grid=grid, block=block, args=args))
    ex = random_int4_experts(4, 1024, 1024, seed=0)
    saved = fused.SMALL_VARIANT["name"]
    try:
        for variant, splits in (("ctasplit", (1, 1)), ("ctasplit_max", (4, 4))):
            fused.set_small_variant(variant)
            ids = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]], dtype=torch.int32)
            out = torch.empty(1, 1024, dtype=torch.bfloat16)
            fused._fused_small(torch.randn(1, 1024).bfloat16(), ids, torch.full((1, 8), 0.125), ex, out)
            assert seen["k"] == "moe_small_ctasplit" and seen["grid"] == (660,) and seen["block"] == (128,)
            args = dict(zip(params, seen["args"]))
            assert len(seen["args"]) == len(params)
            assert (args["M"], args["topk"], args["E"], args["H"], args["I"]) == (1, 8, 4, 1024, 1024)
            assert (args["sgu"], args["sdn"]) == splits
            assert args["Y"].shape == (8 * 1024,) or args["Y"].numel() == 8 * 1024
            assert args["ws"].numel() == 2 + 128 + 1024 // 16 and args["out"] is out
    finally:
        fused.set_small_variant(saved)


def _warp_acc(stack, e: int, tile: int, tiles: int, nsup: int, s: int, part: int, x):
    """What warp (tile, part) of a CTA task accumulates: the issuer's stages ((e * nsup + part * nper) * tiles + tile)
    * FRAG_STAGE * FRAG_WORDS words on, stride tiles stages, against activations part * nper * 256 on."""
    from workbench.moe.packing import FRAG_STAGE, FRAG_WORDS

    try:
        from tests.test_moe_fragments import emulate_tile
    except ImportError:
        from test_moe_fragments import emulate_tile
    import torch

    flat = stack.reshape(-1)
    nper = nsup // s
    blocks = []
    for k in range(nper):
        base = ((e * nsup + part * nper + k) * tiles + tile) * FRAG_STAGE * FRAG_WORDS
        blocks += [flat[base + q * FRAG_WORDS: base + (q + 1) * FRAG_WORDS] for q in range(FRAG_STAGE)]
    k0 = part * nper * 256
    return emulate_tile(torch.stack(blocks), x[:, k0:k0 + nper * 256]).float()   # [16, 8]


def _lane_frag(acc):
    """The float4 a lane (g, t) stores to the partial-sum buffer: rows g, g + 8 x columns 2t, 2t + 1."""
    return [(acc[g, 2 * t], acc[g, 2 * t + 1], acc[g + 8, 2 * t], acc[g + 8, 2 * t + 1])
            for g in range(8) for t in range(4)]


@pytest.mark.parametrize("s", [2, 4])   # s = 1 is the same indexing with one part (and 4 s of emulation)
def test_epilogue_mapping_gate_up_and_down(s):
    """The epilogue's reduction as moe_small_ctasplit indexes it: buffer entry (r * s + pp) * 32 + lane summed
    over pp for tile grp * (4 / s) + r; gate_up writes h[slot, 8 * tile + g] = SiLU(gate) * up, down writes
    Y[pair, 16 * tile + g (+ 8)] = w * y. Checked against the float64 reference for every tile of the task."""
    import torch

    from workbench.int4 import dequantize_int4
    from workbench.moe.packing import random_int4_experts

    ex = random_int4_experts(3, 1024, 1024, seed=5)
    gu, dn = ex.fragments()
    H = I = 1024
    e, cnt, grp = 2, 3, 1
    ntile = 4 // s
    gen = torch.Generator().manual_seed(s)
    x = torch.randn(8, H, generator=gen).to(torch.bfloat16).double()
    x[cnt:] = x[0]
    for phase, stack, tiles, nsup in (("gu", gu, I // 8, H // 256), ("dn", dn, H // 16, I // 256)):
        buf = [None] * 128
        for w in range(4):
            tile, part = grp * ntile + w // s, w % s
            for lane, v in enumerate(_lane_frag(_warp_acc(stack, e, tile, tiles, nsup, s, part, x))):
                buf[w * 32 + lane] = v
        if phase == "gu":
            wt = dequantize_int4(ex.gate_up_packed[e], ex.gate_up_scale[e], group_size=32).double()
            want = wt @ x[:cnt].T                                                   # [2I, cnt]
        else:
            wt = dequantize_int4(ex.down_packed[e], ex.down_scale[e], group_size=32).double()
            want = wt @ x[:cnt].T                                                   # [H, cnt]
        for r in range(ntile):
            tile = grp * ntile + r
            for lane in range(32):
                g, t = lane // 4, lane % 4
                v = [0.0] * 4
                for pp in range(s):
                    v = [a + b for a, b in zip(v, buf[(r * s + pp) * 32 + lane])]
                for cc in range(2):
                    c = 2 * t + cc
                    if c >= cnt:
                        continue
                    if phase == "gu":   # v[cc] = gate row 8 * tile + g, v[2 + cc] = up row I + 8 * tile + g
                        assert abs(v[cc] - want[8 * tile + g, c]) < 1e-4 * (1 + abs(want[8 * tile + g, c]))
                        assert abs(v[2 + cc] - want[I + 8 * tile + g, c]) < 1e-4 * (1 + abs(want[I + 8 * tile + g, c]))
                    else:               # rows 16 * tile + g and + 8 of the output
                        n0 = 16 * tile + g
                        assert abs(v[cc] - want[n0, c]) < 1e-4 * (1 + abs(want[n0, c]))
                        assert abs(v[2 + cc] - want[n0 + 8, c]) < 1e-4 * (1 + abs(want[n0 + 8, c]))
