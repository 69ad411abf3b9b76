"""One sweep end to end (the CLI, the bench entry and notebook 03 call this): build the synthetic model,
check every input against its rope/YaRN limit, run the context sweep, the concurrency sweep and the KV
layout comparison, and return one JSON-able document. Times ms, rates tokens/s.

Prefill is the engine's one-pass ragged prefill (``prefill="real"``, the CPU defaults' small contexts) or, for the
H200's contexts to 128k, seeded random KV rows (``prefill="synthetic"``: the decode is measured, TTFT is not; a
chunked prefill through the engine at 128k does not fit the run's time, see workbench/bench/sweep.py).
"""
from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from workbench.config import load_config
from workbench.engine.synthetic import default_experts, synthetic_model
from workbench.rates import decompose
from workbench.sweep import engine as es
from workbench.sweep.eager_phases import phase_breakdown
from workbench.sweep.endpoint import endpoint_sweep
from workbench.sweep.layout import LAYOUTS, layout_comparison
from workbench.validation import InvalidParameter, check_choice, check_int, check_list

ANCHORS = Path(__file__).resolve().parents[2] / "data" / "anchors" / "source_context.json"
PARTS = ("contexts", "concurrency", "layout")   # what one sweep runs; a run may take a subset (merged later)


def build_model(synthetic: str, layers: int | None = None, device: str = "cpu", experts: int | None = None,
                kv_tokens: int = 0):
    """The synthetic model of :func:`workbench.sweep.engine.model_config` (seeded weights) on ``device``; on CUDA
    with ``experts`` None, the most routed experts per layer that fit beside ``kv_tokens`` KV rows
    (:func:`default_experts`)."""
    check_choice("device", device, ("cpu", "cuda"))
    cfg = es.model_config(synthetic, layers)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    if device == "cuda" and experts is None and synthetic != "tiny":
        experts = default_experts(load_config(synthetic), cfg.num_hidden_layers, 1, max(kv_tokens, 1))
    return synthetic_model(cfg, layers=None, experts=experts, device=device, dtype=dtype)


