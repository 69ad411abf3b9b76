"""Batched DDTree tree kernels on the GPU (``workbench/kernels/ddtree_tree.cu``).

- :func:`build_trees` - bit-exact with :func:`workbench.ddtree.build_tree`,
  ties included: one warp per request with one lane per tree node up to 32
  non-root nodes ("small"), a binary heap in shared memory run by one thread
  above ("heap"); ``method="auto"`` follows the GPU's dispatch table
  (``data/dispatch/<gpu>.json``, field ``tree_build``).
- :func:`tree_visibility` - ancestor-closure masks ``[B, n, n]``.
- :func:`accept_greedy_batched` - one warp per request; bit-exact with
  :func:`workbench.ddtree.accept_greedy`.
- :func:`commit_scattered` / :func:`commit_compact` - the KV commit step.

Every function takes torch tensors. CUDA tensors run the kernels on torch's
current stream with no host synchronisation (so they can be captured in a CUDA
graph); CPU tensors run the NumPy references request by request and return CPU
tensors (the CPU path). Shape and dtype errors raise ``ValueError``; checks
that would need the data on the host (sortedness, NaN, log-probs <= 0, token
ids >= 0) only run with ``validate=True``. A kernel that fails to build or
launch raises ``RuntimeError`` naming it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from workbench.ddtree import reference as ref
from workbench.decode import MAX_BUDGET, MAX_L
from workbench.dispatch import dispatch_for_device
from workbench.kernels import cuda_errors, get_kernel, launch, require_gpu
from workbench.validation import check_array_values, check_choice

__all__ = ["MAX_BUDGET", "MAX_L", "BUILD_METHODS", "SMALL_MAX_NODES", "TREE_BUILD_RULES", "GpuTrees",
           "GpuAccepted", "build_trees", "dispatched_build_method", "tree_visibility", "accept_greedy_batched",
           "commit_scattered", "commit_compact", "build_smem_bytes"]

_FAMILY = "ddtree_tree"
_BUILD_THREADS = 128
_ACCEPT_WARPS = 4
_COMPACT_THREADS = 256
_SMEM_OPTIN = 227 * 1024  # sm_90 dynamic shared memory per block after opt-in


def _torch():
    return torch


@dataclass
class GpuTrees:
    """A batch of draft trees, all with the same node count ``n``.

    ``tokens``, ``parents``, ``depths``, ``ranks``: int64 ``[B, n]``;
    ``scores``: float32 ``[B, n]``. Row ``b`` equals
    ``build_tree(logprobs[b], token_ids[b], budget, root_tokens[b])``.
    """

    tokens: Any
    parents: Any
    depths: Any
    ranks: Any
    scores: Any

    @property
    def batch(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n(self) -> int:
        return int(self.tokens.shape[1])

    def visibility(self):
        """bool ``[B, n, n]`` ancestor-closure masks (see :func:`tree_visibility`)."""
        return tree_visibility(self.parents)

    def tree(self, b: int) -> ref.DraftTree:
        """Request ``b`` as a NumPy :class:`DraftTree` (copies to the host)."""
        return ref.DraftTree(*(t[b].detach().cpu().numpy() for t in
                               (self.tokens, self.parents, self.depths, self.ranks, self.scores)))


@dataclass
class GpuAccepted:
    """Batched greedy accept. ``nodes`` int64 ``[B, n]``: accepted node indices
    root first, padded with -1; ``lengths`` int64 ``[B]`` (root included);
    ``bonus`` int64 ``[B]``: the next root token of each request."""

    nodes: Any
    lengths: Any
    bonus: Any


BUILD_METHODS = ("auto", "small", "heap")
SMALL_MAX_NODES = 32  # "small" holds the whole frontier in one warp's lanes
_SMALL_NODE_SLOTS = 33  # DDT_SMALL_NODES in ddtree_tree.cu
_KERNEL_NAMES = {"small": "ddtree_build_small", "heap": "ddtree_build"}
# The dispatch table's tree_build rule -> (builder up to SMALL_MAX_NODES non-root nodes, builder above).
TREE_BUILD_RULES = {"small_or_heap": ("small", "heap")}


def build_smem_bytes(L: int, K: int, n: int, method: str = "heap") -> int:
    """Dynamic shared memory of one build block: "small": the request's token ids and log-probs and
    33 node slots; "heap": heap entries (float64 score + int key), log-probs and the node arrays."""
    if method == "small":
        return 8 * ((12 * L * K + 12 * _SMALL_NODE_SLOTS + 7) // 8)
    return 8 * n + 4 * L * K + 4 * n + 12 * n


def dispatched_build_method(n_nonroot: int, device: Any = None) -> str:
    """The builder ``method="auto"`` runs for trees of ``n_nonroot`` non-root nodes on ``device``
    (a CUDA device; None: the current one): the ``tree_build`` rule of the GPU's dispatch table."""
    rule = dispatch_for_device(device if device is not None else torch.cuda.current_device()).tree_build
    if rule not in TREE_BUILD_RULES:
        raise ValueError(f"dispatch tree_build={rule!r} is not a known rule; known: {sorted(TREE_BUILD_RULES)}")
    small, large = TREE_BUILD_RULES[rule]
    return small if n_nonroot <= SMALL_MAX_NODES else large


