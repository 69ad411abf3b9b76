"""Tensor-parallel engine step: the full Kimi K2.6 shape over N GPUs (8 H200), greedy and DDTree.

Run on every rank (``--nproc`` GPUs, NCCL, NVLink multicast off through
:data:`workbench.parallel.groups.ENV`)::

    workbench tp --nproc 8 -m workbench.bench.engine_tp --out data/measurements/h200x8

Each rank builds its shard of ``synthetic_tp_model("kimi-k2.6", layers=61, experts=E)`` (E:
``--experts``, default all 384 when both INT4 layouts fit every GPU, else the most that do, a
multiple of the ranks), gives each request a ``--prefix`` of seeded random latent rows (no prefill)
and, for each C in ``--concurrency``, times greedy steps (their tokens become the scripted
drafter's continuation) and DDTree steps (``--block``, ``--budget``, ``ScriptedDrafter`` at each
``--p-top``; the expected accepted length of each is recorded) as CUDA-graph replays of
:class:`workbench.engine.DecodeEngine` over :class:`workbench.parallel.TensorParallelDeepseekV3`,
the all-reduces inside the graph.

Per configuration: wall ms per step (host clock around the replay and its one device-to-host copy,
rank 0; every rank's median recorded), tokens/s, mean accepted length, the per-GPU bytes floor
(this rank's weights the step touches: its attention heads, 1/N of the dense MLP, shared experts and
lm_head, the router, the distinct routed experts of the busiest rank in each layer (the per-layer
all-reduce waits for it), plus every latent KV row read: the KV is replicated) over the copy
bandwidth measured on the GPUs in the same run (the slowest rank's), the per-GPU FLOPs floor over
the bf16 matrix rate, and the all-reduce time of one step: the step's collectives (recorded from its
eager run: two all-reduces of [C x T, hidden] per layer and the argmax's int64 all-reduce) replayed
alone in one CUDA graph. ``pct_of_floor`` = (larger floor + all-reduce ms) / wall. Lossless: each
DDTree request's tokens against its greedy tokens, and every rank's tokens against rank 0's.

Writes ``engine_tp{N}.json`` (provenance of rank 0 plus every rank's GPU, the NCCL version and the
ENV values; raw samples) and prints a table last. ``--dry-run``: the tiny config on the CPU over
gloo in seconds (a test of the same code; no floors; launch it with ``--nproc 2``).
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

from workbench import MEASUREMENTS_DIR
from workbench.bench.engine import _median, _prompts, summarise, timed_steps
from workbench.config import load_config
from workbench.decode import DEFAULT, DecodeConfig
from workbench.engine import DecodeEngine, ScriptedDrafter, tiny_config
from workbench.measure import (capture_graphs, gpu_slug, measure_bf16_matmul_tflops, measure_copy_bandwidth, time_cpu,
                               time_cuda, write_measurement)
from workbench.parallel.groups import env_record, init_from_env, shutdown
from workbench.parallel.model import build_empty_tp, synthetic_tp_model
from workbench.validation import check_float, check_int

SOURCE_TOKENS_PER_S_C1 = 138.7     # the source's service, K2.6 at TP 8 on 8 x RTX PRO 6000, C = 1
CALIBRATION_ACCEPTED = 4.4         # the source's B300 calibration point
GOALS = {"ddtree_tokens_per_s_c1": 280.0, "pct_of_floor": 60.0}  # >= 2 x the source's 138.7, "(>= 280 tokens/s)"


def default_experts(cfg, group, layers: int, rows: int, capacity: int, reserve_gb: float = 16.0) -> int:
    """The most routed experts per layer (all of them at most; a multiple of the ranks and of n_group) whose INT4
    storage (one layout: an expert's bytes are the same in the packed and the fragment layout) fits each GPU beside
    this rank's other weights, a KV pool of ``rows x capacity`` tokens (replicated) and ``reserve_gb`` of work space;
    the smallest over the ranks."""
    tp, k = group.size, cfg.num_experts_per_tok
    step = tp * cfg.n_group // math.gcd(tp, cfg.n_group)
    c = cfg.replace(num_hidden_layers=layers, n_routed_experts=max(step, -(-k // step) * step))
    wb = build_empty_tp(c, group, torch.bfloat16, "meta", True).weight_bytes()  # meta: no storage
    other = sum(v for key, v in wb.items() if key != "routed_per_expert")
    per_expert = wb["routed_per_expert"]
    kv = rows * capacity * c.kv_row_width * layers * 2
    free = torch.cuda.mem_get_info(group.device)[0]
    local = int((free - other - kv - reserve_gb * 2**30) // (c.num_moe_layers * per_expert))
    e = min(cfg.n_routed_experts, local * tp)
    e -= e % step
    return min(group.all_gather_object(max(e, step)))


def rank_distinct(model, group) -> list[list[int]]:
    """Per MoE layer, the distinct routed experts each rank's slice got in the last forward: [layer][rank]."""
    out = []
    for layer in model.layers:
        if layer.is_moe:
            ids = torch.unique(layer.mlp.last_expert_ids)
            local = layer.mlp.experts.num_experts
            out.append(torch.bincount(ids // local, minlength=group.size).tolist())
    return out


def rank_pairs(model, group) -> list[list[int]]:
    """Per MoE layer, the (token, expert) pairs of each rank's experts in the last forward: [layer][rank]."""
    out = []
    for layer in model.layers:
        if layer.is_moe:
            local = layer.mlp.experts.num_experts
            out.append(torch.bincount(layer.mlp.last_expert_ids.reshape(-1) // local, minlength=group.size).tolist())
    return out


def collective_ms(group, trace: list, reps: int) -> list[float]:
    """Samples (ms) of the collectives ``trace`` recorded for one step, run alone on buffers of the same shapes:
    on CUDA captured in one graph and replayed (CUDA events), on the CPU eagerly (host clock)."""
    def one(name: str, shape, dtype):
        t = torch.zeros(shape, dtype=dtype, device=group.device)
        if name == "all_gather":
            return lambda: group.all_gather_last(t)
        op = dist.ReduceOp.MAX if name == "all_reduce_max" else dist.ReduceOp.SUM
        return lambda: dist.all_reduce(t, op=op, group=group.group)

    calls = [one(*entry) for entry in trace if entry[0] != "all_gather_object"]

    def all_of_them() -> None:
        for c in calls:
            c()

    if not calls or group.size == 1:
        return [0.0] * reps
    if group.device.type != "cuda":
        group.barrier()
        return time_cpu(all_of_them, warmup=1, reps=reps)
    [g] = capture_graphs([all_of_them])
    group.barrier()
    samples = time_cuda(g.replay, warmup=3, reps=reps)
    del g
    return samples


def time_tp_session(engine, group, C: int, prefix: int, config: DecodeConfig, drafter, max_new: int, warmup: int,
                    steps: int, run_out: bool = False) -> dict[str, Any]:
    """Warm up (the first step eager, recording the step's collectives; the second captures), time ``steps``
    steps; per step the wall ms, KV rows, accepted counts and per layer the busiest rank's distinct experts and
    pairs. Returns the raw samples (``workbench.bench.engine.summarise``'s fields), the tokens and the trace."""
    m = engine.model
    s = engine.start(_prompts(C, prefix, m.config.vocab_size), max_new, config, drafter, synthetic_prefix=True)
    group.trace = []
    s.step()
    trace, group.trace = group.trace, None
    for _ in range(max(0, warmup - 1)):
        s.step()
    rec = timed_steps(engine, s, C, steps, {
        "distinct_experts": lambda: [max(r) for r in rank_distinct(m, group)],
        "busiest_rank_pairs": lambda: [max(r) for r in rank_pairs(m, group)]})
    while run_out and not s.done:
        s.step()
    return {**rec, "profile": None, "tokens": [r.tokens for r in s.results()],
            "T": config.verify_width(m.config.vocab_size), "trace": [[n, list(sh), str(dt)] for n, sh, dt in trace],
            "_trace": trace, "paths": engine.paths(config.method, all(rec["graph"]), C * config.verify_width(m.config.vocab_size))}


def flops_per_gpu(model, raw: dict[str, Any], C: int) -> float:
    """Matrix FLOPs one GPU must do in a step (median over the steps): this rank's dense weights once per token,
    the busiest rank's routed pairs per layer, its heads' attention over the visible latent rows."""
    c, wb = model.config, model.weight_bytes()
    el = model.embed_tokens.weight.element_size()
    tokens, T = C * raw["T"], raw["T"]
    dense = (wb["attention"] + wb["dense_mlp"] + wb["shared_experts"] + wb["lm_head"]) / el
    per_pair = 2 * 3 * c.hidden_size * c.moe_intermediate_size
    heads = model.layers[0].self_attn.H
    attn = 2 * heads * (c.kv_row_width + c.kv_lora_rank) * len(model.layers) * T
    return statistics.median(2 * dense * tokens + per_pair * sum(p) + attn * kv
                             for p, kv in zip(raw["busiest_rank_pairs"], raw["kv_rows"]))


def summarise_tp(model, raw: dict[str, Any], C: int, gbps: float | None, tflops: float | None,
                 allreduce: list[float]) -> dict[str, Any]:
    """:func:`workbench.bench.engine.summarise` (tokens/s, accepted, the per-GPU bytes floor: this rank's weights
    and the busiest rank's experts) with the per-GPU FLOPs floor and the all-reduce time added:
    ``pct_of_floor`` = (max(bytes floor, FLOPs floor) + all-reduce ms) / wall."""
    out = summarise(model, raw, C, gbps, None)
    flops = flops_per_gpu(model, raw, C)
    flops_ms = flops / (tflops * 1e12) * 1e3 if tflops else None
    ar = _median(allreduce)
    floor = max(out["bytes_floor_ms"], flops_ms) if out["bytes_floor_ms"] and flops_ms else None
    out.update(flops=flops, flops_floor_ms=flops_ms, floor_ms=floor, allreduce_ms=ar,
               allreduces_per_step=len(raw["trace"]), floor_plus_allreduce_ms=None if floor is None else floor + ar,
               pct_of_floor=None if floor is None else 100 * (floor + ar) / out["wall_ms"],
               busiest_rank_pairs_median=_median([sum(p) for p in raw["busiest_rank_pairs"]]))
    return out


def goal_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The 8-GPU goals (:data:`GOALS`) with the measured values: DDTree tokens/s at C = 1 at the p_top whose expected accepted
    length is nearest the calibration point, and every graph row's percent of (floor + all-reduce)."""
    out = []
    dd1 = [r for r in rows if r["method"] == "ddtree" and r["C"] == 1]
    if dd1:
        r = min(dd1, key=lambda r: abs(r["expected_accepted"] - CALIBRATION_ACCEPTED))
        val = r["tokens_per_s"]
        out.append({"goal": "ddtree_tokens_per_s_c1", "target": GOALS["ddtree_tokens_per_s_c1"], "measured": val,
                    "p_top": r["p_top"], "expected_accepted": r["expected_accepted"],
                    "mean_accepted": r["mean_accepted"], "met": bool(val >= GOALS["ddtree_tokens_per_s_c1"])})
    for r in rows:
        val = r.get("pct_of_floor")
        out.append({"goal": f"pct_of_floor/{r['method']}/p{r.get('p_top')}/C{r['C']}", "target": GOALS["pct_of_floor"],
                    "measured": val, "met": None if val is None else bool(val >= GOALS["pct_of_floor"])})
    return out


# (header, row key, width, format): the printed table
TABLE = (("method", "method", 7, "s"), ("p", "p_top", 5, ".2f"), ("C", "C", 3, "d"), ("ms", "wall_ms", 8, ".2f"),
         ("tok/s", "tokens_per_s", 8, ".1f"), ("acc", "mean_accepted", 5, ".2f"), ("exp", "expected_accepted", 5, ".2f"),
         ("floor", "floor_ms", 7, ".2f"), ("allred", "allreduce_ms", 7, ".3f"), ("%fl", "pct_of_floor", 5, ".1f"),
         ("ar/step", "allreduces_per_step", 7, "d"))


def print_table(rows: list[dict[str, Any]], goals: list[dict[str, Any]]) -> None:
    """The rows (:data:`TABLE`'s columns; "-" where a value is missing) and the goals."""
    def cell(v, width: int, fmt: str) -> str:
        ok = isinstance(v, str) or (isinstance(v, (int, float)) and v == v)
        return format(v, f">{width}{fmt}") if ok else format("-", f">{width}")

    print(" ".join(format(h, f">{w}") for h, _, w, _ in TABLE))
    for r in rows:
        print(" ".join(cell(r.get(k), w, f) for _, k, w, f in TABLE))
    for g in goals:
        shown = g["measured"] if g["measured"] is None else round(g["measured"], 2)
        print(f"goal {g['goal']}: target {g['target']}, measured {shown}, met {g['met']}")


def run(out: str | None, group, layers: int = 61, experts: int | None = None, prefix: int = 4096,
        concurrency: tuple[int, ...] = (1, 8), p_tops: tuple[float, ...] = (0.8, 0.78),
        config: DecodeConfig = DEFAULT, steps: int = 10, warmup: int = 3, fuse: str = "eager", dry_run: bool = False
        ) -> dict[str, Any]:
    """The benchmark on this rank (module docstring); rank 0 writes ``engine_tp{N}.json`` into ``out`` (None:
    ``data/measurements/<gpu>x<N>``; ``""``: nowhere) after every configuration. Returns the results."""
    t0 = time.perf_counter()
    dev, tp = group.device, group.size
    block, budget = config.block, config.budget
    gd = config.replace(method="greedy")
    need = (warmup + steps + 2) * block + 2
    capacity = prefix + need + block + 8
    cuda = dev.type == "cuda"
    bw = measure_copy_bandwidth(2 << 30) if cuda else None
    mm = measure_bf16_matmul_tflops() if cuda else None
    ceilings = group.all_gather_object((bw and bw["gb_per_s"], mm and mm["tflops"]))
    gbps = min(c[0] for c in ceilings) if cuda else None
    tflops = min(c[1] for c in ceilings) if cuda else None
    if dry_run:
        cfg = tiny_config(n_group=1, topk_group=1)
        model = synthetic_tp_model(cfg, group, experts=experts, device=dev, dtype=torch.float32, int4=True)
    else:
        cfg = load_config("kimi-k2.6")
        if experts is None:
            experts = default_experts(cfg, group, layers, max(concurrency), capacity)
        model = synthetic_tp_model(cfg, group, layers=layers, experts=experts, device=dev, dtype=torch.bfloat16)
    build_s = time.perf_counter() - t0
    V = model.config.vocab_size
    params = {"model": "tiny" if dry_run else "kimi-k2.6", "tp": tp, "layers": len(model.layers),
              "experts": model.config.n_routed_experts, "experts_per_rank": model.config.n_routed_experts // tp,
              "prefix": prefix, "block": block, "budget": budget, "p_tops": list(p_tops),
              "concurrency": list(concurrency), "steps": steps, "warmup": warmup,
              "dtype": str(model.dtype).replace("torch.", ""), "device": str(dev), "backend": group.backend,
              "commit": gd.commit, "fuse": fuse, "dry_run": dry_run}
    ranks = group.all_gather_object({"rank": group.rank, "device": str(dev), "env": env_record(),
                                     "gpu": torch.cuda.get_device_name(dev) if cuda else None,
                                     "device_bytes": model.device_bytes()})
    extra = {"ranks": ranks, "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
             "world_size": tp}
    notes = ("Tensor parallelism: attention by heads (latent KV replicated on every rank), dense MLP and shared "
             "experts by columns/rows, routed experts by expert (other ranks' pairs computed at weight 0 on an "
             "expert this rank reads), lm_head by vocabulary (argmax reduced). wall = rank 0's host clock around one "
             "step (graph replay with its all-reduces, one device-to-host copy). Floors per GPU: this rank's weights "
             "touched plus the busiest rank's distinct experts per layer plus every latent KV row read, over the "
             "slowest rank's copy bandwidth; FLOPs likewise over the slowest bf16 matrix rate; all-reduce ms = the "
             "step's recorded collectives replayed alone in one CUDA graph. pct_of_floor = (floor + all-reduce) / "
             "wall. Prefix KV rows are seeded random values (no prefill); synthetic weights.")
    rows, raw_all, lossless = [], {}, []
    state: dict[str, Any] = {"error": None}
    where = None if out == "" else (out if out is not None else str(MEASUREMENTS_DIR / f"{gpu_slug()}x{tp}"))

    def save() -> dict[str, Any]:
        results = {"rows": rows, "goals": goal_rows(rows), "lossless": lossless, "copy_bandwidth_gbps": gbps,
                   "bf16_matmul_tflops": tflops, "ceilings_by_rank": ceilings, "error": state["error"],
                   "model_build_s": build_s, "model_device_bytes_by_rank": [r["device_bytes"] for r in ranks]}
        if group.rank == 0 and where is not None:
            samples = {k: {kk: v for kk, v in r.items() if kk not in ("tokens", "_trace")} for k, r in raw_all.items()}
            samples["copy_bandwidth"], samples["bf16_matmul"] = bw, mm
            results["_path"] = str(write_measurement(f"engine_tp{tp}", parameters=params, results=results,
                                                     samples=samples, notes=notes, out_dir=where,
                                                     extra=extra))
        return results

    def record(key, method, p, C, raw, drafter=None) -> None:
        ar = collective_ms(group, raw["_trace"], reps=max(steps, 5))
        raw["allreduce_ms"] = ar
        raw["wall_ms_by_rank"] = group.all_gather_object(_median(raw["wall_ms"]))
        raw_all[key] = raw
        row = {"method": method, "p_top": p, "path": "graph" if raw["graph"] and all(raw["graph"]) else "eager-step",
               **summarise_tp(model, raw, C, gbps, tflops, ar)}
        if drafter is not None:
            row["expected_accepted"] = drafter.expected_accepted_length(budget)
        row["wall_ms_by_rank"] = raw["wall_ms_by_rank"]
        rows.append(row)

    try:
        for C in concurrency:
            engine = DecodeEngine(model, max_requests=C, capacity=capacity, max_generated=need, fuse=fuse)
            g = time_tp_session(engine, group, C, prefix, gd, None, need, warmup, steps, run_out=True)
            record(f"greedy/C{C}", "greedy", None, C, g)
            conts = g["tokens"]
            agree = group.all_gather_object(conts)
            for p in p_tops:
                d = ScriptedDrafter(conts, V, block=block, p_top=p, seed=0, device=dev)
                dd = time_tp_session(engine, group, C, prefix, gd.replace(method="ddtree"), d, need, warmup, steps)
                record(f"ddtree/p{p}/C{C}", "ddtree", p, C, dd, d)
                every = group.all_gather_object(dd["tokens"])
                for i, (got, want) in enumerate(zip(dd["tokens"], conts)):
                    n = min(len(got), len(want))
                    first = next((k for k in range(n) if got[k] != want[k]), None)
                    lossless.append({"C": C, "p_top": p, "request": i, "compared": n, "first_divergence": first,
                                     "ranks_agree": all(e[i] == got for e in every) and all(a[i] == want for a in agree)})
                save()
            engine.drop_graphs()
            del engine
    except Exception:  # noqa: BLE001 - recorded in the measurement file, then raised again below
        state["error"] = traceback.format_exc()
        print(f"rank {group.rank}: {state['error']}", file=sys.stderr)
    results = save()
    if group.rank == 0:
        print_table(rows, results["goals"])
    if state["error"] is not None:
        raise RuntimeError("the tensor-parallel benchmark stopped early (rows so far are written); see above")
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="folder for engine_tp{N}.json (default data/measurements/<gpu>x<N>)")
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--experts", type=int, default=None, help="routed experts per layer (default: all that fit)")
    ap.add_argument("--prefix", type=int, default=None, help="default 4096 (--dry-run: 32)")
    ap.add_argument("--concurrency", default="1,8", help="comma-separated C values")
    ap.add_argument("--p-top", default="0.8,0.78", help="ScriptedDrafter p_top values (0.78: expected accepted "
                                                       "~4.4 at block 16)")
    ap.add_argument("--block", type=int, default=None, help="default 16 (--dry-run: 6)")
    ap.add_argument("--budget", type=int, default=None, help="default 32 (--dry-run: 6)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--fuse", default="eager", choices=("eager", "compile"),
                    help="the step's torch work between the kernels (workbench.engine.step_ops; compile: CUDA only)")
    ap.add_argument("--dry-run", action="store_true", help="tiny config on the CPU over gloo (a test of the code)")
    a = ap.parse_args(argv)
    prefix = check_int("prefix", a.prefix if a.prefix is not None else (32 if a.dry_run else 4096), lo=1)
    conc = tuple(check_int("concurrency", int(x), lo=1, hi=128) for x in a.concurrency.split(","))
    p_tops = tuple(check_float("p_top", float(x), lo=0.0, hi=1.0) for x in a.p_top.split(","))
    check_int("warmup", a.warmup, lo=2)  # the first step of a bucket runs eagerly, the second captures
    check_int("steps", a.steps, lo=1)
    dc = DecodeConfig(block=a.block or (6 if a.dry_run else DEFAULT.block),
                      budget=a.budget or (6 if a.dry_run else DEFAULT.budget))
    if a.dry_run:
        torch.set_num_threads(1)
    group = init_from_env("gloo" if a.dry_run else "auto")
    if not a.dry_run and group.device.type != "cuda":
        raise SystemExit("workbench.bench.engine_tp: error: no CUDA device on this rank; --dry-run runs on the CPU")
    try:
        run(a.out, group, layers=a.layers, experts=a.experts, prefix=prefix, concurrency=conc, p_tops=p_tops,
            config=dc, steps=a.steps, warmup=a.warmup, fuse=a.fuse, dry_run=a.dry_run)
    finally:
        shutdown()
    return 0


if __name__ == "__main__":
    from workbench.parallel.groups import exit_rank

    exit_rank(main())