def sweep(synthetic: str = "tiny", layers: int | None = None, contexts: Sequence[int] = (32, 128, 512),
          concurrency: Sequence[int] = (1, 2, 4), methods: Sequence[str] = es.METHODS, generate: int = 64,
          two_point: Sequence[int] = (8, 40), block: int = 8, budget: int = 16, repeats: int = 3,
          layouts: Sequence[str] = LAYOUTS, concurrency_context: int | None = None, device: str = "cpu",
          seed: int = 0, threads: int | None = None, model=None, prefill: str = "real",
          sustained_at: Sequence[int] | None = None, profile_steps: int = 0, concurrency_generate: int | None = None,
          experts: int | None = None, parts: Sequence[str] = PARTS, real_prefill_upto: int | None = None,
          prefill_chunk: int | None = None) -> dict[str, Any]:
    """Every part of the diagnosis: {parameters, contexts (rows of measure_point), concurrency (rows), layout
    (rows of layout_comparison at the sweep's contexts), phases (rows of phase_breakdown: the eager reference's
    ms per phase per step; CPU only), model}. Inputs are checked before anything runs.
    ``threads``: torch's CPU threads for the run (``torch.set_num_threads``, recorded; None leaves torch's
    setting): on a small shared CPU, 1 keeps OpenMP from spinning against other work (seen: 100x slower steps).
    ``prefill``: ``"real"`` (the engine's one-pass prefill; TTFT measured) or ``"synthetic"`` (seeded random KV rows,
    no prefill, TTFT not measured: the contexts to 128k on the H200). ``sustained_at``: the contexts whose long run is
    ``generate`` tokens (None: all; the others run the two-point's B). ``profile_steps`` (CUDA): each point's
    per-step terms from the captured step's kernel records. ``concurrency_generate``: tokens per request of the
    concurrency part (default ``generate``). ``real_prefill_upto`` (with ``prefill="synthetic"``): the contexts up to
    this length are prefilled by the engine all the same (TTFT measured there), in ``prefill_chunk``-token forwards
    (None: one pass). ``parts``: the parts run (:data:`PARTS`; the others are empty lists,
    ``parameters.parts`` says which ran), so that a long run can be split over several processes and merged
    (:func:`merge`). Each part's wall seconds go to ``parameters.part_seconds`` and to stderr as it ends."""
    parts = check_list("parts", list(parts), lambda name, v: check_choice(name, v, PARTS), f"parts among {PARTS}")

    cfg = es.model_config(synthetic, layers) if model is None else model.config
    chk = es.check_sweep(contexts, concurrency, generate, two_point, methods, cfg.yarn_limit, block, budget,
                         concurrency_context=concurrency_context)
    check_choice("prefill", prefill, ("real", "synthetic"))
    cgen = check_int("concurrency_generate", concurrency_generate or generate, lo=2, hi=generate)
    if sustained_at is not None:
        bad = [c for c in sustained_at if c not in chk["contexts"]]
        if bad:
            raise InvalidParameter("sustained_at", list(sustained_at), "a subset of the contexts "
                                                                       f"{chk['contexts']}")
    check_int("profile_steps", profile_steps, lo=0)
    if real_prefill_upto is not None:
        check_int("real_prefill_upto", real_prefill_upto, lo=1)
    if prefill_chunk is not None:
        check_int("prefill_chunk", prefill_chunk, lo=1)
    if threads is not None:
        torch.set_num_threads(check_int("threads", threads, lo=1))
    syn = prefill == "synthetic"
    kv_tokens = max(chk["contexts"]) + generate + es.reserve(block, budget) \
        + 16 * (chk["concurrency_context"] + cgen + es.reserve(block, budget))
    model = model or build_model(synthetic, layers, device, experts, kv_tokens)
    params = {"synthetic": synthetic, "layers": cfg.num_hidden_layers, "experts": model.config.n_routed_experts,
              "contexts": chk["contexts"], "concurrency": chk["concurrency"], "methods": chk["methods"],
              "generate": generate, "sustained_at": chk["contexts"] if sustained_at is None else list(sustained_at),
              "two_point": chk["two_point"], "block": block, "budget": budget, "repeats": repeats,
              "concurrency_context": chk["concurrency_context"], "concurrency_generate": cgen,
              "layouts": list(layouts), "device": device, "seed": seed, "threads": torch.get_num_threads(),
              "p_top": dict(es.P_TOP), "profile_steps": profile_steps,
              "prefill": ("seeded random KV rows (no prefill; TTFT not measured)" if syn else "the engine's prefill")
              + (f"; the engine's prefill up to {real_prefill_upto} tokens" if syn and real_prefill_upto else "")
              + (f", {prefill_chunk} tokens per forward" if prefill_chunk else ", one pass"),
              "real_prefill_upto": real_prefill_upto, "prefill_chunk": prefill_chunk,
              "parts": list(parts), "part_seconds": {}}

    def timed(part: str, run):
        if part not in parts:
            return []
        t0 = time.perf_counter()
        out = run()
        _free(device)
        params["part_seconds"][part] = time.perf_counter() - t0
        print(f"sweep part {part}: {params['part_seconds'][part]:.1f} s", file=sys.stderr, flush=True)
        return out

    ctx = timed("contexts", lambda: es.context_sweep(
        model, chk["contexts"], chk["methods"], generate, chk["two_point"], block, budget, repeats, seed,
        synthetic_prefix=syn, sustained_at=sustained_at, profile_steps=profile_steps,
        real_prefill_upto=real_prefill_upto, prefill_chunk=prefill_chunk))
    conc = timed("concurrency", lambda: es.concurrency_sweep(
        model, chk["concurrency"], chk["concurrency_context"], chk["methods"], cgen, block, budget, seed,
        synthetic_prefix=syn))
    lay = timed("layout", lambda: layout_comparison(
        layouts, contexts=chk["contexts"], heads=cfg.num_attention_heads, kv_lora_rank=cfg.kv_lora_rank,
        rope_dim=cfg.qk_rope_head_dim, seed=seed, device=device, tail=1 if device == "cpu" else budget + 1))
    phases = phase_breakdown(model, chk["contexts"], chk["methods"], generate, block, budget, seed) \
        if device == "cpu" and "contexts" in parts else []
    return {"parameters": params, "model": cfg.name, "contexts": ctx, "concurrency": conc, "layout": lay,
            "phases": phases}


