"""CPU side of the streaming-read ceiling (workbench/moe/ceiling.py): launch-shape checks and the expected sink."""
import numpy as np
import pytest
import torch

from workbench.moe.ceiling import CONFIGS, expected_sink, stream_touched
from workbench.moe.packing import random_int4_experts


@pytest.fixture(scope="module")
def tiny():
    return random_int4_experts(6, 512, 512, device="cpu", seed=2)


@pytest.mark.parametrize("config,match", [((3, 256, 4), "loads in flight"), ((4, 100, 4), "multiple of 32"),
                                          ((4, 1024, 4), "CTAs per SM"), ((4, 256, 0), "CTAs per SM")])
def test_bad_launch_shapes_are_refused(tiny, config, match):
    with pytest.raises(ValueError, match=match):
        stream_touched(torch.zeros(1, 2, dtype=torch.int32), tiny, config)


def test_cpu_ids_are_refused(tiny):
    with pytest.raises(ValueError, match="CUDA tensor"):
        stream_touched(torch.zeros(1, 2, dtype=torch.int32), tiny, CONFIGS[0])


def test_expected_sink_counts_each_touched_expert_once(tiny):
    gu, dn = tiny.fragments()
    per = (gu[0].numel() + dn[0].numel()) // 4
    ids = torch.tensor([[3, 1], [1, -1], [3, 9]])
    acc, words = expected_sink(ids, tiny)
    assert words == 2 * per
    want = 0
    for e in (1, 3):
        for t in (gu[e], dn[e]):
            for v in t.reshape(-1).numpy().view(np.uint32):
                want ^= int(v)
    assert acc == want
    assert expected_sink(torch.tensor([[-1, 6]]), tiny) == (0, 0)


def test_diagnostic_build_is_scoped_and_checked():
    from workbench.moe import fused
    from workbench.measure import clock_event_reason_names as reason_names
    from workbench.moe.diag import BUILDS

    assert fused.SMALL_OPTIONS["options"] == ()
    with fused.diagnostic_build(BUILDS["nomath"]) as opts:
        assert fused.SMALL_OPTIONS["options"] == opts == ("-DMOE_DIAG_NOMATH",)
    assert fused.SMALL_OPTIONS["options"] == ()
    with pytest.raises(ValueError, match="-D macros"):
        with fused.diagnostic_build(("-O0",)):
            pass
    assert reason_names(0x4 | 0x1) == ["gpu_idle", "sw_power_cap"]


@pytest.mark.parametrize("config,match", [((2, 5, 1), "ring stages"), ((3, 0, 1), "CTAs per SM"),
                                          ((3, 5, 2), "rr must be")])
def test_bad_ring_configs_are_refused(tiny, config, match):
    from workbench.moe.ceiling import stream_ring

    with pytest.raises(ValueError, match=match):
        stream_ring(torch.zeros(1, 2, dtype=torch.int32), tiny, config)


def test_ring_sync_configs():
    from workbench.moe.ceiling import _check_ring_config, _ring_label

    assert _ring_label((3, 5, 1)) == "ring_rs3_b5_rr"
    assert _ring_label((3, 5, 1, 3)) == "ring_rs3_b5_rr_fence_bar"
    assert _ring_label((3, 5, 0, 2)) == "ring_rs3_b5_flat_bar"
    _check_ring_config((3, 5, 0, 2))
    with pytest.raises(ValueError, match="rr only"):
        _check_ring_config((3, 5, 0, 1))
    with pytest.raises(ValueError, match="sync must be"):
        _check_ring_config((3, 5, 1, 4))
    with pytest.raises(ValueError, match="a ring config is"):
        _check_ring_config((3, 5))


def test_wsplit_splits_need_units_of_ring_length():
    from workbench.moe.fused import SMALL_VARIANTS, wsplit_splits

    assert wsplit_splits(7168, 2048, "ring", 3) == (4, 2)
    assert wsplit_splits(7168, 2048, (1, 1), 4) == (1, 1)
    with pytest.raises(ValueError, match="needs at least 3"):
        wsplit_splits(7168, 2048, (4, 4), 4)
    assert SMALL_VARIANTS["wsplit_r3"] == ("moe_small_wsplit_r3", ("ws", "ring", 3))
    with pytest.raises(ValueError, match="warp-split"):
        from workbench.moe.fused import splitk_splits
        splitk_splits(8, 7168, 2048, "wsplit_r3", 660)
