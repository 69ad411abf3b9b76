"""Continuous batching over :class:`~workbench.engine.step.DecodeEngine`: requests join and leave between steps.

A :class:`Batch` owns an engine's slot table (do not run a :class:`~workbench.engine.step.Session` on the same
engine while it lives). Between steps :meth:`Batch.add` takes the lowest free row and the prompt's KV slots;
:meth:`Batch.prefill` runs one ragged forward over every prompt added and not yet prefilled; :meth:`Batch.cancel`
retires a request and returns its KV slots to the pool at once. :meth:`Batch.decode` runs ONE batched engine step
over the bucket that holds the highest live row (rows without a live request are padding and allocate nothing)
and returns each live request's new tokens; :meth:`Batch.step` is prefill then decode. A row's tokens depend only
on its own prompt and KV rows, so every request's output equals :func:`workbench.engine.generate`'s for that
prompt whatever joined or left around it.

Prefill: by default a prompt is prefilled whole between two steps, so the others' next step waits for it
(head-of-line cost: one prefill forward of that prompt's length). With ``prefill_chunk=K`` a prompt is prefilled
K tokens per step boundary (each chunk attends to the chunks before it through the KV pool, as a
:class:`~workbench.engine.model.Segment` with a prefix), so a long prompt delays the others' steps by one K-token
forward at a time; it joins the step once its last chunk is in.

Slot reservation: a request is admitted only when its worst-case KV slots (:meth:`Batch.worst_case`: prompt +
max_new_tokens + the step's tokens per row, T = 1 greedy or the tree size) fit beside the worst cases of every
request already admitted; the pool therefore never runs dry inside a step (the engine's per-row pool-full flag
stays a guard, not a path). :meth:`Batch.add` raises :class:`KVPoolFull` when the reservation cannot be made.
"""
from __future__ import annotations

import dataclasses
import itertools
import time

import numpy as np
import torch

from workbench.decode import DecodeConfig
from workbench.engine.generate import StepRecord, check_prompts
from workbench.engine.kv_cache import KVPoolFull
from workbench.engine.step import DecodeEngine, bucket_for, take_tokens


@dataclasses.dataclass(eq=False)
class Request:
    """One request of a :class:`Batch`: its row while live, output so far, per-step records, and why it ended
    (``finish``: ``"length"``, ``"stop"`` (eos), ``"cancelled"`` or ``"error"`` with ``error`` set)."""

    id: int
    prompt: list[int]
    max_new_tokens: int
    row: int
    out: list[int] = dataclasses.field(default_factory=list)
    steps: list[StepRecord] = dataclasses.field(default_factory=list)
    prefill_ms: float = 0.0
    finish: str | None = None
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.finish is not None

    @property
    def mean_accepted_length(self) -> float:
        return float(np.mean([s.accepted_length for s in self.steps])) if self.steps else float("nan")


