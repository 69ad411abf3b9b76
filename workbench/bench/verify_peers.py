"""Peers of the tree-verify attention kernel (:mod:`workbench.ddtree.verify`), timed beside it by
:mod:`workbench.bench.ddtree` (:data:`PEERS`): same arguments as :func:`~workbench.ddtree.verify.verify_attention`,
each returns ``(out [T, H, 512], lse [T, H] float32)``.

- :func:`verify_attention_naive` - gather the prefix, one matmul for the scores, mask the tail, softmax,
  matmul (matmuls in the input dtype, softmax in float32).
- :func:`verify_attention_sdpa` - torch SDPA with a dense boolean mask.
- :func:`verify_attention_flex` - FlexAttention, where it compiles (it did not for 576/512 head
  dimensions on the H200: the benchmark records the status).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from workbench.ddtree.verify import D_KV, D_LATENT, _torch_verify, _visibility_torch

__all__ = ["PEERS", "verify_attention_naive", "verify_attention_sdpa", "verify_attention_flex"]


def verify_attention_naive(q_latent, q_rope, kv_cache, prefix_slots, tail_kv, parents, scale):
    """Peer: gather the prefix, one matmul for scores, mask the tail, softmax, matmul.

    Same arguments as :func:`verify_attention`; matmuls in the input dtype,
    softmax in float32. Returns ``(out [T, H, 512], lse [T, H] float32)``.
    """
    return _torch_verify(q_latent, q_rope, kv_cache, prefix_slots, tail_kv, parents, scale)


def _dense_mask(parents, P: int):
    T = parents.shape[0]
    vis = _visibility_torch(parents)
    return torch.cat([torch.ones(T, P, dtype=torch.bool, device=parents.device), vis], 1)  # [T, P+T]


def verify_attention_sdpa(q_latent, q_rope, kv_cache, prefix_slots, tail_kv, parents, scale):
    """Peer: ``torch.nn.functional.scaled_dot_product_attention`` with a dense boolean mask.

    Query [1, H, T, 576], keys [1, H, P+T, 576] (one latent row broadcast over
    heads), values = the c_kv part. Returns ``(out [T, H, 512], None)`` (SDPA
    gives no log-sum-exp).
    """
    T, H = q_latent.shape[:2]
    P = prefix_slots.shape[0]
    keys = torch.cat([kv_cache.index_select(0, prefix_slots.long()), tail_kv], 0)
    q = torch.cat([q_latent, q_rope], -1).permute(1, 0, 2)[None]            # [1, H, T, 576]
    k = keys[None, None].expand(1, H, P + T, D_KV)
    v = keys[None, None, :, :D_LATENT].expand(1, H, P + T, D_LATENT)
    mask = _dense_mask(parents, P)[None, None]
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # [1, H, T, 512]
    return o[0].permute(1, 0, 2).contiguous(), None


_FLEX_CACHE: dict[str, Any] = {}


def verify_attention_flex(q_latent, q_rope, kv_cache, prefix_slots, tail_kv, parents, scale):
    """Peer: FlexAttention (``torch.compile``d) with a block mask; raises where it does not compile.

    Returns ``(out [T, H, 512], lse [T, H] float32)``. Failures (head dims 576/512
    are outside what its kernels accept in some torch versions) propagate as the
    original exception; the benchmark records them as unsupported.
    """
    if "fn" not in _FLEX_CACHE:
        _FLEX_CACHE["fn"] = torch.compile(flex_attention, dynamic=False)
    T, H = q_latent.shape[:2]
    P = prefix_slots.shape[0]
    keys = torch.cat([kv_cache.index_select(0, prefix_slots.long()), tail_kv], 0)
    vis = _visibility_torch(parents)

    def mask_mod(b, h, q_idx, kv_idx):
        t = (kv_idx - P).clamp(min=0)
        return (kv_idx < P) | vis[q_idx, t]

    bm = create_block_mask(mask_mod, 1, 1, T, P + T, device=q_latent.device)
    q = torch.cat([q_latent, q_rope], -1).permute(1, 0, 2)[None]
    k = keys[None, None]
    v = keys[None, None, :, :D_LATENT]
    o, l = _FLEX_CACHE["fn"](q, k, v, block_mask=bm, scale=scale, enable_gqa=True, return_lse=True)
    return o[0].permute(1, 0, 2).contiguous(), l[0].permute(1, 0).float()


PEERS = {"naive_torch": verify_attention_naive, "sdpa_dense_mask": verify_attention_sdpa,
         "flex_attention": verify_attention_flex}
"""The peers by the names the measurement files use."""