@functools.cache
def _kernel(name: str, opt_in: bool = False):
    """The ``ddtree_tree`` family's kernel ``name``, built once per process; ``opt_in``: dynamic
    shared memory allowed up to the opt-in limit (launches above 48 KB). Raises ``RuntimeError``
    naming the kernel when it does not build."""
    try:
        k = get_kernel(_FAMILY, name)
        if opt_in:
            k.max_dynamic_shared_size_bytes = _SMEM_OPTIN
    except cuda_errors() as e:
        raise RuntimeError(f"kernel {name} ({_FAMILY}.cu) failed to build: {type(e).__name__}: {e}") from e
    return k


def _launch(name: str, grid, block, args, shared_mem: int = 0) -> None:
    """Launch kernel ``name`` on torch's current stream; a failed launch raises naming the kernel."""
    k = _kernel(name, shared_mem > 48 * 1024)
    try:
        launch(k, grid, block, args, shared_mem=shared_mem)
    except cuda_errors() as e:
        raise RuntimeError(f"kernel {name} ({_FAMILY}.cu) failed to launch: {type(e).__name__}: {e}") from e


def _check_tensor(t: Any, what: str) -> None:
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch tensor, got {type(t).__name__}")


# ---------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------

def build_trees(logprobs, token_ids, budget: int, root_tokens: Any = -1,
                validate: bool = False, method: str = "auto",
                out: GpuTrees | None = None) -> GpuTrees:
    """Build ``B`` draft trees at once.

    ``logprobs``: float32 ``[B, L, K]`` (rows sorted descending, every value
    finite and <= 0), ``token_ids``: int64 or int32 ``[B, L, K]`` (>= 0) on the
    same device; ``budget`` in 1..MAX_BUDGET, L in 1..MAX_L on the GPU.
    ``root_tokens``: an int (>= -1; -1: unknown), or an int64 tensor ``[B]``
    (the bonus tokens from the previous round, on the device). Returns a
    :class:`GpuTrees` with ``n = tree_size(L, K, budget)`` nodes per request.
    ``validate=True`` also checks the values (a host sync): sortedness,
    finiteness, log-probs <= 0, token ids >= 0.
    ``method`` (GPU; both bit-exact): "small" (at most 32 non-root nodes: one
    warp per request, lane p holds node p's next unpopped child, a pop is a
    warp arg-max with ``__reduce_max_sync``), "heap" (a binary heap run by one
    thread in shared memory, one block per request) or "auto"
    (:func:`dispatched_build_method`). CPU tensors run the NumPy reference
    request by request whatever the method. ``out``: preallocated
    :class:`GpuTrees` of shape ``[B, n]`` to write into (GPU).
    """
    torch = _torch()
    _check_tensor(logprobs, "logprobs")
    _check_tensor(token_ids, "token_ids")
    if not isinstance(budget, (int, np.integer)) or isinstance(budget, bool):
        raise TypeError(f"budget must be an int, got {type(budget).__name__}")
    budget = int(budget)
    if budget < 1:
        raise ValueError(f"budget must be >= 1 (it counts non-root nodes), got {budget}")
    check_choice("method", method, BUILD_METHODS)
    if logprobs.dim() != 3:
        raise ValueError(f"logprobs must be [B, L, K], got shape {tuple(logprobs.shape)}")
    if logprobs.dtype != torch.float32:
        raise ValueError(f"logprobs must be float32, got {logprobs.dtype}")
    if tuple(token_ids.shape) != tuple(logprobs.shape):
        raise ValueError(f"token_ids shape {tuple(token_ids.shape)} must equal logprobs shape "
                         f"{tuple(logprobs.shape)}")
    if token_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"token_ids must be int64 or int32, got {token_ids.dtype}")
    if token_ids.device != logprobs.device:
        raise ValueError("token_ids and logprobs must be on the same device")
    B, L, Kin = logprobs.shape
    if L < 1 or Kin < 1:
        raise ValueError(f"logprobs need L >= 1 and K >= 1, got L={L}, K={Kin}")
    root_t = None
    if isinstance(root_tokens, torch.Tensor):
        if tuple(root_tokens.shape) != (B,) or root_tokens.dtype != torch.int64:
            raise ValueError(f"root_tokens must be an int or an int64 tensor [B]=({B},), got "
                             f"{root_tokens.dtype} {tuple(root_tokens.shape)}")
        if root_tokens.device != logprobs.device:
            raise ValueError("root_tokens must be on the same device as logprobs")
        root_t = root_tokens.contiguous()
    elif not isinstance(root_tokens, (int, np.integer)) or isinstance(root_tokens, bool):
        raise TypeError(f"root_tokens must be an int or a tensor, got {type(root_tokens).__name__}")
    elif root_tokens < -1:
        raise ValueError(f"root_tokens={int(root_tokens)} is not allowed: a token id >= 0, or -1 (unknown)")
    if validate:
        if torch.isnan(logprobs).any():
            raise ValueError("logprobs contain NaN")
        if not torch.isfinite(logprobs).all():
            raise ValueError("logprobs must be finite")
        check_array_values("logprobs", logprobs.detach().cpu().numpy(), hi=0.0,
                           what="log-probabilities: log q <= 0")
        check_array_values("token_ids", token_ids.detach().cpu().numpy(), lo=0, integer=True,
                           what="vocabulary indices")
        if (logprobs[..., :-1] < logprobs[..., 1:]).any():
            raise ValueError("logprobs rows must be sorted descending")

    if not logprobs.is_cuda:
        return _build_trees_cpu(logprobs, token_ids, budget, root_t, root_tokens)

    if budget > MAX_BUDGET:
        raise ValueError(f"build_trees on the GPU supports budget <= {MAX_BUDGET}, got {budget}")
    if L > MAX_L:
        raise ValueError(f"build_trees on the GPU supports L <= {MAX_L}, got {L}")

    require_gpu("build_trees")
    K = min(budget, Kin)
    n = ref.tree_size(L, Kin, budget)
    if method == "auto":
        method = dispatched_build_method(n - 1, logprobs.device)
    elif method == "small" and n - 1 > SMALL_MAX_NODES:
        raise ValueError(f"method='small' needs at most {SMALL_MAX_NODES} non-root nodes, "
                         f"this tree has {n - 1}; use 'auto' or 'heap'")
    smem = build_smem_bytes(L, K, n, method)
    if smem > _SMEM_OPTIN:
        raise ValueError(f"tree build needs {smem} B of shared memory (L={L}, K={K}, n={n}); "
                         f"the limit is {_SMEM_OPTIN}")
    lp = logprobs.contiguous()
    ids = token_ids.contiguous().to(torch.int64)
    dev = lp.device
    if out is not None:
        _check_out(out, (B, n), dev)
        tokens, parents, depths, ranks, scores = (out.tokens, out.parents, out.depths, out.ranks,
                                                  out.scores)
        if scores.dtype != torch.float32:
            raise ValueError("out.scores must be float32")
    else:
        tokens = torch.empty((B, n), dtype=torch.int64, device=dev)
        parents = torch.empty_like(tokens)
        depths = torch.empty_like(tokens)
        ranks = torch.empty_like(tokens)
        scores = torch.empty((B, n), dtype=torch.float32, device=dev)
    if B > 0:
        root_ptr = root_t if root_t is not None else np.uint64(0)
        root_def = np.int64(0 if root_t is not None else int(root_tokens))
        block = 32 if method == "small" else _BUILD_THREADS  # "small": one warp (request) per block
        _launch(_KERNEL_NAMES[method], (B,), (block,),
                (lp, ids, root_ptr, root_def, B, L, Kin, K, n, tokens, parents, depths, ranks, scores),
                shared_mem=smem)
    return GpuTrees(tokens, parents, depths, ranks, scores)


