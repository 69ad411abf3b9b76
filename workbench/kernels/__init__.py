"""CUDA kernel sources and their loader.

One ``.cu`` file per kernel family lives in this folder. :func:`load_module`
compiles a family once per process with CuPy (``RawModule``, NVRTC, for the
current device's architecture, sm_90 on Hopper) and caches it; a family that
needs Hopper's own instructions (``wgmma``) asks for ``target="sm_90a"``,
built with nvcc instead (:data:`NVCC_TARGETS`).
:func:`as_cupy` wraps a torch CUDA tensor zero-copy (DLPack) and
:func:`torch_stream` gives torch's current stream to CuPy, so kernels run in
order with torch work and can be captured in a CUDA graph.

Everything here imports on a machine without CuPy or a GPU; only calling a
kernel needs them. :func:`cuda_sources` lists the sources for the nvcc
compile check (tests/test_kernels_compile.py).
"""
from __future__ import annotations

import ctypes
import functools
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

KERNEL_DIR = Path(__file__).resolve().parent


class KernelUnavailable(RuntimeError):
    """Raised when a GPU kernel is asked for on a machine that cannot run it."""


def cuda_sources() -> list[Path]:
    """Every ``*.cu`` kernel family in this folder."""
    return sorted(KERNEL_DIR.glob("*.cu"))


@functools.cache
def gpu_available() -> bool:
    """True when torch sees a CUDA device and CuPy imports."""
    if not torch.cuda.is_available():
        return False
    try:
        import cupy  # noqa: F401
    except ImportError:   # CuPy (optional) not installed, or its CUDA libraries missing
        return False
    return True


@functools.cache
def cuda_errors() -> tuple[type[Exception], ...]:
    """What building, loading or launching a kernel raises: RuntimeError (torch's CUDA errors, CuPy's CUDA driver,
    runtime and NVRTC errors, a failed nvcc, :class:`KernelUnavailable`), OSError (a compiler or cubin that cannot
    be run or read) and, where CuPy imports, its NVRTC ``CompileException`` (a plain Exception)."""
    try:
        from cupy.cuda.compiler import CompileException
    except ImportError:
        return (RuntimeError, OSError)
    return (RuntimeError, OSError, CompileException)


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


# Targets a family may ask for beyond what NVRTC through CuPy builds (sm_90 on Hopper):
# target -> (device capability it needs, nvcc -gencode value).
NVCC_TARGETS: dict[str, tuple[tuple[int, int], str]] = {
    "sm_90a": ((9, 0), "arch=compute_90a,code=sm_90a"),  # Hopper's own instructions: wgmma, setmaxnreg
}


@functools.cache
def load_module(family: str, options: tuple[str, ...] = (), target: str | None = None) -> Any:
    """Compile ``<family>.cu`` once per process; returns ``cupy.RawModule``.

    ``target=None`` (every family by default): NVRTC first (``--std=c++17``
    always on, ``options`` are extra flags such as ``-D...``). If NVRTC cannot
    build the source and ``nvcc`` is on the PATH, the family is built as a
    cubin for the current device with nvcc instead, with a warning that says so.

    ``target="sm_90a"`` (a key of :data:`NVCC_TARGETS`): build with nvcc for
    that target (``-gencode arch=compute_90a,code=sm_90a``), which NVRTC through
    CuPy does not give; needed for Hopper's warpgroup MMA (``wgmma``). Raises
    :class:`KernelUnavailable` when nvcc is missing or the device is not the
    one the target is for; the caller chooses a plain-sm_90 kernel then.
    Sources stay buildable for plain sm_90 (guard target-only code with
    ``#if defined(__CUDA_ARCH_FEAT_SM90_ALL)``).
    """
    require_gpu(f"kernel family {family!r}")
    import cupy as cp

    path = KERNEL_DIR / f"{family}.cu"
    if not path.exists():
        known = ", ".join(p.stem for p in cuda_sources())
        raise FileNotFoundError(f"no kernel family {family!r}; known: {known}")
    if target is not None:
        if target not in NVCC_TARGETS:
            raise ValueError(f"target must be None or one of {sorted(NVCC_TARGETS)}, got {target!r}")

        cap, gencode = NVCC_TARGETS[target]
        have = tuple(torch.cuda.get_device_capability())
        if have != cap:
            raise KernelUnavailable(f"target {target} needs a device of capability {cap}, this one is {have}")
        if shutil.which("nvcc") is None:
            raise KernelUnavailable(f"target {target} is built with nvcc, which is not on the PATH")
        return cp.RawModule(path=str(_nvcc_cubin(family, path, options, f"-gencode={gencode}")))
    try:
        mod = cp.RawModule(code=path.read_text(), options=("--std=c++17", f"-I{KERNEL_DIR}", *options))
        mod.compile()
        return mod
    except cuda_errors() as nvrtc_err:  # the same source built by nvcc when NVRTC cannot build it
        return _nvcc_module(family, path, options, nvrtc_err)


