"""CPU checks of the group-sum correction of moe_small_splitk_s4g (workbench/moe/groupfix.py) and of its
ring layout (which lane copies which sum where, which lane reads it)."""
import pytest
import torch

from workbench.moe.groupfix import GROUP, OFFSET, corrected_dot, exact_dot, group_sums


def _case(seed: int, rows: int, k: int, n: int, mean: float):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-8, 8, (rows, k), generator=g)
    x = (torch.randn(n, k, generator=g) + mean).to(torch.bfloat16)
    scales = (0.02 * (0.5 + torch.rand(rows, k // GROUP, generator=g))).to(torch.bfloat16)
    return q, x, scales


def test_group_sums_are_minus_136_times_the_group_sum():
    x = torch.arange(64, dtype=torch.float32).reshape(1, 64).to(torch.bfloat16)
    s = group_sums(x)
    assert s.dtype == torch.float32 and s.shape == (1, 2)
    assert s.tolist() == [[-OFFSET * sum(range(32)), -OFFSET * sum(range(32, 64))]]
    with pytest.raises(ValueError, match="multiple of 32"):
        group_sums(torch.zeros(3, 40))


@pytest.mark.parametrize("mean", [0.0, 3.0])   # 3.0: same-sign activations, the worst cancellation
def test_corrected_dot_error_far_below_tolerance(mean):
    # Kimi gate_up K (7168) and down K (2048); error relative to the exact float64 dot product
    for k in (7168, 2048):
        q, x, scales = _case(int(k + mean), 16, k, 4, mean)
        got = corrected_dot(q, x, scales).double()
        ref = exact_dot(q, x, scales)
        rel = float((got - ref).norm() / ref.norm())
        assert rel < 1e-4, rel   # the kernels' tolerance is 1e-2
        # per element, against the size of what cancels: 136 * sum|x| * scale per group, summed
        bound = (OFFSET * x.double().abs().reshape(4, -1, GROUP).sum(-1) @ scales.double().T).T * 2.0 ** -20
        assert bool(((got - ref).abs() <= bound + 1e-30).all())


def test_corrected_dot_rejects_bad_input():
    q, x, scales = _case(1, 2, 64, 1, 0.0)
    with pytest.raises(ValueError, match="do not match"):
        corrected_dot(q, x[:, :32], scales)
    with pytest.raises(ValueError, match=r"\[-8, 7\]"):
        corrected_dot(q + 9, x, scales)


def test_ring_sum_layout_gives_each_lane_its_columns():
    # moe_int4.cu frag_gemm_g: lane (g, t) copies S'(col 2t, group g) to byte 8 * (4g + t) and S'(col 2t+1, g)
    # to +4 of the stage's sum area; in step q, group half gr, lane (g, t) reads 8 bytes at 64q + 32gr + 8t
    # twice into C (c0, c1 = rows g of columns 2t, 2t + 1; c2, c3 the same columns for row g + 8).
    area = {}
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        area[8 * (4 * g + t)] = (2 * t, g)
        area[8 * (4 * g + t) + 4] = (2 * t + 1, g)
    assert sorted(area) == list(range(0, 256, 4))
    for lane in range(32):
        t = lane & 3
        for q in range(4):
            for gr in range(2):
                a = 64 * q + 32 * gr + 8 * t
                c = [area[a], area[a + 4], area[a], area[a + 4]]
                group = 2 * q + gr
                assert c == [(2 * t, group), (2 * t + 1, group), (2 * t, group), (2 * t + 1, group)]
