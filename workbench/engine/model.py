"""The DeepSeek-V3 / Kimi K2.x text model in torch.

One module, :class:`DeepseekV3`, with two forward paths:

- ``model(input_ids)`` (``[T]`` or ``[B, T]``, no cache): a fresh prefill with
  *naive* MLA (keys and values expanded from the latent through ``kv_b_proj``,
  causal mask). Returns logits ``[..., T, vocab]``.
- ``model.forward_batch(tokens, positions, segments, cache)``: the engine's
  ragged step over several requests at once (prefill chunks, decode tokens or
  draft trees). Every new token's latent row (``c_kv`` after its RMSNorm, then
  the roped ``k_rope``: ``kv_lora_rank + qk_rope_head_dim`` values) is written
  to the paged KV pool, and attention runs *absorbed* over the latent cache:
  ``q_lat = q_nope @ W_UK`` per head, scores ``q_lat . c_kv + q_rope . k_rope``,
  output ``(softmax . c_kv) @ W_UV^T``. Each segment's new tokens see the
  segment's committed prefix plus their own ancestors (a chain for prefill and
  decode, the draft tree's visibility for verify).

- ``model.forward_step(...)``: the same absorbed forward for the captured
  decode step (:mod:`workbench.engine.runner`): ``C`` requests of ``T`` tokens
  each, attention through the :class:`~workbench.engine.attention.StepAttention`
  the model makes for the step (:meth:`DeepseekV3.step_attention`: one batched
  verify-attention call per layer), no host synchronisation.

``MLAttention.impl`` picks the absorbed attention: ``"auto"`` (the
``workbench.ddtree`` verify kernel on CUDA when the latent shapes are 512 + 64,
the torch path otherwise), ``"kernel"`` or ``"torch"`` (float32 softmax). A
kernel that fails raises; ``last_path`` records what ran. The engine's logits
(``forward_batch``, ``forward_step``) are float32 (the lm_head output), so that
bf16 rounding does not decide an argmax.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import ModelConfig
from workbench.ddtree import verify_attention
from workbench.engine.attention import StepAttention, latent_attention_torch
from workbench.engine.moe import MLP, MoE
from workbench.engine.rope import RotaryEmbedding, apply_rope
from workbench.engine.step_ops import step_ops


class RMSNorm(nn.Module):
    """``weight * (x / rms(x))``, normalised in float32, then cast back (transformers' order)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dt)


@dataclasses.dataclass
class Segment:
    """One request's share of a :meth:`DeepseekV3.forward_batch` call.

    ``prefix_slots`` int64 [P]: committed KV slots (fully visible).
    ``tail_slots`` int64 [T]: slots that receive the new tokens' latent rows.
    ``parents`` int64 [T] or None: tail-relative parent of each new token
    (-1: sees the prefix and itself only); None means a causal chain.
    """

    prefix_slots: torch.Tensor
    tail_slots: torch.Tensor
    parents: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return int(self.tail_slots.shape[0])

    def parents_or_chain(self) -> torch.Tensor:
        if self.parents is not None:
            return self.parents
        return torch.arange(-1, self.length - 1, device=self.tail_slots.device, dtype=torch.int64)

    def visibility(self) -> torch.Tensor:
        """bool [T, T]: ancestor closure of ``parents`` (lower-triangular ones for a chain)."""
        T = self.length
        dev = self.tail_slots.device
        if self.parents is None:
            return torch.ones(T, T, dtype=torch.bool, device=dev).tril()
        par = self.parents.tolist()
        vis = torch.zeros(T, T, dtype=torch.bool)
        for i, p in enumerate(par):
            if p >= i:
                raise ValueError(f"parents[{i}] = {p} is not an earlier node; parents must precede children")
            if p >= 0:
                vis[i, :i] = vis[p, :i]
            vis[i, i] = True
        return vis.to(dev)


ATTENTION_IMPLS = ("auto", "kernel", "torch")


class MLAttention(nn.Module):
    """Multi-head latent attention with HF parameter names (q_a_proj ... o_proj)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.config = c
        self.H, self.dn, self.dr, self.dv, self.R = (c.num_attention_heads, c.qk_nope_head_dim,
                                                     c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank)
        dq = self.dn + self.dr
        if c.q_lora_rank is None:
            self.q_proj = nn.Linear(c.hidden_size, self.H * dq, bias=False)
        else:
            self.q_a_proj = nn.Linear(c.hidden_size, c.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(c.q_lora_rank)
            self.q_b_proj = nn.Linear(c.q_lora_rank, self.H * dq, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(c.hidden_size, self.R + self.dr, bias=False)
        self.kv_a_layernorm = RMSNorm(self.R)
        self.kv_b_proj = nn.Linear(self.R, self.H * (self.dn + self.dv), bias=False)
        self.o_proj = nn.Linear(self.H * self.dv, c.hidden_size, bias=False)
        self.scale = c.softmax_scale
        self.interleave = c.rope_interleave
        self.impl = "auto"  # "auto", "kernel" or "torch" (module docstring)
        self.last_path: str | None = None  # which attention path the last cached forward took

    def attention_path(self, x: torch.Tensor) -> str:
        """``"kernel"`` or ``"torch"``: the absorbed attention that runs for input ``x`` under ``self.impl``."""
        if self.impl not in ATTENTION_IMPLS:
            raise ValueError(f"MLAttention.impl={self.impl!r} is not allowed: one of {', '.join(ATTENTION_IMPLS)}")
        fits = x.is_cuda and self.R == 512 and self.dr == 64
        if self.impl == "kernel" and not fits:
            raise ValueError(f"impl='kernel' needs CUDA tensors and latent 512 + rope 64 (device {x.device}, "
                             f"kv_lora_rank {self.R}, qk_rope_head_dim {self.dr})")
        return "kernel" if self.impl == "kernel" or (self.impl == "auto" and fits) else "torch"

    # -- projections ----------------------------------------------------------
    def project_q(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [..., T, D] -> q_nope [..., T, H, dn], q_rope [..., T, H, dr] (roped)."""
        q = self.q_proj(x) if self.config.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(*x.shape[:-1], self.H, self.dn + self.dr)
        q_nope, q_rope = q.split([self.dn, self.dr], dim=-1)
        return q_nope, apply_rope(q_rope, cos.unsqueeze(-2), sin.unsqueeze(-2), self.interleave)

    def project_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [..., T, D] -> latent rows [..., T, R + dr]: normed c_kv, then roped k_rope."""
        ckv, k_rope = self.kv_a_proj_with_mqa(x).split([self.R, self.dr], dim=-1)
        return torch.cat([self.kv_a_layernorm(ckv), apply_rope(k_rope, cos, sin, self.interleave)], -1)

    def _wkv(self) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.kv_b_proj.weight.view(self.H, self.dn + self.dv, self.R)
        return w[:, :self.dn], w[:, self.dn:]  # W_UK [H, dn, R], W_UV [H, dv, R]

    # -- naive path (fresh prefill) --------------------------------------------
    def forward_naive(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [B, T, D] -> [B, T, D] with causal attention over the T tokens only."""
        B, T, _ = x.shape
        q_nope, q_rope = self.project_q(x, cos, sin)
        rows = self.project_kv(x, cos, sin)
        kv = self.kv_b_proj(rows[..., :self.R]).view(B, T, self.H, self.dn + self.dv)
        k_nope, v = kv.split([self.dn, self.dv], dim=-1)
        k = torch.cat([k_nope, rows[..., None, self.R:].expand(B, T, self.H, self.dr)], -1)
        q = torch.cat([q_nope, q_rope], -1)
        s = torch.einsum("bthd,bshd->bhts", q.float(), k.float()) * self.scale
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        s = s.masked_fill(~causal, float("-inf"))
        p = torch.softmax(s, dim=-1)
        o = torch.einsum("bhts,bshd->bthd", p, v.float()).to(x.dtype)
        return self.o_proj(o.reshape(B, T, self.H * self.dv))

    # -- absorbed path over the latent cache ----------------------------------
    def forward_latent(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: Sequence[Segment],
                       kv_layer: torch.Tensor, tail_slots: torch.Tensor) -> torch.Tensor:
        """x [N, D] (segments concatenated) -> [N, D]; writes the N latent rows to ``kv_layer[tail_slots]``."""
        q_nope, q_rope = self.project_q(x, cos, sin)
        rows = self.project_kv(x, cos, sin)
        kv_layer[tail_slots] = rows.to(kv_layer.dtype)
        w_uk, w_uv = self._wkv()
        q_lat = torch.einsum("nhd,hdr->nhr", q_nope, w_uk)
        kernel = verify_attention if self.attention_path(x) == "kernel" else None
        self.last_path = "workbench.ddtree.verify_attention" if kernel is not None else "torch"
        outs = []
        start = 0
        for seg in segments:
            T = seg.length
            sl = slice(start, start + T)
            start += T
            if kernel is not None:
                o, _ = kernel(q_lat[sl].to(kv_layer.dtype).contiguous(), q_rope[sl].to(kv_layer.dtype).contiguous(),
                              kv_layer, seg.prefix_slots, kv_layer[seg.tail_slots], seg.parents_or_chain(),
                              self.scale, check=False)  # slots and parents are valid by construction
                outs.append(o.float())
            else:
                outs.append(latent_attention_torch(q_lat[sl], q_rope[sl], kv_layer, seg.prefix_slots,
                                                   kv_layer[seg.tail_slots], seg.visibility(), self.scale))
        return self.project_out(torch.cat(outs, 0), x.dtype)

    def project_out(self, o_lat: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Latent attention output [N, H, R] -> [N, D] (``W_UV`` in the weights' dtype, then ``o_proj``)."""
        w_uv = self._wkv()[1]
        o = torch.einsum("nhr,hvr->nhv", o_lat.to(w_uv.dtype), w_uv)
        return self.o_proj(o.reshape(o_lat.shape[0], self.H * self.dv)).to(dtype)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, int4_experts: bool, dtype: torch.dtype):
        super().__init__()
        self.self_attn = MLAttention(config)
        self.is_moe = config.is_moe_layer(layer)
        self.mlp = (MoE(config, int4=int4_experts, dtype=dtype) if self.is_moe
                    else MLP(config.hidden_size, config.intermediate_size))
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        if self.is_moe:
            shape = h.shape
            return self.mlp(h.reshape(-1, shape[-1])).view(shape)
        return self.mlp(h)


class DeepseekV3(nn.Module):
    """DeepSeek-V3 / Kimi K2.x causal LM. Build with :func:`workbench.engine.load_model` or
    :func:`workbench.engine.synthetic_model` (the constructor allocates uninitialised weights)."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32, int4_experts: bool = False):
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.int4_experts = int4_experts
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i, int4_experts, dtype)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        V = self.config.vocab_size
        if ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"input_ids must be an integer tensor, got {ids.dtype}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= V):
            raise ValueError(f"token ids must lie in [0, {V}), got range [{int(ids.min())}, {int(ids.max())}]")
        return self.embed_tokens(ids)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Fresh prefill: input_ids int [T] or [B, T] -> logits [..., T, vocab] (model dtype)."""
        if input_ids.dim() not in (1, 2):
            raise ValueError(f"input_ids must be [T] or [B, T], got shape {tuple(input_ids.shape)}")
        squeeze = input_ids.dim() == 1
        ids = input_ids.unsqueeze(0) if squeeze else input_ids
        ids = ids.to(self.device)
        T = ids.shape[1]
        cos, sin = self.rotary(torch.arange(T, device=self.device))
        h = self._embed(ids)
        for layer in self.layers:
            h = h + layer.self_attn.forward_naive(layer.input_layernorm(h), cos, sin)
            h = h + layer._mlp(layer.post_attention_layernorm(h))
        logits = self.lm_head(self.norm(h))
        return logits[0] if squeeze else logits

    @torch.no_grad()
    def forward_batch(self, tokens: torch.Tensor, positions: torch.Tensor, segments: Sequence[Segment],
                      cache, capture_layers: Sequence[int] = ()) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Ragged step over several requests through the paged latent cache.

        tokens int64 [N] and positions int64 [N]: the segments' new tokens, concatenated in segment order.
        cache: a :class:`workbench.engine.PagedKVCache` whose pool has this model's layers.
        Returns logits [N, vocab] (model dtype) and, for each layer in ``capture_layers``, that
        decoder layer's output hidden state [N, D].
        """
        N = tokens.shape[0]
        if sum(s.length for s in segments) != N or positions.shape[0] != N:
            raise ValueError(f"segments hold {sum(s.length for s in segments)} tokens, tokens {N}, "
                             f"positions {positions.shape[0]}; they must agree")
        if cache.num_layers != len(self.layers) or cache.row_width != self.config.kv_row_width:
            raise ValueError(f"KV cache has {cache.num_layers} layers x {cache.row_width} values per row; "
                             f"model needs {len(self.layers)} x {self.config.kv_row_width}")
        tokens = tokens.to(self.device)
        cos, sin = self.rotary(positions.to(self.device))
        tail = torch.cat([s.tail_slots for s in segments]) if segments else tokens.new_zeros(0)
        h = self._embed(tokens)
        captured: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            h = h + layer.self_attn.forward_latent(layer.input_layernorm(h), cos, sin, segments,
                                                   cache.pool[i], tail)
            h = h + layer._mlp(layer.post_attention_layernorm(h))
            if i in capture_layers:
                captured[i] = h
        return self.logits_f32(h), captured

    def logits_f32(self, h: torch.Tensor, rms=None) -> torch.Tensor:
        """Final norm and lm_head: h [N, D] -> logits float32 [N, vocab] (bf16 weights accumulate into a
        float32 output on CUDA, so the argmax is taken over unrounded logits). ``rms``: the norm function
        (default the module)."""
        x = self.norm(h) if rms is None else rms(h, self.norm.weight, self.norm.eps)
        w = self.lm_head.weight
        if w.dtype == torch.float32:
            return F.linear(x.float(), w)
        if x.is_cuda:
            return torch.mm(x.reshape(-1, x.shape[-1]), w.t(), out_dtype=torch.float32).view(*x.shape[:-1], -1)
        return F.linear(x.float(), w.float())

    def attention_path(self) -> str:
        """``"kernel"`` or ``"torch"``: the absorbed attention this model's layers run on its device."""
        probe = torch.zeros(1, dtype=self.dtype, device=self.device)
        return self.layers[0].self_attn.attention_path(probe)

    def step_attention(self, cache, C: int, T: int) -> StepAttention:
        """The attention of one captured step over ``cache`` (a :class:`~workbench.engine.kv_device.DeviceKVCache`)
        for C requests of T tokens, on the path the layers chose (:meth:`attention_path`)."""
        return StepAttention(cache, C, T, self.attention_path())

    @torch.no_grad()
    def forward_step(self, tokens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, tail_slots: torch.Tensor,
                     pool: torch.Tensor, attention, ops=None, capture_layers: Sequence[int] = ()
                     ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """The engine step's forward (:mod:`workbench.engine.runner`): tokens int64 [N], cos/sin float32
        [N, qk_rope_head_dim // 2], tail_slots int64 [N] (where each token's latent row goes: a padding or
        failed row's is the pool's spare row), pool [layers, slots, row_width]; ``attention`` a
        :class:`workbench.engine.attention.StepAttention` (:meth:`step_attention`); ``ops`` the torch work between the kernels
        (:func:`workbench.engine.step_ops.step_ops`, eager by default). Token ids are trusted (a range check
        would synchronise). Returns float32 logits [N, vocab] and the output hidden state [N, D] of each layer in
        ``capture_layers``. No host synchronisation on the kernel paths."""
        ops = ops or step_ops("eager")
        h = self.embed_tokens(tokens)
        captured: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            a = layer.self_attn
            q_a = a.q_a_proj.weight if a.config.q_lora_rank is not None else None
            q_b = a.q_b_proj.weight if q_a is not None else a.q_proj.weight
            q_a_ln = a.q_a_layernorm if q_a is not None else None
            w_uk, w_uv = a._wkv()
            q_lat, q_rope, rows = ops.attn_in(
                h, layer.input_layernorm.weight, layer.input_layernorm.eps, q_a,
                q_a_ln.weight if q_a_ln is not None else None, q_a_ln.eps if q_a_ln is not None else 0.0, q_b,
                a.kv_a_proj_with_mqa.weight, a.kv_a_layernorm.weight, a.kv_a_layernorm.eps, w_uk, cos, sin,
                a.H, a.dn, a.dr, a.R, a.interleave)
            kv_layer = pool[i]
            rows = rows.to(kv_layer.dtype)
            kv_layer.index_copy_(0, tail_slots, rows)
            o_lat, a.last_path = attention(q_lat, q_rope, kv_layer, rows, a.scale)
            h, y = ops.attn_out(h, o_lat, w_uv, a.o_proj.weight, layer.post_attention_layernorm.weight,
                                layer.post_attention_layernorm.eps)
            mlp = layer.mlp
            if layer.is_moe:
                g = mlp.gate
                ids, w = ops.route(y, g.weight, g.e_score_correction_bias, g.top_k, g.n_group, g.topk_group,
                                   g.norm_topk_prob, g.scaling)
                mlp.last_expert_ids = ids
                routed = mlp.experts(y, ids, w)
                sh = mlp.shared_experts
                h = ops.mlp_out(h, y, routed, sh.gate_proj.weight, sh.up_proj.weight, sh.down_proj.weight) \
                    if sh is not None else h + routed
            else:
                h = ops.mlp_out(h, y, None, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
            if i in capture_layers:
                captured[i] = h
        return self.logits_f32(h, ops.rms), captured

    def device_bytes(self) -> int:
        """Bytes the model holds on its device: every parameter and buffer storage once (the routed experts in the
        one layout they are held in, ``RoutedExperts.layout``)."""
        seen, total = set(), 0
        for t in list(self.parameters()) + list(self.buffers()):
            key = t.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
        return total

    def weight_bytes(self) -> dict[str, int]:
        """Bytes of the stored weights by part (attention, dense MLP, router, shared, routed per expert, head)."""
        def nbytes(m: nn.Module) -> int:
            return sum(t.numel() * t.element_size() for t in list(m.parameters()) + list(m.buffers()))
        out = {"embed": nbytes(self.embed_tokens), "lm_head": nbytes(self.lm_head) + nbytes(self.norm),
               "attention": 0, "dense_mlp": 0, "router": 0, "shared_experts": 0, "routed_per_expert": 0}
        for layer in self.layers:
            out["attention"] += nbytes(layer.self_attn) + nbytes(layer.input_layernorm) + \
                nbytes(layer.post_attention_layernorm)
            if layer.is_moe:
                out["router"] += nbytes(layer.mlp.gate)
                if layer.mlp.shared_experts is not None:
                    out["shared_experts"] += nbytes(layer.mlp.shared_experts)
                out["routed_per_expert"] = layer.mlp.experts.weight_bytes_per_expert()
            else:
                out["dense_mlp"] += nbytes(layer.mlp)
        return out
