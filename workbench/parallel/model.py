"""The DeepSeek-V3 / Kimi K2.x model over tensor-parallel ranks: one process per rank, each holding its shard.

:class:`TensorParallelDeepseekV3` is a :class:`~workbench.engine.model.DeepseekV3` whose layers hold
this rank's pieces (:mod:`workbench.parallel.layers` gives the splits; attention by heads with the
MLA latent KV replicated on every rank, dense MLP and shared experts by columns / rows, routed
experts by expert, lm_head by vocabulary). Its config stays the FULL model's (``vocab_size``,
``num_attention_heads``: what drafters, the KV pool and the tree build read); the modules carry
the local sizes. The single-device code runs unchanged on every rank:

- ``forward(input_ids)`` (naive prefill): full logits [..., T, V] in the model dtype (gathered);
- ``forward_batch(...)`` (:func:`workbench.engine.generate`, the engine's prefill) and
  ``forward_step(...)`` (:class:`workbench.engine.DecodeEngine`'s captured step) return a
  :class:`~workbench.parallel.layers.VocabShardedLogits` for the float32 logits: ``argmax`` is
  reduced across ranks (one int64 all-reduce), so every rank accepts the same tree nodes and
  commits the same tokens. ``forward_step`` runs the step's ``ops`` split around two all-reduces per
  layer (:func:`~workbench.parallel.layers.tp_step_ops`); on CUDA they are NCCL all-reduces captured
  inside the step's CUDA graph.

Every rank builds the same trees (the drafter's program is replicated and seeded, the tree build is
deterministic) and holds the same KV rows (the latent rows come from replicated weights and the
all-reduced residual stream). At ``TPGroup.single()`` the model computes what ``DeepseekV3``
computes, op for op.

Build: :func:`shard_model` (this rank's copy of a full model's weights: tests, small models) or
:func:`synthetic_tp_model` (K2.6 shapes with seeded synthetic weights, each rank drawing only what it
holds of the routed experts: the 8-GPU benchmark, where no process can hold the full model).
"""
from __future__ import annotations

import math
import zlib
from typing import Sequence

import torch
from torch import nn

from workbench.config import Int4Quant, ModelConfig, load_config
from workbench.engine.loader import _is_router
from workbench.engine.model import DecoderLayer, DeepseekV3, MLAttention
from workbench.engine.step_ops import step_ops
from workbench.engine.synthetic import _zero_mean_nibbles
from workbench.parallel.groups import TPGroup
from workbench.parallel.layers import (ExpertParallelMoE, RowParallelLinear, RowParallelMLP, VocabParallelHead,
                                       VocabShardedLogits, check_tp_config, shard_dim, shard_tensor, tp_step_ops)
from workbench.validation import InvalidParameter, check_int


class TensorParallelDecoderLayer(DecoderLayer):
    """One decoder layer's shard: attention over ``H / tp`` heads (``o_proj`` row parallel), the dense MLP
    (:class:`RowParallelMLP`) or the MoE (:class:`ExpertParallelMoE`); norms replicated. Build on the meta
    device (the full-size modules the base constructor makes are replaced)."""

    def __init__(self, config: ModelConfig, layer: int, int4_experts: bool, dtype: torch.dtype, group: TPGroup):
        super().__init__(config, layer, int4_experts, dtype)
        tp = group.size
        heads = config.num_attention_heads // tp
        self.self_attn = MLAttention(config.replace(num_attention_heads=heads))
        self.self_attn.o_proj = RowParallelLinear(heads * config.v_head_dim, config.hidden_size, group)
        self.mlp = (ExpertParallelMoE(config, group, int4=int4_experts, dtype=dtype) if self.is_moe
                    else RowParallelMLP(config.hidden_size, config.intermediate_size, group))


