"""TP = N against TP = 1, on every rank: logits within float32 tolerance, the same greedy and DDTree tokens.

Run under torchrun (gloo on the CPU, NCCL on GPUs)::

    workbench tp --nproc 2 -m workbench.parallel.parity --out DIR
    torchrun --standalone --nproc-per-node 2 -m workbench.parallel.parity --out DIR   # with ENV set

Every rank builds the same full model (``synthetic_model`` of ``tiny_config()``, float32, seeded;
dense or INT4 routed experts) and its own shard (:func:`~workbench.parallel.model.shard_model`),
then compares the shard's results with the full model's, computed on that rank alone:

- ``naive``: ``model(input_ids)`` logits (the shards' gathered) [B, T, V];
- ``batch``: ``forward_batch`` float32 logits of a ragged two-request prefill through a paged cache
  (:meth:`~workbench.parallel.layers.VocabShardedLogits.full`) [N, V], and its reduced argmax
  against the full logits' ``argmax``;
- ``generate`` greedy and DDTree (``ScriptedDrafter``) tokens of :func:`workbench.engine.generate`;
- ``engine`` greedy and DDTree tokens of :class:`workbench.engine.DecodeEngine` (the captured step's
  body, run eagerly: float32 weights; the bf16 graph replay is checked by ``workbench.bench.engine_tp``);
- ``argmax_ties``: the vocabulary-parallel argmax of constructed rows (ties inside and across shards,
  -0.0 against +0.0, -inf) against ``torch.argmax`` of the full rows.

Rank 0 writes ``parity.json``: per expert kind (``--experts dense,int4``) each rank's numbers (worst
absolute logit error over the largest |logit|, token lists, which checks passed) and ``ranks_agree``
(every rank produced the same tokens). Exit status 0 when every check passed, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from workbench.decode import DecodeConfig
from workbench.engine import (DecodeEngine, PagedKVCache, ScriptedDrafter, Segment, generate, synthetic_model,
                              tiny_config)
from workbench.parallel.groups import init_from_env, shutdown
from workbench.parallel.model import shard_model
from workbench.validation import check_choice

PROMPTS = ((1, 2, 3, 4, 5), (7, 8, 9, 10, 11, 12, 13), (40, 41))
RTOL = 1e-5   # worst |TP - full| over the largest |full| logit, float32


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Worst absolute difference over the largest magnitude of ``b``."""
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-30))


def tie_rows(vocab: int, tp: int) -> torch.Tensor:
    """float32 [6, vocab] rows whose argmax needs the tie rule: a tie across the first two shards, a tie inside
    one shard, the maximum in the last shard only, -0.0 / +0.0 as the maximum, all -inf, and all equal."""
    n = vocab // max(tp, 2)  # a shard's width (two halves at tp = 1)
    rows = torch.full((6, vocab), -5.0)
    rows[0, [n + 1, 1]] = 3.0                       # across shards: lower id (1) wins
    rows[1, [n - 1, n - 2]] = 2.5                   # inside shard 0: n - 2
    rows[2, vocab - 1] = 9.0                        # last shard alone
    rows[3] = -1.0
    rows[3, n + 2] = 0.0
    rows[3, 2] = -0.0                               # equal to +0.0: lower id (2)
    rows[4] = float("-inf")                         # all -inf: id 0
    rows[5] = 7.0                                   # all equal: id 0
    return rows


