"""Spec-Bench-style acceptance from the target's greedy continuations: trees, the chain and prompt lookup.

With greedy verification DDTree is lossless, so its output on a prompt IS the target's greedy continuation
``g[0..N-1]`` (``g[0]`` the prefill's argmax). A round that starts with bonus ``g[n]`` at position ``P + n`` sees the
committed context ``prompt + g[:n]``; the drafter's logits for that round depend on nothing else (the DFlash drafter
scores every depth from the context alone). So the drafter is run ONCE at every anchor ``n`` of every continuation
(:func:`draft_all`: top-K log-probs and ids per depth, and the exact rank of the true token at each depth), and a
decode is replayed from those rows (:func:`replay`): each round builds the tree with
:func:`workbench.ddtree.build_trees` (the GPU builder on CUDA, the NumPy reference otherwise), walks it with
:func:`workbench.ddtree.accept_greedy_batched` against the known greedy tokens (the target's argmax at a node is the
greedy token after it whenever the node lies on the accepted path, which is all the walk reads), and moves ``n`` on by
the accepted length. This is the same accepted length as a live DDTree loop whose verify forward computes the same
features (equal to float rounding; the bench checks live loops on a subset for losslessness and agreement).

Per (text type, drafter, budget) the result holds: ``mean_accepted`` (tokens per round, bonus included: tau) with a
bootstrap 95% interval over prompts (:func:`bootstrap_ci`), the per-round histogram of accepted lengths, the hit
rate by depth (P(depth d accepted | depth d - 1 reached)) and by sibling rank (of the rounds reaching depth d - 1,
how often the right token was the accepted node's 1st, 2nd, 3rd... child, or absent), and the tokens and rounds.

Baselines on the same continuations: ``chain`` (one child per node, depth L: budget = L, K = 1) and
:func:`prompt_lookup` (a training-free n-gram drafter: the continuation of the latest earlier occurrence of the
last n tokens, n = 3, 2, 1, proposed as a chain of depth L).
"""
from __future__ import annotations

import numpy as np
import torch

from workbench.ddtree import accept_greedy_batched, build_trees
from workbench.validation import check_int

__all__ = ["draft_all", "replay", "prompt_lookup", "bootstrap_ci", "MAX_RANK"]

MAX_RANK = 8   # sibling ranks reported one by one; larger ones are pooled


@torch.no_grad()
def draft_all(drafter, features: torch.Tensor, seqs: torch.Tensor, prompt_lens: torch.Tensor, gen_lens: torch.Tensor,
              k: int, chunk: int = 1024) -> dict:
    """The drafter at every anchor of every sequence. seqs int64 [M, T] (prompt + greedy continuation, right-padded),
    features [M, T, nf] (target hidden states of ``drafter.target_layers``), prompt_lens / gen_lens int64 [M]
    (continuation tokens). Returns {"lp": float32 [M, N, L, k] (top-k log-probs, sorted), "ids": int64
    [M, N, L, k], "true_rank": int64 [M, N, L] (rank of the greedy token at depth d in the drafter's full
    distribution; -1 past the continuation)} with N = max(gen_lens) (anchors past a row's continuation are
    filled with the row's last anchor)."""
    c = drafter.config
    M, T = seqs.shape
    L, W = c.block - 1, c.context_window
    N = int(gen_lens.max())
    dev = features.device
    lp = torch.empty(M, N, L, k, dtype=torch.float32, device=dev)
    ids = torch.empty(M, N, L, k, dtype=torch.int64, device=dev)
    rank = torch.full((M, N, L), -1, dtype=torch.int64, device=dev)
    pairs = torch.stack(torch.meshgrid(torch.arange(M), torch.arange(N), indexing="ij"), -1).reshape(-1, 2).to(dev)
    for i in range(0, pairs.shape[0], chunk):
        r, n = pairs[i:i + chunk, 0], pairs[i:i + chunk, 1]
        gl = gen_lens.to(dev)[r]
        n_eff = torch.minimum(n, gl - 1)
        a = prompt_lens.to(dev)[r] + n_eff                                     # the bonus's index in seqs
        cidx = a[:, None] - W + torch.arange(W, device=dev)
        cmask = cidx >= 0
        cidx = cidx.clamp(min=0)
        ctx = features[r[:, None], cidx]
        bidx = a[:, None] + torch.arange(c.block, device=dev)
        toks = torch.full((r.shape[0], c.block), c.mask_token_id, dtype=torch.int64, device=dev)
        toks[:, 0] = seqs[r, a]
        logits = drafter(toks, bidx, ctx.to(drafter.fc.weight.dtype), cidx, cmask).float()
        lps = torch.log_softmax(logits, -1)
        v, ix = lps.topk(k, -1)
        lp[r, n], ids[r, n] = v, ix
        truth_idx = bidx[:, 1:]
        inside = truth_idx < (prompt_lens.to(dev)[r] + gl)[:, None]
        truth = seqs[r[:, None], truth_idx.clamp(max=T - 1)]
        tl = lps.gather(-1, truth[..., None])
        rk = (lps > tl).sum(-1)
        rank[r, n] = torch.where(inside & (n < gl)[:, None], rk, torch.full_like(rk, -1))
    return {"lp": lp, "ids": ids, "true_rank": rank}


