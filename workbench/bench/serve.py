"""Serving benchmark (its H200 goals: :data:`GOALS`): ``python -m workbench.bench.serve --out DIR [--tiny]``.

One process builds the engine-step issue's model (:mod:`workbench.bench.engine`: synthetic K2.6 shape, 61 layers,
the most routed INT4 experts that fit; ``--tiny``: the tiny config on the CPU, a dry run of the same code), and per
method (greedy; DDTree with a ``ScriptedDrafter`` of ``--p-top``):

1. the engine's own step: a :class:`~workbench.engine.decode_engine.Session` of C rows over a ``--prompt``-token synthetic
   prefix (no prefill), wall ms per step (median) and tokens per step, at each C of ``--concurrency``;
2. the server on the same engine: :func:`workbench.serve.app.create_app` over a scheduler with that method,
   uvicorn on a free loopback port in a thread of this process; the measuring client
   (:func:`workbench.client.measure_request`) streams ``--prompt``-token prompts (really prefilled, in
   ``--prefill-chunk`` chunks) for ``--max-tokens`` tokens: at C = 1 the median inter-token latency against the
   engine's C = 1 step (goal: within 10%); at C = 8 (the largest C) the aggregate output tokens/s while all C
   requests decode (token events inside the window from the last first token to the first last token) against
   the engine's C-row step (tokens per step / step time; goal: within 15%). The DDTree server's tokens are
   compared with the greedy server's (lossless). DDTree's drafter is scripted on the greedy continuation of each
   prompt (the synthetic model's permutation head makes it the prompt's last token's orbit).
3. head-of-line (:func:`workbench.serve.headofline.head_of_line_sweep`, greedy): the ITL of ``--hol-running``
   decoding requests while a ``--hol-context``-token prompt is admitted whole and chunked (``--hol-chunks``).

Writes ``serving.json`` (provenance with ``WORKBENCH_COMMIT`` honoured, parameters, results, raw samples) after
every part, so a stopped run keeps what it measured; prints a table last. Times ms, rates tokens/s.
"""
from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import threading
import time
import traceback
from typing import Any

import httpx
import torch
import uvicorn

from workbench.bench.engine import time_session
from workbench.client import measure_request
from workbench.config import load_config
from workbench.decode import DEFAULT, DecodeConfig
from workbench.engine import DecodeEngine, ScriptedDrafter, synthetic_model, tiny_config
from workbench.engine.batch import Batch
from workbench.measure import prompts_for, write_measurement
from workbench.serve.app import create_app
from workbench.serve.headofline import head_of_line_sweep
from workbench.serve.scheduler import Scheduler
from workbench.serve.tokenizer import TextCodec
from workbench.engine.synthetic import default_experts
from workbench.validation import InvalidParameter, check_float, check_int

GOALS = {"itl_c1_within": 0.10, "aggregate_c8_within": 0.15}  # relative distance from the engine's step


def build(tiny: bool, layers: int, experts: int | None, rows: int, kv_slots: int, device: str):
    """The benchmark model (bench.engine's recipe) on ``device``."""
    dev = torch.device(device)
    if tiny:
        cfg = tiny_config(n_group=1, topk_group=1)
        return synthetic_model(cfg, layers=None, experts=experts, seed=0, device=dev,
                               dtype=torch.bfloat16 if dev.type == "cuda" else torch.float32, int4=True)

    cfg = load_config("kimi-k2.6")
    if experts is None:
        experts = default_experts(cfg, layers, rows, kv_slots // rows)
    return synthetic_model(cfg, layers=layers, experts=experts, seed=0, device=dev, dtype=torch.bfloat16)


def prompts(n: int, length: int, vocab: int) -> list[list[int]]:
    """``n`` seeded prompts of ``length`` tokens, each ending in a different token (so the rows differ)."""
    out = prompts_for(length, n, vocab, seed=7)
    for i, p in enumerate(out):
        p[-1] = (7 * i + 3) % vocab
    return out


def engine_step(engine, C: int, prompt: int, config: DecodeConfig, drafter, steps: int, warmup: int,
                max_new: int) -> dict[str, Any]:
    """The engine's own step at C rows over a ``prompt``-token synthetic prefix: median wall ms, tokens per step
    (all rows) and per row, and each row's tokens (the first is the prompt's last token)."""
    raw = time_session(engine, C, prompt, config, drafter, max_new, warmup, steps, 0, run_out=drafter is None)
    wall = statistics.median(raw["wall_ms"])
    per_step = statistics.fmean(sum(a) for a in raw["accepted"])
    return {"C": C, "method": config.method, "wall_ms": wall, "tokens_per_step": per_step,
            "mean_accepted": statistics.fmean(x for a in raw["accepted"] for x in a),
            "tokens_per_s": per_step / wall * 1e3, "samples_ms": raw["wall_ms"], "tokens": raw["tokens"]}


class _ByRequest:
    """A ScriptedDrafter's ``continuations`` looked up by the Batch's request id through the prompt it admitted
    (the server assigns ids in admission order, which concurrent requests do not fix)."""

    def __init__(self, batch, by_last_token: dict[int, list[int]]):
        self.batch, self.cont, self.prompt_of = batch, by_last_token, {}
        add = batch.add

        def add_and_note(prompt, max_new_tokens, **options):
            r = add(prompt, max_new_tokens, **options)
            self.prompt_of[r.id] = r.prompt
            return r
        batch.add = add_and_note

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, request: int) -> list[int]:
        p = self.prompt_of.get(request)
        return self.cont.get(p[-1], []) if p else []


