"""CPU model of the cluster variant of the tree-verify kernel (``impl="cluster"``; NOT YET RUN ON A GPU).

``ddtree_verify_wgmma_cluster_bf16`` (``workbench/kernels/ddtree_verify.cu``) runs the default wgmma
kernel's body in thread-block clusters of two CTAs (``__cluster_dims__(2, 1, 1)``) on a 1-D grid of two
regions:

- A: row blocks ``[0, q)`` (``q`` = the row-block count rounded down to even) x ``n_a`` chunks, row block
  fastest. The two CTAs of a cluster (``blk``, ``blk ^ 1``) hold adjacent row blocks of one chunk and
  *share*: each gathers 32 of the 64 keys of every tile from L2 and copies them into the partner's
  shared memory.
- B (an odd row-block count only): the last row block x ``n_b`` chunks, each CTA *solo* (the default's
  loop: whole tiles gathered by itself). For one request its chunks may be shorter and more numerous than
  A's (``clen_b``), so that these CTAs, whose tiles cost more, end with the sharing ones
  (``solo_ratio``); the merge then sees ``max(n_a, n_b)`` partial slots per row, and a region with fewer
  chunks writes log-sum-exp -inf (weight 0) into the slots it leaves empty.

The grid is ``q * n_a + (rb odd) * n_b`` rounded up to even; CTAs past both regions return.

- :func:`cluster_launch_plan` - the host's plan (chunk lengths and counts of both regions, grid, slots).
- :func:`cluster_grid` - CTAs launched for a plan's region sizes.
- :func:`cluster_plan` - every CTA's (row block, chunk, mode) as the kernel computes it, and the L2 tile
  reads per tile step.
- :func:`half_gather_map` - which (key, 16-byte chunk) of a tile each thread of a sharing CTA gathers.
- :func:`simulate_cluster_call` - a CPU simulation of one call, CTA by CTA, with the merge.
"""
from __future__ import annotations

import math
from typing import Any

__all__ = ["cluster_launch_plan", "cluster_grid", "cluster_plan", "half_gather_map", "simulate_cluster_call",
           "ROW_CHUNKS", "TILE_KEYS", "PREDICTION"]

TILE_KEYS = 64    # keys per tile (MMA_KEYS)
ROW_CHUNKS = 72   # 16-byte chunks of a 576-value bf16 KV row
THREADS = 256


def _check(name: str, v: int, minimum: int = 1) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {v!r}")
    return v


def _regions(row_blocks: int) -> tuple[int, bool]:
    """(q, has region B): q = row blocks of region A (even), B = the last row block when the count is odd."""
    return row_blocks & ~1, bool(row_blocks & 1)


def cluster_grid(row_blocks: int, n_a: int, n_b: int | None = None) -> int:
    """CTAs launched: ``q * n_a`` (region A) + ``n_b`` (region B, odd ``row_blocks`` only; default ``n_a``),
    rounded up to even (a multiple of the cluster size 2). Chunk counts may be upper bounds (batched
    requests): CTAs past the real count return."""
    _check("row_blocks", row_blocks)
    _check("n_a", n_a, 0)
    n_b = n_a if n_b is None else _check("n_b", n_b, 0)
    q, has_b = _regions(row_blocks)
    n = q * n_a + (n_b if has_b else 0)
    if n < 1:
        raise ValueError(f"no CTA to launch (row_blocks={row_blocks}, n_a={n_a}, n_b={n_b})")
    return n + (n & 1)


