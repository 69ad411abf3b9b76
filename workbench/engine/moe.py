"""Mixture of experts in the DeepSeek-V3 / Kimi K2 form.

- :class:`Router`: sigmoid scores, ``e_score_correction_bias`` added for the
  choice only, group-limited top-k (groups ranked by the sum of their top-2
  biased scores, ``topk_group`` groups kept), weights = unbiased scores of the
  chosen experts, normalised when ``norm_topk_prob``, times
  ``routed_scaling_factor``. Computed in float32.
- :class:`RoutedExperts`: the routed experts, stacked, either dense
  (``gate_proj``/``up_proj`` [E, I, D], ``down_proj`` [E, D, I]) or INT4
  compressed-tensors pack-quantized in the stacked layout of
  ``workbench.moe.Int4Experts``: ``gate_up_packed`` int32 [E, 2I, D // 8]
  (gate rows then up rows), ``gate_up_scale`` bf16 [E, 2I, D // group],
  ``down_packed`` int32 [E, D, I // 8], ``down_scale`` bf16 [E, D, I // group].
  Checkpoints load into that layout; :meth:`RoutedExperts.prepare` (at load)
  converts it to the fragment layout (``gate_up_frag`` / ``down_frag``,
  ``workbench.moe.packing``) where the fused kernels read that one
  (``workbench.moe.packing.default_layout``), and frees the packed buffers: the
  experts are held once, in the layout their kernels read (``layout``).
  ``RoutedExperts.impl`` says which path runs: ``"auto"`` (the default:
  ``workbench.moe.fused_moe_int4`` for bf16 INT4 experts on CUDA, the torch
  path otherwise), ``"fused"`` or ``"torch"`` (dequantise each touched expert
  once per call; its per-expert token counts are read on the host, so it is
  not captured in CUDA graphs). A fused kernel that fails raises; nothing
  falls back. ``last_path`` records what ran.
- :class:`MLP`: SwiGLU (dense layers and shared experts).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import ModelConfig
from workbench.int4 import dequantize_int4
from workbench.moe.fused import fused_moe_int4, gpu_supported
from workbench.moe.packing import Int4Experts, default_layout

PROJS = ("gate_proj", "up_proj", "down_proj")
IMPLS = ("auto", "fused", "torch")


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``; x [..., D] -> [..., D]."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """``forward(x [N, D]) -> (topk_ids int64 [N, k], topk_weights float32 [N, k])``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        E = config.n_routed_experts
        if config.scoring_func != "sigmoid":
            raise ValueError(f"unsupported scoring_func {config.scoring_func!r}; allowed: sigmoid")
        if E % config.n_group:
            raise ValueError(f"n_routed_experts {E} is not a multiple of n_group {config.n_group}")
        if not 1 <= config.topk_group <= config.n_group:
            raise ValueError(f"topk_group must be in 1..n_group={config.n_group}, got {config.topk_group}")
        self.weight = nn.Parameter(torch.empty(E, config.hidden_size, dtype=torch.float32))
        self.register_buffer("e_score_correction_bias", torch.zeros(E, dtype=torch.float32))
        self.top_k = config.num_experts_per_tok
        self.n_group, self.topk_group = config.n_group, config.topk_group
        self.norm_topk_prob = config.norm_topk_prob
        self.scaling = config.routed_scaling_factor

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        N = x.shape[0]
        E = self.weight.shape[0]
        scores = F.linear(x.float(), self.weight.float()).sigmoid()
        choice = scores + self.e_score_correction_bias
        if self.n_group > 1:
            group_scores = choice.view(N, self.n_group, E // self.n_group).topk(2, dim=-1)[0].sum(-1)
            group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
            group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0)
            score_mask = group_mask.unsqueeze(-1).expand(N, self.n_group, E // self.n_group).reshape(N, E)
            choice = choice.masked_fill(score_mask == 0, float("-inf"))
        ids = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)[1]
        w = scores.gather(1, ids)
        if self.norm_topk_prob:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return ids, w * self.scaling


