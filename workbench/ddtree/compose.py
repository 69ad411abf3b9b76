"""One DDTree round on one stream, without host synchronisation.

drafter logits -> :func:`topk_logprobs` -> :func:`build_trees` -> tree KV
written to the cache -> tree-verify attention -> target argmax per node ->
:func:`accept_greedy_batched` -> :func:`commit_scattered`.

The target here is a small synthetic one (:class:`ToyProblem`: embedding
tables for queries and latent KV, an output projection), enough to close the
loop with real shapes (MLA absorbed: 512 latent + 64 rope, paged KV with
page_size 1). Nothing in :func:`ddtree_round` copies to the host, so the round
runs under ``torch.cuda.set_sync_debug_mode("error")``
(:func:`check_no_host_sync`) and captures into a ``torch.cuda.CUDAGraph`` at a
fixed budget (:func:`capture_round`).

Verify attention: ``verify="torch"`` uses :func:`verify_attention_torch`
(batched, dense masked softmax in float32, written here); ``verify="kernel"``
calls ``workbench.ddtree.verify.verify_attention_batched`` (``check=False``,
so no host sync; on CPU tensors that is its torch path); ``"auto"`` takes the
kernel when the tensors are on the GPU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from workbench.ddtree.reference import topk_logprobs, tree_size
from workbench.ddtree.tree_gpu import (GpuAccepted, GpuTrees, accept_greedy_batched, build_trees, commit_scattered,
                                       tree_visibility)
from workbench.ddtree.verify import verify_attention_batched

__all__ = ["ToyProblem", "RoundResult", "make_toy_problem", "verify_attention_torch",
           "ddtree_round", "check_no_host_sync", "capture_round"]

D_LATENT = 512
D_ROPE = 64


@dataclass
class ToyProblem:
    """Inputs of one round for ``B`` requests (all tensors on one device).

    ``drafter_logits`` float32 ``[B, L, V]``; ``root_tokens`` int64 ``[B]``;
    ``kv_cache`` ``[S, 576]`` (bf16 or float32); ``prefix_slots`` int64
    ``[B, P]``; ``tail_slots`` int64 ``[B, n]`` (where the tree's KV rows go);
    ``q_embed`` ``[V, H, 576]``, ``kv_embed`` ``[V, 576]``, ``w_out``
    ``[512, V]``: the synthetic target; ``scale``: softmax scale.
    """

    drafter_logits: Any
    root_tokens: Any
    kv_cache: Any
    prefix_slots: Any
    tail_slots: Any
    q_embed: Any
    kv_embed: Any
    w_out: Any
    budget: int
    scale: float

    @property
    def batch(self) -> int:
        return int(self.drafter_logits.shape[0])


@dataclass
class RoundResult:
    """Outputs of :func:`ddtree_round` (all on the problem's device)."""

    trees: GpuTrees
    target_argmax: Any       # int64 [B, n]
    accepted: GpuAccepted
    keep_slots: Any          # int64 [B, n], -1 padded
    free_slots: Any          # int64 [B, n], -1 padded
    n_free: Any              # int64 [B]
    attn_out: Any            # float32 [B, n, H, 512]


def make_toy_problem(batch: int = 4, L: int = 7, budget: int = 16, prefix: int = 64,
                     heads: int = 8, vocab: int = 512, dtype: str = "float32",
                     device: str = "cpu", seed: int = 0) -> ToyProblem:
    """Random inputs for a round: ``batch`` requests of ``prefix`` cached tokens
    each (scattered slots in a shared paged cache), drafts over ``L``
    positions with ``K = min(budget, vocab)``."""
    if batch < 1 or L < 1 or budget < 1 or prefix < 0 or heads < 1 or vocab < 2:
        raise ValueError(f"need batch, L, budget, heads >= 1, prefix >= 0, vocab >= 2; got "
                         f"batch={batch}, L={L}, budget={budget}, prefix={prefix}, "
                         f"heads={heads}, vocab={vocab}")
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}.get(dtype)
    if dt is None:
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    g = torch.Generator(device="cpu").manual_seed(seed)
    K = min(budget, vocab)
    n = tree_size(L, K, budget)
    S = batch * (prefix + n) + 7
    perm = torch.randperm(S, generator=g)
    prefix_slots = perm[: batch * prefix].view(batch, prefix)
    tail_slots = perm[batch * prefix: batch * (prefix + n)].view(batch, n)
    d = D_LATENT + D_ROPE

    def rnd(*shape, std=1.0):
        return (torch.randn(*shape, generator=g) * std)

    # drafter logits correlated with the target's preferences make long accepts likely
    w_out = rnd(D_LATENT, vocab, std=1.0 / math.sqrt(D_LATENT))
    prob = ToyProblem(
        drafter_logits=(rnd(batch, L, vocab) * 3.0).to(device),
        root_tokens=torch.randint(0, vocab, (batch,), generator=g).to(device),
        kv_cache=rnd(S, d).to(dt).to(device),
        prefix_slots=prefix_slots.to(device),
        tail_slots=tail_slots.to(device),
        q_embed=rnd(vocab, heads, d, std=1.0).to(dt).to(device),
        kv_embed=rnd(vocab, d).to(dt).to(device),
        w_out=w_out.to(device),
        budget=budget,
        scale=1.0 / math.sqrt(192.0),
    )
    return prob


def verify_attention_torch(q_latent, q_rope, kv_cache, prefix_slots, tail_kv, visibility,
                           scale: float):
    """Batched tree-verify attention (MLA absorbed) with torch ops, float32 math.

    ``q_latent`` ``[B, T, H, 512]``, ``q_rope`` ``[B, T, H, 64]``, ``kv_cache``
    ``[S, 576]``, ``prefix_slots`` int64 ``[B, P]``, ``tail_kv`` ``[B, T, 576]``,
    ``visibility`` bool ``[B, T, T]``. Each tail row sees the whole prefix and
    the tail rows its visibility row allows. Returns ``out`` float32
    ``[B, T, H, 512]`` and ``lse`` float32 ``[B, T, H]``. No host sync.
    """
    B, T, H, _ = q_latent.shape
    q = torch.cat([q_latent, q_rope], dim=-1).float()                  # [B, T, H, 576]
    keys = torch.cat([kv_cache[prefix_slots], tail_kv], dim=1).float()  # [B, P+T, 576]
    P = prefix_slots.shape[1]
    s = torch.einsum("bthd,bsd->bths", q, keys) * scale               # [B, T, H, P+T]
    mask = torch.ones((B, T, P + T), dtype=torch.bool, device=q.device)
    mask[:, :, P:] = visibility
    s = s.masked_fill(~mask[:, :, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    out = torch.einsum("bths,bsd->bthd", p, keys[..., :D_LATENT])
    return out, lse


def ddtree_round(prob: ToyProblem, verify: str = "auto") -> RoundResult:
    """One round: top-k, build, write tree KV, verify, argmax, accept, commit.

    Runs on torch's current stream; on CUDA tensors nothing synchronises with
    the host. ``verify``: "auto", "torch" or "kernel" (see the module doc).
    """
    if verify not in ("auto", "torch", "kernel"):
        raise ValueError(f"verify must be 'auto', 'torch' or 'kernel', got {verify!r}")
    on_gpu = prob.drafter_logits.is_cuda
    use_kernel = verify == "kernel" or (verify == "auto" and on_gpu)
    B, L, V = prob.drafter_logits.shape
    K = min(prob.budget, V)
    lp, ids = topk_logprobs(prob.drafter_logits, K) if on_gpu else \
        [torch.from_numpy(a) for a in topk_logprobs(prob.drafter_logits, K)]
    trees = build_trees(lp, ids, prob.budget, root_tokens=prob.root_tokens)
    tok = trees.tokens                                     # [B, n]
    tail_kv = prob.kv_embed[tok]                           # [B, n, 576]
    prob.kv_cache[prob.tail_slots] = tail_kv               # the verify forward writes tree KV
    q = prob.q_embed[tok]                                  # [B, n, H, 576]
    q_lat, q_rope = q[..., :D_LATENT], q[..., D_LATENT:]
    if use_kernel:
        P = prob.prefix_slots.shape[1]
        offsets = torch.arange(B + 1, dtype=torch.int64, device=tok.device) * P
        out, _ = verify_attention_batched(q_lat.contiguous(), q_rope.contiguous(), prob.kv_cache,
                                          prob.prefix_slots.reshape(-1), offsets, tail_kv, trees.parents,
                                          prob.scale, check=False)
        out = out.float()
    else:
        vis = tree_visibility(trees.parents)
        out, _ = verify_attention_torch(q_lat, q_rope, prob.kv_cache, prob.prefix_slots,
                                        tail_kv, vis, prob.scale)
    logits = out.mean(dim=2) @ prob.w_out                  # [B, n, V]
    argmax = torch.argmax(logits, dim=-1)
    acc = accept_greedy_batched(trees, argmax)
    keep, freed, nfree = commit_scattered(prob.tail_slots, acc)
    return RoundResult(trees, argmax, acc, keep, freed, nfree, out)


def check_no_host_sync(prob: ToyProblem, verify: str = "auto") -> RoundResult:
    """Run :func:`ddtree_round` with ``torch.cuda.set_sync_debug_mode("error")``:
    any host synchronisation raises. Needs CUDA tensors; kernels must be
    compiled already (compiling is host work), so call the round once first."""
    if not prob.drafter_logits.is_cuda:
        raise ValueError("check_no_host_sync needs a problem on a CUDA device")
    prev = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        res = ddtree_round(prob, verify)
    finally:
        torch.cuda.set_sync_debug_mode(prev)
    return res


def capture_round(prob: ToyProblem, verify: str = "auto", warmup: int = 2):
    """Capture :func:`ddtree_round` in a ``torch.cuda.CUDAGraph`` (fixed budget,
    fixed batch). Returns ``(graph, result)``: ``graph.replay()`` recomputes
    ``result``'s tensors in place from the current contents of ``prob``'s
    tensors."""
    if not prob.drafter_logits.is_cuda:
        raise ValueError("capture_round needs a problem on a CUDA device")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            ddtree_round(prob, verify)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        res = ddtree_round(prob, verify)
    return g, res
