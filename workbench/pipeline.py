"""The notebook pipeline: run the numbered notebooks with papermill.

``workbench run [SELECTOR...] [-p NAME VALUE]... [--out DIR] [--fail-fast]``
executes ``notebooks/NN_*.ipynb`` in order in the current Python environment
and writes, under ``runs/<UTC stamp>/`` (git-ignored): each executed notebook,
its HTML export (self-contained: plotly.js once per file, so it opens
offline), and ``run.json`` (the git commit and whether the tree was dirty, the
package versions, and per notebook: parameters, status, seconds, and on
failure the failing cell and the error).

Parameters: ``-p NAME VALUE`` applies to every selected notebook that declares
``NAME`` in its ``parameters`` cell; ``-p NN:NAME VALUE`` (or
``name:NAME``) to the matching notebooks only. Values are YAML-typed (int,
float, bool, list, string; ``1e6`` is the integer 1000000). A name no selected
notebook declares is an error that lists the notebooks' parameters.

Checked before any notebook runs: the notebooks folder and the output folder;
every parameter of every selected notebook (its default, the profile's value,
the ``-p`` value) against its type and range in ``notebooks/parameters.yaml``
and the library's own input check for that notebook (:mod:`workbench.validation`);
the Python packages the notebook ``needs`` there (with how to install a missing
one); an error names the notebook, the parameter, the value and what is allowed,
and nothing runs. A single value
given for a list parameter counts as a one-element list (``-p accept 12`` is
``[12]``); nothing is clipped.

Profiles: on a machine with a CUDA GPU the ``gpu`` profile of
``notebooks/profiles.yaml`` supplies GPU-size parameters (``--profile cpu``
keeps the notebooks' CPU defaults); explicit ``-p`` values win.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import hashlib
import datetime as _dt
import importlib.metadata
import inspect
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import yaml
from tqdm.auto import tqdm

from workbench import NOTEBOOK_DIR, REPO_ROOT
from workbench.environment import has_cuda
from workbench.measure import git_commit
from workbench.validation import (
    InvalidParameter, PackageNeed, ParamSpec, check_choice, check_dir, check_out_dir, parse_text, resolve_ref,
)

RUNS_DIR = REPO_ROOT / "runs"
PROFILES_FILE = NOTEBOOK_DIR / "profiles.yaml"
SCHEMA_NAME = "parameters.yaml"  # beside the notebooks: the type and range of every parameter
PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
# the kernel shows figures as plotly's mimetype (JupyterLab and VS Code draw it); the HTML export adds plotly.js once
PLOTLY_RENDERER = "plotly_mimetype"
VERSIONED = ("torch", "numpy", "plotly", "papermill", "nbconvert", "nbformat", "ipykernel")


@dataclasses.dataclass(frozen=True)
class Notebook:
    path: Path

    @property
    def name(self) -> str:
        """The file name without ``.ipynb``."""
        return self.path.stem

    @property
    def number(self) -> str:
        """The two-digit prefix (``05``)."""
        return self.name.split("_", 1)[0]

    def matches(self, selector: str) -> bool:
        """By number (``5``, ``05``), exact stem, or a substring of the name."""
        s = selector.strip()
        if s.isdigit():
            return int(s) == int(self.number)
        return s == self.name or s.removesuffix(".ipynb") == self.name or s in self.name

    def parameters(self) -> dict[str, dict[str, Any]]:
        """The ``parameters`` cell: name -> {default (source text), type}."""
        import papermill  # imported where used: it takes seconds, and `workbench --help` should not

        params = papermill.inspect_notebook(str(self.path))
        return {k: {"default": v["default"], "type": v["inferred_type_name"], "help": v.get("help", "")}
                for k, v in params.items()}

    def defaults(self, declared: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        """The ``parameters`` cell's defaults as values (each must be a Python literal)."""
        out = {}
        for k, v in (declared if declared is not None else self.parameters()).items():
            try:
                out[k] = ast.literal_eval(v["default"])
            except (ValueError, SyntaxError):
                raise ValueError(f"{self.name}: the default of {k} ({v['default']}) is not a Python literal; "
                                 f"write it as one so it can be checked against {SCHEMA_NAME}") from None
        return out


