"""One sweep end to end (the CLI, the bench entry and notebook 03 call this): build the synthetic model,
check every input against its rope/YaRN limit, run the context sweep, the concurrency sweep and the KV
layout comparison, and return one JSON-able document. Times ms, rates tokens/s.

Prefill is the engine's one-pass ragged prefill: the CPU defaults keep contexts small; a chunked prefill
that reaches 128k is engine work left for the H200 session (issue 26).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from workbench.sweep import engine as es
from workbench.sweep.layout import LAYOUTS, layout_comparison
from workbench.sweep.phases import phase_breakdown
from workbench.sweep.rates import decompose

ANCHORS = Path(__file__).resolve().parents[2] / "data" / "anchors" / "source_context.json"


def build_model(synthetic: str, layers: int | None = None, device: str = "cpu", experts: int | None = None):
    """The synthetic model of :func:`workbench.sweep.engine.model_config` (seeded weights) on ``device``."""
    import torch

    from workbench.engine.synthetic import synthetic_model
    from workbench.validation import check_choice

    check_choice("device", device, ("cpu", "cuda"))
    cfg = es.model_config(synthetic, layers)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    return synthetic_model(cfg, layers=None, experts=experts, device=device, dtype=dtype)


def sweep(synthetic: str = "tiny", layers: int | None = None, contexts: Sequence[int] = (32, 128, 512),
          concurrency: Sequence[int] = (1, 2, 4), methods: Sequence[str] = es.METHODS, generate: int = 64,
          two_point: Sequence[int] = (8, 40), block: int = 8, budget: int = 16, repeats: int = 3,
          layouts: Sequence[str] = LAYOUTS, concurrency_context: int | None = None, device: str = "cpu",
          seed: int = 0, threads: int | None = None, model=None) -> dict[str, Any]:
    """Every part of the diagnosis: {parameters, contexts (rows of measure_point), concurrency (rows), layout
    (rows of layout_comparison at the sweep's contexts), phases (rows of phase_breakdown: the eager reference's
    ms per phase per step), model}. Inputs are checked before anything runs.
    ``threads``: torch's CPU threads for the run (``torch.set_num_threads``, recorded; None leaves torch's
    setting): on a small shared CPU, 1 keeps OpenMP from spinning against other work (seen: 100x slower steps)."""
    import torch

    from workbench.validation import check_int

    cfg = es.model_config(synthetic, layers) if model is None else model.config
    chk = es.check_sweep(contexts, concurrency, generate, two_point, methods, cfg.yarn_limit, block, budget,
                         concurrency_context=concurrency_context)
    if threads is not None:
        torch.set_num_threads(check_int("threads", threads, lo=1))
    model = model or build_model(synthetic, layers, device)
    params = {"synthetic": synthetic, "layers": cfg.num_hidden_layers, "contexts": chk["contexts"],
              "concurrency": chk["concurrency"], "methods": chk["methods"], "generate": generate,
              "two_point": chk["two_point"], "block": block, "budget": budget, "repeats": repeats,
              "concurrency_context": chk["concurrency_context"], "layouts": list(layouts), "device": device,
              "seed": seed, "threads": torch.get_num_threads(), "p_top": es.P_TOP, "prefill": "one ragged pass (no chunking)"}
    ctx = es.context_sweep(model, chk["contexts"], chk["methods"], generate, chk["two_point"], block, budget,
                           repeats, seed)
    conc = es.concurrency_sweep(model, chk["concurrency"], chk["concurrency_context"], chk["methods"], generate,
                                block, budget, seed)
    lay = layout_comparison(layouts, contexts=chk["contexts"], heads=cfg.num_attention_heads,
                            kv_lora_rank=cfg.kv_lora_rank, rope_dim=cfg.qk_rope_head_dim, seed=seed)
    phases = phase_breakdown(model, chk["contexts"], chk["methods"], generate, block, budget, seed)
    return {"parameters": params, "model": cfg.name, "contexts": ctx, "concurrency": conc, "layout": lay,
            "phases": phases}


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
