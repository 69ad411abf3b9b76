"""The trained drafter's measured acceptance as an input, beside the scripted knob (the projection's and the sweep's ``trained:<type>``).

Wherever an acceptance is given - an accepted length in the projection (``accept``), a method of the
context sweep (``methods``) - ``"trained:<type>"`` means "the DFlash-style drafter of :mod:`workbench.acceptance`,
on held-out text of type ``<type>``" (:func:`trained_choices`: ``trained:chat``, ``trained:math``,
``trained:code``). It resolves through :func:`workbench.acceptance.measure.acceptance_for` at the
caller's block and budget, from the H100 measurement ``data/measurements/h100/acceptance.json`` (or a
file given in its place), into a :class:`TrainedAcceptance`: the measured mean accepted length (root
included) with the file's provenance, which the caller records beside its result.

Errors (workbench.validation): a spelling outside :func:`trained_choices` is an
:class:`~workbench.validation.InvalidParameter` listing them; a (type, block, budget) the file did not
measure is one listing what it did measure; no file is a FileNotFoundError naming it.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from workbench import MEASUREMENTS_DIR, REPO_ROOT
from workbench.acceptance.measure import ACCEPTANCE_FILE, acceptance_for, histogram_for
from workbench.acceptance.corpora import TEXT_TYPES
from workbench.validation import InvalidParameter, check_choice, check_float

PREFIX = "trained:"
ACCEPTANCE_GPU = "h100"   # where the acceptance was measured (a drafter's acceptance does not depend on the GPU)


def trained_choices() -> tuple[str, ...]:
    """The allowed spellings, one per text type of :data:`workbench.acceptance.corpora.TEXT_TYPES` (chat, math,
    code: the text types of the committed measurement)."""
    return tuple(PREFIX + t for t in TEXT_TYPES)


def is_trained(value: Any) -> bool:
    """Whether ``value`` asks for the trained drafter (a string starting ``trained:``; checked later)."""
    return isinstance(value, str) and value.startswith(PREFIX)


def check_trained(name: str, value: Any) -> str:
    """``value`` one of :func:`trained_choices`; returns its text type (``"trained:math"`` -> ``"math"``)."""
    return check_choice(name, value, trained_choices())[len(PREFIX):]


@dataclasses.dataclass(frozen=True)
class TrainedAcceptance:
    """The trained drafter's measured mean accepted length (root included) on ``text_type`` at ``block`` and
    ``budget``, with where it comes from: ``file`` (repository-relative where it lies in the repository), the
    ``git_commit`` and ``date_utc`` of the measurement's provenance, the target model and the drafter's
    training steps and final loss, and whether the file is a dry run (tiny random model, not measured data)."""

    text_type: str
    block: int
    budget: int
    mean_accepted: float
    file: str
    git_commit: str | None
    date_utc: str | None
    target: str | None
    drafter_steps: int | None
    final_loss: float | None
    dry_run: bool
    histogram: tuple[int, ...] | None = None

    def p_top_profile(self, block: int) -> list[float] | None:
        """Per drafted depth d = 1 .. block - 1 the probability that depth d is accepted given depth d - 1 was,
        from the measured per-round histogram (S(d + 1) / S(d), S(k) the share of rounds accepting k or more
        tokens): a scripted drafter with this ``p_top`` (misses absent) replays the whole histogram, not only its
        mean. None when the file holds no histogram."""
        if not self.histogram:
            return None
        h = list(self.histogram) + [0] * max(0, block - len(self.histogram))
        total = float(sum(h))
        surv = [sum(h[k:]) / total for k in range(len(h))] + [0.0]     # surv[k] = P(accepted >= k + 1)
        return [surv[d] / surv[d - 1] if surv[d - 1] > 0 else 0.0 for d in range(1, block)]

    @property
    def spec(self) -> str:
        return PREFIX + self.text_type

    def label(self) -> str:
        """One line for a table or a note."""
        dry = ", DRY RUN file" if self.dry_run else ""
        return (f"trained drafter on {self.text_type} text, block {self.block}, budget {self.budget}: measured "
                f"{self.mean_accepted:.3f} ({self.file} at {self.git_commit}{dry})")

    def to_dict(self) -> dict[str, Any]:
        return {"source": "trained", **dataclasses.asdict(self)}


def default_file() -> Path:
    """The committed acceptance measurement: data/measurements/h100/acceptance.json."""
    return MEASUREMENTS_DIR / ACCEPTANCE_GPU / f"{ACCEPTANCE_FILE}.json"


def _load(path: str | Path | None) -> tuple[dict | None, Path]:
    """The measurement document at ``path`` (default :func:`default_file`) or None where there is none."""
    p = default_file() if path is None else Path(path)
    return (json.loads(p.read_text()) if p.exists() else None), p


def trained_acceptance(spec: str, block: int, budget: int, path: str | Path | None = None,
                       name: str = "accept") -> TrainedAcceptance:
    """``spec`` (``"trained:<type>"``, checked as parameter ``name``) resolved at ``block`` and ``budget``
    through :func:`~workbench.acceptance.measure.acceptance_for`, from the committed H100 measurement or the
    file at ``path``. Raises InvalidParameter (spelling; combination not measured) or FileNotFoundError."""
    text_type = check_trained(name, spec)
    doc, file = _load(path)
    try:
        shown = str(file.resolve().relative_to(REPO_ROOT))
    except ValueError:
        shown = str(file)
    try:
        value = acceptance_for(text_type, block, budget, ACCEPTANCE_GPU, doc=doc, path=file)
    except InvalidParameter as e:  # named as the caller's parameter, with the file it was looked up in
        raise InvalidParameter(name, spec, f"a combination measured in {shown}: {e}") from None
    prov = doc.get("provenance") or {}
    res = doc.get("results") or {}
    drafter = res.get("drafter") or {}
    if "training" in res and res.get("best_drafter") in res["training"]:   # the chat / math / code layout
        st = res["training"][res["best_drafter"]]
        drafter = {"steps": st.get("steps"), "final_loss": (st.get("best") or {}).get("loss")}
    hist = tuple(histogram_for(text_type, block, budget, ACCEPTANCE_GPU, doc=doc, path=file)) or None
    return TrainedAcceptance(text_type=text_type, block=block, budget=budget, mean_accepted=value, file=shown,
                             git_commit=prov.get("git_commit"), date_utc=prov.get("date_utc"),
                             target=(res.get("target") or {}).get("name"), drafter_steps=drafter.get("steps"),
                             final_loss=drafter.get("final_loss"), dry_run="DRY RUN" in (doc.get("notes") or ""),
                             histogram=hist)


def check_accept_item(name: str, value: Any, hi: float) -> float | str:
    """One acceptance entry before resolution: a number in [1, ``hi``] (returned as float) or a
    ``trained:<type>`` of :func:`trained_choices` (returned as is)."""
    if is_trained(value):
        check_trained(name, value)
        return value

    return check_float(name, value, lo=1, hi=hi)


def accept_allowed(hi: float, why: str) -> str:
    """What an acceptance list allows, in words (the InvalidParameter message)."""
    return (f"numbers in [1, {hi:g}] ({why}), or the trained drafter's measured acceptance at this block and "
            f"budget: one of {', '.join(trained_choices())}")


def resolve(name: str, items: list[float | str], block: int, budget: int, hi: float,
            path: str | Path | None = None) -> tuple[tuple[float, ...], tuple[TrainedAcceptance | None, ...]]:
    """Checked acceptance entries (:func:`check_accept_item`) -> the accepted lengths and, per entry, its
    :class:`TrainedAcceptance` (None for a number given). A measured value above ``hi`` (a file measured
    under other rules) is an InvalidParameter, never clipped."""
    values, sources = [], []
    for v in items:
        if is_trained(v):
            t = trained_acceptance(v, block, budget, path, name)
            if not 1 <= t.mean_accepted <= hi:
                raise InvalidParameter(name, v, f"a measured accepted length in [1, {hi:g}]; {t.label()}")
            values.append(t.mean_accepted)
            sources.append(t)
        else:
            values.append(float(v))
            sources.append(None)
    return tuple(values), tuple(sources)
