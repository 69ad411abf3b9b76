"""Engine step benchmark: the captured step (:class:`workbench.engine.DecodeEngine`) at full depth.

``python -m workbench.bench.engine --out DIR`` builds
``synthetic_model("kimi-k2.6", layers=61, experts=E)`` (E: ``--experts``, default the
most routed INT4 experts per layer that fit this GPU), gives every request a
``--prefix`` of seeded random latent rows (no prefill), and for each concurrency
C in ``--concurrency`` times

- greedy steps (the greedy tokens become the scripted drafter's continuation), and
- DDTree steps (block, budget, ``ScriptedDrafter`` with each ``--p-top``),

as CUDA-graph replays; at C = 1 the same step run eagerly (``graphs=False``) and
the eager reference (:func:`workbench.engine.generate`'s step functions over a
``PagedKVCache``) are timed in the same run as peers. Per configuration: wall ms
per step (host clock around the replay and its one device-to-host copy), GPU-busy
ms and kernel launches per step (the CUDA profiler's kernel and copy records over
``--profile-steps`` steps), tokens/s, mean accepted length, and the bytes floor:
weights the step touches (attention, dense MLP, router, shared experts, the
distinct routed experts its tokens chose, lm_head, embedding rows) plus the KV
rows it reads, over the device copy bandwidth measured in the same run; the
percent is floor / wall. Writes ``engine_step.json`` (with provenance and raw
samples) and prints a table last. ``--tiny`` runs a small config on the CPU in
seconds (a smoke test of the same code; no floor).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from typing import Any, Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from workbench.config import load_config
from workbench.decode import DEFAULT, DecodeConfig
from workbench.engine import DecodeEngine, ScriptedDrafter, synthetic_model, tiny_config
from workbench.engine.generate import _Timer, _ddtree_step, _greedy_step, _resolve_tree_impl
from workbench.engine.kv_cache import PagedKVCache
from workbench.engine.request import Request
from workbench.measure import busy_us, measure_bf16_matmul_tflops, measure_copy_bandwidth, write_measurement
from workbench.engine.synthetic import default_experts
from workbench.validation import check_float, check_int

GOALS = {"greedy_pct_of_floor_c1": 70.0, "ddtree_pct_of_floor_c1": 60.0, "graph_over_eager_tokens_per_s_c1": 10.0,
         "greedy_c8_over_c1_tokens_per_s": 4.0}


def _median(x) -> float:
    return float(statistics.median(x)) if len(x) else float("nan")


def floor_bytes(model, distinct: list[int], tokens: int, kv_rows: int) -> dict[str, int]:
    """Bytes a step must read at least: weights touched (``distinct`` routed experts per MoE layer)
    and ``kv_rows`` latent rows of every layer; embedding: one row per token."""
    wb = model.weight_bytes()
    el = model.embed_tokens.weight.element_size()
    parts = {k: wb[k] for k in ("attention", "dense_mlp", "router", "shared_experts", "lm_head")}
    parts["routed_experts"] = sum(distinct) * wb["routed_per_expert"]
    parts["embedding_rows"] = tokens * model.config.hidden_size * el
    parts["kv_read"] = kv_rows * model.config.kv_row_width * len(model.layers) * el
    parts["total"] = sum(parts.values())
    return parts


def attention_flops(config, layers: int, tokens_per_request: int, kv_rows: int) -> float:
    """FLOPs of absorbed-MLA attention: scores over the latent + rope row and outputs over the latent, per head,
    for ``kv_rows`` visible rows each seen by ``tokens_per_request`` tokens, over ``layers`` layers."""
    c = config
    return 2 * c.num_attention_heads * (c.kv_row_width + c.kv_lora_rank) * layers * tokens_per_request * kv_rows


def floor_flops(model, distinct_tokens: int, tokens_per_request: int, kv_rows: int) -> float:
    """Matrix FLOPs a step must do at least: every weight once per token (routed: top-k experts per token),
    and the attention scores and outputs over the visible latent rows (kv_rows committed rows, summed over the
    requests, each seen by that request's ``tokens_per_request`` tokens)."""
    c, wb = model.config, model.weight_bytes()
    el = model.embed_tokens.weight.element_size()
    dense_params = (wb["attention"] + wb["dense_mlp"] + wb["shared_experts"] + wb["lm_head"]) / el
    moe_layers = sum(l.is_moe for l in model.layers)
    routed = c.num_experts_per_tok * 3 * c.hidden_size * c.moe_intermediate_size * moe_layers
    return 2 * (dense_params + routed) * distinct_tokens + attention_flops(c, len(model.layers), tokens_per_request,
                                                                           kv_rows)


def _distinct(model) -> list[int]:
    return [int(torch.unique(l.mlp.last_expert_ids).numel()) for l in model.layers if l.is_moe]


def profile_steps(step, n: int) -> dict[str, Any]:
    """Kernel launches and GPU-busy ms per step over ``n`` calls of ``step`` (CUDA profiler records;
    busy = the union of kernel, copy and memset intervals)."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    busy = busy_us((e.time_range.start, e.time_range.end) for e in ev)
    kernels = [e for e in ev if not e.name.startswith(("Memcpy", "Memset"))]
    by: dict[str, list[float]] = {}
    for e in kernels:
        by.setdefault(e.name[:90], []).append((e.time_range.end - e.time_range.start) / 1e3)
    top = sorted(by.items(), key=lambda kv: -sum(kv[1]))[:30]
    return {"launches_per_step": len(kernels) / n, "gpu_busy_ms_per_step": busy / 1e3 / n,
            "events_recorded": len(ev),
            "top_kernels": [{"name": k, "per_step": len(v) / n, "ms_per_step": sum(v) / n} for k, v in top]}


def _prompts(C: int, prefix: int, V: int) -> list[list[int]]:
    return [[(7 * i + 3) % V] * prefix for i in range(C)]


def time_session(engine, C: int, prefix: int, config: DecodeConfig, drafter, max_new: int, warmup: int,
                 steps: int, prof: int, run_out: bool = False) -> dict[str, Any]:
    """Warm up, time ``steps`` steps, profile ``prof`` more; returns the raw samples and the tokens."""
    m = engine.model
    if m.device.type == "cuda":   # the previous sessions' freed blocks back to the driver: at 64 experts x 61 layers the
        torch.cuda.empty_cache()  # a C = 16 DDTree session met OOM with 22 GiB reserved but unallocated
    s = engine.start(_prompts(C, prefix, m.config.vocab_size), max_new, config, drafter, synthetic_prefix=True)
    for _ in range(warmup):
        s.step()
    rec = timed_steps(engine, s, C, steps, {"distinct_experts": lambda: _distinct(m)})
    prof_rec = profile_steps(s.step, prof) if (prof and m.device.type == "cuda") else None
    while run_out and not s.done:
        s.step()
    T = config.verify_width(m.config.vocab_size)
    top2 = [[st.top2 for st in r.steps if st.top2 is not None] for r in s.results()]
    return {**rec, "profile": prof_rec, "tokens": [r.tokens for r in s.results()], "T": T, "top2": top2,
            "paths": engine.paths(config.method, all(rec["graph"]), C * T)}


def timed_steps(engine, session, C: int, steps: int,
                per_step: dict[str, Callable[[], Any]]) -> dict[str, list]:
    """``steps`` steps of ``session`` (C requests): per step its wall ms (``wall_ms``), whether it replayed a graph
    (``graph``), the KV rows its requests held before it (``kv_rows``), the accepted lengths of its C rows
    (``accepted``) and, under each key of ``per_step``, what its function returns after the step."""
    out: dict[str, list] = {"wall_ms": [], "graph": [], "kv_rows": [], "accepted": [], **{k: [] for k in per_step}}
    for _ in range(steps):
        kv_rows = int(engine.cache.lengths[:C].sum())
        step = session.step()
        out["wall_ms"].append(step.ms)
        out["graph"].append(step.graph)
        out["kv_rows"].append(kv_rows)
        out["accepted"].append([int(x) for x in step.accepted[:C]])
        for k, f in per_step.items():
            out[k].append(f())
    return out


def summarise(model, raw: dict[str, Any], C: int, gbps: float | None, tflops: float | None) -> dict[str, Any]:
    """Medians, tokens/s and the floors of a :func:`time_session` record: bytes over the copy bandwidth and
    matrix FLOPs over the bf16 matrix rate, both measured in the run; ``floor_ms`` is the larger."""
    wall = _median(raw["wall_ms"])
    mean_acc = statistics.fmean(a for step in raw["accepted"] for a in step)
    toks_per_step = statistics.fmean(sum(step) for step in raw["accepted"])
    floors = [floor_bytes(model, d, C * raw["T"], kv) for d, kv in zip(raw["distinct_experts"], raw["kv_rows"])]
    nbytes = _median([f["total"] for f in floors])
    flops = _median([floor_flops(model, C * raw["T"], raw["T"], kv) for kv in raw["kv_rows"]])
    bytes_ms = nbytes / (gbps * 1e9) * 1e3 if gbps else None
    flops_ms = flops / (tflops * 1e12) * 1e3 if tflops else None
    floor_ms = max(bytes_ms, flops_ms) if bytes_ms and flops_ms else None
    out = {"C": C, "tokens_per_request_step": raw["T"], "wall_ms": wall, "tokens_per_s": toks_per_step / wall * 1e3,
           "mean_accepted": mean_acc, "bytes_floor": nbytes, "bytes_floor_ms": bytes_ms, "flops": flops,
           "flops_floor_ms": flops_ms, "floor_ms": floor_ms,
           "pct_of_floor": 100 * floor_ms / wall if floor_ms else None,
           "bytes_by_part": {k: _median([f[k] for f in floors]) for k in floors[0]},
           "distinct_experts_median": _median([sum(d) / max(len(d), 1) for d in raw["distinct_experts"]]),
           "graph_replays": sum(raw["graph"]), "paths": raw["paths"]}
    if raw["profile"]:
        out.update(raw["profile"])
        out["gpu_busy_fraction"] = out["gpu_busy_ms_per_step"] / wall
    return out


def time_generate_steps(model, prefix: int, config: DecodeConfig, drafter, cont: list[int], steps: int,
                        prof: int) -> dict[str, Any]:
    """The eager reference at C = 1: :func:`workbench.engine.generate`'s step functions over a
    ``PagedKVCache`` holding ``prefix`` seeded random rows; ``cont`` the request's greedy tokens (the first
    is the token the decode starts from)."""
    dev = model.device
    cache = PagedKVCache.for_model(model, prefix + (steps + prof + 4) * (config.budget + 2))
    cache.add_request(0)
    sl = cache.allocate(0, prefix)
    g = torch.Generator(device=dev).manual_seed(1000)
    rows = torch.randn(cache.num_layers, prefix, cache.row_width, generator=g, device=dev)
    cache.pool[:, sl] = (0.5 * rows).to(cache.pool.dtype)
    cache.append(0, sl)
    r = Request(0, [], max_new_tokens=1 << 30, row=0, tokens=[cont[0]])
    timer = _Timer(dev)
    impl = _resolve_tree_impl(config.tree_impl, dev, config.block, config.budget)

    def fail(_, e):
        raise RuntimeError(f"benchmark request failed: {e}")

    def one():
        timer.start()
        if config.method == "greedy":
            (tok, rec), = _greedy_step(model, cache, [r], timer, fail).values()
            new = [tok]
        else:
            (new, rec), = _ddtree_step(model, cache, [r], {0: ([], [])}, timer, fail, drafter, config.block, config.budget,
                                       config.commit, (), impl).values()
        r.tokens.extend(new)
        timer.finish()
        return rec.accepted_length

    one()
    wall, acc = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        a = one()
        wall.append((time.perf_counter() - t0) * 1e3)
        acc.append([a])
    prof_rec = profile_steps(one, prof) if (prof and dev.type == "cuda") else None
    return {"wall_ms": wall, "accepted": acc, "profile": prof_rec}


def run(out: str | None, layers: int = 61, experts: int | None = None, prefix: int = 4096,
        concurrency: tuple[int, ...] = (1, 2, 4, 8, 16), p_tops: tuple[float, ...] = (0.8, 0.95),
        config: DecodeConfig = DEFAULT, steps: int = 12, warmup: int = 3, prof: int = 3, eager_steps: int = 4,
        tiny: bool = False, device: str = "auto", fuses: tuple[str, ...] = ("eager",),
        baseline_concurrency: tuple[int, ...] = (1, 8)) -> dict[str, Any]:
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    t0 = time.perf_counter()
    block, budget = config.block, config.budget
    gd = config.replace(method="greedy")
    need = (warmup + steps + prof + 2) * block + 2
    capacity = prefix + need + block + 8
    bw = measure_copy_bandwidth(2 << 30) if dev.type == "cuda" else None
    mm = measure_bf16_matmul_tflops() if dev.type == "cuda" else None
    gbps, tflops = (bw["gb_per_s"] if bw else None), (mm["tflops"] if mm else None)
    if tiny:
        cfg = tiny_config(n_group=1, topk_group=1)
        model = synthetic_model(cfg, layers=None, experts=experts, seed=0, device=dev,
                                dtype=torch.bfloat16 if dev.type == "cuda" else torch.float32, int4=True)
    else:
        cfg = load_config("kimi-k2.6")
        if experts is None:
            experts = default_experts(cfg, layers, max(concurrency), capacity)
        model = synthetic_model(cfg, layers=layers, experts=experts, seed=0, device=dev, dtype=torch.bfloat16)
    build_s = time.perf_counter() - t0
    rows, raw_all, lossless = [], {}, []
    state: dict[str, Any] = {"error": None, "captures": 0}
    params = {"model": "tiny" if tiny else "kimi-k2.6", "layers": len(model.layers),
              "experts": model.config.n_routed_experts, "prefix": prefix, "block": block, "budget": budget,
              "p_tops": list(p_tops), "concurrency": list(concurrency), "steps": steps, "warmup": warmup,
              "profile_steps": prof, "eager_steps": eager_steps, "dtype": str(model.dtype).replace("torch.", ""),
              "device": str(dev), "commit": gd.commit, "fuses": list(fuses),
              "baseline_concurrency": list(baseline_concurrency)}
    notes = ("wall = host clock around one step (graph replay or eager body) and its one device-to-host copy; "
             "floor = the larger of (weights touched + KV rows read) / device copy bandwidth and the step's matrix "
             "FLOPs (weights once per token, attention over the visible rows) / bf16 matrix rate, both measured in "
             "this run; routed experts "
             "counted are the distinct ones the step's tokens chose; the drafter's logits (ScriptedDrafter's device "
             "program) are not in the floor. Prefix KV rows are seeded random values (no prefill).")

    def save() -> dict[str, Any]:
        """Write what is measured so far (called after every configuration, so a stopped run keeps its rows)."""
        goals = goal_rows(rows, p_tops[0])
        results = {"rows": rows, "goals": goals, "lossless": lossless, "copy_bandwidth_gbps": gbps,
                   "bf16_matmul_tflops": tflops,
                   "error": state["error"], "model_build_s": build_s, "captures": state["captures"],
                   "model_device_bytes": model.device_bytes(), "experts": model.config.n_routed_experts}
        results.update(_compat(rows, p_tops[0], gbps))
        if out is not None:
            samples = {k: {kk: v for kk, v in r.items() if kk != "tokens"} for k, r in raw_all.items()}
            samples["copy_bandwidth"], samples["bf16_matmul"] = bw, mm
            results["_path"] = str(write_measurement("engine_step", parameters=params, results=results,
                                                     samples=samples, notes=notes, out_dir=out))
        return results

    try:
        for i, fuse in enumerate(fuses):
            engine = DecodeEngine(model, max_requests=max(concurrency), capacity=capacity, max_generated=need,
                                  fuse=fuse)
            cs = concurrency if i == len(fuses) - 1 else tuple(c for c in concurrency if c in baseline_concurrency)
            _sweep(model, engine, rows, raw_all, lossless, gd, cs, p_tops, prefix, need, warmup, steps,
                   prof, eager_steps, capacity, (gbps, tflops), dev, peers=i == 0, save=save)
            state["captures"] += engine.captures
            del engine
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - recorded in the measurement file, then raised again below
        state["error"] = traceback.format_exc()
        print(state["error"], file=sys.stderr)
    results = save()
    print_table(rows, results["goals"])
    if state["error"] is not None:
        raise RuntimeError("the engine benchmark stopped early (rows so far are written); see the traceback above")
    return results


def _sweep(model, engine, rows, raw_all, lossless, gd, concurrency, p_tops, prefix, need, warmup, steps, prof,
           eager_steps, capacity, ceilings, dev, peers: bool, save) -> None:
    """Every (C, method) configuration as graph replays, then (``peers``) the eager peers at C = 1; rows appended
    in place, each with the engine's ``fuse`` mode."""
    V, block, budget, fz = model.config.vocab_size, gd.block, gd.budget, engine.ops.mode
    gbps, tflops = ceilings
    greedy_c1 = None
    for C in concurrency:
        g = time_session(engine, C, prefix, gd, None, need, warmup, steps, prof, run_out=True)
        raw_all[f"greedy/C{C}/graph/{fz}"] = g
        path = "graph" if engine.graphs else "eager-step"
        rows.append({"method": "greedy", "p_top": None, "path": path, "fuse": fz,
                     **summarise(model, g, C, gbps, tflops)})
        conts = g["tokens"]
        if C == 1:
            greedy_c1 = conts
        for p in p_tops:
            d = ScriptedDrafter(conts, V, block=block, p_top=p, seed=0, device=dev)
            dd = time_session(engine, C, prefix, gd.replace(method="ddtree"), d, need, warmup, steps, prof)
            raw_all[f"ddtree/p{p}/C{C}/graph/{fz}"] = dd
            rows.append({"method": "ddtree", "p_top": p, "path": path, "fuse": fz,
                         "expected_accepted": d.expected_accepted_length(budget),
                         **summarise(model, dd, C, gbps, tflops)})
            for i, (got, want) in enumerate(zip(dd["tokens"], conts)):
                n = min(len(got), len(want))
                first = next((k for k in range(n) if got[k] != want[k]), None)
                rec = {"C": C, "p_top": p, "fuse": fz, "request": i, "compared": n, "first_divergence": first}
                if first is not None and 1 <= first <= len(g["top2"][i]):
                    rec["greedy_top2_logits_there"] = g["top2"][i][first - 1]  # greedy step first-1 made it
                lossless.append(rec)
            save()
        engine.drop_graphs()
    if not engine.graphs or greedy_c1 is None or not peers:
        return
    # peers at C = 1: the same step run eagerly, and generate()'s eager step functions
    eager = DecodeEngine(model, max_requests=1, capacity=capacity, max_generated=need, graphs=False)
    d = ScriptedDrafter(greedy_c1, V, block=block, p_top=p_tops[0], seed=0, device=dev)
    for cfg_, dr in ((gd, None), (gd.replace(method="ddtree"), d)):
        e = time_session(eager, 1, prefix, cfg_, dr, need, 1, eager_steps, 1)
        raw_all[f"{cfg_.method}/C1/eager-step"] = e
        rows.append({"method": cfg_.method, "p_top": None if dr is None else p_tops[0], "path": "eager-step",
                     "fuse": "eager", **summarise(model, e, 1, gbps, tflops)})
        save()
    del eager
    for cfg_, dr in ((gd, None), (gd.replace(method="ddtree"), d)):
        e = time_generate_steps(model, prefix, cfg_, dr, greedy_c1[0], eager_steps, 1)
        raw_all[f"{cfg_.method}/C1/generate"] = e
        wall = _median(e["wall_ms"])
        acc = statistics.fmean(a for s in e["accepted"] for a in s)
        rows.append({"method": cfg_.method, "p_top": None if dr is None else p_tops[0], "path": "generate",
                     "fuse": "-", "C": 1, "wall_ms": wall, "tokens_per_s": acc / wall * 1e3, "mean_accepted": acc,
                     **(e["profile"] or {})})
        save()


