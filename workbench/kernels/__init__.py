"""CUDA kernel sources and their loader.

One ``.cu`` file per kernel family lives in this folder. :func:`load_module`
compiles a family once per process with CuPy (``RawModule``, NVRTC, for the
current device's architecture, sm_90 on Hopper) and caches it.
:func:`as_cupy` wraps a torch CUDA tensor zero-copy (DLPack) and
:func:`torch_stream` gives torch's current stream to CuPy, so kernels run in
order with torch work and can be captured in a CUDA graph.

Everything here imports on a machine without CuPy or a GPU; only calling a
kernel needs them. :func:`cuda_sources` lists the sources for the nvcc
compile check (tests/test_kernels_compile.py).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Sequence

KERNEL_DIR = Path(__file__).resolve().parent


class KernelUnavailable(RuntimeError):
    """Raised when a GPU kernel is asked for on a machine that cannot run it."""


def cuda_sources() -> list[Path]:
    """Every ``*.cu`` kernel family in this folder."""
    return sorted(KERNEL_DIR.glob("*.cu"))


@functools.cache
def gpu_available() -> bool:
    """True when torch sees a CUDA device and CuPy imports."""
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        import cupy  # noqa: F401
    except Exception:
        return False
    return True


def require_gpu(what: str) -> None:
    if not gpu_available():
        raise KernelUnavailable(
            f"{what} needs a CUDA GPU with CuPy (pip install 'workbench[gpu]'); "
            "use the CPU reference instead")


def resolve_device(device: str = "auto") -> str:
    """``"auto"`` -> ``"cuda"`` when the GPU kernels can run (:func:`gpu_available`), else ``"cpu"``.

    ``"cpu"`` and ``"cuda"`` pass through; ``"cuda"`` without a usable GPU is an error.
    """
    if device == "auto":
        return "cuda" if gpu_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if device == "cuda":
        require_gpu("device='cuda'")
    return device


@functools.cache
def load_module(family: str, options: tuple[str, ...] = ()) -> Any:
    """Compile ``<family>.cu`` once per process; returns ``cupy.RawModule``.

    NVRTC first (``--std=c++17`` always on, ``options`` are extra flags such as
    ``-D...``). If NVRTC cannot build the source and ``nvcc`` is on the PATH,
    the family is built as a cubin for the current device with nvcc instead,
    with a warning that says so.
    """
    require_gpu(f"kernel family {family!r}")
    import cupy as cp

    path = KERNEL_DIR / f"{family}.cu"
    if not path.exists():
        known = ", ".join(p.stem for p in cuda_sources())
        raise FileNotFoundError(f"no kernel family {family!r}; known: {known}")
    try:
        mod = cp.RawModule(code=path.read_text(), options=("--std=c++17", f"-I{KERNEL_DIR}", *options))
        mod.compile()
        return mod
    except Exception as nvrtc_err:  # noqa: BLE001 - fall back to nvcc when NVRTC cannot build it
        return _nvcc_module(family, path, options, nvrtc_err)


def _nvcc_module(family: str, path: Path, options: tuple[str, ...], nvrtc_err: Exception) -> Any:
    import shutil
    import subprocess
    import tempfile
    import warnings

    import cupy as cp
    import torch

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise nvrtc_err
    major, minor = torch.cuda.get_device_capability()
    out = Path(tempfile.mkdtemp()) / f"{family}.cubin"
    res = subprocess.run([nvcc, f"-arch=sm_{major}{minor}", "-std=c++17", "-cubin", f"-I{KERNEL_DIR}",
                          *options, str(path), "-o", str(out)], capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"{family}: NVRTC failed ({nvrtc_err!r}) and nvcc failed:\n{res.stderr}") from nvrtc_err
    warnings.warn(f"{family}: NVRTC failed ({str(nvrtc_err)[:200]}); using an nvcc-built cubin", stacklevel=3)
    return cp.RawModule(path=str(out))


def get_kernel(family: str, name: str, options: tuple[str, ...] = ()) -> Any:
    """``cupy.RawKernel`` for ``extern "C"`` function ``name`` of ``family``."""
    return load_module(family, tuple(options)).get_function(name)


def as_cupy(t: Any) -> Any:
    """Zero-copy CuPy view of a torch CUDA tensor (DLPack)."""
    import cupy as cp

    return cp.from_dlpack(t)


_STREAMS: dict[tuple[int, int], Any] = {}


def torch_stream() -> Any:
    """torch's current CUDA stream as a CuPy stream (cached per stream and device)."""
    import cupy as cp
    import torch

    s = torch.cuda.current_stream()
    key = (s.cuda_stream, s.device.index)
    cs = _STREAMS.get(key)
    if cs is None:
        if hasattr(cp.cuda.Stream, "from_external"):  # CuPy >= 14
            cs = cp.cuda.Stream.from_external(s)
        else:
            cs = cp.cuda.ExternalStream(s.cuda_stream, s.device.index)
        _STREAMS[key] = cs
    return cs


def launch(kernel: Any, grid: Sequence[int] | int, block: Sequence[int] | int,
           args: Sequence[Any], shared_mem: int = 0) -> None:
    """Launch ``kernel`` on torch's current stream (also CuPy's current stream for the call).

    ``args`` may hold torch CUDA tensors (passed as device pointers), Python
    ints and bools (``int32``) and floats (``float32``); numpy scalars pass as
    they are, so wrap other scalar types in numpy. CuPy raises if the launch
    itself fails.
    """
    import numpy as np
    import torch

    conv = []
    for a in args:
        if isinstance(a, torch.Tensor):
            if not a.is_cuda:
                raise ValueError("kernel argument tensors must be on the GPU")
            conv.append(np.uint64(a.data_ptr()))
        elif isinstance(a, (bool, int)):
            conv.append(np.int32(a))
        elif isinstance(a, float):
            conv.append(np.float32(a))
        else:
            conv.append(a)
    grid = (grid,) if isinstance(grid, int) else tuple(grid)
    block = (block,) if isinstance(block, int) else tuple(block)
    stream = torch_stream()
    with stream:
        kernel(grid, block, tuple(conv), shared_mem=shared_mem, stream=stream)
