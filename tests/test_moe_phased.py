"""The phased form of the small-M path (two launches, moe_int4.cu "Phased form"): its host-side plan, on the CPU."""
import pytest

from workbench.moe.fused import SMALL_VARIANTS, max_work_items, phased_grids, splitk_splits


def test_phased_variants_name_both_kernels():
    for rs in (3, 4):
        kname, spec = SMALL_VARIANTS[f"phased_r{rs}"]
        assert (kname, spec) == (f"moe_small_phased_gu_r{rs}", ("ph", rs))
        assert kname.replace("_gu_", "_dn_") == f"moe_small_phased_dn_r{rs}"
    assert splitk_splits(8, 7168, 2048, "phased_r4", 660) == (1, 1)   # whole-K tasks


@pytest.mark.parametrize("m,want_gu", [(1, 512), (2, 660), (16, 660)])
def test_phased_grids_kimi(m, want_gu):
    """Kimi K2.6 (384 experts, H 7168, I 2048), top-8, 660 resident CTAs of each kernel: at M = 1 the 8 items make
    2048 gate/up tasks, one per warp of 512 CTAs; from M = 2 the bound exceeds what is resident; down: one CTA per
    16-row tile (448)."""
    assert max_work_items(8 * m, 384, 8) * 256 >= 2048
    assert phased_grids(8 * m, 384, 7168, 2048, 660, 660) == (want_gu, 448)
    assert phased_grids(8, 384, 7168, 2048, 660, 300) == (512, 300)


@pytest.mark.parametrize("bad", [(0, 384, 7168, 2048, 660, 660), (8, 384, 7168, 2048, 0, 660)])
def test_phased_grids_refuse_empty(bad):
    with pytest.raises(ValueError, match="need positive"):
        phased_grids(*bad)
