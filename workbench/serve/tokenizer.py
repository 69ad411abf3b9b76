"""Tokenizer and chat template of a served model.

From a checkpoint directory: its ``tokenizer.json`` (Hugging Face ``tokenizers``), its ``tokenizer_config.json``'s
``chat_template`` (Jinja, rendered with ``messages``, ``add_generation_prompt=True``, ``bos_token``,
``eos_token``) and its ``eos_token``. A directory without a chat template gets :data:`DEFAULT_CHAT_TEMPLATE`.

Without a tokenizer (``--synthetic`` with no ``--tokenizer``): :func:`byte_tokenizer`, a byte-level BPE with no
merges whose token id IS the byte value (0..255, GPT-2's byte-to-unicode alphabet), so any text round-trips.
"""
from __future__ import annotations

import json
from pathlib import Path

import jinja2
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

# The default chat template (ChatML-like): each message as "<|im_start|>{role}\n{content}<|im_end|>\n",
# then "<|im_start|>assistant\n" to prompt the reply.
DEFAULT_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the ByteLevel pre-tokenizer's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def byte_tokenizer():
    """A byte-level tokenizer of 256 ids, id = byte value (module docstring)."""
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


class TextCodec:
    """A ``tokenizers.Tokenizer`` with the chat template and eos of the checkpoint it came from."""

    def __init__(self, tokenizer, chat_template: str | None = None, eos_token: str | None = None,
                 bos_token: str | None = None, source: str = "byte-level fallback"):
        self.tokenizer, self.source = tokenizer, source
        self.chat_template = chat_template or DEFAULT_CHAT_TEMPLATE
        self.has_own_template = chat_template is not None
        self._template = jinja2.Environment(loader=jinja2.BaseLoader(), keep_trailing_newline=True).from_string(
            self.chat_template)
        self.eos_token, self.bos_token = eos_token, bos_token
        self.eos_token_id = tokenizer.token_to_id(eos_token) if eos_token else None
        self._byte_level = isinstance(tokenizer.decoder, decoders.ByteLevel)
        self._unbyte = {ch: b for b, ch in _bytes_to_unicode().items()}

    @classmethod
    def from_dir(cls, path: str | Path) -> "TextCodec":
        """The tokenizer of checkpoint directory ``path`` (or a tokenizer.json file)."""
        p = Path(path)
        f = p / "tokenizer.json" if p.is_dir() else p
        if not f.is_file():
            raise FileNotFoundError(f"{f}: no tokenizer.json (the server needs the checkpoint's tokenizer)")
        tok = Tokenizer.from_file(str(f))
        cfg = {}
        tc = f.parent / "tokenizer_config.json"
        if tc.is_file():
            cfg = json.loads(tc.read_text())

        def name(v):
            return v.get("content") if isinstance(v, dict) else v

        tmpl = cfg.get("chat_template")
        if isinstance(tmpl, list):  # [{"name": "default", "template": ...}, ...]
            tmpl = next((t["template"] for t in tmpl if t.get("name") == "default"), None)
        return cls(tok, tmpl, name(cfg.get("eos_token")), name(cfg.get("bos_token")), source=str(f))

    @classmethod
    def bytes(cls) -> "TextCodec":
        return cls(byte_tokenizer())

    @classmethod
    def numbered(cls, vocab_size: int) -> "TextCodec":
        """A word-level tokenizer of ``vocab_size`` ids whose token i is the text ``<i>`` (space-separated): a
        synthetic model keeps its full vocabulary behind the server (its lm_head, the step's largest dense read),
        and ids round-trip through text."""
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        tok = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(vocab_size)}, unk_token="<0>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return cls(tok, source=f"numbered ({vocab_size} ids)")

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``; special tokens (eos, ...) are left out of the text, as vLLM and SGLang do."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_bytes(self, token_id: int) -> bytes:
        """The UTF-8 bytes token ``token_id`` stands for (a byte-level token may hold part of a character); a
        special token's text."""
        tok = self.tokenizer.id_to_token(int(token_id))
        if tok is None:
            return b""
        if self._byte_level and all(c in self._unbyte for c in tok):
            return bytes(self._unbyte[c] for c in tok)
        return self.tokenizer.decode([int(token_id)], skip_special_tokens=False).encode("utf-8")

    def token_text(self, token_id: int) -> str:
        """Token ``token_id`` as text; a token whose bytes are not whole UTF-8 characters as ``bytes:\\xNN...``
        (OpenAI's convention), so distinct partial tokens keep distinct names."""
        data = self.token_bytes(token_id)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in data)

    def render_chat(self, messages: list[dict]) -> str:
        return self._template.render(messages=messages, add_generation_prompt=True, bos_token=self.bos_token or "",
                                     eos_token=self.eos_token or "")
