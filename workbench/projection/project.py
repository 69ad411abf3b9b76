"""Projection: tokens/s low / central / high and the step breakdown on any GPU of data/hardware.json.

``project(gpu, block, budget, accept)`` evaluates the step-cost model
(:mod:`workbench.projection.model`) with every ranged quantity at its central
value, then once per quantity at each end of its range (a one-at-a-time
sensitivity), and finally at the two corners made of each quantity's slower
end and faster end: those give the low and high tokens/s. The model is
monotone in each quantity, so the corners bound it.

The host overhead is calibrated, at every one of those points, on the
source's B300 anchor (303 tok/s at block 8, accepted ~4.4): overhead =
anchor step - the other terms at the anchor, the MoE term of the anchor
taken with the source's own MoE kernel (the PRO 6000 Marlin curve), since
that is what the anchor ran; the projection then uses the calibration's MoE
fraction (this workbench's kernel when its measurement is committed). ``overhead_ms`` fixes it instead;
``overhead_cut_ms`` subtracts a fixed amount from the calibrated value (the
source's "12.5 ms -> 8 ms" read as a 4.5 ms cut).

``overhead="measured"`` takes the term from this workbench's captured engine step instead
(data/measurements/h200/engine_step.json, :mod:`workbench.projection.overhead`): what the C = 1
DDTree step costs beyond its floor on the H200, its host gaps carried over unchanged and its
kernels-below-floor part scaled with the projected step's floor; MoE, dense and attention are then
taken at their floors, since the measured overhead already holds the kernels' time beyond them.

``accept`` takes numbers (an acceptance assumed or scripted) and ``"trained:<type>"`` entries
(:mod:`workbench.projection.trained`): the trained drafter's mean accepted length measured on that
text type at the projection's block and budget (data/measurements/h200/acceptance.json), recorded
with its provenance in :attr:`Projection.accept_sources`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Sequence

from workbench.decode import DEFAULT, MAX_BUDGET
from workbench.projection.calibration import Calibration, load_calibration
from workbench.projection.model import (
    FLOOR_TERMS, TERM_NAMES, TERMS, GpuSpec, Range, StepShape, default_model, load_anchors, load_assumptions,
    load_gpu, step_terms, tokens_per_s,
)
from workbench.projection import overhead as measured_overhead
from workbench.projection import trained
from workbench.validation import InvalidParameter, check_choice, check_float, check_int, check_list

ANCHOR_GPU = "b300"
SOURCE_ANCHOR, MEASURED = "source-anchor", "measured"
OVERHEAD_MODES = (SOURCE_ANCHOR, MEASURED)  # or a number of ms (a fixed host term)


def _anchor() -> dict[str, Any]:
    a = load_anchors()["anchors"]
    point = a["b300_tokens_per_s"]
    s = point["setting"]
    return {"tokens_per_s": float(point["value"]), "block": int(s["block"]), "budget": int(s["budget"]),
            "budget_range": tuple(point.get("budget_range", [s["budget"], s["budget"]])),
            "tp": int(s["tp"]), "accept": Range.from_json({"low": a["b300_accept"]["range"][0],
                                                          "central": a["b300_accept"]["value"],
                                                          "high": a["b300_accept"]["range"][1],
                                                          "source": a["b300_accept"]["source"]}, kind="anchor"),
            "context": Range.from_json({"low": a["anchor_context"]["range"][0],
                                        "central": a["anchor_context"]["value"],
                                        "high": a["anchor_context"]["range"][1],
                                        "source": a["anchor_context"]["range_reason"]})}


def _gpu_ranges(gpu: GpuSpec, calib: Calibration) -> dict[str, Range]:
    out = {f"copy_fraction:{gpu.id}": gpu.copy_fraction,
           f"matmul_fraction:{gpu.id}": gpu.matmul_fraction,
           f"matmul_flops:{gpu.id}": gpu.matmul_flops,
           f"allreduce_latency_s:{gpu.id}": gpu.allreduce_latency_s}
    out.update(calib.gpu_overrides(gpu))
    return out


def param_ranges(gpus: Iterable[GpuSpec], calib: Calibration, *, calibrated_overhead: bool = True
                 ) -> dict[str, Range]:
    """Every ranged quantity a projection onto ``gpus`` depends on, by ``params`` key."""
    a = load_assumptions()
    out: dict[str, Range] = {}
    for g in gpus:
        out.update(_gpu_ranges(g, calib))
    out["dense_fraction_of_copy"] = Range.from_json(a["dense_fraction_of_copy"])
    out["drafter_layers"] = Range.from_json(a["drafter_layers"])
    out.update(calib.param_ranges())  # includes cpu_tree_us_per_node (measured or assumed)
    if calibrated_overhead:
        # the anchor is fitted with the source's stack: the PRO 6000 MoE curve and assumed attention
        for k, r in calib.source_stack().param_ranges().items():
            out.setdefault(k, r)
        anc = _anchor()
        out["anchor_accept"] = anc["accept"]
        out["anchor_context"] = anc["context"]
    return out


def calibrate_overhead(params: Mapping[str, float], calib: Calibration, anchor_gpu: GpuSpec | None = None
                       ) -> tuple[float, dict[str, float]]:
    """Host overhead (ms) that makes the model reproduce the B300 anchor, and the anchor's terms."""
    anc = _anchor()
    gpu = anchor_gpu or load_gpu(ANCHOR_GPU)
    budget = int(params.get("anchor_budget", anc["budget"]))
    shape = StepShape(block=anc["block"], budget=budget, context=int(round(params["anchor_context"])),
                      tp=anc["tp"], tree_builder="cpu")
    terms = step_terms(shape, gpu, params, calib.source_stack())  # the anchor ran SGLang's Marlin MoE
    step = params["anchor_accept"] / anc["tokens_per_s"] * 1e3
    overhead = step - sum(terms.values())
    if overhead < 0:
        raise ValueError(f"the B300 anchor ({anc['tokens_per_s']} tok/s at accepted {params['anchor_accept']}) "
                         f"is faster than the model's device terms alone ({sum(terms.values()):.2f} ms > "
                         f"{step:.2f} ms): the calibration or assumptions are inconsistent")
    terms["overhead"] = overhead
    return overhead, terms


