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
- :func:`check_array_values`: every element of an array (the DDTree tree inputs);
- the world outside the process, checked before any work starts: :func:`load_json_file`,
  :func:`check_dir`, :func:`check_out_dir` (files and folders), :func:`check_host`,
  :func:`check_bindable`, :func:`check_url`, :func:`check_reachable` (network),
  :func:`check_module` and :class:`PackageNeed` (what a notebook or a rank imports).
"""
from __future__ import annotations

import dataclasses
import errno
import importlib
import importlib.util
import ipaddress
import json
import math
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import yaml


class InvalidParameter(ValueError):
    """A parameter outside what is allowed; the message says which, what was given and what is allowed."""

    def __init__(self, name: str, value: Any, allowed: str):
        """``name=value is not allowed: allowed``."""
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
    """`` in [lo, hi]``, `` >= lo``, `` <= hi`` (``lo_open``: ``(lo, ...``) or nothing."""
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
    nothing rounded; so do a list's items. A blank word stays the string it is (``--context ""`` is ``''``, which the
    check then refuses by name), never None: None is written ``null``."""
    if not text.strip():
        return text
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return [_number(v) for v in value] if isinstance(value, list) else _number(value)


def _number(value: Any) -> Any:
    """A YAML value with a number YAML left as text read as one, and an integral float as an int
    (the items of a list too: ``[1e2, 2e2]`` is ``[100, 200]``)."""
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
PATH_KINDS = {"file": "a file", "folder": "a folder", "json": "a JSON file"}  # ParamSpec.path


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
    - ``path``: a ``str`` parameter that names an existing ``file``, ``folder`` or ``json`` file (read as
      JSON), relative to where ``workbench run`` starts; the checked value is the absolute path, since the
      notebook runs in its own folder;
    - ``help``: what the parameter means.
    """

    type: str
    lo: float | str | None = None
    hi: float | str | None = None
    choices: tuple[Any, ...] | str | None = None
    multiple_of: int | str | None = None
    optional: bool = False
    path: str | None = None
    help: str = ""

    def __post_init__(self):
        """The type and the path kind known; choices as a tuple."""
        base = self.type.removeprefix("list[").removesuffix("]")
        if base not in _SCALARS or (base != self.type and self.type != f"list[{base}]"):
            kinds = list(_SCALARS) + [f"list[{k}]" for k in _SCALARS]
            raise InvalidParameter("type", self.type, "one of " + ", ".join(kinds))
        if isinstance(self.choices, list):
            object.__setattr__(self, "choices", tuple(self.choices))
        if self.path is not None and (self.type != "str" or self.path not in PATH_KINDS):
            raise InvalidParameter("path", self.path, "one of " + ", ".join(PATH_KINDS) + " (for a str parameter)")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ParamSpec":
        """From a mapping of notebooks/parameters.yaml; an unknown key is an error listing the known ones."""
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(unknown)} in a parameter spec; allowed: "
                             + ", ".join(f.name for f in dataclasses.fields(cls)))
        return cls(**d)

    @property
    def is_list(self) -> bool:
        """Whether the type is ``list[...]``."""
        return self.type.startswith("list[")

    def allowed_choices(self) -> tuple[Any, ...] | None:
        """The choices, a ``module:NAME`` reference resolved (called where it is a function)."""
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
        if self.path is not None:
            parts.append(f"the path of {PATH_KINDS[self.path]}")
        if self.optional:
            parts.append("or None")
        return " ".join(parts)

    def bound_names(self) -> set[str]:
        """The other parameters of the notebook that bound this one (``hi: block``)."""
        return {b for b in (self.lo, self.hi) if isinstance(b, str) and ":" not in b}

    def _bounds(self, others: Mapping[str, Any] | None) -> dict[str, Any]:
        """The bounds as numbers: a library constant resolved, another parameter's value looked up in ``others``."""
        bounds = {}
        for key in ("lo", "hi"):
            b = getattr(self, key)
            if isinstance(b, str):
                b = resolve_ref(b) if ":" in b else (others or {}).get(b)
            if b is not None:
                bounds[key] = b
        return bounds

    def _existing(self, name: str, value: str) -> str:
        """``value`` the path of an existing file / folder / JSON file (read); returned absolute."""
        what = PATH_KINDS[self.path]
        if self.path == "json":
            load_json_file(name, value, what)
        elif self.path == "folder":
            check_dir(name, value, what)
        elif not Path(value).expanduser().is_file():
            raise InvalidParameter(name, value, f"the path of {what}; it is not an existing file")
        return str(Path(value).expanduser().resolve())

    def _multiple(self) -> int | None:
        """``multiple_of`` as a number."""
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
        bounds = self._bounds(others)
        choices = self.allowed_choices()
        multiple = self._multiple()
        span = _range(bounds.get("lo"), bounds.get("hi"))
        what = kind + span
        if choices is not None:
            what += " among " + ", ".join(map(repr, choices))
        if multiple is not None:
            what += f", multiples of {multiple}"

        def item(n: str, v: Any) -> Any:
            """One value checked against the scalar type, the bounds, the choices and the multiple."""
            v = scalar(n, v, **bounds) if base in ("int", "float") else scalar(n, v)
            if choices is not None:
                check_choice(n, v, choices)
            if multiple is not None and v % multiple:
                raise InvalidParameter(n, v, f"an integer{span} and a multiple of {multiple}")
            return v
        try:
            if self.is_list:
                return check_list(name, value, item, what)
            return item(name, value) if self.path is None else self._existing(name, item(name, value))
        except InvalidParameter as e:
            if self.optional:  # "<rule>, or None; <why not>"
                rule, sep, why = e.allowed.partition("; ")
                raise InvalidParameter(name, value, f"{rule}, or None{sep}{why}") from None
            raise


# ---------------------------------------------------------------- arrays (DDTree tree inputs)

def check_array_values(name: str, values: Any, *, lo: float | None = None, hi: float | None = None,
                       integer: bool = False, what: str = "") -> None:
    """Every element of ``values`` (anything ``numpy.asarray`` takes) finite, in [lo, hi] and, with
    ``integer``, of an integer dtype. Raises :class:`InvalidParameter` naming the first offending
    element by its index (``name[i, j]``), its value and what is allowed (``what`` adds why)."""
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


# ---------------------------------------------------------------- files and folders

def _as_path(name: str, value: Any, allowed: str) -> Path:
    """``value`` as a Path: a non-empty string or path-like, else InvalidParameter."""
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise InvalidParameter(name, value, allowed)
    return Path(value).expanduser()


def load_json_file(name: str, path: Any, what: str = "a JSON file") -> Any:
    """The parsed JSON document at ``path``. InvalidParameter naming the file, what it must be
    (``what``) and why it cannot be read: missing, a folder, unreadable, not text, not JSON
    (with the line and column)."""
    allowed = f"the path of {what}"
    p = _as_path(name, path, allowed)
    if not p.exists():
        raise InvalidParameter(name, str(path), f"{allowed}; it does not exist")
    if p.is_dir():
        raise InvalidParameter(name, str(path), f"{allowed}; this is a folder")
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise InvalidParameter(name, str(path), f"{allowed}; it cannot be read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise InvalidParameter(name, str(path), f"{allowed}; it is not UTF-8 text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidParameter(name, str(path), f"{allowed}; it is not JSON ({e.msg} at line {e.lineno}, "
                                                f"column {e.colno})") from None


def check_dir(name: str, path: Any, what: str = "a folder") -> Path:
    """An existing folder; returns it as a Path."""
    allowed = f"the path of {what}"
    p = _as_path(name, path, allowed)
    if not p.exists():
        raise InvalidParameter(name, str(path), f"{allowed}; it does not exist")
    if not p.is_dir():
        raise InvalidParameter(name, str(path), f"{allowed}; this is a file")
    return p


def check_out_dir(name: str, path: Any, what: str = "an output folder") -> Path:
    """A folder to write into: an existing, writable folder, or a path whose nearest existing parent
    is one (the folder is created there). Returns it as a Path."""
    allowed = f"{what}: an existing writable folder or a new one under a writable folder"
    p = _as_path(name, path, allowed)
    if p.exists() and not p.is_dir():
        raise InvalidParameter(name, str(path), f"{allowed}; this is an existing file")
    parent = p
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise InvalidParameter(name, str(path), f"{allowed}; {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidParameter(name, str(path), f"{allowed}; {parent} is not writable")
    return p


# ---------------------------------------------------------------- network

def check_host(name: str, host: Any) -> str:
    """An address to bind or reach: an IP address or a host name this machine resolves."""
    allowed = "an IP address or a host name this machine resolves (127.0.0.1, 0.0.0.0, ::1, localhost, ...)"
    check_str(name, host)
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise InvalidParameter(name, host, f"{allowed}; {getattr(e, 'strerror', None) or e}") from None
    return host


def check_bindable(host: str, port: int, names: tuple[str, str] = ("host", "port")) -> None:
    """``host``:``port`` can be bound now (a free port this user may bind, an address of this machine);
    the parameter to blame is ``names[0]`` (the address) or ``names[1]`` (the port)."""
    check_host(names[0], host)
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                      flags=socket.AI_PASSIVE)[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will
        try:
            s.bind(addr)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise InvalidParameter(names[1], port, f"a port free on {host}; {port} is in use") from None
            if e.errno in (errno.EACCES, errno.EPERM):
                raise InvalidParameter(names[1], port, f"a port this user may bind (below 1024 needs root); "
                                                       f"{e.strerror}") from None
            raise InvalidParameter(names[0], host, f"an address of this machine; binding it failed "
                                                   f"({e.strerror})") from None


def check_url(name: str, url: Any, example: str = "http://127.0.0.1:8000") -> str:
    """An http:// or https:// base URL with a host (and a valid port where one is given)."""
    allowed = f"an http:// or https:// base URL, e.g. {example}"
    check_str(name, url)
    u = urlparse(url)
    try:
        port_ok = u.port is None or 0 < u.port
    except ValueError:  # a port that is not a number or out of range
        port_ok = False
    if u.scheme not in ("http", "https") or not u.hostname or not port_ok:
        raise InvalidParameter(name, url, allowed)
    return url


def check_reachable(name: str, url: Any, timeout: float = 5.0) -> str:
    """``url`` (:func:`check_url`) where a server accepts a TCP connection within ``timeout`` seconds."""
    check_url(name, url)
    u = urlparse(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        socket.create_connection((u.hostname, port), timeout=timeout).close()
    except OSError as e:  # refused, unresolvable, unreachable, timed out
        reason = e.strerror or str(e) or type(e).__name__
        raise InvalidParameter(name, url, f"the base URL of a running server; connecting to {u.hostname}:{port} "
                                          f"failed ({reason})") from None
    return url


# ---------------------------------------------------------------- what a process imports

def _find_module(module: str) -> str | None:
    """None where ``module`` can be imported, else why not (its parent packages are imported to look)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as e:  # a parent package missing; a relative or malformed name
        return str(e)
    return None if spec is not None else f"no module named {module!r}"


def check_module(name: str, module: Any) -> str:
    """A module ``python -m`` can run: importable, and a package only with a ``__main__``."""
    allowed = "an importable module that python -m can run"
    check_str(name, module)
    why = _find_module(module)
    if why is None and importlib.util.find_spec(module).submodule_search_locations is not None:
        why = None if _find_module(module + ".__main__") is None else f"{module} is a package without __main__"
    if why is not None:
        raise InvalidParameter(name, module, f"{allowed}; {why}")
    return module


@dataclasses.dataclass(frozen=True)
class PackageNeed:
    """A Python module a notebook imports, declared in notebooks/parameters.yaml (``needs``): ``module``
    (its import name), ``install`` (the command that installs it) and ``when`` ({parameter: value}:
    needed only while each parameter is, or as a list holds, that value; empty: always)."""

    module: str
    install: str
    when: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PackageNeed":
        """From a mapping of notebooks/parameters.yaml; an unknown key is an error listing the known ones."""
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown or "module" not in d or "install" not in d:
            raise ValueError(f"a need must have module and install (and may have when); got {', '.join(d)}")
        return cls(**d)

    def applies(self, values: Mapping[str, Any]) -> bool:
        """Whether the notebook's parameter ``values`` need the module."""
        def holds(v: Any, want: Any) -> bool:
            """``v`` is ``want`` or, as a list, holds it."""
            return want in v if isinstance(v, (list, tuple)) else v == want
        return all(holds(values.get(k), want) for k, want in self.when.items())

    def check(self, values: Mapping[str, Any]) -> None:
        """InvalidParameter (the ``when`` parameter as the one to change) or ValueError (always needed)
        where the module is needed and not installed; the message says how to install it."""
        if not self.applies(values) or _find_module(self.module) is None:
            return
        missing = f"the Python module {self.module}, which is not installed: install it with `{self.install}`"
        if not self.when:
            raise ValueError(f"the notebook needs {missing}")
        key, want = next(iter(self.when.items()))
        raise InvalidParameter(key, values.get(key), f"values whose packages are installed; {want!r} needs {missing}")
