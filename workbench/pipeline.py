"""The notebook pipeline: run the numbered notebooks with papermill.

``workbench run [SELECTOR...] [-p NAME VALUE]... [--out DIR] [--fail-fast]``
executes ``notebooks/NN_*.ipynb`` in order in the current Python environment
and writes, under ``runs/<UTC stamp>/`` (git-ignored): each executed notebook,
its HTML export, and ``run.json`` (per notebook: parameters, status, seconds,
and on failure the failing cell and the error).

Parameters: ``-p NAME VALUE`` applies to every selected notebook that declares
``NAME`` in its ``parameters`` cell; ``-p NN:NAME VALUE`` (or
``name:NAME``) to the matching notebooks only. Values are YAML-typed (int,
float, bool, list, string). A name no selected notebook declares is an error
that lists the notebooks' parameters.

Profiles: on a machine with a CUDA GPU the ``gpu`` profile of
``notebooks/profiles.yaml`` supplies GPU-size parameters (``--profile cpu``
keeps the notebooks' CPU defaults); explicit ``-p`` values win.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import datetime as _dt
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import yaml

from workbench import NOTEBOOK_DIR, REPO_ROOT

RUNS_DIR = REPO_ROOT / "runs"
PROFILES_FILE = NOTEBOOK_DIR / "profiles.yaml"


@dataclasses.dataclass(frozen=True)
class Notebook:
    path: Path

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def number(self) -> str:
        return self.name.split("_", 1)[0]

    def matches(self, selector: str) -> bool:
        """By number (``5``, ``05``), exact stem, or a substring of the name."""
        s = selector.strip()
        if s.isdigit():
            return int(s) == int(self.number)
        return s == self.name or s.removesuffix(".ipynb") == self.name or s in self.name

    def parameters(self) -> dict[str, dict[str, Any]]:
        """The ``parameters`` cell: name -> {default (source text), type}."""
        import papermill

        params = papermill.inspect_notebook(str(self.path))
        return {k: {"default": v["default"], "type": v["inferred_type_name"], "help": v.get("help", "")}
                for k, v in params.items()}


def discover(folder: Path = NOTEBOOK_DIR) -> list[Notebook]:
    """The numbered notebooks ``NN_*.ipynb`` in ``folder``, in order."""
    nbs = [Notebook(p) for p in sorted(folder.glob("[0-9][0-9]_*.ipynb"))]
    return nbs


def select(notebooks: list[Notebook], selectors: list[str]) -> list[Notebook]:
    if not selectors:
        return list(notebooks)
    chosen = [nb for nb in notebooks if any(nb.matches(s) for s in selectors)]
    unmatched = [s for s in selectors if not any(nb.matches(s) for nb in notebooks)]
    if unmatched:
        raise ValueError(f"no notebook matches {', '.join(map(repr, unmatched))}; notebooks: "
                         f"{', '.join(nb.name for nb in notebooks)}")
    return chosen


def parse_value(text: str) -> Any:
    """YAML typing: ``3`` -> int, ``0.5`` -> float, ``true`` -> bool, ``[1, 2]`` -> list, else str."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def load_profile(name: str) -> dict[str, dict[str, Any]]:
    """Per-notebook parameters of profile ``name`` from notebooks/profiles.yaml ({} if absent)."""
    if name == "cpu" or not PROFILES_FILE.exists():
        return {}
    data = yaml.safe_load(PROFILES_FILE.read_text()) or {}
    if name not in data:
        raise ValueError(f"unknown profile {name!r}; profiles.yaml has: {', '.join(data) or 'none'}")
    return data[name] or {}


