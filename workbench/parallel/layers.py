"""How each weight is split over the tensor-parallel ranks, and the layers that hold the splits.

Splits (rank r of tp holds the r-th of tp equal contiguous pieces; :func:`shard_dim` names the dimension):

| weight | split | dimension |
| --- | --- | --- |
| ``q_b_proj`` (or ``q_proj``), ``kv_b_proj`` | by attention head (column parallel) | 0 (rows ``head x ...``) |
| ``o_proj`` | by attention head (row parallel, all-reduce after) | 1 |
| ``q_a_proj``, ``kv_a_proj_with_mqa``, their norms | replicated | - |
| dense MLP and shared experts ``gate_proj`` / ``up_proj`` | by intermediate column | 0 |
| dense MLP and shared experts ``down_proj`` | by intermediate row (all-reduce after) | 1 |
| routed experts (dense ``[E, ...]``, INT4 packed or fragment layout) | by expert: rank r holds experts ``r E/tp ..`` | 0 |
| router (``gate.weight``, ``e_score_correction_bias``) | replicated | - |
| ``embed_tokens``, norms | replicated | - |
| ``lm_head`` | by vocabulary row (argmax reduced across ranks) | 0 |

Attention is split by heads and the MLA latent KV is REPLICATED on every rank, as SGLang and vLLM do
for DeepSeek-V3: the latent row of a token (``c_kv`` 512 + ``k_rope`` 64 values) is shared by all
heads, so ``kv_a_proj_with_mqa`` runs on every rank and every rank writes the same row into its own
pool; each rank's heads then attend over the full latent cache (absorbed: ``q_lat = q_nope W_UK``
with this rank's heads of ``W_UK`` / ``W_UV``). KV memory per GPU is therefore the single-GPU
figure, not 1/tp of it (``workbench.capacity`` assumes the same).

Routed experts: by expert (expert parallelism), not by tensor. The fused INT4 MoE kernels
(``workbench.moe.fused.gpu_supported``) need the expert intermediate size a multiple of 512; a
tensor split of Kimi K2.6's 2048 at TP 8 gives 256, which they do not run, while whole experts keep
every kernel, its dispatch table and the INT4 layout unchanged. The router runs replicated, so every
rank sees the same (token, expert) pairs; :class:`ExpertParallelExperts` keeps the pairs of its own
experts and gives the others weight 0 and the id of an expert the step already reads on this rank
(the kernels have no "skip this pair" id, as SGLang's and vLLM's ``expert_map`` kernels have): those
pairs cost no weight bytes but do cost their FLOPs (the whole step's routed FLOPs on every rank; a
kernel that skips id -1 would remove them). The routed and shared partial sums meet in ONE
all-reduce per MoE layer. Load balance: a rank's MoE time follows the distinct experts its own
slice gets; the per-layer all-reduce makes the slowest rank set each layer's time
(``workbench.bench.engine_tp`` counts the floor from that rank).

Dtypes: weights in the model dtype (the router float32, INT4 buffers int32 / bf16 as in
:mod:`workbench.engine.moe`); all-reduces in the model dtype (bf16 on the GPU, as SGLang's); the
lm_head's logits float32.
"""
from __future__ import annotations

import functools
import math
import re
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import ModelConfig
from workbench.engine.moe import MLP, MoE, RoutedExperts
from workbench.engine.step_ops import rms
from workbench.parallel.groups import TPGroup, unpack_argmax, value_keys
from workbench.validation import check_divisor

# (pattern on the parameter / buffer name, dimension split); first match wins; no match: replicated
_RULES = (
    (re.compile(r"\.mlp\.experts\."), 0),
    (re.compile(r"\.self_attn\.(q_b_proj|q_proj|kv_b_proj)\.weight$"), 0),
    (re.compile(r"\.self_attn\.o_proj\.weight$"), 1),
    (re.compile(r"\.mlp\.(shared_experts\.)?(gate_proj|up_proj)\.weight$"), 0),
    (re.compile(r"\.mlp\.(shared_experts\.)?down_proj\.weight$"), 1),
    (re.compile(r"^lm_head\.weight$"), 0),
)


