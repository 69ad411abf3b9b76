"""The per-request record every decode path shares: :class:`Request`, its :class:`StepRecord` per step, and the
input check of prompts.

A :class:`Request` is what a caller hands in (prompt, ``max_new_tokens``) and what it gets back (``tokens``,
``steps``, ``prefill_ms``, ``finish``, ``error``). The request loop (:class:`workbench.engine.batch.Batch`), the
engine's ``generate`` / ``start`` (which drive that loop), the server and the sweep all hold this one record; the
eager reference (:func:`workbench.engine.generate.generate`) returns it too, so results compare field by field.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from workbench.validation import check_float, check_int

FINISH_REASONS = ("length", "stop", "cancelled", "error")
MAX_LOGPROBS = 20  # alternatives per token a request may ask for (OpenAI's top_logprobs limit)
MAX_SEED = 2 ** 63 - 1


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How a request picks its tokens (validated; an error names the field and what is allowed).

    - ``temperature``: 0 takes the float32 argmax (greedy); > 0 samples from softmax(logits / temperature),
      restricted to the ``top_k`` most likely tokens (0: all) and the smallest set whose probability reaches
      ``top_p``. DDTree samples losslessly: its output is the same token sequence plain sampling gives for the
      same ``seed`` (:mod:`workbench.engine.sampling`).
    - ``seed``: the sampling noise of the request; None: the engine draws one (:attr:`Request.seed` records it).
    - ``logprobs``: None, or N in 0..20: each generated token's log-probability under the model's float32
      distribution (temperature 1) and its N most likely alternatives.
    - ``prompt_logprobs``: None, or N in 0..20: the same for every prompt token (the first has none), from the
      prefill.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self):
        check_float("temperature", self.temperature, lo=0.0, hi=2.0)
        check_float("top_p", self.top_p, lo=0.0, hi=1.0, lo_open=True)
        check_int("top_k", self.top_k, lo=0)
        if self.seed is not None:
            check_int("seed", self.seed, lo=0, hi=MAX_SEED)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), lo=0, hi=MAX_LOGPROBS)

    @property
    def sampled(self) -> bool:
        """Tokens are drawn (temperature > 0), not the argmax."""
        return self.temperature > 0


GREEDY_SAMPLING = SamplingParams()


@dataclasses.dataclass
class StepRecord:
    """One request's share of one step: tokens committed (root counted), verify width (tree nodes, 1 for greedy),
    requests in the step, times in ms, what ran (``paths``: attention, moe, tree_build, step, fuse) and, for a
    greedy step of the captured engine, the two largest float32 logits (``top2``, the argmax margin)."""

    step: int
    accepted_length: int
    tree_size: int
    batch: int
    times_ms: dict[str, float]
    paths: dict[str, str] | None = None
    top2: tuple[float, float] | None = None


@dataclasses.dataclass(eq=False)
class Request:
    """One request: its prompt and output limit, the row it holds while live, the generated ``tokens``, one
    :class:`StepRecord` per decode step, the prefill's wall time, and why it ended (``finish``: ``"length"``,
    ``"stop"`` (eos), ``"cancelled"`` or ``"error"`` with ``error`` set; None while it runs). With ``sampling``
    asking for them, ``logprobs`` / ``top_logprobs`` hold one entry per generated token (index i: token i) and
    ``prompt_logprobs`` / ``prompt_top_logprobs`` one per prompt token; ``seed`` is the sampling seed used."""

    id: int
    prompt: list[int]
    max_new_tokens: int
    row: int = -1
    tokens: list[int] = dataclasses.field(default_factory=list)
    steps: list[StepRecord] = dataclasses.field(default_factory=list)
    prefill_ms: float = 0.0
    finish: str | None = None
    error: str | None = None
    sampling: SamplingParams = GREEDY_SAMPLING
    seed: int = 0
    logprobs: list[float] = dataclasses.field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)
    prompt_logprobs: list[float | None] = dataclasses.field(default_factory=list)
    prompt_top_logprobs: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.finish is not None

    @property
    def mean_accepted_length(self) -> float:
        return float(np.mean([s.accepted_length for s in self.steps])) if self.steps else float("nan")

    def emit(self, new, eos: int | None, logprobs=None, top=None) -> list[int]:
        """Append ``new`` token ids up to ``max_new_tokens`` and through the first ``eos``; returns the tokens
        kept and sets ``finish`` to ``"stop"`` (eos) or ``"length"`` when the request is complete. ``logprobs``
        (one float per new token) and ``top`` (one list of (id, logprob) per new token) are kept alongside."""
        kept: list[int] = []
        for i, t in enumerate(new):
            if len(self.tokens) >= self.max_new_tokens:
                break
            self.tokens.append(int(t))
            kept.append(int(t))
            if logprobs is not None:
                self.logprobs.append(float(logprobs[i]))
                self.top_logprobs.append(list(top[i]))
            if eos is not None and int(t) == eos:
                self.finish = self.finish or "stop"
                return kept
        if len(self.tokens) >= self.max_new_tokens:
            self.finish = self.finish or "length"
        return kept

    def fail(self, error: str) -> None:
        """End the request with ``error`` (its tokens so far stay)."""
        self.finish, self.error = "error", error


def check_prompts(prompts, vocab: int) -> list[list[int]]:
    """Token-id lists from a list of sequences (lists or integer tensors) or an integer tensor [T] / [B, T].
    Float, bool or out-of-range ids raise ``ValueError`` naming the prompt (nothing is truncated)."""
    if isinstance(prompts, torch.Tensor):
        if prompts.dtype.is_floating_point or prompts.dtype.is_complex or prompts.dtype == torch.bool:
            raise ValueError(f"prompts must hold integer token ids, got a {prompts.dtype} tensor")
        prompts = [prompts.tolist()] if prompts.dim() == 1 else prompts.tolist()
    if len(prompts) == 0:
        raise ValueError("prompts is empty; give at least one prompt")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, torch.Tensor):
            if p.dtype.is_floating_point or p.dtype.is_complex or p.dtype == torch.bool:
                raise ValueError(f"prompt {i} must hold integer token ids, got a {p.dtype} tensor")
            p = p.tolist()
        bad = [x for x in p if isinstance(x, bool) or not isinstance(x, (int, np.integer))]
        if bad:
            raise ValueError(f"prompt {i} must hold integer token ids, got {bad[:3]!r} "
                             f"({type(bad[0]).__name__}); nothing is rounded or truncated")
        p = [int(x) for x in p]
        if not p:
            raise ValueError(f"prompt {i} is empty")
        bad = [x for x in p if not 0 <= x < vocab]
        if bad:
            raise ValueError(f"prompt {i} holds token ids outside [0, {vocab}): {bad[:5]}")
        out.append(p)
    return out


