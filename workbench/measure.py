"""Measuring helpers shared by the benchmarks, the sweep, the acceptance bench and the projection.

- :func:`provenance` - who/what/where of a measurement (GPU, driver, CUDA,
  torch/cupy versions, git commit, date).
- :func:`time_cuda` - CUDA-event timing, warm-up first, raw samples in ms.
- :func:`time_cuda_queued` - the same with a sleep kernel queued ahead of each
  sample, so the host's launch latency falls outside the events.
- :func:`time_cuda_spans` - device time per call from the CUDA profiler's kernel
  records (first kernel start to last kernel end), no events at all;
  :func:`graph_launch_latency` - the host's launch latency of a tiny graph;
  :func:`busy_us` - the GPU-busy time of a set of kernel records.
- :func:`capture_graphs` / :func:`time_in_graph` - CUDA graphs of callables, and
  the device time per call of many calls captured back to back in ONE graph.
- :func:`measure_copy_bandwidth` / :func:`measure_bf16_matmul_tflops` - the
  two ceilings (floors' denominators), measured in the same run as the kernel they judge.
- :func:`write_measurement` / :func:`load_measurement` - the JSON files under
  ``data/measurements/<gpu>/<name>.json`` that notebooks and papers read.
- :func:`prompts_for` - seeded random prompts (token ids) a measurement feeds an engine.

Samples are Python floats in ms unless a name says otherwise. The clock and power sampling of a
benchmark lives in :mod:`workbench.bench.clocks`.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from workbench import MEASUREMENTS_DIR, REPO_ROOT
from workbench.dispatch import dispatch_for


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=REPO_ROOT)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> str | None:
    """The commit the measured code came from.

    ``WORKBENCH_COMMIT`` wins (the device machine receives a copy of the tree
    without ``.git``); otherwise ``git rev-parse HEAD`` plus ``-dirty`` when
    the tree has uncommitted changes.
    """
    env = os.environ.get("WORKBENCH_COMMIT")
    if env:
        return env
    head = _run(["git", "rev-parse", "HEAD"])
    if head is None:
        return None
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return head + ("-dirty" if dirty else "")


def provenance() -> dict[str, Any]:
    """Environment record stored with every measurement."""
    info: dict[str, Any] = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "host": platform.node(),
    }
    info["torch"] = torch.__version__
    info["cuda_runtime"] = torch.version.cuda
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info["gpu"] = p.name
        info["gpu_sm_count"] = p.multi_processor_count
        info["gpu_memory_bytes"] = p.total_memory
        info["gpu_capability"] = f"{p.major}.{p.minor}"
    info["dispatch"] = dispatch_for().record()   # which kernels this GPU runs; generic=True: no table of its own
    try:
        import cupy

        info["cupy"] = cupy.__version__
    except ImportError:  # cupy (optional) not installed, or its CUDA libraries missing
        info["cupy"] = None
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem",
                "--format=csv,noheader"])
    if smi:
        fields = [f.strip() for f in smi.splitlines()[0].split(",")]
        info["driver"] = fields[1] if len(fields) > 1 else None
        info["nvidia_smi"] = smi.splitlines()[0]
    nvcc = _run(["nvcc", "--version"])
    if nvcc:
        info["nvcc"] = nvcc.splitlines()[-1]
    return info


def time_cuda(fn: Callable[[], Any], *, warmup: int = 10, reps: int = 50,
              setup: Callable[[int], Any] | None = None, sleep_cycles: int = 0) -> list[float]:
    """Time ``fn`` with CUDA events; returns ``reps`` samples in milliseconds.

    ``setup(i)``, when given, runs before repeat ``i`` outside the timed region
    (rotate inputs larger than L2 there). ``sleep_cycles`` > 0 queues a sleep
    kernel of that many SM cycles ahead of each sample's start event
    (:func:`time_cuda_queued`).
    """
    for i in range(warmup):
        if setup is not None:
            setup(i)
        fn()
    torch.cuda.synchronize()
    samples = []
    for i in range(reps):
        if setup is not None:
            setup(i)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        if sleep_cycles:
            torch.cuda._sleep(sleep_cycles)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return samples


def time_cuda_queued(fn: Callable[[], Any], *, warmup: int = 3, reps: int = 20,
                     setup: Callable[[int], Any] | None = None, sleep_cycles: int = 500_000) -> list[float]:
    """Like :func:`time_cuda`, but each sample's start event is queued behind a sleep kernel of
    ``sleep_cycles`` SM cycles (~0.25 ms at 2 GHz): the host issues ``fn``'s launches while the GPU
    sleeps, so the events hold the device time of ``fn`` without the host's launch latency, which
    :func:`time_cuda` counts whenever the GPU is idle when ``fn`` is called. Samples in ms."""
    return time_cuda(fn, warmup=warmup, reps=reps, setup=setup, sleep_cycles=sleep_cycles)


def busy_us(spans: Iterable[tuple[float, float]]) -> float:
    """The length of the union of ``spans`` ((start, end) intervals, any order, in us): the time at least one ran
    (a step's GPU-busy time from its kernel, copy and memset records)."""
    busy, end = 0.0, float("-inf")
    for a, b in sorted((float(a), float(b)) for a, b in spans):
        if b > end:
            busy += b - max(a, end)
            end = b
    return busy


def kernel_spans_ms(kernels: Iterable[tuple[float, float]], calls: int) -> list[float]:
    """Per-call device spans from kernel records: ``kernels`` are (start_us, end_us) intervals of ``calls`` calls
    that ran one after another (a synchronisation between calls), each call the same number of kernels; sorted by
    start, they are cut into ``calls`` equal consecutive groups, and each group gives its first start to its last end,
    in ms. Raises ValueError when the records do not split evenly or two consecutive groups overlap (the calls did
    not run one at a time)."""
    ks = sorted((float(s), float(e)) for s, e in kernels)
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    if not ks or len(ks) % calls:
        raise ValueError(f"{len(ks)} kernel records do not split evenly into {calls} calls: each call must launch "
                         "the same number of kernels, and every call must be recorded")
    per = len(ks) // calls
    groups = [ks[c * per:(c + 1) * per] for c in range(calls)]
    ends = [max(e for _, e in g) for g in groups]
    for c in range(calls - 1):
        if ends[c] > groups[c + 1][0][0]:
            raise ValueError(f"call {c}'s kernels end at {ends[c]:.3f} us, after call {c + 1}'s first kernel starts "
                             f"({groups[c + 1][0][0]:.3f} us): the calls overlapped, so they cannot be told apart")
    return [(end - g[0][0]) / 1e3 for g, end in zip(groups, ends)]


def time_cuda_spans(fn: Callable[[], Any], *, reps: int = 20, warmup: int = 3,
                    setup: Callable[[int], Any] | None = None, copies: bool = False) -> tuple[list[float], int]:
    """Device time of ``fn`` from the CUDA profiler's kernel records (CUPTI, through ``torch.profiler``): each of
    ``reps`` calls runs alone on an idle GPU (synchronised before and after), and its sample is its first kernel's
    start to its last kernel's end (:func:`kernel_spans_ms`). No CUDA event and none of the host's launch latency is
    in it; copies and memsets (``setup``'s routing copies) are left out unless ``copies`` (``fn`` is a copy: then
    ``setup`` must not queue any). ``setup(i)`` runs before call ``i``
    outside the span. Returns (samples in ms, kernels per call). Raises RuntimeError when the profiler recorded no
    kernel."""
    for i in range(warmup):
        if setup is not None:
            setup(i)
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            if setup is not None:
                setup(i)
            torch.cuda.synchronize()
            fn()
            torch.cuda.synchronize()
    kernels = [(e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type == DeviceType.CUDA and (copies or not e.name.startswith(("Memcpy", "Memset")))]
    if not kernels:
        raise RuntimeError("the CUDA profiler recorded no kernel (CUPTI unavailable?)")
    return kernel_spans_ms(kernels, reps), len(kernels) // reps


def graph_launch_latency(reps: int = 50) -> dict[str, Any]:
    """The host's share of a one-replay sample on this machine: a CUDA graph of one tiny kernel timed as one replay on
    an idle GPU (:func:`time_cuda`: the host's launch latency inside) and queued behind a sleep kernel
    (:func:`time_cuda_queued`: the kernel's device time alone). ``latency_ms`` is the difference of the medians;
    ``raw_latency_ms`` the same for the graph launched by ``cudaGraphLaunch`` through cupy (``raw_error`` if not)."""
    x = torch.zeros(1, device="cuda")
    [g] = capture_graphs([lambda: x.add_(1.0)])
    one = time_cuda(g.replay, warmup=10, reps=reps)
    queued = time_cuda_queued(g.replay, warmup=3, reps=reps)
    out: dict[str, Any] = {
        "one_replay_ms": one, "queued_ms": queued, "one_replay_ms_median": median(one),
        "queued_ms_median": median(queued), "latency_ms": median(one) - median(queued),
        "what": "one CUDA graph holding one 1-element add: one replay on an idle GPU minus the same queued; "
                "raw_*: the same graph launched by cudaGraphLaunch through cupy, without torch's replay()"}
    try:   # how much of the latency is torch's replay() path: the executable graph launched directly
        import cupy

        exe, stream = g.raw_cuda_graph_exec(), torch.cuda.current_stream().cuda_stream
        raw = time_cuda(lambda: cupy.cuda.runtime.graphLaunch(exe, stream), warmup=10, reps=reps)
        out.update(raw_one_replay_ms=raw, raw_one_replay_ms_median=median(raw),
                   raw_latency_ms=median(raw) - median(queued))
    except (ImportError, AttributeError, RuntimeError) as exc:  # cupy, the raw handle or the launch: the torch numbers stand
        out["raw_error"] = repr(exc)[:300]
    del g
    return out


def capture_graphs(fns: Iterable[Callable[[], Any]]) -> list[Any]:
    """One CUDA graph per callable, each warmed up once on a side stream first (so that lazy
    initialisation stays out of the capture); returns the ``torch.cuda.CUDAGraph`` objects."""
    fns = list(fns)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graphs = []
    for fn in fns:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        graphs.append(g)
    torch.cuda.synchronize()
    return graphs


def time_in_graph(fns: list[Callable[[], Any]], reps: int, min_calls: int = 16,
                  after: Callable[[], Any] | None = None) -> tuple[list[float], int]:
    """CUDA-event samples (ms per call) of ONE CUDA graph holding ``fns`` (rotated) called back to back,
    at least ``min_calls`` calls and every callable equally often: the device time of a call as it runs
    inside a longer captured step (an engine's decode graph), with no host launch latency in it; each call
    still pays its kernels' launch gaps inside the graph. ``after()``, when given, runs once after the
    timed replays while the graph (and what its calls wrote) is still alive, e.g. to check outputs.
    Returns (samples, calls per replay)."""
    calls = max(min_calls, len(fns))
    calls = len(fns) * math.ceil(calls / len(fns))

    def all_calls() -> None:
        for i in range(calls):
            fns[i % len(fns)]()

    [g] = capture_graphs([all_calls])
    samples = time_cuda(g.replay, warmup=3, reps=reps)
    if after is not None:
        after()
    del g
    return [t / calls for t in samples], calls


def time_cpu(fn: Callable[[], Any], *, warmup: int = 2, reps: int = 20) -> list[float]:
    """Wall-clock samples in milliseconds for CPU code (``time.perf_counter``)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def median(samples: Iterable[float]) -> float:
    return float(statistics.median(list(samples)))


@contextlib.contextmanager
def _device_copy(nbytes: int):
    """A device-to-device copy of ``nbytes`` (float32 buffers, random source): yields (the copy as a callable, bytes
    moved = read + written); the buffers are freed when the block ends."""
    src = torch.empty(nbytes // 4, device="cuda", dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    try:
        yield (lambda: dst.copy_(src)), 2 * src.numel() * 4
    finally:
        del src, dst
        torch.cuda.empty_cache()


def measure_copy_bandwidth(nbytes: int = 2 << 30, reps: int = 20) -> dict[str, Any]:
    """Device-to-device copy bandwidth (bytes read + bytes written) in GB/s."""
    with _device_copy(nbytes) as (fn, moved):
        samples = time_cuda(fn, warmup=3, reps=reps)
    med = median(samples)
    return {"bytes_moved": moved, "samples_ms": samples, "median_ms": med,
            "gb_per_s": moved / (med * 1e-3) / 1e9}


def copy_timing_probe(nbytes: int = 2 << 30, reps: int = 20) -> dict[str, Any]:
    """The copy ceiling timed three ways in one process (what the % of copy columns divide by): one copy between two
    events on an idle GPU (:func:`measure_copy_bandwidth`'s way, host launch latency inside), queued behind a sleep
    kernel, and the profiler's span of the copy (:func:`time_cuda_spans`). GB/s (read + written) of each median."""
    with _device_copy(nbytes) as (fn, moved):
        timings = {"one": time_cuda(fn, warmup=3, reps=reps),
                   "queued": time_cuda_queued(fn, warmup=3, reps=reps, sleep_cycles=4_000_000),
                   "span": time_cuda_spans(fn, reps=reps, copies=True)[0]}
    out: dict[str, Any] = {"bytes_moved": moved}
    for key, samples in timings.items():
        out[f"{key}_ms"] = samples
        out[f"{key}_gb_per_s"] = moved / (median(samples) * 1e-3) / 1e9
    return out


def measure_bf16_matmul_tflops(n: int = 8192, reps: int = 10) -> dict[str, Any]:
    """Dense bf16 matrix rate through torch (cuBLAS) on random data, TFLOP/s."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    samples = time_cuda(lambda: a @ b, warmup=3, reps=reps)
    med = median(samples)
    del a, b
    torch.cuda.empty_cache()
    return {"n": n, "samples_ms": samples, "median_ms": med,
            "tflops": 2 * n**3 / (med * 1e-3) / 1e12}


def gpu_slug() -> str:
    """Short folder name for the current GPU (``h200``, ``h100``, ``cpu``...)."""
    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name(0).lower()
    for key in ("h200", "h100", "b300", "b200", "a100", "l40s"):
        if key in name:
            return key
    if "rtx pro 6000" in name:
        return "rtx-pro-6000"
    return name.replace("nvidia ", "").replace(" ", "-")


def write_measurement(name: str, *, parameters: dict[str, Any], results: Any,
                      samples: Any = None, notes: str | None = None,
                      out_dir: str | os.PathLike | None = None,
                      extra: dict[str, Any] | None = None) -> Path:
    """Write ``<out_dir>/<name>.json`` with provenance; returns the path.

    ``out_dir`` defaults to ``data/measurements/<gpu_slug()>``; benchmarks
    run on the device machine pass ``$OUT``.
    """
    out = Path(out_dir) if out_dir is not None else MEASUREMENTS_DIR / gpu_slug()
    out.mkdir(parents=True, exist_ok=True)
    doc = {"name": name, "provenance": provenance(), "parameters": parameters,
           "results": results, "samples": samples, "notes": notes}
    if extra:
        doc.update(extra)
    path = out / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1, default=_json_default) + "\n")
    return path


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def load_measurement(name: str, gpu: str = "h200") -> dict[str, Any] | None:
    """The committed measurement ``data/measurements/<gpu>/<name>.json`` or None."""
    path = MEASUREMENTS_DIR / gpu / f"{name}.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())


def prompts_for(context: int, count: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """``count`` seeded random prompts of ``context`` tokens (ids in [0, vocab)), as lists of ints."""
    g = torch.Generator().manual_seed(seed * 100003 + context)
    return torch.randint(0, vocab, (count, context), generator=g).tolist()
