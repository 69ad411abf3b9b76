"""The gather probe of the verify kernel's key tiles (workbench.ddtree.gather_probe)."""
import pytest

from workbench.ddtree import gather_probe as GP
from workbench.kernels import gpu_available


def test_tensor_map_rejects_what_it_cannot_describe():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="bf16"):
        GP.encode_row_tensor_map(torch.zeros(8, 576, dtype=torch.float32))
    with pytest.raises(ValueError, match="bf16"):
        GP.encode_row_tensor_map(torch.zeros(8, 512, dtype=torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")
@pytest.mark.parametrize("prefix,heads", [(5000, 8), (777, 64)])
def test_every_gather_lands_the_rows_at_its_layout(prefix, heads):
    """Fresh random rows and slots; each method and depth compares every landed 16-byte chunk with the KV row in
    global memory at its layout (the TMA form: the 128-byte swizzle wgmma reads)."""
    bad = GP.check_layouts(prefix=prefix, heads=heads, seed=prefix)
    assert set(bad) == {f"{m}/d{d}" for m in GP.METHODS for d in GP.DEPTHS}
    assert all(v == 0 for v in bad.values()), bad


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")
def test_gather_rejects_bad_arguments():
    torch = pytest.importorskip("torch")
    kv = torch.zeros(100, 576, dtype=torch.bfloat16, device="cuda")
    slots = torch.arange(64, device="cuda")
    with pytest.raises(ValueError, match="method"):
        GP.gather(kv, slots, 1, 64, "ldg", 1)
    with pytest.raises(ValueError, match="depth"):
        GP.gather(kv, slots, 1, 64, "cp_async", 3)
    with pytest.raises(ValueError, match="tmap"):
        GP.gather(kv, slots, 1, 64, "tma_rows", 1)


def test_committed_probe_and_bound_tables():
    """The committed gather probe (ddtree_gather_probe.json) and the per-point lower bound built on it: every method
    and depth landed its rows correctly, every point has every path, and the bound is the larger of gathers and tensor
    work plus two graph nodes."""
    from workbench.ddtree import report as R
    from workbench.measure import load_measurement

    doc = load_measurement("ddtree_gather_probe")
    if doc is None:
        pytest.skip("no committed ddtree_gather_probe.json")
    res = doc["results"]
    assert set(res["layout_check"].values()) == {0}
    rows = GP.gather_rows_table(res)
    paths = {f"{m}/d{d}" for m in GP.METHODS for d in GP.DEPTHS} | {"verify_diag_gather", "verify_attention"}
    assert len(rows) == len(res["points"]) * len(paths)
    for pt in res["points"]:
        assert set(pt["paths"]) == paths
        assert pt["l2_to_sm_bytes"] == pt["tiles_total"] * GP.TILE_BYTES
    bound = R.verify_bound_rows()
    assert len(bound) == len(load_measurement("ddtree_verify")["results"]["points"])
    for r in bound:
        parts = (float(r["two nodes us"]) + max(float(r["bytes into SMs us"]), float(r["tensor work us"]))
                 + float(r["merge reads us"]))
        assert float(r["bound, merge launch us"]) == pytest.approx(parts, abs=0.11)
        assert float(r["/ allowance"]) == pytest.approx(float(r["bound, merge launch us"])
                                                        / float(r["50% of floor allows us"]), rel=0.02)
        assert float(r["bound, one launch us"]) < float(r["bound, merge launch us"])


def test_split_merge_bound_by_hand():
    """One point worked by hand: 128 rows (two blocks), 6400 keys, 4 SMs, round rates. C = 2 fills the SMs:
    bytes (2 x 128 + 2 x 6400) x 1152 B / 1e12 B/s = 15.04 us, tensor 2 x 128 x 6400 x 1088 / 1e14 = 17.83 us,
    merge 2 x 128 x 512 x 2 B / 1e12 = 0.26 us; two nodes of 1 us. C = 1 leaves half the SMs idle (double time)
    and C = 3 (6 blocks on 4 SMs) still has the busiest SM at 1/4 of the work with a larger merge."""
    from workbench.ddtree.report import split_merge_bound

    b = split_merge_bound(128, 6400, 2, sms=4, gather_bytes_per_s=1e12, matmul_flops_per_s=1e14, node_s=1e-6)
    assert b["chunks"] == 2
    assert b["bytes_s"] == pytest.approx((2 * 128 + 2 * 6400) * 1152 / 1e12)
    assert b["tensor_s"] == pytest.approx(2 * 128 * 6400 * 1088 / 1e14)
    assert b["merge_s"] == pytest.approx(2 * 128 * 512 * 2 / 1e12)
    assert b["total_s"] == pytest.approx(2e-6 + b["tensor_s"] + b["merge_s"])
    unpadded = split_merge_bound(72, 6400, 1, sms=4, gather_bytes_per_s=1e12, matmul_flops_per_s=1e14, node_s=1e-6,
                                 pad_rows=False)
    assert unpadded["tensor_s"] == pytest.approx(2 * 72 * 6400 * 1088 / 1e14)
    with pytest.raises(ValueError, match="launches 1 or 2"):
        split_merge_bound(128, 6400, 3, sms=4, gather_bytes_per_s=1e12, matmul_flops_per_s=1e14, node_s=1e-6)
