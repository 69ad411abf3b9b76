"""CPU model of the cluster variant of the tree-verify kernel (``impl="cluster"``; NOT YET RUN ON A GPU).

``ddtree_verify_wgmma_cluster_bf16`` (``workbench/kernels/ddtree_verify.cu``) runs the default wgmma
kernel's body in thread-block clusters of two CTAs. Its grid is 1-D: CTA ``blk`` works on row block
``blk % row_blocks`` of chunk ``blk // row_blocks`` (row block fastest), the count rounded up to an even
number (``__cluster_dims__(2, 1, 1)`` needs that); a CTA past the last chunk returns at once. The
two CTAs of a cluster (``blk`` and ``blk ^ 1``) *share* when they hold the same chunk: each then gathers
32 of the 64 keys of every tile from L2 and copies them into the partner's shared memory. Otherwise
(different chunks: with an odd number of row blocks one CTA per chunk pairs with a neighbouring chunk's)
each runs the default's loop alone.

This module states that arithmetic in Python, so the kernel's mapping can be checked on a CPU:

- :func:`cluster_grid` - the launch grid (CTAs) for ``row_blocks`` x ``chunks``.
- :func:`cluster_plan` - every CTA's (row block, chunk, mode) and the L2 tile reads per tile step.
- :func:`half_gather_map` - which (key, 16-byte chunk) of a tile each thread of a sharing CTA gathers.
"""
from __future__ import annotations

from typing import Any

__all__ = ["cluster_grid", "cluster_plan", "half_gather_map", "ROW_CHUNKS", "TILE_KEYS"]

TILE_KEYS = 64    # keys per tile (MMA_KEYS)
ROW_CHUNKS = 72   # 16-byte chunks of a 576-value bf16 KV row
THREADS = 256


def _check(name: str, v: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    return v


def cluster_grid(row_blocks: int, chunks: int) -> int:
    """CTAs launched by ``impl="cluster"``: ``row_blocks * chunks`` rounded up to even (a multiple of the
    cluster size 2). ``chunks`` may be an upper bound (batched requests): CTAs past the real count return."""
    n = _check("row_blocks", row_blocks) * _check("chunks", chunks)
    return n + (n & 1)


def cluster_plan(row_blocks: int, chunks: int) -> dict[str, Any]:
    """The kernel's CTA -> work mapping, as the kernel computes it.

    Returns ``{"grid", "ctas", "shared_ctas", "solo_ctas", "idle_ctas", "l2_tile_reads",
    "default_l2_tile_reads", "l2_ratio"}``; ``ctas`` is a list of dicts ``{blk, cluster, rank, row_block,
    chunk, mode}`` with mode ``"shared"`` (gathers half of each tile, copies it to the partner),
    ``"solo"`` (gathers whole tiles, as the default) or ``"idle"`` (past the last chunk: returns).
    ``l2_tile_reads``: whole-tile L2 reads per tile step over the grid (a sharing pair counts 1, a solo
    CTA 1); the default kernel reads ``row_blocks * chunks``.
    """
    grid = cluster_grid(row_blocks, chunks)
    ctas = []
    for blk in range(grid):
        g, r = divmod(blk, row_blocks)
        valid = g < chunks
        shared = valid and ((blk ^ 1) // row_blocks == g)
        ctas.append(dict(blk=blk, cluster=blk >> 1, rank=blk & 1, row_block=r, chunk=g,
                         mode="shared" if shared else ("solo" if valid else "idle")))
    n_shared = sum(c["mode"] == "shared" for c in ctas)
    n_solo = sum(c["mode"] == "solo" for c in ctas)
    reads = n_shared / 2 + n_solo
    return dict(grid=grid, ctas=ctas, shared_ctas=n_shared, solo_ctas=n_solo, idle_ctas=grid - n_shared - n_solo,
                l2_tile_reads=reads, default_l2_tile_reads=row_blocks * chunks,
                l2_ratio=reads / (row_blocks * chunks))


def half_gather_map(rank: int) -> list[tuple[int, int, int]]:
    """(thread, key within the tile, 16-byte chunk of the row) for every ``cp.async`` a sharing CTA of
    cluster rank ``rank`` (0 or 1) issues per tile: keys ``32 * rank + (tid >> 3)``, chunks
    ``(tid & 7) + 8 * i`` for i < 9 (the kernel's ``gather_half``; ``push_half`` copies the same
    chunks to the partner)."""
    if rank not in (0, 1):
        raise ValueError(f"rank must be 0 or 1 (cluster of two CTAs), got {rank!r}")
    return [(tid, 32 * rank + (tid >> 3), (tid & 7) + 8 * i) for tid in range(THREADS) for i in range(9)]


# Written before any run of the cluster kernel (this session had no device time). The figures it starts
# from are committed: data/measurements/h200/ddtree_verify.json and ddtree_verify_probe.json (0929e2e) and
# papers/ddtree_kernels.md section 3, block verify-tiles.
PREDICTION = (
    "PREDICTION for impl='cluster' (written before any GPU run, code as committed; the next session's first "
    "device call measures it). Evidence (0929e2e, same-process probe): a 64-key tile costs 2.61 us (H=8) / 2.57 us "
    "(H=64); the gathers alone 1.71 / 1.94 us, drawing 5.7 / 5.0 TB/s from L2 across the GPU (about what an "
    "H100-class L2 delivers, so the gathers look bound by the aggregate L2 -> SM rate, not by one SM); the "
    "compute alone 1.74 us. The cluster variant halves the L2 reads of a sharing CTA (73.7 -> 36.9 KB per tile) "
    "and adds 36.9 KB per tile over the SM-to-SM network (9 x (ld.shared.v4 + mapa + st.shared::cluster.v4) per "
    "thread, under the P.V) and a cluster barrier per tile instead of __syncthreads (about +0.1 us per tile). "
    "The unknown is the distributed-shared-memory rate: if it is near shared-memory rates, the gathers-and-copies "
    "alone (variant cluster_diag_gather) take 0.9-1.2 us per tile and a tile 2.0-2.2 us; if it is as low as "
    "published H100 microbenchmarks suggest (about 3.3 TB/s for the whole GPU, 25 GB/s per SM: 1.5 us for 36.9 "
    "KB), a tile stays at 2.4-2.6 us. Point predictions (cluster / default, same process): T=32 H=64 (32 row "
    "blocks, every CTA shares) 16k 0.88x, 128k 0.85x (range 0.75-1.00); T=33 H=64 (33 row blocks: 4 of 132 CTAs "
    "run solo and may set the end) 64k/128k 0.93x (0.85-1.02), 4k/16k 0.97x (0.90-1.03); T=33 H=8 (5 row blocks: "
    "26 of 130 CTAs solo; L2 reads 0.6x) 64k/128k 0.93x (0.85-1.02), 4k/16k 1.00x (0.95-1.05: 3-10 tiles, the "
    "fixed part dominates and the cluster adds a barrier and one copy before the first tile). Per tile "
    "(probe, (128k - 16k) / tiles): cluster 2.1 us (1.9-2.6) where the default takes 2.6; cluster_diag_gather "
    "1.1 us (0.8-1.6) where diag_gather takes 1.7-1.9. If the solo CTAs do not speed up with the lighter L2 "
    "load, the T=33 points come out at 0.98-1.02x while T=32 shows the gain: that split is the test of the "
    "straggler question. Correctness: bit-identical to the default (same bytes in shared memory, same wgmma "
    "order), memcheck 0 errors.")
