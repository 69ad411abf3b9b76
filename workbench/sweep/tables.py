"""The sweep document as table rows (lists of dicts): the CLI prints them with
:func:`workbench.display.text_table`, notebook 03 shows them with :func:`workbench.display.table`."""
from __future__ import annotations

from typing import Any

from workbench.sweep.run import decomposition


def tables(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """{title: rows} for the contexts (rates and their checks), the concurrency, the KV layout and the
    decomposition parts."""
    ctx = [{"context": r["context"], "method": r["method"], "p_top": r["p_top"], "TTFT ms": r["ttft_ms"],
            "step ms": r["mean_step_ms"], "accepted": r["mean_accepted"], "sustained t/s": r["sustained"],
            "two-point t/s": r["two_point"], "accepted/step t/s": r["check_sustained"]["identity"],
            "sustained vs identity": r["check_sustained"]["disagreement"],
            "two-point vs identity": (r["check_two_point"] or {}).get("disagreement")} for r in doc["contexts"]]
    conc = [{"C": r["concurrency"], "method": r["method"], "per-request t/s": r["per_request_mean"],
             "aggregate t/s": r["aggregate"], "step ms": r["mean_step_ms"], "accepted": r["mean_accepted"]}
            for r in doc["concurrency"]]
    lay = [{"layout": r["layout"], "context": r["context"], "runs/request": r["runs_per_request"],
            "mean run length": r["mean_run_length"], "runs at context": r["context_runs"],
            "attention ms": r["attention_ms"]} for r in doc["layout"]]
    ph = [{k: v for k, v in r.items()} for r in doc.get("phases", [])]
    if doc.get("source") == "endpoint":  # the engine's KV layout and phase split are not visible over HTTP
        note = [{"note": f"not measured: {doc['endpoint']} is a live server (engine-only part)"}]
        lay, ph = lay or note, ph or note
    return {"contexts": ctx, "concurrency": conc, "KV layout": lay, "phases (eager reference, ms/step)": ph,
            "decomposition": decomposition(doc)}
