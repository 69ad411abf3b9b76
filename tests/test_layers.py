"""The package's layers only point down, and no two modules import each other (directly or round a loop).

Every module of ``workbench/`` is parsed (ast, imports inside functions included). :data:`LAYERS` lists the
layers lowest first; each names the packages (``workbench.<name>``, a subpackage or a root module) that make it
up. A module may import its own package and any package of a lower layer; packages of one layer are independent
of each other (``serve`` and ``sweep`` neither import the other). The root ``workbench/__init__.py`` (paths)
is the bottom. Cycles are looked for between modules, within a package too.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "workbench"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("",),                                              # workbench/__init__.py: repository paths
    ("validation",),                                    # parameter checks and their errors
    ("config", "decode", "hardware", "dispatch", "kernels", "int4", "display", "sanitizer", "rates"),
    ("measure", "environment", "client"),               # timers, floors, provenance; the HTTP measuring client
    ("ddtree", "moe"),                                  # the DDTree and INT4 MoE kernels' Python side
    ("engine",),
    ("parallel",),
    ("acceptance",),                                    # the trained drafter's acceptance
    ("projection", "capacity"),                         # analyses
    ("serve", "sweep"),                                 # the OpenAI server; the context / concurrency sweep
    ("bench",),                                         # benchmarks that write data/measurements
    ("reports",),                                       # papers' and README's tables and figures
    ("pipeline",),                                      # the notebook pipeline
    ("cli",),                                           # the command line (its verbs found by name at run time)
    ("__main__",),                                      # python -m workbench
)


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``workbench/``."""
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = list(p.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The ``workbench`` modules ``name`` imports anywhere in its file (a ``from pkg import mod`` names ``mod``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        else:
            continue
        for t in targets:
            if t != "workbench" and not t.startswith("workbench."):
                continue
            while t not in known and "." in t:
                t = t.rpartition(".")[0]
            if t != name:
                found.add(t)
    return found


def package_of(module: str) -> str:
    """``workbench.sweep.engine`` -> ``sweep``; ``workbench.decode`` -> ``decode``; ``workbench`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of() -> dict[str, int]:
    return {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports_of(m, p, known) for m, p in known.items()}


def test_every_package_has_a_layer():
    layers = layer_of()
    missing = sorted({package_of(m) for m in modules()} - set(layers))
    assert not missing, f"packages without a layer in LAYERS: {missing}"
    assert len(layers) == sum(len(layer) for layer in LAYERS), "a package listed twice in LAYERS"


def test_imports_only_point_down():
    layers = layer_of()
    bad = []
    for m, targets in graph().items():
        for t in sorted(targets):
            a, b = package_of(m), package_of(t)
            if a != b and layers.get(b, -1) >= layers.get(a, -1):
                bad.append(f"{m} (layer {layers.get(a)}) imports {t} (layer {layers.get(b)})")
    assert not bad, "imports from a lower layer to a higher one or the same:\n" + "\n".join(bad)


def test_no_import_cycle():
    g = graph()
    state: dict[str, int] = {}   # 1 on the path, 2 done
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(g.get(m, ())):
            if state.get(t) == 1:
                cycles.append(" -> ".join(path[path.index(t):] + [t]))
            elif t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
