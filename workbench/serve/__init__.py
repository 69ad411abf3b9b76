"""``workbench serve``: an OpenAI-compatible HTTP server over the engine with continuous batching.

Modules: :mod:`~workbench.serve.cli` (the verb; :func:`~workbench.serve.cli.build` makes the model, tokenizer,
engine and scheduler), :mod:`~workbench.serve.app` (FastAPI routes), :mod:`~workbench.serve.schemas` (the pydantic
request and response models: the OpenAPI contract), :mod:`~workbench.serve.protocol` (a validated request as
choices with their sampling, OpenAI error bodies, stop strings), :mod:`~workbench.serve.generation` (one request's
run: queued, then answered whole or as server-sent events), :mod:`~workbench.serve.logprobs` (log-probs in OpenAI's
shapes), :mod:`~workbench.serve.scheduler` (the one thread that owns the engine, and the admission queue),
:mod:`~workbench.serve.tokenizer` (checkpoint tokenizer, chat template, byte-level fallback),
:mod:`~workbench.serve.metrics` (Prometheus). The continuous batch itself is :class:`workbench.engine.batch.Batch`.
"""
