"""CPU tests of the fragment layout the small-M kernels read (workbench.moe.packing.fragment_pack).

Besides the round trip, ``emulate_tile`` replays what one warp of the kernel does with a
(tile, step) block: the LOP3 extraction of mma A registers, the activation words it feeds as B,
the m16n8k16 fragment semantics (PTX ISA: A reg r holds row g + 8 (r & 1), k 2t + 8 (r >> 1) + {0, 1};
B reg r holds k 2t + 8r + {0, 1} of column g; C c holds row g + 8 (c >> 1), column 2t + (c & 1)),
the -136 offset and the per-group fp32 scaling; it must equal the dequantised matrix times x.
"""
import pytest
import torch

from workbench.int4 import dequantize_int4
from workbench.moe.packing import (FRAG_STAGE, FRAG_WORDS, Int4Experts, fragment_dequantize, fragment_pack,
                                   fragment_stages, random_int4_experts)


def with_fragments(ex: Int4Experts) -> Int4Experts:
    """The same experts, held in the fragment layout (on the CPU the packed one is the default)."""
    return Int4Experts(*ex.packed(), layout="fragments")


def tile_major(stage_major: torch.Tensor) -> torch.Tensor:
    """One expert's stage-major fragments [K/256, R/16, 4, 144] -> [R/16, K/64, 144] (fragment_pack's order)."""
    ns, nt = stage_major.shape[:2]
    return stage_major.permute(1, 0, 2, 3).reshape(nt, ns * FRAG_STAGE, FRAG_WORDS)