def shard_dim(name: str) -> int | None:
    """The dimension along which the weight ``name`` (a :class:`~workbench.engine.model.DeepseekV3` parameter or
    buffer name) is split over the ranks, or None when every rank holds all of it (module docstring's table)."""
    for pat, dim in _RULES:
        if pat.search(name):
            return dim
    return None


def shard_tensor(name: str, full: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """Rank ``rank``'s piece of weight ``name`` (a view of ``full``): the ``rank``-th of ``tp`` equal contiguous
    slices along :func:`shard_dim`, or ``full`` itself when replicated. Raises when the dimension does not divide."""
    dim = shard_dim(name)
    if dim is None or tp == 1:
        return full
    n = full.shape[dim]
    if n % tp:
        raise ValueError(f"{name}: dimension {dim} of shape {tuple(full.shape)} does not split into {tp} equal parts")
    return full.narrow(dim, rank * (n // tp), n // tp)


def check_tp_config(config: ModelConfig, tp: object, name: str = "tp") -> int:
    """``tp`` as a number of tensor-parallel ranks for ``config``: an integer that divides the attention heads,
    the vocabulary, the dense intermediate size (when a layer is dense), the shared experts' intermediate size
    and the routed experts (when there are any). Raises :class:`workbench.validation.InvalidParameter` naming
    each of them and the values allowed."""
    c = config
    parts = [(c.num_attention_heads, f"the {c.num_attention_heads} attention heads"),
             (c.vocab_size, f"the vocabulary of {c.vocab_size:,}")]
    if any(not c.is_moe_layer(i) for i in range(c.num_hidden_layers)):
        parts.append((c.intermediate_size, f"the dense intermediate size {c.intermediate_size:,}"))
    if c.num_moe_layers:
        parts.append((c.n_routed_experts, f"the {c.n_routed_experts} routed experts"))
        if c.n_shared_experts:
            s = c.moe_intermediate_size * c.n_shared_experts
            parts.append((s, f"the shared experts' intermediate size {s:,}"))
    g = 0
    for v, _ in parts:
        g = math.gcd(g, v)
    what = ", ".join(w for _, w in parts[:-1]) + f" and {parts[-1][1]} of {c.name or c.model_type}"
    return check_divisor(name, tp, g, what)


# ----------------------------------------------------------------------------- layers

class RowParallelLinear(nn.Linear):
    """``x [..., in/tp] -> [..., out]``: this rank's input columns of the weight ([out, in/tp], no bias), then the
    sum over the ranks (one all-reduce, in x's dtype)."""

    def __init__(self, in_local: int, out: int, group: TPGroup):
        super().__init__(in_local, out, bias=False)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(F.linear(x, self.weight))


class VocabParallelHead(nn.Linear):
    """lm_head rows ``rank V/tp .. (rank + 1) V/tp - 1`` (weight [V/tp, D]). ``forward(x [..., D])`` returns the
    FULL logits [..., V] in x's dtype (the shards gathered: the naive prefill and checks); the engine reads
    :meth:`workbench.parallel.model.TensorParallelDeepseekV3.logits_f32` (float32 shard, argmax reduced) instead."""

    def __init__(self, hidden: int, vocab: int, group: TPGroup):
        super().__init__(hidden, vocab // group.size, bias=False)
        self.group, self.vocab = group, vocab

    @property
    def offset(self) -> int:
        return self.group.rank * (self.vocab // self.group.size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_gather_last(F.linear(x, self.weight))


class VocabShardedLogits:
    """Float32 logits [N, V] held as this rank's vocabulary shard ``shard`` [N, V/tp] (token ids ``offset ..``).

    Duck-types what the engine does with logits, with results equal on every rank: ``logits[rows]`` (leading
    dimensions only), ``argmax(-1)`` (int64 [N], the full rows' ``torch.argmax``: one int64 all-reduce, ties
    toward the lower id), ``topk(k, -1)`` (the full rows' k largest values, float32 [N, k], and ids int64; among equal
    values the ids are those the shards' ``topk`` chose, lower ranks first), ``shape``; :meth:`full` gathers the whole tensor (checks only)."""

    def __init__(self, shard: torch.Tensor, offset: int, vocab: int, group: TPGroup):
        self.shard, self.offset, self.vocab, self.group = shard, offset, vocab, group

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.shard.shape[:-1], self.vocab))

    @property
    def dtype(self) -> torch.dtype:
        return self.shard.dtype

    @property
    def device(self) -> torch.device:
        return self.shard.device

    def __getitem__(self, idx) -> "VocabShardedLogits":
        if idx is Ellipsis or (isinstance(idx, tuple) and (Ellipsis in idx or len(idx) >= self.shard.dim())):
            raise IndexError("VocabShardedLogits indexes the leading (row) dimensions only, not the vocabulary")
        return VocabShardedLogits(self.shard[idx], self.offset, self.vocab, self.group)

    def _last(self, dim: int) -> None:
        if dim not in (-1, self.shard.dim() - 1):
            raise ValueError(f"reductions over the vocabulary dimension only (dim=-1), got dim={dim}")

    def argmax(self, dim: int = -1) -> torch.Tensor:
        self._last(dim)
        rows = self.shard.reshape(-1, self.shard.shape[-1])
        return self.group.argmax(rows, self.offset, self.vocab).view(self.shard.shape[:-1])

    def topk(self, k: int, dim: int = -1):
        """The full rows' k largest logits: a ``(values, indices)`` named tuple, float32 / int64 [..., k]."""
        self._last(dim)
        lead = self.shard.shape[:-1]
        rows = self.shard.reshape(-1, self.shard.shape[-1])
        if self.group.size == 1:
            out = rows.topk(k, dim=-1)
            return torch.return_types.topk((out.values.view(*lead, k), out.indices.view(*lead, k)))
        vals, ids = rows.topk(min(k, rows.shape[-1]), dim=-1)  # this rank's candidates, then the k largest keys
        top = self.group.all_gather_last(value_keys(vals, ids + self.offset, self.vocab)).topk(k, dim=-1).values
        i, v = unpack_argmax(top, self.vocab)
        return torch.return_types.topk((v.view(*lead, k), i.view(*lead, k)))

    def full(self) -> torch.Tensor:
        """float32 [N, V]: every rank's shard gathered (an all-gather of N x V values: checks, not the step)."""
        return self.group.all_gather_last(self.shard)


class ExpertParallelExperts(RoutedExperts):
    """This rank's ``E / tp`` routed experts (global ids ``first .. first + E/tp - 1``), stored as a
    :class:`~workbench.engine.moe.RoutedExperts` of ``E / tp`` experts (dense or INT4, same layout).

    ``forward(x [N, D], ids int64 [N, k] (global), weights float32 [N, k]) -> [N, D]`` in x.dtype: the sum over
    this rank's experts only. Pairs of other ranks' experts get weight 0 and the id of the smallest local
    expert the step touches (0 if none), so they add no weight bytes (module docstring). With
    ``reduce_output`` (a layer without shared experts) the result is summed over the ranks here."""

    def __init__(self, config: ModelConfig, group: TPGroup, int4: bool = False, dtype: torch.dtype | None = None,
                 reduce_output: bool = False):
        local = config.n_routed_experts // group.size
        super().__init__(config.replace(n_routed_experts=local), int4=int4, dtype=dtype)
        self.group, self.first, self.total = group, group.rank * local, config.n_routed_experts
        self.reduce_output = reduce_output

    @torch.no_grad()
    def copy_from(self, full: RoutedExperts) -> None:
        """Hold experts ``first .. first + E/tp - 1`` of ``full`` (a RoutedExperts of all E experts, same kind) in
        the layout ``full`` holds them in (``dense``, ``packed`` or, once converted at load, ``fragments``: every
        stored tensor is [E, ...], so a slice along dimension 0 is this rank's experts in any layout)."""
        if full.int4 != self.int4 or full.num_experts != self.total:
            raise ValueError(f"experts to copy from: int4={full.int4}, {full.num_experts} experts; this rank's "
                             f"shard needs int4={self.int4} and {self.total}")
        names, n = full._storage_names(), self.num_experts
        if full.layout != self.layout:
            for name in self._storage_names():
                delattr(self, name)
            for name in names:
                src = getattr(full, name)
                self.register_buffer(name, src.new_empty((n, *src.shape[1:])))
            self.layout = full.layout
        for name in names:
            getattr(self, name).copy_(getattr(full, name)[self.first:self.first + n])
        self._int4_view = None

    def local_pairs(self, ids: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(local ids int64 [N, k] in 0..E/tp-1, weights float32 [N, k] with other ranks' pairs at 0); device ops
        only (no host synchronisation)."""
        E = self.num_experts
        lid = ids - self.first
        mine = (lid >= 0) & (lid < E)
        fill = torch.where(mine, lid, E).amin() if ids.numel() else lid.new_zeros(())
        fill = torch.where(fill == E, 0, fill)
        return torch.where(mine, lid, fill), torch.where(mine, weights, torch.zeros_like(weights))

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        if self.group.size > 1:
            ids, weights = self.local_pairs(ids, weights)
        out = super().forward(x, ids, weights)
        return self.group.all_reduce(out) if self.reduce_output else out


class ExpertParallelMoE(MoE):
    """Router (replicated), this rank's routed experts (:class:`ExpertParallelExperts`) and its 1/tp column
    slice of the shared experts; ``forward(x [N, D]) -> [N, D]`` summed over the ranks by one all-reduce."""

    def __init__(self, config: ModelConfig, group: TPGroup, int4: bool = False, dtype: torch.dtype | None = None):
        super().__init__(config, int4=int4, dtype=dtype)
        shared = config.moe_intermediate_size * config.n_shared_experts
        self.group = group
        self.experts = ExpertParallelExperts(config, group, int4=int4, dtype=dtype,
                                             reduce_output=not config.n_shared_experts)
        self.shared_experts = MLP(config.hidden_size, shared // group.size) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.shared_experts is None:
            return super().forward(x)  # the experts reduce their own output
        return self.group.all_reduce(super().forward(x))


class RowParallelMLP(MLP):
    """SwiGLU over this rank's 1/tp of the intermediate columns; ``down_proj`` a :class:`RowParallelLinear`, so
    ``forward(x [..., D]) -> [..., D]`` is the full MLP output on every rank."""

    def __init__(self, hidden: int, intermediate: int, group: TPGroup):
        super().__init__(hidden, intermediate // group.size)
        self.down_proj = RowParallelLinear(intermediate // group.size, hidden, group)


# ----------------------------------------------------------------------------- the step's torch work, split

def _attn_partial(o_lat, w_uv, o_w):
    """o_lat [N, H/tp, R] -> this rank's o_proj partial sum [N, D] (``step_ops.attn_out`` before its residual add)."""
    o = torch.einsum("nhr,hvr->nhv", o_lat.to(w_uv.dtype), w_uv)
    return F.linear(o.reshape(o.shape[0], -1), o_w)


def _add_rms(h, p, post_w, post_eps: float):
    """(h + p, its RMSNorm): ``step_ops.attn_out`` after the o_proj."""
    h = h + p
    return h, rms(h, post_w, post_eps)


def _mlp_partial(y, routed, gate_w, up_w, down_w):
    """This rank's SwiGLU slice plus its routed partial (None: a dense layer): ``step_ops.mlp_out`` before the
    residual add."""
    m = F.linear(F.silu(F.linear(y, gate_w)) * F.linear(y, up_w), down_w)
    return m if routed is None else routed + m


@functools.cache
def _pieces(mode: str) -> tuple:
    fns = (_attn_partial, _add_rms, _mlp_partial)
    if mode == "compile":
        fns = tuple(torch.compile(f, dynamic=True, fullgraph=True) for f in fns)
    return fns


def tp_step_ops(ops: SimpleNamespace, group: TPGroup) -> SimpleNamespace:
    """``ops`` (:func:`workbench.engine.step_ops.step_ops`, eager or compiled) with ``attn_out`` and ``mlp_out``
    split around an all-reduce of the partial sum ([N, D], model dtype): two all-reduces per decoder layer. At
    tp = 1 the functions compute what ``ops``' do, op for op."""
    attn_partial, add_rms, mlp_partial = _pieces(ops.mode)

    def attn_out(h, o_lat, w_uv, o_w, post_w, post_eps):
        return add_rms(h, group.all_reduce(attn_partial(o_lat, w_uv, o_w)), post_w, post_eps)

    def mlp_out(h, y, routed, gate_w, up_w, down_w):
        return h + group.all_reduce(mlp_partial(y, routed, gate_w, up_w, down_w))

    return SimpleNamespace(mode=ops.mode, rms=ops.rms, attn_in=ops.attn_in, route=ops.route, attn_out=attn_out,
                           mlp_out=mlp_out, group=group)
