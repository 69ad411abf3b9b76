"""How fast can an SM gather the verify kernel's key tiles? A probe of three ways of issuing the gather.

The tree-verify attention kernel spends about as long per 64-key tile gathering the tile (page-size-1 rows
of 1152 bytes through the slot indices, mostly from L2) as computing on it (paper, block ``verify-tiles``),
and its next step named there is a cheaper gather per SM. The kernels of ``ddtree_gather_probe.cu`` do only
the gather, at the verify kernel's grid (row blocks x chunks, one CTA per SM), by

- ``cp_async``: the verify kernel's way (16-byte ``cp.async``, 18 per thread per tile, every thread issuing),
- ``tma_rows``: the bulk tensor copy, 9 copies of 64 columns per key row (a 2-D tensor map over the KV
  cache, 128-byte swizzle, the layout wgmma reads), issued by one warp and completing on an mbarrier,
- ``bulk_rows``: one non-tensor bulk copy of 1152 bytes per key row (a row-major stage wgmma cannot read
  as the score operand; it measures the cost of one request per row),

each with one tile in flight while a tile is consumed (depth 1, the verify kernel's two stages) or two
(depth 2, three stages: no room left for Q). In the same process it times the verify kernel's own
gather-alone build (``-DVERIFY_WG_DIAG=1``) and its default attention launch, at the same points.

- :func:`check_layouts` - every method and depth gathers fresh random rows with ``check`` on: each thread
  compares what landed with the KV rows in global memory at its method's layout; mismatches counted.
- :func:`probe_point` - in-graph time per call (KV rotated over input sets that together exceed L2) of
  each gather and of the verify launches; bytes moved L2 -> SM and the rate.

``python -m workbench.ddtree.gather_probe --out DIR`` writes ``DIR/ddtree_gather_probe.json`` and prints a
table last. The tensor map is encoded with the driver's ``cuTensorMapEncodeTiled`` (``ctypes``).
"""
from __future__ import annotations

import argparse
import ctypes
import functools
from typing import Any, Sequence

from workbench.ddtree import verify as V

__all__ = ["METHODS", "GATHER_PREDICTION", "encode_row_tensor_map", "gather", "check_layouts", "probe_point",
           "gather_rows_table"]

METHODS = {"cp_async": 0, "tma_rows": 1, "bulk_rows": 2}
DEPTHS = (1, 2)
TILE_KEYS = 64
ROW_BYTES = V.D_KV * 2           # one bf16 key row: 1152 bytes
TILE_BYTES = TILE_KEYS * ROW_BYTES

GATHER_PREDICTION = (
    "Written before the first run (code of this commit): cp_async at depth 1 reproduces the verify kernel's "
    "gather-alone build within 10% (about 1.7-1.9 us per tile, 5-6 TB/s L2 -> SMs over the grid). Depth 2 "
    "(two tiles in flight) is 1.3-1.7x faster per tile for cp_async if a tile's gather is bound by its round "
    "trip rather than by the L2 fabric. tma_rows (9 requests of 128 bytes per row from one warp) is no faster "
    "than cp_async at the same depth (FlashInfer's maintainers report TMA short of bandwidth for page-size-1 "
    "rows); bulk_rows (one request per row) 1.2-1.5x faster than cp_async. If neither bulk form beats cp_async "
    "by 20% at depth 1, a TMA gather is not the verify kernel's next step.")


def encode_row_tensor_map(kv: Any) -> Any:
    """A ``CUtensorMap`` (128 bytes, in a uint8 CUDA tensor) over ``kv`` [S, >= 576] bf16: 2-D, box of
    64 columns x 1 row, 128-byte swizzle, 128-byte L2 promotion; encoded with the driver's
    ``cuTensorMapEncodeTiled``. The map holds ``kv``'s address: keep ``kv`` alive while it is used."""
    import numpy as np
    import torch

    if kv.dtype != torch.bfloat16 or kv.dim() != 2 or kv.shape[1] < V.D_KV or kv.stride(1) != 1:
        raise ValueError(f"kv must be a bf16 [S, >= {V.D_KV}] tensor with unit column stride, got "
                         f"{tuple(kv.shape)} {kv.dtype} strides {kv.stride()}")
    if (kv.stride(0) * 2) % 16 or kv.data_ptr() % 16:
        raise ValueError("kv's row stride and address must be multiples of 16 bytes for a tensor map")
    from workbench.kernels import KernelUnavailable, libcuda

    try:
        fn = libcuda().cuTensorMapEncodeTiled
    except (OSError, AttributeError) as e:
        raise KernelUnavailable(f"the driver's cuTensorMapEncodeTiled is not available: {e}") from e
    fn.restype = ctypes.c_int
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    buf = np.zeros(128 + 64, dtype=np.uint8)
    off = (-buf.ctypes.data) % 64                        # CUtensorMap is 64-byte aligned
    ptr = ctypes.c_void_p(buf.ctypes.data + off)
    dims = (u64 * 2)(V.D_KV, kv.shape[0])
    strides = (u64 * 1)(kv.stride(0) * 2)
    box = (u32 * 2)(64, 1)
    estr = (u32 * 2)(1, 1)
    # dtype BFLOAT16 = 9, rank 2, interleave NONE = 0, swizzle 128B = 3, L2 promotion 128B = 2, OOB fill NONE = 0
    rc = fn(ptr, 9, 2, ctypes.c_void_p(kv.data_ptr()), dims, strides, box, estr, 0, 3, 2, 0)
    if rc != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {rc}")
    return torch.from_numpy(buf[off:off + 128].copy()).to(kv.device)


