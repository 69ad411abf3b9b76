"""From a validated request model (:mod:`workbench.serve.schemas`) to what the scheduler runs: OpenAI error bodies
(:class:`ApiError`, and :func:`validation_error` for a body the models refuse), the request's choices
(:class:`Plan`: prompts x n, each with its :class:`~workbench.engine.request.SamplingParams`) and incremental
detokenisation with stop strings (:class:`TextStream`)."""
from __future__ import annotations

import dataclasses
from typing import Any

from workbench.engine.request import SamplingParams
from workbench.serve.schemas import (
    MAX_CHOICES, MAX_LOGPROBS, MAX_STOP, MAX_STOP_CHARS, ChatCompletionRequest, CompletionRequest,
)
from workbench.validation import InvalidParameter

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions

# What each request field allows, for the 400 that names it.
ALLOWED = {
    "model": "the served model's id (GET /v1/models) or null",
    "prompt": f"a non-empty string, a non-empty list of token ids, or a list of up to {MAX_CHOICES} of either",
    "messages": "a non-empty list of {role: system|developer|user|assistant|tool, content: a string or a list of "
                "{type: 'text', text}}",
    "max_tokens": "an integer >= 1 (completions: >= 0, 0 only with echo), or null",
    "max_completion_tokens": "an integer >= 1 or null",
    "temperature": "a finite number in [0, 2] or null",
    "top_p": "a finite number in (0, 1] or null",
    "top_k": "an integer >= -1 (0 or -1: off) or null",
    "seed": "an integer in [0, 2^62] or null",
    "n": f"an integer in [1, {MAX_CHOICES}] or null",
    "stream": "true, false or null",
    "stream_options": "{include_usage: bool} or null",
    "stop": f"a string or a list of up to {MAX_STOP} strings, each 1..{MAX_STOP_CHARS} characters, or null",
    "logprobs": f"completions: an integer in [0, {MAX_LOGPROBS}] or null; chat: true, false or null",
    "top_logprobs": f"an integer in [0, {MAX_LOGPROBS}] with logprobs: true, or null",
    "echo": "true, false or null",
    "tokens": "a list of token ids (integers >= 0)",
    "user": "a string or null",
    "best_of": "null or equal to n (best_of is not supported by this server)",
    "suffix": "null or '' (suffix is not supported by this server)",
    "presence_penalty": "0 or null (penalties are not supported by this server)",
    "frequency_penalty": "0 or null (penalties are not supported by this server)",
    "repetition_penalty": "1 or null (penalties are not supported by this server)",
    "logit_bias": "{} or null (logit_bias is not supported by this server)",
    "tools": "[] or null (tools are not supported by this server)",
    "tool_choice": "'none', 'auto' or null (tools are not supported by this server)",
    "response_format": "{type: 'text'} or null (other formats are not supported by this server)",
    "parallel_tool_calls": "true, false or null",
    "add_special_tokens": "true, false or null",
    "return_token_strs": "true, false or null",
}


class ApiError(Exception):
    """An HTTP error with an OpenAI-style body: {"error": {"message", "type", "param", "code"}}; ``headers`` go
    with the response (``Retry-After`` on a 429, ``Allow`` on a 405)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers
        self.type = type or {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error",
                             503: "service_unavailable"}.get(status, "invalid_request_error"
                                                             if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def validation_error(errors: list[dict], fields: set[str] | None = None) -> ApiError:
    """The 400 for a body the request models refuse: each offending field named with what it allows (unknown and
    unsupported fields by name); ``param`` is the first field. ``fields``: the endpoint's known fields."""
    parts: dict[str, str] = {}
    for e in errors:
        loc = [x for x in e.get("loc", ()) if x != "body"]
        name = str(loc[0]) if loc else ""
        if name in parts:
            continue
        msg = str(e.get("msg", ""))
        if not name and e.get("type") == "value_error":  # a check across fields
            parts[name] = msg.removeprefix("Value error, ")
        elif not name:
            parts[name] = ("the request body is missing: send a JSON object (Content-Type: application/json)"
                           if e.get("type") == "missing" else
                           "the request body must be a JSON object, sent with Content-Type: application/json")
        elif e.get("type") == "extra_forbidden":
            known = f"; the fields are {', '.join(sorted(fields))}" if fields else ""
            parts[name] = f"unknown field {name!r}: this server does not support it{known}"
        elif "not supported by this server" in msg:
            parts[name] = msg.removeprefix("Value error, ")
        elif e.get("type") == "json_invalid":
            parts[name] = f"the request body is not valid JSON: {e.get('ctx', {}).get('error', msg)}"
        else:
            value = e.get("input")
            shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
            why = msg.removeprefix("Value error, ")
            parts[name] = f"{name}={shown} is not allowed: {ALLOWED.get(name, why)}" + (
                f" ({why})" if name in ALLOWED and ("Unicode" in why or "needs" in why) else "")
    if not parts:
        return ApiError(400, "malformed request")
    first = next(iter(parts))
    return ApiError(400, "; ".join(parts.values()), first or None)


@dataclasses.dataclass
class Choice:
    """One sequence to generate: choice ``index`` of the response, its prompt, its sampling."""

    index: int
    prompt: list[int]
    sampling: SamplingParams


