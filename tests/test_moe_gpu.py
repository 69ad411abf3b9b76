"""GPU parity of every MoE kernel the dispatch reaches against the float32 reference (marker ``gpu``).

Kimi K2.6 shapes (384 experts, H 7168, I 2048, top-8): each small-M kernel over its M range, each four-launch
variant on the layout it reads (fragment variants on experts held in the fragment layout, packed variants on the
same weights held packed), uniform and skewed routing; the dispatched path at M where the dispatch changes kernel;
the fragment four-launch path equal bit for bit to the small-M pair with the same sums; invalid ids, graph replays,
determinism; experts held once; a forced kernel that cannot run raises a clear error. Tolerances: tests/tolerances.py
(``moe_bf16``, in units of the reference output's RMS).
"""
import pytest
import torch

from tolerances import assert_close
from workbench.bench.moe import kernel_checks
from workbench.bench.moe_counts import make_routing
from workbench.dispatch import dispatch_for
from workbench.moe.fused import (FOUR_LAUNCH, FRAG_VARIANTS, LARGE_VARIANTS, SMALL_KERNELS, fused_moe_int4, moe_plan,
                                 variant_name)
from workbench.moe.packing import random_int4_experts
from workbench.moe.reference import moe_reference

pytestmark = pytest.mark.gpu

KIMI = (384, 7168, 2048)
TOPK = 8


@pytest.fixture(scope="module")
def kimi():
    return random_int4_experts(*KIMI, device="cuda", seed=0)   # the layout the dispatch holds: fragments on the H200


@pytest.fixture(scope="module")
def kimi_packed():
    return random_int4_experts(*KIMI, device="cuda", seed=0, layout="packed")


@pytest.fixture(scope="module")
def small():
    return random_int4_experts(16, 1024, 1024, device="cuda", seed=7)


def parity(experts, m: int, routing: str, seed: int, kernel=None) -> dict:
    """fused_moe_int4 (``kernel`` forced, or the dispatch's) against moe_reference on fresh random inputs, the
    outputs poisoned first; compared in units of the reference's RMS. Returns the plan that ran."""
    gen = torch.Generator().manual_seed(seed)
    ids, w = make_routing(m, experts.num_experts, TOPK, routing, gen)
    x = torch.randn(m, experts.hidden, generator=gen).to(torch.bfloat16).cuda()
    ids, w = ids.cuda(), w.cuda()
    torch.full((4 * m * TOPK * experts.hidden,), float("nan"), device="cuda")   # NaN into the allocator's blocks
    out = fused_moe_int4(x, ids, w, experts, kernel=kernel)
    ref = moe_reference(x, ids, w, experts)
    scale = ref.pow(2).mean().sqrt()
    assert_close("moe_bf16", out.float() / scale, ref / scale)
    return moe_plan(m, TOPK, x.device, hidden=experts.hidden, intermediate=experts.intermediate, kernel=kernel,
                    layout=experts.layout)


def _small_ranges() -> list[tuple[str, int]]:
    """(kernel, M) for every small-M kernel at the first and last M of its range in the H200 dispatch, and at M = 16
    for the others (any small-M kernel runs any M * top-k <= 128)."""
    d = dispatch_for("NVIDIA H200")
    out, lo = [], 1
    for max_m, name in d.moe_small:
        out += [(name, m) for m in sorted({lo, max_m})]
        lo = max_m + 1
    out += [(name, 16) for name in SMALL_KERNELS if (name, 16) not in out]
    return out


@pytest.mark.parametrize("routing", ["uniform", "skewed"])
@pytest.mark.parametrize("kernel,m", _small_ranges())
def test_small_kernels_parity_kimi_shape(kimi, kernel, m, routing):
    plan = parity(kimi, m, routing, seed=m, kernel=kernel)
    assert plan["path"] == "small" and plan["kernel"] == kernel


@pytest.mark.parametrize("routing", ["uniform", "skewed"])
@pytest.mark.parametrize("m", [1, 33, 300])
@pytest.mark.parametrize("variant", LARGE_VARIANTS, ids=variant_name)
def test_four_launch_variants_parity_kimi_shape(kimi_packed, variant, m, routing):
    plan = parity(kimi_packed, m, routing, seed=m + 1, kernel=variant)
    assert plan["launches"][1] == f"moe_gate_up_{variant_name(variant)}"


@pytest.mark.parametrize("routing", ["uniform", "skewed"])
@pytest.mark.parametrize("m", [1, 33, 300])
@pytest.mark.parametrize("kernel", list(FRAG_VARIANTS))
def test_fragment_four_launch_variants_parity_kimi_shape(kimi, kernel, m, routing):
    assert kimi.layout == "fragments"
    plan = parity(kimi, m, routing, seed=m + 2, kernel=kernel)
    assert plan["launches"][1] == f"moe_gate_up_{kernel}"


@pytest.mark.parametrize("m", [1, 9, 16])
def test_fragment_four_launch_equals_the_small_pair_bit_for_bit(small, m):
    """frag_nt* run the small-M kernels' arithmetic (whole-K chain per 16-row tile, pairs summed k ascending from 0)
    over align's items: for the same inputs they equal phased_r2_pdl exactly, whatever the item boundaries."""
    gen = torch.Generator().manual_seed(40 + m)
    ids, w = make_routing(m, 16, TOPK, "skewed", gen)
    x = torch.randn(m, 1024, generator=gen).to(torch.bfloat16).cuda()
    ids, w = ids.cuda(), w.cuda()
    want = fused_moe_int4(x, ids, w, small, kernel="phased_r2_pdl")
    for kern in FRAG_VARIANTS:
        assert torch.equal(fused_moe_int4(x, ids, w, small, kernel=kern), want), kern


