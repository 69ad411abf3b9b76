"""Measurement code: one module per area; each writes data/measurements/<gpu>/<name>.json with provenance.

The shared helpers (timers, floors, provenance, measurement files) are :mod:`workbench.measure`; what only the
benchmarks use stays here (:mod:`workbench.bench.clocks`, the MoE benchmark's parts ``moe_*``)."""