class TensorParallelDeepseekV3(DeepseekV3):
    """Rank ``group.rank``'s shard of a DeepSeek-V3 / Kimi K2.x model (module docstring). The constructor
    allocates nothing (meta device); build with :func:`build_empty_tp`, :func:`shard_model` or
    :func:`synthetic_tp_model`."""

    def __init__(self, config: ModelConfig, group: TPGroup, dtype: torch.dtype = torch.float32,
                 int4_experts: bool = False):
        check_tp_config(config, group.size)
        with torch.device("meta"):
            super().__init__(config, dtype=dtype, int4_experts=int4_experts)
            self.layers = nn.ModuleList(TensorParallelDecoderLayer(config, i, int4_experts, dtype, group)
                                        for i in range(config.num_hidden_layers))
            self.lm_head = VocabParallelHead(config.hidden_size, config.vocab_size, group)
        self.group = group

    @property
    def tp(self) -> int:
        return self.group.size

    def logits_f32(self, h: torch.Tensor, rms=None) -> VocabShardedLogits:
        """Final norm and this rank's lm_head rows: h [N, D] -> float32 logits [N, V] as a
        :class:`VocabShardedLogits` (shard [N, V/tp]; ``argmax`` reduced across ranks)."""
        shard = super().logits_f32(h, rms)
        return VocabShardedLogits(shard, self.lm_head.offset, self.config.vocab_size, self.group)

    @torch.no_grad()
    def forward_step(self, tokens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, tail_slots: torch.Tensor,
                     pool: torch.Tensor, attention, ops=None, capture_layers: Sequence[int] = ()):
        """:meth:`DeepseekV3.forward_step` with ``ops`` split around the all-reduces
        (:func:`~workbench.parallel.layers.tp_step_ops`); returns (:class:`VocabShardedLogits`, captured
        hidden states [N, D] (replicated))."""
        return super().forward_step(tokens, cos, sin, tail_slots, pool, attention,
                                    tp_step_ops(ops or step_ops("eager"), self.group), capture_layers)

    def weights(self) -> dict[str, torch.Tensor]:
        """Every parameter and buffer by name (this rank's pieces)."""
        return dict(list(self.named_parameters()) + list(self.named_buffers()))


def build_empty_tp(config: ModelConfig, group: TPGroup, dtype: torch.dtype, device, int4_experts: bool
                   ) -> TensorParallelDeepseekV3:
    """A :class:`TensorParallelDeepseekV3` with uninitialised storage on ``device`` (router float32, as
    :func:`workbench.engine.loader.build_empty`)."""
    model = TensorParallelDeepseekV3(config, group, dtype=dtype, int4_experts=int4_experts)
    for name, p in model.named_parameters():
        if p.is_floating_point() and not _is_router(name):
            p.data = torch.empty_like(p, dtype=dtype)
    model.to_empty(device=device)
    return model.eval()


def _prepare(model: DeepseekV3) -> None:
    """The fused MoE's view of each layer's experts made now, so that ``device_bytes()`` is final."""
    for layer in model.layers:
        if layer.is_moe:
            layer.mlp.experts.prepare(model.dtype)


@torch.no_grad()
def shard_model(full: DeepseekV3, group: TPGroup) -> TensorParallelDeepseekV3:
    """Rank ``group.rank``'s shard of ``full`` (any :class:`DeepseekV3`, on its device and dtype): every weight
    copied from :func:`~workbench.parallel.layers.shard_tensor`. The copy is independent of ``full``."""
    check_tp_config(full.config, group.size)
    model = build_empty_tp(full.config, group, full.dtype, full.device, full.int4_experts)
    src = dict(list(full.named_parameters()) + list(full.named_buffers()))
    for layer, whole in zip(model.layers, full.layers):
        if layer.is_moe:  # routed experts: this rank's slice, in the layout the full model holds them in
            layer.mlp.experts.copy_from(whole.mlp.experts)
    for name, t in model.weights().items():
        if ".mlp.experts." in name:
            continue
        piece = shard_tensor(name, src[name], group.rank, group.size)
        if piece.shape != t.shape:
            raise ValueError(f"{name}: the shard of {tuple(src[name].shape)} is {tuple(piece.shape)}, the rank's "
                             f"module holds {tuple(t.shape)}")
        t.copy_(piece)
    _prepare(model)
    return model


# ----------------------------------------------------------------------------- synthetic weights per rank

def _generator(device: torch.device, seed: int, *key) -> torch.Generator:
    """A generator seeded by ``seed`` and ``key`` (names, indices): the same draw on every rank and for any tp."""
    h = zlib.crc32(repr(key).encode())
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + h) % (2**63 - 1))


