"""Notebook 03 against a live OpenAI-compatible server: the measuring client's results in the sweep document's shape.

:func:`endpoint_sweep` runs :func:`workbench.client.sweep` (two-point and sustained rates per context, every
(context, concurrency) point) and :func:`as_sweep_doc` maps its result onto the rows that
:mod:`workbench.sweep.tables` and :mod:`workbench.sweep.figures` read, so the notebook draws the same plots:

- ``contexts`` rows (method = the served model's name): TTFT (ms) of the sustained request; ``step_ms`` its ITL
  gaps and ``accepted`` the tokens of each token event (on our server one event is one engine step; on a server
  that streams one token per chunk, 1 each); the sustained and two-point rates (tokens/s) and both checked against
  mean tokens per event / mean gap (:func:`workbench.rates.rate_check`);
- ``concurrency`` rows: aggregate output tokens/s of the C requests and the mean of their per-request rates;
- ``layout`` and ``phases``: empty (the KV layout and the per-phase split are the engine's, not visible over HTTP).

Failed or timed-out requests are counted in ``failures`` (one entry per failed request, with its error); a context
whose sustained or two-point request failed has no row, and the failure says so.
"""
from __future__ import annotations

import statistics
from typing import Any, Sequence
from urllib.parse import urlparse

from workbench.client import sweep
from workbench.rates import rate_check
from workbench.validation import InvalidParameter, check_str


def check_endpoint(endpoint: str, served_model: str | None) -> str:
    """``endpoint`` an http(s) URL and ``served_model`` the model name it serves; returns the endpoint."""
    u = urlparse(check_str("endpoint", endpoint))
    if u.scheme not in ("http", "https") or not u.netloc:
        raise InvalidParameter("endpoint", endpoint, "an http:// or https:// base URL, e.g. http://127.0.0.1:8000")
    if not served_model:
        raise InvalidParameter("served_model", served_model, "the served model's name (required with an endpoint)")
    return endpoint


def endpoint_sweep(endpoint: str, served_model: str, contexts: Sequence[int], concurrency: Sequence[int],
                   generate: int, two_point: Sequence[int], timeout: float = 600.0, api_key: str | None = None,
                   seed: int = 0) -> dict[str, Any]:
    """Measure ``endpoint`` (client sweep: ``max_tokens`` = ``two_point[1]`` at each concurrency point, the
    two-point pair and a ``generate``-token sustained request per context) and return :func:`as_sweep_doc`."""
    check_endpoint(endpoint, served_model)
    res = sweep(endpoint, served_model, contexts, concurrency, max_tokens=list(two_point)[-1], two_point=two_point,
                sustained=generate, timeout=timeout, api_key=api_key, seed=seed)
    return as_sweep_doc(res, {"contexts": list(contexts), "concurrency": list(concurrency), "generate": generate,
                              "two_point": list(two_point)})


def _context_row(model: str, r: dict[str, Any]) -> dict[str, Any] | None:
    su, tp = r.get("sustained"), r.get("two_point")
    if not (su and su["ok"] and su["tokens_per_s"] and tp and tp["ok"] and tp["tokens_per_s"]):
        return None
    gaps_ms = [1e3 * g for g in su["itl_s"]]
    acc = [float(n) for n in su["chunk_tokens"][1:]]  # tokens of each event after the first (one gap each)
    if not gaps_ms or len(acc) != len(gaps_ms):
        return None
    secs = [g / 1e3 for g in gaps_ms]
    return {"context": r["context"], "method": model, "p_top": None, "ttft_ms": 1e3 * su["ttft_s"],
            "generated": su["tokens"], "committed": int(sum(acc)), "decode_ms": 1e3 * su["decode_s"],
            "mean_step_ms": statistics.fmean(gaps_ms), "mean_accepted": statistics.fmean(acc),
            "sustained": su["tokens_per_s"], "two_point": tp["tokens_per_s"], "two_point_tokens": tp["tokens"],
            "two_point_wall_ms": [1e3 * t for t in tp["e2e_s"]],
            "check_sustained": rate_check(su["tokens_per_s"], acc, secs),
            "check_two_point": rate_check(tp["tokens_per_s"], acc, secs),
            "server_accept_length": su.get("accept_length"), "step_ms": gaps_ms, "accepted": acc}


def as_sweep_doc(res: dict[str, Any], parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """The client sweep result ``res`` as a sweep document (module docstring)."""
    model = res["model"]
    failures = []
    ctx = []
    for r in res["rates"]:
        row = _context_row(model, r)
        if row is None:
            errs = [e for part in ("sustained", "two_point") if r.get(part)
                    for e in ([r[part].get("error")] if part == "sustained" else r[part].get("errors", [])) if e]
            failures.append({"context": r["context"], "what": "rates", "errors": errs or ["no rate"]})
        else:
            ctx.append(row)
    conc = []
    for p in res["points"]:
        a = p["aggregate"]
        failures += [{"context": p["context"], "concurrency": p["concurrency"], "what": "point", "errors": [e]}
                     for e in a["errors"]]
        per = [q["output_tokens_per_s"] for q in p["requests"] if q["ok"] and q["output_tokens_per_s"]]
        if not per:
            continue
        conc.append({"concurrency": p["concurrency"], "method": model, "p_top": None, "context": p["context"],
                     "per_request": per, "per_request_mean": statistics.fmean(per),
                     "aggregate": a["output_tokens_per_s"], "committed": a["output_tokens"],
                     "steps": a["itl_s"]["n"], "mean_step_ms": 1e3 * (a["itl_s"]["mean"] or float("nan")),
                     "mean_accepted": a["accept_length"], "failed": a["failed"]})
    return {"source": "endpoint", "endpoint": res["endpoint"], "model": model,
            "parameters": {**(parameters or {}), "endpoint": res["endpoint"], "served_model": model},
            "contexts": ctx, "concurrency": conc, "layout": [], "phases": [], "failures": failures, "client": res}