def run(int4: bool = False, new_tokens: int = 10, block: int = 6, budget: int = 6, seed: int = 1,
        group=None) -> dict[str, Any]:
    """The checks on this rank (module docstring); returns its numbers. ``group``: a
    :class:`~workbench.parallel.groups.TPGroup` (default: :func:`~workbench.parallel.groups.init_from_env`)."""
    t0 = time.perf_counter()
    group = group or init_from_env()
    dev = group.device
    cfg = tiny_config()
    full = synthetic_model(cfg, layers=None, dtype=torch.float32, seed=seed, device=dev, int4=int4)
    tp = shard_model(full, group)
    out: dict[str, Any] = {"rank": group.rank, "tp": group.size, "backend": group.backend, "int4": int4,
                           "device": str(dev), "local_bytes": tp.device_bytes(), "full_bytes": full.device_bytes()}

    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]], device=dev)
    out["naive_err"] = _err(tp(ids), full(ids))

    caches = [PagedKVCache.for_model(m, 64) for m in (full, tp)]
    res = []
    for m, cache in zip((full, tp), caches):
        segs, toks, pos = [], [], []
        for i, p in enumerate(PROMPTS[:2]):
            cache.add_request(i)
            segs.append(Segment(cache.slots(i), cache.allocate(i, len(p))))
            toks.append(torch.tensor(p))
            pos.append(torch.arange(len(p)))
        logits, _ = m.forward_batch(torch.cat(toks).to(dev), torch.cat(pos).to(dev), segs, cache)
        res.append(logits)
    out["batch_err"] = _err(res[1].full(), res[0])
    out["batch_argmax_equal"] = bool(torch.equal(res[1].argmax(-1), res[0].argmax(-1)))
    top_tp, top_full = res[1].topk(2, dim=-1), res[0].topk(2, dim=-1)
    out["batch_top2_err"] = _err(top_tp.values, top_full.values)

    ref_greedy = [r.tokens for r in generate(full, PROMPTS, new_tokens)]
    out["greedy_full"] = ref_greedy
    out["greedy_tp"] = [r.tokens for r in generate(tp, PROMPTS, new_tokens)]
    dc = DecodeConfig(method="ddtree", block=block, budget=budget)
    drafter = ScriptedDrafter(ref_greedy, cfg.vocab_size, block=block, p_top=0.7, seed=seed, device=dev)
    out["ddtree_full"] = [r.tokens for r in generate(full, PROMPTS, new_tokens, config=dc, drafter=drafter)]
    dd = generate(tp, PROMPTS, new_tokens, config=dc, drafter=drafter)
    out["ddtree_tp"] = [r.tokens for r in dd]
    out["ddtree_tp_accepted"] = [r.mean_accepted_length for r in dd]
    for name, m in (("full", full), ("tp", tp)):  # float32: the eager step (graphs need the bf16 kernels)
        eng = DecodeEngine(m, max_requests=len(PROMPTS), capacity=96, max_generated=new_tokens, graphs=False)
        out[f"engine_greedy_{name}"] = [r.tokens for r in eng.generate(PROMPTS, new_tokens)]
        out[f"engine_ddtree_{name}"] = [r.tokens for r in eng.generate(PROMPTS, new_tokens, dc, drafter)]

    rows = tie_rows(cfg.vocab_size, group.size).to(dev)
    n = cfg.vocab_size // group.size
    got = group.argmax(rows[:, group.rank * n:(group.rank + 1) * n].contiguous(), group.rank * n, cfg.vocab_size)
    out["argmax_ties"] = got.tolist()
    out["argmax_ties_ref"] = rows.argmax(-1).tolist()
    out["seconds"] = time.perf_counter() - t0
    return out


def passed(r: dict[str, Any]) -> dict[str, bool]:
    """Each check of one rank's :func:`run` record: True when it passed."""
    return {"naive_logits": r["naive_err"] <= RTOL, "batch_logits": r["batch_err"] <= RTOL,
            "batch_argmax": r["batch_argmax_equal"], "batch_top2": r["batch_top2_err"] <= RTOL,
            "generate_greedy": r["greedy_tp"] == r["greedy_full"],
            "generate_ddtree": r["ddtree_tp"] == r["ddtree_full"] == r["greedy_full"],
            "engine_greedy": r["engine_greedy_tp"] == r["engine_greedy_full"] == r["greedy_full"],
            "engine_ddtree": r["engine_ddtree_tp"] == r["engine_ddtree_full"] == r["greedy_full"],
            "argmax_ties": r["argmax_ties"] == r["argmax_ties_ref"]}


VARIANTS = ("dense", "int4")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="folder for parity.json (rank 0 writes it)")
    ap.add_argument("--experts", default="dense,int4", help="comma-separated routed-expert kinds: dense (float32) "
                                                          "and/or int4 (the fused MoE path on GPUs)")
    ap.add_argument("--backend", default="auto", help="auto (NCCL with CUDA, else gloo), nccl or gloo")
    a = ap.parse_args(argv)
    kinds = [check_choice("experts", k, VARIANTS) for k in a.experts.split(",")]
    torch.set_num_threads(1)
    group = init_from_env(a.backend)
    try:
        recs = [group.all_gather_object(run(int4=k == "int4", group=group)) for k in kinds]
    finally:
        shutdown()
    ok, docs = True, []
    for rs in recs:
        keys = [k for k in rs[0] if k.endswith(("_tp", "_full"))]
        agree = all(all(r[k] == rs[0][k] for k in keys) for r in rs)
        checks = [passed(r) for r in rs]
        ok = ok and agree and all(all(c.values()) for c in checks)
        docs.append({"int4": rs[0]["int4"], "ranks_agree": agree, "checks": checks, "ranks": rs})
        if group.rank == 0:
            for r, c in zip(rs, checks):
                print(f"rank {r['rank']}/{r['tp']} ({r['backend']}, {r['device']}, int4={r['int4']}): naive "
                      f"{r['naive_err']:.1e}, batch {r['batch_err']:.1e}, failed: "
                      f"{[k for k, v in c.items() if not v] or 'none'}, {r['seconds']:.1f} s")
            print(f"int4={rs[0]['int4']}: ranks agree: {agree}")
    if group.rank == 0:
        if a.out:
            Path(a.out).mkdir(parents=True, exist_ok=True)
            (Path(a.out) / "parity.json").write_text(json.dumps({"ok": ok, "variants": docs}, indent=1) + "\n")
        print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    from workbench.parallel.groups import exit_rank

    exit_rank(main())
