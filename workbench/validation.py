"""One validation layer for every entry point (library calls, CLI verbs, notebook parameters).

Each check raises :class:`InvalidParameter` (a ``ValueError``) whose message
names the parameter, the value given and what is allowed. Nothing is clipped.

- scalar checks: :func:`check_int`, :func:`check_float`, :func:`check_bool`,
  :func:`check_str`, :func:`check_choice`, :func:`check_divisor`, :func:`check_list`;
- :func:`parse_text`: a command-line word as a value (``-p NAME VALUE``, the CLI verbs'
  numeric options), so ``1e6`` is the integer 1000000 everywhere;
- :class:`ParamSpec`: the declarative type and range of one notebook parameter
  (``notebooks/parameters.yaml`` holds one per parameter; ``workbench.pipeline`` checks
  ``-p`` values, the profile's and the notebooks' defaults against them before any
  notebook runs);
- :func:`check_array_values`: every element of an array (the DDTree tree inputs).
"""
from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import yaml


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



def check_bool(name: str, value: Any) -> bool:
    """True or False (not 0 / 1, not a string); returns it."""
    if not isinstance(value, bool):
        raise InvalidParameter(name, value, "true or false")
    return value


def check_str(name: str, value: Any) -> str:
    """A non-empty string; returns it."""
    if not isinstance(value, str) or not value:
        raise InvalidParameter(name, value, "a non-empty string")
    return value


def check_divisor(name: str, value: Any, of: int, what: str) -> int:
    """A positive integer that divides ``of`` (``what`` says what ``of`` counts); returns it."""
    divisors = [d for d in range(1, of + 1) if of % d == 0]
    allowed = f"an integer that divides {what}: one of {', '.join(map(str, divisors))}"
    if isinstance(value, bool) or not isinstance(value, int) or value not in divisors:
        raise InvalidParameter(name, value, allowed)
    return value


def check_list(name: str, value: Any, item: Callable[[str, Any], Any], item_allowed: str) -> list[Any]:
    """A non-empty list whose every item passes ``item(name, v)``; a single value is taken as a
    one-element list (``-p accept 12`` is ``[12]``). Returns the checked items."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    allowed = f"a non-empty list of {item_allowed} (a single value counts as a one-element list)"
    if not items:
        raise InvalidParameter(name, value, allowed)
    try:
        return [item(name, v) for v in items]
    except InvalidParameter:
        raise InvalidParameter(name, value, allowed) from None


def check_two_point(name: str, value: Any, hi: int | None = None) -> list[int]:
    """The two max_tokens (A, B) of a two-point rate: integers with 1 <= A < B (<= ``hi`` when given)."""
    bound = f"in [1, {hi}]" if hi is not None else ">= 1"
    allowed = f"two max_tokens A < B, both integers {bound}"
    pair = check_list(name, value, lambda n, v: check_int(n, v, lo=1, hi=hi), f"integers {bound}")
    if len(pair) != 2 or pair[0] >= pair[1]:
        raise InvalidParameter(name, list(value), allowed)
    return pair


def parse_text(text: str) -> Any:
    """A command-line word as a value: YAML-typed (``3`` int, ``0.5`` float, ``true`` bool,
    ``[1, 2]`` list, ``null`` None, else the string), and a number YAML leaves as text
    (``1e6``) read as a float. An integral float becomes an int (``1e6`` -> 1000000): exact,
    nothing rounded."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


# ---------------------------------------------------------------- notebook parameters (declarative)

_SCALARS: dict[str, tuple[str, Callable[..., Any]]] = {
    "int": ("integers", check_int),
    "float": ("numbers", check_float),
    "bool": ("true/false values", lambda name, v, **_: check_bool(name, v)),
    "str": ("strings", lambda name, v, **_: check_str(name, v)),
}
NONE_WORDS = ("None", "none", "null", "~")