class Server:
    """The app over ``batch`` on a free loopback port, uvicorn in a thread of this process."""

    def __init__(self, batch, name: str, codec=None):
        self.scheduler = Scheduler(batch)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # the model's whole vocabulary behind the server (the byte codec's 256 ids would refuse most prompt ids)
        codec = codec or TextCodec.numbered(batch.runner.model.config.vocab_size)
        app = create_app(self.scheduler, codec, name)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        t0 = time.time()
        while not self.server.started:
            if time.time() - t0 > 60 or not self.thread.is_alive():
                raise RuntimeError("the benchmark server did not start")
            time.sleep(0.05)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def client_round(url: str, name: str, batch_prompts: list[list[int]], max_tokens: int, timeout: float):
    """Send every prompt at once (streamed) and return the measuring client's results."""
    async def main():
        async with httpx.AsyncClient(timeout=httpx.Timeout(timeout),
                                     limits=httpx.Limits(max_connections=len(batch_prompts) + 4)) as http:
            return await asyncio.gather(*(measure_request(http, url, name, p, max_tokens, timeout)
                                          for p in batch_prompts))

    return asyncio.run(main())


def steady_aggregate(results) -> dict[str, Any]:
    """Output tokens/s while every request decodes: token events after each request's first, arriving inside
    [the last first-token time, the first last-token time]; None when that window is empty."""
    arrivals = []
    for r in results:
        t = r.sent_s + r.ttft_s
        times = [t]
        for g in r.itl_s:
            t += g
            times.append(t)
        arrivals.append(list(zip(times, r.chunk_tokens)))
    lo = max(a[0][0] for a in arrivals)
    hi = min(a[-1][0] for a in arrivals)
    toks = sum(n for a in arrivals for t, n in a[1:] if lo < t <= hi)
    if not hi > lo or not toks:
        return {"window_ms": max(0.0, (hi - lo) * 1e3), "tokens": toks, "tokens_per_s": None}
    return {"window_ms": (hi - lo) * 1e3, "tokens": toks, "tokens_per_s": toks / (hi - lo)}


def serve_round(srv: Server, name: str, ps: list[list[int]], max_tokens: int, timeout: float) -> dict[str, Any]:
    rs = client_round(srv.url, name, ps, max_tokens, timeout)
    bad = [r.error for r in rs if not r.ok]
    if bad:
        raise RuntimeError(f"{len(bad)} of {len(rs)} benchmark requests failed: {bad[0]}")
    itl = [1e3 * g for r in rs for g in r.itl_s]
    return {"C": len(ps), "itl_ms_median": statistics.median(itl), "itl_ms_mean": statistics.fmean(itl),
            "ttft_ms_median": statistics.median(1e3 * r.ttft_s for r in rs),
            "accept_length": statistics.fmean(r.accept_length for r in rs) if all(
                r.accept_length is not None for r in rs) else None,
            "steady": steady_aggregate(rs), "output_tokens": sum(r.output_tokens for r in rs),
            "samples": [r.as_dict() for r in rs]}


