"""Log-probabilities in OpenAI's response shapes, from the engine's per-token entries (``Request.logprobs``,
``top_logprobs``, ``prompt_logprobs``, ``prompt_top_logprobs``: natural logs of the model's float32 distribution at
temperature 1, the alternatives most likely first).

- completions (``logprobs=N``): ``{tokens, token_logprobs, top_logprobs, text_offset}``; ``top_logprobs`` maps
  token text to log-prob for the N alternatives and the chosen token (as OpenAI's legacy API does); with ``echo``
  the prompt's tokens come first, the very first with ``None`` (nothing precedes it).
- chat (``logprobs: true, top_logprobs: N``): ``{content: [{token, logprob, bytes, top_logprobs: [{token,
  logprob, bytes}]}]}`` with exactly N alternatives per token.

A token's text is :meth:`TextCodec.token_text` (a byte-level token holding part of a character reads
``bytes:\\xNN``; its ``bytes`` are exact). ``text_offset`` counts characters of the answered text up to each
token.
"""
from __future__ import annotations


class Offsets:
    """Character offsets of successive tokens in a text decoded from their bytes (a UTF-8 continuation byte
    starts no character)."""

    def __init__(self, start: int = 0):
        self.at = start

    def advance(self, data: bytes) -> int:
        """The offset of a token of bytes ``data``; moves past it."""
        here = self.at
        self.at += sum(1 for b in data if b & 0xC0 != 0x80)
        return here


def completion_logprobs(codec, ids: list[int], lps: list, tops: list, offsets: Offsets) -> dict:
    """The completions shape for tokens ``ids`` with their log-probs ``lps`` (None for a prompt's first) and
    alternatives ``tops`` ((id, logprob) lists)."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for t, lp, top in zip(ids, lps, tops):
        data = codec.token_bytes(t)
        text = codec.token_text(t)
        out["tokens"].append(text)
        out["token_logprobs"].append(lp)
        out["text_offset"].append(offsets.advance(data))
        if lp is None:
            out["top_logprobs"].append(None)
            continue
        alts = {codec.token_text(i): v for i, v in top}
        alts.setdefault(text, lp)
        out["top_logprobs"].append(alts)
    return out


def merge_completion_logprobs(a: dict | None, b: dict) -> dict:
    """``a`` followed by ``b`` (the prompt's entries, then the generated ones)."""
    if a is None:
        return b
    return {k: a[k] + b[k] for k in a}


def chat_logprobs(codec, ids: list[int], lps: list, tops: list) -> list[dict]:
    """The chat shape's ``content`` entries for generated tokens ``ids``."""
    def entry(t: int, lp: float) -> dict:
        return {"token": codec.token_text(t), "logprob": lp, "bytes": list(codec.token_bytes(t))}

    return [{**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in top]} for t, lp, top in zip(ids, lps, tops)]
