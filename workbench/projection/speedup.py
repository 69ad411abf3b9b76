"""DDTree's tokens/s over greedy decoding's on the measured engine step, at a measured accepted length.

tokens/s = accepted length / step time, and greedy decoding accepts one token per step, so at concurrency C
(both steps batched over the same C requests)

    DDTree / greedy = accepted length x greedy step / DDTree step,

and DDTree pays only above the break-even accepted length DDTree step / greedy step. The step times are the
engine_step measurement's graph-replay rows at C (:func:`workbench.projection.overhead.measured_steps`: the fuse
mode the engine dispatches by default; a step's time does not depend on what it accepts). The accepted length is
either the trained drafter's, from the acceptance measurement at the engine step's block and budget
(:func:`trained_speedups`, one per text type measured), or the scripted drafter's that the engine step ran with
(:func:`scripted_speedup`). No measured number is typed here.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from workbench.acceptance.measure import measured_rows
from workbench.projection.overhead import MeasuredStep, measured_steps

__all__ = ["Speedup", "scripted_speedup", "trained_speedups"]


@dataclasses.dataclass(frozen=True)
class Speedup:
    """DDTree against greedy decoding at concurrency ``C``: ``accepted`` tokens per DDTree step (root included),
    from ``source`` (a text type of the trained drafter, or the scripted drafter's p_top), over the two measured
    steps."""

    source: str
    block: int
    budget: int
    C: int
    accepted: float
    greedy: MeasuredStep
    ddtree: MeasuredStep

    @property
    def break_even(self) -> float:
        """The accepted length at which DDTree's tokens/s equals greedy's: DDTree step / greedy step."""
        return self.ddtree.wall_ms / self.greedy.wall_ms

    @property
    def ratio(self) -> float:
        """DDTree's tokens/s over greedy's: accepted length / break-even."""
        return self.accepted / self.break_even


def _shape(engine_doc: Mapping[str, Any]) -> tuple[int, int]:
    """The engine step's (block, budget); ValueError when its parameters lack them."""
    par = engine_doc.get("parameters") or {}
    if "block" not in par or "budget" not in par:
        raise ValueError("the engine_step document's parameters lack block / budget")
    return int(par["block"]), int(par["budget"])


def trained_speedups(engine_doc: Mapping[str, Any], acceptance_doc: Mapping[str, Any], C: int = 1
                     ) -> list[Speedup]:
    """One :class:`Speedup` per text type the acceptance document measured at the engine step's block and budget,
    in the document's order, over the engine step's greedy and DDTree rows at ``C``. ValueError when either
    document lacks what is needed (the message names it)."""
    block, budget = _shape(engine_doc)
    steps = measured_steps(engine_doc, C=C)
    rows = [r for r in measured_rows(dict(acceptance_doc)) if (r["block"], r["budget"]) == (block, budget)]
    if not rows:
        raise ValueError(f"the acceptance document has no row at the engine step's block {block}, budget {budget}")
    return [Speedup(r["text_type"], block, budget, C, float(r["mean_accepted"]), steps["greedy"], steps["ddtree"])
            for r in rows]


def scripted_speedup(engine_doc: Mapping[str, Any], C: int = 1, p_top: float | None = None) -> Speedup:
    """:class:`Speedup` of the engine step's own DDTree row at ``C`` and ``p_top`` (default the highest scripted
    acceptance the file measured), at the accepted length that row recorded."""
    block, budget = _shape(engine_doc)
    p_tops = (engine_doc.get("parameters") or {}).get("p_tops") or []
    p_top = p_top if p_top is not None else (max(p_tops) if p_tops else None)
    steps = measured_steps(engine_doc, C=C, p_top=p_top)
    dd = steps["ddtree"]
    if dd.mean_accepted is None:
        raise ValueError(f"the engine step's {dd.label} row has no mean_accepted")
    label = "scripted drafter" if dd.p_top is None else f"scripted drafter (p_top {dd.p_top:g})"
    return Speedup(label, block, budget, C, dd.mean_accepted, steps["greedy"], dd)
