"""The context sweep as a measurement file: ``python -m workbench.bench.sweep --out DIR [--h200 | options]``.

Runs :func:`workbench.sweep.run.sweep` and writes ``DIR/context_sweep.json`` (default DIR:
``data/measurements/<gpu>/``) with provenance (:func:`workbench.measure.write_measurement`, ``WORKBENCH_COMMIT``
honoured): parameters, the run plan and its time estimate, results (contexts with each point's per-step terms,
concurrency, layout, decomposition) and, as samples, every step's wall time (ms) and accepted length. On the CPU it
is a dry run; its file is not H200 data.

``--h200`` is the context diagnosis's run at full depth (:data:`H200_PLAN`): the engine-step model (synthetic K2.6 shape, 61
layers, the most routed INT4 experts that fit), contexts 1k-128k, prefilled by the engine up to 4k (1,024 tokens per
forward; TTFT recorded, and the two-point walls include it as the source's did) and beyond with seeded random KV rows
(a prefill of 128k tokens through 61 layers does not fit the run's time), greedy and DDTree high /
low, two-point (8, 264) at every context, and the full 1,500-token sustained run only where the source measured
it (about 5k: context 4096; adding 64k costs about 95 s more, past the ~6 minutes), the other contexts' sustained
rate over the two-point's 264 tokens; concurrency 1-10 at 1k for 32
tokens each; KV layout (contiguous, scattered, compacted) with the verify kernel's attention time at every context;
per-step terms from the captured step's kernel records over 4 steps per point. :func:`plan_seconds` estimates the
run from ``engine_step.json``'s measured step times (greedy and DDTree at C = 1 and their growth with C), with the
verify attention's growth with context from the kernel's FLOPs, and the estimate is written beside the result.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from workbench.decode import DEFAULT, bucket_for
from workbench.measure import load_measurement, write_measurement
from workbench.sweep.engine import METHODS
from workbench.sweep.run import PARTS, decomposition, merge, sweep

# The context diagnosis on one H200 (~6 minutes, see plan_seconds): which points get the full sustained run, how many
# repetitions, how long the concurrency runs are.
H200_PLAN: dict[str, Any] = {
    "synthetic": "kimi-k2.6", "layers": 61, "device": "cuda", "prefill": "synthetic", "real_prefill_upto": 4096,
    "prefill_chunk": 1024,
    "contexts": [1024, 4096, 16384, 65536, 131072], "methods": ["greedy", "ddtree-high", "ddtree-low"],
    "generate": 1500, "sustained_at": [4096], "two_point": [8, 264], "repeats": 1,
    "block": DEFAULT.block, "budget": DEFAULT.budget, "concurrency": list(range(1, 11)), "concurrency_context": 1024,
    "concurrency_generate": 32, "profile_steps": 4,
}


# The engine's chunked prefill on the H200 (the committed serving.json: TTFT 2.2 s for 4,096 tokens in 1,024-token
# forwards at 61 layers): an estimate's constant, not a result.
PREFILL_MS_PER_TOKEN = 0.55


def _step_ms(method: str, context: int, C: int, engine_step: dict[str, Any] | None) -> float:
    """A step's ms for the estimate: engine_step.json's C-row graph step at prefix 4096 (the nearest bucket), plus
    for DDTree the verify attention's extra FLOPs beyond 4096 keys (33 nodes x 64 heads x 1,088 MACs per key per
    layer at 400 TFLOP/s); greedy's extra KV read over 4.3 TB/s."""
    rows = (engine_step or {}).get("results", {}).get("rows", [])
    want = "greedy" if method == "greedy" else "ddtree"

    B = bucket_for(C)
    # the sweep's engine runs the default step ops (fuse "eager"): the compiled rows are ~15% faster and under-estimate
    got = [r["wall_ms"] for r in rows if r["method"] == want and r["C"] == B and r["path"] == "graph"
           and r.get("fuse", "eager") == "eager"]
    base = min(got) if got else (16.0 if want == "greedy" else 41.0) * (1 + 0.25 * math.log2(B))
    extra = max(0, context - 4096)
    if want == "greedy":
        return base + C * extra * 70272 / 4.3e12 * 1e3
    return base + C * 33 * 64 * 2 * 1088 * extra * 61 / 400e12 * 1e3


