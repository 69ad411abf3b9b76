"""Tree-verify attention, MLA absorbed: reference, CUDA kernel, peers, parity, benchmark.

One DDTree verify step attends every tree node's query heads over the request's
prefix KV (read through slot indices: paged KV with page_size 1) plus the
tree tail, where node ``i`` sees tail row ``t`` only when ``t`` is ``i`` or one
of its ancestors. With absorbed MLA a KV row is ``[c_kv (512) | k_rope (64)]``,
the score is ``(q_latent . c_kv + q_rope . k_rope) * scale`` and the output is
the softmax-weighted ``c_kv`` (512 values; ``W_UV`` is applied afterwards).

- :func:`verify_attention_reference` - float64 ground truth (NumPy or torch).
- :func:`verify_attention` / :func:`verify_attention_batched` - the CUDA kernel
  (``workbench/kernels/ddtree_verify.cu``): the prefix is split across thread
  blocks (flash-decoding), each block reads a chunk of latent rows once for 64
  query rows (every head of every node in the block) with bf16 tensor cores
  (``mma.sync`` m16n8k16), the masked tail is the last chunk, and the chunk
  partials are merged by log-sum-exp. float32 inputs take a CUDA-core path.
  CPU tensors take a torch path (float32 arithmetic).
- Peers: :func:`verify_attention_naive` (gather, matmul, mask, softmax),
  :func:`verify_attention_sdpa` (torch SDPA with a dense boolean mask),
  :func:`verify_attention_flex` (FlexAttention, where it compiles).
- :func:`verify_parity_rows` - parity table rows against the reference.
- :func:`benchmark_verify` - timings against peers and the floor
  ``max(bytes / copy bandwidth, flops / bf16 matrix rate)`` measured in the
  same process; ``python -m workbench.ddtree.verify --out DIR`` writes
  ``DIR/ddtree_verify.json``.

Kernel notes (numbers: ``data/measurements/h200/ddtree_verify.json``). The bf16
default on the H200 is ``impl="wgmma"``: Hopper warpgroup MMA, which needs the
sm_90a target, so this one kernel is built with nvcc
(``workbench.kernels.load_module(..., target="sm_90a")``); where that cannot
load, ``auto`` runs the previous ``mma.sync`` kernel (``impl="mma"``, NVRTC,
plain sm_90). wgmma kernel: 2 warpgroups, 64 query rows x 64 keys per tile,
Q (73.7 KB) and two key stages (2 x 73.7 KB) in 128-byte-swizzled shared
memory; warpgroup g computes the scores of keys 32g..32g+31 (m64n32k16, Q and
K both K-major through matrix descriptors), the row maxima are exchanged, P
(bf16) goes to shared memory, and warpgroup g accumulates output columns
256g..256g+255 (m64n256k16, V = the same key tile read MN-major through the
descriptor's transpose bit); 218 registers, no spills. Every KV row is read
once per 64-row block, so a 64 x 64 tile moves 73.7 KB from L2 for 8.9 MFLOP:
on the H200 a tile takes about 3 us per SM where its flops alone would take
1.5 us at the measured matmul rate. Nsight Compute sees neither memory nor
compute near a peak (latency-bound: one 8-warp block per SM, all warps in
lockstep); starting the gather later made it slower, but so did a 32-key
ring with three gathers in flight (commit 967a0d4): the per-tile fixed work
(three block barriers, the softmax, the wgmma issue-and-wait round trips)
costs as much as the gather's latency. Since 5de266b the row maxima are
exchanged on a named barrier per warp pair (warps w and w+4 share rows) and
O is rescaled only when a row maximum moved.
With H = 8 the 264 query rows fill five 64-row blocks, the last with 8 rows. The chunk partials are
merged by a second launch (one block per query row, chunks read in parallel);
one small launch before prepares offsets, chunk starts and the ancestor masks.

Not the default, NOT YET RUN ON A GPU (written without device time; the next session runs
``workbench/ddtree/h200_verify_pingpong.sh``):

- ``impl="pingpong"`` (``ddtree_verify_pingpong_bf16``): the next step the profile named, overlap
  across warpgroups. FlashMLA's "seesaw" schedule adapted to the cp.async gather: per round two
  64-key tiles (A in stage 0, B in stage 1); WG0 computes S_A (m64n64k16, a row's 64 keys in one
  lane quad, so no max exchange), its softmax, and O[:, :256] += P_A V_A with P_A from registers
  (RS wgmma); WG1 computes S_B under WG0's softmax, takes m and P_A through shared memory (P_A in
  stage 0's rope block, free once S_A is done), runs O[:, 256:] += P_A V_A while it does its own
  softmax, and publishes P_B for WG0's O[:, :256] += P_B V_B. Two named barriers per round, no
  block barrier in the loop. Each stage is refilled in two column-block groups by the warpgroup
  that reads them last, right after that read; completion goes to one of four mbarriers through
  cp.async.mbarrier.arrive.noinc. 246 registers, no spills.
- ``impl="pingpong_rem"`` (``ddtree_verify_pingpong_rem_bf16``): H = 8's padding. Where the last row
  block holds at most 8 rows it runs with swapped operands (S^T = K Q^T and O^T += V^T P^T, wgmma
  m64n8k16: an eighth of a 64-row block's tensor work per tile) and takes 3 key chunks per thread
  block, so the full row blocks get 30 chunks instead of 26 on 132 SMs (:func:`_plan_rem`).
- Predicted before any run (model: fixed part + tiles per block x time per tile, fitted to the
  committed file; ping-pong at 2.1 us per tile, range 1.9-2.5, against 2.8-2.9 today):
  pingpong H=64 4k/16k/64k/128k 0.066/0.167/0.570/1.11 ms (39/61/71/73% of floor), H=8
  0.032/0.046/0.109/0.192 ms (10/28/47/53%); pingpong_rem H=8 0.032/0.045/0.100/0.171 ms
  (10/28/51/59%). The fixed part (about 25-29 us: three launches, Q and first tile, partial write
  and merge) is untouched, so H=8 at 4k/16k and H=64 at 4k stay below 50% whatever the tile rate.
"""
from __future__ import annotations

import argparse
import math
import time
from typing import Any, Iterable, Sequence

import numpy as np

from workbench.kernels import launch as _launch
from workbench.sanitizer import read_logs, stated_count, summary_lines

D_LATENT = 512  # kv_lora_rank: c_kv width and output width
D_ROPE = 64     # qk_rope_head_dim
D_KV = D_LATENT + D_ROPE

_MMA_ROWS = 64      # query rows per block, tensor-core kernel (impl "mma")
_SIMPLE_ROWS = 16   # query rows per block, CUDA-core kernel
_MMA_SMEM = 230_400
_WGMMA_SMEM = 231_424
_PINGPONG_SMEM = 223_296  # Q + two key stages + exchange + 4 mbarriers + 1024 alignment slack
_REM_SMEM = 231_680       # pingpong_rem: its remainder blocks' 3 stages + 8 Q rows + exchange + slack (the larger)
_REM_MAX_ROWS = 8         # pingpong_rem: the last row block goes by swapped operands (wgmma n8) when it has <= 8 rows
_REM_CHUNKS = 3           # pingpong_rem: key chunks per remainder thread block
_SIMPLE_SMEM = (16 * 576 + 32 * 577 + 16 * 32 + 3 * 16) * 4
_IMPLS = ("auto", "wgmma", "pingpong", "pingpong_rem", "mma", "simple")
_WGMMA_TARGET = "sm_90a"  # workbench.kernels.load_module target of the wgmma kernel
_WGMMA_KERNEL = "ddtree_verify_wgmma_bf16"  # 64-key tiles, 2 stages (a 32-key 4-stage ring: commit 967a0d4)
_PINGPONG_KERNEL = "ddtree_verify_pingpong_bf16"  # seesaw ping-pong over pairs of 64-key tiles (not yet run on a GPU)
_PINGPONG_REM_KERNEL = "ddtree_verify_pingpong_rem_bf16"  # + the last <= 8 rows by swapped operands (not yet run)

__all__ = [
    "D_KV", "D_LATENT", "D_ROPE",
    "verify_attention_reference", "verify_attention", "verify_attention_batched",
    "verify_attention_naive", "verify_attention_sdpa", "verify_attention_flex",
    "random_verify_inputs", "default_parity_cases", "verify_parity_rows",
    "verify_floor", "benchmark_verify", "verify_table", "verify_benchmark_rows",
    "auto_impl", "wgmma_unavailable_reason", "read_sanitizer_logs",
]


# ----------------------------------------------------------------------------- validation

def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in x.shape)


def _check_shapes(q_latent, q_rope, kv_cache, tail_kv, parents, scale, *, batched: bool) -> tuple[int, int, int]:
    """Checks shapes (not values); returns (B, T, H) (B = 1 when not batched)."""
    lead = 1 if batched else 0
    ql, qr = _shape(q_latent), _shape(q_rope)
    if len(ql) != 3 + lead or ql[-1] != D_LATENT:
        want = "[B, T, H, 512]" if batched else "[T, H, 512]"
        raise ValueError(f"q_latent must be {want}, got {list(ql)}")
    if qr != ql[:-1] + (D_ROPE,):
        raise ValueError(f"q_rope must be {list(ql[:-1]) + [D_ROPE]} (same nodes/heads as q_latent), got {list(qr)}")
    B = ql[0] if batched else 1
    T, H = ql[lead], ql[lead + 1]
    if T < 1 or H < 1 or B < 1:
        raise ValueError(f"need at least one request, node and head, got B={B} T={T} H={H}")
    kv = _shape(kv_cache)
    if len(kv) != 2 or kv[1] != D_KV:
        raise ValueError(f"kv_cache must be [S, {D_KV}] ([c_kv 512 | k_rope 64] per slot), got {list(kv)}")
    tk = _shape(tail_kv)
    want_tail = ((B,) if batched else ()) + (T, D_KV)
    if tk != want_tail:
        raise ValueError(f"tail_kv must be {list(want_tail)}, got {list(tk)}")
    pa = _shape(parents)
    want_par = ((B,) if batched else ()) + (T,)
    if pa != want_par:
        raise ValueError(f"parents must be {list(want_par)}, got {list(pa)}")
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite positive number, got {scale!r}")
    return B, T, H


