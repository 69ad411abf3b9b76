"""The request loop: ONE continuously batched loop that ``generate()``, the closed session, the server and the
sweep all drive.

:class:`Batch` holds the live :class:`~workbench.engine.request.Request` records of one
:class:`~workbench.engine.runner.ModelRunner` (do not run two on the same runner) and one
:class:`~workbench.decode.DecodeConfig`. Between steps :meth:`Batch.add` admits a prompt (a free row, its prompt's
KV slots) and :meth:`Batch.cancel` retires a request (its slots go back to the pool at once). :meth:`Batch.step` is

1. schedule: :meth:`prefill` - one ragged forward over the next piece of every admitted prompt (the whole prompt,
   or ``prefill_chunk`` tokens of it: each chunk attends to the chunks before it through the pool); a prompt whose
   last piece is in gets its first token and joins the decode rows;
2. run: :meth:`decode` - ONE runner step over the bucket that holds the highest live row (rows without a live
   request are padding and allocate nothing), a typed :class:`~workbench.engine.runner.StepOutput`;
3. postprocess: each live request takes its new tokens (up to ``max_new_tokens``, through ``eos``) and a
   :class:`~workbench.engine.request.StepRecord`; finished and failed requests are retired.

A row's tokens depend only on its own prompt and KV rows, so every request's output equals the eager reference's
(:func:`workbench.engine.generate.generate`) for that prompt whatever joined or left around it.

Slots: with ``reserve=True`` (the server's policy) a request is admitted only when its worst case
(:meth:`~workbench.decode.DecodeConfig.worst_case_slots`: prompt + max_new_tokens + one step's tokens) fits beside
the worst cases of every request already admitted, so the pool never runs dry inside a step and an admitted request
always finishes. With ``reserve=False`` (a closed session of known prompts) only the prompt's slots are taken; a
request whose step cannot get its slots ends alone with a ``KVPoolFull`` error and the others go on.
"""
from __future__ import annotations

import dataclasses
import itertools
import random
import time

import torch

from workbench.decode import GREEDY, DecodeConfig, bucket_for
from workbench.engine.kv_device import KVPoolFull
from workbench.engine.request import GREEDY_SAMPLING, MAX_SEED, Request, SamplingParams, StepRecord, check_prompts
from workbench.engine.runner import ModelRunner, PrefillPiece, StepOutput
from workbench.validation import check_int


@dataclasses.dataclass
class _Prefilling:
    """An admitted request's prefill so far: its prompt's slots int64 [P], the tokens prefilled, the captured
    features of each piece, and whether its rows are seeded random values instead (benchmarks)."""

    slots: torch.Tensor
    done: int = 0
    feats: list = dataclasses.field(default_factory=list)
    synthetic: bool = False


