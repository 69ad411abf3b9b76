"""The step's torch work between the custom kernels, as a few functions that ``torch.compile`` can fuse.

One decoder layer of :meth:`workbench.engine.model.DeepseekV3.forward_step` is

    attn_in  (input RMSNorm, q_a / q_b or q projection, q_a RMSNorm, kv_a projection,
              kv_a RMSNorm, YaRN rope of q and k, q_lat = q_nope W_UK)
    -> KV write + verify-attention kernel ->
    attn_out (W_UV, o_proj, residual add, post-attention RMSNorm)
    -> route (router scores, top-k, weights) -> fused INT4 MoE kernel ->
    mlp_out  (shared experts or the dense MLP, residual add)

Each function computes exactly what the modules of :mod:`workbench.engine.model`
and :mod:`workbench.engine.moe` compute, op for op (so the eager step equals
:func:`workbench.engine.generate` bit for bit on the CPU). :func:`step_ops`
returns them as they are (``"eager"``) or each wrapped in
``torch.compile(dynamic=True)`` (``"compile"``: Inductor fuses the norms, rope,
casts and residual adds around the matrix products into a few Triton kernels;
CUDA only). Shapes: N tokens, D hidden, H heads, R = kv_lora_rank, Dr =
qk_rope_head_dim; activations in the model dtype.
"""
from __future__ import annotations

import functools
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from workbench.engine.rope import apply_rope

FUSE_MODES = ("eager", "compile")


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """``w * (x / rms(x))`` normalised in float32 and cast back (RMSNorm.forward)."""
    dt = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(dt)


def attn_in(x, ln_w, ln_eps: float, q_a, q_a_ln, q_a_eps: float, q_b, kv_a, kv_ln, kv_eps: float, w_uk,
            cos, sin, H: int, dn: int, dr: int, R: int, interleave: bool):
    """x [N, D] (the residual stream) -> q_lat [N, H, R], q_rope [N, H, Dr] (roped), latent rows [N, R + Dr].
    ``q_a`` None: ``q_b`` is the plain q projection (no q LoRA). w_uk [H, dn, R]."""
    y = rms(x, ln_w, ln_eps)
    q = F.linear(y, q_b) if q_a is None else F.linear(rms(F.linear(y, q_a), q_a_ln, q_a_eps), q_b)
    q = q.view(*y.shape[:-1], H, dn + dr)
    q_nope, q_rope = q.split([dn, dr], dim=-1)
    q_rope = apply_rope(q_rope, cos.unsqueeze(-2), sin.unsqueeze(-2), interleave)
    ckv, k_rope = F.linear(y, kv_a).split([R, dr], dim=-1)
    rows = torch.cat([rms(ckv, kv_ln, kv_eps), apply_rope(k_rope, cos, sin, interleave)], -1)
    return torch.einsum("nhd,hdr->nhr", q_nope, w_uk), q_rope, rows


def attn_out(h, o_lat, w_uv, o_w, post_w, post_eps: float):
    """h [N, D], o_lat [N, H, R] (attention output in the latent space) -> (h + o_proj(o_lat W_UV^T),
    its post-attention RMSNorm), both [N, D] (MLAttention.project_out, the residual add, the norm)."""
    o = torch.einsum("nhr,hvr->nhv", o_lat.to(w_uv.dtype), w_uv)
    h = h + F.linear(o.reshape(o.shape[0], -1), o_w)
    return h, rms(h, post_w, post_eps)


def route(y, gate_w, bias, top_k: int, n_group: int, topk_group: int, norm_topk: bool, scaling: float):
    """Router.forward: y [N, D] -> (expert ids int64 [N, top_k], weights float32 [N, top_k])."""
    N = y.shape[0]
    E = gate_w.shape[0]
    scores = F.linear(y.float(), gate_w.float()).sigmoid()
    choice = scores + bias
    if n_group > 1:
        group_scores = choice.view(N, n_group, E // n_group).topk(2, dim=-1)[0].sum(-1)
        group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0)
        score_mask = group_mask.unsqueeze(-1).expand(N, n_group, E // n_group).reshape(N, E)
        choice = choice.masked_fill(score_mask == 0, float("-inf"))
    ids = torch.topk(choice, k=top_k, dim=-1, sorted=False)[1]
    w = scores.gather(1, ids)
    if norm_topk:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return ids, w * scaling


def mlp_out(h, y, routed, gate_w, up_w, down_w):
    """h + (routed + down(silu(gate(y)) * up(y))): the shared experts (routed [N, D]) or, with ``routed``
    None, the dense MLP, and the residual add."""
    m = F.linear(F.silu(F.linear(y, gate_w)) * F.linear(y, up_w), down_w)
    return h + (m if routed is None else routed + m)


@functools.cache
def step_ops(mode: str = "eager") -> SimpleNamespace:
    """The functions above, eager or each compiled once per process (``torch.compile(dynamic=True)``)."""
    if mode not in FUSE_MODES:
        raise ValueError(f"fuse={mode!r} is not allowed: one of {', '.join(FUSE_MODES)}")
    fns = {"rms": rms, "attn_in": attn_in, "attn_out": attn_out, "route": route, "mlp_out": mlp_out}
    if mode == "compile":
        fns = {k: torch.compile(f, dynamic=True, fullgraph=True) for k, f in fns.items()}
    return SimpleNamespace(mode=mode, **fns)
