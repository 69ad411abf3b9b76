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
