"""A Llama-family target with a static KV cache: batched greedy generation (CUDA graph) and whole-sequence features.

:class:`StaticLlama` reads a ``transformers`` ``LlamaForCausalLM``'s own modules (no copy of the weights) and runs
them with its own attention, so that

- :meth:`StaticLlama.generate` continues many prompts at once greedily (argmax over float32 logits): prompts
  left-padded to ``max_prompt`` in a static cache ``[layers, 2, B, kv_heads, max_prompt + new_tokens, head_dim]``
  (the model's dtype), one eager prefill per batch, then one decode step captured as a CUDA graph and replayed
  ``new_tokens - 1`` times (the step writes its own next token, slot and output column on the device; on the CPU
  the same step runs eagerly). Tokens/s and token counts come back with the tokens.
- :meth:`StaticLlama.forward` is the plain causal forward over right-padded sequences: the final normed hidden
  states float [B, T, D] (the LM head's input, for the target's soft labels) and the hidden states of
  ``capture_layers`` concatenated [B, T, len(capture_layers) x D] (the drafter's context).

It exposes what :class:`workbench.engine.drafters.DFlashDrafter` reads from a target (``config``,
``embed_tokens``, ``lm_head``, ``device``, ``dtype``). Its logits equal the transformers model's to float32
rounding (``tests/test_acceptance_fastllama.py`` on a tiny random Llama).
"""
from __future__ import annotations

import math
import time
from typing import Sequence

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from workbench.acceptance.target import ModelFacts
from workbench.validation import check_int

__all__ = ["StaticLlama"]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