def replay(drafts: dict, seqs: torch.Tensor, prompt_lens: torch.Tensor, gen_lens: torch.Tensor, budget: int,
           k: int | None = None) -> dict:
    """Replay DDTree decodes of every continuation from :func:`draft_all`'s rows with trees of ``budget`` nodes
    built from the top ``k`` (default min(budget, available)) candidates per depth (``k=1, budget=L``: the chain).
    Returns per prompt the accepted length of every round and the pooled depth / sibling-rank counts: {"rounds":
    [[acc, ...] per prompt], "reached" [L], "accepted" [L], "by_rank" [L, MAX_RANK + 1] (the last column: rank >=
    MAX_RANK), "nodes" (tree nodes incl. root)}."""
    check_int("budget", budget, lo=1)
    lp_all, ids_all = drafts["lp"], drafts["ids"]
    M, N, L, K = lp_all.shape
    k = min(budget, K) if k is None else min(k, K)
    dev = lp_all.device
    P = prompt_lens.to(dev)
    G = gen_lens.to(dev)
    n = torch.zeros(M, dtype=torch.int64, device=dev)
    rounds: list[list[int]] = [[] for _ in range(M)]
    reached = torch.zeros(L, dtype=torch.int64, device=dev)
    accepted = torch.zeros(L, dtype=torch.int64, device=dev)
    by_rank = torch.zeros(L, MAX_RANK + 1, dtype=torch.int64, device=dev)
    T = seqs.shape[1]
    nodes = None
    while True:
        act = torch.nonzero(n < G - 1).flatten()
        if act.numel() == 0:
            break
        na = n[act]
        lp = lp_all[act, na, :, :k].contiguous()
        ids = ids_all[act, na, :, :k].contiguous()
        bonus = seqs[act, P[act] + na]
        trees = build_trees(lp, ids, budget, root_tokens=bonus)
        nodes = trees.n
        # the greedy token after each node's depth: truth[b, d] = g[n + d + 1]; -1 past the continuation
        didx = P[act][:, None] + na[:, None] + 1 + torch.arange(L + 1, device=dev)
        inside = didx < (P[act] + G[act])[:, None]
        truth = torch.where(inside, seqs[act[:, None], didx.clamp(max=T - 1)], torch.full_like(didx, -1))
        am = truth.gather(1, trees.depths.clamp(max=L))
        acc = accept_greedy_batched(trees, am)
        lens = acc.lengths
        # depth / sibling-rank statistics: depth d is reached when lens >= d (the path holds depth d - 1)
        d = torch.arange(1, L + 1, device=dev)
        reach = (lens[:, None] >= d[None]) & inside[:, :L]
        hit = lens[:, None] >= d[None] + 1
        reached += reach.sum(0)
        accepted += hit.sum(0)
        an = acc.nodes
        if an.shape[1] < L + 1:
            an = torch.cat([an, torch.full((an.shape[0], L + 1 - an.shape[1]), -1, dtype=an.dtype, device=dev)], 1)
        path = an[:, 1:L + 1].clamp(min=0)                                     # accepted node at depth 1..L
        r = trees.ranks.gather(1, path).clamp(max=MAX_RANK)
        by_rank.scatter_add_(1, torch.where(hit, r, torch.zeros_like(r)).T.contiguous(), hit.T.long().contiguous())
        for i, (row, ln) in enumerate(zip(act.tolist(), lens.tolist())):
            rounds[row].append(int(ln))
        n[act] += lens
    return {"rounds": rounds, "reached": reached.tolist(), "accepted": accepted.tolist(),
            "by_rank": by_rank.tolist(), "nodes": nodes, "budget": budget, "k": k}


