"""The FastAPI app: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions`` (SSE streaming or not),
``/health`` and ``/metrics``.

Each response carries per-request speculative-decoding figures in ``meta_info`` (named as SGLang's):
``prompt_tokens``, ``completion_tokens``, ``spec_verify_ct`` (engine steps that decoded this request),
``spec_accept_length`` (mean tokens committed per step, the root counted: 1.0 for greedy), ``ttft_s``,
``e2e_latency_s``, ``method``; and each choice its ``token_ids`` (the generated ids, as vLLM's
``return_token_ids``). A streamed response sends ``meta_info`` on its last chunk.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from workbench.serve.protocol import ApiError, Params, TextStream, chat_params, completion_params
from workbench.serve.scheduler import Job, Scheduler


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

    app = FastAPI(title="workbench serve", lifespan=lifespan)
    app.state.scheduler, app.state.codec, app.state.model_name = scheduler, codec, model_name
    batch = scheduler.batch
    method = batch.config.method
    created = int(time.time())

    @app.exception_handler(ApiError)
    async def _api_error(request, e: ApiError):
        scheduler.metrics.requests.labels("rejected").inc()
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(request, e):
        return JSONResponse(ApiError(400, f"malformed request: {e.errors()}").body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, e):
        return JSONResponse(ApiError(e.status_code, str(e.detail)).body(), status_code=e.status_code)

    def auth(request: Request) -> None:
        if api_key is None:
            return
        h = request.headers.get("authorization", "")
        if h != f"Bearer {api_key}":
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", None,
                           "invalid_api_key")

    async def body_of(request: Request):
        try:
            return json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not valid JSON: {e}") from None

    @app.get("/health")
    async def health():
        ok = scheduler.alive
        return JSONResponse({"status": "ok" if ok else "down", **scheduler.snapshot()}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics():
        return Response(scheduler.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(request: Request):
        auth(request)
        e = batch.runner
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "workbench", "max_model_len": e.capacity,
                                            "method": method}]}

    def limit_tokens(p: Params) -> int:
        if p.max_tokens is not None:
            return p.max_tokens
        room = batch.runner.capacity - len(p.prompt_ids) - batch.config.extra_positions
        return max(1, min(batch.runner.max_generated, room))

    async def run(p: Params, kind: str):
        max_tokens = limit_tokens(p)
        try:
            batch.check(len(p.prompt_ids), max_tokens)
        except ValueError as e:
            raise ApiError(400, str(e), "max_tokens" if len(p.prompt_ids) < batch.runner.capacity else "prompt",
                           "context_length_exceeded") from None
        loop = asyncio.get_running_loop()
        job = Job(p.prompt_ids, max_tokens, loop, asyncio.Queue())
        scheduler.submit(job)
        try:
            ev = await job.events.get()
        except BaseException:
            scheduler.cancel(job)
            raise
        if ev[0] == "rejected":
            raise ApiError(ev[1], ev[2], None, "kv_pool_full" if ev[1] == 429 else None)
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        if p.stream:
            return StreamingResponse(_stream(job, p, kind, rid), media_type="text/event-stream")
        try:
            return await _whole(job, p, kind, rid)
        finally:
            scheduler.cancel(job)  # no-op when done; frees the row if the handler was cancelled

    def meta(job: Job, n: int) -> dict:
        req = job.req
        now = time.perf_counter()
        return {"prompt_tokens": len(job.prompt), "completion_tokens": n, "spec_verify_ct": len(req.steps),
                "spec_accept_length": req.mean_accepted_length if req.steps else None,
                "ttft_s": None if job.first is None else job.first - job.arrived,
                "e2e_latency_s": now - job.arrived, "method": method}

    def usage(job: Job, n: int) -> dict:
        return {"prompt_tokens": len(job.prompt), "completion_tokens": n, "total_tokens": len(job.prompt) + n}

    def choice(kind: str, text: str, ids: list[int], finish, delta: bool, first: bool = False) -> dict:
        c = {"index": 0, "finish_reason": finish, "token_ids": ids}
        if kind == "chat":
            if delta:
                d = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
                c["delta"] = d
            else:
                c["message"] = {"role": "assistant", "content": text}
        else:
            c["text"], c["logprobs"] = text, None
        return c

    def envelope(kind: str, rid: str, chunk: bool) -> dict:
        obj = ("chat.completion" + (".chunk" if chunk else "")) if kind == "chat" else "text_completion"
        return {"id": rid, "object": obj, "created": int(time.time()), "model": model_name}

    async def _events(job: Job, p: Params):
        """(text delta, new ids, finish or None, error or None) per engine event until the request ends."""
        ts = TextStream(codec, p.stop)
        while True:
            ev = await job.events.get()
            if ev[0] == "tokens":
                delta = ts.feed(ev[1])
                if ts.stopped:
                    scheduler.cancel(job, "stop")
                    n = len(ts.ids)
                    yield delta, ev[1], "stop", None, n
                    return
                yield delta, ev[1], None, None, len(ts.ids)
            elif ev[0] == "done":
                finish, error = ev[1], ev[2]
                finish = {"length": "length", "stop": "stop"}.get(finish, finish)
                yield ts.flush(), [], finish, error, len(ts.ids)
                return

    async def _whole(job: Job, p: Params, kind: str, rid: str):
        text, ids, finish, n = "", [], None, 0
        async for delta, new, fin, err, n in _events(job, p):
            text += delta
            ids += new
            if err:  # failed while decoding (counted as an error by the scheduler, not as a rejection)
                e = ApiError(500 if "KVPool" not in err else 429, err, None,
                             "kv_pool_full" if "KVPool" in err else "engine_error")
                return JSONResponse(e.body(), status_code=e.status)
            finish = fin or finish
        return {**envelope(kind, rid, False), "choices": [choice(kind, text, ids, finish, False)],
                "usage": usage(job, n), "meta_info": meta(job, n)}

    async def _stream(job: Job, p: Params, kind: str, rid: str):
        def sse(obj) -> str:
            return f"data: {json.dumps(obj)}\n\n"

        n = 0
        try:
            first = True
            if kind == "chat":
                yield sse({**envelope(kind, rid, True), "choices": [choice(kind, "", [], None, True, True)]})
                first = False
            async for delta, new, fin, err, n in _events(job, p):
                if err:
                    yield sse(ApiError(500 if "KVPool" not in err else 429, err).body())
                    break
                if delta or new or fin:
                    out = {**envelope(kind, rid, True), "choices": [choice(kind, delta, new, fin, True, first)]}
                    first = False
                    if fin:
                        out["meta_info"] = meta(job, n)
                    yield sse(out)
            if p.include_usage:
                yield sse({**envelope(kind, rid, True), "choices": [], "usage": usage(job, n)})
            yield "data: [DONE]\n\n"
        finally:
            scheduler.cancel(job)  # the client left (or we are done): free its row and slots

    @app.post("/v1/completions")
    async def completions(request: Request):
        auth(request)
        return await run(completion_params(await body_of(request), model_name, codec), "completion")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        auth(request)
        return await run(chat_params(await body_of(request), model_name, codec), "chat")

    return app
