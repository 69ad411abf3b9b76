"""One completion or chat request's run: its choices (:class:`~workbench.serve.protocol.Plan`) queued as scheduler
jobs, then answered whole (one JSON body) or streamed (server-sent events, one chunk per engine event and choice).

:func:`admit` checks every choice against what the engine can ever run (400), queues them together and waits until
all are admitted (or raises the queue's 429 with ``Retry-After``); :class:`Run` then turns the jobs' events into
OpenAI's response bodies: text (stop strings applied per choice), ``token_ids``, log-probs where asked
(:mod:`workbench.serve.logprobs`), ``usage`` and SGLang's ``meta_info``.
"""
from __future__ import annotations

import asyncio
import json
import time

from workbench.serve.logprobs import Offsets, chat_logprobs, completion_logprobs, merge_completion_logprobs
from workbench.serve.protocol import ApiError, Plan, TextStream
from workbench.serve.scheduler import Job, Scheduler


CLIENT_GONE = 499  # nginx's "client closed request": the status of a response nobody will read


async def until_disconnected(request) -> None:
    """Returns when the client of ``request`` (whose body has been read) disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _next(events: asyncio.Queue, gone: asyncio.Future | None) -> tuple:
    """The next event, or :class:`ApiError` 499 once ``gone`` (the client left) is done."""
    if gone is None:
        return await events.get()
    get = asyncio.ensure_future(events.get())
    done, _ = await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
    if get in done:
        return get.result()
    get.cancel()
    raise ApiError(CLIENT_GONE, "the client closed the connection")


def _limit(scheduler: Scheduler, plan: Plan, prompt_len: int) -> int:
    """The choice's max_tokens: the plan's, or (chat without one) up to the context's end."""
    if plan.max_tokens is not None:
        return plan.max_tokens
    b = scheduler.batch
    room = b.runner.capacity - prompt_len - b.config.extra_slots(b.runner.vocab_size)
    return max(1, min(b.runner.max_generated, room))


async def admit(scheduler: Scheduler, plan: Plan, gone: asyncio.Future | None = None
                ) -> tuple[list[Job], list[tuple]]:
    """Queue ``plan``'s choices and wait until every one is admitted; returns the jobs and the events that came
    meanwhile. 400 for a choice that can never run, 429 (with Retry-After) when the queue refuses one; ``gone``
    (done when the client leaves) takes the jobs out of the queue."""
    b = scheduler.batch
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    if len(plan.choices) > scheduler.max_queue:
        raise ApiError(400, f"n={plan.n} is not allowed: {len(plan.choices)} choices (prompts x n) exceed the "
                            f"admission queue's {scheduler.max_queue} sequences", "n")
    jobs = []
    for c in plan.choices:
        mt = _limit(scheduler, plan, len(c.prompt))
        try:
            b.check(len(c.prompt), mt)
        except ValueError as e:
            raise ApiError(400, str(e), "max_tokens" if len(c.prompt) < b.runner.capacity else "prompt",
                           "context_length_exceeded") from None
        jobs.append(Job(c.prompt, mt, loop, events, c.sampling, c.index))
    scheduler.submit(jobs)
    waiting, early = {j.index for j in jobs}, []
    try:
        while waiting:
            ev = await _next(events, gone)
            if ev[1] == "admitted":
                waiting.discard(ev[0])
            elif ev[1] == "rejected":
                status, message, retry = ev[2], ev[3], ev[4]
                raise ApiError(status, message, None, "queue_full" if status == 429 else None,
                               headers={"Retry-After": str(retry)} if retry else None)
            else:
                early.append(ev)
    except BaseException:
        for j in jobs:
            scheduler.cancel(j)
        raise
    return jobs, early


class _Choice:
    """One choice's progress: its text stream, what was answered so far, and how it ended."""

    def __init__(self, job: Job, plan: Plan, codec):
        self.job, self.plan, self.codec = job, plan, codec
        self.text = TextStream(codec, plan.stop)
        self.finish: str | None = None
        self.error: str | None = None
        self.started = False
        self.offsets = Offsets()
        self.n = 0  # generated tokens answered

    def prompt_part(self) -> tuple[str, dict | None]:
        """With echo, on the first output: the prompt's text and its log-probs."""
        if not self.plan.echo or self.started:
            return "", None
        text = self.codec.decode(self.job.prompt)
        lp = None
        if self.plan.logprobs is not None:
            r = self.job.req
            lp = completion_logprobs(self.codec, self.job.prompt, r.prompt_logprobs, r.prompt_top_logprobs,
                                     self.offsets)
        self.offsets.at = len(text)
        return text, lp

    def logprobs(self, ids: list[int], start: int):
        """The log-probs of generated ``ids`` (the first at ``start``) in the endpoint's shape."""
        r = self.job.req
        lps, tops = r.logprobs[start:start + len(ids)], r.top_logprobs[start:start + len(ids)]
        if self.plan.kind == "chat":
            return chat_logprobs(self.codec, ids, lps, tops)
        return completion_logprobs(self.codec, ids, lps, tops, self.offsets)