def merge(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One sweep document from runs of parts of one plan (:func:`sweep` with ``parts``): the context rows of every
    run in context order, the concurrency and layout rows of the runs that took those parts (each part from exactly
    one run), the parameters of the first run with the union of contexts and parts and every run's part seconds.
    Raises when the runs disagree on the model or the sweep's settings, or a part or (context, method) repeats."""
    if not docs:
        raise InvalidParameter("docs", [], "at least one sweep document")
    same = ("synthetic", "layers", "experts", "methods", "generate", "two_point", "block", "budget", "repeats",
            "device", "prefill", "p_top", "profile_steps")
    first = docs[0]["parameters"]
    for d in docs[1:]:
        diff = [k for k in same if d["parameters"].get(k) != first.get(k)]
        if diff:
            raise InvalidParameter("docs", [k for k in diff], "runs of one plan (same model and settings); "
                                                              f"these differ: {diff}")
    seen_parts: dict[str, int] = {}
    for i, d in enumerate(docs):
        for p in d["parameters"].get("parts", PARTS):
            if p != "contexts" and p in seen_parts:
                raise InvalidParameter("docs", p, f"each of the concurrency and layout parts from one run (runs "
                                                  f"{seen_parts[p]} and {i} both took {p!r})")
            seen_parts.setdefault(p, i)
    keys = [(r["context"], r["method"]) for d in docs for r in d["contexts"]]
    if len(keys) != len(set(keys)):
        raise InvalidParameter("docs", sorted({k for k in keys if keys.count(k) > 1}), "each (context, method) once")
    rows = sorted((r for d in docs for r in d["contexts"]), key=lambda r: (r["context"], r["method"]))
    params = {**first, "contexts": sorted({c for d in docs for c in d["parameters"]["contexts"]}),
              "sustained_at": sorted({c for d in docs for c in d["parameters"]["sustained_at"]}),
              "parts": sorted(seen_parts), "part_seconds": [d["parameters"].get("part_seconds", {}) for d in docs],
              "merged_runs": len(docs)}
    return {"parameters": params, "model": docs[0]["model"], "contexts": rows,
            "concurrency": [r for d in docs for r in d["concurrency"]],
            "layout": [r for d in docs for r in d["layout"]], "phases": [r for d in docs for r in d["phases"]]}


def _free(device: str) -> None:
    """Return the last engine's KV pool and graphs to the device (the next part builds its own engine)."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def samples_of(doc: dict[str, Any], context: int, method: str) -> dict[str, Any] | None:
    """A context_sweep measurement file's per-step samples (step_ms, accepted) of one (context, method)."""
    return next((s for s in doc.get("samples") or [] if s["context"] == context and s["method"] == method), None)


def from_measurement(doc: dict[str, Any]) -> dict[str, Any]:
    """A context_sweep measurement file (``python -m workbench.bench.sweep``) in :func:`sweep`'s shape: its
    parameters, and its context rows with their per-step samples (step_ms, accepted) put back."""
    ctx = []
    for r in doc["results"]["contexts"]:
        s = samples_of(doc, r["context"], r["method"]) or {"step_ms": [], "accepted": []}
        ctx.append({**r, "step_ms": s["step_ms"], "accepted": s["accepted"]})
    return {"parameters": doc["parameters"], "model": doc["parameters"].get("synthetic"), "contexts": ctx,
            "concurrency": doc["results"]["concurrency"], "layout": doc["results"]["layout"],
            "phases": doc["results"].get("phases", []), "provenance": doc.get("provenance")}


def notebook_doc(endpoint: str | None = None, served_model: str | None = None, synthetic: str = "tiny",
                 layers: int | None = None, contexts: Sequence[int] = (32, 128, 512), concurrency: Sequence[int] = (1, 2, 4),
                 methods: Sequence[str] = es.METHODS, generate: int = 64, two_point: Sequence[int] = (8, 40),
                 block: int = 8, budget: int = 16, repeats: int = 3, device: str = "cpu",
                 threads: int | None = None, measurement: str | None = None) -> dict[str, Any]:
    """Notebook 03's document: with ``measurement`` (the path of a committed ``context_sweep.json``) that run,
    shown without running anything; with ``endpoint`` (a URL) the live server's measurements through the serving
    client (:func:`workbench.sweep.endpoint.endpoint_sweep`: ``generate`` tokens sustained, ``two_point``, the
    contexts and concurrencies; the engine's parameters unused), else this engine's :func:`sweep`."""
    if measurement is not None:
        path = Path(measurement)
        if not path.is_file():
            raise InvalidParameter("measurement", measurement, "the path of a context_sweep.json measurement file "
                                                               "(e.g. data/measurements/h200/context_sweep.json)")
        doc = json.loads(path.read_text())
        if doc.get("name") != "context_sweep" and "contexts" not in doc.get("results", {}):
            raise InvalidParameter("measurement", measurement, "a context_sweep measurement file (it has no "
                                                               "results.contexts)")
        return from_measurement(doc)
    if endpoint is not None:
        return endpoint_sweep(endpoint, served_model, contexts, concurrency, generate, two_point)
    return sweep(synthetic, layers, contexts, concurrency, methods, generate, two_point, block, budget, repeats,
                 device=device, threads=threads)


def anchors() -> dict[str, Any]:
    """The source's quoted figures (data/anchors/source_context.json)."""
    return json.loads(ANCHORS.read_text())["anchors"]


def decomposition(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The source's arithmetic (accepted length / step time) redone: the source's row (2.9 / 144 ms) and, per
    measured (context, method), mean accepted / mean step ms beside the sustained and two-point rates, and which
    term moved the rate most against the first context of the same method (``dominant``: the ratio of accepted
    lengths against the inverse ratio of step times)."""
    a = anchors()
    acc, ms = a["accepted_length_reasoning"]["value"], a["step_ms_at_5k"]["value"]
    out = [{"source": "source (seed-000)", "context": a["step_ms_at_5k"]["context"], "method": "DDTree (SGLang)",
            "mean_accepted": acc, "mean_step_ms": ms, "accepted/step": decompose(acc, ms),
            "sustained": a["sustained_tokens_per_s"]["value"],
            "two_point": a["two_point_tokens_per_s_at_5k"]["value"], "dominant": "-"}]
    first: dict[str, dict] = {}
    for r in doc["contexts"]:
        f = first.setdefault(r["method"], r)
        acc_ratio = r["mean_accepted"] / f["mean_accepted"]
        step_ratio = f["mean_step_ms"] / r["mean_step_ms"]
        dom = "-" if r is f else ("step time" if abs(step_ratio - 1) >= abs(acc_ratio - 1) else "accepted length")
        out.append({"source": "this run", "context": r["context"], "method": r["method"],
                    "mean_accepted": r["mean_accepted"], "mean_step_ms": r["mean_step_ms"],
                    "accepted/step": decompose(r["mean_accepted"], r["mean_step_ms"]),
                    "sustained": r["sustained"], "two_point": r["two_point"], "dominant": dom})
    return out