def _check_out(out, shapes, dev) -> None:
    torch = _torch()
    fields = [getattr(out, f) for f in out.__dataclass_fields__]
    if not isinstance(shapes, list):
        shapes = [shapes] * len(fields)
    for f, t, shp in zip(out.__dataclass_fields__, fields, shapes):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shp) or t.device != dev \
                or not t.is_contiguous():
            raise ValueError(f"out.{f} must be a contiguous tensor of shape {tuple(shp)} on {dev}")
        if f != "scores" and t.dtype != torch.int64:
            raise ValueError(f"out.{f} must be int64, got {t.dtype}")


def _build_trees_cpu(logprobs, token_ids, budget, root_t, root_default) -> GpuTrees:
    torch = _torch()
    lp = logprobs.detach().numpy()
    ids = token_ids.detach().numpy()
    trees = []
    for b in range(lp.shape[0]):
        root = int(root_t[b]) if root_t is not None else int(root_default)
        trees.append(ref.build_tree(lp[b], ids[b], budget, root_token=root))
    n = ref.tree_size(lp.shape[1], lp.shape[2], budget)

    def stack(attr, dtype):
        if not trees:
            return torch.empty((0, n), dtype=dtype)
        return torch.from_numpy(np.stack([getattr(t, attr) for t in trees]))

    return GpuTrees(stack("tokens", torch.int64), stack("parents", torch.int64),
                    stack("depths", torch.int64), stack("ranks", torch.int64),
                    stack("scores", torch.float32))