def _bf16_bits(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF


def _bits_bf16(b: torch.Tensor) -> torch.Tensor:
    b = torch.where(b >= 2**15, b - 2**16, b).to(torch.int16)
    return b.view(torch.bfloat16).to(torch.float64)


def emulate_tile(frag_tile: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """frag_tile int32 [K/64, 144] (one tile), x [8, K] -> [16, 8] float64 as the kernel computes it."""
    acc = torch.zeros(16, 8, dtype=torch.float64)
    xb = _bf16_bits(x)                                        # [8 columns, K]
    for s in range(frag_tile.shape[0]):
        words = frag_tile[s, :128].to(torch.int64) & 0xFFFFFFFF
        sw = frag_tile[s, 128:].to(torch.int64) & 0xFFFFFFFF
        for gr in range(2):
            tmp = torch.zeros(16, 8, dtype=torch.float64)
            for h in range(2):
                A = torch.zeros(16, 16, dtype=torch.float64)
                B = torch.zeros(16, 8, dtype=torch.float64)
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    word = int(words[4 * lane + 2 * gr + h])
                    for r in range(4):
                        reg = ((word >> (4 * r)) & 0x000F000F) | 0x43004300
                        row, k = g + 8 * (r & 1), 2 * t + 8 * (r >> 1)
                        A[row, k] = _bits_bf16(torch.tensor(reg & 0xFFFF)) - 136
                        A[row, k + 1] = _bits_bf16(torch.tensor(reg >> 16)) - 136
                    kb = 64 * s + 32 * gr + 8 * t + 4 * h      # B words as loaded: x[kb..kb+3] of column g
                    for r in range(2):
                        B[2 * t + 8 * r, g] = _bits_bf16(xb[g, kb + 2 * r])
                        B[2 * t + 8 * r + 1, g] = _bits_bf16(xb[g, kb + 2 * r + 1])
                tmp += A @ B
            for g in range(8):
                word = int(sw[2 * g + gr])
                acc[g] += _bits_bf16(torch.tensor(word & 0xFFFF)) * tmp[g]
                acc[g + 8] += _bits_bf16(torch.tensor(word >> 16)) * tmp[g + 8]
    return acc


def test_fragment_roundtrip_gate_up_and_down():
    ex = random_int4_experts(2, 128, 64, seed=3)
    for e in range(2):
        gu = fragment_pack(ex.gate_up_packed[e], ex.gate_up_scale[e], gate_up=True)
        assert gu.shape == (128 // 16, 128 // 64, FRAG_WORDS) and gu.dtype == torch.int32
        assert torch.equal(fragment_dequantize(gu, gate_up=True),
                           dequantize_int4(ex.gate_up_packed[e], ex.gate_up_scale[e], group_size=32))
        dn = fragment_pack(ex.down_packed[e], ex.down_scale[e])
        assert torch.equal(fragment_dequantize(dn), dequantize_int4(ex.down_packed[e], ex.down_scale[e], group_size=32))


@pytest.mark.parametrize("gate_up", [False, True])
def test_kernel_fragment_arithmetic(gate_up):
    ex = random_int4_experts(1, 128, 32, seed=5)    # gate_up [64, 128] (K = 128: two steps), down [128, 32]
    packed, scale = ex.gate_up_packed[0], ex.gate_up_scale[0]
    frag = fragment_pack(packed, scale, gate_up=gate_up)
    w = dequantize_int4(packed, scale, group_size=32).double()
    x = torch.randn(8, 128, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).double()
    tile = 1
    rows = torch.arange(16 * tile, 16 * tile + 16)
    if gate_up:   # tile j = gate rows 8j..8j+7, then up rows 8j..8j+7 (I = 32)
        rows = torch.cat([torch.arange(8 * tile, 8 * tile + 8), 32 + torch.arange(8 * tile, 8 * tile + 8)])
    got = emulate_tile(frag[tile], x)
    want = w[rows] @ x.T
    assert torch.allclose(got, want, rtol=1e-9, atol=1e-9)


def test_fragments_made_once_at_construction_replace_the_packed_form_and_round_trip_bit_for_bit():
    """The fragment layout is made when the experts are built and is the only copy held (the packed tensors are
    converted as read, not kept; nbytes equals the packed form's); dequantised back it equals the compressed-tensors
    weights, bit for bit, for every expert and both matrices."""
    src = random_int4_experts(2, 256, 512, seed=1)
    ex = with_fragments(src)
    gu, dn = ex.fragments()
    assert gu.shape == (2, 1, 1024 // 16, FRAG_STAGE, FRAG_WORDS) and dn.shape == (2, 2, 256 // 16, FRAG_STAGE, FRAG_WORDS)
    assert ex.fragments()[0] is gu and ex.layout == "fragments"
    assert ex.gate_up_packed is None and ex.down_scale is None
    with pytest.raises(ValueError, match="converted when they were read"):
        ex.packed()
    packed_bytes = sum(t.numel() * t.element_size() for t in src.packed())
    assert ex.nbytes == gu.numel() * 4 + dn.numel() * 4 == packed_bytes
    assert ex.bytes_per_expert() == src.bytes_per_expert()
    for e in range(2):
        w_gu, w_dn = src.dequantize(e)
        assert torch.equal(fragment_dequantize(tile_major(gu[e]), gate_up=True), w_gu)
        assert torch.equal(fragment_dequantize(tile_major(dn[e])), w_dn)
        f_gu, f_dn = ex.dequantize(e)
        assert torch.equal(f_gu, w_gu) and torch.equal(f_dn, w_dn)
    view = Int4Experts.from_fragments(gu, dn)
    assert view.gate_up_frag is gu and (view.num_experts, view.hidden, view.intermediate) == (2, 256, 512)
    assert view.to("cpu").layout == "fragments"


def test_cpu_experts_hold_the_packed_layout_and_say_so():
    ex = random_int4_experts(2, 256, 256, seed=1)
    assert ex.layout == "packed"
    assert ex.nbytes == sum(t.numel() * t.element_size() for t in ex.packed()) == ex.num_experts * ex.bytes_per_expert()
    with pytest.raises(ValueError, match="no fragment layout"):
        ex.fragments()
    with pytest.raises(AttributeError):
        ex.down_scale = ex.down_scale * 2     # frozen
    with pytest.raises(ValueError, match="layout must be one of"):
        Int4Experts(*ex.packed(), layout="tiles")
    with pytest.raises(ValueError, match="down_frag has shape"):
        f = with_fragments(ex)
        Int4Experts.from_fragments(f.gate_up_frag, f.down_frag[:, :, :4])


def test_fragment_layout_needs_stage_multiples():
    ex = random_int4_experts(1, 128, 64, seed=0)
    with pytest.raises(ValueError, match="multiple"):
        with_fragments(ex)


@pytest.mark.parametrize("gate_up", [False, True])
def test_kernel_stage_addressing(gate_up):
    """The small-M kernels' reads of the stack: the stage of (expert, 256-K stage j, tile) starts at
    uint4 ((e * nsup + j) * tiles + tile) * 144, is copied as uint4 lane + 32 i (i < 4) and 128 + lane
    (lane < 16), and block q of it (64-K step 4 j + q) at uint4 36 q: the blocks gathered this way, run
    through the kernel's arithmetic, give W x."""
    copied = sorted([lane + 32 * i for lane in range(32) for i in range(4)] + [128 + lane for lane in range(16)])
    assert copied == list(range(FRAG_STAGE * FRAG_WORDS // 4))
    src = random_int4_experts(3, 512, 256, seed=11)
    ex = with_fragments(src)
    gu, dn = ex.fragments()
    stack = gu if gate_up else dn
    rows, k = (512, 512) if gate_up else (512, 256)
    packed, scale = (src.gate_up_packed[1], src.gate_up_scale[1]) if gate_up else (src.down_packed[1], src.down_scale[1])
    w = dequantize_int4(packed, scale, group_size=32).double()
    flat = stack.reshape(-1)
    e, tile, tiles, nsup = 1, 5, rows // 16, k // 256
    blocks = []
    for j in range(nsup):
        base = ((e * nsup + j) * tiles + tile) * FRAG_STAGE * FRAG_WORDS
        for q in range(FRAG_STAGE):
            blocks.append(flat[base + q * FRAG_WORDS: base + (q + 1) * FRAG_WORDS])
    x = torch.randn(8, k, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).double()
    got = emulate_tile(torch.stack(blocks), x)
    r = torch.arange(16 * tile, 16 * tile + 16)
    if gate_up:
        r = torch.cat([torch.arange(8 * tile, 8 * tile + 8), 256 + torch.arange(8 * tile, 8 * tile + 8)])
    assert torch.allclose(got, w[r] @ x.T, rtol=1e-9, atol=1e-9)


def test_fragment_stages_rejects_bad_k():
    ex = random_int4_experts(1, 128, 32, seed=0)
    with pytest.raises(ValueError, match="multiple of 256"):
        fragment_stages(fragment_pack(ex.gate_up_packed[0], ex.gate_up_scale[0], gate_up=True))


def test_fragment_pack_rejects_bad_shapes():
    ex = random_int4_experts(1, 64, 32, seed=0)
    with pytest.raises(ValueError, match="multiple of 64"):
        fragment_pack(ex.gate_up_packed[0][:, :4], ex.gate_up_scale[0][:, :1])
    with pytest.raises(ValueError, match="scale"):
        fragment_pack(ex.down_packed[0], ex.down_scale[0][:, :0])
    with pytest.raises(ValueError, match="int32"):
        fragment_dequantize(torch.zeros(1, 1, 10, dtype=torch.int32))