class RoutedExperts(nn.Module):
    """Stacked routed experts; ``forward(x [N, D], ids [N, k], weights [N, k]) -> [N, D]`` in x.dtype."""

    def __init__(self, config: ModelConfig, int4: bool = False, dtype: torch.dtype | None = None):
        super().__init__()
        E, D, I = config.n_routed_experts, config.hidden_size, config.moe_intermediate_size
        self.num_experts, self.hidden, self.intermediate = E, D, I
        self.int4 = int4
        shapes = {"gate_proj": (I, D), "up_proj": (I, D), "down_proj": (D, I)}
        self.shapes = shapes
        if int4:
            g = (config.expert_quant.group_size if config.expert_quant else 32)
            self.group_size = g
            if D % g or I % g:
                raise ValueError(f"expert dims {D}, {I} must be multiples of the group size {g}")
            self.register_buffer("gate_up_packed", torch.empty(E, 2 * I, D // 8, dtype=torch.int32))
            self.register_buffer("gate_up_scale", torch.empty(E, 2 * I, D // g, dtype=torch.bfloat16))
            self.register_buffer("down_packed", torch.empty(E, D, I // 8, dtype=torch.int32))
            self.register_buffer("down_scale", torch.empty(E, D, I // g, dtype=torch.bfloat16))
        else:
            for name, (o, i) in shapes.items():
                self.register_parameter(name, nn.Parameter(torch.empty(E, o, i, dtype=dtype)))
        self.layout = "packed" if int4 else "dense"  # "fragments" once prepare() converted them
        self.impl = "auto"  # "auto", "fused" or "torch" (module docstring)
        self.last_path: str | None = None  # which path the last forward took
        self._int4_view = None

    def int4_slot(self, proj: str, kind: str, e: int) -> torch.Tensor:
        """The view of the stacked INT4 storage holding ``proj``'s ``kind`` (packed/scale) of expert e (packed
        layout: what a checkpoint loads into)."""
        if self.layout != "packed":
            raise ValueError(f"these experts hold the {self.layout} layout; the packed storage was converted at load")
        I = self.intermediate
        if proj == "down_proj":
            return getattr(self, f"down_{kind}")[e]
        rows = slice(0, I) if proj == "gate_proj" else slice(I, 2 * I)
        return getattr(self, f"gate_up_{kind}")[e, rows]

    def _gate_up(self, e: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_gate_up [2I, D], W_down [D, I]) of expert e in ``dtype`` (dequantised for INT4)."""
        if self.layout == "fragments":
            return self.as_int4_experts().dequantize(e, dtype)
        if self.int4:
            gu = dequantize_int4(self.gate_up_packed[e], self.gate_up_scale[e], dtype=dtype)
            dn = dequantize_int4(self.down_packed[e], self.down_scale[e], dtype=dtype)
            return gu, dn
        return torch.cat([self.gate_proj[e], self.up_proj[e]]).to(dtype), self.down_proj[e].to(dtype)

    def expert_weight(self, name: str, e: int, dtype: torch.dtype) -> torch.Tensor:
        """Weight ``name`` (gate_proj/up_proj/down_proj) of expert ``e`` as ``dtype`` [out, in]."""
        if self.layout == "fragments":
            gu, dn = self._gate_up(e, dtype)
            I = self.intermediate
            return {"gate_proj": gu[:I], "up_proj": gu[I:], "down_proj": dn}[name]
        if self.int4:
            return dequantize_int4(self.int4_slot(name, "packed", e), self.int4_slot(name, "scale", e), dtype=dtype)
        return getattr(self, name)[e].to(dtype)

    def _storage_names(self) -> tuple[str, ...]:
        return {"dense": PROJS, "packed": ("gate_up_packed", "gate_up_scale", "down_packed", "down_scale"),
                "fragments": ("gate_up_frag", "down_frag")}[self.layout]

    def weight_bytes_per_expert(self) -> int:
        """Bytes of one expert's stored weights (the same in the packed and the fragment layout)."""
        return sum(getattr(self, n)[0].numel() * getattr(self, n).element_size() for n in self._storage_names())

    def prepare(self, dtype: torch.dtype) -> None:
        """At load: when the fused path will run for inputs of ``dtype`` (INT4 experts of group 32 on CUDA, bf16),
        hold the experts in the layout its kernels read (the fragment layout where the dispatch runs small-M kernels:
        converted now, one expert at a time, and the packed buffers freed) and make the fused MoE's view, so that the
        model's device bytes are final."""
        if not self.int4 or self.layout != "packed":
            return
        probe = torch.empty(0, dtype=dtype, device=self.gate_up_packed.device)
        if self.group_size != 32 or self.path(probe) != "fused":
            return
        if default_layout(probe.device, self.hidden, self.intermediate) == "fragments":
            self.to_fragment_layout()
        self.as_int4_experts()

    def to_fragment_layout(self) -> None:
        """Convert the packed INT4 storage to the fragment layout (``gate_up_frag`` int32 [E, D/256, 2I/16, 4, 144],
        ``down_frag`` int32 [E, I/256, D/16, 4, 144]), one expert at a time, and free the packed buffers."""
        if self.layout != "packed" or self.group_size != 32:
            raise ValueError(f"only packed INT4 experts of group 32 convert (layout {self.layout!r}, "
                             f"group {getattr(self, 'group_size', None)})")
        ex = Int4Experts(self.gate_up_packed, self.gate_up_scale, self.down_packed, self.down_scale,
                         self.group_size, layout="fragments")
        for name in ("gate_up_packed", "gate_up_scale", "down_packed", "down_scale"):
            delattr(self, name)
        self.register_buffer("gate_up_frag", ex.gate_up_frag)
        self.register_buffer("down_frag", ex.down_frag)
        self.layout = "fragments"
        self._int4_view = None

    def as_int4_experts(self):
        """A zero-copy ``workbench.moe.Int4Experts`` over this storage (INT4 only), in its layout."""
        first = getattr(self, self._storage_names()[0])
        if self._int4_view is None or self._int4_view.tensors()[0].data_ptr() != first.data_ptr():
            if self.layout == "fragments":
                self._int4_view = Int4Experts.from_fragments(self.gate_up_frag, self.down_frag)
            else:
                self._int4_view = Int4Experts(self.gate_up_packed, self.gate_up_scale, self.down_packed,
                                              self.down_scale, self.group_size, layout="packed")
        return self._int4_view

    def path(self, x: torch.Tensor) -> str:
        """``"fused"`` or ``"torch"``: what :meth:`forward` runs for input ``x`` under ``self.impl``."""
        if self.impl not in IMPLS:
            raise ValueError(f"RoutedExperts.impl={self.impl!r} is not allowed: one of {', '.join(IMPLS)}")
        fusable = self.int4 and x.is_cuda and x.dtype == torch.bfloat16
        if self.impl == "fused" and not fusable:
            raise ValueError("impl='fused' needs INT4 experts and bf16 input on a CUDA device "
                             f"(int4={self.int4}, device={x.device}, dtype={x.dtype})")
        return "fused" if self.impl == "fused" or (self.impl == "auto" and fusable) else "torch"

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [N, D], ids int64 [N, k], weights float32 [N, k] -> [N, D] in x.dtype."""
        if self.path(x) == "fused":
            exp = self.as_int4_experts()
            why = gpu_supported(exp)
            if why is not None:
                raise ValueError(f"fused_moe_int4 does not run these experts ({why}); set impl='torch'")
            self.last_path = "workbench.moe.fused_moe_int4"
            return fused_moe_int4(x, ids, weights, exp, validate=False)
        self.last_path = "torch (dequantise each touched expert)"
        out = torch.zeros_like(x)
        I = self.intermediate
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        tok = order // ids.shape[1]
        slot = order % ids.shape[1]
        start = 0
        for e, c in enumerate(counts):
            if c == 0:
                continue
            t, s = tok[start:start + c], slot[start:start + c]
            start += c
            xe = x[t]
            w_gu, w_dn = self._gate_up(e, x.dtype)
            gu = F.linear(xe, w_gu)
            h = F.silu(gu[:, :I]) * gu[:, I:]
            ye = F.linear(h, w_dn) * weights[t, s, None]
            out.index_add_(0, t, ye.to(out.dtype))
        return out


class MoE(nn.Module):
    """Router + routed experts + shared experts; ``forward(x [N, D]) -> [N, D]``.

    ``last_expert_ids`` keeps the last call's routing (for byte counting in benchmarks).
    """

    def __init__(self, config: ModelConfig, int4: bool = False, dtype: torch.dtype | None = None):
        super().__init__()
        self.gate = Router(config)
        self.experts = RoutedExperts(config, int4=int4, dtype=dtype)
        self.shared_experts = (MLP(config.hidden_size, config.moe_intermediate_size * config.n_shared_experts)
                               if config.n_shared_experts else None)
        self.last_expert_ids: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, w = self.gate(x)
        self.last_expert_ids = ids
        y = self.experts(x, ids, w)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        return y