@dataclasses.dataclass(frozen=True)
class NotebookSchema:
    """A notebook's entry in notebooks/parameters.yaml: one :class:`ParamSpec` per parameter, the
    library's input check (``module:function``, called with the parameters it names) and the Python
    packages the notebook needs (:class:`~workbench.validation.PackageNeed`)."""

    parameters: dict[str, ParamSpec]
    check: str | None = None
    needs: tuple[PackageNeed, ...] = ()

    def check_values(self, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` (every parameter of the notebook) checked and typed; raises InvalidParameter
        (the first bad one) or ValueError for a parameter the schema lacks."""
        missing = sorted(set(values) - set(self.parameters))
        if missing:
            raise ValueError(f"parameter(s) {', '.join(missing)} have no entry in notebooks/{SCHEMA_NAME}: "
                             f"give each a type and range there")
        typed = {}
        for k in self._order(values):
            try:
                typed[k] = self.parameters[k].check(k, values[k], {**values, **typed})
            except InvalidParameter as e:  # the library's own message where its check covers k (it says more)
                raise self._library_message(e, values) from None
        self._call_check(typed)
        for need in self.needs:
            need.check(typed)
        return {k: typed[k] for k in values}

    def _order(self, values: dict[str, Any]) -> list[str]:
        """The parameters in the order they are checked: those that bound another (``hi: block``) first,
        so a bad bound is blamed on itself, not on the parameter it bounds."""
        bounds = set().union(*(spec.bound_names() for spec in self.parameters.values()))
        return sorted(values, key=lambda k: k not in bounds)

    def _call_check(self, values: dict[str, Any]) -> None:
        """The library's input check of the notebook, called with the parameters it names."""
        if self.check:
            fn = resolve_ref(self.check)
            names = inspect.signature(fn).parameters
            fn(**{k: v for k, v in values.items() if k in names})

    def _library_message(self, e: InvalidParameter, values: dict[str, Any]) -> InvalidParameter:
        """The library's own message for the parameter ``e`` names, where its check refuses the same one."""
        try:
            self._call_check(values)
        except InvalidParameter as lib:
            if lib.name == e.name:
                return lib
        except (ValueError, TypeError):
            pass
        return e


SCHEMA_KEYS = ("parameters", "check", "needs")  # per notebook in parameters.yaml


def load_schema(folder: Path = NOTEBOOK_DIR) -> dict[str, NotebookSchema]:
    """notebooks/parameters.yaml: notebook selector -> :class:`NotebookSchema`."""
    path = Path(folder) / SCHEMA_NAME
    if not path.exists():
        raise ValueError(f"{path} is missing: every notebook parameter needs a type and range there")
    raw = yaml.safe_load(path.read_text()) or {}
    return {str(sel): _notebook_schema(str(sel), entry or {}) for sel, entry in raw.items()}


def _notebook_schema(sel: str, entry: dict[str, Any]) -> NotebookSchema:
    """One notebook's entry of parameters.yaml; an unknown key is an error naming the allowed ones."""
    unknown = sorted(set(entry) - set(SCHEMA_KEYS))
    if unknown:
        raise ValueError(f"notebooks/{SCHEMA_NAME}, {sel!r}: unknown key(s) {', '.join(unknown)}; "
                         f"allowed: {', '.join(SCHEMA_KEYS)}")
    return NotebookSchema({k: ParamSpec.from_dict(v) for k, v in (entry.get("parameters") or {}).items()},
                          entry.get("check"), tuple(PackageNeed.from_dict(n) for n in entry.get("needs") or ()))


def schema_of(nb: Notebook, schema: dict[str, NotebookSchema]) -> NotebookSchema:
    """The one entry of notebooks/parameters.yaml that matches ``nb`` (none or several is an error)."""
    hits = [s for sel, s in schema.items() if nb.matches(sel)]
    if len(hits) != 1:
        raise ValueError(f"{nb.name}: {'no' if not hits else 'more than one'} entry in notebooks/{SCHEMA_NAME} "
                         f"(keys: {', '.join(schema)})")
    return hits[0]


def discover(folder: Path = NOTEBOOK_DIR) -> list[Notebook]:
    """The numbered notebooks ``NN_*.ipynb`` in ``folder`` (an existing folder that holds some), in order."""
    what = "a folder of numbered notebooks (NN_*.ipynb)"
    folder = check_dir("notebooks", folder, what)
    nbs = [Notebook(p) for p in sorted(folder.glob("[0-9][0-9]_*.ipynb"))]
    if not nbs:
        raise InvalidParameter("notebooks", str(folder), f"{what}; it holds none")
    return nbs


def select(notebooks: list[Notebook], selectors: list[str]) -> list[Notebook]:
    """The notebooks any of ``selectors`` matches (all without selectors); a selector matching none is an error."""
    if not selectors:
        return list(notebooks)
    chosen = [nb for nb in notebooks if any(nb.matches(s) for s in selectors)]
    unmatched = [s for s in selectors if not any(nb.matches(s) for nb in notebooks)]
    if unmatched:
        raise ValueError(f"no notebook matches {', '.join(map(repr, unmatched))}; notebooks: "
                         f"{', '.join(nb.name for nb in notebooks)}")
    return chosen


def load_profile(name: str) -> dict[str, dict[str, Any]]:
    """Per-notebook parameters of profile ``name`` from notebooks/profiles.yaml ({} for ``auto`` and ``cpu``:
    the notebooks' own defaults); a name neither there nor ``auto`` / ``cpu`` is an InvalidParameter."""
    data = (yaml.safe_load(PROFILES_FILE.read_text()) or {}) if PROFILES_FILE.exists() else {}
    check_choice("profile", name, ("auto", "cpu", *data))
    return {} if name in ("auto", "cpu") else data[name] or {}


def resolve_parameters(notebooks: list[Notebook], overrides: list[tuple[str, str]],
                       profile: dict[str, dict[str, Any]] | None = None,
                       schema: dict[str, NotebookSchema] | None = None) -> dict[str, dict[str, Any]]:
    """Map notebook name -> parameters to inject, checked (see :func:`check_parameters`).

    Raises ValueError for unknown names and for values outside notebooks/parameters.yaml or
    the library's checks, before anything runs."""
    declared = {nb.name: nb.parameters() for nb in notebooks}
    out: dict[str, dict[str, Any]] = {nb.name: {} for nb in notebooks}
    origin: dict[str, dict[str, str]] = {nb.name: {} for nb in notebooks}
    for nb in notebooks:  # profile values; a name the notebook does not declare is an error
        for sel, values in (profile or {}).items():
            if nb.matches(str(sel)):
                unknown = sorted(set(values) - set(declared[nb.name]))
                if unknown:
                    raise ValueError(f"profile sets unknown parameter(s) {', '.join(unknown)} for {nb.name}; "
                                     f"its parameters are: {', '.join(declared[nb.name])}")
                out[nb.name].update(values)
                origin[nb.name].update(dict.fromkeys(values, "the profile"))
    for key, raw in overrides:
        value = parse_text(raw)
        scope, _, name = key.rpartition(":")
        targets = [nb for nb in notebooks if not scope or nb.matches(scope)]
        if not targets:
            raise ValueError(f"-p {key}: no selected notebook matches {scope!r}; selected: "
                             + ", ".join(nb.name for nb in notebooks))
        hit = [nb for nb in targets if name in declared[nb.name]]
        if not hit:
            listing = "; ".join(f"{nb.name}: {', '.join(declared[nb.name]) or '(none)'}" for nb in targets
                                ) or "no selected notebook matches the scope"
            raise ValueError(f"unknown parameter {key!r}; parameters are: {listing}")
        for nb in hit:
            out[nb.name][name] = value
            origin[nb.name][name] = f"-p {key}"
    return check_parameters(notebooks, out, origin, declared, schema)


def check_parameters(notebooks: list[Notebook], injected: dict[str, dict[str, Any]],
                     origin: dict[str, dict[str, str]], declared: dict[str, dict[str, dict[str, Any]]],
                     schema: dict[str, NotebookSchema] | None = None) -> dict[str, dict[str, Any]]:
    """Every parameter of every notebook (default, profile or ``-p`` value) against its
    :class:`ParamSpec` and the notebook's library check. Returns the injected values, typed
    (a single value for a list parameter becomes a one-element list). Raises ValueError listing
    every notebook's first bad parameter, with where its value came from."""
    errors, typed_out = [], {}
    for nb in notebooks:
        sch = schema_of(nb, schema if schema is not None else load_schema(nb.path.parent))
        values = {**nb.defaults(declared[nb.name]), **injected[nb.name]}
        try:
            typed = sch.check_values(values)
        except InvalidParameter as e:
            errors.append(f"{nb.name}: {e} ({_origin_note(e.name, sch, values, origin[nb.name])})")
            continue
        except ValueError as e:
            errors.append(f"{nb.name}: {e}")
            continue
        typed_out[nb.name] = {k: typed[k] for k in injected[nb.name]}
    if errors:
        raise ValueError("parameters not allowed; no notebook ran:\n  " + "\n  ".join(errors))
    return typed_out


def _origin_note(name: str, sch: NotebookSchema, values: dict[str, Any], origin: dict[str, str]) -> str:
    """Where the refused value came from and, where a bound of it was set (``hi: block`` given with -p or by
    the profile), that bound with its value and origin: the parameter the user changed is named."""
    note = f"value from {origin.get(name, 'the notebook default')}"
    spec = sch.parameters.get(name)
    for b in sorted(spec.bound_names()) if spec else ():
        if b in origin:
            note += f"; bounded by {b}={values.get(b)!r} from {origin[b]}"
    return note


def _kernel_spec() -> tuple[str, str]:
    """A kernelspec for this very interpreter, so notebooks run in the current environment: its name
    and the JUPYTER_PATH that finds it (the spec's folder first)."""
    root = Path(tempfile.gettempdir()) / f"workbench-kernels-{os.getuid()}"
    name = "workbench-" + hashlib.sha1(sys.executable.encode()).hexdigest()[:10]  # stable across runs
    spec_dir = root / "kernels" / name
    spec_dir.mkdir(parents=True, exist_ok=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"workbench ({sys.executable})", "language": "python"}))
    paths = os.environ.get("JUPYTER_PATH", "")
    return name, os.pathsep.join([str(root)] + ([paths] if paths else []))


def _export_html(nb_path: Path) -> Path:
    """The executed notebook as one self-contained HTML file: each plotly figure drawn from its
    mimetype output, plotly.js embedded once (with the first figure), so the file opens offline.
    A widget (it needs a running kernel) shows as a note; the widgets' saved state, which
    carries another copy of plotly.js, is left out."""
    import nbformat  # these three imported where used: together they take seconds
    import plotly.io as pio
    from nbconvert import HTMLExporter

    nb = nbformat.read(nb_path, as_version=4)
    first = True
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if PLOTLY_MIME in data:
                fig = data.pop(PLOTLY_MIME)
                data["text/html"] = pio.to_html({k: fig[k] for k in ("data", "layout", "frames") if k in fig},
                                                config=fig.get("config"), include_plotlyjs=first,
                                                include_mathjax=False, full_html=False, validate=False,
                                                default_height=525)
                first = False
            elif WIDGET_MIME in data:
                out["data"] = {"text/html": "<p><em>An interactive widget: open the executed .ipynb in Jupyter "
                                            "with a running kernel to use it.</em></p>"}
    nb.metadata.pop("widgets", None)
    html, _ = HTMLExporter().from_notebook_node(nb)
    path = nb_path.with_suffix(".html")
    path.write_text(html)
    return path


def _versions() -> dict[str, str | None]:
    """Python and the packages the notebooks and their reports run on (cupy if installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    cupy = sorted(d.metadata["Name"] for d in importlib.metadata.distributions()
                  if (d.metadata["Name"] or "").lower().startswith("cupy"))
    for name in cupy:
        out[name] = importlib.metadata.version(name)
    return out


def _git() -> dict[str, Any]:
    """The commit the run came from and whether tracked files differed from it."""
    commit = git_commit()
    if commit is None:
        return {"commit": None, "dirty": None}
    return {"commit": commit.removesuffix("-dirty"), "dirty": commit.endswith("-dirty")}


@contextlib.contextmanager
def _environ(**values: str):
    """Environment variables set for the duration (the kernels started inside inherit them)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_one(nb: Notebook, params: dict[str, Any], out: Path, kernel: str) -> dict[str, Any]:
    """Execute one notebook into ``out`` and export its HTML; returns its run.json entry."""
    import papermill  # imported where used: it takes seconds

    entry: dict[str, Any] = {"notebook": nb.name, "parameters": params, "status": "ok"}
    target = out / nb.path.name
    t0 = time.perf_counter()
    try:
        papermill.execute_notebook(str(nb.path), str(target), parameters=params, kernel_name=kernel,
                                   cwd=str(nb.path.parent), progress_bar=False, log_output=False)
    except papermill.PapermillExecutionError as e:
        entry.update(status="failed", error={"cell_index": e.cell_index, "exec_count": e.exec_count,
                                             "cell_source": e.source, "ename": e.ename, "evalue": e.evalue})
    except (papermill.PapermillException, RuntimeError, OSError, ValueError) as e:  # kernel died, bad notebook
        entry.update(status="failed", error={"cell_index": None, "ename": type(e).__name__,
                                             "evalue": str(e), "traceback": traceback.format_exc()})
    entry["seconds"] = round(time.perf_counter() - t0, 2)
    if target.exists():
        entry["executed"] = str(target)
        try:
            entry["html"] = str(_export_html(target))
        except (OSError, ValueError, KeyError, TypeError) as e:  # an export failure must not hide the run's result
            entry["html_error"] = f"{type(e).__name__}: {e}"
    return entry


def run_notebooks(selectors: list[str] | None = None, overrides: list[tuple[str, str]] | None = None,
                  out_dir: str | Path | None = None, fail_fast: bool = False, profile: str = "auto",
                  notebook_dir: Path = NOTEBOOK_DIR, progress: bool = True) -> dict[str, Any]:
    """Execute the selected notebooks; returns the run record (also written as run.json). Everything is
    checked before the first notebook starts: the folders, the profile and the parameters."""
    notebooks = select(discover(notebook_dir), selectors or [])
    if out_dir is not None:
        check_out_dir("out", out_dir, "the run's output folder")
    load_profile(profile)  # checks the name
    if profile == "auto":
        profile = "gpu" if has_cuda() else "cpu"
    elif profile == "gpu" and not has_cuda():
        raise InvalidParameter("profile", profile, "'auto' or 'cpu' on this machine (no CUDA GPU found; the gpu "
                                                   "profile's sizes and devices need one)")
    params = resolve_parameters(notebooks, overrides or [], load_profile(profile))
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = _make_out(Path(out_dir).expanduser() if out_dir else RUNS_DIR / stamp)
    record: dict[str, Any] = {"started_utc": stamp, "profile": profile, "python": sys.executable,
                              "git": _git(), "versions": _versions(), "plotly_renderer": PLOTLY_RENDERER,
                              "out_dir": str(out), "notebooks": []}
    _execute(notebooks, params, out, record, fail_fast, progress)
    record["failed"] = sum(e["status"] != "ok" for e in record["notebooks"])
    record["finished_utc"] = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    (out / "run.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    return record


def _make_out(out: Path) -> Path:
    """The run's output folder, created; one the checks could not foresee failing (a read-only or virtual file
    system) is an InvalidParameter naming it."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InvalidParameter("out", str(out), f"a folder this user can create; {e.strerror}") from None
    return out


def _execute(notebooks: list[Notebook], params: dict[str, dict[str, Any]], out: Path, record: dict[str, Any],
             fail_fast: bool, progress: bool) -> None:
    """Run each notebook in this interpreter's kernel, appending its entry to ``record`` and rewriting run.json
    after each; a failure is printed with its cell and stops the rest only with ``fail_fast``."""
    kernel, jupyter_path = _kernel_spec()
    bar = tqdm(notebooks, desc="notebooks", unit="nb", disable=not progress, file=sys.stderr)
    with _environ(PLOTLY_RENDERER=PLOTLY_RENDERER, JUPYTER_PATH=jupyter_path):  # for papermill and the kernels
        from jupyter_client.kernelspec import KernelSpecManager  # with papermill, where used

        KernelSpecManager().get_kernel_spec(kernel)  # fail early if not found
        for nb in bar:
            bar.set_postfix_str(nb.name)
            entry = _run_one(nb, params[nb.name], out, kernel)
            record["notebooks"].append(entry)
            (out / "run.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
            if entry["status"] != "ok":
                msg = entry["error"]
                print(f"\n{nb.name}: FAILED in cell {msg.get('cell_index')}: {msg['ename']}: {msg['evalue']}",
                      file=sys.stderr)
                if fail_fast:
                    break


# ---- CLI --------------------------------------------------------------------------
def register(sub: argparse._SubParsersAction) -> None:
    """The ``run`` and ``list`` verbs."""
    p = sub.add_parser("run", help="execute the numbered notebooks with papermill",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("selectors", nargs="*", metavar="SELECTOR", help="notebook number or name (default: all)")
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="set a parameter (YAML-typed); NN:NAME scopes it to one notebook")
    p.add_argument("--out", metavar="DIR", help="output folder (default runs/<UTC stamp>/)")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failing notebook")
    p.add_argument("--profile", default="auto", metavar="auto|cpu|gpu",
                   help="auto (gpu when CUDA is present), cpu, gpu, ...")
    p.add_argument("--notebooks", default=str(NOTEBOOK_DIR), metavar="DIR", help="folder of numbered notebooks")
    p.set_defaults(func=_cli_run)
    q = sub.add_parser("list", help="the notebooks with their parameters and defaults")
    q.add_argument("--notebooks", default=str(NOTEBOOK_DIR), metavar="DIR", help="folder of numbered notebooks")
    q.set_defaults(func=_cli_list)


def _cli_run(args: argparse.Namespace) -> int:
    """``workbench run``: the notebooks run, one line each, and where the run record is; 1 if any failed."""
    rec = run_notebooks(args.selectors, [tuple(p) for p in args.parameter], args.out, args.fail_fast, args.profile,
                        notebook_dir=Path(args.notebooks))
    for e in rec["notebooks"]:
        print(f"{e['status']:>6}  {e['seconds']:8.1f} s  {e['notebook']}"
              + (f"  (no HTML: {e['html_error']})" if "html_error" in e else ""))
    print(f"run record: {Path(rec['out_dir']) / 'run.json'} ({rec['failed']} failed)")
    return 1 if rec["failed"] else 0


def _cli_list(args: argparse.Namespace) -> int:
    """``workbench list``: each notebook, its parameters with their rules, and the packages it needs."""
    notebooks = discover(Path(args.notebooks))
    schema = load_schema(Path(args.notebooks))
    for nb in notebooks:
        sch = schema_of(nb, schema)
        print(nb.name + (f"  (also checked by {sch.check})" if sch.check else ""))
        for need in sch.needs:
            when = " and ".join(f"{k} holds {v!r}" for k, v in need.when.items())
            print(f"    needs {need.module}{f' when {when}' if when else ''}: {need.install}")
        for k, v in nb.parameters().items():
            spec = sch.parameters.get(k)
            rule = f"  ({spec.describe()})" if spec else f"  (no entry in {SCHEMA_NAME})"
            text = (spec.help if spec else "") or v["help"]
            print(f"    {k} = {v['default']}{rule}" + (f"  # {text}" if text else ""))
    return 0
