"""The context sweep as a measurement file: ``python -m workbench.bench.sweep --out DIR [options]``.

Runs :func:`workbench.sweep.run.sweep` and writes ``DIR/context_sweep.json`` (default DIR:
``data/measurements/<gpu>/``) with provenance (:func:`workbench.bench.measure.write_measurement`):
parameters, results (contexts, concurrency, layout, decomposition) and, as samples, every step's
wall time (ms) and accepted length. On the CPU it is a smoke run; its file is not H200 data.
The H200 run wants ``--device cuda --synthetic kimi-k2.6 --layers 61`` with contexts to 128k, which
needs the engine's chunked prefill (not written yet: the one-pass prefill limits the contexts).
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from workbench.bench.measure import write_measurement
    from workbench.sweep.engine import METHODS
    from workbench.sweep.run import decomposition, sweep

    p = argparse.ArgumentParser(prog="python -m workbench.bench.sweep", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="output folder (default data/measurements/<gpu>)")
    p.add_argument("--synthetic", default="tiny")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--contexts", type=int, nargs="+", default=[32, 128, 512])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--method", nargs="+", default=list(METHODS))
    p.add_argument("--generate", type=int, default=64)
    p.add_argument("--two-point", type=int, nargs=2, default=[8, 40])
    p.add_argument("--block", type=int, default=8)
    p.add_argument("--budget", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args(argv)
    try:
        doc = sweep(a.synthetic, a.layers, a.contexts, a.concurrency, a.method, a.generate, a.two_point, a.block,
                    a.budget, a.repeats, device=a.device,
                    threads=a.threads)
    except ValueError as e:
        print(f"workbench.bench.sweep: error: {e}", file=sys.stderr)
        return 2
    samples = [{"context": r["context"], "method": r["method"], "step_ms": r["step_ms"], "accepted": r["accepted"]}
               for r in doc["contexts"]]
    results = {"contexts": [{k: v for k, v in r.items() if k not in ("step_ms", "accepted")} for r in doc["contexts"]],
               "concurrency": doc["concurrency"], "layout": doc["layout"], "decomposition": decomposition(doc)}
    notes = ("CPU smoke run: not H200 data" if a.device == "cpu" else None)
    path = write_measurement("context_sweep", parameters=doc["parameters"], results=results, samples=samples,
                             notes=notes, out_dir=a.out)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