def _nvcc_cubin(family: str, path: Path, options: tuple[str, ...], arch_flag: str) -> Path:
    """Build ``path`` into a cubin with nvcc (``arch_flag``: ``-arch=...`` or ``-gencode=...``)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise KernelUnavailable("nvcc is not on the PATH")
    out = Path(tempfile.mkdtemp()) / f"{family}.cubin"
    res = subprocess.run([nvcc, arch_flag, "-std=c++17", "-cubin", f"-I{KERNEL_DIR}", *options, str(path),
                          "-o", str(out)], capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"{family}: nvcc {arch_flag} failed:\n{res.stderr}")
    return out


def _nvcc_module(family: str, path: Path, options: tuple[str, ...], nvrtc_err: Exception) -> Any:
    import cupy as cp

    if shutil.which("nvcc") is None:
        raise nvrtc_err
    major, minor = torch.cuda.get_device_capability()
    try:
        out = _nvcc_cubin(family, path, options, f"-arch=sm_{major}{minor}")
    except RuntimeError as e:
        raise RuntimeError(f"{family}: NVRTC failed ({nvrtc_err!r}) and {e}") from nvrtc_err
    warnings.warn(f"{family}: NVRTC failed ({str(nvrtc_err)[:200]}); using an nvcc-built cubin", stacklevel=3)
    return cp.RawModule(path=str(out))


def get_kernel(family: str, name: str, options: tuple[str, ...] = (), target: str | None = None) -> Any:
    """``cupy.RawKernel`` for ``extern "C"`` function ``name`` of ``family`` (``target``: see
    :func:`load_module`)."""
    return load_module(family, tuple(options), target).get_function(name)


def as_cupy(t: Any) -> Any:
    """Zero-copy CuPy view of a torch CUDA tensor (DLPack)."""
    import cupy as cp

    return cp.from_dlpack(t)


_STREAMS: dict[tuple[int, int], Any] = {}


def torch_stream() -> Any:
    """torch's current CUDA stream as a CuPy stream (cached per stream and device)."""
    import cupy as cp

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
    conv = _kernel_args(args)
    grid = (grid,) if isinstance(grid, int) else tuple(grid)
    block = (block,) if isinstance(block, int) else tuple(block)
    stream = torch_stream()
    with stream:
        kernel(grid, block, tuple(conv), shared_mem=shared_mem, stream=stream)


def _kernel_args(args: Sequence[Any]) -> list[Any]:
    """:func:`launch`'s argument conversion: torch CUDA tensors -> uint64 device pointers, Python ints and bools ->
    int32, floats -> float32, numpy scalars as they are."""
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
    return conv


_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6   # cuda.h, CUlaunchAttributeID


def launch_dependent(kernel: Any, grid: int, block: int, args: Sequence[Any]) -> None:
    """Launch ``kernel`` (1-D grid and block, no dynamic shared memory) on torch's current stream with programmatic
    dependent launch: it may begin while the kernel before it on the stream is still running, and must itself
    execute ``griddepcontrol.wait`` before it reads what that kernel writes (the kernel before it lets it start
    early with ``griddepcontrol.launch_dependents``). Through the driver's ``cuLaunchKernelEx`` (CuPy has no launch
    attributes); works under CUDA-graph capture. ``args`` as :func:`launch`'s."""
    if not (isinstance(grid, int) and isinstance(block, int)) or grid < 1 or block < 1:
        raise ValueError(f"launch_dependent takes a positive int grid and block, got {grid!r}, {block!r}")
    cu = libcuda()
    values = []
    for a in _kernel_args(args):
        ctype = {np.dtype(np.uint64): ctypes.c_uint64, np.dtype(np.int32): ctypes.c_int32,
                 np.dtype(np.float32): ctypes.c_float}.get(np.asarray(a).dtype)
        if ctype is None:
            raise ValueError(f"launch_dependent: unsupported argument type {type(a).__name__}")
        values.append(ctype(a.item() if hasattr(a, "item") else a))
    params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
    attr = _LaunchAttr(id=_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
    cfg = _LaunchConfig(grid, 1, 1, block, 1, 1, 0, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream),
                        ctypes.pointer(attr), 1)
    fptr = getattr(kernel, "ptr", None) or kernel.kernel.ptr
    err = cu.cuLaunchKernelEx(ctypes.byref(cfg), ctypes.c_void_p(fptr), params, None)
    if err != 0:
        name = ctypes.c_char_p()
        cu.cuGetErrorName(err, ctypes.byref(name))
        raise RuntimeError(f"cuLaunchKernelEx failed: {name.value.decode() if name.value else err}")


class _LaunchAttr(ctypes.Structure):
    """CUlaunchAttribute (cuda.h): the id, 4 bytes of padding, a 64-byte value union (an int here)."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int), ("rest", ctypes.c_char * 60)]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuda.h)."""
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttr)), ("numAttrs", ctypes.c_uint)]


@functools.lru_cache(maxsize=1)
def libcuda() -> Any:
    """The CUDA driver library through ``ctypes``, loaded once (``OSError`` where there is none), for the calls CuPy
    does not expose (``cuLaunchKernelEx``, for programmatic dependent launch)."""
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuLaunchKernelEx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.cuLaunchKernelEx.restype = ctypes.c_int
    return lib