def plan_seconds(plan: dict[str, Any], engine_step: dict[str, Any] | None,
                 accepted: dict[str, float] | None = None, parts=("contexts", "concurrency")) -> dict[str, Any]:
    """Estimated seconds of the ``parts`` of ``plan`` that it estimates (contexts, concurrency; steps x step ms;
    ``accepted`` tokens per step per method, default greedy 1, DDTree high 8, low 1.7 at block 16), model build and
    captures as a fixed 40 s. ``plan["sustained_at"]``: the contexts with the long run (None: all)."""
    acc = accepted or {"greedy": 1.0, "ddtree-high": 8.0, "ddtree-low": 1.7}
    a, b = plan["two_point"]
    ctx_s = 0.0
    upto = plan.get("real_prefill_upto") or 0
    long_at = plan["contexts"] if plan.get("sustained_at") is None else plan["sustained_at"]
    for c in plan["contexts"] if "contexts" in parts else ():
        n = plan["generate"] if c in long_at else b
        for m in plan["methods"]:
            tokens = a + n + plan["repeats"] * (a + b) + (4 + 3) * acc[m]
            ctx_s += tokens / acc[m] * _step_ms(m, c, 1, engine_step) / 1e3
            if c <= upto:   # prefills: warm-up, long run, the two-point's A and B per repeat, the profiled session
                ctx_s += (3 + 2 * plan["repeats"]) * c * PREFILL_MS_PER_TOKEN / 1e3
    conc_s = 0.0
    for C in plan["concurrency"] if "concurrency" in parts else ():
        g = plan["concurrency_generate"]
        conc_s += (g + 3) * _step_ms("greedy", plan["concurrency_context"], C, engine_step) / 1e3
        for m in plan["methods"]:
            conc_s += (g + 3) / acc[m] * _step_ms(m, plan["concurrency_context"], C, engine_step) / 1e3
    return {"contexts_s": ctx_s, "concurrency_s": conc_s, "fixed_s": 40.0, "total_s": ctx_s + conc_s + 40.0,
            "basis": "engine_step.json graph step times (nearest bucket, prefix 4096) + verify attention FLOPs / "
                     "KV bytes beyond 4096 keys; accepted per step " + ", ".join(f"{k} {v}" for k, v in acc.items())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.bench.sweep", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="output folder (default data/measurements/<gpu>)")
    p.add_argument("--h200", action="store_true", help="the context diagnosis's full-depth run (H200_PLAN); the options below "
                                                       "then change single values of the plan")
    p.add_argument("--synthetic", default=None, help="default tiny")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--experts", type=int, default=None)
    p.add_argument("--contexts", type=int, nargs="+", default=None, help="default 32 128 512")
    p.add_argument("--concurrency", type=int, nargs="+", default=None, help="default 1 2 4")
    p.add_argument("--concurrency-context", type=int, default=None)
    p.add_argument("--concurrency-generate", type=int, default=None)
    p.add_argument("--method", nargs="+", default=None, help="default " + " ".join(METHODS))
    p.add_argument("--generate", type=int, default=None, help="default 64")
    p.add_argument("--sustained-at", type=int, nargs="+", default=None, help="contexts with the full sustained run")
    p.add_argument("--two-point", type=int, nargs=2, default=None, help="default 8 40")
    p.add_argument("--block", type=int, default=None, help="default 8")
    p.add_argument("--budget", type=int, default=None, help="default 16")
    p.add_argument("--repeats", type=int, default=None, help="default 3")
    p.add_argument("--prefill", default=None, help="real or synthetic (default real)")
    p.add_argument("--profile-steps", type=int, default=None, help="CUDA: steps profiled per point (default 0)")
    p.add_argument("--real-prefill-upto", type=int, default=None,
                   help="with --prefill synthetic: the engine prefills the contexts up to this length (TTFT there)")
    p.add_argument("--prefill-chunk", type=int, default=None, help="tokens per prefill forward (default one pass)")
    p.add_argument("--device", default=None, help="default cpu")
    p.add_argument("--part", nargs="+", default=None, choices=PARTS,
                   help="run only these parts (default all); write NAME.json with --name and merge the parts' files "
                        "with --merge")
    p.add_argument("--name", default="context_sweep", help="measurement name (default context_sweep)")
    p.add_argument("--merge", nargs="+", default=None, metavar="FILE",
                   help="merge part files (runs of one plan) into context_sweep.json; runs nothing")
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args(argv)
    if a.merge:
        return _merge_files(a.merge, a.out)
    plan: dict[str, Any] = dict(H200_PLAN) if a.h200 else {
        "synthetic": "tiny", "layers": None, "device": "cpu", "prefill": "real", "contexts": [32, 128, 512],
        "methods": list(METHODS), "generate": 64, "sustained_at": None, "two_point": [8, 40], "repeats": 3,
        "block": 8, "budget": 16, "concurrency": [1, 2, 4], "concurrency_context": None,
        "concurrency_generate": None, "profile_steps": 0, "real_prefill_upto": None, "prefill_chunk": None}
    for key, val in (("synthetic", a.synthetic), ("layers", a.layers), ("contexts", a.contexts),
                     ("concurrency", a.concurrency), ("concurrency_context", a.concurrency_context),
                     ("concurrency_generate", a.concurrency_generate), ("methods", a.method),
                     ("generate", a.generate), ("sustained_at", a.sustained_at), ("two_point", a.two_point),
                     ("block", a.block), ("budget", a.budget), ("repeats", a.repeats), ("prefill", a.prefill),
                     ("profile_steps", a.profile_steps), ("device", a.device),
                     ("real_prefill_upto", a.real_prefill_upto), ("prefill_chunk", a.prefill_chunk)):
        if val is not None:
            plan[key] = val
    if plan["sustained_at"] is not None:
        plan["sustained_at"] = [c for c in plan["sustained_at"] if c in plan["contexts"]]
    est = plan_seconds(plan, load_measurement("engine_step", "h200"), parts=a.part or PARTS) \
        if plan["device"] == "cuda" else None
    if est:
        print(f"estimated run time on one H200: {est['total_s']:.0f} s ({est['basis']})", file=sys.stderr)
    try:
        doc = sweep(plan["synthetic"], plan["layers"], plan["contexts"], plan["concurrency"], plan["methods"],
                    plan["generate"], plan["two_point"], plan["block"], plan["budget"], plan["repeats"],
                    concurrency_context=plan["concurrency_context"], device=plan["device"], threads=a.threads,
                    prefill=plan["prefill"], sustained_at=plan["sustained_at"], profile_steps=plan["profile_steps"],
                    concurrency_generate=plan["concurrency_generate"], experts=a.experts,
                    parts=a.part or PARTS, real_prefill_upto=plan["real_prefill_upto"],
                    prefill_chunk=plan["prefill_chunk"])
    except ValueError as e:
        print(f"workbench.bench.sweep: error: {e}", file=sys.stderr)
        return 2
    notes = ("CPU dry run: not H200 data" if plan["device"] == "cpu" else
             "Prefill: seeded random KV rows (TTFT not measured). Sustained 1,500 tokens only at the contexts in "
             "plan.sustained_at (the source's ~5k point); elsewhere the sustained rate is over the two-point's "
             "B tokens. Per-step terms: CUDA profiler kernel records of the captured step by kernel family; draft "
             "timed separately; rest = wall - the others (projections, norms, lm_head, glue, host gaps).")
    path = write_measurement(a.name, parameters=doc["parameters"], samples=_samples(doc), notes=notes,
                             results=_results(doc, {"h200": a.h200, **plan}, est), out_dir=a.out)
    print(path)
    return 0


def _samples(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"context": r["context"], "method": r["method"], "step_ms": r["step_ms"], "accepted": r["accepted"]}
            for r in doc["contexts"]]


