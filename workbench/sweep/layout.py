"""KV layout under churn: how scattered a request's slots get, and what that costs attention.

The engine's pool is page_size 1 (:class:`~workbench.engine.kv_device.DeviceKVCache`: a free-slot
stack, a slot table per request row). :func:`churn` drives that cache with the engine's own slot
operations (``admit``, ``allocate``, ``commit_tree`` / ``commit_append``, ``release``) the way a
server does: ``requests`` requests pass through ``rows`` rows, admitted as rows free up and finished
at staggered lengths while the others decode, and a drafter that misses (each drafted position is
accepted with probability ``p_top`` until the first miss) so every DDTree commit returns most of a
tree's slots to the stack in between kept ones. Layouts:

- ``scattered``: DDTree, ``commit_tree(..., "scattered")`` (keep the accepted nodes' slots);
- ``compacted``: DDTree, ``commit_tree(..., "compacted")`` (move the accepted rows to the first
  slots of the step's allocation);
- ``greedy``: one slot per request per step (``commit_append``);
- ``contiguous``: the reference layout, each request's positions in consecutive slots.

:func:`fragmentation` is the metric over the slots a request holds in position order: contiguous
runs (a run continues while the next slot is the previous one +- 1) per request and the mean run
length in tokens. :func:`attention_ms` times one layer's absorbed-MLA attention
(``latent_attention_torch``, the engine's torch path) over a slot list, so a scattered and a
contiguous list of the same length compare directly (ms, median of repeats; on the CPU the torch path, the
gather's cost; on CUDA the engine's verify kernel).
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Sequence

import torch

from workbench.ddtree import verify_attention
from workbench.ddtree.tree_gpu import GpuAccepted
from workbench.engine.kv_device import DeviceKVCache
from workbench.engine.attention import latent_attention_torch
from workbench.validation import InvalidParameter, check_choice, check_float, check_int

LAYOUTS = ("contiguous", "scattered", "compacted", "greedy")


def runs(slots: Sequence[int]) -> list[int]:
    """Lengths of the contiguous runs of ``slots`` (position order): a run continues while each slot is
    the previous one + 1 or - 1 (slots are distinct, so a run cannot turn)."""
    s = [int(x) for x in slots]
    if not s:
        return []
    out, n = [], 1
    for a, b in zip(s, s[1:]):
        if abs(b - a) == 1 and (n == 1 or b - a == d):
            n += 1
        else:
            out.append(n)
            n = 1
        d = b - a
    out.append(n)
    return out


def fragmentation(requests: Sequence[Sequence[int]]) -> dict[str, float]:
    """Over each request's slots (position order): mean contiguous runs per request, mean run length (tokens
    per run, over all runs) and mean tokens per request."""
    if not requests:
        raise InvalidParameter("requests", requests, "at least one request's slots")
    rs = [runs(s) for s in requests]
    allr = [x for r in rs for x in r]
    return {"requests": len(requests), "runs_per_request": statistics.fmean(len(r) for r in rs),
            "mean_run_length": statistics.fmean(allr) if allr else 0.0,
            "tokens_per_request": statistics.fmean(len(s) for s in requests)}


def _accepted_path(g: torch.Generator, T: int, depth: int, p_top: float) -> list[int]:
    """Accepted node indices (root first) of a T-node tree: 1 + hits before the first miss (at most
    ``depth``), at node indices drawn increasing (a best-first tree numbers a path's nodes in increasing order)."""
    a = 1
    while a <= min(depth, T - 1) and float(torch.rand(1, generator=g)) < p_top:
        a += 1
    picks = sorted(torch.randperm(T - 1, generator=g)[:a - 1].add(1).tolist())
    return [0] + picks


def churn(layout: str = "scattered", *, requests: int = 12, rows: int = 4, prompt: int = 48, generate: int = 96,
          tree: int = 17, depth: int = 7, p_top: float = 0.6, seed: int = 0, layers: int = 1,
          row_width: int = 576) -> dict[str, Any]:
    """Run ``requests`` requests of ``prompt`` tokens through ``rows`` rows of a fresh DeviceKVCache (module
    docstring), each to a seeded length in [generate / 2, generate] tokens; ``tree`` slots per DDTree step, at most
    ``depth`` drafted tokens accepted. Returns {layout, fragmentation (of every finished request's slots, read just
    before its release), slots (per finished request, position order), steps}. ``contiguous`` runs no steps: each
    request holds prompt + its target length in consecutive slots."""
    check_choice("layout", layout, LAYOUTS)
    requests = check_int("requests", requests, lo=1)
    rows = check_int("rows", rows, lo=1)
    prompt = check_int("prompt", prompt, lo=1)
    generate = check_int("generate", generate, lo=2)
    tree = check_int("tree", tree, lo=2)
    depth = check_int("depth", depth, lo=1, hi=tree - 1)
    p_top = check_float("p_top", p_top, lo=0.0, hi=1.0)
    g = torch.Generator().manual_seed(seed)
    capacity = prompt + generate + tree + depth + 1
    targets = [int(x) for x in torch.randint(generate // 2, generate + 1, (requests,), generator=g)]
    if layout == "contiguous":
        held = [list(range(i * capacity, i * capacity + prompt + t)) for i, t in enumerate(targets)]
        return {"layout": layout, "fragmentation": fragmentation(held), "slots": held, "steps": 0}
    cache = DeviceKVCache(layers, rows * capacity, rows, capacity, row_width, torch.float32)
    waiting = list(range(requests))
    row_req: list[int | None] = [None] * rows
    made = [0] * requests
    held: list[list[int]] = []
    steps = 0
    n = 1 if layout == "greedy" else tree
    while waiting or any(r is not None for r in row_req):
        for row in range(rows):  # admit into free rows (between steps, as a scheduler does)
            if row_req[row] is None and waiting:
                row_req[row] = waiting.pop(0)
                cache.admit(row, prompt)
        active = torch.tensor([r is not None for r in row_req])
        slots, ok = cache.allocate(active, n)
        if not bool(ok[active].all()):
            raise RuntimeError("the churn's pool ran out of slots (a sizing error in churn())")
        if layout == "greedy":
            cache.commit_append(slots, ok)
            got = ok.long()
        else:
            nodes = torch.full((rows, n), -1, dtype=torch.int64)
            lengths = torch.zeros(rows, dtype=torch.int64)
            for row in range(rows):
                if row_req[row] is not None:
                    path = _accepted_path(g, n, depth, p_top)
                    nodes[row, :len(path)] = torch.tensor(path)
                    lengths[row] = len(path)
                else:
                    nodes[row, 0] = 0
            acc = GpuAccepted(nodes, lengths.clamp(min=1), torch.zeros(rows, dtype=torch.int64))
            got = cache.commit_tree(slots, acc, ok, layout)
        steps += 1
        for row in range(rows):
            r = row_req[row]
            if r is None:
                continue
            made[r] += int(got[row])
            if made[r] >= targets[r]:
                held.append(cache.table[row, :int(cache.lengths[row])].tolist())
                cache.release(row)
                row_req[row] = None
    return {"layout": layout, "fragmentation": fragmentation(held), "slots": held, "steps": steps}


def attention_ms(slots: Sequence[int], *, heads: int = 8, tail: int = 1, kv_lora_rank: int = 512,
                 rope_dim: int = 64, repeats: int = 20, seed: int = 0, device: str = "cpu") -> float:
    """Median time (ms) of one layer's absorbed-MLA attention of ``tail`` new tokens (a chain) over the pool rows
    ``slots`` (a pool just large enough to hold them), after one warm-up. On the CPU: ``latent_attention_torch``
    (float32 math over bf16 rows; wall clock). On CUDA: the engine's verify kernel
    (``workbench.ddtree.verify_attention``, bf16; CUDA events), the kernel a captured step runs per layer."""
    idx = torch.tensor([int(s) for s in slots], dtype=torch.int64, device=device)
    if idx.numel() == 0:
        raise InvalidParameter("slots", list(slots), "at least one slot")
    g = torch.Generator().manual_seed(seed)
    R, W = kv_lora_rank, kv_lora_rank + rope_dim
    cuda = device != "cpu"
    dt = torch.bfloat16 if cuda else torch.float32
    pool = torch.randn(int(idx.max()) + 1, W, generator=g).to(device=device, dtype=torch.bfloat16)
    q_lat = torch.randn(tail, heads, R, generator=g).to(device=device, dtype=dt)
    q_rope = torch.randn(tail, heads, rope_dim, generator=g).to(device=device, dtype=dt)
    tail_kv = torch.randn(tail, W, generator=g).to(device=device, dtype=torch.bfloat16 if cuda else torch.float32)
    if cuda:
        parents = torch.arange(-1, tail - 1, device=device)
        run = lambda: verify_attention(q_lat, q_rope, pool, idx, tail_kv, parents, W ** -0.5, check=False)  # noqa: E731
    else:
        vis = torch.ones(tail, tail, dtype=torch.bool, device=device).tril()
        run = lambda: latent_attention_torch(q_lat, q_rope, pool, idx, tail_kv, vis, W ** -0.5)  # noqa: E731
    out = []
    for i in range(repeats + 1):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            b.synchronize()
            ms = a.elapsed_time(b)
        else:
            t0 = time.perf_counter()
            run()
            ms = (time.perf_counter() - t0) * 1e3
        if i:
            out.append(ms)
    return statistics.median(out)


def layout_comparison(layouts: Sequence[str] = LAYOUTS, *, contexts: Sequence[int] = (256,), heads: int = 8,
                      kv_lora_rank: int = 512, rope_dim: int = 64, repeats: int = 20, seed: int = 0,
                      device: str = "cpu", tail: int = 1, **churn_kw) -> list[dict[str, Any]]:
    """Per layout: the churn's fragmentation, and per context the attention time (ms) over a request's slot
    list of that many tokens laid out as that layout lays it out (the churned request's slots, repeated with
    an offset past the pool when the context is longer than one request); ``tail`` new tokens (a verify tree's
    nodes: budget + 1) attend, on ``device`` (:func:`attention_ms`)."""
    rows = []
    for lay in layouts:
        res = churn(lay, seed=seed, **churn_kw)
        longest = max(res["slots"], key=len)
        span = max(max(s) for s in res["slots"]) + 1
        for c in contexts:
            check_int("contexts", c, lo=1)
            sl, k = [], 0
            while len(sl) < c:
                sl += [s + k * span for s in longest]
                k += 1
            sl = sl[:c]
            rows.append({"layout": lay, "context": c, **res["fragmentation"], "steps": res["steps"],
                         "context_runs": len(runs(sl)),
                         "attention_ms": attention_ms(sl, heads=heads, kv_lora_rank=kv_lora_rank,
                                                     rope_dim=rope_dim, repeats=repeats, seed=seed, device=device,
                                                     tail=tail)})
    return rows