@dataclasses.dataclass
class Projection:
    """Result of :func:`project`. Times in ms, rates in tokens/s."""

    gpu: str
    gpu_name: str
    shape: StepShape
    accept: tuple[float, ...]
    overhead_mode: str
    tokens_per_s: list[dict[str, float]]            # per accept: accept, low, central, high
    breakdown: dict[str, dict[str, float]]          # corner ('low','central','high') -> term -> ms
    sensitivity: list[dict[str, Any]]               # per ranged quantity: step ms at its ends
    ranges: dict[str, Range]
    calibration: Calibration
    anchor_overhead_ms: dict[str, float]            # calibrated host overhead at each corner
    bandwidth_bytes_per_s: float
    measured_overhead: dict[str, Any] | None = None  # overhead='measured': the H200 step and its transfer
    accept_sources: tuple[Any, ...] = ()            # per accept: trained.TrainedAcceptance, or None (a number given)

    def accept_label(self, i: int) -> str:
        """Accepted length ``i`` as shown: the number, and ``trained:<type>`` where it was measured."""
        src = self.accept_sources[i] if i < len(self.accept_sources) else None
        return f"{self.accept[i]:g}" if src is None else f"{self.accept[i]:.3g} ({src.spec})"

    @property
    def overhead_kind(self) -> str:
        """'source-anchor', 'measured' or 'fixed'."""
        return (MEASURED if self.measured_overhead is not None else
                SOURCE_ANCHOR if self.overhead_mode.startswith("calibrated") else "fixed")

    @property
    def step_ms(self) -> dict[str, float]:
        return {k: sum(v.values()) for k, v in self.breakdown.items()}

    @property
    def lumped_overhead_ms(self) -> dict[str, float]:
        """Step minus the MoE term: what the source's single 'overhead' figure lumps together."""
        return {k: sum(v.values()) - v["moe"] for k, v in self.breakdown.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu, "gpu_name": self.gpu_name,
            "inputs": {"block": self.shape.block, "budget": self.shape.budget, "verify_tokens": self.shape.m,
                       "context": self.shape.context, "tp": self.shape.tp,
                       "tree_builder": self.shape.tree_builder, "accept": list(self.accept),
                       "overhead": self.overhead_mode, "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
                       "accept_sources": [{"source": "given"} if s is None else s.to_dict()
                                          for s in self.accept_sources]},
            "tokens_per_s": self.tokens_per_s,
            "step_ms": self.step_ms,
            "breakdown_ms": self.breakdown,
            "lumped_overhead_ms": self.lumped_overhead_ms,
            "anchor_overhead_ms": self.anchor_overhead_ms,
            "measured_overhead": self.measured_overhead,
            "sensitivity": self.sensitivity,
            "ranges": {k: dataclasses.asdict(v) for k, v in self.ranges.items()},
            "terms": [dataclasses.asdict(t) for t in TERMS],
            "calibration": {"files": self.calibration.files, "notes": self.calibration.notes,
                            "quantities": self.calibration.describe()},
        }

    def table(self) -> str:
        """Plain-text summary: tokens/s per accepted length and the step breakdown."""
        s = self.shape
        lines = [f"{self.gpu_name} ({self.gpu}), TP={s.tp}, block {s.block}, budget {s.budget} "
                 f"(M={s.m} verify tokens), context {s.context}, tree build on {s.tree_builder}, "
                 f"overhead: {self.overhead_mode}",
                 f"bandwidth {self.bandwidth_bytes_per_s / 1e12:.2f} TB/s (datasheet); MoE: {self.calibration.moe_source}",
                 "calibrated from: " + ("; ".join(self.calibration.files) if self.calibration.files else
                                        "the source's anchors only (no measurement file)")
                 + ("" if not self.calibration.files else " (--anchors-only gives the source's own stack)"),
                 "", f"{'accepted':>9} {'low':>9} {'central':>9} {'high':>9}   tokens/s"]
        for r in self.tokens_per_s:
            lines.append(f"{r['accept']:>9g} {r['low']:>9.0f} {r['central']:>9.0f} {r['high']:>9.0f}")
        for a, src in zip(self.accept, self.accept_sources):
            if src is not None:
                lines.append(f"accepted {a:g} = {src.label()}")
        lines += ["", f"{'term':<12} {'low':>8} {'central':>8} {'high':>8}   ms per step "
                  "(low/high = the slow/fast corners)"]
        for name in TERM_NAMES:
            lines.append(f"{name:<12} {self.breakdown['low'][name]:>8.2f} "
                         f"{self.breakdown['central'][name]:>8.2f} {self.breakdown['high'][name]:>8.2f}")
        st = self.step_ms
        lines.append(f"{'step':<12} {st['low']:>8.2f} {st['central']:>8.2f} {st['high']:>8.2f}")
        lo = self.lumped_overhead_ms
        lines.append(f"{'step - moe':<12} {lo['low']:>8.2f} {lo['central']:>8.2f} {lo['high']:>8.2f}"
                     "   (what the source calls 'overhead')")
        mo = self.measured_overhead
        if mo is not None:
            st, tr = mo["step"], mo["transfer"]["central"]
            lines.append(f"measured overhead: {st['method']} C={st['C']} on the {st['gpu']} ({st['file']} at "
                         f"{st['git_commit']}): wall {st['wall_ms']:.2f} - floor {st['floor_ms']:.2f} = "
                         f"{st['overhead_ms']:.2f} ms = host gaps {st['host_ms']:.2f} + kernels below floor "
                         f"{st['kernel_excess_ms']:.2f} ms; here host {tr['host_ms']:.2f} + kernels "
                         f"{st['kernel_excess_ms']:.2f} x {tr['floor_ratio']:.3f}^{tr['exponent']:g} = "
                         f"{tr['overhead_ms']:.2f} ms (moe, dense, attention at their floors)")
        for n in self.calibration.notes:
            lines.append(f"note: {n}")
        return "\n".join(lines)