def resolve_ref(ref: str) -> Any:
    """``module:NAME`` -> that attribute of the library (a constant or a function named in
    notebooks/parameters.yaml)."""
    mod, _, attr = ref.partition(":")
    if not attr:
        raise ValueError(f"{ref!r} is not a 'module:NAME' reference")
    return getattr(importlib.import_module(mod), attr)


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """Type and range of one notebook parameter, as written in notebooks/parameters.yaml.

    - ``type``: ``int``, ``float``, ``bool``, ``str``, or ``list[int]`` / ``list[float]`` /
      ``list[str]`` (a single value given for a list counts as a one-element list);
    - ``lo`` / ``hi``: inclusive bounds: a number, the name of another parameter of the
      same notebook (``topk`` <= ``num_experts``), or a library constant ``module:NAME``;
    - ``choices``: the allowed values: a list, or ``module:NAME`` of the library (a tuple, a
      dict's keys, or a function returning them);
    - ``multiple_of``: an ``int`` parameter must be a multiple of this (a number or ``module:NAME``);
    - ``optional``: None is allowed too (``-p overhead_ms null``, or ``None``);
    - ``help``: what the parameter means.
    """

    type: str
    lo: float | str | None = None
    hi: float | str | None = None
    choices: tuple[Any, ...] | str | None = None
    multiple_of: int | str | None = None
    optional: bool = False
    help: str = ""

    def __post_init__(self):
        base = self.type.removeprefix("list[").removesuffix("]")
        if base not in _SCALARS or (base != self.type and self.type != f"list[{base}]"):
            kinds = list(_SCALARS) + [f"list[{k}]" for k in _SCALARS]
            raise InvalidParameter("type", self.type, "one of " + ", ".join(kinds))
        if isinstance(self.choices, list):
            object.__setattr__(self, "choices", tuple(self.choices))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ParamSpec":
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(unknown)} in a parameter spec; allowed: "
                             + ", ".join(f.name for f in dataclasses.fields(cls)))
        return cls(**d)

    @property
    def is_list(self) -> bool:
        return self.type.startswith("list[")

    def allowed_choices(self) -> tuple[Any, ...] | None:
        if not isinstance(self.choices, str):
            return self.choices
        found = resolve_ref(self.choices)
        return tuple(found() if callable(found) else found)

    def describe(self) -> str:
        """The rule in words (``workbench list``)."""
        parts = [self.type]
        lo, hi = (resolve_ref(b) if isinstance(b, str) and ":" in b else b for b in (self.lo, self.hi))
        if lo is not None or hi is not None:
            parts.append(_range(lo, hi).strip())
        if self.choices is not None:
            parts.append("one of " + ", ".join(map(str, self.allowed_choices())))
        if self.multiple_of is not None:
            parts.append(f"a multiple of {self._multiple()}")
        if self.optional:
            parts.append("or None")
        return " ".join(parts)

    def _multiple(self) -> int | None:
        m = self.multiple_of
        return resolve_ref(m) if isinstance(m, str) else m

    def check(self, name: str, value: Any, others: Mapping[str, Any] | None = None) -> Any:
        """``value`` checked (and typed: an int given for a float is a float, a single value for a
        list a one-element list); ``others`` are the notebook's other parameters, for bounds that
        name one. Raises :class:`InvalidParameter`."""
        if self.optional and (value is None or value in NONE_WORDS):
            return None
        base = self.type.removeprefix("list[").removesuffix("]")
        kind, scalar = _SCALARS[base]
        bounds = {}
        for key in ("lo", "hi"):
            b = getattr(self, key)
            if isinstance(b, str):  # a library constant, or another parameter's value
                b = resolve_ref(b) if ":" in b else (others or {}).get(b)
            if b is not None:
                bounds[key] = b
        choices = self.allowed_choices()
        multiple = self._multiple()
        what = kind + _range(bounds.get("lo"), bounds.get("hi"))
        if choices is not None:
            what += " among " + ", ".join(map(repr, choices))
        if multiple is not None:
            what += f", multiples of {multiple}"

        def item(n: str, v: Any) -> Any:
            v = scalar(n, v, **bounds) if base in ("int", "float") else scalar(n, v)
            if choices is not None:
                check_choice(n, v, choices)
            if multiple is not None and v % multiple:
                raise InvalidParameter(n, v, f"an integer{_range(bounds.get('lo'), bounds.get('hi'))} "
                                             f"and a multiple of {multiple}")
            return v
        try:
            return check_list(name, value, item, what) if self.is_list else item(name, value)
        except InvalidParameter as e:
            if self.optional:
                raise InvalidParameter(name, value, f"{e.allowed}, or None") from None
            raise


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
