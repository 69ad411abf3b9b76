"""CPU tests of the float32 MoE reference, the CPU path of fused_moe_int4, what it dispatches (moe_plan) and the
bench's analysis helpers."""
import json

import pytest
import torch

from workbench import DATA_DIR
from workbench.bench.moe_counts import bytes_moved, distinct_experts, flops, make_routing, plateau_m, rel_error
from workbench.bench.moe_peers import dequantize_gpu, group_pairs, peer_moe
from workbench.dispatch import dispatch_for
from workbench.kernels import KERNEL_DIR
from workbench.moe import fused_moe_int4, moe_reference, random_int4_experts
from workbench.moe.fused import (FOUR_LAUNCH, FRAG_VARIANTS, LARGE_VARIANTS, SMALL_KERNELS, large_variant, max_work_items,
                                 moe_plan, variant_name)

H200 = dispatch_for("NVIDIA H200")

SRC = (KERNEL_DIR / "moe_int4.cu").read_text()


def _naive(x, ids, w, ex):
    out = torch.zeros(x.shape[0], ex.hidden)
    for m in range(x.shape[0]):
        for j in range(ids.shape[1]):
            gu, dn = ex.dequantize(int(ids[m, j]))
            a = gu @ x[m].float()
            h = torch.nn.functional.silu(a[:ex.intermediate]) * a[ex.intermediate:]
            out[m] += float(w[m, j]) * (dn @ h)
    return out


def test_reference_matches_token_by_token_loop():
    ex = random_int4_experts(6, 64, 32, seed=1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 64, generator=g).bfloat16()
    ids, w = make_routing(5, 6, 3, "uniform", g)
    ids[1] = ids[0]  # shared experts across tokens
    ref = moe_reference(x, ids, w, ex)
    assert ref.dtype == torch.float32 and ref.shape == (5, 64)
    torch.testing.assert_close(ref, _naive(x, ids, w, ex), rtol=1e-5, atol=1e-5)


def test_cpu_fused_path_is_reference_in_bf16():
    ex = random_int4_experts(8, 256, 64, seed=2)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 256, generator=g).bfloat16()
    ids, w = make_routing(4, 8, 2, "skewed", g)
    out = fused_moe_int4(x, ids, w, ex)
    assert out.dtype == torch.bfloat16 and out.shape == (4, 256)
    assert rel_error(out, moe_reference(x, ids, w, ex)) < 1e-2


def test_peer_loop_matches_reference():
    ex = random_int4_experts(8, 64, 32, seed=4)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 64, generator=g).bfloat16()
    ids, w = make_routing(6, 8, 3, "uniform", g)
    gu = lambda e, xx: xx.float() @ dequantize_gpu(ex.gate_up_packed[e], ex.gate_up_scale[e], torch.float32).T
    dn = lambda e, h: h @ dequantize_gpu(ex.down_packed[e], ex.down_scale[e], torch.float32).T
    out = peer_moe(x, group_pairs(ids, w), gu, dn, ex.intermediate)
    assert rel_error(out, moe_reference(x, ids, w, ex)) < 1e-2


def test_bad_inputs_raise():
    ex = random_int4_experts(4, 64, 32)
    x = torch.randn(2, 64).bfloat16()
    ids = torch.tensor([[0, 1], [2, 3]])
    w = torch.ones(2, 2)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        fused_moe_int4(x, torch.tensor([[0, 4], [1, 2]]), w, ex)
    with pytest.raises(ValueError, match="hidden must be"):
        fused_moe_int4(torch.randn(2, 32).bfloat16(), ids, w, ex)
    with pytest.raises(ValueError, match="bf16"):
        fused_moe_int4(x.float(), ids, w, ex)
    with pytest.raises(ValueError, match="topk_weights"):
        fused_moe_int4(x, ids, torch.ones(2, 3), ex)
    with pytest.raises(ValueError, match="int32 or int64"):
        fused_moe_int4(x, ids.float(), w, ex)


