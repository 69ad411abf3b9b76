"""The scheduler: ONE thread owns the engine and runs one batched step at a time.

HTTP handlers (on the asyncio loop) :meth:`Scheduler.submit` a :class:`Job` and read its events from an
``asyncio.Queue``; they :meth:`Scheduler.cancel` it when the client leaves or a stop string ends it. Between two
steps the thread retires cancelled jobs (their KV slots go back to the pool at once), admits waiting jobs while a
row is free, runs :meth:`Batch.prefill` (posting the first tokens of prompts now complete) and
:meth:`Batch.decode` (one batched engine step) and posts each job's new tokens. Admission failures answer the job alone: a request whose worst-case KV slots (prompt + max_tokens + one
step's slots, :meth:`Batch.worst_case`) cannot be reserved beside the admitted requests' gets 429, one that can
never fit (beyond the context or the whole pool) 400. Because every admitted request's worst case is reserved, no
request runs out of slots while decoding (should the engine flag it anyway, that request alone ends with an error
event; the others continue).

Events (tuples) on ``job.events``: ``("admitted",)``, ``("tokens", ids)``, ``("done", finish, error)`` or, before
admission, ``("rejected", status, message)``.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import time

from workbench.engine.batch import Batch, Request
from workbench.engine.kv_device import KVPoolFull
from workbench.serve.metrics import Metrics

log = logging.getLogger("workbench.serve")


@dataclasses.dataclass(eq=False)
class Job:
    prompt: list[int]
    max_tokens: int
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    arrived: float = dataclasses.field(default_factory=time.perf_counter)
    cancelled: bool = False
    finish: str | None = None  # why the client side ended it (e.g. "stop" for a stop string)
    req: Request | None = None
    first: float | None = None
    last: float | None = None

    def post(self, *event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the handler's event loop is closed (server shut down): nobody to tell
            pass


class Scheduler:
    """Runs ``batch`` in a thread of its own (module docstring). max_waiting: jobs queued for a row beyond it
    are rejected with 429."""

    def __init__(self, batch: Batch, metrics: Metrics | None = None, max_waiting: int = 256):
        self.batch, self.metrics, self.max_waiting = batch, metrics or Metrics(), max_waiting
        self._cv = threading.Condition()
        self._waiting: collections.deque[Job] = collections.deque()
        self._jobs: dict[Request, Job] = {}
        self._cancels: list[Job] = []
        self._stop = False
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.failure: str | None = None
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
    def submit(self, job: Job) -> bool:
        """Queue ``job``; False (and a 429 "rejected" event) when the waiting queue is full."""
        with self._cv:
            if len(self._waiting) >= self.max_waiting:
                job.post("rejected", 429, f"the server has {len(self._waiting)} requests waiting for a row; "
                                          f"retry later")
                return False
            self._waiting.append(job)
            self.metrics.waiting.set(len(self._waiting))
            self._cv.notify_all()
        return True

    def cancel(self, job: Job, finish: str = "cancelled") -> None:
        """End ``job`` at the next step boundary (no-op once it is done)."""
        with self._cv:
            if job.finish is None:
                job.finish = finish
            job.cancelled = True
            self._cancels.append(job)
            self._cv.notify_all()

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
        job.post("done", finish, req.error)
        self._jobs.pop(req, None)

    def _admit(self, job: Job) -> None:
        b = self.batch
        try:
            req = b.add(job.prompt, job.max_tokens)
        except KVPoolFull as e:
            total = b.runner.cache.num_slots
            status = 400 if b.worst_case(len(job.prompt), job.max_tokens) > total else 429
            job.post("rejected", status, f"{e}; " + ("the prompt is larger than the whole KV pool" if status == 400
                                                     else "retry when other requests have finished"))
            return
        except ValueError as e:
            job.post("rejected", 400, str(e))
            return
        job.req = req
        self._jobs[req] = job
        self.metrics.prompt_tokens.inc(len(job.prompt))
        job.post("admitted")

    def _between_steps(self) -> None:
        with self._cv:
            cancels, self._cancels = self._cancels, []
            admit = []
            while self._waiting and self.batch.rows_free() - len(admit) > 0:
                j = self._waiting.popleft()
                if not j.cancelled:
                    admit.append(j)
        for job in cancels:
            req = job.req
            if req is not None and not req.done:
                self.batch.cancel(req)
                self._end(job, req)
        for job in admit:
            self._admit(job)

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
                job.post("tokens", toks)
            if req.steps and req.steps[-1].step == self.batch.step_index - 1 and not job.cancelled:
                m.accepted.observe(req.steps[-1].accepted_length)
            if req.done:
                self._end(job, req)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._stop or self._waiting or self._cancels or self.batch.busy):
                    self._cv.wait()
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
                job.post("rejected", 503, "the server is shutting down")
            self._waiting.clear()
        self._gauges()
