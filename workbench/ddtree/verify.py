"""Tree-verify attention, MLA absorbed: the API (reference, CUDA kernels, torch CPU path).

One DDTree verify step attends every tree node's query heads over the request's
prefix KV (read through slot indices: paged KV with page_size 1) plus the
tree tail, where node ``i`` sees tail row ``t`` only when ``t`` is ``i`` or one
of its ancestors. With absorbed MLA a KV row is ``[c_kv (512) | k_rope (64)]``,
the score is ``(q_latent . c_kv + q_rope . k_rope) * scale`` and the output is
the softmax-weighted ``c_kv`` (512 values; ``W_UV`` is applied afterwards).

- :func:`verify_attention_reference` - float64 ground truth (NumPy or torch).
- :func:`verify_attention` / :func:`verify_attention_batched` - the CUDA kernels
  of ``workbench/kernels/ddtree_verify.cu`` on CUDA tensors, a torch path
  (float32 arithmetic) on CPU tensors.
- :func:`dispatched_impl` - which kernel ``impl="auto"`` runs: the GPU's
  dispatch table (``data/dispatch/<gpu>.json``: ``verify_bf16``, ``verify_fp32``).
- :func:`random_verify_inputs` - fresh random inputs (torch), :func:`default_scale`.

The kernels (numbers: ``data/measurements/h200/ddtree_verify.json``, design and
history: ``papers/ddtree_kernels.md``). The key range of each request is split
across thread blocks (flash-decoding); a block reads each latent row of its
chunk once for 64 query rows (every head of every node in the block), the masked
tail is the last chunk, and a second launch merges the chunk partials by
log-sum-exp. ``"wgmma"`` (bf16, the H200's choice): Hopper warpgroup MMA, built
for sm_90a with nvcc; warpgroup 0 computes the 64 x 64 score tile (m64n64k16),
both warpgroups accumulate half of the 512 output columns (m64n256k16), the next
tile's gather (cp.async through the slot indices, which reach shared memory a
tile ahead) runs under both. One request with T <= 128 needs no prepare launch
(the kernel builds its ancestor masks in shared memory). ``"mma"`` (bf16, any
sm_90 build; the generic choice): ``mma.sync`` m16n8k16, same tiling.
``"simple"`` (float32): CUDA cores, 16 query rows per block. A kernel that fails
to build or launch raises ``RuntimeError`` naming it; nothing falls back.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import numpy as np
import torch

from workbench.config import load_config
from workbench.dispatch import dispatch_for_device
from workbench.kernels import cuda_errors, get_kernel, launch, require_gpu

D_LATENT = 512  # kv_lora_rank: c_kv width and output width
D_ROPE = 64     # qk_rope_head_dim
D_KV = D_LATENT + D_ROPE

_MMA_ROWS = 64      # query rows per block, tensor-core kernel (impl "mma")
_SIMPLE_ROWS = 16   # query rows per block, CUDA-core kernel
_MMA_SMEM = 230_400
_WGMMA_SMEM = 232_448  # + 1 KB for the single-request form's in-kernel ancestor masks
_NOPREP_MAX_T = 128   # single-request form without the prepare launch: (nodes of a block) x ceil(T/32) <= 256 words
_SIMPLE_SMEM = (16 * 576 + 32 * 577 + 16 * 32 + 3 * 16) * 4
IMPLS = ("auto", "wgmma", "mma", "simple")
_KERNELS = {"wgmma": "ddtree_verify_wgmma_bf16", "mma": "ddtree_verify_mma_bf16", "simple": "ddtree_verify_simple_f32"}
_SMEM = {"wgmma": _WGMMA_SMEM, "mma": _MMA_SMEM, "simple": _SIMPLE_SMEM}
_TARGETS = {"wgmma": "sm_90a"}  # workbench.kernels.load_module targets (others: NVRTC, plain sm_90)

__all__ = [
    "D_KV", "D_LATENT", "D_ROPE",
    "verify_attention_reference", "verify_attention", "verify_attention_batched",
    "random_verify_inputs", "default_scale", "dispatched_impl", "IMPLS",
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


@functools.cache
def _kernel(name: str, smem: int, target: str | None = None):
    """Cached ``RawKernel`` ``name`` of the ddtree_verify family (``target``: see
    :func:`workbench.kernels.load_module`), dynamic shared memory limit raised once. Raises
    ``RuntimeError`` naming the kernel when it does not build or load."""
    try:
        k = get_kernel("ddtree_verify", name, (), target)
        if smem > 48 * 1024:
            k.max_dynamic_shared_size_bytes = smem
    except cuda_errors() as e:
        where = f" for {target}" if target else ""
        raise RuntimeError(f"kernel {name} (ddtree_verify.cu{where}) failed to build: {type(e).__name__}: "
                           f"{str(e).strip()[:500]}") from e
    return k


def _launch(name: str, smem: int, grid, block, args, target: str | None = None) -> None:
    """Launch kernel ``name`` on torch's current stream; a failure raises naming the kernel."""
    k = _kernel(name, smem, target)
    try:
        launch(k, grid, block, args, shared_mem=smem)
    except cuda_errors() as e:
        raise RuntimeError(f"kernel {name} (ddtree_verify.cu) failed to launch: {type(e).__name__}: {e}") from e


