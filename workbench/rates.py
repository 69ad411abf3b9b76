"""Decode-rate arithmetic: the two-point rate, the sustained rate, and accepted length / step time.

Units: tokens, seconds and tokens/s unless a name ends in ``_ms``.

- two-point (the source's method): the same prompt with ``max_tokens`` A and B, each request's
  wall time t_A, t_B (prefill included, so it cancels): ``(B - A) / (t_B - t_A)``;
- sustained: tokens generated after the first over the decode time of one long generation;
- identity: a decode's tokens/s is ``mean accepted length / mean step time`` over the same
  steps (sum accepted / sum step time, exactly); :func:`rate_check` reports how far a measured
  rate lies from it (the issue's goal: within 5%).
"""
from __future__ import annotations

import math
from typing import Sequence

from workbench.validation import InvalidParameter, check_float, check_int

IDENTITY_TOLERANCE = 0.05  # the sweep's goal: measured tokens/s within 5% of accepted / step time


def two_point_rate(tokens_a: int, tokens_b: int, seconds_a: float, seconds_b: float) -> float:
    """``(tokens_b - tokens_a) / (seconds_b - seconds_a)`` in tokens/s: the rate of the extra tokens
    of the longer request (the source: max_tokens 8 and 264, 256 / (t_264 - t_8))."""
    a = check_int("tokens_a", tokens_a, lo=1)
    b = check_int("tokens_b", tokens_b, lo=a + 1)
    ta = check_float("seconds_a", seconds_a, lo=0.0, lo_open=True)
    tb = check_float("seconds_b", seconds_b, lo=ta, lo_open=True)
    return (b - a) / (tb - ta)


def sustained_rate(tokens: int, seconds: float) -> float:
    """``tokens / seconds`` in tokens/s (tokens decoded in ``seconds`` of decode wall time)."""
    n = check_int("tokens", tokens, lo=1)
    return n / check_float("seconds", seconds, lo=0.0, lo_open=True)


def identity_rate(accepted: Sequence[float], step_seconds: Sequence[float]) -> float:
    """``mean(accepted) / mean(step_seconds)`` in tokens/s over the same steps (one entry per step)."""
    if len(accepted) != len(step_seconds) or not len(accepted):
        raise InvalidParameter("accepted", f"{len(accepted)} steps against {len(step_seconds)} step times",
                               "one accepted length per step time, at least one step")
    mean_t = sum(step_seconds) / len(step_seconds)
    if not mean_t > 0:
        raise InvalidParameter("step_seconds", mean_t, "a mean step time > 0")
    return (sum(accepted) / len(accepted)) / mean_t


def relative_disagreement(measured: float, expected: float) -> float:
    """``(measured - expected) / expected``: + where the measured rate is higher."""
    check_float("expected", expected, lo=0.0, lo_open=True)
    return (check_float("measured", measured) - expected) / expected


def rate_check(measured: float, accepted: Sequence[float], step_seconds: Sequence[float],
               tolerance: float = IDENTITY_TOLERANCE) -> dict:
    """A measured rate against ``mean accepted / mean step time``: {measured, mean_accepted,
    mean_step_ms, identity (tokens/s), disagreement (relative), within (|disagreement| <= tolerance)}."""
    ident = identity_rate(accepted, step_seconds)
    d = relative_disagreement(measured, ident)
    return {"measured": measured, "mean_accepted": sum(accepted) / len(accepted),
            "mean_step_ms": 1e3 * sum(step_seconds) / len(step_seconds), "identity": ident,
            "disagreement": d, "within": bool(abs(d) <= tolerance) and math.isfinite(d)}


def decompose(accepted: float, step_ms: float) -> float:
    """The source's arithmetic: tokens/s = accepted length (tokens/step) / step time (ms -> s)."""
    a = check_float("accepted", accepted, lo=0.0, lo_open=True)
    return a / (check_float("step_ms", step_ms, lo=0.0, lo_open=True) / 1e3)