def test_routing_and_counting():
    g = torch.Generator().manual_seed(0)
    for kind in ("uniform", "skewed"):
        ids, w = make_routing(64, 384, 8, kind, g)
        assert ids.shape == (64, 8) and ids.dtype == torch.int32
        assert all(len(set(r.tolist())) == 8 for r in ids)  # distinct experts per token
        torch.testing.assert_close(w.sum(1), torch.ones(64))
    u = [distinct_experts(make_routing(16, 384, 8, "uniform", g)[0]) for _ in range(20)]
    s = [distinct_experts(make_routing(16, 384, 8, "skewed", g)[0]) for _ in range(20)]
    assert sum(s) < sum(u)  # skew concentrates the load
    with pytest.raises(ValueError, match="routing"):
        make_routing(1, 8, 2, "zipf", g)
    # Kimi: one expert = 3 x 7168 x 2048 / 2 bytes + scales; M=1 touches 8
    bpe = 3 * 7168 * 2048 // 2 + 3 * 7168 * 2048 // 32 * 2
    assert bytes_moved(8, bpe, 1, 7168, 8) == 8 * bpe + 4 * 7168 + 64
    assert flops(1, 8, 7168, 2048) == 2 * 8 * 3 * 7168 * 2048


def test_plateau_and_work_item_bound():
    ms = [1.0, 1.1, 1.3, 2.0, 4.0, 8.1]
    assert plateau_m([1, 2, 4, 8, 16, 32], ms) == 8   # 2.0 / 8 = 0.25 ms/token is already the lowest
    assert plateau_m([1, 2], [float("nan"), 1.0]) == 2          # NaN points are skipped
    assert plateau_m([1, 2, 4], [1.0, 1.0, 1.0]) is None       # still falling at the largest M swept
    assert plateau_m([1, 2, 4, 8], [1.0, 2.0, 4.0, 8.1]) == 1  # flat per token from the start
    assert H200.moe_large_variant(1)[0] == 1 and H200.moe_large_variant(1024)[0] == 4
    g = torch.Generator().manual_seed(5)
    for m in (1, 3, 16, 100, 1024):
        for kind in ("uniform", "skewed"):
            ids, _ = make_routing(m, 384, 8, kind, g)
            counts = torch.bincount(ids.reshape(-1).long(), minlength=384)
            chunk = 8 * H200.moe_large_variant(m)[0]
            need = int(((counts + chunk - 1) // chunk).sum())
            assert need <= max_work_items(m * 8, 384, chunk)


def test_every_kernel_in_the_tables_is_compiled_and_nothing_else_is():
    """fused's tables name exactly the entry points of moe_int4.cu, and every dispatch file names only those."""
    for var in LARGE_VARIANTS:
        nt, rt, d, s, line = var
        tag = variant_name(var).split("_")[-1]
        assert f"MOE_INSTANCE({nt}, {rt}, {d}, {s}, {'true' if line else 'false'}, {tag})" in SRC
    assert SRC.count("MOE_INSTANCE(") - 1 == len(LARGE_VARIANTS)          # minus the macro's definition
    for gu, dn, _ in SMALL_KERNELS.values():
        assert f"MOE_PHASED_KERNELS({gu}, {dn}," in SRC
    assert SRC.count("MOE_PHASED_KERNELS(") - 1 == len(SMALL_KERNELS)
    for nt in FRAG_VARIANTS.values():
        assert f"MOE_FRAG_INSTANCE({nt})" in SRC
    assert SRC.count("MOE_FRAG_INSTANCE(") - 1 == len(FRAG_VARIANTS)
    for path in sorted((DATA_DIR / "dispatch").glob("*.json")):
        raw = json.loads(path.read_text())
        assert {k for _, k in raw["moe_small"]} <= set(SMALL_KERNELS), path.name
        assert {tuple(v) for _, v in raw["moe_large"]} <= set(LARGE_VARIANTS), path.name
        assert {f"frag_nt{nt}" for _, nt in raw["moe_large_frag"]} <= set(FRAG_VARIANTS), path.name


def test_moe_plan_follows_the_dispatch_data():
    plan = lambda m, **kw: moe_plan(m, 8, "cuda", dispatch=H200, **kw)   # noqa: E731
    for m, (max_m, kern) in [(1, H200.moe_small[0]), (2, H200.moe_small[1]), (16, H200.moe_small[-1])]:
        p = plan(m)
        assert p["path"] == "small" and p["kernel"] == kern and p["launches"] == list(SMALL_KERNELS[kern][:2])
    # on the H200 the experts are held in the fragment layout: beyond the small-M range its four-launch variants run
    assert plan(1)["layout"] == "fragments"
    p = plan(17)
    frag = f"frag_nt{H200.moe_large_frag_nt(17)}"
    assert p["path"] == FOUR_LAUNCH and p["kernel"] == f"{FOUR_LAUNCH}:{frag}" and p["variant"] is None
    assert p["launches"] == ["moe_align", f"moe_gate_up_{frag}", f"moe_down_{frag}", "moe_combine"]
    assert plan(1, kernel=FOUR_LAUNCH)["kernel"] == f"four_launch:frag_nt{H200.moe_large_frag_nt(1)}"
    assert plan(1, kernel=FOUR_LAUNCH)["forced"]
    assert plan(300, kernel="frag_nt4")["launches"][1] == "moe_gate_up_frag_nt4"
    assert plan(300, kernel="frag_nt4")["nt"] == 4 and p["nt"] == H200.moe_large_frag_nt(17)   # work items of 8 NT
    # packed experts (the layout elsewhere, or asked for): the packed variants, no small-M kernel
    p = plan(17, layout="packed")
    assert p["path"] == FOUR_LAUNCH and p["variant"] == H200.moe_large_variant(17)
    assert p["launches"] == ["moe_align", f"moe_gate_up_{variant_name(p['variant'])}",
                             f"moe_down_{variant_name(p['variant'])}", "moe_combine"]
    assert plan(1, layout="packed")["variant"] == H200.moe_large_variant(1)
    assert plan(4, kernel=(4, 2, 2, 0, 0), layout="packed")["kernel"] == "four_launch:nt4_rt2_d2"
    assert plan(4, kernel=(4, 2, 2, 0, 0), layout="packed")["nt"] == 4
    generic = dispatch_for("a GPU without a table")
    assert generic.generic and moe_plan(1, 8, "cuda", dispatch=generic)["path"] == FOUR_LAUNCH
    cpu = moe_plan(3, 8, "cpu")
    assert cpu["impl"] == "torch" and cpu["kernel"] == "moe_reference" and cpu["launches"] == []
    assert plan(3, impl="torch")["impl"] == "torch"


def test_moe_plan_refuses_what_cannot_run():
    with pytest.raises(ValueError, match="unknown MoE kernel 'phased_r9'"):
        moe_plan(1, 8, "cuda", kernel="phased_r9", dispatch=H200)
    with pytest.raises(ValueError, match="at most 128"):
        moe_plan(17, 8, "cuda", kernel="phased_r2_pdl", dispatch=H200)
    with pytest.raises(ValueError, match="four-launch variant must be one of"):
        moe_plan(1, 8, "cuda", kernel=(1, 1, 4, 0, 0), dispatch=H200, layout="packed")
    with pytest.raises(ValueError, match="reads the packed layout; these experts hold the fragment layout"):
        moe_plan(1, 8, "cuda", kernel=(1, 2, 2, 0, 0), dispatch=H200)
    with pytest.raises(ValueError, match="reads the fragment layout; these experts hold the packed layout"):
        moe_plan(1, 8, "cuda", kernel="phased_r2_pdl", dispatch=H200, layout="packed")
    with pytest.raises(ValueError, match="layout must be one of"):
        moe_plan(1, 8, "cuda", dispatch=H200, layout="tiles")
    with pytest.raises(ValueError, match="impl='cuda' needs CUDA tensors"):
        moe_plan(1, 8, "cpu", impl="cuda")
    with pytest.raises(ValueError, match="impl must be one of"):
        moe_plan(1, 8, "cpu", impl="triton")
    with pytest.raises(ValueError, match="torch reference takes none"):
        moe_plan(1, 8, "cpu", kernel="phased_r2_pdl")
    # a whole-line variant needs H and I multiples of 1024; the register-prefetch form runs instead
    assert large_variant((1, 2, 0, 2, 1), 512, 512) == (1, 2, 2, 0, 0)
    assert large_variant((1, 2, 0, 2, 1), 7168, 2048) == (1, 2, 0, 2, 1)


def test_fused_on_cpu_runs_the_reference_and_refuses_cuda_kernels():
    ex = random_int4_experts(4, 64, 32, seed=6)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 64, generator=g).bfloat16()
    ids, w = make_routing(3, 4, 2, "uniform", g)
    ref = moe_reference(x, ids, w, ex).to(torch.bfloat16)
    assert torch.equal(fused_moe_int4(x, ids, w, ex), ref)
    assert torch.equal(fused_moe_int4(x, ids, w, ex, impl="torch"), ref)
    with pytest.raises(ValueError, match="impl='cuda' needs CUDA tensors"):
        fused_moe_int4(x, ids, w, ex, impl="cuda")
    with pytest.raises(ValueError, match="torch reference takes none"):
        fused_moe_int4(x, ids, w, ex, kernel="phased_r2_pdl")
