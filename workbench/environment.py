"""What this machine offers the workbench (``workbench env``)."""
from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
from typing import Any

import torch

from workbench.kernels import gpu_available


def has_cuda() -> bool:
    return torch.cuda.is_available()


def describe() -> dict[str, Any]:
    """Python, torch, CuPy, CUDA, GPU, nvcc, and where the pipeline will run."""
    info: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
    info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    try:
        import cupy

        info["cupy"] = cupy.__version__
        try:
            info["cupy_cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        except RuntimeError as e:   # CuPy's CUDARuntimeError: no driver or device
            info["cupy_cuda_runtime"] = f"unavailable ({type(e).__name__})"
    except ImportError:   # CuPy (optional) not installed, or its CUDA libraries missing
        info["cupy"] = None
    nvcc = shutil.which("nvcc")
    if nvcc:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
        info["nvcc"] = out.stdout.strip().splitlines()[-1] if out.returncode == 0 else "broken"
    else:
        info["nvcc"] = None

    info["gpu_kernels"] = gpu_available()
    info["pipeline_runs_on"] = ("GPU (profile 'gpu': GPU sizes from notebooks/profiles.yaml)" if has_cuda()
                                else "CPU (profile 'cpu': the notebooks' small defaults)")
    return info


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("env", help="Python, torch, CuPy, CUDA, GPU, nvcc and what the pipeline runs on")
    p.set_defaults(func=lambda args: print("\n".join(f"{k:18} {v}" for k, v in describe().items())) or 0)