def goal_rows(rows: list[dict[str, Any]], p: float) -> list[dict[str, Any]]:
    """The issue's goals at C = 1 (and C = 8 for scaling), each with the measured value."""
    def row(method, C, path, p_top=None):
        """The fastest row of that configuration (over the fuse modes measured)."""
        got = [r for r in rows if r["method"] == method and r["C"] == C and r["path"] == path
               and (p_top is None or r.get("p_top") == p_top)]
        return min(got, key=lambda r: r["wall_ms"]) if got else None

    out = []
    g1, d1 = row("greedy", 1, "graph"), row("ddtree", 1, "graph", p)
    gen = row("greedy", 1, "generate")
    g8 = row("greedy", 8, "graph")
    for name, val in (("greedy_pct_of_floor_c1", g1 and g1["pct_of_floor"]),
                      ("ddtree_pct_of_floor_c1", d1 and d1["pct_of_floor"]),
                      ("graph_over_eager_tokens_per_s_c1", g1 and gen and g1["tokens_per_s"] / gen["tokens_per_s"]),
                      ("greedy_c8_over_c1_tokens_per_s", g1 and g8 and g8["tokens_per_s"] / g1["tokens_per_s"])):
        out.append({"goal": name, "target": GOALS[name], "measured": val,
                    "met": None if val is None else bool(val >= GOALS[name])})
    return out


