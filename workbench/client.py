"""A measuring client for any OpenAI-compatible completions server (ours, SGLang, vLLM).

Each request is streamed (``/v1/completions``, ``"stream": true``) and timed on arrival of its chunks; figures are
named as SGLang's ``bench_serving`` and vLLM's ``bench serve`` name them:

- TTFT: request sent -> first chunk carrying output;
- ITL: the gaps between successive output chunks of one request (a DDTree step that commits several tokens
  arrives as one chunk: one gap; with ``token_ids`` in the chunks, as ours sends, a chunk without ids (text
  held back for a stop string or an incomplete character, flushed at the end) is not a token event);
- TPOT: ``(e2e - TTFT) / (output tokens - 1)``;
- output tokens/s: per request ``output tokens / e2e``; aggregate at concurrency C ``sum output tokens / wall``
  from the first send to the last end;
- tokens per token event (``chunk_tokens``: the ids a chunk carries, or 1): on our server one event is one engine
  step, so these are the accepted lengths and the ITL gaps the step times, step by step over the generation;
- accepted length: when the server reports it (``meta_info.spec_accept_length`` with ``spec_verify_ct``: ours and
  SGLang's), the step-weighted mean.

Prompts of a chosen token length are sent as token ids (the OpenAI completions API takes a list of ids; vLLM and
SGLang accept it), ids 1..255 drawn from a seed, so the length is exact on any server whose vocabulary has them;
``usage.prompt_tokens`` is recorded to confirm it. Timeouts and failures are results, never dropped: each request
has ``ok`` and, when not, ``error`` (``"timeout"``, the HTTP status and the server's error message, ...), and
every aggregate counts them. The two-point rate (``max_tokens`` A and B, each alone) and the sustained rate (one
long generation, tokens after the first over the time after the first) use :mod:`workbench.rates`.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import random
import statistics
import sys
import time
from typing import Any, Sequence

import httpx

from workbench.rates import sustained_rate, two_point_rate
from workbench.validation import check_float, check_int, check_list, check_str, check_two_point, parse_text


@dataclasses.dataclass
class RequestResult:
    ok: bool
    error: str | None
    context: int
    max_tokens: int
    prompt_tokens: int | None = None
    output_tokens: int = 0
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = dataclasses.field(default_factory=list)
    accept_length: float | None = None
    spec_steps: int | None = None
    chunk_tokens: list[int] = dataclasses.field(default_factory=list)  # tokens of each token event (ids, or 1)
    sent_s: float | None = None  # time.perf_counter() when the request was sent (arrivals: sent + ttft + itl sums)
    token_ids: list[int] = dataclasses.field(default_factory=list)  # the ids the chunks carried (servers that send them)

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or self.output_tokens < 2 or self.ttft_s is None:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def output_tokens_per_s(self) -> float | None:
        return self.output_tokens / self.e2e_s if self.ok and self.e2e_s else None

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["tpot_s"], d["output_tokens_per_s"] = self.tpot_s, self.output_tokens_per_s
        return d


def prompt_ids(context: int, seed: int = 0) -> list[int]:
    """``context`` token ids in 1..255, reproducible from ``seed``."""
    g = random.Random(seed)
    return [g.randint(1, 255) for _ in range(context)]


async def measure_request(http, endpoint: str, model: str, prompt: list[int], max_tokens: int,
                          timeout: float, api_key: str | None = None) -> RequestResult:
    """Stream one completion and time it (module docstring)."""
    r = RequestResult(False, None, len(prompt), max_tokens)
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    t0 = time.perf_counter()
    r.sent_s = t0
    last = None
    chunks_tokens = 0

    async def run():
        nonlocal last, chunks_tokens
        async with http.stream("POST", endpoint.rstrip("/") + "/v1/completions", json=body, headers=headers) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                try:
                    msg = json.loads(text)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    msg = text[:300]
                r.error = f"HTTP {resp.status_code}: {msg}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                obj = json.loads(line[6:])
                if "error" in obj:
                    r.error = f"stream error: {obj['error'].get('message')}"
                    return
                now = time.perf_counter()
                if obj.get("usage"):
                    r.prompt_tokens = obj["usage"].get("prompt_tokens")
                    r.output_tokens = obj["usage"].get("completion_tokens") or 0
                if obj.get("meta_info"):
                    m = obj["meta_info"]
                    r.accept_length, r.spec_steps = m.get("spec_accept_length"), m.get("spec_verify_ct")
                for c in obj.get("choices") or []:
                    ids = c.get("token_ids")  # ours; other servers: a chunk with text is a token event
                    if (bool(ids) if ids is not None else bool(c.get("text"))):
                        if r.ttft_s is None:
                            r.ttft_s = now - t0
                        else:
                            r.itl_s.append(now - last)
                        last = now
                        r.chunk_tokens.append(len(c.get("token_ids") or []) or 1)
                        r.token_ids += c.get("token_ids") or []
                        chunks_tokens += r.chunk_tokens[-1]
            r.ok = r.ttft_s is not None
            if not r.ok:
                r.error = "no output"

    try:
        await asyncio.wait_for(run(), timeout)
    except asyncio.TimeoutError:
        r.ok, r.error = False, f"timeout after {timeout} s"
    except (httpx.HTTPError, OSError, ValueError) as e:
        r.ok, r.error = False, f"{type(e).__name__}: {e}"
    r.e2e_s = time.perf_counter() - t0
    if r.ok and not r.output_tokens:
        r.output_tokens = chunks_tokens  # no usage chunk: count the chunks' ids (or chunks)
    return r


def _stats(values: Sequence[float]) -> dict:
    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return {"mean": None, "median": None, "p99": None, "n": 0}
    s = sorted(v)
    return {"mean": statistics.fmean(v), "median": statistics.median(v),
            "p99": s[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)], "n": len(v)}


def aggregate(results: Sequence[RequestResult], wall_s: float) -> dict:
    """Aggregates of one concurrency point; failures counted (``failed``, ``errors``)."""
    ok = [r for r in results if r.ok]
    out = sum(r.output_tokens for r in ok)
    steps = sum(r.spec_steps or 0 for r in ok if r.accept_length is not None)
    acc = (sum(r.accept_length * r.spec_steps for r in ok if r.accept_length is not None and r.spec_steps)
           / steps) if steps else None
    return {"requests": len(results), "completed": len(ok), "failed": len(results) - len(ok),
            "errors": [r.error for r in results if not r.ok], "wall_s": wall_s, "output_tokens": out,
            "output_tokens_per_s": out / wall_s if wall_s > 0 else None,
            "ttft_s": _stats([r.ttft_s for r in ok]), "itl_s": _stats([x for r in ok for x in r.itl_s]),
            "tpot_s": _stats([r.tpot_s for r in ok]), "e2e_s": _stats([r.e2e_s for r in ok]),
            "accept_length": acc}


async def _point(http, endpoint, model, context, concurrency, max_tokens, timeout, api_key, seed):
    t0 = time.perf_counter()
    rs = await asyncio.gather(*(measure_request(http, endpoint, model, prompt_ids(context, seed + i), max_tokens,
                                                timeout, api_key) for i in range(concurrency)))
    return {"context": context, "concurrency": concurrency, "max_tokens": max_tokens,
            "aggregate": aggregate(rs, time.perf_counter() - t0), "requests": [r.as_dict() for r in rs]}


def sweep(endpoint: str, model: str, contexts: Sequence[int] = (128,), concurrency: Sequence[int] = (1,),
          max_tokens: int = 64, two_point: Sequence[int] | None = None, sustained: int | None = None,
          timeout: float = 120.0, api_key: str | None = None, seed: int = 0) -> dict:
    """Measure ``endpoint`` at every (context, concurrency) point; with ``two_point`` (A, B) and ``sustained``
    N, also those rates at each context, one request at a time. Returns a JSON-ready dict."""
    check_str("endpoint", endpoint)
    check_str("model", model)
    contexts = check_list("contexts", contexts, lambda n, v: check_int(n, v, lo=1), "integers >= 1")
    concurrency = check_list("concurrency", concurrency, lambda n, v: check_int(n, v, lo=1, hi=1024),
                             "integers in [1, 1024]")
    check_int("max_tokens", max_tokens, lo=1)
    check_float("timeout", timeout, lo=0.0, lo_open=True)
    if two_point is not None:
        two_point = check_two_point("two_point", two_point)
    if sustained is not None:
        check_int("sustained", sustained, lo=2)

    async def main():
        async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=httpx.Limits(
                max_connections=max(concurrency) + 4)) as http:
            points = [await _point(http, endpoint, model, c, n, max_tokens, timeout, api_key, seed)
                      for c in contexts for n in concurrency]
            rates = []
            for c in contexts:
                row: dict[str, Any] = {"context": c}
                if two_point is not None:
                    a, b = [await measure_request(http, endpoint, model, prompt_ids(c, seed), m, timeout, api_key)
                            for m in two_point]
                    row["two_point"] = {"max_tokens": list(two_point), "ok": a.ok and b.ok,
                                        "errors": [r.error for r in (a, b) if not r.ok],
                                        "tokens": [a.output_tokens, b.output_tokens], "e2e_s": [a.e2e_s, b.e2e_s]}
                    row["two_point"]["tokens_per_s"] = (
                        two_point_rate(a.output_tokens, b.output_tokens, a.e2e_s, b.e2e_s)
                        if a.ok and b.ok and b.output_tokens > a.output_tokens and b.e2e_s > a.e2e_s else None)
                if sustained is not None:
                    s = await measure_request(http, endpoint, model, prompt_ids(c, seed), sustained, timeout, api_key)
                    row["sustained"] = {"max_tokens": sustained, "ok": s.ok, "error": s.error,
                                        "tokens": s.output_tokens, "decode_s": (s.e2e_s - s.ttft_s) if s.ok else None,
                                        "ttft_s": s.ttft_s, "itl_s": s.itl_s, "chunk_tokens": s.chunk_tokens,
                                        "accept_length": s.accept_length}
                    row["sustained"]["tokens_per_s"] = (
                        sustained_rate(s.output_tokens - 1, s.e2e_s - s.ttft_s)
                        if s.ok and s.output_tokens > 1 and s.e2e_s > s.ttft_s else None)
                if len(row) > 1:
                    rates.append(row)
        return {"endpoint": endpoint, "model": model, "points": points, "rates": rates}

    return asyncio.run(main())


def summary(res: dict) -> str:
    """One line per point and per rate row."""
    def ms(s):
        return "-" if s is None else f"{1e3 * s:.1f}"

    lines = [f"{res['endpoint']} {res['model']}"]
    for p in res["points"]:
        a = p["aggregate"]
        lines.append(f"context {p['context']:>6} C {p['concurrency']:>3}: {a['completed']}/{a['requests']} ok "
                     f"({a['failed']} failed), output {a['output_tokens_per_s'] or 0:.1f} tok/s, TTFT median "
                     f"{ms(a['ttft_s']['median'])} ms, ITL median {ms(a['itl_s']['median'])} ms, TPOT median "
                     f"{ms(a['tpot_s']['median'])} ms, accepted {a['accept_length'] or '-'}")
    for r in res["rates"]:
        tp, su = r.get("two_point"), r.get("sustained")
        lines.append(f"context {r['context']:>6}: two-point {tp and tp['tokens_per_s']} tok/s, sustained "
                     f"{su and su['tokens_per_s']} tok/s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m workbench.client --endpoint URL --model NAME [--contexts ...] [--concurrency ...]
    [--max-tokens N] [--two-point A B] [--sustained N] [--timeout S] [--api-key KEY] [--json]``."""
    p = argparse.ArgumentParser(prog="python -m workbench.client", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoint", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", required=True)
    p.add_argument("--contexts", type=parse_text, nargs="+", default=[128])
    p.add_argument("--concurrency", type=parse_text, nargs="+", default=[1])
    p.add_argument("--max-tokens", type=parse_text, default=64)
    p.add_argument("--two-point", type=parse_text, nargs=2)
    p.add_argument("--sustained", type=parse_text)
    p.add_argument("--timeout", type=parse_text, default=120.0)
    p.add_argument("--api-key")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    try:
        res = sweep(a.endpoint, a.model, a.contexts, a.concurrency, a.max_tokens, a.two_point, a.sustained,
                    a.timeout, a.api_key)
    except ValueError as e:
        print(f"workbench.client: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(res, indent=1) if a.json else summary(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
