"""One validation layer for every entry point (library calls, CLI verbs, notebook parameters).

Each check raises :class:`InvalidParameter` (a ``ValueError``) whose message
names the parameter, the value given and what is allowed. Nothing is clipped.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


class InvalidParameter(ValueError):
    """A parameter outside what is allowed; the message says which, what was given and what is allowed."""

    def __init__(self, name: str, value: Any, allowed: str):
        self.name, self.value, self.allowed = name, value, allowed
        super().__init__(f"{name}={value!r} is not allowed: {allowed}")


def check_int(name: str, value: Any, *, lo: int | None = None, hi: int | None = None) -> int:
    """An integer (not a bool, not a float) in [lo, hi]; returns it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParameter(name, value, f"an integer{_range(lo, hi)}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise InvalidParameter(name, value, f"an integer{_range(lo, hi)}")
    return value


def check_float(name: str, value: Any, *, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False) -> float:
    """A finite real number in [lo, hi] (``lo_open``: > lo); returns it as float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidParameter(name, value, f"a finite number{_range(lo, hi, lo_open)}")
    if (lo is not None and (value <= lo if lo_open else value < lo)) or (hi is not None and value > hi):
        raise InvalidParameter(name, value, f"a finite number{_range(lo, hi, lo_open)}")
    return float(value)


def check_choice(name: str, value: Any, allowed: Iterable[Any]) -> Any:
    """One of ``allowed``; returns it."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise InvalidParameter(name, value, "one of " + ", ".join(repr(a) for a in allowed))
    return value


def _range(lo, hi, lo_open: bool = False) -> str:
    if lo is not None and hi is not None:
        return f" in ({lo}, {hi}]" if lo_open else f" in [{lo}, {hi}]"
    if lo is not None:
        return f" > {lo}" if lo_open else f" >= {lo}"
    if hi is not None:
        return f" <= {hi}"
    return ""


# ---------------------------------------------------------------- arrays (DDTree tree inputs)

def check_array_values(name: str, values: Any, *, lo: float | None = None, hi: float | None = None,
                       integer: bool = False, what: str = "") -> None:
    """Every element of ``values`` (anything ``numpy.asarray`` takes) finite, in [lo, hi] and, with
    ``integer``, of an integer dtype. Raises :class:`InvalidParameter` naming the first offending
    element by its index (``name[i, j]``), its value and what is allowed (``what`` adds why)."""
    import numpy as np

    a = np.asarray(values)
    kind = "integers" if integer else "finite numbers"
    allowed = f"{kind}{_range(lo, hi)}" + (f" ({what})" if what else "")
    if integer and not np.issubdtype(a.dtype, np.integer):
        raise InvalidParameter(f"{name}.dtype", str(a.dtype), allowed)
    if not integer and not np.issubdtype(a.dtype, np.number):
        raise InvalidParameter(f"{name}.dtype", str(a.dtype), allowed)
    bad = np.zeros(a.shape, dtype=bool) if integer else ~np.isfinite(a)
    if lo is not None:
        bad |= a < lo
    if hi is not None:
        bad |= a > hi
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        v = a[idx].item()
        raise InvalidParameter(f"{name}[{', '.join(map(str, idx))}]", v, allowed)