def check_overhead(overhead: Any, overhead_ms: Any = None, overhead_cut_ms: Any = None) -> str | float | None:
    """The overhead choice: ``None`` (``overhead_ms`` when given, else the source's anchor), one of
    :data:`OVERHEAD_MODES`, or a number of ms >= 0; not together with ``overhead_ms``, and
    ``overhead_cut_ms`` only with the source-anchor calibration. Returns the mode or the ms."""
    allowed = (f"one of {', '.join(repr(m) for m in OVERHEAD_MODES)}, a number of ms >= 0 (a fixed host "
               f"overhead), or None")
    if overhead is None:
        return None
    if isinstance(overhead, str):
        if overhead not in OVERHEAD_MODES:
            raise InvalidParameter("overhead", overhead, allowed)
        value: str | float = overhead
    else:
        try:
            value = check_float("overhead", overhead, lo=0)
        except InvalidParameter:
            raise InvalidParameter("overhead", overhead, allowed) from None
    if overhead_ms is not None:
        raise InvalidParameter("overhead", overhead, "None when overhead_ms is given (overhead_ms is the same "
                                                     "choice as overhead=<ms>: give one of them)")
    if overhead_cut_ms is not None and value != SOURCE_ANCHOR:
        raise InvalidParameter("overhead_cut_ms", overhead_cut_ms,
                               f"None unless overhead is {SOURCE_ANCHOR!r} (the cut applies to the overhead "
                               f"calibrated on the source's anchor), got overhead={overhead!r}")
    return value


