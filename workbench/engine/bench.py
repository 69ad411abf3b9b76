"""Engine step benchmark: greedy and DDTree steps of a K2.6-shaped slice at batch 1.

``python -m workbench.engine.bench --out DIR`` builds :func:`synthetic_model`
("kimi-k2.6", default 4 layers: one dense, three MoE with all 384 INT4
experts, full vocabulary), fills the paged KV cache with ``--prefix`` random
latent rows (no prefill needed), then times

- greedy decode steps (one token), and
- DDTree steps (ScriptedDrafter over the greedy continuation just produced,
  ``--block``/``--budget``), checking that the DDTree tokens equal the greedy
  ones (lossless),

each with the breakdown draft / tree_build / verify / accept / commit (CUDA
events), next to the floor: bytes of the weights the step touches (attention,
dense MLP, router, shared experts, the distinct routed experts the step's
tokens chose, lm_head, embedding rows) plus the KV rows read, over the copy
bandwidth measured in the same run. Writes ``engine_step.json`` through
:func:`workbench.measure.write_measurement` and prints a short table last.
``--tiny`` runs a small config on the CPU (a smoke test of the same code).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from typing import Any

import torch

from workbench.engine.drafters import ScriptedDrafter
from workbench.engine.generate import PHASES, _ddtree_step, _greedy_step, _Req, _resolve_tree_impl, _Timer
from workbench.engine.kv_cache import PagedKVCache
from workbench.engine.synthetic import synthetic_model, tiny_config


def _median(x):
    return float(statistics.median(x)) if x else float("nan")


def step_bytes(model, tokens_in_step: int, kv_rows_read: int) -> dict[str, int]:
    """Bytes a step must read at least: weights touched (routed experts as chosen in the last
    forward) plus the KV rows read. Embedding: one row per token."""
    wb = model.weight_bytes()
    routed = 0
    distinct = []
    for layer in model.layers:
        if layer.is_moe and layer.mlp.last_expert_ids is not None:
            d = int(torch.unique(layer.mlp.last_expert_ids).numel())
            distinct.append(d)
            routed += d * wb["routed_per_expert"]
    row = model.config.hidden_size * model.embed_tokens.weight.element_size()
    kv = kv_rows_read * model.config.kv_row_width * len(model.layers) * model.embed_tokens.weight.element_size()
    parts = {"attention": wb["attention"], "dense_mlp": wb["dense_mlp"], "router": wb["router"],
             "shared_experts": wb["shared_experts"], "routed_experts": routed, "lm_head": wb["lm_head"],
             "embedding_rows": tokens_in_step * row, "kv_read": kv}
    parts["total"] = sum(parts.values())
    parts["distinct_experts_per_moe_layer"] = distinct
    return parts


def _time_dflash(model, block: int, dev: torch.device, reps: int = 10) -> dict[str, Any]:
    """Draft time of a DFlash-style drafter at the model's hidden size (random weights): 2 layers,
    heads x head_dim = 32 x 128, intermediate 4 x hidden... sized like published block drafters."""
    from workbench.engine.drafters import DFlashConfig, DFlashDrafter, DraftInput

    D = model.config.hidden_size
    layers = tuple(sorted({0, len(model.layers) // 2, len(model.layers) - 1}))
    cfg = DFlashConfig(hidden_size=D, num_layers=2, num_heads=32 if D >= 4096 else 2,
                       head_dim=128 if D >= 4096 else 16, intermediate_size=min(4 * D, 18432), block=block,
                       target_layers=layers, mask_token_id=0, context_window=64)
    d = DFlashDrafter.random(cfg, model, seed=5)
    W = cfg.context_window
    inp = DraftInput(torch.tensor([1], device=dev), torch.tensor([4096], device=dev), [0], [1],
                     [torch.randn(W, len(layers) * D, device=dev, dtype=model.dtype)],
                     [torch.arange(4096 - W, 4096, device=dev)])
    timer = _Timer(dev)
    samples = []
    for i in range(reps + 2):
        timer.start()
        d.draft(inp)
        timer.mark("draft")
        if i >= 2:
            samples.append(timer.finish()["draft"])
    nbytes = sum(p.numel() * p.element_size() for p in d.parameters())
    del d
    return {"config": dataclasses.asdict(cfg), "median_ms": _median(samples), "samples_ms": samples,
            "own_weight_bytes": nbytes}


def _profile(out: str, greedy_run, ddtree_run, dev: torch.device) -> None:
    """torch.profiler over 3 greedy and 3 DDTree steps; op tables to <out>/engine_profile.txt."""
    from pathlib import Path

    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    lines = []
    for name, fn in (("greedy", greedy_run), ("ddtree", ddtree_run)):
        with profile(activities=acts) as prof:
            fn(3) if name == "ddtree" else fn(3, False)
        ka = prof.key_averages()
        key = "self_device_time_total" if dev.type == "cuda" else "self_cpu_time_total"
        lines.append(f"== {name}: 3 steps, by {key}\n" + ka.table(sort_by=key, row_limit=25, max_name_column_width=60))
        lines.append(f"== {name}: 3 steps, by cpu_time_total\n" + ka.table(sort_by="cpu_time_total", row_limit=25,
                                                                          max_name_column_width=60))
    Path(out, "engine_profile.txt").write_text("\n".join(lines))


def _fill_prefix(cache: PagedKVCache, rid, n: int, seed: int) -> None:
    cache.add_request(rid)
    s = cache.allocate(rid, n)
    g = torch.Generator(device=cache.device).manual_seed(seed)
    for layer in range(cache.num_layers):
        rows = torch.randn(n, cache.row_width, generator=g, device=cache.device) * 0.5
        cache.write(layer, s, rows)
    cache.append(rid, s)


def run(out: str | None, layers: int = 4, experts: int | None = None, prefix: int = 4096, block: int = 16,
        budget: int = 32, p_top: float = 0.8, steps: int = 16, warmup: int = 3, tiny: bool = False,
        device: str = "auto", moe: str = "auto", verify: str = "auto", tree_impl: str = "auto",
        bandwidth_bytes: int = 2 << 30, profile: bool = False) -> dict[str, Any]:
    from workbench.measure import measure_copy_bandwidth, write_measurement

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    t0 = time.perf_counter()
    if tiny:
        cfg = tiny_config(n_group=1, topk_group=1, num_hidden_layers=max(layers, 2))
        model = synthetic_model(cfg, layers=layers, experts=experts, seed=0, device=dev,
                                dtype=torch.bfloat16 if dev.type == "cuda" else torch.float32, int4=True)
    else:
        model = synthetic_model("kimi-k2.6", layers=layers, experts=experts, seed=0, device=dev,
                                dtype=torch.bfloat16)
    build_s = time.perf_counter() - t0
    notes = []
    for layer in model.layers:
        if layer.is_moe:
            layer.mlp.experts.use_fused = moe != "torch"
        layer.self_attn.use_kernel = verify != "torch"
    V = model.config.vocab_size
    cache = PagedKVCache.for_model(model, prefix + (steps + warmup) * (budget + 2) + 64)
    timer = _Timer(dev)

    def fail(r, e):
        raise RuntimeError(f"benchmark request failed: {e}")

    def greedy_run(n_steps: int, record: bool):
        _fill_prefix(cache, 0, prefix, seed=1)
        r = _Req(0, [], [1], [])
        recs = []
        for _ in range(n_steps):
            timer.start()
            res = _greedy_step(model, cache, [r], timer, fail)
            (tok, rec), = res.values()
            r.out.append(tok)
            rec.times_ms = timer.finish()
            recs.append((rec, step_bytes(model, 1, cache.length(0))))
        cache.release(0)
        return r.out, recs

    def degrade(e: Exception) -> bool:
        """After a kernel failure: drop the verify kernel first, then the fused MoE. False: nothing left."""
        for layer in model.layers:
            if layer.self_attn.use_kernel and dev.type == "cuda":
                for l2 in model.layers:
                    l2.self_attn.use_kernel = False
                notes.append(f"verify kernel path failed ({type(e).__name__}: {e}); measured torch attention")
                return True
        for layer in model.layers:
            if layer.is_moe and layer.mlp.experts.use_fused and dev.type == "cuda":
                for l2 in model.layers:
                    if l2.is_moe:
                        l2.mlp.experts.use_fused = False
                notes.append(f"fused MoE path failed ({type(e).__name__}: {e}); measured the torch MoE")
                return True
        return False

    def try_kernels(fn, *a):
        while True:
            try:
                return fn(*a)
            except Exception as e:  # a kernel of another issue failed: say so, measure the torch path
                for rid in cache.requests():
                    cache.release(rid)
                if not degrade(e):
                    raise

    # greedy: warm-up, then measured steps; the tokens become the drafter's continuation
    try_kernels(greedy_run, warmup, False)
    cont, g_recs = try_kernels(greedy_run, steps * 8 + block, True)
    g_recs = g_recs[:steps]
    impl = _resolve_tree_impl(tree_impl, dev, block, budget)
    drafter = ScriptedDrafter([cont], V, block=block, p_top=p_top, seed=0, device=dev)

    def ddtree_run(n_steps: int):
        _fill_prefix(cache, 0, prefix, seed=1)
        r = _Req(0, [], [cont[0]], [])
        recs = []
        for _ in range(n_steps):
            timer.start()
            res = _ddtree_step(model, cache, [r], timer, fail, drafter, block, budget, "scattered", (), impl)
            (new, rec), = res.values()
            rec.times_ms = timer.finish()
            r.out.extend(new)
            recs.append((rec, step_bytes(model, rec.tree_size, cache.length(0))))
        cache.release(0)
        return r.out, recs

    try_kernels(ddtree_run, warmup)
    d_out, d_recs = try_kernels(ddtree_run, steps)
    n_cmp = min(len(d_out), len(cont))
    agree = next((i for i in range(n_cmp) if d_out[i] != cont[i]), n_cmp)
    if profile and out is not None:
        _profile(out, greedy_run, ddtree_run, dev)
    dflash = _time_dflash(model, block, dev, reps=steps)
    bw = measure_copy_bandwidth(bandwidth_bytes) if dev.type == "cuda" else None
    gbps = bw["gb_per_s"] if bw else None

    def summarise(recs):
        times = {p: _median([r.times_ms[p] for r, _ in recs]) for p in PHASES + ("total",)}
        nbytes = _median([b["total"] for _, b in recs])
        parts = {k: _median([b[k] for _, b in recs]) for k in recs[0][1] if k not in (
            "total", "distinct_experts_per_moe_layer")}
        acc = _median([r.accepted_length for r, _ in recs])
        mean_acc = float(sum(r.accepted_length for r, _ in recs) / len(recs))
        floor_ms = nbytes / (gbps * 1e9) * 1e3 if gbps else None
        return {"median_ms": times, "bytes_touched": nbytes, "bytes_by_part": parts,
                "distinct_experts_per_moe_layer": [
                    _median([b["distinct_experts_per_moe_layer"][i] for _, b in recs])
                    for i in range(len(recs[0][1]["distinct_experts_per_moe_layer"]))],
                "floor_ms": floor_ms, "pct_of_floor": (100 * floor_ms / times["total"]) if floor_ms else None,
                "median_accepted_length": acc, "mean_accepted_length": mean_acc,
                "tree_size": recs[0][0].tree_size, "ms_per_token": times["total"] / mean_acc}

    expected = drafter.expected_accepted_length(budget)
    results = {"greedy": summarise(g_recs), "ddtree": summarise(d_recs), "lossless": agree == n_cmp,
               "tokens_agreeing_with_greedy": agree, "compared_tokens": n_cmp,
               "scripted_expected_accepted_length": expected, "dflash_draft": dflash, "copy_bandwidth_gbps": gbps, "model_build_s": build_s,
               "moe_path": next((l.mlp.experts.last_path for l in model.layers if l.is_moe), None),
               "verify_path": model.layers[0].self_attn.last_path, "tree_impl": impl}
    samples = {"greedy": [r.times_ms for r, _ in g_recs], "ddtree": [dict(r.times_ms, accepted=r.accepted_length)
                                                                    for r, _ in d_recs],
               "copy_bandwidth": bw}
    params = {"model": "tiny" if tiny else "kimi-k2.6", "layers": layers,
              "experts": experts or model.config.n_routed_experts, "prefix": prefix, "block": block,
              "budget": budget, "p_top": p_top, "steps": steps, "warmup": warmup, "batch": 1,
              "dtype": str(model.dtype).replace("torch.", ""), "device": str(dev)}
    results["ddtree"]["ms_per_token_at_expected_acceptance"] = results["ddtree"]["median_ms"]["total"] / expected
    if agree < n_cmp:
        notes.append(f"DDTree output agreed with greedy for the first {agree} of {n_cmp} tokens: in bf16 the "
                     "target's logits differ in their last bits between a 1-token and a tree-wide forward "
                     "(different kernels and batch shapes), which flips near-tied argmaxes of this random "
                     "model; after that the scripted continuation no longer matches the target, so the "
                     "observed acceptance falls. ms_per_token_at_expected_acceptance uses the drafter's "
                     "scripted expectation instead (exact losslessness is tested in float32).")
    notes.append("floor = (weights touched + KV rows read) / measured device copy bandwidth; the routed "
                 "experts counted are the distinct ones the step's tokens chose; lm_head is the full "
                 "vocabulary head. Acceptance comes from ScriptedDrafter over the greedy continuation.")
    path = None
    if out is not None:
        path = write_measurement("engine_step", parameters=params, results=results, samples=samples,
                                 notes=" ".join(notes), out_dir=out)
    results["_path"] = str(path) if path else None
    print_table(results)
    return results


def print_table(results: dict[str, Any]) -> None:
    print(f"engine step, batch 1 (moe: {results['moe_path']}, verify: {results['verify_path']}, "
          f"tree: {results['tree_impl']}; ddtree = greedy for {results['tokens_agreeing_with_greedy']}/"
          f"{results['compared_tokens']} tokens; scripted E[accept] "
          f"{results['scripted_expected_accepted_length']:.2f})")
    print(f"DFlash-style drafter (2 layers, random weights) draft: {results['dflash_draft']['median_ms']:.3f} ms")
    hdr = f"{'method':8s} {'total':>8s} " + " ".join(f"{p:>10s}" for p in PHASES) + \
        f" {'accept':>6s} {'ms/tok':>7s} {'floor':>7s} {'%floor':>6s}"
    print(hdr)
    for m in ("greedy", "ddtree"):
        r = results[m]
        t = r["median_ms"]
        fl = f"{r['floor_ms']:7.3f}" if r["floor_ms"] else "      -"
        pf = f"{r['pct_of_floor']:6.1f}" if r["pct_of_floor"] else "     -"
        print(f"{m:8s} {t['total']:8.3f} " + " ".join(f"{t[p]:10.3f}" for p in PHASES) +
              f" {r['mean_accepted_length']:6.2f} {r['ms_per_token']:7.3f} {fl} {pf}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="folder for engine_step.json (default: do not write)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=None)
    ap.add_argument("--prefix", type=int, default=4096)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--p-top", type=float, default=0.8)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--moe", choices=("auto", "torch"), default="auto")
    ap.add_argument("--verify", choices=("auto", "torch"), default="auto")
    ap.add_argument("--tree-impl", choices=("auto", "reference", "batched"), default="auto")
    ap.add_argument("--tiny", action="store_true", help="small config (CPU smoke test)")
    ap.add_argument("--profile", action="store_true", help="also write engine_profile.txt (torch.profiler)")
    a = ap.parse_args(argv)
    run(a.out, layers=a.layers, experts=a.experts, prefix=a.prefix, block=a.block, budget=a.budget,
        p_top=a.p_top, steps=a.steps, warmup=a.warmup, tiny=a.tiny, device=a.device, moe=a.moe,
        verify=a.verify, tree_impl=a.tree_impl, profile=a.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
