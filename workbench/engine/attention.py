"""Absorbed MLA attention over the latent KV pool: the torch reference and the captured step's attention.

- :func:`latent_attention_torch`: one request's tree or chain of new tokens over its committed slots, in float32
  (the CPU path, and the reference the verify kernel is checked against).
- :class:`StepAttention`: one step's attention for C requests of T tokens over the engine's device slot table:
  one ``workbench.ddtree.verify_attention_batched`` call per layer on CUDA (captured in graphs), or request by
  request through :func:`latent_attention_torch`. :func:`verify_chunk_keys` is the kernel's split of the keys.

The model chooses the path (``MLAttention.impl``: kernel or torch) and makes the step's attention
(:meth:`workbench.engine.model.DeepseekV3.step_attention`); the KV cache only stores rows.
"""
from __future__ import annotations

import torch

from workbench.ddtree import tree_visibility, verify_attention_batched


def latent_attention_torch(q_lat: torch.Tensor, q_rope: torch.Tensor, kv_layer: torch.Tensor,
                           prefix_slots: torch.Tensor, tail_kv: torch.Tensor, visibility: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """Absorbed MLA attention, torch reference path.

    q_lat [T, H, R], q_rope [T, H, Dr], kv_layer [S, R + Dr] (the pool of one layer),
    prefix_slots int64 [P], tail_kv [T, R + Dr], visibility bool [T, T].
    Returns the latent output [T, H, R] in float32.
    """
    R = q_lat.shape[-1]
    keys = torch.cat([kv_layer[prefix_slots], tail_kv.to(kv_layer.dtype)], 0).float()  # [P+T, R+Dr]
    s = torch.einsum("thr,sr->ths", q_lat.float(), keys[:, :R])
    s = s + torch.einsum("thd,sd->ths", q_rope.float(), keys[:, R:])
    s = s * scale
    P = prefix_slots.shape[0]
    mask = torch.cat([torch.ones(visibility.shape[0], P, dtype=torch.bool, device=visibility.device),
                      visibility], 1)
    s = s.masked_fill(~mask[:, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("ths,sr->thr", p, keys[:, :R])


def verify_row_blocks(T: int, heads: int) -> int:
    """64-row blocks of one request's (nodes x heads) query rows in the verify kernel."""
    return -(-T * heads // 64)


def verify_chunk_keys(capacity: int, T: int, heads: int, C: int, sms: int) -> int:
    """Keys per thread block of the captured step's verify kernel: a request's ``capacity`` (slots, not its live
    length: the graph's grid is fixed at capture) split so that the C requests' (64-row blocks x key chunks) fill
    the ``sms`` multiprocessors once. At C = 1, T = 33 nodes, 64 heads on 132 multiprocessors that is 4 chunks of
    capacity / 4 keys: a prefix shorter than the capacity runs on fewer thread blocks, each up to capacity / 4 keys
    long (``papers/context_diagnosis.md``)."""
    per_request = max(1, sms // (C * verify_row_blocks(T, heads)))
    return max(64, -(-(capacity + T) // per_request // 64) * 64)


class StepAttention:
    """Absorbed-MLA attention of one step over a :class:`~workbench.engine.kv_device.DeviceKVCache`: C requests of
    T new tokens. The model makes it (:meth:`workbench.engine.model.DeepseekV3.step_attention`) with the path its
    attention modules chose; the cache only stores.

    :meth:`prepare` (once per step, before the forward) lays the first C rows' committed slots end
    to end (``prefix`` int64 [C x capacity], ``offsets`` int64 [C + 1], device ops only) and takes
    the tree's ``parents`` int64 [C, T] (None: T = 1, decode). Calling it per layer with
    q_lat [N, H, R], q_rope [N, H, Dr], kv_layer [slots, R + Dr], tail rows [N, R + Dr] (N = C x T)
    returns (the latent output [N, H, R] (kernel: the input dtype; torch: float32), the path that ran):

    - ``"kernel"``: one ``workbench.ddtree.verify_attention_batched`` call over every request's
      nodes (CUDA, latent 512 + rope 64; no host synchronisation: captured in graphs);
    - ``"torch"``: request by request through ``latent_attention_torch`` with the lengths read on
      the host (the CPU path, and the eager reference on CUDA; not capturable).
    """

    def __init__(self, cache, C: int, T: int, impl: str):
        if impl not in ("kernel", "torch"):
            raise ValueError(f"impl={impl!r} is not allowed: 'kernel' or 'torch'")
        self.cache, self.C, self.T, self.impl = cache, C, T, impl
        dev = cache.device
        self.prefix = torch.zeros(C * cache.capacity + 1, dtype=torch.int64, device=dev)
        self.offsets = torch.zeros(C + 1, dtype=torch.int64, device=dev)
        self.parents: torch.Tensor | None = None
        self._vis: list[torch.Tensor] | None = None
        self._lens: list[int] | None = None

    def prepare(self, parents: torch.Tensor | None) -> None:
        c, C = self.cache, self.C
        self.parents = parents if parents is not None else torch.full((C, 1), -1, dtype=torch.int64,
                                                                       device=c.device)
        if self.impl == "kernel":
            lens = c.lengths[:C]
            self.offsets[1:] = torch.cumsum(lens, 0)
            valid = c._cols < lens[:, None]
            pos = torch.where(valid, self.offsets[:C, None] + c._cols, C * c.capacity)
            self.prefix.scatter_(0, pos.reshape(-1), c.table[:C].reshape(-1))
        else:
            self._lens = c.lengths[:C].tolist()
            par = self.parents.cpu()
            self._vis = [tree_visibility(par[b:b + 1])[0].to(c.device) for b in range(C)]

    def chunk_len(self, heads: int) -> int:
        """Keys per thread block of the verify kernel in this step (:func:`verify_chunk_keys`)."""
        sms = torch.cuda.get_device_properties(self.cache.device).multi_processor_count
        return verify_chunk_keys(self.cache.capacity, self.T, heads, self.C, sms)

    def __call__(self, q_lat, q_rope, kv_layer, tail, scale: float):
        C, T = self.C, self.T
        N, H, R = q_lat.shape
        if self.impl == "kernel":
            dt = kv_layer.dtype
            o, _ = verify_attention_batched(q_lat.to(dt).view(C, T, H, R), q_rope.to(dt).view(C, T, H, -1),
                                            kv_layer, self.prefix[:C * self.cache.capacity], self.offsets,
                                            tail.view(C, T, -1), self.parents, scale, check=False,
                                            chunk_len=self.chunk_len(H))
            return o.view(N, H, R), "workbench.ddtree.verify_attention_batched"
        outs = []
        for b in range(C):
            sl = slice(b * T, (b + 1) * T)
            pre = self.cache.table[b, :self._lens[b]]
            outs.append(latent_attention_torch(q_lat[sl], q_rope[sl], kv_layer, pre, tail[sl], self._vis[b], scale))
        return torch.cat(outs, 0), "torch (request by request)"