class Batch:
    """The request loop over ``runner`` with one :class:`DecodeConfig` (default greedy) and, for DDTree, one
    ``drafter`` with a device program (module docstring). ``eos_token_id`` ends a request when generated.
    ``prefill_chunk``: prompt tokens per request per prefill forward (default: the whole prompt at once).
    ``reserve``: admit only what can always finish (module docstring)."""

    def __init__(self, runner: ModelRunner, config: DecodeConfig | None = None, drafter=None,
                 eos_token_id: int | None = None, prefill_chunk: int | None = None, reserve: bool = True):
        self.runner, self.config, self.eos = runner, config or GREEDY, eos_token_id
        self.prefill_chunk = None if prefill_chunk is None else check_int("prefill_chunk", prefill_chunk, lo=1)
        self.reserve = bool(reserve)
        if self.config.method == "ddtree" and drafter is None:
            raise ValueError("method 'ddtree' needs a drafter (ScriptedDrafter, DFlashDrafter, ...)")
        self.program = runner.program(drafter, self.config.block) if self.config.method == "ddtree" else None
        self.layers = self.program.target_layers if self.program is not None else ()
        self.live: dict[int, Request] = {}  # row -> request
        self._pending: list[Request] = []  # admitted, prompt not fully prefilled
        self._prefill: dict[Request, _Prefilling] = {}
        self._reserved: dict[Request, int] = {}
        self._ids = itertools.count()
        self.step_index = 0
        self.last: StepOutput | None = None  # the last decode step's output
        for row in range(runner.rows):
            runner.stop_row(row)
        self.step_tokens = self.config.verify_width(runner.vocab_size)

    # -- capacity ---------------------------------------------------------------
    @property
    def reserved(self) -> int:
        """Worst-case slots of the admitted requests (``reserve=True``; host count, no device read)."""
        return sum(self._reserved.values())

    def worst_case(self, prompt_len: int, max_new_tokens: int) -> int:
        """KV slots a request can hold at most (:meth:`~workbench.decode.DecodeConfig.worst_case_slots`)."""
        return self.config.worst_case_slots(prompt_len, max_new_tokens, self.runner.vocab_size)

    def slots_free(self) -> int:
        return int(self.runner.cache.top)

    def slots_unreserved(self) -> int:
        """Slots no admitted request may claim: the pool less every admitted request's worst case."""
        return self.runner.cache.num_slots - self.reserved

    def slots_used(self) -> int:
        return self.runner.cache.num_slots - self.slots_free()

    def rows_free(self) -> int:
        return self.runner.rows - len(self.live) - len(self._pending)

    @property
    def prefilling(self) -> bool:
        """An admitted prompt is not fully prefilled yet."""
        return bool(self._pending)

    @property
    def busy(self) -> bool:
        """A request is live or still being prefilled."""
        return bool(self.live or self._pending)

    def check(self, prompt_len: int, max_new_tokens: int) -> None:
        """ValueError when a request of this size can never run on this runner (output or context limit, or, with
        ``reserve``, a worst case beyond the whole KV pool)."""
        r = self.runner
        check_int("max_new_tokens", max_new_tokens, lo=1, hi=r.max_generated)
        extra = self.config.extra_slots(r.vocab_size)
        need = prompt_len + max_new_tokens + extra
        if need > r.capacity:
            raise ValueError(f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens})"
                             f"{f' + {extra} for the last step' if extra else ''} = {need} tokens, beyond the "
                             f"engine's capacity: the context limit {r.capacity} per request")
        worst = self.worst_case(prompt_len, max_new_tokens)
        if self.reserve and worst > r.cache.num_slots:
            raise ValueError(f"KV pool too small: the request needs up to {worst} slots (prompt {prompt_len} + "
                             f"max_new_tokens {max_new_tokens} + {self.step_tokens} per step), the whole pool has "
                             f"{r.cache.num_slots}")

    # -- between steps ---------------------------------------------------------
    def add(self, prompt, max_new_tokens: int, synthetic_prefix: bool = False,
            sampling: SamplingParams | None = None) -> Request:
        """Admit one prompt (token ids): take the lowest free row and the prompt's KV slots now (with ``reserve``,
        reserve its :meth:`worst_case` too); the prefill runs at the next :meth:`prefill` or :meth:`step`.
        ValueError when it can never run (:meth:`check`), RuntimeError when every row is taken, KVPoolFull when its
        slots (or reservation) do not fit now. ``synthetic_prefix`` (benchmarks): seeded random KV rows instead of
        the prefill forward, decoding on from the prompt's last token (which counts as the first generated).
        ``sampling``: how its tokens are picked and which log-probabilities it gets (default greedy, none)."""
        (prompt,) = check_prompts([prompt], self.runner.vocab_size)
        self.check(len(prompt), max_new_tokens)
        sampling = sampling or GREEDY_SAMPLING
        if synthetic_prefix and (sampling.logprobs is not None or sampling.prompt_logprobs is not None):
            raise ValueError("synthetic_prefix has no prefill, so no log-probabilities: ask for none")
        taken = set(self.live) | {r.row for r in self._pending}
        row = next((i for i in range(self.runner.rows) if i not in taken), None)
        if row is None:
            raise RuntimeError(f"every one of the engine's {self.runner.rows} rows is taken")
        worst = self.worst_case(len(prompt), max_new_tokens)
        if self.reserve and worst > self.slots_unreserved():
            raise KVPoolFull(f"KV pool full: the request needs up to {worst} slots reserved (prompt {len(prompt)} + "
                             f"max_new_tokens {max_new_tokens} + {self.step_tokens} per step); {self.reserved} of "
                             f"{self.runner.cache.num_slots} are reserved by {len(self.live) + len(self._pending)} "
                             f"admitted requests")
        slots = self.runner.cache.admit(row, len(prompt))  # raises KVPoolFull
        seed = sampling.seed if sampling.seed is not None else random.SystemRandom().randrange(MAX_SEED + 1)
        r = Request(next(self._ids), prompt, max_new_tokens, row, sampling=sampling, seed=seed)
        if self.reserve:
            self._reserved[r] = worst
        self._prefill[r] = _Prefilling(slots, synthetic=bool(synthetic_prefix))
        self._pending.append(r)
        return r

    def cancel(self, r: Request, finish: str = "cancelled", error: str | None = None) -> None:
        """Retire ``r`` now (if still admitted): its row and KV slots are free for the next admission."""
        if r in self._pending:
            self._pending.remove(r)
            self._prefill.pop(r, None)
            self.runner.stop_row(r.row)
            self._reserved.pop(r, None)
        elif self.live.get(r.row) is r:
            self._retire(r)
        if r.finish is None:
            r.finish, r.error = finish, error

    def _retire(self, r: Request) -> None:
        self._reserved.pop(r, None)
        del self.live[r.row]
        self.runner.stop_row(r.row)

    def _join(self, r: Request, first: int, features=None, logprob: float | None = None,
              top: list | None = None) -> list[int]:
        """``r``'s prompt is in: its first token (with its log-probability where asked), its drafter row, and its
        decode row (retired if already done)."""
        kept = r.emit([first], self.eos, None if logprob is None else [logprob], None if top is None else [top])
        if self.program is not None:
            pos = torch.arange(len(r.prompt), device=self.runner.model.device) if features is not None else None
            self.program.admit(r.row, r.id, upto=r.max_new_tokens, features=features, positions=pos)
        self.live[r.row] = r
        self.runner.start_row(r.row, first, r.sampling, r.seed)
        if r.done:
            self._retire(r)
        return kept

    def prefill(self) -> dict[Request, list[int]]:
        """Schedule: prefill the admitted requests' next pieces in one ragged forward (the whole prompt, or its next
        ``prefill_chunk`` tokens); returns the first token of each request whose prompt is now complete."""
        if not self._pending:
            return {}
        out: dict[Request, list[int]] = {}
        for r in [r for r in self._pending if self._prefill[r].synthetic]:
            st = self._prefill.pop(r)
            self._pending.remove(r)
            self.runner.fill_synthetic(st.slots, seed=1000 + r.row)
            out[r] = self._join(r, r.prompt[-1])
        if not self._pending:
            return out
        t0 = time.perf_counter()
        spans = []
        for r in self._pending:
            d = self._prefill[r].done
            spans.append((d, min(len(r.prompt), d + (self.prefill_chunk or len(r.prompt)))))
        pieces = [PrefillPiece(self._prefill[r].slots[:d], self._prefill[r].slots[d:end], r.prompt[d:end], d,
                               r.prompt[end] if end < len(r.prompt) else None, r.sampling, r.seed)
                  for r, (d, end) in zip(self._pending, spans)]
        results = self.runner.prefill(pieces, self.layers)
        ms = (time.perf_counter() - t0) * 1e3
        still = []
        for r, (d, end), res in zip(self._pending, spans, results):
            st = self._prefill[r]
            r.prefill_ms += ms
            st.done = end
            if res.features is not None:
                st.feats.append(res.features)
            if r.sampling.prompt_logprobs is not None:
                if d == 0:
                    r.prompt_logprobs.append(None)
                    r.prompt_top_logprobs.append([])
                r.prompt_logprobs.extend(res.prompt_logprobs)
                r.prompt_top_logprobs.extend(res.prompt_top)
            if end < len(r.prompt):
                still.append(r)
                continue
            del self._prefill[r]
            out[r] = self._join(r, res.first, torch.cat(st.feats) if self.layers else None, res.first_logprob,
                                res.first_top)
        self._pending = still
        return out

    # -- the step --------------------------------------------------------------
    def step(self) -> dict[Request, list[int]]:
        """:meth:`prefill`, then :meth:`decode`; returns each request's new tokens (requests that finish are
        retired, their slots freed)."""
        events = self.prefill()
        for r, toks in self.decode().items():
            events[r] = events.get(r, []) + toks
        return events

    def decode(self) -> dict[Request, list[int]]:
        """Run and postprocess: one runner step over the live rows (its output kept in :attr:`last`); returns each
        live request's new tokens (requests that finish are retired). Empty when nothing is live."""
        events: dict[Request, list[int]] = {}
        if not self.live:
            return events
        r_ = self.runner
        live = list(self.live.values())
        bucket = r_.bucket(bucket_for(max(self.live) + 1), self.config, self.program,
                           sampled=any(r.sampling.sampled for r in live),
                           logprobs=any(r.sampling.logprobs is not None for r in live))
        out = self.last = r_.step(bucket)
        greedy = self.config.method == "greedy"
        for r in live:
            if out.pool_full[r.row]:
                r.fail(f"KVPoolFull: KV pool full: request {r.id} could not get {out.tree_size} slots "
                       f"({r_.cache.num_slots} slots in the pool, {r_.capacity} per request)")
                new: list[int] = []
            else:
                top2 = (float(out.top2[r.row, 0]), float(out.top2[r.row, 1])) if greedy else None
                r.steps.append(StepRecord(self.step_index, int(out.accepted[r.row]), out.tree_size, len(live),
                                          {"total": out.ms}, out.paths, top2))
                n = r.sampling.logprobs
                lps, top = out.new_logprobs(r.row, n) if n is not None else (None, None)
                new = r.emit(out.new_tokens(r.row), self.eos, lps, top)
            events[r] = new
            if r.done:
                self._retire(r)
        self.step_index += 1
        return events


__all__ = ["Batch", "KVPoolFull", "Request"]
