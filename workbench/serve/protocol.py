"""OpenAI request parsing (with the errors it answers) and incremental detokenisation with stop strings."""
from __future__ import annotations

import dataclasses
from typing import Any


class ApiError(Exception):
    """An HTTP error with an OpenAI-style body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error",
                             503: "service_unavailable"}.get(status, "invalid_request_error"
                                                             if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclasses.dataclass
class Params:
    """What a completion or chat request asks for, checked."""

    prompt_ids: list[int]
    max_tokens: int | None
    stream: bool
    include_usage: bool
    stop: list[str]


def _get(body: dict, name: str, kinds, default=None, allowed: str = ""):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise ApiError(400, f"{name}={v!r} is not allowed: {allowed}", name)
    if not isinstance(v, kinds):
        raise ApiError(400, f"{name}={v!r} is not allowed: {allowed}", name)
    return v


def common(body: Any, model_name: str) -> dict:
    """Checks shared by both endpoints; returns max_tokens, stream, include_usage and stop."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != model_name:
        raise ApiError(404, f"the model {model!r} does not exist: this server serves {model_name!r}", "model",
                       "model_not_found")
    t = _get(body, "temperature", (int, float), 0.0, "a number >= 0")
    if t < 0:
        raise ApiError(400, f"temperature={t!r} is not allowed: a number >= 0", "temperature")
    if t > 0:
        raise ApiError(400, f"temperature={t!r} is not supported: this server decodes greedily only "
                            "(temperature 0). Lossless DDTree sampling needs rejection sampling over the tree, "
                            "which is not built", "temperature", "unsupported_value")
    n = _get(body, "n", int, 1, "1")
    if n != 1:
        raise ApiError(400, f"n={n!r} is not supported: one choice per request (greedy decoding gives one answer)",
                       "n", "unsupported_value")
    for name in ("logprobs", "top_logprobs", "echo", "suffix", "best_of"):
        v = body.get(name)
        if v not in ((None, 1) if name == "best_of" else (None, False)):
            raise ApiError(400, f"{name}={v!r} is not supported by this server", name, "unsupported_value")
    mt = body.get("max_tokens", body.get("max_completion_tokens"))
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
        raise ApiError(400, f"max_tokens={mt!r} is not allowed: an integer >= 1", "max_tokens")
    stream = _get(body, "stream", bool, False, "true or false")
    so = _get(body, "stream_options", dict, {}, "an object")
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, f"stop={body.get('stop')!r} is not allowed: a non-empty string or a list of up to 4",
                       "stop")
    return {"max_tokens": mt, "stream": stream, "include_usage": bool(so.get("include_usage")), "stop": stop}


def completion_params(body: Any, model_name: str, codec) -> Params:
    c = common(body, model_name)
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        if not p:
            raise ApiError(400, "prompt is empty", "prompt")
        ids = codec.encode(p)
    elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        if not all(0 <= t < codec.vocab_size for t in p):
            raise ApiError(400, f"prompt token ids must lie in 0..{codec.vocab_size - 1}", "prompt")
        ids = list(p)
    else:
        raise ApiError(400, "prompt must be a non-empty string or a list of token ids (one prompt per request)",
                       "prompt")
    return Params(ids, c["max_tokens"] if c["max_tokens"] is not None else 16, c["stream"], c["include_usage"],
                  c["stop"])


def chat_params(body: Any, model_name: str, codec) -> Params:
    c = common(body, model_name)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "messages must be a non-empty list of {role, content}", "messages")
    clean = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a string role", "messages")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}]
            if not all(isinstance(x, dict) and x.get("type") == "text" and isinstance(x.get("text"), str)
                       for x in content):
                raise ApiError(400, f"messages[{i}].content: only text parts are supported", "messages")
            content = "".join(x["text"] for x in content)
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts", "messages")
        clean.append({"role": m["role"], "content": content})
    ids = codec.encode(codec.render_chat(clean))
    return Params(ids, c["max_tokens"], c["stream"], c["include_usage"], c["stop"])


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
