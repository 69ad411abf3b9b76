"""The per-GPU dispatch tables (data/dispatch/*.json) and the frozen Dispatch read from them."""
import dataclasses

import pytest

from workbench.measure import provenance
from workbench.dispatch import DISPATCH_DIR, Dispatch, dispatch_for


def test_h200_table_is_matched_and_tuned():
    d = dispatch_for("NVIDIA H200")
    assert d.gpu == "h200" and not d.generic
    assert d.moe_small_kernel(1, 8) == "phased_r2_pdl"
    assert d.moe_small_kernel(2, 8) == "phased_r3_pdl_k4"
    assert d.moe_small_kernel(16, 8) == "phased_r3_pdl_gu2"
    assert d.moe_small_kernel(17, 8) is None          # 136 pairs > 128: the four-launch path
    assert d.moe_large_variant(512) == (2, 2, 2, 0, 0)
    assert d.moe_large_variant(10**6) == (4, 2, 2, 0, 0)
    assert d.verify_impl("bfloat16") == "wgmma" and d.verify_impl("torch.float32") == "simple"


def test_unknown_gpu_gets_the_generic_table_and_says_so():
    d = dispatch_for("NVIDIA GeForce RTX 4090")
    assert d.generic and d.gpu == "generic" and d.device_name == "NVIDIA GeForce RTX 4090"
    assert d.moe_small_kernel(1, 8) is None and d.verify_impl("bfloat16") == "mma"
    assert d.record()["generic"] is True


def test_dispatch_is_frozen_and_read_once():
    d = dispatch_for("NVIDIA H200")
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.verify_bf16 = "mma"
    assert dispatch_for("NVIDIA H200") is d
    assert isinstance(d.moe_small, tuple) and isinstance(d.moe_large, tuple)


def test_every_table_parses_and_names_known_forms():
    from workbench.ddtree.tree_gpu import TREE_BUILD_RULES
    from workbench.moe.fused import LARGE_VARIANTS, SMALL_KERNELS

    for path in sorted(DISPATCH_DIR.glob("*.json")):
        d = dispatch_for("generic" if path.stem == "generic" else f"NVIDIA {path.stem.upper()}")
        assert isinstance(d, Dispatch)
        assert d.tree_build in TREE_BUILD_RULES
        assert {k for _, k in d.moe_small} <= set(SMALL_KERNELS)
        assert {v for _, v in d.moe_large} <= set(LARGE_VARIANTS)
        assert d.verify_bf16 in ("wgmma", "mma") and d.verify_fp32 == "simple"


def test_measurement_provenance_records_the_dispatch():
    rec = provenance()["dispatch"]
    assert set(rec) >= {"gpu", "generic", "moe_small", "moe_large", "verify_bf16", "tree_build"}


def test_dispatch_for_device_reads_the_cuda_device_name(monkeypatch):
    """A CUDA device (by index, or the current one when it has none) is looked up by its name; other devices get
    the generic table."""
    import torch

    from workbench.dispatch import dispatch_for_device

    names = {0: "NVIDIA GeForce RTX 4090", 1: "NVIDIA H200"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: names[i])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert dispatch_for_device("cuda:0").generic
    assert dispatch_for_device(torch.device("cuda:1")).gpu == "h200"
    assert dispatch_for_device("cuda").gpu == "h200"
    assert dispatch_for_device(0).generic
    assert dispatch_for_device("cpu").generic and dispatch_for_device("cpu").device_name == "cpu"
