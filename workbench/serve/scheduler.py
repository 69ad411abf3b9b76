"""The scheduler: ONE thread owns the engine and runs one batched step at a time.

HTTP handlers (on the asyncio loop) :meth:`Scheduler.submit` a :class:`Job` and read its events from an
``asyncio.Queue``; they :meth:`Scheduler.cancel` it when the client leaves or a stop string ends it. Between two
steps the thread retires cancelled jobs (their KV slots go back to the pool at once), admits waiting jobs while a
row is free, runs :meth:`Batch.prefill` (posting the first tokens of prompts now complete) and
:meth:`Batch.decode` (one batched engine step) and posts each job's new tokens.

Admission: a job waits in a bounded FIFO queue (``max_queue`` jobs, ``max_queue_wait`` seconds) until a row is free
and its worst-case KV slots (:meth:`Batch.worst_case`) can be reserved beside the admitted requests'; jobs are
admitted in arrival order (the head waits for room, the ones behind it wait for the head) as others finish. A job
that finds the queue full, or waits past the bound, gets 429 with a ``Retry-After``; one that can never fit (beyond
the context or the whole pool) 400. Because every admitted request's worst case is reserved, no request runs out
of slots while decoding (should the engine flag it anyway, that request alone ends with an error event; the others
continue).

Events (tuples) on ``job.events``, each led by the job's ``index`` (the jobs of one HTTP request share one queue):
``(i, "admitted")``, ``(i, "tokens", ids, start)`` (``start``: the index of ``ids[0]`` among the request's generated
tokens, where its log-probabilities are in ``job.req``), ``(i, "done", finish, error)`` or, before admission,
``(i, "rejected", status, message, retry_after_s)``.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import threading
import time

from workbench.engine.batch import Batch, Request
from workbench.engine.kv_device import KVPoolFull
from workbench.engine.request import SamplingParams
from workbench.serve.metrics import Metrics

log = logging.getLogger("workbench.serve")


@dataclasses.dataclass(eq=False)
class Job:
    """One sequence to generate for a handler: its prompt, limit and sampling; ``index``: its choice in the
    response (the tag on its events)."""

    prompt: list[int]
    max_tokens: int
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    sampling: SamplingParams | None = None
    index: int = 0
    arrived: float = dataclasses.field(default_factory=time.perf_counter)
    queued: float | None = None  # when it entered the queue
    admitted: float | None = None
    cancelled: bool = False
    finish: str | None = None  # why the client side ended it (e.g. "stop" for a stop string)
    req: Request | None = None
    first: float | None = None
    last: float | None = None

    def post(self, *event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (self.index, *event))
        except RuntimeError:  # the handler's event loop is closed (server shut down): nobody to tell
            pass


class Scheduler:
    """Runs ``batch`` in a thread of its own (module docstring). ``max_queue``: jobs that may wait for admission;
    ``max_queue_wait``: seconds a job may wait before it is refused (429)."""

    def __init__(self, batch: Batch, metrics: Metrics | None = None, max_queue: int = 256,
                 max_queue_wait: float = 60.0):
        self.batch, self.metrics = batch, metrics or Metrics()
        self.max_queue, self.max_queue_wait = max_queue, max_queue_wait
        self._cv = threading.Condition()
        self._waiting: collections.deque[Job] = collections.deque()
        self._jobs: dict[Request, Job] = {}
        self._cancels: list[Job] = []
        self._stop = False
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.failure: str | None = None
        self._blocked = False  # the queue's head did not fit at the last boundary
        self._service_s = 1.0  # running mean of a request's time from admission to its end (for Retry-After)
        self._gauges()

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> "Scheduler":
        self._thread = threading.Thread(target=self._run, name="workbench-scheduler", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- from the handlers (any thread) -------------------------------------------
    def submit(self, jobs: list[Job]) -> bool:
        """Queue ``jobs`` (one HTTP request's, together); False (and a 429 "rejected" event to each) when the queue
        has no room for all of them."""
        with self._cv:
            if len(self._waiting) + len(jobs) > self.max_queue:
                msg = (f"the server is busy: {len(self._waiting)} requests are waiting for a row (the queue holds "
                       f"{self.max_queue}); retry later")
                for job in jobs:
                    job.post("rejected", 429, msg, self.retry_after())
                self.metrics.refused.labels("queue_full").inc()
                return False
            now = time.perf_counter()
            for job in jobs:
                job.queued = now
                self._waiting.append(job)
            self.metrics.waiting.set(len(self._waiting))
            self._cv.notify_all()
        return True

    def cancel(self, job: Job, finish: str = "cancelled") -> None:
        """End ``job`` at the next step boundary (no-op once it is done); a waiting job leaves the queue now."""
        with self._cv:
            if job.finish is None:
                job.finish = finish
            job.cancelled = True
            if job.req is None and job in self._waiting:
                self._waiting.remove(job)
                self.metrics.waiting.set(len(self._waiting))
                return
            self._cancels.append(job)
            self._cv.notify_all()

    def retry_after(self) -> int:
        """Seconds a refused client should wait: about one admitted request's time (at least 1)."""
        return max(1, math.ceil(self._service_s))

    def snapshot(self) -> dict:
        """Running and waiting requests and KV slots as of the last step boundary (kept by the scheduler
        thread: reading the device's free count from another thread would synchronise the device)."""
        return {**self._stats, "waiting": len(self._waiting), "steps": self.steps}

    # -- the thread ---------------------------------------------------------------
    def _gauges(self) -> None:
        m, b = self.metrics, self.batch
        used, free = b.slots_used(), b.slots_free()
        self._stats = {"running": len(b.live), "kv_slots_used": used, "kv_slots_free": free,
                       "kv_slots_reserved": b.reserved, "kv_slots": b.runner.cache.num_slots, "rows": b.runner.rows}
        m.kv_reserved.set(b.reserved)
        m.kv_used.set(used)
        m.kv_free.set(free)
        m.running.set(len(b.live))
        m.waiting.set(len(self._waiting))

    def _end(self, job: Job, req: Request) -> None:
        finish = job.finish if (job.cancelled and job.finish and req.finish == "cancelled") else req.finish
        status = "error" if finish == "error" else ("cancelled" if finish == "cancelled" else "ok")
        self.metrics.requests.labels(status).inc()
        if job.admitted is not None:
            self._service_s += 0.1 * ((time.perf_counter() - job.admitted) - self._service_s)
        job.post("done", finish, req.error)
        self._jobs.pop(req, None)

    def _admit(self, job: Job) -> bool:
        """Admit ``job`` now; False when its slots cannot be reserved yet (it stays at the head of the queue)."""
        b = self.batch
        try:
            req = b.add(job.prompt, job.max_tokens, sampling=job.sampling)
        except KVPoolFull:
            return False
        except (ValueError, RuntimeError) as e:  # can never run (checked up front by the handler; kept as a guard)
            job.post("rejected", 400, str(e), None)
            self.metrics.refused.labels("invalid").inc()
            return True
        job.req, job.admitted = req, time.perf_counter()
        self._jobs[req] = job
        self.metrics.prompt_tokens.inc(len(job.prompt))
        self.metrics.queue_wait.observe(job.admitted - (job.queued or job.arrived))
        job.post("admitted")
        return True

    def _expire(self) -> None:
        """Refuse (429) the waiting jobs that have waited longer than ``max_queue_wait``."""
        now = time.perf_counter()
        with self._cv:
            late = [j for j in self._waiting if now - (j.queued or j.arrived) > self.max_queue_wait]
            for j in late:
                self._waiting.remove(j)
        for j in late:
            j.post("rejected", 429, f"waited {now - (j.queued or j.arrived):.1f} s for a row and KV slots (the bound "
                                    f"is {self.max_queue_wait:g} s); retry later", self.retry_after())
            self.metrics.refused.labels("queue_timeout").inc()

    def _between_steps(self) -> None:
        with self._cv:
            cancels, self._cancels = self._cancels, []
        for job in cancels:
            req = job.req
            if req is not None and not req.done:
                self.batch.cancel(req)
                self._end(job, req)
        self._expire()
        while self.batch.rows_free() > 0:
            with self._cv:
                if not self._waiting:
                    break
                job = self._waiting.popleft()
            if job.cancelled:
                continue
            if not self._admit(job):
                with self._cv:
                    self._waiting.appendleft(job)  # arrival order: the head waits for room
                break
        with self._cv:
            self._blocked = bool(self._waiting)

    def _deliver(self, events: dict[Request, list[int]]) -> None:
        m = self.metrics
        now = time.perf_counter()
        for req, toks in events.items():
            job = self._jobs.get(req)
            if job is None:
                continue
            if toks:
                if job.first is None:
                    job.first = now
                    m.ttft.observe(now - job.arrived)
                else:
                    m.itl.observe(now - job.last)
                job.last = now
                m.generation_tokens.inc(len(toks))
                job.post("tokens", toks, len(req.tokens) - len(toks))
            if req.steps and req.steps[-1].step == self.batch.step_index - 1 and not job.cancelled:
                m.accepted.observe(req.steps[-1].accepted_length)
            if req.done:
                self._end(job, req)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._stop or self._cancels or self.batch.busy or (self._waiting and not self._blocked)):
                    # a head that did not fit: look again (and expire waiting jobs) shortly
                    self._cv.wait(0.05 if self._waiting else None)
                    self._blocked = False
                if self._stop:
                    break
            try:
                self._between_steps()
                self._deliver(self.batch.prefill())  # first tokens out before the step runs
                events = self.batch.decode()
                self.steps += 1
                self._deliver(events)
            except Exception as e:  # the engine failed: end every live job with the error, keep serving
                log.exception("engine step failed")
                self.metrics.engine_failures.inc()
                self.failure = f"{type(e).__name__}: {e}"
                for req, job in list(self._jobs.items()):
                    self.batch.cancel(req, "error", self.failure)
                    self._end(job, req)
            self._gauges()
        for req, job in list(self._jobs.items()):
            self.batch.cancel(req, "error", "the server is shutting down")
            self._end(job, req)
        with self._cv:
            for job in self._waiting:
                job.post("rejected", 503, "the server is shutting down", None)
            self._waiting.clear()
        self._gauges()