def prompt_lookup(prompt: list[int], gen: list[int], depth: int, max_ngram: int = 3) -> list[int]:
    """Accepted lengths per round of a prompt-lookup (n-gram) drafter replayed on ``gen`` (the greedy continuation
    of ``prompt``): at bonus g[n], the latest earlier occurrence of the last m tokens of prompt + g[:n + 1]
    (m = max_ngram .. 1) proposes the ``depth`` tokens after it as a chain; no match: nothing proposed."""
    check_int("depth", depth, lo=1)
    seq = list(prompt) + list(gen)
    P, N = len(prompt), len(gen)
    out, n = [], 0
    while n < N - 1:
        end = P + n + 1                      # context through the bonus
        prop: list[int] = []
        for m in range(min(max_ngram, end - 1), 0, -1):
            tail = seq[end - m:end]
            for s in range(end - m - 1, -1, -1):
                if seq[s:s + m] == tail:
                    prop = seq[s + m:min(s + m + depth, end)]
                    break
            if prop:
                break
        a = 1
        for j, t in enumerate(prop):
            if n + 1 + j < N and gen[n + 1 + j] == t:
                a += 1
            else:
                break
        out.append(a)
        n += a
    return out


def bootstrap_ci(rounds: list[list[int]], reps: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean accepted length (sum of accepted / rounds) over prompts
    resampled with replacement."""
    rng = np.random.default_rng(seed)
    tot = np.array([sum(r) for r in rounds], dtype=np.float64)
    cnt = np.array([len(r) for r in rounds], dtype=np.float64)
    idx = rng.integers(0, len(rounds), size=(reps, len(rounds)))
    means = tot[idx].sum(1) / np.maximum(cnt[idx].sum(1), 1)
    a = (1 - level) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def summarize(res: dict, seed: int = 0) -> dict:
    """A replay's (or prompt lookup's ``{"rounds": ...}``) summary row: mean_accepted, its 95% interval, rounds,
    tokens, the histogram [1..max] and the depth / sibling-rank hit rates."""
    rounds = res["rounds"]
    flat = [a for r in rounds for a in r]
    hi = max(flat) if flat else 1
    row = {"mean_accepted": float(np.sum(flat) / max(1, len(flat))), "ci95": bootstrap_ci(rounds, seed=seed),
           "rounds": len(flat), "tokens": int(np.sum(flat)), "prompts": len(rounds),
           "histogram": np.bincount(flat, minlength=hi + 1)[1:].tolist(),
           "per_prompt_mean": [float(np.mean(r)) if r else None for r in rounds]}
    if "reached" in res:
        reached, acc = np.array(res["reached"]), np.array(res["accepted"])
        row["hit_by_depth"] = [float(a / r) if r else None for a, r in zip(acc, reached)]
        row["reached_by_depth"] = reached.tolist()
        br = np.array(res["by_rank"], dtype=np.float64)
        row["hit_by_sibling_rank"] = [[float(x / r) if r else None for x in br[d]] for d, r in enumerate(reached)]
        row["nodes"] = res["nodes"]
    return row