def _draw(name: str, shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator, device: torch.device,
          out_scale: float, group_size: int) -> torch.Tensor:
    """One weight of :func:`workbench.engine.synthetic_model`'s kind, drawn whole (full shape) from ``g``."""
    if name.endswith("_packed"):
        return _zero_mean_nibbles(torch.randint(-2**31, 2**31 - 1, shape, generator=g, device=device,
                                                dtype=torch.int32))
    if name.endswith("_scale"):
        fan_in = shape[-1] * group_size
        s = (1.0 + 0.25 * torch.rand(shape, generator=g, device=device)) / (math.sqrt(17.5) * math.sqrt(fan_in))
        return (s * (out_scale if name.endswith("down_scale") else 1.0)).to(dtype)
    if name.endswith("e_score_correction_bias"):
        return 0.01 * torch.randn(shape, generator=g, device=device)
    if len(shape) == 1:
        return (1.0 + 0.1 * torch.randn(shape, generator=g, device=device)).to(dtype)
    if name == "embed_tokens.weight":
        return torch.randn(shape, generator=g, device=device, dtype=dtype)
    std = 1.0 / math.sqrt(shape[-1])
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        std *= out_scale
    return torch.randn(shape, generator=g, device=device, dtype=dtype) * std


@torch.no_grad()
def synthetic_tp_model(config: ModelConfig | str, group: TPGroup, layers: int | None = None,
                       experts: int | None = None, seed: int = 0, device: str | torch.device | None = None,
                       dtype: torch.dtype = torch.bfloat16, int4: bool | None = None) -> TensorParallelDeepseekV3:
    """Rank ``group.rank``'s shard of a synthetic model with ``config``'s dimensions (its first ``layers`` layers,
    ``experts`` routed experts per layer; default all), drawn as :func:`workbench.engine.synthetic_model` draws
    its weights (Gaussian 1/sqrt(fan_in), residual outputs scaled by 1/sqrt(2 x layers), zero-mean INT4
    nibbles, norms near 1, the permutation lm_head: row perm[t] = embedding of t / sqrt(hidden)) but from a
    generator per weight name (and per routed expert), so that the shards of any tp put together are the
    ``TPGroup.single()`` model, and each rank draws only its own routed experts (a full K2.6 layer's are
    9.5 GB). Not the same numbers as ``synthetic_model``'s single generator."""
    base = load_config(config) if isinstance(config, str) else config
    int4 = base.expert_quant is not None if int4 is None else int4
    n = base.n_routed_experts if experts is None else check_int("experts", experts, lo=base.num_experts_per_tok)
    if n % base.n_group:
        raise InvalidParameter("experts", experts, f"an integer >= {base.num_experts_per_tok} and a multiple of "
                                                   f"n_group={base.n_group}")
    cfg = base.replace(n_routed_experts=n, expert_quant=base.expert_quant or (Int4Quant() if int4 else None),
                       num_hidden_layers=base.num_hidden_layers if layers is None else
                       check_int("layers", layers, lo=1, hi=base.num_hidden_layers))
    device = torch.device(device or group.device)
    model = build_empty_tp(cfg, group, dtype, device, int4)
    out_scale = 1.0 / math.sqrt(2 * cfg.num_hidden_layers)
    gsize = cfg.expert_quant.group_size if (int4 and cfg.expert_quant) else 32
    for name, t in model.weights().items():
        if ".mlp.experts." in name:  # [E/tp, ...]: this rank's experts, one generator per global expert
            first = group.rank * t.shape[0]
            for e in range(t.shape[0]):
                g = _generator(device, seed, name, first + e)
                t[e].copy_(_draw(name, tuple(t.shape[1:]), t.dtype, g, device, out_scale, gsize))
            continue
        if name == "lm_head.weight":
            continue
        full_shape = list(t.shape)
        dim = shard_dim(name)
        if dim is not None:
            full_shape[dim] *= group.size
        full = _draw(name, tuple(full_shape), t.dtype, _generator(device, seed, name), device, out_scale, gsize)
        t.copy_(shard_tensor(name, full, group.rank, group.size))
    # permutation head: full row perm[t] = embedding row t / sqrt(hidden); this rank's rows are ids offset..
    V, D = cfg.vocab_size, cfg.hidden_size
    perm = torch.randperm(V, generator=_generator(device, seed, "lm_head.perm"), device=device)
    inv = torch.argsort(perm)
    head = model.lm_head
    rows = inv[head.offset:head.offset + head.weight.shape[0]]
    head.weight.copy_((model.embed_tokens.weight[rows].float() / math.sqrt(D)).to(head.weight.dtype))
    _prepare(model)
    return model