class Run:
    """The events of an admitted request's jobs as response bodies (module docstring)."""

    def __init__(self, scheduler: Scheduler, codec, plan: Plan, jobs: list[Job], early: list[tuple], rid: str,
                 model_name: str):
        self.scheduler, self.codec, self.plan, self.rid, self.model = scheduler, codec, plan, rid, model_name
        self.jobs = jobs
        self.choices = {j.index: _Choice(j, plan, codec) for j in jobs}
        self.early = early
        self.events = jobs[0].events

    def cancel(self) -> None:
        for j in self.jobs:
            self.scheduler.cancel(j)  # no-op for jobs already done

    async def updates(self, gone: asyncio.Future | None = None):
        """(choice, text, ids, logprobs, finish) per event until every choice has ended; an engine error raises
        :class:`ApiError` (500, or 429 for a pool that ran dry)."""
        open_ = set(self.choices)
        pending = list(self.early)
        while open_:
            ev = pending.pop(0) if pending else await _next(self.events, gone)
            c = self.choices.get(ev[0])
            if c is None or c.finish is not None:
                continue
            if ev[1] == "tokens":
                ids, start = ev[2], ev[3]
                prefix, plp = c.prompt_part()
                c.started = True
                if self.plan.drop_generated:
                    text, ids, lp = prefix, [], plp
                else:
                    delta = c.text.feed(ids)
                    lp = c.logprobs(ids, start) if self.plan.logprobs is not None else None
                    if lp is not None and self.plan.kind == "completion":
                        lp = merge_completion_logprobs(plp, lp)
                    text = prefix + delta
                    c.n += len(ids)
                if c.text.stopped:
                    c.finish = "stop"
                    self.scheduler.cancel(c.job, "stop")
                    open_.discard(c.job.index)
                yield c, text, ids, lp, c.finish
            elif ev[1] == "done":
                finish, error = ev[2], ev[3]
                if error:
                    raise ApiError(429 if "KVPool" in error else 500, error, None,
                                   "kv_pool_full" if "KVPool" in error else "engine_error")
                c.finish = "stop" if finish == "stop" else "length"
                open_.discard(c.job.index)
                prefix, plp = c.prompt_part()
                c.started = True
                text = prefix + ("" if self.plan.drop_generated else c.text.flush())
                yield c, text, [], plp, c.finish

    # -- bodies ---------------------------------------------------------------------------------------------------
    def envelope(self, chunk: bool) -> dict:
        kind = self.plan.kind
        obj = ("chat.completion" + (".chunk" if chunk else "")) if kind == "chat" else "text_completion"
        return {"id": self.rid, "object": obj, "created": int(time.time()), "model": self.model}

    def meta(self, c: _Choice) -> dict:
        req, job = c.job.req, c.job
        return {"prompt_tokens": len(job.prompt), "completion_tokens": c.n, "spec_verify_ct": len(req.steps),
                "spec_accept_length": req.mean_accepted_length if req.steps else None,
                "ttft_s": None if job.first is None else job.first - job.arrived,
                "e2e_latency_s": time.perf_counter() - job.arrived,
                "queue_s": None if job.admitted is None else job.admitted - (job.queued or job.arrived),
                "method": self.scheduler.batch.config.method}

    def metas(self):
        m = [self.meta(self.choices[i]) for i in sorted(self.choices)]
        return m[0] if len(m) == 1 else m

    def usage(self) -> dict:
        prompt = sum(len(c.job.prompt) for i, c in self.choices.items() if i % self.plan.n == 0)
        done = sum(c.n for c in self.choices.values())
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}

    def _choice(self, c: _Choice, text: str, ids: list[int], lp, finish, delta: bool, first: bool = False) -> dict:
        out = {"index": c.job.index, "finish_reason": finish, "token_ids": ids}
        if self.plan.kind == "chat":
            if delta:
                out["delta"] = {"role": "assistant", "content": text} if first else (
                    {"content": text} if text else {})
            else:
                out["message"] = {"role": "assistant", "content": text}
            out["logprobs"] = None if lp is None else {"content": lp}
        else:
            out["text"], out["logprobs"] = text, lp
        return out

    async def whole(self, gone: asyncio.Future | None = None) -> dict:
        """The non-streamed body (:class:`ApiError` 499 when ``gone``: the client left, its jobs are cancelled)."""
        acc = {i: {"text": "", "ids": [], "lp": None} for i in self.choices}
        try:
            async for c, text, ids, lp, finish in self.updates(gone):
                a = acc[c.job.index]
                a["text"] += text
                a["ids"] += ids
                if lp is not None:
                    a["lp"] = lp if a["lp"] is None else (a["lp"] + lp if self.plan.kind == "chat"
                                                         else merge_completion_logprobs(a["lp"], lp))
        finally:
            self.cancel()
        want_lp = self.plan.logprobs is not None
        choices = []
        for i in sorted(self.choices):
            c, a = self.choices[i], acc[i]
            lp = a["lp"] if a["lp"] is not None else (([] if self.plan.kind == "chat" else
                                                       {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                                        "text_offset": []}) if want_lp else None)
            choices.append(self._choice(c, a["text"], a["ids"], lp, c.finish, False))
        return {**self.envelope(False), "choices": choices, "usage": self.usage(), "meta_info": self.metas()}

    async def stream(self):
        """The server-sent events: chunks, a usage chunk when asked, ``[DONE]``."""
        def sse(obj) -> str:
            return f"data: {json.dumps(obj)}\n\n"

        try:
            if self.plan.kind == "chat":
                for i in sorted(self.choices):
                    yield sse({**self.envelope(True),
                               "choices": [self._choice(self.choices[i], "", [], None, None, True, True)]})
            try:
                async for c, text, ids, lp, finish in self.updates():
                    if not (text or ids or finish):
                        continue
                    out = {**self.envelope(True), "choices": [self._choice(c, text, ids, lp, finish, True)]}
                    if finish:
                        out["meta_info"] = self.meta(c)
                    yield sse(out)
            except ApiError as e:
                yield sse(e.body())
                return
            if self.plan.include_usage:
                yield sse({**self.envelope(True), "choices": [], "usage": self.usage()})
            yield "data: [DONE]\n\n"
        finally:
            self.cancel()  # the client left (or we are done): free the rows and slots