def _compat(rows, p: float, gbps) -> dict[str, Any]:
    """``results.greedy`` / ``results.ddtree`` at C = 1 (graph) in the fields earlier readers use."""
    out = {}
    for method in ("greedy", "ddtree"):
        got = [r for r in rows if r["method"] == method and r["C"] == 1 and r["path"] in ("graph", "eager-step")
               and r.get("p_top") in (None, p)]
        r = min(got, key=lambda r: r["wall_ms"]) if got else None
        if r:
            parts = {k: v for k, v in r["bytes_by_part"].items() if k != "total"}
            out[method] = {"median_ms": {"total": r["wall_ms"]}, "bytes_by_part": parts,
                           "pct_of_floor": r["pct_of_floor"], "floor_ms": r["floor_ms"],
                           "ms_per_token": r["wall_ms"] / r["mean_accepted"],
                           "mean_accepted_length": r["mean_accepted"], "tree_size": r["tokens_per_request_step"]}
    return out


def print_table(rows: list[dict[str, Any]], goals: list[dict[str, Any]]) -> None:
    def f(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) and v == v else "-"

    print(f"{'method':7s} {'p':>5s} {'path':10s} {'fuse':7s} {'C':>3s} {'ms':>8s} {'busy':>7s} {'launch':>7s} "
          f"{'tok/s':>8s} {'acc':>5s} {'floor':>7s} {'%fl':>5s}")
    for r in rows:
        print(f"{r['method']:7s} {f(r.get('p_top'), '5.2f'):>5s} {r['path']:10s} {r.get('fuse', '-'):7s} {r['C']:3d} "
              f"{f(r['wall_ms'], '8.2f')} {f(r.get('gpu_busy_ms_per_step'), '7.2f')} "
              f"{f(r.get('launches_per_step'), '7.0f')} "
              f"{f(r['tokens_per_s'], '8.1f')} {f(r.get('mean_accepted'), '5.2f')} {f(r.get('floor_ms'), '7.2f')} "
              f"{f(r.get('pct_of_floor'), '5.1f')}")
    for g in goals:
        print(f"goal {g['goal']}: target {g['target']}, measured {f(g['measured'], '.2f')}, met {g['met']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="folder for engine_step.json (default: do not write)")
    ap.add_argument("--layers", type=int, default=None, help="default 61 (--tiny: the tiny config's 3)")
    ap.add_argument("--experts", type=int, default=None, help="routed experts per layer (default: the most that fit)")
    ap.add_argument("--prefix", type=int, default=None, help="default 4096 (--tiny: 32)")
    ap.add_argument("--concurrency", default=None, help="comma-separated C values (default 1,2,4,8,16; --tiny 1,2)")
    ap.add_argument("--p-top", default="0.8,0.95")
    ap.add_argument("--block", type=int, default=None, help="default DecodeConfig's (--tiny: 8)")
    ap.add_argument("--budget", type=int, default=None, help="default DecodeConfig's (--tiny: 8)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--eager-steps", type=int, default=4)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--fuse", default="eager", help="comma-separated step_ops modes (eager, compile): the last "
                                                   "runs every C, the others only --baseline-concurrency; the "
                                                   "eager peers run with the first")
    ap.add_argument("--baseline-concurrency", default="1,8")
    ap.add_argument("--tiny", action="store_true", help="small config on the CPU in seconds (smoke test)")
    a = ap.parse_args(argv)
    layers = a.layers if a.layers is not None else (None if a.tiny else 61)
    prefix = check_int("prefix", a.prefix if a.prefix is not None else (32 if a.tiny else 4096), lo=1)
    conc = tuple(check_int("concurrency", int(x), lo=1, hi=128) for x in
                 (a.concurrency or ("1,2" if a.tiny else "1,2,4,8,16")).split(","))
    p_tops = tuple(check_float("p_top", float(x), lo=0.0, hi=1.0) for x in a.p_top.split(","))
    check_int("warmup", a.warmup, lo=2)  # the first step of a bucket runs eagerly, the second captures
    dc = DecodeConfig(block=a.block or (8 if a.tiny else DEFAULT.block),
                      budget=a.budget or (8 if a.tiny else DEFAULT.budget))
    if a.tiny:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a smoke test on a shared CPU: one thread is the fastest here
        try:
            run(a.out, layers=None, experts=a.experts, prefix=prefix, concurrency=conc, p_tops=p_tops,
                config=dc, steps=min(a.steps, 3), warmup=2, prof=0, eager_steps=2, tiny=True,
                device="cpu" if a.device == "auto" else a.device)
        finally:
            torch.set_num_threads(threads)
    else:
        run(a.out, layers=layers, experts=a.experts, prefix=prefix, concurrency=conc, p_tops=p_tops, config=dc,
            steps=a.steps, warmup=a.warmup, prof=a.profile_steps, eager_steps=a.eager_steps,
            device=a.device, fuses=tuple(a.fuse.split(",")),
            baseline_concurrency=tuple(int(x) for x in a.baseline_concurrency.split(",")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