def check_inputs(gpu: Any, block: Any, budget: Any, accept: Any, overhead_ms: Any = None,
                 context: Any = StepShape.context, tp: Any = StepShape.tp, tree_builder: Any = StepShape.tree_builder,
                 overhead_cut_ms: Any = None, bandwidth_bytes_per_s: Any = None, overhead: Any = None,
                 accept_trained: Any = None, acceptance_file: Any = None
                 ) -> tuple[GpuSpec, StepShape, tuple[float, ...], tuple[Any, ...]]:
    """The rules :func:`project` applies to its inputs: the GPU, the step's shape (:class:`StepShape`:
    block and budget within the tree builder's limits, tp dividing the heads, context within YaRN),
    the accepted lengths (1 .. min(block, budget + 1), or ``trained:<type>``: the trained drafter's
    measured value at this block and budget, :mod:`workbench.projection.trained`; a single entry is a
    one-element list; ``accept_trained``: more ``trained:<type>`` entries, appended - notebook 04's
    parameter, its ``accept`` being numbers; ``acceptance_file``: read in place of
    data/measurements/h200/acceptance.json) and the overheads (>= 0 ms, one or the other;
    ``overhead``: :func:`check_overhead`). Returns the GPU, the shape, the accepted lengths (float) and
    per accepted length its :class:`~workbench.projection.trained.TrainedAcceptance` or None.
    ``workbench run`` checks notebook 04's parameters with it before the notebook runs."""
    target = load_gpu(gpu)
    if bandwidth_bytes_per_s is not None:
        target = target.with_bandwidth(check_float("bandwidth_bytes_per_s", bandwidth_bytes_per_s, lo=0,
                                                   lo_open=True))
    shape = StepShape(block=block, budget=budget, context=context, tp=tp, tree_builder=tree_builder)
    hi = min(shape.block, shape.m)
    items = check_list("accept", accept, lambda n, v: trained.check_accept_item(n, v, hi),
                       trained.accept_allowed(hi, f"the accepted length counts the root; at most block = "
                                                  f"{shape.block} and the tree's budget + 1 = {shape.m} nodes"))
    if accept_trained is not None:
        choices = trained.trained_choices()
        items += check_list("accept_trained", accept_trained, lambda n, v: check_choice(n, v, choices),
                            "entries among " + ", ".join(choices))
    acc, sources = trained.resolve("accept", items, shape.block, shape.budget, hi, acceptance_file)
    if overhead_ms is not None:
        check_float("overhead_ms", overhead_ms, lo=0)
    if overhead_cut_ms is not None:
        check_float("overhead_cut_ms", overhead_cut_ms, lo=0)
        if overhead_ms is not None:
            raise InvalidParameter("overhead_cut_ms", overhead_cut_ms,
                                   "None when overhead_ms is given (fix the overhead or cut the calibrated one)")
    check_overhead(overhead, overhead_ms, overhead_cut_ms)
    return target, shape, acc, sources


