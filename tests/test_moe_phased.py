"""The phased form of the small-M path (two launches, moe_int4.cu "Phased form"): its host-side plan, on the CPU."""
import pytest

from workbench.moe.fused import SMALL_VARIANTS, max_work_items, phased_grids, phased_spec, splitk_splits


def test_phased_variants_name_both_kernels():
    for rs in (3, 4):
        kname, spec = SMALL_VARIANTS[f"phased_r{rs}"]
        assert (kname, spec) == (f"moe_small_phased_gu_r{rs}", ("ph", rs))
        assert kname.replace("_gu_", "_dn_") == f"moe_small_phased_dn_r{rs}"
    assert splitk_splits(8, 7168, 2048, "phased_r4", 660) == (1, 1)   # whole-K tasks
    assert phased_spec("phased_r3_pdl") == SMALL_VARIANTS["phased_r3_pdl"]
    for other in ("ctasplit_x4e_r3fst", "v3", "no_such_variant"):
        with pytest.raises(ValueError, match="phased form"):
            phased_spec(other)


@pytest.mark.parametrize("m,want_gu", [(1, 512), (2, 660), (16, 660)])
def test_phased_grids_kimi(m, want_gu):
    """Kimi K2.6 (384 experts, H 7168, I 2048), top-8, 660 resident CTAs of each kernel: at M = 1 the 8 items make
    2048 gate/up tasks, one per warp of 512 CTAs; from M = 2 the bound exceeds what is resident; down: one CTA per
    16-row tile (448)."""
    assert max_work_items(8 * m, 384, 8) * 256 >= 2048
    assert phased_grids(8 * m, 384, 7168, 2048, 660, 660) == (want_gu, 448)
    assert phased_grids(8, 384, 7168, 2048, 660, 300) == (512, 300)
    # the K-split form: one task per CTA (M = 2: 16 items x 256 tiles, capped at the resident CTAs; M = 1 below it)
    assert phased_grids(16, 384, 7168, 2048, 660, 660, 1) == (660, 448)
    assert phased_grids(8, 384, 7168, 2048, 5000, 660, 1) == (2048, 448)


@pytest.mark.parametrize("bad", [(0, 384, 7168, 2048, 660, 660), (8, 384, 7168, 2048, 0, 660),
                                 (8, 384, 7168, 2048, 660, 660, 0)])
def test_phased_grids_refuse_empty(bad):
    with pytest.raises(ValueError, match="need positive"):
        phased_grids(*bad)


def test_launch_structs_match_cuda_h():
    """CUlaunchAttribute is 72 bytes (id, padding, a 64-byte union) and CUlaunchConfig 56 (stream at 32)."""
    import ctypes

    from workbench.kernels import _LaunchAttr, _LaunchConfig

    assert ctypes.sizeof(_LaunchAttr) == 72 and _LaunchAttr.value.offset == 8
    assert ctypes.sizeof(_LaunchConfig) == 56 and _LaunchConfig.hStream.offset == 32


def test_launch_dependent_refuses_bad_shapes():
    from workbench.kernels import launch_dependent

    with pytest.raises(ValueError, match="positive int grid and block"):
        launch_dependent(None, (2, 1), 128, ())
    with pytest.raises(ValueError, match="positive int grid and block"):
        launch_dependent(None, 0, 128, ())


def test_breakdown_refuses_other_variants_and_formats_rows():
    import torch

    from workbench.moe.phased import breakdown, table_rows

    with pytest.raises(ValueError, match="phased form"):
        breakdown([], 1, "uniform", "ctasplit_x4e_r3fst", torch.Generator())
    part = {"one_replay_ms": 0.03, "in_graph_ms": 0.028}
    row = table_rows([{"variant": "phased_r3", "m": 1, "routing": "uniform", "gu": part, "dn": part, "gu+dn": part,
                       "boundary_one_replay_ms": -0.03, "boundary_in_graph_ms": -0.028}])[0]
    assert row["gu us"] == "30.0 / 28.0" and row["both - parts us"] == "-30.0 / -28.0"


def test_breakdown_rejects_unknown_build():
    """workbench.moe.phased.breakdown: a build that is not a diag.ALL_BUILDS key is refused before any GPU work."""
    import torch

    from workbench.moe.diag import ALL_BUILDS, BUILDS, FRAG_BUILDS
    from workbench.moe.phased import breakdown

    assert set(ALL_BUILDS) == set(BUILDS) | set(FRAG_BUILDS) and "nomath_frag_noact" in ALL_BUILDS
    with pytest.raises(ValueError, match="build must be one of"):
        breakdown([], 1, "uniform", "phased_r3", torch.Generator(), build="nomath_everything")