def run(out: str | None, tiny: bool = False, layers: int = 61, experts: int | None = None, prompt: int = 4096,
        max_tokens: int = 128, concurrency: tuple[int, ...] = (1, 8), p_top: float = 0.8,
        config: DecodeConfig = DEFAULT, prefill_chunk: int | None = 1024, steps: int = 20, warmup: int = 3,
        repeats: int = 3,
        hol_context: int = 8192, hol_running: int = 4, hol_chunks: tuple[int | None, ...] = (None, 1024),
        device: str = "auto", fuse: str = "eager", timeout: float = 300.0) -> dict[str, Any]:
    dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    for n, v in (("prompt", prompt), ("max_tokens", max_tokens), ("steps", steps), ("repeats", repeats),
                 ("hol_context", hol_context), ("hol_running", hol_running)):
        check_int(n, v, lo=1)
    check_int("warmup", warmup, lo=2)  # the first step of a bucket runs eagerly, the second captures
    block, budget = config.block, config.budget
    rows = max(max(concurrency), hol_running + 1)
    T = budget + 1
    per = prompt + max_tokens + T + block + 8
    need = warmup + steps + 2 + max_tokens + block
    capacity = max(prompt + need + block + 8, hol_context + max_tokens + T + block + 8)
    kv_slots = max(rows * (per + need), hol_running * per + hol_context + max_tokens + T + 64)
    t0 = time.perf_counter()
    model = build(tiny, layers, experts, rows, kv_slots, dev)
    build_s = time.perf_counter() - t0
    name = "synthetic-tiny" if tiny else f"synthetic-kimi-k2.6-{len(model.layers)}L"
    params = {"model": "tiny" if tiny else "kimi-k2.6", "layers": len(model.layers),
              "experts": model.config.n_routed_experts, "prompt": prompt, "max_tokens": max_tokens,
              "concurrency": list(concurrency), "p_top": p_top, "block": block, "budget": budget,
              "prefill_chunk": prefill_chunk, "steps": steps, "warmup": warmup, "repeats": repeats,
              "hol_context": hol_context, "hol_running": hol_running, "hol_chunks": list(hol_chunks),
              "device": dev, "fuse": fuse, "kv_slots": kv_slots, "capacity": capacity,
              "dtype": str(model.dtype).replace("torch.", "")}
    notes = ("Engine step: a Session over a synthetic prefix (seeded random latent rows, no prefill), host clock "
             "around each step and its one device-to-host copy. Server: uvicorn and the scheduler thread in this "
             "process, the client too (asyncio; its parsing shares the interpreter with the server). C = 1: median "
             "gap between token events (one event per engine step) against the engine's C = 1 step; largest C: "
             "tokens arriving while every request decodes (window from the last first token to the first last "
             "token) against the engine's tokens per step / step time. " + ("CPU dry run: not H200 data."
                                                                           if dev == "cpu" else ""))
    res: dict[str, Any] = {"engine": [], "server": [], "goals": [], "lossless": [], "head_of_line": [],
                           "model_build_s": build_s, "error": None}
    samples: dict[str, Any] = {}

    def save():
        if out is not None:
            res["_path"] = str(write_measurement("serving", parameters=params, results=res, samples=samples,
                                                 notes=notes, out_dir=out))

    engine = DecodeEngine(model, max_requests=rows, capacity=capacity, kv_slots=kv_slots,
                          max_generated=need + max_tokens, fuse=fuse)
    V = model.config.vocab_size
    ps = prompts(max(concurrency), prompt, V)
    gd = config.replace(method="greedy")
    served: dict[str, dict[int, list[int]]] = {}
    try:
        # greedy first: its engine tokens script the DDTree drafter (continuation after each prompt's last token)
        conts: dict[int, list[int]] = {}
        for method in ("greedy", "ddtree"):
            cfg = gd if method == "greedy" else gd.replace(method="ddtree")
            for C in concurrency:
                drafter = None
                if method == "ddtree":
                    drafter = ScriptedDrafter([[p[-1]] + conts[p[-1]] for p in ps[:C]], V, block=block,
                                              p_top=p_top, seed=0, device=model.device)
                e = engine_step(engine, C, prompt, cfg, drafter, steps, warmup, need)
                if method == "greedy":
                    for p, toks in zip(ps, e["tokens"]):
                        conts.setdefault(p[-1], toks[1:])
                samples[f"engine/{method}/C{C}"] = {"wall_ms": e.pop("samples_ms")}
                e.pop("tokens")
                res["engine"].append(e)
                save()
            engine.drop_graphs()
            drafter = None
            if method == "ddtree":
                drafter = ScriptedDrafter([[0]], V, block=block, p_top=p_top, seed=0, device=model.device)
            batch = Batch(engine, cfg, drafter, prefill_chunk=prefill_chunk)
            if drafter is not None:
                drafter.continuations = _ByRequest(batch, conts)
            srv = Server(batch, name)
            try:
                serve_round(srv, name, ps[:max(concurrency)], 4, timeout)  # warm-up: prefill path, every bucket
                for C in concurrency:
                    for k in range(repeats if C == 1 else 1):
                        r = serve_round(srv, name, [ps[k % len(ps)]] if C == 1 else ps[:C], max_tokens, timeout)
                        got = r.pop("samples")
                        samples[f"server/{method}/C{C}/{k}"] = got
                        for q, p in zip(got, [ps[k % len(ps)]] if C == 1 else ps[:C]):
                            served.setdefault(method, {})[(C, p[-1])] = q["token_ids"]
                        res["server"].append({"method": method, "repeat": k, **r})
                        save()
            finally:
                srv.close()
        res["lossless"] = [{"C": C, "last_token": t, "equal": ids == served["greedy"].get((C, t)),
                            "tokens": len(ids)} for (C, t), ids in served.get("ddtree", {}).items()]
        res["goals"] = goals(res)
        save()
        engine.drop_graphs()
        hol = head_of_line_sweep(engine, hol_context, hol_running, 64, hol_chunks, gd, warm=3, after=3)
        res["head_of_line"] = hol
    except Exception:  # noqa: BLE001 - recorded in the measurement file, then raised again below
        res["error"] = traceback.format_exc()
        print(res["error"], file=sys.stderr)
    res["goals"] = goals(res)
    res["wall_s"] = time.perf_counter() - t0
    save()
    print_table(res)
    if res["error"] is not None:
        raise RuntimeError("the serving benchmark stopped early (what it measured is written); see above")
    return res


