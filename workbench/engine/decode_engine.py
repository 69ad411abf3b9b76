"""The engine's entry points for a known set of prompts: :class:`DecodeEngine` (a
:class:`~workbench.engine.runner.ModelRunner` with ``generate`` and ``start``) and its :class:`Session`.

Both drive the one request loop (:class:`~workbench.engine.batch.Batch`) with ``reserve=False``: every prompt is
admitted and prefilled at :meth:`DecodeEngine.start`, then each :meth:`Session.step` is one loop step. A prompt
whose slots do not fit, or a request whose step cannot get its slots, ends alone with a ``KVPoolFull`` error; the
others go on. The server and the continuous-batching tools use :class:`~workbench.engine.batch.Batch` directly.
"""
from __future__ import annotations

from workbench.decode import GREEDY, DecodeConfig
from workbench.engine.batch import Batch
from workbench.engine.kv_device import KVPoolFull
from workbench.engine.request import Request, check_prompts
from workbench.engine.runner import ModelRunner, StepOutput


class Session:
    """The requests of one :meth:`DecodeEngine.start`, in prompt order, stepped by :meth:`step` until
    :attr:`done`; ``batch`` is the loop that runs them."""

    def __init__(self, batch: Batch, requests: list[Request]):
        self.batch, self.requests = batch, requests

    @property
    def done(self) -> bool:
        return all(r.done for r in self.requests)

    def step(self) -> StepOutput:
        """One decode step of every live request; returns the step's output (times, accepted lengths by row)."""
        if self.done:
            raise ValueError("every request of this session is done")
        self.batch.step()
        return self.batch.last

    def results(self) -> list[Request]:
        return list(self.requests)


class DecodeEngine(ModelRunner):
    """Greedy and DDTree decoding of a set of prompts on a :class:`~workbench.engine.runner.ModelRunner` (same
    arguments), through the one request loop."""

    def generate(self, prompts, max_new_tokens: int, config: DecodeConfig | None = None, drafter=None,
                 eos_token_id: int | None = None) -> list[Request]:
        """Decode ``prompts`` (a list of token-id lists or an int tensor) up to ``max_new_tokens`` each;
        ``config`` defaults to greedy. Same contract as the eager reference :func:`workbench.engine.generate`."""
        s = self.start(prompts, max_new_tokens, config, drafter, eos_token_id)
        while not s.done:
            s.step()
        return s.results()

    def start(self, prompts, max_new_tokens: int, config: DecodeConfig | None = None, drafter=None,
              eos_token_id: int | None = None, synthetic_prefix: bool = False,
              prefill_chunk: int | None = None) -> Session:
        """Admit and prefill the prompts; returns the :class:`Session` to step.

        ``synthetic_prefix`` (benchmarks): fill each prompt's KV rows with seeded random values instead of running
        the prefill, and continue from the prompt's last token. ``prefill_chunk``: prefill in forwards of at most
        that many tokens per prompt (rounds of one chunk of every unfinished prompt, each attending to the rows
        before it), so long prompts need activations of one chunk only; None: one ragged forward over all.
        """
        config = config or GREEDY
        prompts = check_prompts(prompts, self.vocab_size)
        if len(prompts) > self.rows:
            raise ValueError(f"{len(prompts)} prompts is not allowed: the engine has {self.rows} rows")
        batch = Batch(self, config, drafter, eos_token_id, prefill_chunk, reserve=False)
        for p in prompts:
            batch.check(len(p), max_new_tokens)
        requests = []
        for i, p in enumerate(prompts):
            try:
                requests.append(batch.add(p, max_new_tokens, synthetic_prefix=synthetic_prefix))
            except KVPoolFull as err:
                r = Request(-1 - i, p, max_new_tokens)
                r.fail(f"KVPoolFull: {err}")
                requests.append(r)
        while batch.prefilling:
            batch.prefill()
        return Session(batch, requests)