def _check_parents_np(parents: np.ndarray) -> None:
    p = np.asarray(parents)
    if not np.issubdtype(p.dtype, np.integer):
        raise ValueError(f"parents must be integers, got {p.dtype}")
    idx = np.arange(p.shape[-1])
    if np.any(p >= idx) or np.any(p < -1):
        bad = np.argwhere((p >= idx) | (p < -1))[0]
        raise ValueError(f"parents must satisfy -1 <= parents[i] < i (parent before child); "
                         f"index {tuple(int(v) for v in bad)} holds {int(p[tuple(bad)])}")


def _ancestor_visibility_np(parents: np.ndarray) -> np.ndarray:
    """bool [T, T]: vis[i, t] iff tail node t is i or an ancestor of i (explicit walk)."""
    p = np.asarray(parents, dtype=np.int64)
    T = p.shape[0]
    vis = np.zeros((T, T), dtype=bool)
    for i in range(T):
        j = i
        while j >= 0:
            vis[i, j] = True
            j = int(p[j])
    return vis


# ----------------------------------------------------------------------------- reference

def verify_attention_reference(q_latent, q_rope, kv_cache, prefix_slots, tail_kv, parents, scale):
    """Float64 ground truth of tree-verify attention (absorbed MLA).

    q_latent [T, H, 512], q_rope [T, H, 64], kv_cache [S, 576] (rows
    ``[c_kv | k_rope]``), prefix_slots [P] int (slots of the prefix, any order,
    need not be contiguous), tail_kv [T, 576] (the tree nodes' own KV rows),
    parents [T] int (``-1 <= parents[i] < i``), scale: softmax scale.
    NumPy arrays or torch tensors (any dtype; computed in float64 on their device).

    Row (i, h) sees the whole prefix, and tail row t iff t is i or an ancestor of i.
    Returns ``(out [T, H, 512], lse [T, H])`` in float64, ``lse`` the natural-log
    log-sum-exp of the scaled scores: NumPy arrays for NumPy input, torch tensors
    for torch input.
    """
    import torch

    numpy_in = not torch.is_tensor(q_latent)
    T_, H_ = _check_shapes(q_latent, q_rope, kv_cache, tail_kv, parents, scale, batched=False)[1:]

    def t64(x):
        x = torch.as_tensor(np.asarray(x)) if not torch.is_tensor(x) else x
        return x.detach().to(torch.float64)

    dev = q_latent.device if torch.is_tensor(q_latent) else torch.device("cpu")
    ql, qr = t64(q_latent).to(dev), t64(q_rope).to(dev)
    kv, tail = t64(kv_cache).to(dev), t64(tail_kv).to(dev)
    slots_np = (prefix_slots.detach().cpu().numpy() if torch.is_tensor(prefix_slots)
                else np.asarray(prefix_slots))
    if slots_np.ndim != 1 or (slots_np.size and not np.issubdtype(slots_np.dtype, np.integer)):
        raise ValueError(f"prefix_slots must be a 1-D integer array, got shape {slots_np.shape} {slots_np.dtype}")
    S = kv.shape[0]
    if slots_np.size and (slots_np.min() < 0 or slots_np.max() >= S):
        raise ValueError(f"prefix_slots must lie in [0, {S}) (kv_cache rows), got [{slots_np.min()}, {slots_np.max()}]")
    par_np = parents.detach().cpu().numpy() if torch.is_tensor(parents) else np.asarray(parents)
    _check_parents_np(par_np)
    vis = torch.as_tensor(_ancestor_visibility_np(par_np), device=dev)

    P = slots_np.size
    keys = torch.cat([kv[torch.as_tensor(slots_np.astype(np.int64), device=dev)], tail], 0)  # [P+T, 576]
    q = torch.cat([ql, qr], -1).reshape(T_ * H_, D_KV)
    node = torch.arange(T_ * H_, device=dev) // H_
    out = torch.empty(T_ * H_, D_LATENT, dtype=torch.float64, device=dev)
    lse = torch.empty(T_ * H_, dtype=torch.float64, device=dev)
    step = max(1, (1 << 25) // (P + T_))  # bound the score block to ~256 MB
    for r0 in range(0, T_ * H_, step):
        r1 = min(T_ * H_, r0 + step)
        s = (q[r0:r1] @ keys.T) * scale
        s[:, P:] = s[:, P:].masked_fill(~vis[node[r0:r1]], float("-inf"))
        l = torch.logsumexp(s, -1)
        lse[r0:r1] = l
        out[r0:r1] = torch.exp(s - l[:, None]) @ keys[:, :D_LATENT]
    out, lse = out.reshape(T_, H_, D_LATENT), lse.reshape(T_, H_)
    if numpy_in:
        return out.cpu().numpy(), lse.cpu().numpy()
    return out, lse


# ----------------------------------------------------------------------------- torch helpers

def _visibility_torch(parents):
    """bool [T, T] ancestor closure by boolean matrix squaring (no host sync)."""
    import torch

    T = parents.shape[-1]
    dev = parents.device
    p = parents.long()
    A = torch.zeros(T, T, dtype=torch.float32, device=dev)
    A.scatter_(1, p.clamp(min=0)[:, None], (p >= 0).float()[:, None])
    V = A + torch.eye(T, dtype=torch.float32, device=dev)
    for _ in range(max(0, math.ceil(math.log2(T)))):
        V = ((V @ V) > 0).float()
    return V > 0


def _torch_verify(q_latent, q_rope, kv_cache, prefix_slots, tail_kv, parents, scale, compute_dtype=None):
    """Naive torch verify for one request; matmuls in ``compute_dtype`` (default: input dtype)."""
    import torch

    dt = compute_dtype or q_latent.dtype
    T, H = q_latent.shape[:2]
    P = prefix_slots.shape[0]
    keys = torch.cat([kv_cache.index_select(0, prefix_slots.long()), tail_kv], 0).to(dt)  # [P+T, 576]
    q = torch.cat([q_latent, q_rope], -1).reshape(T * H, D_KV).to(dt)
    s = (q @ keys.T).float().mul_(scale).view(T, H, P + T)
    vis = _visibility_torch(parents)
    s[:, :, P:].masked_fill_(~vis[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).to(dt).view(T * H, P + T)
    out = (p @ keys[:, :D_LATENT]).view(T, H, D_LATENT)
    return out.to(q_latent.dtype), lse


# ----------------------------------------------------------------------------- the kernel

def _num_sms(device) -> int:
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count


def _plan(n_prefix_total: int, B: int, T: int, M: int, rows_per_block: int, blocks_per_wave: int,
          chunk_len: int | None, key_align: int = 64) -> tuple[int, int, int]:
    """(row blocks, chunk length in keys, upper bound on the number of chunks). An automatic chunk
    length is a multiple of ``key_align`` keys (64: one tile; 128 for ``pingpong``: one tile pair)."""
    rb = -(-M // rows_per_block)
    total = n_prefix_total + B * T
    if chunk_len is None:
        slots = max(1, blocks_per_wave // rb)
        want = slots if B == 1 else max(slots - B, B)
        chunk_len = max(key_align, -(-(-(-total // want)) // key_align) * key_align)
    elif chunk_len < 1:
        raise ValueError(f"chunk_len must be >= 1 keys, got {chunk_len}")
    n_chunks = -(-total // chunk_len) + (0 if B == 1 else B)
    if n_chunks > 65535:
        raise ValueError(f"{n_chunks} key chunks exceed the grid limit 65535; use a larger chunk_len")
    return rb, chunk_len, n_chunks


def _plan_rem(n_prefix_total: int, B: int, T: int, M: int, blocks_per_wave: int, chunk_len: int | None,
              rem_k: int) -> tuple[int, int, int]:
    """Plan of ``impl="pingpong_rem"``: (row blocks, chunk length, upper bound on the chunks). The last
    row block (at most 8 rows) takes ``rem_k`` chunks per thread block, so a wave holds
    ``(row blocks - 1) * chunks + ceil(chunks / rem_k)`` working blocks; the automatic chunk count is the
    largest that fits one wave (H = 8, 33 nodes, 132 SMs, rem_k 3: 30 chunks instead of 26)."""
    if rem_k < 1:
        raise ValueError(f"rem_k (chunks per remainder block) must be >= 1, got {rem_k}")
    rb = -(-M // _MMA_ROWS)
    full = rb - 1
    total = n_prefix_total + B * T
    if chunk_len is None:
        slots = 1
        while full * (slots + 1) + -(-(slots + 1) // rem_k) <= blocks_per_wave:
            slots += 1
        want = slots if B == 1 else max(slots - B, B)
        chunk_len = max(64, -(-(-(-total // want)) // 64) * 64)
    elif chunk_len < 1:
        raise ValueError(f"chunk_len must be >= 1 keys, got {chunk_len}")
    n_chunks = -(-total // chunk_len) + (0 if B == 1 else B)
    if n_chunks > 65535:
        raise ValueError(f"{n_chunks} key chunks exceed the grid limit 65535; use a larger chunk_len")
    return rb, chunk_len, n_chunks


_KERNELS: dict[tuple, Any] = {}


def _kernel(name: str, smem: int, options: tuple = (), target: str | None = None):
    """Cached ``RawKernel`` of the ddtree_verify family (``options`` such as ``-D`` macros
    select tuning variants; ``target`` see :func:`workbench.kernels.load_module`), dynamic shared
    memory limit raised once."""
    k = _KERNELS.get((name, options, target))
    if k is None:
        from workbench.kernels import get_kernel

        k = get_kernel("ddtree_verify", name, tuple(options), target)
        if smem > 48 * 1024:
            try:
                k.max_dynamic_shared_size_bytes = smem
            except AttributeError:  # older CuPy: set the attribute through the driver
                import cupy

                cupy.cuda.driver.funcSetAttribute(k.kernel.ptr, 8, smem)  # MAX_DYNAMIC_SHARED_SIZE_BYTES
        _KERNELS[(name, options, target)] = k
    return k


_WGMMA_STATE: dict[str, Any] = {}


def wgmma_unavailable_reason() -> str | None:
    """``None`` when the wgmma kernel (sm_90a, built with nvcc) loads on this machine, else why not.

    Tried once per process; ``impl="auto"`` runs the ``mma.sync`` kernel when this is not ``None``.
    """
    if "reason" not in _WGMMA_STATE:
        try:
            _kernel("ddtree_verify_wgmma_bf16", _WGMMA_SMEM, (), _WGMMA_TARGET)
            _WGMMA_STATE["reason"] = None
        except Exception as e:  # noqa: BLE001 - the reason is reported, auto falls back to mma
            _WGMMA_STATE["reason"] = f"{type(e).__name__}: {str(e).strip()[:300]}"
    return _WGMMA_STATE["reason"]


def auto_impl(dtype: Any) -> str:
    """What ``impl="auto"`` runs on this machine for inputs of ``dtype`` (a torch dtype or its name):
    ``"wgmma"`` for bf16 where it loads (see :func:`wgmma_unavailable_reason`), else ``"mma"``;
    ``"simple"`` for float32."""
    name = str(dtype).replace("torch.", "")
    if name != "bfloat16":
        return "simple"
    return "wgmma" if wgmma_unavailable_reason() is None else "mma"


def _check_values(kv_rows: int, prefix_slots, prefix_offsets, parents) -> None:
    """Value checks that need one host sync (skipped with check=False)."""
    import torch

    T = parents.shape[-1]
    idx = torch.arange(T, device=parents.device)
    bad_par = ((parents >= idx) | (parents < -1)).any()
    n = prefix_slots.shape[0]
    bad_slot = ((prefix_slots < 0) | (prefix_slots >= kv_rows)).any() if n else torch.zeros((), dtype=torch.bool,
                                                                                              device=parents.device)
    if prefix_offsets is None:  # the single-request form: [0, n] by construction
        bad_off = torch.zeros((), dtype=torch.bool, device=parents.device)
    else:
        d = prefix_offsets[1:] - prefix_offsets[:-1]
        bad_off = (prefix_offsets[0] != 0) | (prefix_offsets[-1] != n) | (d < 0).any()
    flags = torch.stack([bad_par, bad_slot.to(parents.device), bad_off.to(parents.device)]).cpu().tolist()
    if flags[0]:
        raise ValueError("parents must satisfy -1 <= parents[i] < i (parent before child) for every node")
    if flags[1]:
        raise ValueError(f"prefix_slots must lie in [0, {kv_rows}) (kv_cache rows)")
    if flags[2]:
        raise ValueError(f"prefix_offsets must start at 0, end at len(prefix_slots) = {n} and never decrease")


def verify_attention_batched(q_latent, q_rope, kv_cache, prefix_slots, prefix_offsets, tail_kv, parents, scale, *,
                             check: bool = True, impl: str = "auto", chunk_len: int | None = None,
                             out=None, lse=None, _poison_workspace: bool = False, _options: tuple = (),
                             _single_prefix: int | None = None, _rem_chunks: int = _REM_CHUNKS):
    """Tree-verify attention for B requests with different prefix lengths.

    q_latent [B, T, H, 512], q_rope [B, T, H, 64], kv_cache [S, 576] (rows
    ``[c_kv | k_rope]``, shared by all requests), prefix_slots [N] int (all
    requests' prefix slots, concatenated), prefix_offsets [B + 1] int (request b
    owns ``prefix_slots[offsets[b]:offsets[b+1]]``), tail_kv [B, T, 576],
    parents [B, T] int (``-1 <= parents[b, i] < i``), scale: softmax scale.
    Torch tensors; q/kv/tail bf16 or float32 (one dtype). On CUDA the kernel
    runs with no host sync when ``check=False`` (``check=True`` validates
    parents, slots and offsets first, which syncs once). CPU tensors take a
    torch path computed in float32. (Internal: :func:`verify_attention` passes
    ``prefix_offsets=None`` with ``_single_prefix=P`` for one request, so that
    no offsets tensor has to be made on the device.)

    ``impl``: ``"auto"`` (:func:`auto_impl`: wgmma, else mma, for bf16; CUDA
    cores for float32), ``"wgmma"`` (bf16, Hopper warpgroup MMA, built for
    sm_90a with nvcc; 64 query rows x 64 keys per step), ``"pingpong"`` (bf16,
    sm_90a: the two warpgroups in a ping-pong ("seesaw") schedule over pairs of
    64-key tiles, each one's softmax under the other's wgmma; not the default,
    not yet measured), ``"pingpong_rem"`` (as ``pingpong``, and where the last
    64-row block holds at most 8 rows, as at H = 8 with 33 nodes, those rows go
    by swapped operands (wgmma m64n8: keys as M, the 8 rows as N), 3 key
    chunks per such block, so the full row blocks get more chunks; not yet
    measured), ``"mma"`` (bf16
    tensor cores through ``mma.sync``, any sm_90 build; the previous kernel)
    or ``"simple"`` (CUDA cores, any dtype). ``chunk_len`` overrides
    the keys per thread block. ``out``/``lse`` may be given preallocated.
    Returns ``(out [B, T, H, 512] in the input dtype, lse [B, T, H] float32)``.
    """
    import torch

    if prefix_offsets is None:
        if _single_prefix is None or not torch.is_tensor(prefix_slots) or not torch.is_tensor(q_latent):
            raise ValueError("prefix_offsets must be a [B + 1] integer tensor")
        prefix_offsets = torch.tensor([0, int(_single_prefix)], dtype=torch.int64)  # host copy: checks only
        single = True
    else:
        single = False
    if not all(torch.is_tensor(x) for x in (q_latent, q_rope, kv_cache, prefix_slots, prefix_offsets, tail_kv,
                                             parents)):
        raise TypeError("verify_attention_batched takes torch tensors (use verify_attention_reference for NumPy)")
    B, T, H = _check_shapes(q_latent, q_rope, kv_cache, tail_kv, parents, scale, batched=True)
    if impl not in _IMPLS:
        raise ValueError(f"impl must be one of {_IMPLS}, got {impl!r}")
    dtype = q_latent.dtype
    if dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"inputs must be bfloat16 or float32, got {dtype}")
    for name, x in (("q_rope", q_rope), ("kv_cache", kv_cache), ("tail_kv", tail_kv)):
        if x.dtype != dtype:
            raise ValueError(f"{name} is {x.dtype} but q_latent is {dtype}: all inputs need one dtype")
    for name, x in (("prefix_slots", prefix_slots), ("prefix_offsets", prefix_offsets), ("parents", parents)):
        if x.dtype.is_floating_point or x.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor, got {x.dtype}")
    if prefix_slots.dim() != 1:
        raise ValueError(f"prefix_slots must be 1-D [N], got {list(prefix_slots.shape)}")
    if _shape(prefix_offsets) != (B + 1,):
        raise ValueError(f"prefix_offsets must be [B + 1] = [{B + 1}], got {list(prefix_offsets.shape)}")
    if single and (B != 1 or int(prefix_slots.shape[0]) != int(_single_prefix)):
        raise ValueError("_single_prefix needs one request whose prefix is all of prefix_slots")
    dev = q_latent.device
    if single:
        prefix_offsets = prefix_offsets.to(dev) if dev.type == "cpu" else None
    for name, x in (("q_rope", q_rope), ("kv_cache", kv_cache), ("prefix_slots", prefix_slots),
                    ("prefix_offsets", prefix_offsets), ("tail_kv", tail_kv), ("parents", parents)):
        if x is None:
            continue
        if x.device != dev:
            raise ValueError(f"{name} is on {x.device} but q_latent is on {dev}: all inputs need one device")
    M = T * H

    if dev.type == "cpu":
        if check:
            _check_values(kv_cache.shape[0], prefix_slots, prefix_offsets, parents.long())
        offs = prefix_offsets.tolist()
        outs, lses = [], []
        for b in range(B):
            o, l = _torch_verify(q_latent[b], q_rope[b], kv_cache, prefix_slots[offs[b]:offs[b + 1]], tail_kv[b],
                                 parents[b], scale, compute_dtype=torch.float32)
            outs.append(o)
            lses.append(l.float())
        o, l = torch.stack(outs), torch.stack(lses)
        if out is not None:
            out.copy_(o)
            o = out
        if lse is not None:
            lse.copy_(l)
            l = lse
        return o, l

    if dev.type != "cuda":
        raise ValueError(f"tensors must be on a CUDA device or the CPU, got {dev}")
    from workbench.kernels import require_gpu

    require_gpu("verify_attention")
    if kv_cache.stride(1) != 1 or (kv_cache.stride(0) * kv_cache.element_size()) % 16 or kv_cache.data_ptr() % 16:
        raise ValueError("kv_cache rows must be contiguous and 16-byte aligned (row stride a multiple of 16 bytes)")
    slots = prefix_slots.to(torch.int64).contiguous()
    offsets = None if single else prefix_offsets.to(torch.int64).contiguous()
    par = parents.to(torch.int64).contiguous()
    if check:
        _check_values(kv_cache.shape[0], slots, offsets, par)
    ql = q_latent.contiguous()
    qr = q_rope.contiguous()
    tail = tail_kv.contiguous()

    kind = impl if impl != "auto" else auto_impl(dtype)
    if kind in ("mma", "wgmma", "pingpong", "pingpong_rem") and dtype != torch.bfloat16:
        raise ValueError(f"impl={impl!r} needs bfloat16 inputs (float32 takes impl='simple')")
    if kind in ("wgmma", "pingpong", "pingpong_rem"):
        why = wgmma_unavailable_reason()
        if why is not None:
            raise ValueError(f"impl={kind!r} is not available here ({why}); use impl='mma' or 'auto'")
    if kind == "pingpong_rem" and not 0 < M % _MMA_ROWS <= _REM_MAX_ROWS:
        kind = "pingpong"  # no last row block of <= 8 rows: the same kernel as pingpong
    rows = _MMA_ROWS if kind in ("mma", "wgmma", "pingpong", "pingpong_rem") else _SIMPLE_ROWS
    per_sm = 2 if kind == "simple" else 1
    # pingpong keeps 64-key chunk granularity: whole tile pairs (128) would leave SMs idle at short
    # prefixes (H=8, 4k: 17 chunks of 256 keys instead of 22 of 192); an odd last tile costs half a round
    if kind == "pingpong_rem":
        rb, clen, n_chunks = _plan_rem(int(slots.shape[0]), B, T, M, _num_sms(dev), chunk_len, int(_rem_chunks))
    else:
        rb, clen, n_chunks = _plan(int(slots.shape[0]), B, T, M, rows, per_sm * _num_sms(dev), chunk_len)
    W = -(-T // 32)

    i32 = dict(dtype=torch.int32, device=dev)
    chunk_start = torch.empty(B + 1, **i32)
    offs_ws = torch.empty(B + 1, dtype=torch.int64, device=dev)
    vis = torch.empty(B * T * W, dtype=torch.int32, device=dev)
    o_part = torch.empty(n_chunks * M * D_LATENT, dtype=torch.float32, device=dev)
    lse_part = torch.empty(n_chunks * M, dtype=torch.float32, device=dev)
    if _poison_workspace:
        o_part.fill_(float("nan"))
        lse_part.fill_(float("nan"))
        vis.fill_(-1)
    if out is None:
        out = torch.empty(B, T, H, D_LATENT, dtype=dtype, device=dev)
    elif _shape(out) != (B, T, H, D_LATENT) or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {dtype} tensor [B, T, H, 512] = {[B, T, H, D_LATENT]}")
    if lse is None:
        lse = torch.empty(B, T, H, dtype=torch.float32, device=dev)
    elif _shape(lse) != (B, T, H) or lse.dtype != torch.float32 or not lse.is_contiguous():
        raise ValueError(f"lse must be a contiguous float32 tensor [B, T, H] = {[B, T, H]}")

    _launch(_kernel("ddtree_verify_prepare", 0), 1 + -(-(B * T) // 1024), 1024,
            (np.uint64(0) if offsets is None else offsets, np.int64(slots.shape[0]), par, B, T, W, clen, offs_ws,
             chunk_start, vis))
    scale_log2 = float(scale) * math.log2(math.e)
    args = (ql, qr, kv_cache, np.int64(kv_cache.stride(0)), slots, offs_ws, tail, vis, chunk_start, o_part,
            lse_part, B, T, H, W, clen, scale_log2)
    if kind == "wgmma":
        _launch(_kernel(_WGMMA_KERNEL, _WGMMA_SMEM, _options, _WGMMA_TARGET), (rb, n_chunks), 256,
                args, shared_mem=_WGMMA_SMEM)
    elif kind == "pingpong":
        _launch(_kernel(_PINGPONG_KERNEL, _PINGPONG_SMEM, _options, _WGMMA_TARGET), (rb, n_chunks), 256,
                args, shared_mem=_PINGPONG_SMEM)
    elif kind == "pingpong_rem":
        _launch(_kernel(_PINGPONG_REM_KERNEL, _REM_SMEM, _options, _WGMMA_TARGET), (rb, n_chunks), 256,
                args + (int(_rem_chunks),), shared_mem=_REM_SMEM)
    elif kind == "mma":
        _launch(_kernel("ddtree_verify_mma_bf16", _MMA_SMEM, _options), (rb, n_chunks), 256, args,
                shared_mem=_MMA_SMEM)
    else:
        name = "ddtree_verify_simple_bf16" if dtype == torch.bfloat16 else "ddtree_verify_simple_f32"
        _launch(_kernel(name, _SIMPLE_SMEM), (rb, n_chunks), 256, args, shared_mem=_SIMPLE_SMEM)
    merge = "ddtree_verify_merge_bf16" if dtype == torch.bfloat16 else "ddtree_verify_merge_f32"
    _launch(_kernel(merge, 0), B * M, 128, (o_part, lse_part, chunk_start, out, lse, B, M))
    return out, lse


def verify_attention(q_latent, q_rope, kv_cache, prefix_slots, tail_kv, parents, scale, *, check: bool = True,
                     impl: str = "auto", chunk_len: int | None = None, out=None, lse=None, _options: tuple = (),
                     _rem_chunks: int = _REM_CHUNKS):
    """Tree-verify attention for one request (absorbed MLA, paged prefix + tree tail).

    q_latent [T, H, 512], q_rope [T, H, 64], kv_cache [S, 576] (rows
    ``[c_kv | k_rope]``), prefix_slots [P] int (need not be contiguous or
    sorted), tail_kv [T, 576], parents [T] int (``-1 <= parents[i] < i``),
    scale: softmax scale. Torch tensors, bf16 or float32; CUDA tensors run the
    kernel (no host sync with ``check=False``), CPU tensors a torch path in
    float32. See :func:`verify_attention_batched` for ``impl``/``chunk_len``.

    Returns ``(out [T, H, 512] in the input dtype, lse [T, H] float32)``.
    """
    import torch

    if not torch.is_tensor(q_latent):
        raise TypeError("verify_attention takes torch tensors (use verify_attention_reference for NumPy)")
    _check_shapes(q_latent, q_rope, kv_cache, tail_kv, parents, scale, batched=False)
    if not torch.is_tensor(prefix_slots) or prefix_slots.dim() != 1:
        raise ValueError("prefix_slots must be a 1-D integer torch tensor [P]")
    P = int(prefix_slots.shape[0])
    o = None if out is None else out.unsqueeze(0)
    l = None if lse is None else lse.unsqueeze(0)
    o, l = verify_attention_batched(q_latent[None], q_rope[None], kv_cache, prefix_slots, None, tail_kv[None],
                                    parents[None], scale, check=check, impl=impl, chunk_len=chunk_len, out=o, lse=l,
                                    _options=_options, _single_prefix=P, _rem_chunks=_rem_chunks)
    return o[0], l[0]


# ----------------------------------------------------------------------------- peers

def verify_attention_naive(q_latent, q_rope, kv_cache, prefix_slots, tail_kv, parents, scale):
    """Peer: gather the prefix, one matmul for scores, mask the tail, softmax, matmul.

    Same arguments as :func:`verify_attention`; matmuls in the input dtype,
    softmax in float32. Returns ``(out [T, H, 512], lse [T, H] float32)``.
    """
    return _torch_verify(q_latent, q_rope, kv_cache, prefix_slots, tail_kv, parents, scale)


def _dense_mask(parents, P: int):
    import torch

    T = parents.shape[0]
    vis = _visibility_torch(parents)
    return torch.cat([torch.ones(T, P, dtype=torch.bool, device=parents.device), vis], 1)  # [T, P+T]


def verify_attention_sdpa(q_latent, q_rope, kv_cache, prefix_slots, tail_kv, parents, scale):
    """Peer: ``torch.nn.functional.scaled_dot_product_attention`` with a dense boolean mask.

    Query [1, H, T, 576], keys [1, H, P+T, 576] (one latent row broadcast over
    heads), values = the c_kv part. Returns ``(out [T, H, 512], None)`` (SDPA
    gives no log-sum-exp).
    """
    import torch
    import torch.nn.functional as F

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
    original exception; :func:`benchmark_verify` records them as unsupported.
    """
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

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


# ----------------------------------------------------------------------------- random inputs, parity

def default_scale() -> float:
    """Kimi K2.6 softmax scale (mscale^2 / sqrt(192))."""
    from workbench.config import load_config

    return load_config("kimi-k2.6").softmax_scale


def random_verify_inputs(nodes: int, heads: int, prefix: int | Sequence[int], dtype: Any = "bfloat16",
                         device: Any = "cpu", seed: int = 0, cache_factor: float = 1.5) -> dict[str, Any]:
    """Fresh random verify inputs (torch). ``prefix`` an int (single request) or a list (batched).

    KV rows and queries are standard normal; the prefix slots are a random
    subset of a cache ``cache_factor`` times larger, in random order; parents
    form a random tree (``parents[i]`` uniform in ``[0, i)``, root -1).
    Returns a dict of the keyword arguments of :func:`verify_attention` (or
    ``_batched``, with ``prefix_offsets``, when ``prefix`` is a list).
    """
    import torch

    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    dev = torch.device(device)
    batched = not isinstance(prefix, (int, np.integer))
    prefixes = [int(p) for p in (prefix if batched else [prefix])]
    if any(p < 0 for p in prefixes) or nodes < 1 or heads < 1:
        raise ValueError(f"need nodes >= 1, heads >= 1, prefix >= 0; got {nodes}, {heads}, {prefixes}")
    B, N = len(prefixes), sum(prefixes)
    S = max(1, int(N * cache_factor) + 7)
    gen = torch.Generator(device=dev).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32).to(dt)

    kv = randn(S, D_KV)
    slots = torch.randperm(S, generator=gen, device=dev)[:N].contiguous()
    ql = randn(B, nodes, heads, D_LATENT)
    qr = randn(B, nodes, heads, D_ROPE)
    tail = randn(B, nodes, D_KV)
    frac = torch.rand(B, nodes, generator=gen, device=dev)
    par = (frac * torch.arange(nodes, device=dev)).floor().long()
    par[:, 0] = -1
    scale = default_scale()
    if batched:
        offs = torch.tensor([0] + list(np.cumsum(prefixes)), dtype=torch.int64, device=dev)
        return dict(q_latent=ql, q_rope=qr, kv_cache=kv, prefix_slots=slots, prefix_offsets=offs, tail_kv=tail,
                    parents=par, scale=scale)
    return dict(q_latent=ql[0], q_rope=qr[0], kv_cache=kv, prefix_slots=slots, tail_kv=tail[0], parents=par[0],
                scale=scale)


def default_parity_cases(device: Any = "cpu") -> list[dict[str, Any]]:
    """The parity grid: small on a CPU; on a GPU heads 8/64, prefix 0..128k, bf16 and float32, batched."""
    import torch

    on_gpu = torch.device(device).type == "cuda"
    if not on_gpu:
        return [dict(kernel="verify_attention", nodes=5, heads=2, prefix=p, dtype=d, repeats=2)
                for d in ("float32", "bfloat16") for p in (0, 37)] + [
            dict(kernel="verify_attention_batched", nodes=5, heads=2, prefix=[0, 19, 40], dtype="float32",
                 repeats=2)]
    cases = []
    for dt in ("bfloat16", "float32"):
        for heads in (8, 64):
            for p in (0, 1, 100, 4096 + 37, 131072):
                cases.append(dict(kernel="verify_attention", nodes=33, heads=heads, prefix=p, dtype=dt,
                                  repeats=3 if p < 100000 else 1))
        cases.append(dict(kernel="verify_attention_batched", nodes=33, heads=8, prefix=[0, 5000, 70, 20000],
                          dtype=dt, repeats=2))
    for tag in ("wgmma", "pingpong", "pingpong_rem", "mma"):
        if tag in ("wgmma", "pingpong", "pingpong_rem") and wgmma_unavailable_reason() is not None:
            continue
        for heads in (8, 64):
            for p in (100, 4096 + 37, 131072):
                cases.append(dict(kernel=f"verify_attention[{tag}]", nodes=33, heads=heads, prefix=p,
                                  dtype="bfloat16", repeats=2 if p < 100000 else 1))
        cases.append(dict(kernel=f"verify_attention_batched[{tag}]", nodes=33, heads=8,
                          prefix=[0, 5000, 70, 20000], dtype="bfloat16", repeats=1))
    if wgmma_unavailable_reason() is None:
        cases += pingpong_edge_cases()
    cases += [
        dict(kernel="verify_attention[simple]", nodes=33, heads=8, prefix=4096 + 37, dtype="bfloat16", repeats=2),
        dict(kernel="verify_attention", nodes=65, heads=8, prefix=3000, dtype="bfloat16", repeats=2),
        dict(kernel="verify_attention", nodes=17, heads=64, prefix=777, dtype="float32", repeats=2),
        dict(kernel="verify_attention_naive", nodes=33, heads=8, prefix=4096, dtype="bfloat16", repeats=1),
        dict(kernel="verify_attention_sdpa", nodes=33, heads=8, prefix=4096, dtype="bfloat16", repeats=1),
    ]
    return cases


def pingpong_edge_cases(repeats: int = 1) -> list[dict[str, Any]]:
    """Parity cases aimed at the ping-pong kernel's round structure (``impl="pingpong"``): a chunk of
    one tile (no tile B in the only round), odd and even tile counts, the tree tail split across
    chunks (``chunk_len`` 64 and 192: rounds that end on a partial pair), a partly filled row block
    (H = 8: 264 rows), rows that see no key of a chunk, batched requests with empty prefixes; and for
    ``impl="pingpong_rem"`` last row blocks of 8, 4 and 5 rows (H = 8, 4, 1) over several chunks each."""
    pp = "verify_attention[pingpong]"
    out = [dict(kernel=pp, nodes=33, heads=8, prefix=p, dtype="bfloat16", repeats=repeats)
           for p in (0, 1, 31, 64 - 33, 95, 128 - 33, 200)]
    out += [dict(kernel=pp, nodes=33, heads=8, prefix=p, dtype="bfloat16", repeats=repeats, chunk_len=c)
            for p, c in ((300, 64), (1000, 192), (4096 + 37, 128), (777, 320))]
    out += [dict(kernel=pp, nodes=9, heads=64, prefix=500, dtype="bfloat16", repeats=repeats),
            dict(kernel=pp, nodes=65, heads=8, prefix=3000, dtype="bfloat16", repeats=repeats),
            dict(kernel="verify_attention_batched[pingpong]", nodes=33, heads=8, prefix=[0, 64, 1, 5000],
                 dtype="bfloat16", repeats=repeats),
            dict(kernel="verify_attention_batched[pingpong]", nodes=17, heads=64, prefix=[129, 0],
                 dtype="bfloat16", repeats=repeats, chunk_len=64)]
    # pingpong_rem: the last row block of <= 8 rows by swapped operands, several chunks per such block
    pr = "verify_attention[pingpong_rem]"
    out += [dict(kernel=pr, nodes=33, heads=8, prefix=p, dtype="bfloat16", repeats=repeats)
            for p in (0, 1, 100, 4096 + 37)]
    out += [dict(kernel=pr, nodes=n, heads=h, prefix=p, dtype="bfloat16", repeats=repeats, chunk_len=c)
            for n, h, p, c in ((33, 8, 700, 64), (33, 8, 1000, 192), (17, 8, 2000, 320), (33, 4, 900, 256),
                               (5, 1, 600, 128), (9, 8, 333, None))]
    out += [dict(kernel="verify_attention_batched[pingpong_rem]", nodes=33, heads=8, prefix=[0, 64, 1, 5000],
                 dtype="bfloat16", repeats=repeats),
            dict(kernel="verify_attention_batched[pingpong_rem]", nodes=17, heads=8, prefix=[300, 0, 77],
                 dtype="bfloat16", repeats=repeats, chunk_len=128)]
    return out


def _tolerances(dtype: str) -> tuple[float, float]:
    """(relative output error by norm, absolute lse error)."""
    return (1e-2, 2e-3) if dtype == "bfloat16" else (2e-5, 1e-4)


def verify_parity_rows(cases: Iterable[dict[str, Any]] | None = None, device: Any = "cpu",
                       seed: int = 0) -> list[dict[str, Any]]:
    """Parity rows: each case on fresh random inputs against the float64 reference.

    A case is a dict: ``kernel`` (``verify_attention``, ``verify_attention_batched``,
    either with an impl tag such as ``verify_attention[mma]`` or ``[simple]``;
    ``verify_attention_naive``, ``verify_attention_sdpa``),
    ``nodes``, ``heads``, ``prefix`` (int, or a list for the batched kernel),
    ``dtype`` (``"bfloat16"``/``"float32"``), ``repeats`` (random cases), optionally
    ``chunk_len`` (keys per thread block, passed to the kernel).
    ``None`` takes :func:`default_parity_cases`. Outputs are poisoned (NaN)
    before each run and every element is checked. Returns rows
    ``{kernel, shapes, cases, max_abs_err, max_rel_err, lse_max_abs_err,
    bit_exact (None: float), tolerance, pass}``; ``max_rel_err`` is
    ``||out - ref|| / ||ref||``, the worst over the cases.
    """
    import torch

    dev = torch.device(device)
    rows = []
    for ci, case in enumerate(cases if cases is not None else default_parity_cases(dev)):
        kernel = case.get("kernel", "verify_attention")
        dtype = case.get("dtype", "bfloat16")
        rel_tol, lse_tol = _tolerances(dtype)
        max_abs = max_rel = lse_err = 0.0
        finite = True
        n = int(case.get("repeats", 1))
        for rep in range(n):
            inp = random_verify_inputs(case["nodes"], case["heads"], case["prefix"], dtype, dev,
                                       seed=seed + 1000 * ci + rep)
            base, _, tag = kernel.partition("[")
            impl = tag.rstrip("]") or "auto"
            extra = {"chunk_len": int(case["chunk_len"])} if case.get("chunk_len") else {}
            if base == "verify_attention_batched":
                out = torch.full(inp["q_latent"].shape, float("nan"), dtype=inp["q_latent"].dtype, device=dev)
                lse = torch.full(inp["q_latent"].shape[:-1], float("nan"), dtype=torch.float32, device=dev)
                kw = dict(_poison_workspace=True) if dev.type == "cuda" else {}
                o, l = verify_attention_batched(**inp, out=out, lse=lse, impl=impl, **kw, **extra)
                offs = inp["prefix_offsets"].tolist()
                refs = [verify_attention_reference(inp["q_latent"][b], inp["q_rope"][b], inp["kv_cache"],
                                                   inp["prefix_slots"][offs[b]:offs[b + 1]], inp["tail_kv"][b],
                                                   inp["parents"][b], inp["scale"]) for b in range(len(offs) - 1)]
                ro, rl = torch.stack([r[0] for r in refs]), torch.stack([r[1] for r in refs])
            else:
                if base == "verify_attention":
                    out = torch.full(inp["q_latent"].shape, float("nan"), dtype=inp["q_latent"].dtype, device=dev)
                    lse = torch.full(inp["q_latent"].shape[:-1], float("nan"), dtype=torch.float32, device=dev)
                    o, l = verify_attention(**inp, out=out, lse=lse, impl=impl, **extra)
                elif base == "verify_attention_naive":
                    o, l = verify_attention_naive(**inp)
                elif base == "verify_attention_sdpa":
                    o, l = verify_attention_sdpa(**inp)
                else:
                    raise ValueError(f"unknown kernel {kernel!r}")
                ro, rl = verify_attention_reference(**inp)
            o64 = o.double()
            finite &= bool(torch.isfinite(o64).all())
            diff = (o64 - ro).abs()
            max_abs = max(max_abs, float(diff.max()))
            max_rel = max(max_rel, float(torch.linalg.vector_norm(o64 - ro) / torch.linalg.vector_norm(ro)))
            if l is not None:
                finite &= bool(torch.isfinite(l).all())
                lse_err = max(lse_err, float((l.double() - rl).abs().max()))
        p = case["prefix"]
        pstr = f"P={p}" if isinstance(p, (int, np.integer)) else f"B={len(p)} P={list(p)}"
        cstr = f" chunk={case['chunk_len']}" if case.get("chunk_len") else ""
        rows.append(dict(kernel=kernel,
                         shapes=f"T={case['nodes']} H={case['heads']} {pstr} {dtype}{cstr}",
                         cases=n, max_abs_err=max_abs, max_rel_err=max_rel,
                         lse_max_abs_err=lse_err if kernel != "verify_attention_sdpa" else None,
                         bit_exact=None, tolerance=rel_tol,
                         **{"pass": bool(finite and max_rel <= rel_tol and lse_err <= lse_tol)}))
    return rows


# ----------------------------------------------------------------------------- benchmark

def verify_floor(nodes: int, heads: int, prefix: int, elem_bytes: int, copy_gbps: float,
                 matmul_tflops: float) -> dict[str, float]:
    """Bytes, flops and floor (ms) of one verify call: max(bytes / bandwidth, flops / matrix rate).

    Bytes: prefix + tail KV rows read once, queries read, output written
    (input dtype), lse (float32) and slots (int64). Flops: 2 * rows * keys * (576 + 512).
    """
    rows = nodes * heads
    keys = prefix + nodes
    nbytes = keys * D_KV * elem_bytes + rows * D_KV * elem_bytes + rows * D_LATENT * elem_bytes + rows * 4 + prefix * 8
    flops = 2.0 * rows * keys * (D_KV + D_LATENT)
    t_mem = nbytes / (copy_gbps * 1e9) * 1e3
    t_cmp = flops / (matmul_tflops * 1e12) * 1e3
    return dict(bytes=float(nbytes), flops=flops, memory_ms=t_mem, compute_ms=t_cmp, floor_ms=max(t_mem, t_cmp),
                bound="compute" if t_cmp >= t_mem else "memory")


_PEERS = {"naive_torch": verify_attention_naive, "sdpa_dense_mask": verify_attention_sdpa,
          "flex_attention": verify_attention_flex}

# The ping-pong kernel and its -D switches, timed beside the default by ``python -m workbench.ddtree.verify``.
PINGPONG_VARIANTS: dict[str, dict[str, Any]] = {
    "pingpong": {"impl": "pingpong"},
    # slot indices of the next round read at refill time instead of at the top of the round
    "pingpong_slot_late": {"impl": "pingpong", "_options": ("-DVERIFY_PP_SLOT_EARLY=0",)},
    # bar.sync on both sides of the two named barriers (no bar.arrive): the warpgroups rendezvous
    "pingpong_bar_sync": {"impl": "pingpong", "_options": ("-DVERIFY_PP_ARRIVE=0",)},
    # + the last row block of <= 8 rows (H = 8) by swapped operands, 3 (or 2) chunks per such block
    "pingpong_rem": {"impl": "pingpong_rem"},
    "pingpong_rem2": {"impl": "pingpong_rem", "_rem_chunks": 2},
}


def _capture(fns: Sequence[Any]) -> list[Any]:
    """One CUDA graph per callable (warmed up on a side stream first)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graphs = []
    for fn in fns:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        graphs.append(g)
    torch.cuda.synchronize()
    return graphs


def _time_rotating(fns: Sequence[Any], reps: int, warmup: int, graph: bool) -> tuple[list[float], str]:
    """CUDA-event samples (ms) of ``fns[i % len(fns)]``; replayed CUDA graphs when ``graph``
    (falls back to eager launches, saying so, when capture fails)."""
    import torch

    from workbench.measure import time_cuda

    mode = "eager"
    calls = list(fns)
    if graph:
        try:
            graphs = _capture(fns)
            calls = [g.replay for g in graphs]
            mode = "cuda_graph"
        except Exception as e:  # noqa: BLE001 - recorded in the mode string
            torch.cuda.synchronize()
            mode = f"eager (graph capture failed: {type(e).__name__})"
    cur = {"i": 0}

    def setup(i):
        cur["i"] = i % len(calls)

    samples = time_cuda(lambda: calls[cur["i"]](), warmup=warmup, reps=reps, setup=setup)
    return samples, mode


def benchmark_verify(heads: Sequence[int] = (8, 64), nodes: int = 33,
                     prefixes: Sequence[int] = (4096, 16384, 65536, 131072), dtype: Any = "bfloat16",
                     out: Any = None, reps: int = 50, peer_reps: int = 10,
                     peers: Sequence[str] = ("naive_torch", "sdpa_dense_mask", "flex_attention"),
                     variants: dict[str, dict[str, Any]] | None = None, seed: int = 0,
                     on_point: Any = None) -> dict[str, Any]:
    """Time :func:`verify_attention` against peers and its floor on the current GPU.

    For every (heads, prefix) point: fresh random inputs, the KV rotated over
    several caches so that more than L2 is read; every callable (the kernel,
    its ``variants`` (name -> extra keyword arguments of :func:`verify_attention`,
    e.g. ``{"simple": {"impl": "simple"}}``), each peer) timed as replayed CUDA graphs (launch
    overhead out; eager where capture fails, recorded in ``mode``) with CUDA
    events, the kernel also eagerly (``eager_median_ms``, Python launch
    overhead in); medians over ``reps`` (peers: ``peer_reps``); FlexAttention
    recorded as unsupported, with the reason, where it fails; the floor from
    :func:`verify_floor` with the copy bandwidth and bf16 matrix rate measured
    in this process; percent of floor and the speedup over the best peer.
    ``out``: a folder to write ``ddtree_verify.json`` into; ``on_point``: called
    with the results so far (``complete`` False) after every point. Returns the
    results dict (raw samples under ``samples``, ``complete`` True).
    """
    import torch

    from workbench.kernels import require_gpu
    from workbench.measure import measure_bf16_matmul_tflops, measure_copy_bandwidth, median, time_cuda

    require_gpu("benchmark_verify")
    dev = torch.device("cuda")
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    dname = str(dt).replace("torch.", "")
    bw = measure_copy_bandwidth()
    mm = measure_bf16_matmul_tflops()
    l2 = 60 << 20
    points, samples = [], {}
    flex_reason = None

    def _results(pts):
        return dict(points=pts, copy_gb_per_s=bw["gb_per_s"], bf16_matmul_tflops=mm["tflops"],
                    goal="faster than every peer at every point and >= 50% of floor",
                    all_faster_than_peers=all(p["faster_than_all_peers"] for p in pts),
                    min_percent_of_floor=min(p["percent_of_floor"] for p in pts) if pts else None,
                    parameters=dict(heads=list(heads), nodes=nodes, prefixes=list(prefixes), dtype=dname,
                                    reps=reps, peer_reps=peer_reps, peers=list(peers),
                                    variants={k: {a: list(b) if isinstance(b, tuple) else b for a, b in v.items()}
                                              for k, v in (variants or {}).items()}),
                    samples=dict(kernels=samples, copy_ms=bw["samples_ms"], matmul_ms=mm["samples_ms"]))

    for H in heads:
        for P in prefixes:
            kv_bytes = (P + nodes) * D_KV * torch.tensor([], dtype=dt).element_size()
            n_sets = int(min(16, max(2, math.ceil(3 * l2 / max(kv_bytes, 1)))))
            sets = [random_verify_inputs(nodes, H, P, dt, dev, seed=seed + 7919 * s + P + H, cache_factor=1.0)
                    for s in range(n_sets)]
            key = f"H{H}_P{P}"
            samples[key] = {}

            def fns_for(kw):
                return [lambda st=st: verify_attention(**st, check=False, **kw) for st in sets]

            ks, kmode = _time_rotating(fns_for({}), reps, 5, graph=True)
            samples[key]["verify_attention"] = ks
            cur = {"i": 0}
            eager = time_cuda(lambda: verify_attention(**sets[cur["i"]], check=False), warmup=3, reps=20,
                              setup=lambda i: cur.__setitem__("i", i % n_sets))
            samples[key]["verify_attention_eager"] = eager
            var_res = {}
            for vname, kw in (variants or {}).items():
                vs, vmode = _time_rotating(fns_for(kw), reps, 3, graph=True)
                samples[key][f"verify_attention[{vname}]"] = vs
                var_res[vname] = {"median_ms": median(vs), "mode": vmode}
            fl = verify_floor(nodes, H, P, sets[0]["kv_cache"].element_size(), bw["gb_per_s"], mm["tflops"])
            kmed = median(ks)
            peer_res = {}
            for name in peers:
                fn = _PEERS[name]
                if name == "flex_attention" and flex_reason is not None:
                    peer_res[name] = {"status": "unsupported", "reason": flex_reason}
                    continue
                try:
                    t0 = time.perf_counter()
                    fn(**sets[0])
                    torch.cuda.synchronize()
                    first_s = time.perf_counter() - t0
                    pfns = [lambda st=st: fn(**st) for st in sets]
                    ps, pmode = _time_rotating(pfns, peer_reps, 2, graph=name != "flex_attention")
                    samples[key][name] = ps
                    peer_res[name] = {"status": "ok", "median_ms": median(ps), "mode": pmode,
                                      "first_call_s": first_s}
                except Exception as e:  # noqa: BLE001 - recorded, not hidden
                    msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
                    reason = f"{type(e).__name__}: {msg}"
                    if name == "flex_attention":
                        flex_reason = reason
                    peer_res[name] = {"status": "unsupported" if name == "flex_attention" else "failed",
                                      "reason": reason}
                    torch.cuda.synchronize()
                torch.cuda.empty_cache()
            ok = [v["median_ms"] for v in peer_res.values() if v["status"] == "ok"]
            best = min(ok) if ok else None
            points.append(dict(heads=H, nodes=nodes, prefix=P, dtype=dname, kv_sets=n_sets, mode=kmode,
                               impl=auto_impl(dt),
                               median_ms=kmed, eager_median_ms=median(eager), variants=var_res,
                               floor_ms=fl["floor_ms"], floor_bound=fl["bound"],
                               percent_of_floor=100.0 * fl["floor_ms"] / kmed, bytes=fl["bytes"], flops=fl["flops"],
                               achieved_tflops=fl["flops"] / (kmed * 1e-3) / 1e12, peers=peer_res,
                               best_peer_ms=best, speedup_vs_best_peer=(best / kmed) if best else None,
                               faster_than_all_peers=all(kmed < v for v in ok)))
            del sets
            torch.cuda.empty_cache()
            if on_point is not None:  # e.g. write the file after every point: a run cut short keeps them
                on_point(dict(_results(points), complete=False))
    results = dict(_results(points), complete=True)
    if out is not None:
        _write(results, out)
    return results


def _write(results: dict[str, Any], out: Any):
    from workbench.measure import write_measurement

    body = {k: v for k, v in results.items() if k not in ("samples", "parameters")}
    return write_measurement("ddtree_verify", out_dir=out, parameters=results["parameters"], results=body,
                             samples=results["samples"],
                             notes=VERIFY_NOTES)


VERIFY_NOTES = (
    "verify_attention, bf16 default = impl 'wgmma' (Hopper warpgroup MMA, sm_90a via nvcc; 2 warpgroups in "
    "lockstep, 64 query rows x 64 keys per tile, flash-decoding split + log-sum-exp merge launch; unchanged since "
    "5de266b). Variants in the same process: 'mma' = the mma.sync kernel (62fb1b2's design); 'pingpong' = "
    "ddtree_verify_pingpong_bf16 (commit 7dc8d3a and after): the two warpgroups in FlashMLA's 'seesaw' schedule "
    "over pairs of 64-key tiles (WG0 owns tile A and O[:, :256], WG1 tile B and O[:, 256:]; P of a warpgroup's "
    "own tile from registers (RS wgmma), the other's P through the stage's rope block; two named barriers, no "
    "block barrier in the loop; each stage refilled in two column-block groups by the warpgroup that reads them "
    "last, completion on mbarriers via cp.async.mbarrier.arrive.noinc); 'pingpong_slot_late' = the same with the "
    "next round's slot indices read at refill time (-DVERIFY_PP_SLOT_EARLY=0); 'pingpong_bar_sync' = bar.sync on "
    "both sides of the named barriers (-DVERIFY_PP_ARRIVE=0); 'pingpong_rem' = ddtree_verify_pingpong_rem_bf16 "
    "(d56b0db and after): as pingpong, and the last row block when it holds <= 8 rows (H=8: 264 = 4 x 64 + 8) by "
    "swapped operands (wgmma m64n8k16, keys as M, 3 chunks per remainder block, 30 chunks instead of 26 for the "
    "full row blocks at H=8); 'pingpong_rem2' = the same with 2 chunks per remainder block. PREDICTED BEFORE ANY "
    "RUN (papers/ddtree_kernels.md section 3, version 7; model: time = fixed part + tiles per thread block x time "
    "per tile, fitted to the 82e9399 file: fixed 29 us (H=64) / 25 us (H=8), 2.80 / 2.88 us per tile): the "
    "ping-pong kernel takes 2.1 us per tile (range 1.9-2.5), i.e. pingpong H=64: 4k 0.066 ms (39% of floor), "
    "16k 0.167 (61%), 64k 0.570 (71%), 128k 1.11 (73%); H=8: 4k 0.032 (10%), 16k 0.046 (28%), 64k 0.109 (47%), "
    "128k 0.192 (53%); pingpong_rem H=8: 4k 0.032 (10%), 16k 0.045 (28%), 64k 0.100 (51%), 128k 0.171 (59%); "
    "slot_late and bar_sync within 5% of pingpong. The fixed part (3 launches, Q and first-tile load, partial "
    "write and merge) is untouched, so H=8 at 4k/16k and H=64 at 4k stay below 50%. Peers: naive torch, SDPA "
    "with a dense mask, FlexAttention attempt. All timed as replayed CUDA graphs (eager_median_ms: the default "
    "with Python launch overhead); floor = max(bytes / measured copy bandwidth, flops / measured bf16 matmul "
    "rate); results.parity: rows against the float64 reference; results.sanitizer: compute-sanitizer logs "
    "(memcheck: every smoke case; racecheck: the ping-pong smoke cases); results.complete: false while the "
    "run was cut short.")


def verify_benchmark_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Flat rows (one per heads x prefix point) of :func:`benchmark_verify` results, or of the
    committed measurement (``load_measurement("ddtree_verify")``, its ``results`` or the whole file)."""
    res = results.get("results", results)
    rows = []
    for p in res["points"]:
        row = dict(heads=p["heads"], nodes=p["nodes"], prefix=p["prefix"], kernel_ms=p["median_ms"],
                   eager_ms=p.get("eager_median_ms"), floor_ms=p["floor_ms"], floor_bound=p["floor_bound"],
                   percent_of_floor=p["percent_of_floor"], achieved_tflops=p["achieved_tflops"])
        for name, v in p.get("variants", {}).items():
            row[f"{name}_ms"] = v["median_ms"]
        for name, v in p["peers"].items():
            row[f"{name}_ms"] = v["median_ms"] if v["status"] == "ok" else None
            if v["status"] != "ok":
                row[f"{name}_status"] = f"{v['status']}: {v.get('reason', '')}"
        row["speedup_vs_best_peer"] = p["speedup_vs_best_peer"]
        row["faster_than_all_peers"] = p["faster_than_all_peers"]
        rows.append(row)
    return rows


def verify_table(results: dict[str, Any]) -> str:
    """Plain-text table of :func:`benchmark_verify` results (or of the committed measurement)."""
    res = results.get("results", results)
    variants = sorted({v for p in res["points"] for v in p.get("variants", {})})
    lines = [f"{'H':>3} {'P':>7} {'kernel ms':>10} {'eager ms':>9} {'floor ms':>9} {'%floor':>7} "
             + " ".join(f"{v + ' ms':>11}" for v in variants)
             + f" {'naive ms':>9} {'sdpa ms':>9} {'flex':>12} {'xbest':>6}"]
    for p in res["points"]:
        def pm(name):
            r = p["peers"].get(name)
            if r is None:
                return "-"
            return f"{r['median_ms']:.3f}" if r["status"] == "ok" else r["status"]
        sp = p["speedup_vs_best_peer"]
        var = " ".join(f"{p['variants'][v]['median_ms']:>11.4f}" if v in p.get("variants", {}) else f"{'-':>11}"
                       for v in variants)
        lines.append(f"{p['heads']:>3} {p['prefix']:>7} {p['median_ms']:>10.4f} {p.get('eager_median_ms') or 0:>9.4f} "
                     f"{p['floor_ms']:>9.4f} {p['percent_of_floor']:>6.1f}% {var} {pm('naive_torch'):>9} "
                     f"{pm('sdpa_dense_mask'):>9} {pm('flex_attention'):>12} {(f'{sp:.1f}x' if sp else '-'):>6}")
    return "\n".join(lines)


def _rows_table(rows: list[dict[str, Any]]) -> str:
    out = [f"{'kernel':<26} {'shapes':<40} {'n':>2} {'max_abs':>9} {'max_rel':>9} {'lse_err':>9} pass"]
    for r in rows:
        le = r["lse_max_abs_err"]
        out.append(f"{r['kernel']:<26} {r['shapes']:<40} {r['cases']:>2} {r['max_abs_err']:>9.2e} "
                   f"{r['max_rel_err']:>9.2e} {(f'{le:.2e}' if le is not None else '-'):>9} {r['pass']}")
    return "\n".join(out)


SANITIZER_COMMAND = "compute-sanitizer --tool {tool} --kernel-name kns=ddtree_verify python -m workbench.ddtree.verify --smoke"


def read_sanitizer_logs(folder: Any, tools: Sequence[str] = ("memcheck", "racecheck")) -> dict[str, Any]:
    """Parse ``<folder>/<tool>.log``: runs of ``SANITIZER_COMMAND`` (the ``--smoke`` parity cases of
    every verify kernel under compute-sanitizer; a last line ``exit=N`` gives the exit code). Returns
    per tool: the SUMMARY lines, the errors (memcheck) or hazards (racecheck) they state, whether the
    smoke cases ran to their verdict, the exit code and the command (the log's first line when it
    reads ``# command: ...``, else ``SANITIZER_COMMAND``)."""
    def parse(tool: str, text: str, rc: int | None) -> dict[str, Any]:
        lines = text.strip().splitlines()
        summary = [ln.strip("= ").strip() for ln in summary_lines(text.strip())]
        # a first line "# command: ..." records the command actually run (e.g. with --smoke-only)
        cmd = lines[0][len("# command: "):].strip() if lines and lines[0].startswith("# command: ") else \
            SANITIZER_COMMAND.format(tool=tool)
        return {"summary": summary, "errors": stated_count(summary),
                "smoke_verdict": "PASS" if "SMOKE PASS" in text else ("FAIL" if "SMOKE FAIL" in text else None),
                "returncode": rc, "command": cmd}

    return read_logs(folder, tools, parse)


def _named_variants() -> dict[str, dict[str, Any]]:
    """Variants ``--variants`` may name (name -> keyword arguments of :func:`verify_attention`)."""
    return {"mma": {"impl": "mma"}, **PINGPONG_VARIANTS,
            "wgmma_prefetch": {"impl": "wgmma", "_options": ("-DVERIFY_WG_PREFETCH=1",)},
            "wgmma_a26b7c4": {"impl": "wgmma", "_options": ("-DVERIFY_WG_PAIR_BAR=0", "-DVERIFY_WG_LAZY_RESCALE=0")}}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.ddtree.verify",
                                 description="tree-verify attention: parity against the float64 reference and "
                                             "benchmark against peers (writes DIR/ddtree_verify.json)")
    ap.add_argument("--out", default=None, help="folder for ddtree_verify.json (default: data/measurements/<gpu>)")
    ap.add_argument("--heads", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--prefixes", type=int, nargs="+", default=[4096, 16384, 65536, 131072])
    ap.add_argument("--nodes", type=int, default=33)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--peer-reps", type=int, default=10)
    ap.add_argument("--unroll-variants", type=int, nargs="*", default=[],
                    help="also time the mma.sync kernel compiled with these score-loop unroll factors (default 4)")
    ap.add_argument("--no-mma-variant", action="store_true",
                    help="do not time the other bf16 kernels (mma.sync, the ping-pong wgmma kernel and its "
                         "-D variants) beside the default one")
    ap.add_argument("--old-wgmma-variants", action="store_true",
                    help="also time the wgmma variants of the previous runs (wgmma_prefetch, wgmma_a26b7c4)")
    ap.add_argument("--variants", nargs="*", default=None,
                    help=f"time exactly these variants beside the default (names: {sorted(_named_variants())}); "
                         "default: mma and the ping-pong variants")
    ap.add_argument("--peers", nargs="*", default=list(_PEERS),
                    help=f"peers to time (default: all of {list(_PEERS)}; none: --peers with no names)")
    ap.add_argument("--smoke", action="store_true", help="small parity cases only (for compute-sanitizer)")
    ap.add_argument("--smoke-only", default=None, help="with --smoke: only the cases whose kernel name holds this")
    ap.add_argument("--no-parity", action="store_true", help="skip the parity grid")
    ap.add_argument("--sanitizer-logs", default=None,
                    help="folder with memcheck.log / racecheck.log of SANITIZER_COMMAND runs made before this one, "
                         "recorded under results.sanitizer")
    args = ap.parse_args(argv)

    import torch

    if args.variants is not None:  # names checked before any work, also on a CPU
        bad = [v for v in args.variants if v not in _named_variants()]
        if bad:
            raise SystemExit(f"unknown variants {bad}; known: {sorted(_named_variants())}")
    bad_peers = [p for p in args.peers if p not in _PEERS]
    if bad_peers:
        raise SystemExit(f"unknown peers {bad_peers}; known: {list(_PEERS)}")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if args.smoke:
        cases = [dict(kernel=k, nodes=9, heads=8, prefix=p, dtype=d, repeats=1)
                 for k, d in (("verify_attention[wgmma]", "bfloat16"), ("verify_attention[mma]", "bfloat16"),
                              ("verify_attention", "float32"), ("verify_attention[simple]", "bfloat16"))
                 for p in (0, 150)]
        cases += [dict(kernel=f"verify_attention_batched[{t}]", nodes=9, heads=8, prefix=[0, 70, 130],
                       dtype="bfloat16", repeats=1) for t in ("wgmma", "pingpong", "mma")]
        # ping-pong: the round structure (refills of both stages, a last round without tile B, the
        # tail split across chunks) needs chunks of several tile pairs, which small prefixes never get
        cases += [dict(kernel="verify_attention[pingpong]", nodes=9, heads=8, prefix=p, dtype="bfloat16",
                       repeats=1, chunk_len=c) for p, c in ((0, None), (150, None), (600, 384), (700, 320),
                                                            (300, 192))]
        cases += [dict(kernel="verify_attention[pingpong]", nodes=33, heads=8, prefix=450, dtype="bfloat16",
                       repeats=1, chunk_len=256)]
        # pingpong_rem: 9 nodes x 8 heads = 72 rows, the last block of 8 rows by swapped operands,
        # 3 chunks per remainder block (several chunks and a partial last group with chunk_len 64/128)
        cases += [dict(kernel="verify_attention[pingpong_rem]", nodes=9, heads=8, prefix=p, dtype="bfloat16",
                       repeats=1, chunk_len=c) for p, c in ((0, None), (150, None), (600, 128), (500, 64),
                                                            (700, 320))]
        cases += [dict(kernel="verify_attention_batched[pingpong_rem]", nodes=9, heads=8, prefix=[0, 70, 130],
                       dtype="bfloat16", repeats=1, chunk_len=64)]
        if args.smoke_only:
            cases = [c for c in cases if args.smoke_only in c["kernel"]]
        rows = verify_parity_rows(cases, dev)
        print(_rows_table(rows))
        print("SMOKE", "PASS" if all(r["pass"] for r in rows) else "FAIL")
        return 0 if all(r["pass"] for r in rows) else 1
    rows = None
    if not args.no_parity:
        t0 = time.perf_counter()
        rows = verify_parity_rows(None, dev)
        print(_rows_table(rows))
        print(f"parity: {sum(r['pass'] for r in rows)}/{len(rows)} pass in {time.perf_counter() - t0:.1f} s",
              flush=True)
    if dev != "cuda":
        print("no CUDA GPU: benchmark skipped")
        return 0
    variants = {}
    if args.variants is not None:
        variants = {v: _named_variants()[v] for v in args.variants}
    elif not args.no_mma_variant and auto_impl("bfloat16") == "wgmma":
        variants["mma"] = {"impl": "mma"}  # the previous kernel, same process
        variants.update(PINGPONG_VARIANTS)
        if args.old_wgmma_variants:
            variants["wgmma_prefetch"] = {"impl": "wgmma", "_options": ("-DVERIFY_WG_PREFETCH=1",)}
            # the wgmma kernel as measured in a26b7c4: block-wide row-max barrier, O rescaled every tile
            variants["wgmma_a26b7c4"] = {"impl": "wgmma",
                                         "_options": ("-DVERIFY_WG_PAIR_BAR=0", "-DVERIFY_WG_LAZY_RESCALE=0")}
    variants.update({f"mma_unroll{u}": {"impl": "mma", "_options": (f"-DVERIFY_S_UNROLL={u}",)}
                     for u in args.unroll_variants})
    extra: dict[str, Any] = {}
    if rows is not None:
        extra["parity"] = rows
    if args.sanitizer_logs:
        extra["sanitizer"] = read_sanitizer_logs(args.sanitizer_logs)
    res = benchmark_verify(heads=tuple(args.heads), nodes=args.nodes, prefixes=tuple(args.prefixes),
                           reps=args.reps, peer_reps=args.peer_reps, variants=variants, peers=tuple(args.peers),
                           on_point=lambda r: _write(dict(r, **extra), args.out))
    res.update(extra)
    path = _write(res, args.out)
    print(f"wrote {path}")
    print(verify_table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