def goals(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The serving goals (:data:`GOALS`) per method: the server's C = 1 median ITL against the engine's C = 1 step (relative
    distance <= 10%), and the steady aggregate tokens/s at the largest C against the engine's C-row step (<= 15%)."""
    out = []
    for method in ("greedy", "ddtree"):
        eng = {e["C"]: e for e in res["engine"] if e["method"] == method}
        srv = [s for s in res["server"] if s["method"] == method]
        one = [s["itl_ms_median"] for s in srv if s["C"] == 1]
        if one and 1 in eng:
            itl = statistics.median(one)
            d = itl / eng[1]["wall_ms"] - 1
            out.append({"goal": f"{method}: C=1 ITL vs engine step", "server": itl, "engine": eng[1]["wall_ms"],
                        "unit": "ms", "relative": d, "target": GOALS["itl_c1_within"],
                        "met": bool(abs(d) <= GOALS["itl_c1_within"])})
        big = max((s["C"] for s in srv if s["C"] > 1), default=None)
        if big is not None and big in eng:
            s = next(s for s in srv if s["C"] == big)
            got = s["steady"]["tokens_per_s"]
            d = None if got is None else got / eng[big]["tokens_per_s"] - 1
            out.append({"goal": f"{method}: C={big} aggregate vs engine batched step", "server": got,
                        "engine": eng[big]["tokens_per_s"], "unit": "tokens/s", "relative": d,
                        "target": GOALS["aggregate_c8_within"],
                        "met": None if d is None else bool(abs(d) <= GOALS["aggregate_c8_within"])})
    return out


def print_table(res: dict[str, Any]) -> None:
    def f(v, fmt=".2f"):
        return format(v, fmt) if isinstance(v, (int, float)) and v == v else "-"

    for e in res["engine"]:
        print(f"engine {e['method']:6s} C={e['C']:<2d} step {f(e['wall_ms'])} ms, {f(e['tokens_per_step'])} tok/step, "
              f"{f(e['tokens_per_s'], '.1f')} tok/s")
    for s in res["server"]:
        print(f"server {s['method']:6s} C={s['C']:<2d} ITL median {f(s['itl_ms_median'])} ms, TTFT median "
              f"{f(s['ttft_ms_median'], '.1f')} ms, steady {f(s['steady']['tokens_per_s'], '.1f')} tok/s, "
              f"accepted {f(s['accept_length'])}")
    for h in res["head_of_line"]:
        print(f"head-of-line chunk {h['chunk']}: baseline ITL {f(h['baseline_itl_ms'])} ms, max {f(h['max_itl_ms'])} "
              f"ms over {h['boundaries']} boundaries, stall {f(h['stall_ms'], '.1f')} ms, long TTFT "
              f"{f(h['long_ttft_ms'], '.1f')} ms")
    for g in res["goals"]:
        print(f"goal {g['goal']}: server {f(g['server'])} vs engine {f(g['engine'])} {g['unit']} "
              f"({f(100 * g['relative'] if g['relative'] is not None else None, '+.1f')}%), target within "
              f"{100 * g['target']:.0f}%: met {g['met']}")
    bad = [x for x in res["lossless"] if not x["equal"]]
    print(f"lossless: {len(res['lossless']) - len(bad)} of {len(res['lossless'])} DDTree outputs equal greedy's")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.bench.serve", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="folder for serving.json (default: do not write)")
    ap.add_argument("--tiny", action="store_true", help="tiny config on the CPU: a dry run of the same code")
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--experts", type=int, default=None, help="routed experts per layer (default: the most that fit)")
    ap.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 4096; --tiny 24)")
    ap.add_argument("--max-tokens", type=int, default=None, help="tokens per measured request (default 128; --tiny 12)")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--p-top", type=float, default=0.8)
    ap.add_argument("--block", type=int, default=None, help="default 16 (--tiny 4)")
    ap.add_argument("--budget", type=int, default=None, help="default 32 (--tiny 6)")
    ap.add_argument("--prefill-chunk", default=None, help="prompt tokens per prefill forward, or 'none' "
                                                          "(default 1024; --tiny 8)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3, help="C = 1 requests measured")
    ap.add_argument("--hol-context", type=int, default=None, help="the long prompt (default 8192; --tiny 48)")
    ap.add_argument("--hol-running", type=int, default=4, help="requests decoding while it is admitted")
    ap.add_argument("--hol-chunks", default=None, help="comma-separated chunk sizes, 'none' = whole "
                                                       "(default none,1024; --tiny none,16)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--fuse", default="eager", help="step_ops mode: eager or compile (CUDA)")
    ap.add_argument("--timeout", type=float, default=300.0)
    a = ap.parse_args(argv)

    def chunk(x: str):
        return None if x.lower() == "none" else int(x)

    t = a.tiny
    try:
        check_float("p_top", a.p_top, lo=0.0, hi=1.0)
        kw = dict(tiny=t, layers=a.layers, experts=a.experts, prompt=a.prompt or (24 if t else 4096),
                  max_tokens=a.max_tokens or (12 if t else 128),
                  concurrency=tuple(int(x) for x in a.concurrency.split(",")), p_top=a.p_top,
                  config=DecodeConfig(block=a.block or (4 if t else DEFAULT.block),
                                      budget=a.budget or (6 if t else DEFAULT.budget)),
                  prefill_chunk=chunk(a.prefill_chunk or ("8" if t else "1024")), steps=min(a.steps, 4) if t else a.steps,
                  warmup=a.warmup, repeats=a.repeats, hol_context=a.hol_context or (48 if t else 8192),
                  hol_running=a.hol_running if not t else min(a.hol_running, 2),
                  hol_chunks=tuple(chunk(x) for x in (a.hol_chunks or ("none,16" if t else "none,1024")).split(",")),
                  device=("cpu" if t and a.device == "auto" else a.device), fuse=a.fuse, timeout=a.timeout)
    except (ValueError, InvalidParameter) as e:
        print(f"python -m workbench.bench.serve: error: {e}", file=sys.stderr)
        return 2
    threads = torch.get_num_threads()
    if t:
        torch.set_num_threads(1)  # a dry run on a shared CPU: one thread is the fastest here
    try:
        run(a.out, **kw)
    finally:
        torch.set_num_threads(threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
