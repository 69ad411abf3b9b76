"""Measurement code: one module per area; each writes data/measurements/<gpu>/<name>.json with provenance."""
