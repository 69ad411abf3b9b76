"""DDTree references on the CPU (NumPy): the ground truth for the GPU kernels.

- :func:`topk_logprobs` - float32 log-softmax over the vocabulary, top-k per
  position, rows sorted descending (ties: lower token id first).
- :func:`build_tree` - best-first draft tree (Ringel & Romano, Algorithm 1)
  with a ``heapq`` heap, float64 scores built by the exact incremental
  formulas of DESIGN.md "DDTree, precisely", heap ordered by
  ``(-score, rank path)``; returns a :class:`DraftTree`.
- :func:`accept_greedy` - the longest root path the target's argmax agrees
  with, plus the next bonus token; returns an :class:`Accepted`.

Inputs may be NumPy arrays or torch tensors (copied to the CPU).
"""
from __future__ import annotations

import heapq
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from workbench.decode import grid_node_count, tree_size
from workbench.validation import check_array_values, check_int

__all__ = ["DraftTree", "Accepted", "topk_logprobs", "build_tree", "accept_greedy",
           "grid_node_count", "tree_size"]


def _to_numpy(x: Any, what: str) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch tensor
        x = x.detach().cpu().numpy()
    try:
        return np.asarray(x)
    except (TypeError, ValueError) as exc:  # pragma: no cover - not array-like (or ragged)
        raise TypeError(f"{what} must be array-like, got {type(x).__name__}") from exc


# ---------------------------------------------------------------------------
# top-k log-probs
# ---------------------------------------------------------------------------

def topk_logprobs(logits: Any, k: int):
    """Top-``k`` float32 log-probs per position, rows sorted descending.

    ``logits``: float array ``[L, V]`` or ``[B, L, V]`` (NumPy, or a torch
    tensor). Log-probs are ``topk(logits) - logsumexp(all logits)`` computed in
    float32. Returns ``(logprobs float32 [..., k], token_ids int64 [..., k])``.
    Ties between equal logits put the lower token id first.

    A torch tensor on a CUDA device is handled with torch ops on that device
    and returns torch tensors (``torch.log_softmax`` + ``torch.topk``); their
    last bits and the order of tied values may differ from the NumPy path.
    """
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    k = int(k)
    if hasattr(logits, "is_cuda") and logits.is_cuda:
        return _topk_logprobs_torch(logits, k)
    x = _to_numpy(logits, "logits")
    if x.ndim not in (2, 3):
        raise ValueError(f"logits must be [L, V] or [B, L, V], got shape {tuple(x.shape)}")
    if not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"logits must be floating point, got {x.dtype}")
    V = x.shape[-1]
    if not 1 <= k <= V:
        raise ValueError(f"k must be in 1..V={V}, got {k}")
    x = x.astype(np.float32, copy=False)
    if np.isnan(x).any():
        raise ValueError("logits contain NaN")
    m = x.max(axis=-1, keepdims=True)
    if not np.isfinite(m).all():
        raise ValueError("every logits row needs a finite maximum (got +inf or all -inf)")
    lse = (m + np.log(np.exp(x - m, dtype=np.float32).sum(axis=-1, keepdims=True,
                                                          dtype=np.float32))).astype(np.float32)
    flat = x.reshape(-1, V)
    idx = np.empty((flat.shape[0], k), dtype=np.int64)
    for i, row in enumerate(flat):
        idx[i] = _topk_indices(row, k)
    ids = idx.reshape(x.shape[:-1] + (k,))
    vals = np.take_along_axis(x, ids, axis=-1)
    return (vals - lse).astype(np.float32), ids


