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