def project(gpu: str = "b300", block: int = DEFAULT.block, budget: int = DEFAULT.budget,
            accept: Sequence[float | str] | float | str = (12, 16), *,
            overhead_ms: float | None = None, overhead_cut_ms: float | None = None, context: int = StepShape.context,
            tp: int = StepShape.tp, tree_builder: str = StepShape.tree_builder,
            bandwidth_bytes_per_s: float | None = None,
            calibration: Calibration | Iterable[Any] | None = None, use_measurements: bool = True,
            anchor_budget: int | None = None, overhead: str | float | None = None,
            accept_trained: Sequence[str] | str | None = None, acceptance_file: str | None = None) -> Projection:
    """Project tokens/s at concurrency 1 on ``gpu`` (an id of data/hardware.json).

    ``accept``: one or more accepted lengths per step (root included; 1 <= a <= block), each a number or
    ``"trained:<type>"``: the trained drafter's mean accepted length measured on that text type at this block
    and budget (:mod:`workbench.projection.trained`; ``accept_trained``: more such entries, appended;
    ``acceptance_file``: read in place of data/measurements/h200/acceptance.json).
    ``overhead``: ``"source-anchor"`` (the default: calibrated on the B300 anchor), ``"measured"``
    (from the H200 engine step, :mod:`workbench.projection.overhead`; needs its file in the
    calibration) or a number of ms (fixed).
    ``overhead_ms``: the older spelling of ``overhead=<ms>`` (fix the host overhead term, ms >= 0);
    ``overhead_cut_ms``: calibrate on the anchor, then subtract this many ms.
    ``bandwidth_bytes_per_s``: what-if datasheet bandwidth for ``gpu``.
    ``anchor_budget``: the budget the B300 anchor is taken to have run at (default: the anchor
    file's, 8; the source does not state it); a structural what-if, not part of the ranges.
    ``calibration``: a :class:`Calibration` or measurement files to load; ``use_measurements``:
    read the committed data/measurements/h200 files (False = the source's anchors only).
    Raises :class:`~workbench.validation.InvalidParameter` (a ValueError) on an input outside
    :func:`check_inputs`'s rules.
    """
    target, shape, acc, sources = check_inputs(gpu, block, budget, accept, overhead_ms, context, tp, tree_builder,
                                               overhead_cut_ms, bandwidth_bytes_per_s, overhead, accept_trained,
                                               acceptance_file)
    choice = check_overhead(overhead, overhead_ms, overhead_cut_ms)
    if isinstance(choice, float):
        overhead_ms = choice
    if anchor_budget is not None:
        check_int("anchor_budget", anchor_budget, lo=1, hi=MAX_BUDGET)
    if isinstance(calibration, Calibration):
        calib = calibration
    else:
        calib = load_calibration(calibration, use_measurements=use_measurements, tp=tp)
    cfg = default_model()

    anchor_gpu = load_gpu(ANCHOR_GPU)
    measured = choice == MEASURED
    calibrated = overhead_ms is None and not measured
    gpus = [target] if not calibrated or target.id == ANCHOR_GPU else [target, anchor_gpu]
    ranges = param_ranges(gpus, calib, calibrated_overhead=calibrated)
    m_step = None
    if measured:
        m_step = measured_overhead.from_calibration(calib)["ddtree"]
        ranges[measured_overhead.EXPONENT_KEY] = measured_overhead.EXCESS_EXPONENT
    transfers: dict[int, dict[str, float]] = {}

    def evaluate(params: Mapping[str, float]) -> tuple[dict[str, float], float]:
        if measured:
            floors = step_terms(shape, target, params, calib, cfg, at_floor=True)
            floor = sum(floors[k] for k in FLOOR_TERMS)
            tr = measured_overhead.transfer(m_step, floor, params[measured_overhead.EXPONENT_KEY])
            transfers[id(params)] = tr
            terms = {k: (floors[k] if k in FLOOR_TERMS else v)
                     for k, v in step_terms(shape, target, params, calib, cfg).items()}
            terms["overhead"] = tr["overhead_ms"]
            return terms, tr["overhead_ms"]
        if calibrated:
            oh, _ = calibrate_overhead(params, calib, anchor_gpu)
            anchor_oh = oh
            if overhead_cut_ms is not None:
                oh -= overhead_cut_ms
                if oh < 0:
                    raise ValueError(f"overhead cut {overhead_cut_ms} ms exceeds the calibrated host overhead "
                                     f"{anchor_oh:.2f} ms")
        else:
            oh = anchor_oh = float(overhead_ms)
        return step_terms(shape, target, params, calib, cfg, overhead_ms=oh), anchor_oh

    fixed = {} if anchor_budget is None else {"anchor_budget": anchor_budget}

    central = {**{k: r.central for k, r in ranges.items()}, **fixed}
    base_terms, base_oh = evaluate(central)
    base_step = sum(base_terms.values())
    slow, fast = dict(central), dict(central)  # 'fixed' entries ride along in every dict
    sens = []
    for k, r in ranges.items():
        if not r.is_ranged:
            continue
        t_lo = sum(evaluate({**central, k: r.low})[0].values())
        t_hi = sum(evaluate({**central, k: r.high})[0].values())
        slow[k], fast[k] = (r.low, r.high) if t_lo >= t_hi else (r.high, r.low)
        sens.append({"quantity": k, "low": r.low, "central": r.central, "high": r.high, "kind": r.kind,
                     "source": r.source, "step_ms_at_low": t_lo, "step_ms_at_high": t_hi,
                     "swing_ms": abs(t_hi - t_lo)})
    sens.sort(key=lambda d: -d["swing_ms"])
    slow_terms, slow_oh = evaluate(slow)
    fast_terms, fast_oh = evaluate(fast)
    mo = None
    if measured:
        mo = {"step": m_step.to_dict(), "greedy": measured_overhead.from_calibration(calib)["greedy"].to_dict(),
              "transfer": {"low": transfers[id(slow)], "central": transfers[id(central)], "high": transfers[id(fast)]},
              "assumption": measured_overhead.EXCESS_EXPONENT.source}
    breakdown = {"low": slow_terms, "central": base_terms, "high": fast_terms}
    rows = [{"accept": a, "low": tokens_per_s(a, sum(slow_terms.values())),
             "central": tokens_per_s(a, base_step), "high": tokens_per_s(a, sum(fast_terms.values()))}
            for a in acc]
    if measured:
        mode = (f"measured: {m_step.label} on the {m_step.gpu}, beyond its floor "
                f"({m_step.file} at {m_step.git_commit})")
    elif overhead_ms is not None:
        mode = f"fixed {overhead_ms:g} ms"
    elif overhead_cut_ms is not None:
        mode = f"calibrated on the B300 anchor minus {overhead_cut_ms:g} ms"
    else:
        mode = "calibrated on the B300 anchor"
    return Projection(gpu=target.id, gpu_name=target.name, shape=shape, accept=acc, overhead_mode=mode,
                      tokens_per_s=rows, breakdown=breakdown, sensitivity=sens, ranges=ranges,
                      calibration=calib, anchor_overhead_ms={"low": slow_oh, "central": base_oh, "high": fast_oh},
                      bandwidth_bytes_per_s=target.bandwidth_bytes_per_s, measured_overhead=mo,
                      accept_sources=sources)