def _topk_indices(row: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, descending, ties by lower index."""
    V = row.shape[0]
    if k * 8 >= V:
        return np.argsort(-row, kind="stable")[:k]
    kth = np.partition(row, V - k)[V - k]  # k-th largest value
    above = np.flatnonzero(row > kth)
    equal = np.flatnonzero(row == kth)[: k - above.size]
    cand = np.concatenate([above, equal])
    order = np.lexsort((cand, -row[cand]))  # primary: value desc, then index asc
    return cand[order]


def _topk_logprobs_torch(logits, k: int):
    if logits.dim() not in (2, 3):
        raise ValueError(f"logits must be [L, V] or [B, L, V], got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    V = logits.shape[-1]
    if not 1 <= k <= V:
        raise ValueError(f"k must be in 1..V={V}, got {k}")
    x = logits.float()
    vals, ids = torch.topk(x, k, dim=-1, largest=True, sorted=True)
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    return (vals - lse), ids.to(torch.int64)


# ---------------------------------------------------------------------------
# tree build
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class DraftTree:
    """A best-first draft tree in pop order (index 0 is the root).

    Arrays of length ``n`` (= 1 + min(budget, nodes the grid allows)):
    ``tokens`` int64 (``tokens[0]`` = root token), ``parents`` int64
    (``parents[0] = -1``, ``parents[i] < i``), ``depths`` int64 (root 0),
    ``ranks`` int64 (rank of the node's token in its depth's top-k row; root
    -1), ``scores`` float32 (sum of log-probs along the path; root 0).
    """

    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    ranks: np.ndarray
    scores: np.ndarray

    @property
    def n(self) -> int:
        return int(self.tokens.shape[0])

    def visibility(self) -> np.ndarray:
        """bool ``[n, n]``: ``vis[i, j]`` iff node j is node i or an ancestor of it."""
        n = self.n
        vis = np.zeros((n, n), dtype=bool)
        for i in range(n):
            p = int(self.parents[i])
            if p >= 0:
                vis[i, :i] = vis[p, :i]
            vis[i, i] = True
        return vis

    def positions(self, start: int) -> np.ndarray:
        """int64 ``[n]``: position of each node, ``start + depth``."""
        return start + self.depths

    def rank_path(self, i: int) -> tuple[int, ...]:
        """The rank path ``(r_1, ..., r_d)`` of node ``i`` (root: ``()``)."""
        out = []
        while i > 0:
            out.append(int(self.ranks[i]))
            i = int(self.parents[i])
        return tuple(reversed(out))


def _check_tree_inputs(lp: np.ndarray, ids: np.ndarray, budget: Any, batched: bool) -> None:
    want = 3 if batched else 2
    shape_txt = "[B, L, K]" if batched else "[L, K]"
    if not isinstance(budget, (int, np.integer)) or isinstance(budget, bool):
        raise TypeError(f"budget must be an int, got {type(budget).__name__}")
    if budget < 1:
        raise ValueError(f"budget must be >= 1 (it counts non-root nodes), got {budget}")
    if lp.ndim != want:
        raise ValueError(f"logprobs must be {shape_txt}, got shape {tuple(lp.shape)}")
    if lp.dtype != np.float32:
        raise ValueError(f"logprobs must be float32 (scores are built from float32 "
                         f"log-probs), got {lp.dtype}")
    if ids.shape != lp.shape:
        raise ValueError(f"token_ids shape {tuple(ids.shape)} must equal logprobs shape "
                         f"{tuple(lp.shape)}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"token_ids must be integers, got {ids.dtype}")
    if lp.shape[-2] < 1:
        raise ValueError("logprobs need at least one position (L >= 1)")
    if lp.shape[-1] < 1:
        raise ValueError("logprobs need at least one candidate per position (K >= 1)")
    if np.isnan(lp).any():
        raise ValueError("logprobs contain NaN")
    if not np.isfinite(lp).all():
        raise ValueError("logprobs must be finite (an -inf log-prob would make the "
                         "incremental sibling score NaN); drop those candidates (smaller K)")
    check_array_values("logprobs", lp, hi=0.0, what="log-probabilities: log q <= 0")
    check_array_values("token_ids", ids, lo=0, integer=True, what="vocabulary indices")
    if (lp[..., :-1] < lp[..., 1:]).any():
        raise ValueError("logprobs rows must be sorted descending (as topk_logprobs returns)")


def build_tree(logprobs: Any, token_ids: Any, budget: int, root_token: int = -1) -> DraftTree:
    """Best-first DDTree over an ``[L, K]`` grid of top-k drafts.

    ``logprobs``: float32 ``[L, K]``, finite and <= 0, each row sorted
    descending (row d holds log q_{d+1}). ``token_ids``: int ``[L, K]``, >= 0.
    ``budget`` (>= 1): non-root nodes to pop; K is cut to min(budget, K).
    ``root_token``: the bonus token at the root, or -1 when unknown. Heap entries are ordered by
    ``(-score, rank path)`` like Python tuples; scores are float64, the first
    ``lp[0, 0]``, a sibling ``(score - lp[d-1, r]) + lp[d-1, r+1]``, a child
    ``score + lp[d, 0]``. Returns a :class:`DraftTree` of
    ``n = 1 + min(budget, sum_d K^d)`` nodes.
    """
    lp = _to_numpy(logprobs, "logprobs")
    ids = _to_numpy(token_ids, "token_ids")
    _check_tree_inputs(lp, ids, budget, batched=False)
    if not isinstance(root_token, bool) and hasattr(root_token, "__index__"):
        root_token = operator.index(root_token)  # NumPy and torch integer scalars
    check_int("root_token", root_token, lo=-1)
    budget = int(budget)
    L = lp.shape[0]
    K = min(budget, lp.shape[1])
    lp64 = lp[:, :K].astype(np.float64)  # exact widening of each float32
    lpl = lp64.tolist()

    n = tree_size(L, K, budget)
    tokens = [int(root_token)]
    parents = [-1]
    depths = [0]
    ranks = [-1]
    scores = [0.0]
    # entry: (-score, rank path, score, parent index)
    heap: list[tuple[float, tuple[int, ...], float, int]] = []
    s0 = lpl[0][0]
    heap.append((-s0, (0,), s0, 0))
    while heap and len(tokens) < n:
        _, path, score, parent = heapq.heappop(heap)
        i = len(tokens)
        d = len(path)
        r = path[-1]
        tokens.append(int(ids[d - 1, r]))
        parents.append(parent)
        depths.append(d)
        ranks.append(r)
        scores.append(score)
        if r + 1 < K:
            s = (score - lpl[d - 1][r]) + lpl[d - 1][r + 1]
            heapq.heappush(heap, (-s, path[:-1] + (r + 1,), s, parent))
        if d < L:
            s = score + lpl[d][0]
            heapq.heappush(heap, (-s, path + (0,), s, i))
    return DraftTree(tokens=np.asarray(tokens, dtype=np.int64),
                     parents=np.asarray(parents, dtype=np.int64),
                     depths=np.asarray(depths, dtype=np.int64),
                     ranks=np.asarray(ranks, dtype=np.int64),
                     scores=np.asarray(scores, dtype=np.float64).astype(np.float32))


# ---------------------------------------------------------------------------
# greedy accept
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Accepted:
    """Result of :func:`accept_greedy`.

    ``nodes`` int64 ``[length]``: accepted node indices, root first (a root
    path). ``length``: number of accepted nodes, root included (>= 1).
    ``bonus``: the target's argmax at the last accepted node (next root token).
    """

    nodes: np.ndarray
    length: int
    bonus: int

    @property
    def tokens_emitted(self) -> int:
        """Tokens this round adds to the output: the accepted drafts plus the bonus."""
        return self.length


def accept_greedy(tree: DraftTree, target_argmax: Any) -> Accepted:
    """Greedy accept: from the root, follow the child whose token equals the
    target's argmax at the current node; the first miss is the bonus token.

    ``target_argmax``: int ``[n]``, the target's argmax at every node. When
    several children carry the same token the first in pop order is taken.
    """
    if not isinstance(tree, DraftTree):
        raise TypeError(f"tree must be a DraftTree, got {type(tree).__name__}")
    am = _to_numpy(target_argmax, "target_argmax")
    if am.shape != (tree.n,):
        raise ValueError(f"target_argmax must have shape [n]=({tree.n},), got {tuple(am.shape)}")
    if not np.issubdtype(am.dtype, np.integer):
        raise ValueError(f"target_argmax must be integers, got {am.dtype}")
    children: dict[int, list[int]] = {}
    for i in range(1, tree.n):
        children.setdefault(int(tree.parents[i]), []).append(i)
    path = [0]
    cur = 0
    while True:
        want = int(am[cur])
        nxt = next((c for c in children.get(cur, ()) if int(tree.tokens[c]) == want), None)
        if nxt is None:
            break
        path.append(nxt)
        cur = nxt
    return Accepted(nodes=np.asarray(path, dtype=np.int64), length=len(path), bonus=int(am[cur]))