class Batch:
    """A continuously batched decode over ``engine`` with one :class:`DecodeConfig` (default greedy) and, for
    DDTree, one ``drafter`` with a device program. ``eos_token_id`` ends a request when generated.
    ``prefill_chunk``: prompt tokens per request per prefill forward (default: the whole prompt at once)."""

    def __init__(self, engine: DecodeEngine, config: DecodeConfig | None = None, drafter=None,
                 eos_token_id: int | None = None, prefill_chunk: int | None = None):
        from workbench.validation import check_int

        self.engine, self.config, self.eos = engine, config or DecodeConfig(method="greedy"), eos_token_id
        self.prefill_chunk = None if prefill_chunk is None else check_int("prefill_chunk", prefill_chunk, lo=1)
        if self.config.method == "ddtree" and drafter is None:
            raise ValueError("method 'ddtree' needs a drafter (ScriptedDrafter, DFlashDrafter, ...)")
        self.program = engine._program(drafter, self.config.block) if self.config.method == "ddtree" else None
        self.layers = self.program.target_layers if self.program is not None else ()
        self.live: dict[int, Request] = {}  # row -> request
        self._pending: list[Request] = []  # added, not yet prefilled
        self._ids = itertools.count()
        self.step_index = 0
        for row in range(engine.rows):
            engine.cache.release(row)
        self._active_host = torch.zeros(engine.rows, dtype=torch.bool)
        engine.active.copy_(self._active_host)
        self._host: dict[int, torch.Tensor] = {}
        self.reserved = 0  # worst-case slots of the live and pending requests (host count, no device read)
        self.step_tokens = 1
        if self.config.method == "ddtree":
            from workbench.ddtree import tree_size

            c = self.config
            self.step_tokens = tree_size(c.depth, min(c.budget, engine.model.config.vocab_size), c.budget)

    # -- capacity ---------------------------------------------------------------
    @property
    def extra(self) -> int:
        """Tokens beyond prompt + output a request must have room for (the deepest tree)."""
        return self.config.block if self.config.method == "ddtree" else 0

    def slots_free(self) -> int:
        return int(self.engine.cache.top)

    def worst_case(self, prompt_len: int, max_new_tokens: int) -> int:
        """KV slots a request can hold at most: ``prompt_len + max_new_tokens`` committed plus one step's
        allocation (``step_tokens``: 1 for greedy, the tree size for DDTree) before its accept frees the rest."""
        return prompt_len + max_new_tokens + self.step_tokens

    def slots_unreserved(self) -> int:
        """Slots no admitted request may claim: the pool less every admitted request's worst case."""
        return self.engine.cache.num_slots - self.reserved

    def slots_used(self) -> int:
        return self.engine.cache.num_slots - self.slots_free()

    def rows_free(self) -> int:
        return self.engine.rows - len(self.live) - len(self._pending)

    @property
    def busy(self) -> bool:
        """A request is live or still being prefilled."""
        return bool(self.live or self._pending)

    def check(self, prompt_len: int, max_new_tokens: int) -> None:
        """ValueError when a request of this size can never run on this engine (context or output limit, or a
        worst case beyond the whole KV pool)."""
        e = self.engine
        if max_new_tokens > e.max_generated:
            raise ValueError(f"max_new_tokens={max_new_tokens} is not allowed: at most {e.max_generated} "
                             f"(the engine's max_generated)")
        need = prompt_len + max_new_tokens + self.extra
        if need > e.capacity:
            raise ValueError(f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens})"
                             f"{' + block' if self.extra else ''} = {need} tokens, beyond the context limit "
                             f"{e.capacity} per request")
        worst = self.worst_case(prompt_len, max_new_tokens)
        if worst > e.cache.num_slots:
            raise ValueError(f"KV pool too small: the request needs up to {worst} slots (prompt {prompt_len} + "
                             f"max_new_tokens {max_new_tokens} + {self.step_tokens} per step), the whole pool has "
                             f"{e.cache.num_slots}")

    # -- between steps ---------------------------------------------------------
    def add(self, prompt, max_new_tokens: int) -> Request:
        """Admit one prompt (token ids): reserve its :meth:`worst_case` slots and take a row and its prompt's KV
        slots now (KVPoolFull when the reservation does not fit beside the admitted requests', RuntimeError when
        every row is taken); the prefill runs at the next :meth:`prefill` or :meth:`step`."""
        from workbench.validation import check_int

        check_int("max_new_tokens", max_new_tokens, lo=1)
        (prompt,) = check_prompts([prompt], self.engine.model.config.vocab_size)
        self.check(len(prompt), max_new_tokens)
        taken = set(self.live) | {r.row for r in self._pending}
        row = next((i for i in range(self.engine.rows) if i not in taken), None)
        if row is None:
            raise RuntimeError(f"every one of the engine's {self.engine.rows} rows is taken")
        worst = self.worst_case(len(prompt), max_new_tokens)
        if worst > self.slots_unreserved():
            raise KVPoolFull(f"KV pool full: the request needs up to {worst} slots reserved (prompt {len(prompt)} + "
                             f"max_new_tokens {max_new_tokens} + {self.step_tokens} per step); {self.reserved} of "
                             f"{self.engine.cache.num_slots} are reserved by {len(self.live) + len(self._pending)} "
                             f"admitted requests")
        slots = self.engine.cache.admit(row, len(prompt))  # raises KVPoolFull
        r = Request(next(self._ids), prompt, max_new_tokens, row)
        r._slots = slots  # type: ignore[attr-defined]
        r._reserved = worst  # type: ignore[attr-defined]
        self.reserved += worst
        self._pending.append(r)
        return r

    def cancel(self, r: Request, finish: str = "cancelled", error: str | None = None) -> None:
        """Retire ``r`` now (if still live): its row and KV slots are free for the next admission."""
        if r in self._pending:
            self._pending.remove(r)
            self.engine.cache.release(r.row)
            self._unreserve(r)
        elif self.live.get(r.row) is r:
            self._retire(r)
        if r.finish is None:
            r.finish, r.error = finish, error

    def _unreserve(self, r: Request) -> None:
        self.reserved -= getattr(r, "_reserved", 0)
        r._reserved = 0  # type: ignore[attr-defined]

    def _retire(self, r: Request) -> None:
        self._unreserve(r)
        del self.live[r.row]
        self.engine.cache.release(r.row)
        self._active_host[r.row] = False
        self.engine.active[r.row] = False

    def _emit(self, r: Request, new: list[int]) -> list[int]:
        kept, why = take_tokens(r.out, new, r.max_new_tokens, self.eos)
        if r.finish is None and why is not None:
            r.finish = why
        return kept

    def prefill(self) -> dict[Request, list[int]]:
        """Prefill the added requests in one ragged forward (the whole prompt, or its next ``prefill_chunk``
        tokens); returns the first token of each request whose prompt is now complete (those join the step;
        one that is then already done is retired)."""
        if not self._pending:
            return {}
        e, dev = self.engine, self.engine.model.device
        t0 = time.perf_counter()
        spans = []
        for r in self._pending:
            d = getattr(r, "_prefilled", 0)
            spans.append((d, min(len(r.prompt), d + (self.prefill_chunk or len(r.prompt)))))
        firsts, feats = e.prefill_pieces([(r._slots[:d], r._slots[d:end], r.prompt[d:end], d)
                                          for r, (d, end) in zip(self._pending, spans)], self.layers)
        ms = (time.perf_counter() - t0) * 1e3
        out, still = {}, []
        for r, (d, end), t, f in zip(self._pending, spans, firsts, feats):
            r.prefill_ms += ms
            r._prefilled = end  # type: ignore[attr-defined]
            if f is not None:
                r._feats = getattr(r, "_feats", []) + [f]  # type: ignore[attr-defined]
            if end < len(r.prompt):
                still.append(r)
                continue
            out[r] = self._emit(r, [t])
            e.last_token[r.row] = t
            e.num_generated[r.row] = 1
            if self.program is not None:
                f = torch.cat(r._feats) if self.layers else None
                p = torch.arange(len(r.prompt), device=dev) if self.layers else None
                self.program.admit(r.row, r.id, upto=r.max_new_tokens, features=f, positions=p)
                r._feats = []
            self.live[r.row] = r
            self._active_host[r.row] = True
            e.active[r.row] = True
            if r.done:
                self._retire(r)
        self._pending = still
        return out

    # -- the step --------------------------------------------------------------
    def step(self) -> dict[Request, list[int]]:
        """:meth:`prefill` what was added, then :meth:`decode`; returns each request's new tokens (requests that
        finish are retired, their slots freed)."""
        events = self.prefill()
        for r, toks in self.decode().items():
            events[r] = events.get(r, []) + toks
        return events

    def decode(self) -> dict[Request, list[int]]:
        """One engine step over the live rows; returns each live request's new tokens (requests that finish
        are retired, their slots freed). Empty when nothing is live."""
        events: dict[Request, list[int]] = {}
        if not self.live:
            return events
        e, cfg = self.engine, self.config
        C = bucket_for(max(self.live) + 1)
        bucket = e._bucket(C, cfg, self.program)
        host, ms, graph = e.step_to_host(bucket, cfg, self._host.get(C))
        self._host[C] = host
        rows = host.numpy()
        L1 = rows.shape[1] - 4
        live = list(self.live.values())
        paths = e.paths(cfg.method, graph, C * bucket.T)
        for r in live:
            row = rows[r.row]
            if row[L1 + 1]:
                r.finish, r.error = "error", (f"KVPoolFull: KV pool full: request {r.id} could not get "
                                              f"{bucket.T} slots ({e.cache.num_slots} slots in the pool)")
                new: list[int] = []
            else:
                n = int(row[L1])
                r.steps.append(StepRecord(self.step_index, n, bucket.T, len(live), {"total": ms}, paths))
                new = self._emit(r, [int(t) for t in row[:n]])
            events[r] = new
            if r.done:
                self._retire(r)
        self.step_index += 1
        return events


__all__ = ["Batch", "KVPoolFull", "Request"]
