"""Measurement code: one module per area; each writes data/measurements/<gpu>/<name>.json with provenance.

The shared helpers (timers, floors, provenance, measurement files) are :mod:`workbench.measure`; what only the
benchmarks use stays here (:mod:`workbench.bench.clocks`, the MoE benchmark's parts ``moe_*``).

One module per area, each ``python -m workbench.bench.<area> --out DIR``: ``ddtree`` (tree kernels, verify attention
with ``verify_peers``), ``moe`` (the INT4 MoE sweep), ``engine`` (the captured step against its floors and peers),
``engine_tp`` (the same over tensor-parallel ranks), ``sweep`` (the context sweep's device plan), ``serve`` (the
server against the engine step), ``acceptance`` (the drafter pipeline on the real target).
"""