def resolve_parameters(notebooks: list[Notebook], overrides: list[tuple[str, str]],
                       profile: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Map notebook name -> parameters to inject; raises ValueError for unknown names."""
    declared = {nb.name: nb.parameters() for nb in notebooks}
    out: dict[str, dict[str, Any]] = {nb.name: {} for nb in notebooks}
    for nb in notebooks:  # profile values; a name the notebook does not declare is an error
        for sel, values in (profile or {}).items():
            if nb.matches(str(sel)):
                unknown = sorted(set(values) - set(declared[nb.name]))
                if unknown:
                    raise ValueError(f"profile sets unknown parameter(s) {', '.join(unknown)} for {nb.name}; "
                                     f"its parameters are: {', '.join(declared[nb.name])}")
                out[nb.name].update(values)
    for key, raw in overrides:
        value = parse_value(raw)
        scope, _, name = key.rpartition(":")
        targets = [nb for nb in notebooks if not scope or nb.matches(scope)]
        hit = [nb for nb in targets if name in declared[nb.name]]
        if not hit:
            listing = "; ".join(f"{nb.name}: {', '.join(declared[nb.name]) or '(none)'}" for nb in targets
                                ) or "no selected notebook matches the scope"
            raise ValueError(f"unknown parameter {key!r}; parameters are: {listing}")
        for nb in hit:
            out[nb.name][name] = value
    return out


def _kernel_name() -> str:
    """A kernelspec for this very interpreter, so notebooks run in the current environment."""
    from jupyter_client.kernelspec import KernelSpecManager

    root = Path(tempfile.gettempdir()) / f"workbench-kernels-{os.getuid()}"
    name = "workbench-" + hashlib.sha1(sys.executable.encode()).hexdigest()[:10]  # stable across runs
    spec_dir = root / "kernels" / name
    spec_dir.mkdir(parents=True, exist_ok=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"workbench ({sys.executable})", "language": "python"}))
    paths = os.environ.get("JUPYTER_PATH", "")
    if str(root) not in paths.split(os.pathsep):
        os.environ["JUPYTER_PATH"] = os.pathsep.join([str(root)] + ([paths] if paths else []))
    KernelSpecManager().get_kernel_spec(name)  # fail early if not found
    return name


def _export_html(nb_path: Path) -> Path | None:
    import nbformat
    from nbconvert import HTMLExporter

    html, _ = HTMLExporter().from_notebook_node(nbformat.read(nb_path, as_version=4))
    out = nb_path.with_suffix(".html")
    out.write_text(html)
    return out


def run_notebooks(selectors: list[str] | None = None, overrides: list[tuple[str, str]] | None = None,
                  out_dir: str | Path | None = None, fail_fast: bool = False, profile: str = "auto",
                  notebook_dir: Path = NOTEBOOK_DIR, progress: bool = True) -> dict[str, Any]:
    """Execute the selected notebooks; returns the run record (also written as run.json)."""
    import papermill
    from tqdm.auto import tqdm

    notebooks = select(discover(notebook_dir), selectors or [])
    if not notebooks:
        raise ValueError(f"no numbered notebooks (NN_*.ipynb) in {notebook_dir}")
    if profile == "auto":
        from workbench.environment import has_cuda

        profile = "gpu" if has_cuda() else "cpu"
    params = resolve_parameters(notebooks, overrides or [], load_profile(profile))
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(out_dir) if out_dir else RUNS_DIR / stamp
    out.mkdir(parents=True, exist_ok=True)
    kernel = _kernel_name()
    # executed notebooks and their HTML carry plotly.js, so figures show offline
    os.environ.setdefault("PLOTLY_RENDERER", "plotly_mimetype+notebook")
    record: dict[str, Any] = {"started_utc": stamp, "profile": profile, "python": sys.executable,
                              "out_dir": str(out), "notebooks": []}
    bar = tqdm(notebooks, desc="notebooks", unit="nb", disable=not progress, file=sys.stderr)
    for nb in bar:
        bar.set_postfix_str(nb.name)
        entry: dict[str, Any] = {"notebook": nb.name, "parameters": params[nb.name], "status": "ok"}
        target = out / nb.path.name
        t0 = time.perf_counter()
        try:
            papermill.execute_notebook(str(nb.path), str(target), parameters=params[nb.name],
                                       kernel_name=kernel, cwd=str(nb.path.parent), progress_bar=False,
                                       log_output=False)
        except papermill.PapermillExecutionError as e:
            entry.update(status="failed", error={"cell_index": e.cell_index, "exec_count": e.exec_count,
                                                 "cell_source": e.source, "ename": e.ename, "evalue": e.evalue})
        except Exception as e:  # kernel died, bad notebook, ...
            entry.update(status="failed", error={"cell_index": None, "ename": type(e).__name__,
                                                 "evalue": str(e), "traceback": traceback.format_exc()})
        entry["seconds"] = round(time.perf_counter() - t0, 2)
        if target.exists():
            entry["executed"] = str(target)
            try:
                entry["html"] = str(_export_html(target))
            except Exception as e:  # an export failure must not hide the run's result
                entry["html_error"] = f"{type(e).__name__}: {e}"
        record["notebooks"].append(entry)
        (out / "run.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
        if entry["status"] != "ok":
            msg = entry["error"]
            print(f"\n{nb.name}: FAILED in cell {msg.get('cell_index')}: {msg['ename']}: {msg['evalue']}",
                  file=sys.stderr)
            if fail_fast:
                break
    record["failed"] = sum(e["status"] != "ok" for e in record["notebooks"])
    record["finished_utc"] = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    (out / "run.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    return record


# ---- CLI --------------------------------------------------------------------------
def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="execute the numbered notebooks with papermill",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("selectors", nargs="*", metavar="SELECTOR", help="notebook number or name (default: all)")
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="set a parameter (YAML-typed); NN:NAME scopes it to one notebook")
    p.add_argument("--out", help="output folder (default runs/<UTC stamp>/)")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failing notebook")
    p.add_argument("--profile", default="auto", help="auto (gpu when CUDA is present), cpu, gpu, ...")
    p.add_argument("--notebooks", default=str(NOTEBOOK_DIR), help="folder of numbered notebooks")
    p.set_defaults(func=_cli_run)
    q = sub.add_parser("list", help="the notebooks with their parameters and defaults")
    q.add_argument("--notebooks", default=str(NOTEBOOK_DIR), help="folder of numbered notebooks")
    q.set_defaults(func=_cli_list)


def _cli_run(args: argparse.Namespace) -> int:
    rec = run_notebooks(args.selectors, [tuple(p) for p in args.parameter], args.out, args.fail_fast, args.profile,
                        notebook_dir=Path(args.notebooks))
    for e in rec["notebooks"]:
        print(f"{e['status']:>6}  {e['seconds']:8.1f} s  {e['notebook']}")
    print(f"run record: {Path(rec['out_dir']) / 'run.json'} ({rec['failed']} failed)")
    return 1 if rec["failed"] else 0


def _cli_list(args: argparse.Namespace) -> int:
    for nb in discover(Path(args.notebooks)):
        print(nb.name)
        for k, v in nb.parameters().items():
            typ = f"  ({v['type']})" if v["type"] and v["type"] != "None" else ""
            print(f"    {k} = {v['default']}{typ}" + (f"  # {v['help']}" if v["help"] else ""))
    return 0
