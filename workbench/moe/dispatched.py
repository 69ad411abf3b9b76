"""Which INT4 MoE path the dispatch runs at M tokens, and the small-M comparison file read by path.

:data:`SMALL_COMPARE` names the measurement (``data/measurements/<gpu>/moe_small_dispatch.json``, written by
``python -m workbench.bench.moe --small-compare``) that times the small-M kernels beside the four-launch path at
M <= 16 in one process; :func:`small_path_rows` reads its rows per path beside the path ``data/dispatch`` names
(:func:`dispatched_label`). The papers' tables (:mod:`workbench.reports.moe_plots`) and the projection's
calibration (:mod:`workbench.projection.calibration`) both read it here.
"""
from __future__ import annotations

from typing import Any

from workbench.dispatch import dispatch_for
from workbench.moe.fused import FOUR_LAUNCH

SMALL_COMPARE = "moe_small_dispatch"   # the small-M kernels beside the four-launch path at M <= 16, one process


def one_launch_paths(small: dict[str, Any]) -> list[str]:
    """Labels of the small-M kernels a comparison timed (its ``paths`` but ``four_launch``)."""
    return [p for p in small["parameters"].get("paths", [FOUR_LAUNCH]) if p != FOUR_LAUNCH]


def dispatched_label(m: int, topk: int, device_name: str) -> str:
    """The comparison-file label of the path data/dispatch names for M tokens on ``device_name``: a small-M kernel's
    name or ``four_launch``."""
    return dispatch_for(device_name).moe_small_kernel(m, topk) or FOUR_LAUNCH


def small_path_rows(small: dict[str, Any], topk: int | None = None) -> list[dict[str, Any]]:
    """Per (routing, M): every timed path's ms and % of copy from one run, the fastest, and the path the dispatch
    of the file's GPU names (:func:`dispatched_label`; its % of copy is None when this file did not time it)."""
    k = topk or small["parameters"]["topk"]
    gpu = small["provenance"].get("gpu", "")
    paths = one_launch_paths(small) + [FOUR_LAUNCH]
    out = []
    for r in sorted(small["results"]["rows"], key=lambda r: (r["routing"], r["m"])):
        row: dict[str, Any] = {"routing": r["routing"], "M": r["m"]}
        timed = {p: r[f"{p}_pct_of_copy"] for p in paths if f"{p}_pct_of_copy" in r}
        for p in paths:
            row[f"{p} ms"] = r.get(f"{p}_ms_median")
            row[f"{p} % copy"] = timed.get(p)
        row["fastest"] = max(timed, key=timed.get)
        d = dispatched_label(r["m"], k, gpu)
        row["dispatched"] = f"four_launch ({r['four_launch_variant']})" if d == FOUR_LAUNCH else d
        row["dispatched % copy"] = timed.get(d)
        same = r.get("dispatched") == d   # queued / in-graph / span columns: only of the dispatched path
        row["dispatched queued % copy"] = r.get(f"{d}_queued_pct_of_copy") if same else None
        row["dispatched in-graph % copy"] = r.get(f"{d}_ingraph_pct_of_copy") if same else None
        row["dispatched span % copy"] = r.get(f"{d}_span_pct_of_copy") if same else None
        out.append(row)
    return out