class StaticLlama(ModelFacts):
    """A transformers Llama causal LM run with a static KV cache (module docstring). ``capture_layers``: decoder
    layers whose outputs :meth:`forward` returns as features."""

    def __init__(self, model, capture_layers: Sequence[int] = ()):
        inner = getattr(model, "model", None)
        if inner is None or not hasattr(inner, "layers"):
            raise TypeError(f"{type(model).__name__} has no model.layers: a Llama-family causal LM is needed")
        cfg = model.config
        self.model = model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.config = cfg
        self.layers = list(inner.layers)
        n = len(self.layers)
        for l in capture_layers:
            check_int("capture_layers item", l, lo=0, hi=n - 1)
        self.capture_layers = tuple(int(l) for l in capture_layers)
        self.embed_tokens = model.get_input_embeddings()
        self.lm_head = model.get_output_embeddings()
        self.norm = inner.norm
        self.nh = cfg.num_attention_heads
        self.kvh = getattr(cfg, "num_key_value_heads", None) or self.nh
        self.hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.nh
        theta = float(getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"])
        self.rope_theta = theta
        self.inv_freq = 1.0 / theta ** (torch.arange(0, self.hd, 2, dtype=torch.float32, device=self.device) / self.hd)

    def _cos_sin(self, pos: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """pos int64 [B, T] -> cos, sin [B, 1, T, head_dim] (rotate-half layout, as transformers' Llama)."""
        f = pos.float()[..., None] * self.inv_freq
        emb = torch.cat([f, f], -1)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]

    def _qkv(self, layer, x, cos, sin):
        a = layer.self_attn
        B, T, _ = x.shape
        q = a.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = a.k_proj(x).view(B, T, self.kvh, self.hd).transpose(1, 2)
        v = a.v_proj(x).view(B, T, self.kvh, self.hd).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    @staticmethod
    def _mlp(layer, h):
        m = layer.mlp
        x = layer.post_attention_layernorm(h)
        return h + m.down_proj(F.silu(m.gate_proj(x)) * m.up_proj(x))

    # ---------------------------------------------------------------------------------------------
    # whole sequences
    # ---------------------------------------------------------------------------------------------

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Causal forward over input_ids int64 [B, T] (right padding is harmless). Returns (final normed hidden
        [B, T, D] in the compute dtype, features [B, T, len(capture_layers) x D] or None)."""
        ids = input_ids.to(self.device)
        B, T = ids.shape
        h = self.embed_tokens(ids)
        cos, sin = self._cos_sin(torch.arange(T, device=ids.device).expand(B, T), h.dtype)
        g = self.nh // self.kvh
        feats = []
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(h), cos, sin)
            if g > 1:
                k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + layer.self_attn.o_proj(o.transpose(1, 2).reshape(B, T, -1))
            h = self._mlp(layer, h)
            if i in self.capture_layers:
                feats.append(h)
        f = torch.cat([feats[self.capture_layers.index(l)] for l in self.capture_layers], -1) if feats else None
        return self.norm(h), f

    def forward_features(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits float32 [B, T, V], features) - :class:`workbench.acceptance.target.HFTarget`'s signature."""
        h, f = self.forward(input_ids)
        return self.lm_head(h).float(), f

    # ---------------------------------------------------------------------------------------------
    # batched greedy generation
    # ---------------------------------------------------------------------------------------------

    def _prefill(self, ids, pad, cache):
        """ids int64 [B, P] left-padded (pad int64 [B] leading pad tokens); fills cache[:, :, :, :, :P]; returns
        float32 logits [B, V] of the last position."""
        B, P = ids.shape
        dev = ids.device
        j = torch.arange(P, device=dev)
        pos = (j[None] - pad[:, None]).clamp(min=0)
        h = self.embed_tokens(ids)
        cos, sin = self._cos_sin(pos, h.dtype)
        valid = (j[None, None, :] <= j[None, :, None]) & ((j[None, None, :] >= pad[:, None, None])
                                                          | (j[None, None, :] == j[None, :, None]))
        g = self.nh // self.kvh
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(h), cos, sin)
            cache[li, 0, :, :, :P] = k
            cache[li, 1, :, :, :P] = v
            if g > 1:
                k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None])
            h = h + layer.self_attn.o_proj(o.transpose(1, 2).reshape(B, P, -1))
            h = self._mlp(layer, h)
        return self.lm_head(self.norm(h[:, -1])).float()

    def _decode(self, tok, slot, pad, cache, out, first_slot):
        """One greedy step at cache slot ``slot`` (int64 [1], device): reads tok int64 [B], writes the next
        token into ``tok`` and ``out[:, slot - first_slot]``, then advances ``slot`` (device ops only)."""
        B = tok.shape[0]
        S = cache.shape[4]
        g = self.nh // self.kvh
        col = torch.arange(S, device=tok.device)
        pos = (slot - pad)[:, None]
        h = self.embed_tokens(tok[:, None])
        cos, sin = self._cos_sin(pos, h.dtype)
        valid = ((col[None] >= pad[:, None]) & (col[None] <= slot))[:, None, None]   # [B, 1, 1, S]
        scale = 1.0 / math.sqrt(self.hd)
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(h), cos, sin)
            cache[li, 0].index_copy_(2, slot, k)
            cache[li, 1].index_copy_(2, slot, v)
            qg = q.view(B, self.kvh, g, self.hd)
            s = torch.matmul(qg, cache[li, 0].transpose(-1, -2)) * scale               # [B, kvh, g, S]
            s = s.masked_fill(~valid, float("-inf"))
            o = torch.matmul(torch.softmax(s.float(), -1).to(h.dtype), cache[li, 1])      # [B, kvh, g, hd]
            h = h + layer.self_attn.o_proj(o.reshape(B, 1, -1))
            h = self._mlp(layer, h)
        nxt = self.lm_head(self.norm(h[:, 0])).float().argmax(-1)
        tok.copy_(nxt)
        out.index_copy_(1, slot - first_slot, nxt[:, None])
        slot.add_(1)

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], new_tokens: int, batch: int = 256, max_prompt: int = 256,
                 pad_id: int = 0, graph: bool | None = None, seconds: float | None = None,
                 progress: bool = False) -> tuple[list[list[int]], dict]:
        """Greedy continuations of ``prompts`` (token lists, each 1..max_prompt long): ``new_tokens`` tokens each
        (no stop at EOS: cut where you need). Batches of ``batch`` (the last one padded with copies of its first
        prompt); ``graph`` (default: on CUDA) captures the decode step once for all batches; ``seconds``: stop
        after the batch that passes that time (whole batches only). Returns (continuations, stats: prompts,
        tokens, seconds, tokens_per_s, batches, graph)."""
        check_int("new_tokens", new_tokens, lo=1)
        check_int("batch", batch, lo=1)
        check_int("max_prompt", max_prompt, lo=1)
        for i, p in enumerate(prompts):
            if not 1 <= len(p) <= max_prompt:
                raise ValueError(f"prompt {i} has {len(p)} tokens; 1..max_prompt={max_prompt} allowed")
        dev = self.device
        graph = (dev.type == "cuda") if graph is None else graph
        S = max_prompt + new_tokens
        cache = torch.zeros(len(self.layers), 2, batch, self.kvh, S, self.hd, dtype=self.dtype, device=dev)
        tok = torch.zeros(batch, dtype=torch.int64, device=dev)
        slot = torch.zeros(1, dtype=torch.int64, device=dev)
        first = torch.full((1,), max_prompt - 1, dtype=torch.int64, device=dev)
        pad = torch.zeros(batch, dtype=torch.int64, device=dev)
        out = torch.zeros(batch, new_tokens, dtype=torch.int64, device=dev)
        step = lambda: self._decode(tok, slot, pad, cache, out, first)  # noqa: E731
        g = None
        results: list[list[int]] = []
        t0 = time.perf_counter()
        n_batches = 0
        bar = tqdm(range(0, len(prompts), batch), desc="greedy generation", disable=not progress)
        for b0 in bar:
            chunk = list(prompts[b0:b0 + batch])
            real = len(chunk)
            chunk += [chunk[0]] * (batch - real)
            ids = torch.full((batch, max_prompt), pad_id, dtype=torch.int64)
            for r, p in enumerate(chunk):
                ids[r, max_prompt - len(p):] = torch.as_tensor(list(p), dtype=torch.int64)
            pad.copy_(torch.tensor([max_prompt - len(p) for p in chunk], dtype=torch.int64))
            cache.zero_()
            logits = self._prefill(ids.to(dev), pad, cache)
            nxt = logits.argmax(-1)
            tok.copy_(nxt)
            out.zero_()
            out[:, 0] = nxt
            slot.fill_(max_prompt)
            if new_tokens > 1 and graph and g is None:
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):  # warm-up outside the capture, then put the state back
                    step()
                torch.cuda.current_stream().wait_stream(s)
                tok.copy_(nxt)
                slot.fill_(max_prompt)
                g = torch.cuda.CUDAGraph()
                try:
                    with torch.cuda.graph(g):
                        step()
                except RuntimeError as e:  # a capture the runtime refuses: the same step runs eagerly
                    print(f"greedy generation: CUDA graph capture failed ({e}); decoding eagerly", flush=True)
                    g, graph = None, False
                tok.copy_(nxt)
                slot.fill_(max_prompt)
                out.zero_()
                out[:, 0] = nxt
            for _ in range(new_tokens - 1):
                if g is not None:
                    g.replay()
                else:
                    step()
            results.extend(out[:real].tolist())
            n_batches += 1
            if seconds is not None and time.perf_counter() - t0 > seconds:
                break
        if dev.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        tokens = len(results) * new_tokens
        return results, {"prompts": len(results), "tokens": tokens, "seconds": dt,
                         "tokens_per_s": tokens / dt if dt > 0 else None, "batches": n_batches,
                         "batch": batch, "max_prompt": max_prompt, "new_tokens": new_tokens,
                         "graph": bool(g is not None), "dtype": str(self.dtype).replace("torch.", "")}
