"""``workbench serve``: an OpenAI-compatible HTTP server over the engine with continuous batching.

Modules: :mod:`~workbench.serve.cli` (the verb; :func:`~workbench.serve.cli.build` makes the model, tokenizer,
engine and scheduler), :mod:`~workbench.serve.app` (FastAPI routes, SSE streaming), :mod:`~workbench.serve.scheduler`
(the one thread that owns the engine), :mod:`~workbench.serve.protocol` (request checks, OpenAI error bodies,
stop strings), :mod:`~workbench.serve.tokenizer` (checkpoint tokenizer, chat template, byte-level fallback),
:mod:`~workbench.serve.metrics` (Prometheus). The continuous batch itself is :class:`workbench.engine.batch.Batch`.
"""