# ---------------------------------------------------------------------------
# visibility
# ---------------------------------------------------------------------------

def tree_visibility(parents):
    """bool ``[B, n, n]``: ``vis[b, i, j]`` iff node j is node i or one of its
    ancestors. ``parents``: int64 ``[B, n]`` with ``parents[:, 0] = -1`` and
    ``parents[:, i] < i``."""
    torch = _torch()
    _check_tensor(parents, "parents")
    if parents.dim() != 2 or parents.dtype != torch.int64:
        raise ValueError(f"parents must be int64 [B, n], got {parents.dtype} "
                         f"{tuple(parents.shape)}")
    B, n = parents.shape
    if not parents.is_cuda:
        out = np.zeros((B, n, n), dtype=bool)
        p = parents.numpy()
        for b in range(B):
            for i in range(n):
                if p[b, i] >= 0:
                    out[b, i, :i] = out[b, p[b, i], :i]
                out[b, i, i] = True
        return torch.from_numpy(out)
    vis = torch.empty((B, n, n), dtype=torch.bool, device=parents.device)
    total = B * n * n
    if total:
        blocks = min((total + 255) // 256, 65535)
        _launch("ddtree_visibility", (blocks,), (256,),
               (parents.contiguous(), B, n, vis))
    return vis


# ---------------------------------------------------------------------------
# accept
# ---------------------------------------------------------------------------

def _tree_tensors(trees) -> tuple[Any, Any]:
    if not (hasattr(trees, "tokens") and hasattr(trees, "parents")):
        raise TypeError("trees must have .tokens and .parents (e.g. build_trees' GpuTrees)")
    return trees.tokens, trees.parents


def accept_greedy_batched(trees, target_argmax, out: GpuAccepted | None = None) -> GpuAccepted:
    """Greedy accept for a batch: ``trees`` has ``tokens`` and ``parents``
    int64 ``[B, n]`` (a :class:`GpuTrees`); ``target_argmax`` int64 ``[B, n]``
    is the target's argmax at every node. Row ``b`` equals
    ``accept_greedy(tree_b, target_argmax[b])`` (nodes padded with -1).
    ``out``: preallocated :class:`GpuAccepted` to write into (GPU)."""
    torch = _torch()
    tokens, parents = _tree_tensors(trees)
    for t, what in ((tokens, "tokens"), (parents, "parents"), (target_argmax, "target_argmax")):
        _check_tensor(t, what)
        if t.dim() != 2 or t.dtype != torch.int64:
            raise ValueError(f"{what} must be int64 [B, n], got {t.dtype} {tuple(t.shape)}")
    if not (tokens.shape == parents.shape == target_argmax.shape):
        raise ValueError(f"tokens {tuple(tokens.shape)}, parents {tuple(parents.shape)} and "
                         f"target_argmax {tuple(target_argmax.shape)} must have one shape [B, n]")
    if len({t.device for t in (tokens, parents, target_argmax)}) != 1:
        raise ValueError("tokens, parents and target_argmax must be on one device")
    B, n = tokens.shape
    if n < 1:
        raise ValueError("trees need at least the root node (n >= 1)")
    if not tokens.is_cuda:
        nodes = torch.full((B, n), -1, dtype=torch.int64)
        lengths = torch.empty(B, dtype=torch.int64)
        bonus = torch.empty(B, dtype=torch.int64)
        for b in range(B):
            tr = ref.DraftTree(tokens[b].numpy(), parents[b].numpy(), np.zeros(n, np.int64),
                               np.zeros(n, np.int64), np.zeros(n, np.float32))
            a = ref.accept_greedy(tr, target_argmax[b].numpy())
            nodes[b, :a.length] = torch.from_numpy(a.nodes)
            lengths[b] = a.length
            bonus[b] = a.bonus
        return GpuAccepted(nodes, lengths, bonus)
    dev = tokens.device
    if out is not None:
        _check_out(out, [(B, n), (B,), (B,)], dev)
        nodes, lengths, bonus = out.nodes, out.lengths, out.bonus
    else:
        nodes = torch.empty((B, n), dtype=torch.int64, device=dev)
        lengths = torch.empty(B, dtype=torch.int64, device=dev)
        bonus = torch.empty(B, dtype=torch.int64, device=dev)
    if B:
        warps = min(_ACCEPT_WARPS, B)
        smem = 4 * n * warps
        _launch("ddtree_accept", ((B + warps - 1) // warps,), (32 * warps,),
               (tokens.contiguous(), parents.contiguous(), target_argmax.contiguous(), B, n,
                nodes, lengths, bonus), shared_mem=smem)
    return GpuAccepted(nodes, lengths, bonus)


# ---------------------------------------------------------------------------
# commit
# ---------------------------------------------------------------------------

def _check_commit(slots, accepted: GpuAccepted):
    torch = _torch()
    _check_tensor(slots, "slots")
    if not isinstance(accepted, GpuAccepted):
        raise TypeError(f"accepted must be a GpuAccepted, got {type(accepted).__name__}")
    if slots.dim() != 2 or slots.dtype != torch.int64:
        raise ValueError(f"slots must be int64 [B, n], got {slots.dtype} {tuple(slots.shape)}")
    if tuple(accepted.nodes.shape) != tuple(slots.shape):
        raise ValueError(f"slots {tuple(slots.shape)} and accepted nodes "
                         f"{tuple(accepted.nodes.shape)} must have one shape [B, n]")
    if slots.device != accepted.nodes.device:
        raise ValueError("slots and accepted must be on one device")


def commit_scattered(slots, accepted: GpuAccepted):
    """Scattered commit (paged KV, page_size 1).

    ``slots``: int64 ``[B, n]``, the KV slot each tree node was written to.
    Returns ``(keep, freed, nfree)``: ``keep`` int64 ``[B, n]`` the accepted
    nodes' slots in path order (root first), -1 padded (``lengths`` valid);
    ``freed`` int64 ``[B, n]`` the other nodes' slots in node order, -1 padded;
    ``nfree`` int64 ``[B]`` (= n - lengths).
    """
    torch = _torch()
    _check_commit(slots, accepted)
    B, n = slots.shape
    if not slots.is_cuda:
        keep = torch.full((B, n), -1, dtype=torch.int64)
        freed = torch.full((B, n), -1, dtype=torch.int64)
        nfree = torch.empty(B, dtype=torch.int64)
        for b in range(B):
            ln = int(accepted.lengths[b])
            acc = accepted.nodes[b, :ln]
            keep[b, :ln] = slots[b, acc]
            mask = torch.ones(n, dtype=torch.bool)
            mask[acc] = False
            rest = slots[b, mask]
            freed[b, :rest.numel()] = rest
            nfree[b] = rest.numel()
        return keep, freed, nfree
    keep = torch.empty_like(slots)
    freed = torch.empty_like(slots)
    nfree = torch.empty(B, dtype=torch.int64, device=slots.device)
    if B:
        warps = min(_ACCEPT_WARPS, B)
        _launch("ddtree_commit_scattered", ((B + warps - 1) // warps,), (32 * warps,),
               (slots.contiguous(), accepted.nodes.contiguous(), accepted.lengths.contiguous(),
                B, n, keep, freed, nfree), shared_mem=n * warps)
    return keep, freed, nfree


def commit_compact(kv_cache, slots, accepted: GpuAccepted, dest_start, slot_dim: int = 0):
    """Compacting commit, in place: for each request ``b`` and ``j < lengths[b]``,
    KV row ``dest_start[b] + j`` <- row ``slots[b, accepted.nodes[b, j]]``.

    ``kv_cache``: contiguous tensor whose dimension ``slot_dim`` indexes slots
    (dimensions before it are independent planes, e.g. layers; dimensions after
    it form one row; rows must be a whole number of 4-byte words). ``slots``
    int64 ``[B, n]``; ``dest_start`` int64 ``[B]``. Sources and destinations of
    one request may overlap (every row is read before any is written);
    different requests must use disjoint slots. Accepted paths must have at
    most 1024 nodes (a root path has at most L + 1 <= 33). Returns ``kv_cache``.
    """
    torch = _torch()
    _check_commit(slots, accepted)
    _check_tensor(kv_cache, "kv_cache")
    _check_tensor(dest_start, "dest_start")
    B, n = slots.shape
    if dest_start.dtype != torch.int64 or tuple(dest_start.shape) != (B,):
        raise ValueError(f"dest_start must be int64 [B]=({B},), got {dest_start.dtype} "
                         f"{tuple(dest_start.shape)}")
    if not 0 <= slot_dim < kv_cache.dim():
        raise ValueError(f"slot_dim must be in 0..{kv_cache.dim() - 1}, got {slot_dim}")
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache must be contiguous (it is updated in place)")
    if kv_cache.device != slots.device or dest_start.device != slots.device:
        raise ValueError("kv_cache, slots and dest_start must be on one device")
    planes = int(np.prod(kv_cache.shape[:slot_dim], dtype=np.int64))
    S = kv_cache.shape[slot_dim]
    row_bytes = int(np.prod(kv_cache.shape[slot_dim + 1:], dtype=np.int64)) * kv_cache.element_size()
    if row_bytes % 4:
        raise ValueError(f"a KV row must be a multiple of 4 bytes, got {row_bytes}")
    if not kv_cache.is_cuda:
        view = kv_cache.view(planes, S, -1)
        for b in range(B):
            ln = int(accepted.lengths[b])
            src = slots[b, accepted.nodes[b, :ln]]
            d0 = int(dest_start[b])
            view[:, d0:d0 + ln] = view[:, src].clone()
        return kv_cache
    W = row_bytes // 4
    if B and planes:
        if planes > 65535:
            raise ValueError(f"at most 65535 planes, got {planes}")
        _launch("ddtree_commit_compact", (B, planes), (_COMPACT_THREADS,),
               (kv_cache, np.int64(S * W), W, slots.contiguous(), accepted.nodes.contiguous(),
                accepted.lengths.contiguous(), dest_start.contiguous(), n),
               shared_mem=8 * n)
    return kv_cache
