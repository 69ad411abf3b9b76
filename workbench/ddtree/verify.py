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
memory; warpgroup 0 computes the scores of all 64 keys (m64n64k16, Q and K
both K-major through matrix descriptors; a row's scores lie in one lane quad,
so no row-max exchange), P (bf16) and the rescale factors go to shared memory,
and warpgroup g accumulates output columns 256g..256g+255 (m64n256k16, V = the
same key tile read MN-major through the descriptor's transpose bit); the next
tile's cp.async gather runs under both phases; 242 registers, no spills.
(Until 1e272c7 each warpgroup computed its 32-key half with m64n32k16 and the
row maxima were exchanged: ``-DVERIFY_WG_S1=0``, bench variant wgmma_5de266b.)
Every KV row is read once per 64-row block, so a 64 x 64 tile moves 73.7 KB
from L2 for 8.9 MFLOP. Measured per tile on the H200 (0929e2e): 2.6 us; the
gathers alone 1.7-1.9 us, the compute alone 1.74 us (diagnostic builds
``-DVERIFY_WG_DIAG=1`` / ``=2``): the two overlap only in part, and the gathers
alone draw about 5 TB/s from L2 across the GPU. Tried and slower: a 32-key ring
with three gathers in flight (967a0d4), the ping-pong kernels of version 7
(1e272c7), warpgroup 1 alone gathering with the slot indices read ahead
(f9c5bfa). With H = 8 the 264 query rows fill five 64-row blocks, the last with
8 rows. The chunk partials are merged by a second launch (one block per query
row, the chunks' lse values read once, in parallel). Batched requests first run
one small launch for offsets, chunk starts and the ancestor masks; one request
with T <= 128 does without it (the kernel takes the prefix length and builds
the masks its tail blocks need in shared memory).
(papers/ddtree_kernels.md, section 3, has every version with its prediction and
outcome.)
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
_WGMMA_SMEM = 232_448  # + 1 KB for the single-request form's in-kernel ancestor masks
_NOPREP_MAX_T = 128   # single-request form without the prepare launch: (nodes of a block) x ceil(T/32) <= 256 words
_SIMPLE_SMEM = (16 * 576 + 32 * 577 + 16 * 32 + 3 * 16) * 4
_IMPLS = ("auto", "wgmma", "mma", "simple")
_WGMMA_TARGET = "sm_90a"  # workbench.kernels.load_module target of the wgmma kernel
_WGMMA_KERNEL = "ddtree_verify_wgmma_bf16"  # 64-key tiles, 2 stages (a 32-key 4-stage ring: commit 967a0d4)

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
    length is a multiple of ``key_align`` keys (64: one tile)."""
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
                             _single_prefix: int | None = None, _prepare: bool | None = None,
                             _merge_options: tuple = ()):
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
    no offsets tensor has to be made on the device; with the wgmma kernel and
    T <= 128 that form also skips the prepare launch: the kernel takes the
    prefix length as an argument and builds the ancestor masks it needs in
    shared memory (``_prepare=True`` forces the prepare launch, a tuning
    variant). ``_options`` / ``_merge_options``: ``-D`` options of the
    attention / merge kernel builds, tuning variants.)

    ``impl``: ``"auto"`` (:func:`auto_impl`: wgmma, else mma, for bf16; CUDA
    cores for float32), ``"wgmma"`` (bf16, Hopper warpgroup MMA, built for
    sm_90a with nvcc; 64 query rows x 64 keys per step), ``"mma"`` (bf16
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
    if kind in ("mma", "wgmma") and dtype != torch.bfloat16:
        raise ValueError(f"impl={impl!r} needs bfloat16 inputs (float32 takes impl='simple')")
    if kind == "wgmma":
        why = wgmma_unavailable_reason()
        if why is not None:
            raise ValueError(f"impl={kind!r} is not available here ({why}); use impl='mma' or 'auto'")
    rows = _MMA_ROWS if kind in ("mma", "wgmma") else _SIMPLE_ROWS
    per_sm = 2 if kind == "simple" else 1
    rb, clen, n_chunks = _plan(int(slots.shape[0]), B, T, M, rows, per_sm * _num_sms(dev), chunk_len)
    W = -(-T // 32)
    # single request, wgmma kernel, T <= 128: no prepare launch (the kernel reads P and parents itself)
    noprep = single and kind == "wgmma" and T <= _NOPREP_MAX_T and _prepare is not True

    i32 = dict(dtype=torch.int32, device=dev)
    if not noprep:
        chunk_start = torch.empty(B + 1, **i32)
        offs_ws = torch.empty(B + 1, dtype=torch.int64, device=dev)
        vis = torch.empty(B * T * W, dtype=torch.int32, device=dev)
    o_part = torch.empty(n_chunks * M * D_LATENT, dtype=torch.float32, device=dev)
    lse_part = torch.empty(n_chunks * M, dtype=torch.float32, device=dev)
    if _poison_workspace:
        o_part.fill_(float("nan"))
        lse_part.fill_(float("nan"))
        if not noprep:
            vis.fill_(-1)
    if out is None:
        out = torch.empty(B, T, H, D_LATENT, dtype=dtype, device=dev)
    elif _shape(out) != (B, T, H, D_LATENT) or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {dtype} tensor [B, T, H, 512] = {[B, T, H, D_LATENT]}")
    if lse is None:
        lse = torch.empty(B, T, H, dtype=torch.float32, device=dev)
    elif _shape(lse) != (B, T, H) or lse.dtype != torch.float32 or not lse.is_contiguous():
        raise ValueError(f"lse must be a contiguous float32 tensor [B, T, H] = {[B, T, H]}")

    null = np.uint64(0)
    if noprep:
        offs_ws = vis = chunk_start = null
    else:
        _launch(_kernel("ddtree_verify_prepare", 0), 1 + -(-(B * T) // 1024), 1024,
                (null if offsets is None else offsets, np.int64(slots.shape[0]), par, B, T, W, clen, offs_ws,
                 chunk_start, vis))
    scale_log2 = float(scale) * math.log2(math.e)
    args = (ql, qr, kv_cache, np.int64(kv_cache.stride(0)), slots, offs_ws, tail, vis, chunk_start, o_part,
            lse_part, B, T, H, W, clen, scale_log2)
    if kind == "wgmma":
        _launch(_kernel(_WGMMA_KERNEL, _WGMMA_SMEM, _options, _WGMMA_TARGET), (rb, n_chunks), 256,
                args + (np.int64(slots.shape[0]) if noprep else np.int64(0), par if noprep else null),
                shared_mem=_WGMMA_SMEM)
    elif kind == "mma":
        _launch(_kernel("ddtree_verify_mma_bf16", _MMA_SMEM, _options), (rb, n_chunks), 256, args,
                shared_mem=_MMA_SMEM)
    else:
        name = "ddtree_verify_simple_bf16" if dtype == torch.bfloat16 else "ddtree_verify_simple_f32"
        _launch(_kernel(name, _SIMPLE_SMEM), (rb, n_chunks), 256, args, shared_mem=_SIMPLE_SMEM)
    merge = "ddtree_verify_merge_bf16" if dtype == torch.bfloat16 else "ddtree_verify_merge_f32"
    _launch(_kernel(merge, 0, tuple(_merge_options)), B * M, 128,
            (o_part, lse_part, chunk_start, out, lse, B, M, n_chunks if noprep else 0))
    return out, lse


def verify_attention(q_latent, q_rope, kv_cache, prefix_slots, tail_kv, parents, scale, *, check: bool = True,
                     impl: str = "auto", chunk_len: int | None = None, out=None, lse=None, _options: tuple = (),
                     _prepare: bool | None = None, _merge_options: tuple = ()):
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
                                    _options=_options, _single_prefix=P, _prepare=_prepare,
                                    _merge_options=_merge_options)
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
    for tag in ("wgmma", "mma"):
        if tag == "wgmma" and wgmma_unavailable_reason() is not None:
            continue
        for heads in (8, 64):
            for p in (100, 4096 + 37, 131072):
                cases.append(dict(kernel=f"verify_attention[{tag}]", nodes=33, heads=heads, prefix=p,
                                  dtype="bfloat16", repeats=2 if p < 100000 else 1))
        cases.append(dict(kernel=f"verify_attention_batched[{tag}]", nodes=33, heads=8,
                          prefix=[0, 5000, 70, 20000], dtype="bfloat16", repeats=1))
    if wgmma_unavailable_reason() is None:
        # the default's single-request form without the prepare launch (T <= 128): blocks of many nodes
        # (H = 1: 64 per block, 4 mask words), nodes split across blocks (H = 3), the tail split across
        # chunks (chunk_len 64), T = 128 (the largest) and T = 129 (prepare launch again)
        cases += [dict(kernel="verify_attention[wgmma]", nodes=n, heads=h, prefix=p, dtype="bfloat16", repeats=2,
                       chunk_len=c) for n, h, p, c in ((100, 1, 500, None), (70, 3, 1000, 64), (33, 8, 1000, 64),
                                                       (128, 2, 300, None), (129, 2, 300, 128), (17, 64, 0, None))]
        for name in WGMMA_VARIANTS:  # the variants timed beside the default
            cases += [dict(kernel="verify_attention[wgmma]", nodes=33, heads=h, prefix=4096 + 37, dtype="bfloat16",
                           repeats=1, variant=name) for h in (8, 64)]
            cases.append(dict(kernel="verify_attention_batched[wgmma]", nodes=33, heads=8,
                              prefix=[0, 5000, 70, 20000], dtype="bfloat16", repeats=1, variant=name))
    cases += [
        dict(kernel="verify_attention[simple]", nodes=33, heads=8, prefix=4096 + 37, dtype="bfloat16", repeats=2),
        dict(kernel="verify_attention", nodes=65, heads=8, prefix=3000, dtype="bfloat16", repeats=2),
        dict(kernel="verify_attention", nodes=17, heads=64, prefix=777, dtype="float32", repeats=2),
        dict(kernel="verify_attention_naive", nodes=33, heads=8, prefix=4096, dtype="bfloat16", repeats=1),
        dict(kernel="verify_attention_sdpa", nodes=33, heads=8, prefix=4096, dtype="bfloat16", repeats=1),
    ]
    return cases


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
    ``chunk_len`` (keys per thread block, passed to the kernel), ``options`` (``-D``
    options of the kernel build, a tuning variant) and ``variant`` (a name of
    :data:`WGMMA_VARIANTS`); the last two on CUDA tensors only.
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
            if case.get("options"):  # -D options of the kernel build (tuning variants; CUDA only)
                extra["_options"] = tuple(case["options"])
            if case.get("variant"):  # a named variant of WGMMA_VARIANTS (CUDA only)
                extra.update({k: v for k, v in WGMMA_VARIANTS[case["variant"]].items() if k != "impl"})
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
        cstr = (f" chunk={case['chunk_len']}" if case.get("chunk_len") else "") + \
            (f" {' '.join(case['options'])}" if case.get("options") else "") + \
            (f" [{case['variant']}]" if case.get("variant") else "")
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

# -D variants of the wgmma kernel that ``--variants`` may name (timed beside the default in one process)
WGMMA_VARIANTS: dict[str, dict[str, Any]] = {
    # the default of 5de266b..1e272c7: each warpgroup its 32-key half of S and a row-max exchange, the
    # prepare launch, the two-pass merge
    "wgmma_5de266b": {"impl": "wgmma", "_options": ("-DVERIFY_WG_S1=0",), "_prepare": True,
                      "_merge_options": ("-DVERIFY_MERGE_V1=1",)},
    # + S by warpgroup 0 alone (VERIFY_WG_S1, m64n64k16)
    "s1_prepare_merge1": {"impl": "wgmma", "_prepare": True, "_merge_options": ("-DVERIFY_MERGE_V1=1",)},
    # + no prepare launch for one request (T <= 128); the default adds the one-pass merge
    "s1_merge1": {"impl": "wgmma", "_merge_options": ("-DVERIFY_MERGE_V1=1",)},
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


def _time_pipelined(fns: Sequence[Any], reps: int, per_sample: int = 10) -> list[float]:
    """CUDA-event samples (ms per call) of ``per_sample`` CUDA-graph replays issued back to back
    (``fns`` rotated): the GPU stays busy, so the host's graph-launch latency overlaps the previous
    replay, as it does when a verify step runs inside a longer stream of work."""
    import torch

    graphs = _capture(fns)
    for g in graphs[:3]:
        g.replay()
    torch.cuda.synchronize()
    out = []
    for i in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for j in range(per_sample):
            graphs[(i * per_sample + j) % len(graphs)].replay()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / per_sample)
    return out


def graph_launch_floor(reps: int = 200) -> dict[str, Any]:
    """Replay time (ms, median; samples) of a CUDA graph holding one minimal kernel node (a one-element
    add), timed as the benchmark times a verify call: what any one-graph call costs at least."""
    import torch

    from workbench.measure import median

    x = torch.zeros(1, device="cuda")
    s, mode = _time_rotating([lambda: x.add_(1.0)], reps, 5, graph=True)
    return {"median_ms": median(s), "mode": mode, "samples_ms": s}


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
    with the results so far (``complete`` False) after every point. The kernel and
    its variants are also timed back to back (``pipelined_ms``: ten graph replays
    per sample, per call), and the replay time of a graph of one minimal kernel
    node is recorded (``graph_launch_floor_ms``): the part of every headline time
    that is the graph launch itself. Returns the results dict (raw samples under
    ``samples``, ``complete`` True).
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
    floor_graph = graph_launch_floor()
    l2 = 60 << 20
    points, samples = [], {}
    flex_reason = None

    def _results(pts):
        return dict(points=pts, copy_gb_per_s=bw["gb_per_s"], bf16_matmul_tflops=mm["tflops"],
                    graph_launch_floor_ms=floor_graph["median_ms"],
                    goal="faster than every peer at every point and >= 50% of floor",
                    all_faster_than_peers=all(p["faster_than_all_peers"] for p in pts),
                    min_percent_of_floor=min(p["percent_of_floor"] for p in pts) if pts else None,
                    parameters=dict(heads=list(heads), nodes=nodes, prefixes=list(prefixes), dtype=dname,
                                    reps=reps, peer_reps=peer_reps, peers=list(peers),
                                    variants={k: {a: list(b) if isinstance(b, tuple) else b for a, b in v.items()}
                                              for k, v in (variants or {}).items()}),
                    samples=dict(kernels=samples, copy_ms=bw["samples_ms"], matmul_ms=mm["samples_ms"],
                                 graph_launch_floor_ms=floor_graph["samples_ms"]))

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
            kp = _time_pipelined(fns_for({}), reps)
            samples[key]["verify_attention_pipelined"] = kp
            cur = {"i": 0}
            eager = time_cuda(lambda: verify_attention(**sets[cur["i"]], check=False), warmup=3, reps=20,
                              setup=lambda i: cur.__setitem__("i", i % n_sets))
            samples[key]["verify_attention_eager"] = eager
            var_res = {}
            for vname, kw in (variants or {}).items():
                vs, vmode = _time_rotating(fns_for(kw), reps, 3, graph=True)
                samples[key][f"verify_attention[{vname}]"] = vs
                vp = _time_pipelined(fns_for(kw), reps)
                samples[key][f"verify_attention[{vname}]_pipelined"] = vp
                var_res[vname] = {"median_ms": median(vs), "mode": vmode, "pipelined_ms": median(vp)}
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
                               median_ms=kmed, eager_median_ms=median(eager), pipelined_ms=median(kp),
                               variants=var_res,
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
    "verify_attention, bf16 default = impl 'wgmma' (Hopper warpgroup MMA, sm_90a via nvcc; 2 warpgroups, 64 query "
    "rows x 64 keys per tile, flash-decoding split + log-sum-exp merge launch). Since 0929e2e: S of a tile by "
    "warpgroup 0 alone (VERIFY_WG_S1, m64n64k16: Q read from shared memory once per tile, no row-max exchange); "
    "the single-request form (T <= 128) without the prepare launch (prefix length as an argument, ancestor masks "
    "built in shared memory by the blocks whose chunk reaches the tail); the merge's two passes over the chunks' "
    "lse values fused into one and its weighted sum 8 loads deep. Variants in the same process, a chain from the "
    "previous default to today's: 'wgmma_5de266b' = the default of 5de266b..1e272c7 (-DVERIFY_WG_S1=0, prepare "
    "launch, -DVERIFY_MERGE_V1=1 merge); 's1_prepare_merge1' = + S1; 's1_merge1' = + no prepare launch; the "
    "default = + one-pass merge; 'mma' = the mma.sync kernel (62fb1b2's design). (Predictions and outcomes of each "
    "step: papers/ddtree_kernels.md section 3 and the notes of the committed runs.) pipelined_ms: graph replays "
    "back to back (ten per sample); graph_launch_floor_ms: a graph of one minimal kernel node timed as the kernel "
    "is. Peers: naive torch, SDPA with a dense mask, FlexAttention attempt. All timed as replayed CUDA graphs "
    "(eager_median_ms: the default with Python launch overhead); floor = max(bytes / measured copy bandwidth, "
    "flops / measured bf16 matmul rate); results.parity: rows against the float64 reference; results.sanitizer: "
    "compute-sanitizer logs of the smoke cases; results.complete: false while the run was cut short.")


def verify_benchmark_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Flat rows (one per heads x prefix point) of :func:`benchmark_verify` results, or of the
    committed measurement (``load_measurement("ddtree_verify")``, its ``results`` or the whole file)."""
    res = results.get("results", results)
    rows = []
    for p in res["points"]:
        row = dict(heads=p["heads"], nodes=p["nodes"], prefix=p["prefix"], kernel_ms=p["median_ms"],
                   eager_ms=p.get("eager_median_ms"), pipelined_ms=p.get("pipelined_ms"), floor_ms=p["floor_ms"],
                   floor_bound=p["floor_bound"],
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
    lines = [f"{'H':>3} {'P':>7} {'kernel ms':>10} {'pipe ms':>8} {'eager ms':>9} {'floor ms':>9} {'%floor':>7} "
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
        lines.append(f"{p['heads']:>3} {p['prefix']:>7} {p['median_ms']:>10.4f} {p.get('pipelined_ms') or 0:>8.4f} "
                     f"{p.get('eager_median_ms') or 0:>9.4f} "
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
    return {"mma": {"impl": "mma"}, **WGMMA_VARIANTS,
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
                    help="do not time the other bf16 kernel (mma.sync) beside the default one")
    ap.add_argument("--old-wgmma-variants", action="store_true",
                    help="also time the wgmma variants of the previous runs (wgmma_prefetch, wgmma_a26b7c4)")
    ap.add_argument("--variants", nargs="*", default=None,
                    help=f"time exactly these variants beside the default (names: {sorted(_named_variants())}); "
                         "default: mma and WGMMA_VARIANTS")
    ap.add_argument("--peers", nargs="*", default=list(_PEERS),
                    help=f"peers to time (default: all of {list(_PEERS)}; none: --peers with no names)")
    ap.add_argument("--smoke", action="store_true", help="small parity cases only (for compute-sanitizer)")
    ap.add_argument("--smoke-only", default=None,
                    help="with --smoke: only the cases whose kernel name, -D options or variant hold this")
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
                       dtype="bfloat16", repeats=1) for t in ("wgmma", "mma")]
        # the default's single-request form without the prepare launch: many nodes per block, nodes split
        # across blocks, the tail split across chunks
        cases += [dict(kernel="verify_attention[wgmma]", nodes=n, heads=h, prefix=p, dtype="bfloat16", repeats=1,
                       chunk_len=c) for n, h, p, c in ((70, 1, 200, None), (40, 3, 300, 64), (9, 8, 300, 128))]
        # the variants timed beside the default
        for name in WGMMA_VARIANTS:
            cases += [dict(kernel="verify_attention[wgmma]", nodes=9, heads=8, prefix=p, dtype="bfloat16",
                           repeats=1, chunk_len=c, variant=name) for p, c in ((0, None), (300, 128))]
            cases += [dict(kernel="verify_attention_batched[wgmma]", nodes=9, heads=8, prefix=[0, 70, 130],
                           dtype="bfloat16", repeats=1, chunk_len=64, variant=name)]
        if args.smoke_only:
            cases = [c for c in cases if args.smoke_only in " ".join([c["kernel"], *c.get("options", ()),
                                                                      c.get("variant", "")])]
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
        variants.update(WGMMA_VARIANTS)  # the previous default and the steps from it to today's
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
