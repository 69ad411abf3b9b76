"""Token choice inside the step: the float32 argmax, or seeded sampling that DDTree keeps lossless; log-probs.

Sampling is Gumbel-max with noise that depends only on (the request's seed, the index of the generated token,
the vocabulary id): token i of a request is ``argmax(masked logits / temperature + G(seed, i, v))``, where the
mask keeps the ``top_k`` most likely ids and the smallest set whose probability reaches ``top_p``. Because the
noise of token i does not depend on how the engine reached it, DDTree's walk over its verified tree (at each node,
take the target's token for that node's position; move to the child that holds it, else emit it and stop: the
target-only walk of ``DESIGN.md``, with :func:`workbench.ddtree.accept_greedy_batched` as the walk) produces the
very sequence plain sampling produces for that seed, token for token: its output is distributed exactly as the
target's. Rows at temperature 0 take the argmax of the raw float32 logits, bit for bit the greedy path.

The noise is a counter-based hash in int64 tensor ops (32-bit lanes, no generator state), so it is the same on
the CPU and the GPU, reproducible per request whatever else is batched, and captured in CUDA graphs.

Shapes: logits float32 [N, V]; per row temperature float32 [N], top_p float32 [N], top_k int64 [N] (0: off),
seed int64 [N], index int64 [N] (which generated token the row picks). Returns int64 [N].
"""
from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (lowbias32) on int64 tensors holding values in [0, 2^32)."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def gumbel_noise(seed: torch.Tensor, index: torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel(0, 1) noise float32 [N, vocab] for rows of (seed int64 [N], index int64 [N])."""
    v = torch.arange(vocab, device=seed.device, dtype=torch.int64)
    lo, hi = seed & _M32, (seed >> 32) & _M32
    row = _mix32(_mix32(lo ^ _mix32(hi + 0x9E3779B9)) ^ (index & _M32))
    h = _mix32(row[:, None] ^ _mix32(v[None, :] + 0x85EBCA6B))
    u = (h.double() + 0.5) / 4294967296.0
    return (-torch.log(-torch.log(u))).float()


def scale(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """logits float32 [N, V] over each row's temperature [N] (0 is held at 1e-6: those rows take the argmax)."""
    return logits / temperature.clamp(min=1e-6)[:, None]


def keep_mask(scaled: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """bool [N, V]: the ids each row may sample from its temperature-scaled logits (:func:`scale`): its top_k,
    then the smallest set reaching top_p."""
    N, V = scaled.shape
    srt, order = scaled.sort(-1, descending=True)
    rank = torch.arange(V, device=scaled.device)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, V))
    probs = torch.softmax(srt, -1)
    before = probs.cumsum(-1) - probs  # probability of the ids ranked above
    keep_sorted = (rank[None, :] < k[:, None]) & (before < top_p[:, None])
    keep_sorted[:, 0] = True
    return torch.zeros_like(keep_sorted).scatter_(1, order, keep_sorted)


def choose(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
           seed: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Each row's token (module docstring): the argmax where temperature is 0, else the seeded sample."""
    greedy = logits.argmax(-1)
    scaled = scale(logits, temperature)
    masked = torch.where(keep_mask(scaled, top_p, top_k), scaled, float("-inf"))
    sampled = (masked + gumbel_noise(seed, index, logits.shape[1])).argmax(-1)
    return torch.where(temperature > 0, sampled, greedy)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, n: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probabilities under softmax(float32 logits) [N, V] at temperature 1: of ``tokens`` int64 [N]
    (float32 [N]) and the ``n`` most likely ids (int64 [N, n], float32 [N, n], most likely first)."""
    lp = torch.log_softmax(logits.float(), -1)
    top = lp.topk(n, -1) if n else None
    chosen = lp.gather(1, tokens[:, None]).squeeze(1)
    if top is None:
        return chosen, tokens.new_zeros(tokens.shape[0], 0), lp.new_zeros(tokens.shape[0], 0)
    return chosen, top.indices, top.values
