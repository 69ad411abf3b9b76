"""Every CUDA source compiles for sm_90 with nvcc (where nvcc exists; CI has it, without a GPU)."""
import shutil
import subprocess

import pytest

from workbench.kernels import KERNEL_DIR, cuda_sources

NVCC = shutil.which("nvcc")


def test_sources_present():
    assert KERNEL_DIR.is_dir()


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("src", cuda_sources(), ids=lambda p: p.name)
def test_nvcc_compiles_for_sm90(src, tmp_path):
    out = subprocess.run([NVCC, "-arch=sm_90", "-std=c++17", "-Xptxas", "-v", f"-I{KERNEL_DIR}",
                          "-c", str(src), "-o", str(tmp_path / (src.stem + ".o"))],
                         capture_output=True, text=True)
    assert out.returncode == 0, f"nvcc failed for {src.name}:\n{out.stderr}"