def _align(keys: int, align: int = TILE_KEYS) -> int:
    return max(align, -(-keys // align) * align)


def cluster_launch_plan(row_blocks: int, total_keys: int, chunk_len: int, n_chunks: int, sms: int,
                        single: bool = True, solo_ratio: float = 1.0, fixed_chunk_len: bool = False
                        ) -> dict[str, int]:
    """The host's plan for ``impl="cluster"``, from the default's plan (``chunk_len``, ``n_chunks``: what
    ``verify._plan`` gives for the same call) of ``total_keys`` keys (prefix + tail of one request, or all
    requests with their tails for a batch).

    ``solo_ratio`` (>= 1): the expected cost of a solo tile over a shared one. 1.0 keeps the default's
    chunking in both regions (the outputs then equal the default's bit for bit). Above 1, for one request
    with an odd row-block count > 1 and no ``fixed_chunk_len``, region A takes ``n_a`` chunks and region B the
    ``sms - q * n_a`` SMs left, choosing ``n_a`` to minimise ``max(tiles_a, solo_ratio * tiles_b)``
    (the default's split is kept when nothing beats it). Batched requests keep the default's global chunks.

    Returns ``{"row_blocks", "q", "clen_a", "n_a", "clen_b", "n_b", "slots", "grid"}``: ``slots`` partials per
    row for the merge (single request: ``max(n_a, n_b)``; batched: ``n_chunks``).
    """
    _check("row_blocks", row_blocks)
    _check("total_keys", total_keys)
    _check("chunk_len", chunk_len)
    _check("n_chunks", n_chunks)
    _check("sms", sms)
    if not (isinstance(solo_ratio, (int, float)) and math.isfinite(solo_ratio) and solo_ratio >= 1.0):
        raise ValueError(f"solo_ratio must be a finite number >= 1, got {solo_ratio!r}")
    q, has_b = _regions(row_blocks)
    n_a, clen_a, n_b, clen_b = n_chunks, chunk_len, (n_chunks if has_b else 0), chunk_len
    if single and has_b and q > 0 and solo_ratio > 1.0 and not fixed_chunk_len:
        tiles = -(-chunk_len // TILE_KEYS)
        best = (solo_ratio * tiles, n_a, clen_a, n_b, clen_b)
        for c in range(1, sms // q + 1):
            left = sms - q * c
            if left < 1:
                break
            ca = _align(-(-total_keys // c))
            cb = _align(-(-total_keys // left))
            cost = max(ca // TILE_KEYS, solo_ratio * (cb // TILE_KEYS))
            if cost < best[0] - 1e-9:
                best = (cost, -(-total_keys // ca), ca, -(-total_keys // cb), cb)
        _, n_a, clen_a, n_b, clen_b = best
    slots = max(n_a, n_b) if single else n_chunks
    return dict(row_blocks=row_blocks, q=q, clen_a=clen_a, n_a=n_a, clen_b=clen_b, n_b=n_b, slots=slots,
                grid=cluster_grid(row_blocks, n_a, n_b))


def cluster_plan(row_blocks: int, n_a: int, n_b: int | None = None, valid_chunks: int | None = None
                 ) -> dict[str, Any]:
    """The kernel's CTA -> work mapping, as the kernel computes it.

    ``n_a``/``n_b``: chunks of regions A and B (``n_b`` defaults to ``n_a``); ``valid_chunks``: chunks that
    exist (batched: ``chunk_start[B]``, at most ``n_a``; default all). Returns ``{"grid", "ctas",
    "shared_ctas", "solo_ctas", "idle_ctas", "l2_tile_reads", "default_l2_tile_reads", "l2_ratio"}``;
    ``ctas``: dicts ``{blk, cluster, rank, region, row_block, chunk, mode}``, mode ``"shared"`` (gathers half
    of each tile and copies it to the partner), ``"solo"`` (whole tiles, as the default) or ``"idle"``
    (returns at once). ``l2_tile_reads``: whole-tile L2 reads per tile step over the grid (a sharing pair
    counts 1, a solo CTA 1); ``default_l2_tile_reads``: the default kernel's, ``row_blocks * n_a``.
    """
    n_b = n_a if n_b is None else n_b
    grid = cluster_grid(row_blocks, n_a, n_b)
    q, has_b = _regions(row_blocks)
    ctas = []
    for blk in range(grid):
        if blk < q * n_a:
            region, g, r = "A", blk // q, blk % q
            lim = n_a if valid_chunks is None else valid_chunks
            mode = "shared" if g < lim else "idle"
        elif has_b:
            region, g, r = "B", blk - q * n_a, row_blocks - 1
            lim = n_b if valid_chunks is None else valid_chunks
            mode = "solo" if g < lim else "idle"
        else:
            region, g, r, mode = "-", -1, -1, "idle"
        ctas.append(dict(blk=blk, cluster=blk >> 1, rank=blk & 1, region=region, row_block=r, chunk=g, mode=mode))
    n_shared = sum(c["mode"] == "shared" for c in ctas)
    n_solo = sum(c["mode"] == "solo" for c in ctas)
    reads = n_shared / 2 + n_solo
    default = row_blocks * (n_a if valid_chunks is None else valid_chunks)
    return dict(grid=grid, ctas=ctas, shared_ctas=n_shared, solo_ctas=n_solo, idle_ctas=grid - n_shared - n_solo,
                l2_tile_reads=reads, default_l2_tile_reads=default, l2_ratio=reads / default)


def half_gather_map(rank: int) -> list[tuple[int, int, int]]:
    """(thread, key within the tile, 16-byte chunk of the row) for every ``cp.async`` a sharing CTA of
    cluster rank ``rank`` (0 or 1) issues per tile: keys ``32 * rank + (tid >> 3)``, chunks
    ``(tid & 7) + 8 * i`` for i < 9 (the kernel's ``gather_half``; ``push_half`` copies the same
    chunks to the partner)."""
    if rank not in (0, 1):
        raise ValueError(f"rank must be 0 or 1 (cluster of two CTAs), got {rank!r}")
    return [(tid, 32 * rank + (tid >> 3), (tid & 7) + 8 * i) for tid in range(THREADS) for i in range(9)]


def simulate_cluster_call(q_latent, q_rope, kv_cache, prefix_slots, tail_kv, parents, scale,
                          plan: dict[str, int], rows: int = 64) -> tuple[Any, Any]:
    """CPU simulation (torch, float64) of one single-request call of the cluster kernel and its merge, CTA by
    CTA as :func:`cluster_plan` maps them: each CTA's partial softmax over its region's key chunk for its 64
    rows, the tile assembled from both halves (:func:`half_gather_map`) for sharing CTAs, the -inf slots a
    region with fewer chunks leaves, and the log-sum-exp merge over ``plan["slots"]``. Checks the plan's
    arithmetic against :func:`workbench.ddtree.verify.verify_attention_reference` on a CPU; shapes as
    there (one request). Returns ``(out [T, H, 512], lse [T, H])`` float64 torch tensors."""
    import torch

    from workbench.ddtree.verify import _ancestor_visibility_np

    T, H = int(q_latent.shape[0]), int(q_latent.shape[1])
    M = T * H
    P = int(prefix_slots.shape[0])
    keys = torch.cat([torch.as_tensor(kv_cache, dtype=torch.float64)[torch.as_tensor(prefix_slots).long()],
                      torch.as_tensor(tail_kv, dtype=torch.float64)], 0)  # [P + T, 576]
    q = torch.cat([torch.as_tensor(q_latent, dtype=torch.float64), torch.as_tensor(q_rope, dtype=torch.float64)],
                  -1).reshape(M, 576)
    vis = torch.as_tensor(_ancestor_visibility_np(torch.as_tensor(parents).numpy()))
    rb = -(-M // rows)
    if rb != plan["row_blocks"]:
        raise ValueError(f"plan is for {plan['row_blocks']} row blocks, the inputs have {rb}")
    n_slots = plan["slots"]
    o_part = torch.full((n_slots, M, 512), float("nan"), dtype=torch.float64)
    lse_part = torch.full((n_slots, M), float("nan"), dtype=torch.float64)
    tile_map = {rank: half_gather_map(rank) for rank in (0, 1)}
    for c in cluster_plan(rb, plan["n_a"], plan["n_b"])["ctas"]:
        if c["mode"] == "idle":
            continue
        clen, n_reg = (plan["clen_a"], plan["n_a"]) if c["region"] == "A" else (plan["clen_b"], plan["n_b"])
        g, r0 = c["chunk"], c["row_block"] * rows
        k0, k1 = g * clen, min(g * clen + clen, P + T)
        if c["mode"] == "shared":  # every 16-byte chunk of every tile from exactly one CTA of the pair
            for t0 in range(k0, k1, TILE_KEYS):
                got = {(k, ch) for rank in (0, 1) for _, k, ch in tile_map[rank] if t0 + k < k1}
                assert got == {(k, ch) for k in range(min(TILE_KEYS, k1 - t0)) for ch in range(ROW_CHUNKS)}
        rr = torch.arange(r0, min(r0 + rows, M))
        s = (q[rr] @ keys[k0:k1].T) * scale
        kk = torch.arange(k0, k1)
        tail = kk >= P
        if tail.any():
            node = rr // H
            s[:, tail] = s[:, tail].masked_fill(~vis[node][:, kk[tail] - P], float("-inf"))
        lse = torch.logsumexp(s, -1)
        w = torch.exp(s - lse[:, None]).nan_to_num(0.0)
        o_part[g, rr] = w @ keys[k0:k1, :512]
        lse_part[g, rr] = lse
        if g == n_reg - 1:  # the slots this region leaves empty: weight 0 in the merge
            lse_part[n_reg:n_slots, rr] = float("-inf")
    lse = torch.logsumexp(lse_part, 0)  # [M]; NaN here means a slot nobody wrote
    wts = torch.exp(lse_part - lse[None])
    out = torch.einsum("sm,smd->md", wts, torch.where(wts[..., None] > 0, o_part, torch.zeros_like(o_part)))
    return out.reshape(T, H, 512), lse.reshape(T, H)


# Written before any run of the cluster kernel (this session had no device time). The figures it starts
# from are committed: data/measurements/h200/ddtree_verify.json and ddtree_verify_probe.json (0929e2e) and
# papers/ddtree_kernels.md section 3, block verify-tiles.
PREDICTION = (
    "PREDICTION for impl='cluster' (written before any GPU run, code as committed; the next session's first "
    "device call measures it). Evidence (0929e2e, same-process probe): a 64-key tile costs 2.61 us (H=8) / 2.57 us "
    "(H=64); the gathers alone 1.71 / 1.94 us, drawing 5.7 / 5.0 TB/s from L2 across the GPU (about what an "
    "H100-class L2 delivers, so the gathers look bound by the aggregate L2 -> SM rate rather than by one SM); the "
    "compute alone 1.74 us. A sharing CTA reads half a tile from L2 (73.7 -> 36.9 KB) and sends 36.9 KB over the "
    "SM-to-SM network (9 x (ld.shared.v4 + mapa + st.shared::cluster.v4) per thread, under the P.V), with a "
    "cluster barrier per tile instead of __syncthreads (about +0.1 us per tile). The unknown is the rate of "
    "distributed shared memory: near shared-memory rates, the half gathers and copies alone (cluster_diag_gather) "
    "take 0.9-1.2 us per tile and a tile 2.0-2.2 us; as low as published H100 microbenchmarks suggest (about 3.3 "
    "TB/s for the whole GPU, 25 GB/s per SM: 1.5 us for 36.9 KB) a tile stays at 2.4-2.6 us. The half gathers "
    "alone without the copies (cluster_diag_half): 0.9-1.1 us per tile if the aggregate L2 rate binds, 1.2-1.5 us "
    "if one SM's latency does; cluster_diag_gather minus cluster_diag_half is the copy's cost. Per tile "
    "(probe, (128k - 16k) / tiles, the sharing CTAs at T=32, H=64): cluster 2.1 us (1.9-2.6) where the default "
    "takes 2.6. Whole calls (variant / default, same process): T=32 H=64 (32 row blocks, every CTA shares) 0.88x "
    "at 16k and 0.85x at 128k (range 0.75-1.00). T=33 H=64 (33 row blocks: region B = 4 solo CTAs of 132, the "
    "same chunk length, so they may set the end): 0.93x from 64k up (0.85-1.02), 0.97x at 4k/16k (0.90-1.03); "
    "cluster_bal is the same plan there (no SM left to rebalance). T=33 H=8 (5 row blocks; 26 of 130 CTAs solo, "
    "L2 reads 0.6x): cluster 0.93x from 64k up (0.85-1.02) and 1.00x at 4k/16k (0.95-1.05: 3-10 tiles, the "
    "fixed part dominates and the cluster adds a barrier and one copy before the first tile); cluster_bal (the "
    "solo row block on 32-33 shorter chunks: at 128k region A 25 chunks of 82 tiles, region B 32 of 65) 0.87x "
    "at 128k and 0.88x at 64k (0.80-1.05), 0.94x at 16k (0.88-1.08), 1.00x at 4k (0.95-1.08: more partial slots "
    "to merge). If the solo CTAs do not speed up with the lighter L2 load, cluster comes out at 0.98-1.02x at "
    "T=33 while T=32 and cluster_bal at H=8 still show the gain: the three together tell the questions apart. "
    "Correctness: cluster bit-identical to the default (same bytes in shared memory, same wgmma order, same "
    "chunking); cluster_bal within the parity tolerance (different chunking); memcheck 0 errors.")
