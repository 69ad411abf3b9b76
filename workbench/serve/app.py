"""The FastAPI app: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions`` (SSE streaming or not),
vLLM's ``/tokenize``, ``/detokenize`` and ``/tokenizer_info``, ``/health`` and ``/metrics`` (Prometheus text).

Request bodies and responses are the pydantic models of :mod:`workbench.serve.schemas`, so ``/openapi.json``
declares them, error responses included. Every error is OpenAI's ``{"error": {...}}`` body: a body the models refuse
is a 400 naming the fields (never FastAPI's 422); a 405 carries ``Allow``, a 429 ``Retry-After``.

Each response carries per-request speculative-decoding figures in ``meta_info`` (named as SGLang's; a list when
there are several choices): ``prompt_tokens``, ``completion_tokens``, ``spec_verify_ct`` (engine steps that decoded
this request), ``spec_accept_length`` (mean tokens committed per step, the root counted: 1.0 for greedy),
``ttft_s``, ``e2e_latency_s``, ``queue_s`` (time in the admission queue), ``method``; and each choice its
``token_ids`` (the generated ids, as vLLM's ``return_token_ids``). A streamed response sends a choice's
``meta_info`` on its last chunk.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from workbench.serve import schemas as S
from workbench.serve.generation import Run, admit, until_disconnected
from workbench.serve.protocol import ApiError, chat_plan, completion_plan, validation_error
from workbench.serve.scheduler import Scheduler

ERRORS = {400: "Malformed or unsupported request (the message names the fields)",
          401: "Missing or wrong API key", 404: "Unknown model", 429: "The admission queue is full or the wait "
          "bound passed (Retry-After says when to retry)", 500: "The engine failed on this request",
          503: "The server is shutting down"}
SSE = {"text/event-stream": {"schema": {  # one event (OpenAPI 3.1 without itemSchema)
    "type": "object", "required": ["data"], "description": "A server-sent event: a JSON chunk (or an error body), "
                                                          "the last one 'data: [DONE]'",
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}}}}}


def _errors(*codes: int) -> dict:
    return {c: {"model": S.ErrorResponse, "description": ERRORS[c]} for c in codes}


def create_app(scheduler: Scheduler, codec, model_name: str, api_key: str | None = None) -> FastAPI:
    """The app over a started-or-not ``scheduler`` (started at app startup when not running, stopped at
    shutdown if the app started it)."""
    @contextlib.asynccontextmanager
    async def lifespan(app):
        owns = not scheduler.alive
        if owns:
            scheduler.start()
        try:
            yield
        finally:
            if owns:
                await asyncio.to_thread(scheduler.stop)

    app = FastAPI(title="workbench serve", version="1", lifespan=lifespan)
    app.state.scheduler, app.state.codec, app.state.model_name = scheduler, codec, model_name
    batch = scheduler.batch
    method = batch.config.method
    created = int(time.time())
    fields = {"/v1/completions": set(S.CompletionRequest.model_fields),
              "/v1/chat/completions": set(S.ChatCompletionRequest.model_fields)}

    def error(e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(ApiError)
    async def _api_error(request, e: ApiError):
        scheduler.metrics.requests.labels("rejected").inc()
        return error(e)

    @app.exception_handler(RequestValidationError)
    async def _validation(request, e):
        scheduler.metrics.requests.labels("rejected").inc()
        return error(validation_error(list(e.errors()), fields.get(request.url.path)))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, e):
        detail = str(e.detail)
        if e.status_code == 400 and "parsing the body" in detail:  # FastAPI's JSON decode failure
            detail = "the request body is not valid JSON in UTF-8"
        return error(ApiError(e.status_code, detail, headers=getattr(e, "headers", None)))

    def auth(request: Request) -> None:
        """With ``api_key``: ``Authorization: Bearer <key>`` or a 401 (checked before the body)."""
        if api_key is None:
            return
        if request.headers.get("authorization", "") != f"Bearer {api_key}":
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", None,
                           "invalid_api_key")

    guarded = [Depends(auth)]

    @app.get("/health", response_model=S.Health, responses={503: {"model": S.Health, "description": "Stopped"}})
    async def health():
        ok = scheduler.alive
        return JSONResponse({"status": "ok" if ok else "down", **scheduler.snapshot()}, status_code=200 if ok else 503)

    @app.get("/metrics", response_class=PlainTextResponse, responses={200: {
        "description": "Prometheus text exposition format 0.0.4 (workbench.serve.metrics names each metric)",
        "content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def metrics():
        return PlainTextResponse(scheduler.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models", response_model=S.ModelList, dependencies=guarded, responses=_errors(401))
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "workbench", "max_model_len": batch.runner.capacity,
                                            "method": method}]}

    @app.get("/tokenizer_info", response_model=S.TokenizerInfo, dependencies=guarded, responses=_errors(401))
    async def tokenizer_info():
        return {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": codec.eos_token,
                "bos_token": codec.bos_token, "pad_token": None, "chat_template": codec.chat_template,
                "model_max_length": batch.runner.capacity, "vocab_size": codec.vocab_size}

    @app.post("/tokenize", response_model=S.TokenizeResponse, dependencies=guarded,
              responses=_errors(400, 401, 404))
    async def tokenize(body: S.TokenizeRequest):
        check_model(body.model)
        if isinstance(body, S.TokenizeChat):
            text = codec.render_chat([{"role": m.role, "content": m.content if isinstance(m.content, str) else
                                       "".join(p.text for p in m.content or [])} for m in body.messages])
        else:
            text = body.prompt
        ids = codec.tokenizer.encode(text, add_special_tokens=bool(body.add_special_tokens)).ids
        strs = [codec.token_text(t) for t in ids] if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": batch.runner.capacity, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize", response_model=S.DetokenizeResponse, dependencies=guarded,
              responses=_errors(400, 401, 404))
    async def detokenize(body: S.DetokenizeRequest):
        check_model(body.model)
        bad = [t for t in body.tokens if t >= codec.vocab_size]
        if bad:
            raise ApiError(400, f"tokens={bad[:5]!r} are not allowed: token ids in 0..{codec.vocab_size - 1}",
                           "tokens")
        return {"prompt": codec.decode(body.tokens)}

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise ApiError(404, f"the model {name!r} does not exist: this server serves {model_name!r}", "model",
                           "model_not_found")

    async def respond(request: Request, plan, prefix: str):
        """Queue ``plan``, then answer it whole or streamed; a client that leaves meanwhile frees its place or
        row (a stream notices through its response)."""
        gone = asyncio.ensure_future(until_disconnected(request))
        try:
            jobs, early = await admit(scheduler, plan, gone)
            run = Run(scheduler, codec, plan, jobs, early, prefix + uuid.uuid4().hex[:24], model_name)
            if plan.stream:
                gone.cancel()  # the streaming response listens for the disconnect itself
                return StreamingResponse(run.stream(), media_type="text/event-stream")
            try:
                return await run.whole(gone)
            except ApiError as e:
                return error(e)  # failed while decoding (counted by the scheduler as an error, not a rejection)
        finally:
            gone.cancel()

    @app.post("/v1/completions", response_model=S.CompletionResponse, dependencies=guarded,
              responses={200: {"content": SSE}, **_errors(400, 401, 404, 429, 500, 503)})
    async def completions(body: S.CompletionRequest, request: Request):
        return await respond(request, completion_plan(body, model_name, codec), "cmpl-")

    @app.post("/v1/chat/completions", response_model=S.ChatCompletionResponse, dependencies=guarded,
              responses={200: {"content": SSE}, **_errors(400, 401, 404, 429, 500, 503)})
    async def chat(body: S.ChatCompletionRequest, request: Request):
        return await respond(request, chat_plan(body, model_name, codec), "chatcmpl-")

    def openapi() -> dict:
        """The schema without FastAPI's 422 (validation errors are 400 here)."""
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for path in doc.get("paths", {}).values():
                for op in path.values():
                    op.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                doc.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi
    return app