@dataclasses.dataclass
class Plan:
    """What a completion or chat request asks for, checked: its choices and how to answer."""

    kind: str  # "completion" or "chat"
    choices: list[Choice]
    max_tokens: int | None  # None: up to the context's end
    stream: bool
    include_usage: bool
    stop: list[str]
    echo: bool = False
    logprobs: int | None = None  # completions: N alternatives; chat: top_logprobs (0 with logprobs alone)
    drop_generated: bool = False  # max_tokens 0 with echo: one token runs, none is answered
    n: int = 1  # choices per prompt (choice index = prompt index x n + j)


def sampling(req, index: int, logprobs: int | None, prompt_logprobs: int | None) -> SamplingParams:
    """The engine's sampling of choice ``index`` (seed + index when a seed is given); a value the engine refuses
    is a 400 naming it."""
    seed = None if req.seed is None else req.seed + index
    try:
        return SamplingParams(temperature=float(req.temperature or 0.0), top_p=float(1.0 if req.top_p is None
                                                                                      else req.top_p),
                              top_k=max(0, req.top_k or 0), seed=seed, logprobs=logprobs,
                              prompt_logprobs=prompt_logprobs)
    except InvalidParameter as e:
        raise ApiError(400, str(e), e.name) from None


def _stop(v) -> list[str]:
    return [] if v is None else [v] if isinstance(v, str) else list(v)


def _check_model(req, model_name: str) -> None:
    if req.model is not None and req.model != model_name:
        raise ApiError(404, f"the model {req.model!r} does not exist: this server serves {model_name!r}", "model",
                       "model_not_found")


def _prompts(p: Any, vocab: int, codec) -> list[list[int]]:
    """The prompt field as token-id lists (a string encoded; ids checked against the vocabulary)."""
    items = [p] if isinstance(p, str) or (p and isinstance(p[0], int)) else list(p)
    out = []
    for x in items:
        ids = codec.encode(x) if isinstance(x, str) else list(x)
        if not ids:
            raise ApiError(400, f"prompt={x!r} is not allowed: it encodes to no tokens", "prompt")
        bad = [t for t in ids if t >= vocab]
        if bad:
            raise ApiError(400, f"prompt token ids must lie in 0..{vocab - 1}; got {bad[:5]}", "prompt")
        out.append(ids)
    return out


def completion_plan(req: CompletionRequest, model_name: str, codec) -> Plan:
    """The choices of a /v1/completions request: each prompt x n (choice index prompt_i * n + j)."""
    _check_model(req, model_name)
    n = req.n or 1
    prompts = _prompts(req.prompt, codec.vocab_size, codec)
    if len(prompts) * n > MAX_CHOICES:
        raise ApiError(400, f"n={n} x {len(prompts)} prompts = {len(prompts) * n} choices is not allowed: at most "
                            f"{MAX_CHOICES} per request", "n")
    mt = DEFAULT_COMPLETION_TOKENS if req.max_tokens is None else req.max_tokens
    if mt == 0 and not req.echo:
        raise ApiError(400, "max_tokens=0 is not allowed without echo: an integer >= 1 (0 only with echo: true)",
                       "max_tokens")
    plp = req.logprobs if req.echo else None
    choices = [Choice(i * n + j, ids, sampling(req, j, req.logprobs, plp))
               for i, ids in enumerate(prompts) for j in range(n)]
    return Plan("completion", choices, max(1, mt), bool(req.stream), _usage(req), _stop(req.stop),
                echo=bool(req.echo), logprobs=req.logprobs, drop_generated=mt == 0, n=n)


def chat_plan(req: ChatCompletionRequest, model_name: str, codec) -> Plan:
    """The choices of a /v1/chat/completions request: n of the rendered conversation."""
    _check_model(req, model_name)
    n = req.n or 1
    msgs = [{"role": m.role, "content": m.content if isinstance(m.content, str) or m.content is None
             else "".join(p.text for p in m.content)} for m in req.messages]
    for m in msgs:
        m["content"] = m["content"] or ""
    ids = codec.encode(codec.render_chat(msgs))
    if not ids:
        raise ApiError(400, "messages render to no tokens", "messages")
    lp = (req.top_logprobs or 0) if req.logprobs else None
    choices = [Choice(j, ids, sampling(req, j, lp, None)) for j in range(n)]
    mt = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    return Plan("chat", choices, mt, bool(req.stream), _usage(req), _stop(req.stop), logprobs=lp, n=n)


def _usage(req) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)


class TextStream:
    """Token ids in, text deltas out: holds back a trailing incomplete UTF-8 character and any tail that could
    begin a stop string; ends at the first stop string (which is not included)."""

    def __init__(self, codec, stop: list[str]):
        self.codec, self.stop = codec, stop
        self.ids: list[int] = []
        self.text = ""  # sent so far
        self.stopped = False

    def feed(self, ids: list[int]) -> str:
        if self.stopped:
            return ""
        self.ids += ids
        full = self.codec.decode(self.ids)
        hits = [i for i in (full.find(s, max(0, len(self.text) - len(s))) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            return self._emit(full[:min(hits)])
        safe = full.rstrip("\ufffd")
        hold = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(safe)), 0, -1):
                if safe.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        return self._emit(safe[:len(safe) - hold])

    def flush(self) -> str:
        """At the end: whatever was held back."""
        return "" if self.stopped else self._emit(self.codec.decode(self.ids))

    def _emit(self, upto: str) -> str:
        if len(upto) <= len(self.text):
            return ""
        delta, self.text = upto[len(self.text):], upto
        return delta