def _results(doc: dict[str, Any], plan: dict[str, Any] | list, est: Any) -> dict[str, Any]:
    return {"contexts": [{k: v for k, v in r.items() if k not in ("step_ms", "accepted")} for r in doc["contexts"]],
            "concurrency": doc["concurrency"], "layout": doc["layout"], "phases": doc["phases"],
            "decomposition": decomposition(doc), "plan": plan, "estimate": est}


def _merged_estimate(prov: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The parts' plan estimates summed (each part estimated its own plan before it ran); None when none had one."""
    ests = [p["estimate"] for p in prov if p.get("estimate")]
    if not ests:
        return None
    return {"total_s": sum(e["total_s"] for e in ests), "basis": ests[0]["basis"] + f" (sum over {len(ests)} parts)",
            "parts": ests}


def _merge_files(files: list[str], out: str | None) -> int:
    """context_sweep.json from part files written by ``--part ... --name ...`` (runs of one plan): their documents
    rebuilt (each context row with its step samples), merged (:func:`workbench.sweep.run.merge`), written with the
    first file's provenance fields kept as ``merged_from`` (each part's commit, date and GPU)."""
    docs, prov, first_prov = [], [], None
    for f in files:
        raw = json.loads(Path(f).read_text())
        first_prov = first_prov or raw.get("provenance")
        steps = {(s["context"], s["method"]): s for s in raw["samples"]}
        res = raw["results"]
        docs.append({"parameters": raw["parameters"], "model": raw["parameters"].get("synthetic"),
                     "contexts": [{**r, **{k: steps[(r["context"], r["method"])][k] for k in ("step_ms", "accepted")}}
                                  for r in res["contexts"]],
                     "concurrency": res["concurrency"], "layout": res["layout"], "phases": res["phases"]})
        prov.append({"file": Path(f).name, **{k: raw.get("provenance", {}).get(k) for k in
                                              ("git_commit", "date_utc", "gpu", "driver")}, "plan": res.get("plan"),
                     "estimate": res.get("estimate")})
    try:
        doc = merge(docs)
    except ValueError as e:
        print(f"workbench.bench.sweep: error: {e}", file=sys.stderr)
        return 2
    notes = json.loads(Path(files[0]).read_text()).get("notes", "")
    path = write_measurement("context_sweep", parameters={**doc["parameters"], "merged_from": prov},
                             results=_results(doc, [p["plan"] for p in prov], _merged_estimate(prov)),
                             samples=_samples(doc), notes=notes + " Merged from part runs (parameters.merged_from).",
                             out_dir=out, extra={"provenance": first_prov} if first_prov else None)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