@pytest.mark.parametrize("m", [1, 2, 3, 16, 17, 511, 512, 1024])
def test_dispatched_path_parity_kimi_shape(kimi, m):
    """Without ``kernel=`` the path data/dispatch/h200.json names for M runs, and is right."""
    plan = parity(kimi, m, "uniform", seed=100 + m)
    d = dispatch_for(torch.cuda.get_device_name())
    if kimi.layout == "fragments":
        want = d.moe_small_kernel(m, TOPK) or f"{FOUR_LAUNCH}:frag_nt{d.moe_large_frag_nt(m)}"
    else:
        want = f"{FOUR_LAUNCH}:{variant_name(d.moe_large_variant(m))}"
    assert plan["kernel"] == want and plan["layout"] == kimi.layout
    assert not plan["forced"]


def test_whole_line_variant_at_other_shapes_runs_its_register_form():
    ex = random_int4_experts(8, 512, 512, device="cuda", seed=2, layout="packed")
    plan = parity(ex, 40, "skewed", seed=4, kernel=(1, 2, 0, 2, 1))
    assert plan["launches"][1] == "moe_gate_up_nt1_rt2_d2"


def test_every_kernel_small_shape_edge_cases(small):
    """The bench's kernel checks (what --sanitize runs): every kernel at M = 1, 2, 16 / 1, 9, 40, larger M, an
    invalid id in each path (its row NaN, the others finite), a graph replay with fresh routing."""
    packed = random_int4_experts(16, 1024, 1024, device="cuda", seed=7, layout="packed")
    res = kernel_checks(small, torch.Generator().manual_seed(11), packed=packed)
    bad = [r for r in res if not r["ok"]]
    assert not bad, bad
    assert {r["path"] for r in res if r["routing"] == "invalid-id"} == {*SMALL_KERNELS, *FRAG_VARIANTS}
    assert {r["path"] for r in res} >= {f"{FOUR_LAUNCH}:{variant_name(v)}" for v in LARGE_VARIANTS}


@pytest.mark.parametrize("kernel", [*SMALL_KERNELS, *FRAG_VARIANTS, FOUR_LAUNCH])
def test_deterministic_and_graph_replay_equals_eager(small, kernel):
    gen = torch.Generator().manual_seed(5)
    ids, w = make_routing(9, 16, TOPK, "skewed", gen)
    x = torch.randn(9, 1024, generator=gen).to(torch.bfloat16).cuda()
    ids, w = ids.cuda(), w.cuda()
    a = fused_moe_int4(x, ids, w, small, kernel=kernel)
    assert torch.equal(a, fused_moe_int4(x, ids, w, small, kernel=kernel))
    held = {}
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        held["out"] = fused_moe_int4(x, ids, w, small, kernel=kernel, validate=False)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(held["out"], a)


def test_forced_kernel_errors_name_the_kernel(small):
    x = torch.randn(17, 1024, device="cuda").to(torch.bfloat16)
    ids, w = make_routing(17, 16, TOPK, "uniform", torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="unknown MoE kernel 'phased_r9_pdl'"):
        fused_moe_int4(x[:1], ids[:1].cuda(), w[:1].cuda(), small, kernel="phased_r9_pdl")
    with pytest.raises(ValueError, match="'phased_r2_pdl' takes at most 128"):
        fused_moe_int4(x, ids.cuda(), w.cuda(), small, kernel="phased_r2_pdl")
    with pytest.raises(ValueError, match="four-launch variant must be one of"):
        fused_moe_int4(x, ids.cuda(), w.cuda(), small, kernel=(2, 1, 0, 4, 1))
    with pytest.raises(ValueError, match=r"topk_ids must lie in \[0, 16\)"):
        fused_moe_int4(x, (ids + 16).cuda(), w.cuda(), small)


def test_experts_are_held_once_in_the_layout_their_kernels_read(small):
    d = dispatch_for(torch.cuda.get_device_name())
    assert small.layout == ("fragments" if d.moe_small else "packed")
    packed = random_int4_experts(16, 1024, 1024, device="cuda", seed=7, layout="packed")
    assert small.nbytes == packed.nbytes == sum(t.numel() * t.element_size() for t in small.tensors())
    for e in (0, 15):
        assert all(torch.equal(a, b) for a, b in zip(small.dequantize(e), packed.dequantize(e)))
    torch_path = fused_moe_int4(torch.randn(2, 1024, device="cuda").to(torch.bfloat16),
                                torch.tensor([[0, 1] * 4, [2, 3] * 4], device="cuda"),
                                torch.full((2, TOPK), 0.125, device="cuda"), small, impl="torch")
    assert torch_path.dtype == torch.bfloat16 and torch_path.is_cuda


def test_in_graph_timing_checks_back_to_back_calls(small):
    """The bench's in-graph timing over two weight sets: outputs right, a per-call time per sample."""
    from workbench.bench.moe_timing import IN_GRAPH_CALLS, time_ours_in_graph

    banks = [small, random_int4_experts(16, 1024, 1024, device="cuda", seed=8)]
    res = time_ours_in_graph(banks, 4, "skewed", torch.Generator().manual_seed(4), reps=3)
    assert res["calls"] == IN_GRAPH_CALLS and len(res["distinct"]) == IN_GRAPH_CALLS
    assert len(res["ms"]) == 3 and all(t > 0 for t in res["ms"])
    assert res["check"]["checked"] and res["check"]["ok"], res["check"]