def dispatched_impl(dtype: Any, device: Any = None) -> str:
    """What ``impl="auto"`` runs for inputs of ``dtype`` (a torch dtype or its name) on the CUDA
    ``device`` (None: the current one): the GPU's dispatch table, ``verify_bf16`` (``"wgmma"`` on the
    H200, ``"mma"`` in the generic table) or ``verify_fp32`` (``"simple"``)."""
    impl = dispatch_for_device(device if device is not None else torch.cuda.current_device()).verify_impl(dtype)
    if impl not in IMPLS[1:]:
        raise ValueError(f"dispatch verify impl {impl!r} is not a verify kernel; known: {IMPLS[1:]}")
    return impl


def _check_values(kv_rows: int, prefix_slots, prefix_offsets, parents) -> None:
    """Value checks that need one host sync (skipped with check=False)."""
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
                             out=None, lse=None, _poison_workspace: bool = False,
                             _single_prefix: int | None = None):
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
    shared memory. ``_poison_workspace``: fill the partials with NaN first,
    for parity tests.)

    ``impl``: ``"auto"`` (:func:`dispatched_impl`: the GPU's dispatch table),
    ``"wgmma"`` (bf16, Hopper warpgroup MMA, built for sm_90a with nvcc),
    ``"mma"`` (bf16, ``mma.sync``, any sm_90 build) or ``"simple"`` (float32,
    CUDA cores); ignored on CPU tensors. ``chunk_len`` overrides the keys per
    thread block. ``out``/``lse`` may be given preallocated.
    Returns ``(out [B, T, H, 512] in the input dtype, lse [B, T, H] float32)``.
    """
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
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
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

    kind = impl if impl != "auto" else dispatched_impl(dtype, dev)
    if kind in ("mma", "wgmma") and dtype != torch.bfloat16:
        raise ValueError(f"impl={kind!r} needs bfloat16 inputs, got {dtype} (float32 takes impl='simple')")
    if kind == "simple" and dtype != torch.float32:
        raise ValueError(f"impl='simple' needs float32 inputs, got {dtype} (bfloat16 takes 'wgmma' or 'mma')")
    if kind == "wgmma" and kv_cache.shape[0] > 2**31 - 1:  # the kernel may carry slot indices in 32 bits
        raise ValueError(f"kv_cache has {kv_cache.shape[0]} rows; impl='wgmma' allows at most 2**31 - 1")
    rows = _MMA_ROWS if kind in ("mma", "wgmma") else _SIMPLE_ROWS
    per_sm = 2 if kind == "simple" else 1
    rb, clen, n_chunks = _plan(int(slots.shape[0]), B, T, M, rows, per_sm * _num_sms(dev), chunk_len)
    W = -(-T // 32)
    # single request, wgmma kernel, T <= 128: no prepare launch (the kernel reads P and parents itself)
    noprep = single and kind == "wgmma" and T <= _NOPREP_MAX_T

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
        _launch("ddtree_verify_prepare", 0, 1 + -(-(B * T) // 1024), 1024,
                (null if offsets is None else offsets, np.int64(slots.shape[0]), par, B, T, W, clen, offs_ws,
                 chunk_start, vis))
    scale_log2 = float(scale) * math.log2(math.e)
    args = (ql, qr, kv_cache, np.int64(kv_cache.stride(0)), slots, offs_ws, tail, vis, chunk_start, o_part,
            lse_part, B, T, H, W, clen, scale_log2)
    if kind == "wgmma":  # the single-request form's prefix length and parents (else 0 and null)
        args += (np.int64(slots.shape[0]) if noprep else np.int64(0), par if noprep else null)
    _launch(_KERNELS[kind], _SMEM[kind], (rb, n_chunks), 256, args, _TARGETS.get(kind))
    merge = "ddtree_verify_merge_bf16" if dtype == torch.bfloat16 else "ddtree_verify_merge_f32"
    _launch(merge, 0, B * M, 128, (o_part, lse_part, chunk_start, out, lse, B, M, n_chunks if noprep else 0))
    return out, lse


def verify_attention(q_latent, q_rope, kv_cache, prefix_slots, tail_kv, parents, scale, *, check: bool = True,
                     impl: str = "auto", chunk_len: int | None = None, out=None, lse=None,
                     _poison_workspace: bool = False):
    """Tree-verify attention for one request (absorbed MLA, paged prefix + tree tail).

    q_latent [T, H, 512], q_rope [T, H, 64], kv_cache [S, 576] (rows
    ``[c_kv | k_rope]``), prefix_slots [P] int (need not be contiguous or
    sorted), tail_kv [T, 576], parents [T] int (``-1 <= parents[i] < i``),
    scale: softmax scale. Torch tensors, bf16 or float32; CUDA tensors run the
    kernel (no host sync with ``check=False``), CPU tensors a torch path in
    float32. See :func:`verify_attention_batched` for ``impl``/``chunk_len``.

    Returns ``(out [T, H, 512] in the input dtype, lse [T, H] float32)``.
    """
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
                                    _poison_workspace=_poison_workspace, _single_prefix=P)
    return o[0], l[0]


# ----------------------------------------------------------------------------- random inputs

def default_scale() -> float:
    """Kimi K2.6 softmax scale (mscale^2 / sqrt(192))."""
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
