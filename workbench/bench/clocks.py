"""A GPU's clocks and power under load: ``nvidia-smi`` sampled while CUDA graphs replay back to back.

- :class:`smi_sampler` - samples ``nvidia-smi`` every few ms while a block runs (dicts of ``t`` in s,
  ``sm_mhz``, ``mem_mhz``, ``power_w``, ``temp_c`` and the clock-event bit mask ``reasons``).
- :func:`clock_phases` - phases of graph replays with the clocks, power and clock-event reasons inside each.
"""
from __future__ import annotations

import csv
import datetime as _dt
import io
import shutil
import statistics
import subprocess
import threading
import time
from typing import Any, Callable

import torch

SMI_FIELDS = ("timestamp", "clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "clocks_event_reasons.active")
# nvidia-smi clock-event reason bits (nvmlClocksEventReason*)
CLOCK_EVENT_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                       0x20: "sync_boost", 0x40: "sw_thermal", 0x80: "hw_thermal", 0x100: "hw_power_brake"}


def clock_event_reason_names(mask: int) -> list[str]:
    """Names of the clock-event reason bits set in ``mask`` (:data:`CLOCK_EVENT_REASONS`)."""
    return [n for b, n in CLOCK_EVENT_REASONS.items() if mask & b]


class smi_sampler:
    """Context manager: sample ``nvidia-smi`` every ``period_ms`` while the block runs. The list it yields is
    filled when the block ends: one dict per sample, ``t`` (seconds, ``time.time()``'s clock, from nvidia-smi's own
    timestamp: its output reaches a pipe in blocks), ``sm_mhz``, ``mem_mhz``, ``power_w``, ``temp_c``, ``reasons``
    (the active clock-event bit mask). Raises if nvidia-smi is missing or gives no sample."""

    def __init__(self, period_ms: int = 20):
        self.exe = shutil.which("nvidia-smi")
        if self.exe is None:
            raise RuntimeError("nvidia-smi not found: sampling clocks needs it")
        self.period_ms = period_ms
        self.out: list[dict[str, Any]] = []

    def __enter__(self) -> list[dict[str, Any]]:
        self.fields = list(SMI_FIELDS)
        probe = subprocess.run([self.exe, f"--query-gpu={self.fields[-1]}", "--format=csv,noheader"],
                               capture_output=True)
        if probe.returncode:
            self.fields[-1] = "clocks_throttle_reasons.active"   # the field's name before the rename
        self.proc = subprocess.Popen([self.exe, f"--query-gpu={','.join(self.fields)}", "--format=csv,noheader,nounits",
                                      f"-lms={self.period_ms}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: list[str] = []

        def reader() -> None:
            for line in self.proc.stdout:
                self.lines.append(line.strip())

        self.thread = threading.Thread(target=reader, daemon=True)
        self.thread.start()
        time.sleep(0.2)
        return self.out

    def __exit__(self, *exc: Any) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.thread.join(timeout=5)
        for line in self.lines:
            parts = [q.strip() for q in next(csv.reader(io.StringIO(line)), [])]
            if len(parts) != len(self.fields):
                continue
            try:
                t = _dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                self.out.append({"t": t, "sm_mhz": float(parts[1]), "mem_mhz": float(parts[2]),
                                 "power_w": float(parts[3]), "temp_c": float(parts[4]), "reasons": int(parts[5], 16)})
            except ValueError:
                continue
        if not self.out and exc[0] is None:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"nvidia-smi gave no samples: {err.strip()[:300]}")


def replay_for(replay: Callable[[], Any], seconds: float, calls: int) -> tuple[float, float, list[float]]:
    """Replay ``replay`` (a graph of ``calls`` calls) back to back for about ``seconds``; returns (start, end) on
    ``time.time()``'s clock and the per-call ms of every replay (CUDA events)."""
    per_call = []
    t0 = time.time()
    while time.time() - t0 < seconds:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        replay()
        b.record()
        b.synchronize()
        per_call.append(a.elapsed_time(b) / calls)
    return t0, time.time(), per_call


def clock_phases(phases: list[tuple[str, Callable[[], Any], int]], seconds: float = 3.0,
                 idle_s: float = 1.0, period_ms: int = 20) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each phase (label, graph replay, calls per replay) replayed back to back for ``seconds``, ``idle_s`` idle
    before the first and after each, ``nvidia-smi`` sampled every ``period_ms`` throughout. Per phase: replays,
    per-call ms of the first 5 replays and of the second half (medians), and over the samples inside the phase
    (its first tenth left out) the SM clock (median, min), power (median, max), the hottest temperature and the
    union of the clock-event reasons. Returns (rows, samples: smi, windows, per-call ms, idle SM clock)."""
    windows, per_call = {}, {}
    with smi_sampler(period_ms) as smi:
        time.sleep(idle_s)
        for label, replay, calls in phases:
            t0, t1, pc = replay_for(replay, seconds, calls)
            windows[label], per_call[label] = (t0, t1), pc
            time.sleep(idle_s)
    rows = []
    first = windows[phases[0][0]][0] if phases else float("inf")
    idle = [q["sm_mhz"] for q in smi if q["t"] < first]
    for label, _, _ in phases:
        t0, t1 = windows[label]
        inside = [q for q in smi if t0 + 0.1 * (t1 - t0) <= q["t"] <= t1]
        pc = per_call[label]
        mask = 0
        for q in inside:
            mask |= q["reasons"]
        rows.append({"phase": label, "replays": len(pc), "seconds": t1 - t0,
                     "first5_ms_per_call": statistics.median(pc[:5]),
                     "second_half_ms_per_call": statistics.median(pc[len(pc) // 2:]),
                     "smi_samples": len(inside),
                     "sm_mhz_median": statistics.median(q["sm_mhz"] for q in inside) if inside else None,
                     "sm_mhz_min": min(q["sm_mhz"] for q in inside) if inside else None,
                     "power_w_median": statistics.median(q["power_w"] for q in inside) if inside else None,
                     "power_w_max": max(q["power_w"] for q in inside) if inside else None,
                     "temp_c_max": max(q["temp_c"] for q in inside) if inside else None,
                     "reasons": clock_event_reason_names(mask)})
    return rows, {"smi": smi, "windows": windows, "per_call_ms": per_call,
                  "idle_sm_mhz_median": statistics.median(idle) if idle else None}
