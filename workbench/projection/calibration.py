"""Calibration of the step-cost model: this workbench's H200 measurements where present,
the source's anchors otherwise.

Measurement files (``data/measurements/h200/<name>.json``, read with
:func:`workbench.measure.load_measurement`, or given as paths):

- ``moe_bandwidth`` -> the MoE kernel's fraction of the copy bandwidth per M
  (uniform routing) and the copy bandwidth of the same run;
- ``ddtree_kernels`` / ``ddtree_verify`` -> the verify attention's time and floor
  per prefix length (at heads = 64 / tp), fitted as fixed + floor / efficiency,
  and the GPU tree-build time per budget;
- ``engine_step`` -> a measured step breakdown, shown beside the model (not
  fitted).

Their layouts are read defensively (see :func:`_records`): records are dicts
found anywhere under ``results``; a file whose records cannot be read is
reported in :attr:`Calibration.notes` and the anchors are used instead. No
measured number is typed here.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from workbench.measure import load_measurement
from workbench.moe.dispatched import SMALL_COMPARE, small_path_rows
from workbench.projection.model import (GpuSpec, Range, default_model, load_anchors, load_assumptions, load_gpu,
                                        moe_layer_bytes)

MEASUREMENT_NAMES = ("moe_bandwidth", "ddtree_kernels", "ddtree_verify", "engine_step")


# ---------------------------------------------------------------------------
# Reading measurement files defensively
# ---------------------------------------------------------------------------
def _records(obj: Any, path: tuple = ()) -> Iterator[tuple[tuple, dict]]:
    """Every dict under ``obj`` with the keys that led to it (list indices skipped)."""
    if isinstance(obj, dict):
        yield path, obj
        for k, v in obj.items():
            yield from _records(v, path + (str(k),))
    elif isinstance(obj, list):
        for v in obj:
            yield from _records(v, path)


def _num(d: Mapping[str, Any], *keys: str) -> float | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    return None


def _text(path: tuple, d: Mapping[str, Any]) -> str:
    parts = list(path) + [str(v) for k, v in d.items() if isinstance(v, str)]
    return " ".join(parts).lower()


_M_KEYS = ("m", "M", "tokens", "num_tokens", "n_tokens")
_MS_KEYS = ("median_ms_per_layer", "ms_per_layer", "median_ms", "time_ms", "ms")
_PCT_COPY_KEYS = ("percent_of_copy_bandwidth", "pct_of_copy_bandwidth", "percent_of_copy", "pct_of_copy",
                  "percent_of_measured_bandwidth", "pct_of_measured_bandwidth", "percent_of_bandwidth",
                  "pct_bandwidth", "percent_of_peak", "pct_of_peak")
_FRAC_COPY_KEYS = ("fraction_of_copy_bandwidth", "fraction_of_copy", "frac_of_copy")
_BYTES_KEYS = ("bytes_moved", "bytes", "weight_bytes")
_COPY_KEYS_GBPS = ("copy_gb_per_s", "copy_bandwidth_gb_per_s", "measured_copy_gb_per_s", "gb_per_s")
_COPY_KEYS_BPS = ("copy_bytes_per_s", "copy_bandwidth_bytes_per_s", "measured_copy_bytes_per_s",
                  "bandwidth_bytes_per_s")
_PEER_WORDS = ("cublas", "torch", "dequant", "bf16_peer", "peer", "reference", "skew")


def _is_peer(text: str) -> bool:
    return any(w in text for w in _PEER_WORDS)


def _bps(d: Mapping[str, Any], *extra_tbps: str) -> float | None:
    """A bandwidth in bytes/s from whichever unit ``d`` records it in (B/s, GB/s, TB/s)."""
    v = _num(d, *_COPY_KEYS_BPS)
    if v:
        return v
    v = _num(d, *_COPY_KEYS_GBPS)
    if v:
        return v * 1e9
    v = _num(d, *extra_tbps) if extra_tbps else None
    return v * 1e12 if v else None


def _copy_bandwidth(doc: Mapping[str, Any]) -> float | None:
    """The copy bandwidth (bytes/s) measured in the same run, if the file records one."""
    for path, d in _records(doc.get("results")):
        if "copy" in _text(path, d):
            v = _bps(d, "copy_tb_per_s", "tb_per_s")
            if v:
                return v
    for d in (doc.get("parameters") or {}, doc.get("results") or {}):
        if isinstance(d, dict):
            v = _bps(d)
            if v:
                return v
    return None


def moe_points_from_measurement(doc: Mapping[str, Any]) -> list[tuple[float, float]]:
    """(M, fraction of the copy bandwidth) of the workbench MoE kernel, uniform routing, sorted by M.

    Uses a recorded percent/fraction of the copy bandwidth when present, else
    bytes moved / (median ms x the run's copy bandwidth).
    """
    copy_bw = _copy_bandwidth(doc)
    pts: dict[float, float] = {}
    for path, d in _records(doc.get("results")):
        m = _num(d, *_M_KEYS)
        if m is None or m < 1:
            continue
        t = _text(path, d)
        if _is_peer(t):
            continue
        frac = _num(d, *_FRAC_COPY_KEYS)
        if frac is None:
            pct = _num(d, *_PCT_COPY_KEYS)
            if pct is not None:
                frac = pct / 100.0
        if frac is None:
            ms = _num(d, *_MS_KEYS)
            nbytes = _num(d, *_BYTES_KEYS)
            if ms and nbytes and copy_bw:
                frac = nbytes / (ms * 1e-3) / copy_bw
        if frac is not None and 0 < frac < 2 and m not in pts:
            pts[m] = frac
    return sorted(pts.items())


def attention_points_from_measurement(doc: Mapping[str, Any], heads: int) -> list[tuple[float, float, float]]:
    """(prefix length, median ms, floor ms) of the verify attention at ``heads`` heads, sorted by prefix.
    The floor is the record's ``floor_ms`` or, failing that, median x its percent/fraction of floor."""
    pts: dict[float, tuple[float, float]] = {}
    whole = "verify" in str(doc.get("name", "")).lower()  # a ddtree_verify file: every record is verify
    for path, d in _records(doc.get("results")):
        t = _text(path, d)
        if not whole and "verify" not in t and "attention" not in t:
            continue
        if _is_peer(t) and "workbench" not in t:
            continue
        prefix = _num(d, "prefix", "prefix_len", "prefix_length", "context", "P")
        h = _num(d, "heads", "H", "num_heads", "n_heads")
        if prefix is None or (h is not None and int(h) != heads):
            continue
        ms = _num(d, "median_ms", "ms", "time_ms")
        floor = _num(d, "floor_ms")
        if ms and floor is None:
            frac = _num(d, "fraction_of_floor", "frac_of_floor")
            if frac is None:
                pct = _num(d, "percent_of_floor", "pct_of_floor", "floor_percent")
                frac = None if pct is None else pct / 100.0
            floor = None if frac is None else ms * frac
        if ms and floor and ms > 0 and floor > 0 and prefix not in pts:
            pts[prefix] = (ms, floor)
    return sorted((p, ms, fl) for p, (ms, fl) in pts.items())


def fit_attention(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Fit time = fixed + floor / efficiency over (prefix, ms, floor ms) points (least squares on
    the line ms = a + b floor, a >= 0, b >= 1). Returns (fixed ms per call, efficiency = 1/b)."""
    if not points:
        raise ValueError("no attention points to fit")
    xs = [fl for _, _, fl in points]
    ys = [ms for _, ms, _ in points]
    if len(points) == 1 or max(xs) == min(xs):
        return 0.0, min(1.0, xs[0] / ys[0])
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    b = max(b, 1.0)
    a = max(0.0, my - b * mx)
    return a, 1.0 / b


def tree_build_points_from_measurement(doc: Mapping[str, Any]) -> list[tuple[float, float]]:
    """(budget, ms) of the GPU tree build, sorted by budget: per budget the fastest kernel variant,
    the CUDA-graph time when recorded (``gpu_graph_ms``), else the eager one. The benchmark times a
    batch (64 requests, one thread block each); at C=1 one block does no more work, so this is an
    upper bound for one request."""
    pts: dict[float, float] = {}
    for path, d in _records(doc.get("results")):
        if "build" not in " ".join(path).lower():
            continue
        ms = _num(d, "gpu_graph_ms", "gpu_median_ms", "gpu_eager_ms", "median_ms", "gpu_ms")
        if ms is None:
            us = _num(d, "gpu_median_us", "median_us", "gpu_us")
            ms = None if us is None else us * 1e-3
        budget = _num(d, "budget")
        if budget is None:
            budget = _num(doc.get("parameters", {}).get("build", {}) if isinstance(doc.get("parameters"), dict)
                          else {}, "budget")
        if ms is None or budget is None or ms <= 0:
            continue
        pts[budget] = min(ms, pts.get(budget, math.inf))
    return sorted(pts.items())


def cpu_tree_us_per_node_from_measurement(doc: Mapping[str, Any]) -> float | None:
    """CPU reference (Python heapq) build time per popped node, in us: cpu_ms / (batch x budget) of
    the headline build record (``parameters.build.budget``), else of the largest budget."""
    params = doc.get("parameters") if isinstance(doc.get("parameters"), dict) else {}
    headline = _num(params.get("build") or {}, "budget") if isinstance(params.get("build"), dict) else None
    per: dict[float, float] = {}
    for path, d in _records(doc.get("results")):
        if "build" not in " ".join(path).lower():
            continue
        cpu, batch, budget = _num(d, "cpu_ms"), _num(d, "batch"), _num(d, "budget")
        if cpu and batch and budget:
            per.setdefault(budget, cpu * 1e3 / (batch * budget))
    if not per:
        return None
    return per[headline] if headline in per else per[max(per)]


def engine_step_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every numeric ``*_ms`` / ``*_us`` field under ``results`` of an engine_step measurement,
    flattened as rows (record, field, value): shown beside the model, not fitted."""
    rows = []
    for path, d in _records(doc.get("results")):
        for k, v in d.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and (k.endswith("ms") or k.endswith("us")):
                rows.append({"record": "/".join(path) or "results", "field": k, "value": float(v)})
    return rows


def _interp_log(points: list[tuple[float, float]], x: float) -> float:
    """Linear interpolation in log(x); constant beyond the ends."""
    if not points:
        raise ValueError("no points to interpolate")
    if x <= points[0][0]:
        return points[0][1]
    if x >= points[-1][0]:
        return points[-1][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + w * (y1 - y0)
    return points[-1][1]


# ---------------------------------------------------------------------------
# The calibration
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Calibration:
    """Where each calibrated quantity of the model comes from.

    ``moe_measured``: (M, fraction of copy) points from a measurement, or None
    (then the source's PRO 6000 anchors are used, converted to a fraction of
    the copy bandwidth with the ranged PRO 6000 copy fraction).
    """

    moe_measured: list[tuple[float, float]] | None = None
    moe_measured_gpu: str | None = None
    moe_copy_bytes_per_s: float | None = None
    moe_file: str | None = None
    moe_small_file: str | None = None   # M <= 16 points: the dispatched path of a small-M comparison
    attention_measured: list[tuple[float, float, float]] | None = None  # (prefix, ms, floor ms)
    attention_fit: tuple[float, float] | None = None  # (fixed ms per call, efficiency of the rest)
    tree_build_measured: list[tuple[float, float]] | None = None
    cpu_tree_us_per_node_measured: float | None = None
    engine_step: dict[str, Any] | None = None
    tree_file: str | None = None
    attention_file: str | None = None
    files: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    heads_per_gpu: int = 8

    def source_stack(self) -> "Calibration":
        """This calibration with the source's stack: the MoE fraction of the PRO 6000 Marlin anchors and
        the assumed attention (SGLang's backend, not this workbench's kernel): what the B300 anchor was
        measured with, so the host overhead is fitted against it."""
        return dataclasses.replace(self, moe_measured=None, moe_measured_gpu=None, moe_copy_bytes_per_s=None,
                                   moe_file=None, moe_small_file=None, attention_measured=None, attention_fit=None)

    # -- quantities the model asks for -------------------------------------
    def moe_fraction(self, m: float, params: Mapping[str, float]) -> float:
        """Fraction of the copy bandwidth the MoE GEMM reaches at ``m`` tokens."""
        if self.moe_measured:
            return _interp_log(self.moe_measured, m)
        return _interp_log(self.anchor_moe_points(params), m)

    @staticmethod
    def anchor_moe_points(params: Mapping[str, float]) -> list[tuple[float, float]]:
        anchors = load_anchors()["anchors"]
        cfg = default_model()
        pro = load_gpu("rtx-pro-6000")
        copy = params.get("copy_fraction:rtx-pro-6000", pro.copy_fraction.central)
        pts = []
        for key in ("moe_ms_per_layer_m9", "moe_ms_per_layer_m32"):
            a = anchors[key]
            achieved = moe_layer_bytes(cfg, a["m"]) / (a["value"] * 1e-3)
            pts.append((float(a["m"]), achieved / (pro.bandwidth_bytes_per_s * copy)))
        return sorted(pts)

    def attention_layer_ms(self, floor_ms: float, params: Mapping[str, float]) -> float:
        """Verify attention per layer: fixed + floor / efficiency (measured fit, or assumptions)."""
        if self.attention_fit is not None:
            fixed, eff = self.attention_fit
        else:
            fixed, eff = params["attention_fixed_us_per_layer"] * 1e-3, params["attention_fraction_of_floor"]
        return fixed + floor_ms / eff

    def gpu_tree_build_ms(self, params: Mapping[str, float], budget: int | None = None) -> float:
        """GPU tree-build time (ms) at ``budget``: measured (interpolated in log budget) or assumed."""
        if self.tree_build_measured:
            return _interp_log(self.tree_build_measured, budget or self.tree_build_measured[-1][0])
        return params["gpu_tree_build_ms"]

    # -- ranges it contributes ----------------------------------------------
    def param_ranges(self) -> dict[str, Range]:
        """Ranged quantities the calibration needs (keys of the ``params`` dict)."""
        a = load_assumptions()
        out: dict[str, Range] = {}
        if not self.moe_measured:
            out["copy_fraction:rtx-pro-6000"] = load_gpu("rtx-pro-6000").copy_fraction
        if self.attention_fit is None:
            out["attention_fraction_of_floor"] = Range.from_json(a["attention_fraction_of_floor"])
            out["attention_fixed_us_per_layer"] = Range.from_json(a["attention_fixed_us_per_layer"], unit="us")
        if not self.tree_build_measured:
            out["gpu_tree_build_ms"] = Range.from_json(a["gpu_tree_build_ms"], unit="ms")
        cpu = Range.from_json(a["cpu_tree_us_per_node"], unit="us")
        if self.cpu_tree_us_per_node_measured is not None:
            v = self.cpu_tree_us_per_node_measured
            cpu = Range(min(v, cpu.low), v, max(v, cpu.high), f"measured: this workbench's heapq reference on "
                        f"the H200 host ({self.tree_file}); range kept from the assumption (SGLang's builder "
                        f"and host differ)", kind="measured", unit="us")
        out["cpu_tree_us_per_node"] = cpu
        return out

    def gpu_overrides(self, gpu: GpuSpec) -> dict[str, Range]:
        """Measured replacements for a GPU's ranged quantities (the copy fraction of the run)."""
        if self.moe_measured and self.moe_copy_bytes_per_s and gpu.id == self.moe_measured_gpu:
            frac = self.moe_copy_bytes_per_s / gpu.bandwidth_bytes_per_s
            return {f"copy_fraction:{gpu.id}": Range.fixed(
                frac, f"copy bandwidth measured in the same run as the MoE kernel ({self.moe_file})",
                kind="measured")}
        return {}

    @property
    def moe_source(self) -> str:
        if self.moe_measured:
            small = (f"; at M <= 16 the path dispatched today, from {Path(self.moe_small_file).name}"
                     if self.moe_small_file else "")
            return f"measured: {self.moe_measured_gpu} moe_bandwidth ({len(self.moe_measured)} M points){small}"
        return "anchors: PRO 6000 Marlin 1.18 ms/layer at M=9, 3.171 ms/layer at M=32"

    def describe(self) -> list[dict[str, str]]:
        """One row per calibrated quantity: what, value, source."""
        rows = [{"quantity": "MoE fraction of copy bandwidth", "source": self.moe_source,
                 "value": ", ".join(f"M={m:g}: {f:.3f}" for m, f in
                                    (self.moe_measured or self.anchor_moe_points({})))}]
        if self.attention_fit is not None:
            fixed, eff = self.attention_fit
            rows.append({"quantity": f"verify attention per layer ({self.heads_per_gpu} heads, 33 nodes): "
                                     f"fixed + floor / efficiency",
                         "source": f"measured: {self.attention_file} (fit over prefixes "
                                   f"{', '.join(f'{p:g}' for p, _, _ in self.attention_measured)})",
                         "value": f"fixed {fixed * 1e3:.1f} us, efficiency {eff:.2f} "
                                  f"(measured {', '.join(f'{ms * 1e3:.0f}' for _, ms, _ in self.attention_measured)} us)"})
        else:
            a = load_assumptions()
            r, f = Range.from_json(a["attention_fraction_of_floor"]), Range.from_json(a["attention_fixed_us_per_layer"])
            rows.append({"quantity": "verify attention per layer: fixed + floor / efficiency", "source": "assumption",
                         "value": f"fixed {f.low:g}-{f.high:g} us, efficiency {r.low:g}-{r.high:g}"})
        if self.tree_build_measured:
            rows.append({"quantity": "GPU tree build (batch-64 launch)", "source": f"measured: {self.tree_file}",
                         "value": ", ".join(f"budget {b:g}: {t * 1e3:.1f} us" for b, t in self.tree_build_measured)})
        else:
            r = Range.from_json(load_assumptions()["gpu_tree_build_ms"])
            rows.append({"quantity": "GPU tree build", "source": "assumption",
                         "value": f"{r.low * 1e3:g}-{r.high * 1e3:g} us"})
        if self.cpu_tree_us_per_node_measured is not None:
            rows.append({"quantity": "CPU tree build per node", "source": f"measured: {self.tree_file}",
                         "value": f"{self.cpu_tree_us_per_node_measured:.2f} us"})
        else:
            r = Range.from_json(load_assumptions()["cpu_tree_us_per_node"])
            rows.append({"quantity": "CPU tree build per node", "source": "assumption",
                         "value": f"{r.low:g}-{r.high:g} us (central {r.central:g})"})
        return rows


def _load_doc(item: str | Path | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    if isinstance(item, Mapping):
        return dict(item), str(item.get("name", "<dict>"))
    p = Path(item)
    if not p.exists():
        raise FileNotFoundError(f"calibration file {str(p)!r} does not exist")
    try:
        doc = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"calibration file {str(p)!r} is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"calibration file {str(p)!r} must hold a JSON object (a measurement file)")
    return doc, str(p)


def _kind_of(doc: Mapping[str, Any], label: str) -> str:
    name = str(doc.get("name") or Path(label).stem)
    if name.startswith("moe_small"):
        return "moe_small"
    for n in MEASUREMENT_NAMES:
        if n in name:
            return n
    raise ValueError(f"calibration file {label!r} has name {name!r}; allowed measurement names: "
                     f"{', '.join(MEASUREMENT_NAMES)}, or moe_small_* (bench --small-compare)")


def _gpu_of(doc: Mapping[str, Any], default: str) -> str:
    name = str((doc.get("provenance") or {}).get("gpu") or "").lower()
    for key in ("h200", "h100", "b300", "b200"):
        if key in name:
            return key
    if "rtx pro 6000" in name:
        return "rtx-pro-6000"
    return default


def moe_points_dispatched(points: list[tuple[float, float]], small: Mapping[str, Any]) -> list[tuple[float, float]]:
    """``points`` with the M values of a small-M comparison (``bench --small-compare``) replaced by the
    fraction of copy of the path ``fused_moe_int4`` dispatches today at that M (uniform routing), the
    path the engine runs; that comparison's rows are timed against its own run's copy bandwidth."""
    merged = dict(points)
    for r in small_path_rows(dict(small)):
        if r["routing"] == "uniform" and r["dispatched % copy"] is not None:
            merged[float(r["M"])] = r["dispatched % copy"] / 100.0
    return sorted(merged.items())


def load_calibration(files: Iterable[str | Path | Mapping[str, Any]] | None = None, *,
                     use_measurements: bool = True, gpu: str = "h200", tp: int = 8,
                     num_attention_heads: int | None = None) -> Calibration:
    """Build a :class:`Calibration`.

    ``files``: measurement files (paths or parsed dicts) that take precedence
    over the committed ones; ``use_measurements=False`` ignores the committed
    ``data/measurements/<gpu>/`` files (anchors only, the source's own stack).
    """
    heads = (num_attention_heads or default_model().num_attention_heads) // tp
    cal = Calibration(heads_per_gpu=max(heads, 1))
    docs: dict[str, tuple[dict[str, Any], str]] = {}
    for item in files or ():
        doc, label = _load_doc(item)
        docs[_kind_of(doc, label)] = (doc, label)
    if use_measurements:
        for n in MEASUREMENT_NAMES:
            if n not in docs:
                doc = load_measurement(n, gpu)
                if doc is not None:
                    docs[n] = (doc, f"data/measurements/{gpu}/{n}.json")
        if "moe_small" not in docs and docs.get("moe_bandwidth", ("", ""))[1].startswith("data/measurements/"):
            doc = load_measurement(SMALL_COMPARE, gpu)
            if doc is not None:
                docs["moe_small"] = (doc, f"data/measurements/{gpu}/{SMALL_COMPARE}.json")
    if "moe_bandwidth" in docs:
        doc, label = docs["moe_bandwidth"]
        pts = moe_points_from_measurement(doc)
        if pts:
            cal.moe_measured = pts
            cal.moe_measured_gpu = _gpu_of(doc, gpu)
            cal.moe_copy_bytes_per_s = _copy_bandwidth(doc)
            cal.moe_file = label
            cal.files.append(label)
            if "moe_small" in docs:
                sdoc, slabel = docs["moe_small"]
                cal.moe_measured = moe_points_dispatched(pts, sdoc)
                cal.moe_small_file = slabel
                cal.files.append(slabel)
        else:
            cal.notes.append(f"{label}: no MoE records with M and a fraction of the copy bandwidth "
                             f"found; using the source's anchors")
    if "moe_small" in docs and not cal.moe_small_file:
        cal.notes.append(f"{docs['moe_small'][1]}: a small-M comparison is used only beside a moe_bandwidth "
                         f"measurement (it covers M <= 16 alone); not used")
    for name in ("ddtree_kernels", "ddtree_verify"):  # verify timings may live in either file
        if name not in docs:
            continue
        doc, label = docs[name]
        used = False
        if not cal.attention_measured:
            pts = attention_points_from_measurement(doc, cal.heads_per_gpu)
            if pts:
                cal.attention_measured, cal.attention_file, used = pts, label, True
                cal.attention_fit = fit_attention(pts)
        if not cal.tree_build_measured:
            tb = tree_build_points_from_measurement(doc)
            if tb:
                cal.tree_build_measured, cal.tree_file, used = tb, label, True
                cal.cpu_tree_us_per_node_measured = cpu_tree_us_per_node_from_measurement(doc)
        if used:
            cal.files.append(label)
    if ("ddtree_kernels" in docs or "ddtree_verify" in docs) and not cal.attention_measured:
        cal.notes.append(f"no verify records at {cal.heads_per_gpu} heads with a floor in the ddtree files; "
                         f"the attention efficiency stays an assumption")
    if "engine_step" in docs:
        doc, label = docs["engine_step"]
        cal.engine_step = doc
        cal.files.append(label)
    return cal