_KERNELS: dict[tuple[int, int], Any] = {}


def _kernel(method: int, depth: int) -> Any:
    k = _KERNELS.get((method, depth))
    if k is None:
        from workbench.kernels import get_kernel

        k = get_kernel("ddtree_gather_probe", f"ddtree_gather_m{method}_d{depth}")
        k.max_dynamic_shared_size_bytes = _smem(depth)
        _KERNELS[(method, depth)] = k
    return k


@functools.lru_cache(maxsize=None)
def _unused_word(device: str) -> Any:
    """An int32 [1] CUDA tensor for the kernel's check-counter argument when the check is off (and the tensor-map
    argument of the cp.async and bulk methods): made once per device, outside any graph capture, so a timed gather
    is one kernel node (a tensor made per call would put a fill kernel into every captured call)."""
    import torch

    return torch.zeros(1, dtype=torch.int32, device=device)


def _smem(depth: int) -> int:
    return (depth + 1) * TILE_BYTES + 1024


def _grid(heads: int, prefix: int, nodes: int) -> tuple[int, int, int]:
    """(row blocks, chunk length, chunks) of the verify kernel's plan for one request (chunks over the
    prefix only: the probe gathers prefix rows)."""
    rb, clen, _ = V._plan(prefix, 1, nodes, nodes * heads, V._MMA_ROWS, V._num_sms("cuda"), None)
    return rb, clen, -(-prefix // clen)


def gather(kv: Any, slots: Any, row_blocks: int, chunk_len: int, method: str, depth: int, *, tmap: Any = None,
           err: Any = None) -> None:
    """Launch one gather (``method`` a key of :data:`METHODS`, ``depth`` 1 or 2) over ``slots`` [P] int64
    of ``kv`` [S, 576] bf16, grid (``row_blocks``, ceil(P / ``chunk_len``)). ``tmap``
    (:func:`encode_row_tensor_map` of ``kv``) is needed for ``tma_rows``; ``err`` (a uint32/int32 CUDA
    tensor [1]) turns on the in-kernel check, which adds each mismatching 16-byte chunk to ``err[0]``."""
    import numpy as np

    from workbench.kernels import launch

    if method not in METHODS:
        raise ValueError(f"method must be one of {sorted(METHODS)}, got {method!r}")
    if depth not in DEPTHS:
        raise ValueError(f"depth must be one of {DEPTHS}, got {depth!r}")
    if method == "tma_rows" and tmap is None:
        raise ValueError("tma_rows needs tmap=encode_row_tensor_map(kv)")
    P = int(slots.shape[0])
    if P < 1 or chunk_len < 1 or row_blocks < 1:
        raise ValueError(f"need P >= 1, chunk_len >= 1, row_blocks >= 1; got {P}, {chunk_len}, {row_blocks}")
    dummy = err if err is not None else _unused_word(str(kv.device))
    launch(_kernel(METHODS[method], depth), (row_blocks, -(-P // chunk_len)), 256,
           (kv, np.int64(kv.stride(0)), slots, P, chunk_len, tmap if tmap is not None else dummy, err is not None, dummy),
           shared_mem=_smem(depth))


def check_layouts(prefix: int = 5000, heads: int = 8, nodes: int = 33, seed: int = 1) -> dict[str, int]:
    """Mismatching 16-byte chunks per ``method/depth`` over one gather of fresh random rows with the
    in-kernel check on (0 = every landed tile equals the KV rows at the method's layout)."""
    import torch

    st = V.random_verify_inputs(nodes, heads, prefix, torch.bfloat16, "cuda", seed=seed)
    kv, slots = st["kv_cache"], st["prefix_slots"]
    tmap = encode_row_tensor_map(kv)
    rb, clen, _ = _grid(heads, prefix, nodes)
    out = {}
    for m in METHODS:
        for d in DEPTHS:
            err = torch.zeros(1, dtype=torch.int32, device="cuda")
            gather(kv, slots, rb, clen, m, d, tmap=tmap, err=err)
            out[f"{m}/d{d}"] = int(err.item())
    return out


def probe_point(heads: int, prefix: int, nodes: int = 33, reps: int = 20, seed: int = 0) -> dict[str, Any]:
    """In-graph ms per call (medians and samples; KV rotated over input sets) of every gather and of the
    verify kernel's gather-alone build and default attention launch at (heads, prefix)."""
    from workbench.ddtree.verify_probe import _input_sets, record_launches
    from workbench.kernels import launch
    from workbench.measure import median, time_in_graph

    sets = _input_sets(heads, prefix, nodes, seed)
    tmaps = [encode_row_tensor_map(s["kv_cache"]) for s in sets]
    _unused_word(str(sets[0]["kv_cache"].device))   # made here, before any capture
    rb, clen, chunks = _grid(heads, prefix, nodes)
    ctas = rb * chunks
    tiles_total = rb * sum(-(-min(clen, prefix - g * clen) // TILE_KEYS) for g in range(chunks))
    res: dict[str, Any] = {"heads": heads, "prefix": prefix, "nodes": nodes, "row_blocks": rb, "chunk_len": clen,
                           "chunks": chunks, "ctas": ctas, "tiles_per_cta_max": -(-clen // TILE_KEYS),
                           "tiles_total": tiles_total, "l2_to_sm_bytes": tiles_total * TILE_BYTES,
                           "dram_bytes": prefix * ROW_BYTES, "kv_sets": len(sets), "paths": {}, "samples": {}}

    def timed(name: str, fns: list) -> None:
        s, calls = time_in_graph(fns, reps, min_calls=16)
        res["paths"][name] = {"ms": median(s), "calls_per_graph": calls}
        res["samples"][name] = s

    for m in METHODS:
        for d in DEPTHS:
            timed(f"{m}/d{d}", [lambda st=st, t=t, m=m, d=d: gather(st["kv_cache"], st["prefix_slots"], rb, clen, m, d,
                                                                     tmap=t) for st, t in zip(sets, tmaps)])
    for name, opts in (("verify_diag_gather", ("-DVERIFY_WG_DIAG=1",)), ("verify_attention", ())):
        recs = [record_launches(st, impl="wgmma", _options=opts)["attention"] for st in sets]
        timed(name, [lambda r=r: launch(r[0], r[1], r[2], r[3], shared_mem=r[4]) for r in recs])
    for p in res["paths"].values():
        p["us_per_tile"] = p["ms"] * 1e3 / res["tiles_per_cta_max"]
        p["l2_to_sm_tb_s"] = res["l2_to_sm_bytes"] / (p["ms"] * 1e-3) / 1e12
    return res


def gather_rows_table(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (point, path): ms, us per tile, L2 -> SM TB/s, ratio to cp_async at depth 1."""
    rows = []
    for pt in results["points"]:
        base = pt["paths"].get("cp_async/d1", {}).get("ms")
        for name, p in pt["paths"].items():
            rows.append({"H": pt["heads"], "prefix": pt["prefix"], "grid": f"{pt['row_blocks']} x {pt['chunks']}",
                         "tiles per CTA": pt["tiles_per_cta_max"], "path": name, "in-graph us": round(p["ms"] * 1e3, 1),
                         "us per tile": round(p["us_per_tile"], 2), "L2 -> SM TB/s": round(p["l2_to_sm_tb_s"], 2),
                         "cp_async d1 / path": round(base / p["ms"], 2) if base else "-"})
    return rows


NOTES = (
    "Gather probe (workbench/ddtree/gather_probe.py, kernels ddtree_gather_probe.cu): only the verify kernel's key-tile "
    "gather, at its grid (row blocks x chunks of the planner, chunks over the prefix only, 256 threads, one CTA per SM), by "
    "cp.async (the verify kernel's way), TMA 64-column x 1-row boxes with the 128-byte swizzle (9 per row, one warp "
    "issuing, mbarrier), or one 1152-byte bulk copy per row (row-major stage), at 1 or 2 tiles in flight; "
    "verify_diag_gather / verify_attention: the verify kernel's -DVERIFY_WG_DIAG=1 build and default attention launch at "
    "the same point. In-graph time per call (time_in_graph, KV rotated over input sets that together exceed L2); "
    "l2_to_sm_bytes = tiles gathered x 73728 (every row block reads every row); us per tile = time / tiles per CTA. "
    "layout_check: mismatching 16-byte chunks per method/depth, in-kernel compare with the KV rows (0 = correct).")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.ddtree.gather_probe", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for the JSON (default: data/measurements/<gpu>)")
    ap.add_argument("--points", nargs="+", default=["8:131072", "64:131072", "8:16384", "64:16384"], help="H:P")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--name", default="ddtree_gather_probe")
    args = ap.parse_args(argv)

    from workbench.kernels import require_gpu
    from workbench.measure import write_measurement
    from workbench.papers import markdown_table

    require_gpu("gather_probe")
    results: dict[str, Any] = {"prediction": GATHER_PREDICTION, "layout_check": check_layouts(), "points": []}
    print("layout check (mismatching chunks):", results["layout_check"], flush=True)
    samples = {}
    for spec in args.points:
        H, P = (int(x) for x in spec.split(":"))
        pt = probe_point(H, P, reps=args.reps)
        samples[f"H{H}_P{P}"] = pt.pop("samples")
        results["points"].append(pt)
        print(markdown_table(gather_rows_table({"points": [pt]})), flush=True)
    path = write_measurement(args.name, out_dir=args.out, parameters=dict(points=args.points, reps=args.reps),
                             results=results, samples=samples, notes=NOTES)
    print(f"wrote {path}")
    print(markdown_table(gather_rows_table(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
