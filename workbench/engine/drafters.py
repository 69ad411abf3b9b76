"""Drafters for DDTree: one protocol, a scripted drafter for systems work, a DFlash-style block drafter.

Protocol (:class:`Drafter`): an attribute ``block`` (block size; a draft
covers the ``L = block - 1`` positions after the bonus token), an attribute
``target_layers`` (target decoder layers whose output hidden states the
drafter wants for the committed context; empty if none), and
``draft(inp: DraftInput) -> logits float [B, L, V]``.

:class:`ScriptedDrafter` - a controlled acceptance knob
---------------------------------------------------------
Given each request's true continuation (the target's own greedy tokens), for
draft position ``i`` (0-based, the i-th token after the bonus) it emits a
fixed log-probability profile over ranks, ``logits[rank r] = -gap * r`` for
``r < spread`` and ``-1e4 - r`` beyond, and places tokens on the ranks:

- with probability ``p_top[i]`` the correct token is at rank 0 (a hit);
- otherwise (a miss) the correct token is at rank ``miss_rank`` (1 <= m <
  spread), or, with ``miss_rank=None``, at the very bottom (absent from any
  tree), and a random wrong token takes rank 0.

All other ranks hold random distinct wrong tokens. Draws come from a
generator seeded by ``(seed, request, position)``, so a run is reproducible.

How the settings map to the expected accepted length (root counted): with
``gap`` large (the default 4.0), the best-first tree puts the rank-0 chain
first, so for ``budget >= L`` and ``miss_rank=None``

    E[accepted length] = 1 + sum_{j=1..L} prod_{i<j+1} p_top[i-1]
                       = 1 + p + p^2 + ... + p^L   for a constant p.

(p = 0.9, L = 15: 8.15; p = 0.8: 4.86; p = 0.7: 3.32; p = 1: block.) With ``miss_rank = m``
a miss is still accepted when the tree holds the node whose rank path is
(0, ..., 0, m, ...) - the budget decides. :meth:`ScriptedDrafter.expected_accepted_length`
computes the exact expectation for any settings and budget by building the
same tree (the tree depends only on the rank profile, which is fixed):
E = 1 + sum over non-root tree nodes of prod_i P(rank r_i at depth i), with
P(0) = p_top, P(m) = 1 - p_top, zero for other ranks. Past the end of the
known continuation the drafter emits random tokens.

:class:`DFlashDrafter` - block diffusion drafter (architecture and loading)
---------------------------------------------------------------------------
A few non-causal transformer layers over ``[bonus, MASK x (block - 1)]``
sharing the target's ``embed_tokens`` and ``lm_head``; the target's hidden
states from ``target_layers`` (concatenated, projected by ``fc`` to the
hidden size and normed) for the last ``context_window`` committed tokens are
prepended as extra keys/values in every layer. Rotary positions follow the
tokens' absolute positions. Weights load from safetensors (see
:meth:`DFlashDrafter.load`); training is later work.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from workbench.ddtree import build_tree, topk_logprobs
from workbench.decode import DEFAULT


@dataclasses.dataclass
class DraftInput:
    """What a drafter sees for a batch of B requests.

    bonus int64 [B]: the bonus token (root of the tree); positions int64 [B]: its position.
    request_index: the requests' indices in the ``generate`` call; num_generated: tokens
    generated so far per request, the bonus included (so the bonus is output token
    ``num_generated - 1``). context_features: per request the target hidden states
    [C, len(target_layers) * D] of its committed tokens (oldest first) and their positions [C],
    or None when the drafter asks for no target layers.
    """

    bonus: torch.Tensor
    positions: torch.Tensor
    request_index: list[int]
    num_generated: list[int]
    context_features: list[torch.Tensor] | None = None
    context_positions: list[torch.Tensor] | None = None


class Drafter(Protocol):
    block: int
    target_layers: tuple[int, ...]

    def draft(self, inp: DraftInput) -> torch.Tensor:  # [B, block - 1, V]
        ...


class ScriptedDrafter:
    """Emits logits [B, block-1, V] that rank the true continuation as scripted (module docstring).

    continuations: per request (index in the ``generate`` call) the target's greedy output tokens.
    p_top: probability that the correct token is rank 0, one float or one per draft position.
    miss_rank: rank of the correct token on a miss (>= 1), or None (last rank: absent).
    """

    target_layers: tuple[int, ...] = ()

    def __init__(self, continuations: Sequence[Sequence[int]], vocab_size: int, block: int = DEFAULT.block,
                 p_top: float | Sequence[float] = 0.9, miss_rank: int | None = None, gap: float = 4.0,
                 spread: int = 64, seed: int = 0, device: str | torch.device | None = None):
        if block < 2:
            raise ValueError(f"block must be >= 2 (the bonus plus at least one drafted token), got {block}")
        L = block - 1
        p = [float(p_top)] * L if np.isscalar(p_top) else [float(x) for x in p_top]
        if len(p) != L:
            raise ValueError(f"p_top has {len(p)} entries; block {block} drafts {L} positions")
        if any(not 0.0 <= x <= 1.0 for x in p):
            raise ValueError(f"p_top values must lie in [0, 1], got {p}")
        if miss_rank is not None and not 1 <= miss_rank < vocab_size:
            raise ValueError(f"miss_rank must be in 1..{vocab_size - 1} or None, got {miss_rank}")
        if gap <= 0 or spread < 1:
            raise ValueError(f"gap must be > 0 and spread >= 1, got {gap}, {spread}")
        if vocab_size < 2:
            raise ValueError("vocab_size must be >= 2")
        self.continuations = [list(map(int, c)) for c in continuations]
        self.vocab_size, self.block, self.p_top = vocab_size, block, p
        self.miss_rank, self.gap, self.spread, self.seed = miss_rank, gap, spread, seed
        if miss_rank is not None and miss_rank >= min(spread, vocab_size):
            raise ValueError(f"miss_rank {miss_rank} must be below spread={spread} (and the vocabulary size)")
        self.device = torch.device(device or "cpu")
        self.spread = min(spread, vocab_size)
        r = torch.arange(self.spread, dtype=torch.float32)
        self.profile = -gap * r  # logit of ranks 0..spread-1
        # every other token: a floor far below the profile (ordered by token id, never reached by a tree)
        self.floor = -1e4 - torch.arange(vocab_size, dtype=torch.float32) / vocab_size

    def _ranked(self, g: torch.Generator, target: int | None, hit: bool) -> torch.Tensor:
        """Token ids for ranks 0..spread-1 (the target placed as scripted, or left to the floor)."""
        V, S = self.vocab_size, self.spread
        if S * 4 >= V:
            cand = torch.randperm(V, generator=g)
        else:  # draw a few extra ids, keep the first S distinct ones
            cand = torch.randint(0, V, (2 * S + 16,), generator=g)
            _, first = np.unique(cand.numpy(), return_index=True)
            cand = cand[np.sort(first)]
            if cand.numel() < S + 1:
                cand = torch.randperm(V, generator=g)
        if target is None:
            return cand[:S]
        cand = cand[cand != target]
        if not hit and self.miss_rank is None:
            return cand[:S]  # the target stays on the floor: absent from any practical tree
        rank = 0 if hit else self.miss_rank
        return torch.cat([cand[:rank], torch.tensor([target]), cand[rank:S - 1]])

    def script(self, request: int, num_generated: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The draws of one draft: token ids int64 [L, spread + 1] and their logits float32 [L, spread + 1]
        (ranks 0..spread-1, then an absent target at -2e4 or a repeat of rank 0); every other token
        keeps its floor logit. Seeded by (seed, request, num_generated)."""
        L, S = self.block - 1, self.spread
        cont = self.continuations[request] if request < len(self.continuations) else []
        g = torch.Generator().manual_seed(hash((self.seed, request, num_generated)) & 0x7FFFFFFF)
        hits = torch.rand(L, generator=g).tolist()
        ids = torch.empty(L, S + 1, dtype=torch.int64)
        vals = torch.empty(L, S + 1, dtype=torch.float32)
        for i in range(L):
            j = num_generated + i  # output index of the token this position predicts
            target = cont[j] if j < len(cont) else None
            hit = hits[i] < self.p_top[i]
            order = self._ranked(g, target, hit)
            m = order.numel()
            ids[i, :m], vals[i, :m] = order, self.profile[:m]
            ids[i, m:], vals[i, m:] = order[0], self.profile[0]
            if target is not None and not hit and self.miss_rank is None:
                ids[i, S], vals[i, S] = target, -2e4  # absent: below the floor
        return ids, vals

    def draft(self, inp: DraftInput) -> torch.Tensor:
        B, L, V = len(inp.request_index), self.block - 1, self.vocab_size
        out = self.floor.repeat(B, L, 1)
        for b, (ri, ng) in enumerate(zip(inp.request_index, inp.num_generated)):
            ids, vals = self.script(ri, ng)
            out[b].scatter_(1, ids, vals)
        return out.to(self.device)

    def device_program(self, rows: int, max_generated: int, device) -> "ScriptedProgram":
        """This drafter's draws for ``rows`` requests on ``device``, drafted without the host (captured)."""
        return ScriptedProgram(self, rows, max_generated, device)

    def expected_accepted_length(self, budget: int) -> float:
        """Exact E[accepted length] (root counted) for a tree of ``budget`` with this rank profile."""
        L = self.block - 1
        k = min(budget, self.vocab_size)
        prof = torch.cat([self.profile, self.floor[: self.vocab_size - self.spread].sort(descending=True)[0]])
        lp, _ = topk_logprobs(prof.numpy()[None].repeat(L, 0), k)
        tree = build_tree(np.asarray(lp, dtype=np.float32), np.tile(np.arange(k), (L, 1)), budget)
        miss = self.miss_rank if self.miss_rank is not None else -1  # absent: never in the tree
        prob = np.zeros(tree.n)
        prob[0] = 1.0
        total = 1.0
        for i in range(1, tree.n):
            d, r = int(tree.depths[i]) - 1, int(tree.ranks[i])
            q = self.p_top[d] if r == 0 else ((1 - self.p_top[d]) if r == miss else 0.0)
            prob[i] = prob[int(tree.parents[i])] * q
            total += prob[i]
        return float(total)


class ScriptedProgram:
    """A :class:`ScriptedDrafter` on the device: its draws for every row and generated count up to
    ``max_generated`` (``ids`` int64 / ``vals`` float32 [rows, max_generated + 1, L, spread + 1]),
    filled by :meth:`admit` between steps; :meth:`draft` builds the logits with device ops only.

    The device-program protocol the engine step uses (:class:`DFlashProgram` too): ``target_layers``;
    ``admit(row, request, upto, features=None, positions=None)`` between steps; ``draft(num_generated,
    bonus, start)`` (int64 [C] each) -> logits float32 [C, L, V] and ``commit(features, nodes, count,
    positions)`` inside the step, both capturable."""

    target_layers: tuple[int, ...] = ()

    def __init__(self, drafter: ScriptedDrafter, rows: int, max_generated: int, device):
        L, S1 = drafter.block - 1, drafter.spread + 1
        self.drafter, self.G = drafter, max_generated + 1
        self.ids = torch.zeros(rows, self.G, L, S1, dtype=torch.int64, device=device)
        self.vals = torch.zeros(rows, self.G, L, S1, dtype=torch.float32, device=device)
        self.floor = drafter.floor.to(device)
        self.rows = torch.arange(rows, device=device)

    def admit(self, row: int, request: int, upto: int | None = None, features=None, positions=None) -> None:
        """Fill ``row`` with request ``request``'s draws for generated counts 0..upto (default all)."""
        n = self.G if upto is None else min(self.G, upto + 1)
        ids, vals = zip(*(self.drafter.script(request, g) for g in range(n)))
        self.ids[row, :n] = torch.stack(ids).to(self.ids.device)
        self.vals[row, :n] = torch.stack(vals).to(self.vals.device)

    def commit(self, features, nodes, count, positions) -> None:
        """Nothing to keep: the script does not read the target."""

    def draft(self, num_generated: torch.Tensor, bonus=None, start=None) -> torch.Tensor:
        """num_generated int64 [C] (device) -> logits float32 [C, L, V], as :meth:`ScriptedDrafter.draft`."""
        C = num_generated.shape[0]
        g = num_generated.clamp(max=self.G - 1)
        ids, vals = self.ids[self.rows[:C], g], self.vals[self.rows[:C], g]
        out = self.floor.expand(C, ids.shape[1], self.floor.shape[0]).clone()
        return out.scatter_(2, ids, vals)


# ---------------------------------------------------------------------------
# DFlash-style block drafter
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DFlashConfig:
    """Hyper-parameters of :class:`DFlashDrafter` (hidden_size must equal the target's)."""

    hidden_size: int
    num_layers: int = 2
    num_heads: int = 4
    head_dim: int = 32
    intermediate_size: int = 256
    block: int = DEFAULT.block
    target_layers: tuple[int, ...] = (0,)
    mask_token_id: int = 0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    context_window: int = 64

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "DFlashConfig":
        d = json.loads(text)
        d["target_layers"] = tuple(d["target_layers"])
        return cls(**d)


class _Norm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """x [B, S, H, d] rotated (rotate-half form) at positions pos [B, S]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    f = pos.float()[..., None] * inv  # [B, S, d/2]
    cos, sin = f.cos()[:, :, None], f.sin()[:, :, None]
    x1, x2 = x.float()[..., :d // 2], x.float()[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)


class _DFlashLayer(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        hd = c.num_heads * c.head_dim
        self.c = c
        self.input_layernorm = _Norm(c.hidden_size, c.rms_norm_eps)
        self.q_proj = nn.Linear(c.hidden_size, hd, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, hd, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, hd, bias=False)
        self.o_proj = nn.Linear(hd, c.hidden_size, bias=False)
        self.post_attention_layernorm = _Norm(c.hidden_size, c.rms_norm_eps)
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, h, ctx, pos, ctx_pos, ctx_mask):
        c = self.c
        B, S, _ = h.shape
        x = self.input_layernorm(h)
        kv_in = torch.cat([ctx, x], 1)  # context features (already projected) then the block
        kv_pos = torch.cat([ctx_pos, pos], 1)
        q = _rope(self.q_proj(x).view(B, S, c.num_heads, c.head_dim), pos, c.rope_theta)
        k = _rope(self.k_proj(kv_in).view(B, -1, c.num_heads, c.head_dim), kv_pos, c.rope_theta)
        v = self.v_proj(kv_in).view(B, -1, c.num_heads, c.head_dim)
        mask = torch.cat([ctx_mask, torch.ones(B, S, dtype=torch.bool, device=h.device)], 1)  # non-causal
        s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) / math.sqrt(c.head_dim)
        s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
        o = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v.float()).to(h.dtype)
        h = h + self.o_proj(o.reshape(B, S, -1))
        x = self.post_attention_layernorm(h)
        return h + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashDrafter(nn.Module):
    """DFlash-style block drafter sharing the target's embedding and lm_head.

    ``forward(block_tokens [B, block], positions [B, block], context [B, C, n*D],
    context_positions [B, C], context_mask bool [B, C]) -> logits [B, block - 1, V]``
    (the logits of positions 1..block-1). ``draft(DraftInput)`` builds those inputs from the
    bonus tokens and the target features that ``generate`` collects.
    """

    def __init__(self, config: DFlashConfig, target):
        super().__init__()
        tc = target.config
        if config.hidden_size != tc.hidden_size:
            raise ValueError(f"drafter hidden_size {config.hidden_size} must equal the target's {tc.hidden_size}")
        if any(not 0 <= l < tc.num_hidden_layers for l in config.target_layers) or not config.target_layers:
            raise ValueError(f"target_layers {config.target_layers} must be a non-empty subset of "
                             f"0..{tc.num_hidden_layers - 1}")
        if config.block < 2:
            raise ValueError(f"block must be >= 2, got {config.block}")
        if not 0 <= config.mask_token_id < tc.vocab_size:
            raise ValueError(f"mask_token_id {config.mask_token_id} is outside the vocabulary")
        self.config = config
        self.block = config.block
        self.target_layers = tuple(config.target_layers)
        self.fc = nn.Linear(len(config.target_layers) * tc.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = _Norm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(_DFlashLayer(config) for _ in range(config.num_layers))
        self.norm = _Norm(config.hidden_size, config.rms_norm_eps)
        # shared with the target, not owned (kept out of state_dict)
        object.__setattr__(self, "_target", target)
        self.to(device=target.device, dtype=target.dtype)

    def own_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items()}

    def forward(self, block_tokens, positions, context, context_positions, context_mask):
        t = self._target
        h = t.embed_tokens(block_tokens).to(t.dtype)
        ctx = self.hidden_norm(self.fc(context.to(t.dtype)))
        for layer in self.layers:
            h = layer(h, ctx, positions, context_positions, context_mask)
        return t.lm_head(self.norm(h[:, 1:]))

    @torch.no_grad()
    def draft(self, inp: DraftInput) -> torch.Tensor:
        c, dev = self.config, self._target.device
        B = inp.bonus.shape[0]
        if inp.context_features is None:
            raise ValueError("DFlashDrafter needs the target's context features (generate passes them)")
        W = c.context_window
        nfeat = len(c.target_layers) * self.config.hidden_size
        ctx = torch.zeros(B, W, nfeat, dtype=self._target.dtype, device=dev)
        cpos = torch.zeros(B, W, dtype=torch.int64, device=dev)
        cmask = torch.zeros(B, W, dtype=torch.bool, device=dev)
        for b in range(B):
            f, p = inp.context_features[b][-W:], inp.context_positions[b][-W:]
            n = f.shape[0]
            if n:
                ctx[b, W - n:] = f.to(ctx.dtype)
                cpos[b, W - n:] = p
                cmask[b, W - n:] = True
        toks = torch.full((B, c.block), c.mask_token_id, dtype=torch.int64, device=dev)
        toks[:, 0] = inp.bonus.to(dev)
        pos = inp.positions.to(dev)[:, None] + torch.arange(c.block, device=dev)
        return self.forward(toks, pos, ctx, cpos, cmask).float()

    def device_program(self, rows: int, max_generated: int, device) -> "DFlashProgram":
        """This drafter with its context window resident on the device, for ``rows`` requests."""
        return DFlashProgram(self, rows)

    def save(self, path: str | Path) -> Path:
        """Write the drafter's own weights (not the shared embedding/head) to one safetensors file."""
        path = Path(path)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(path),
                  metadata={"dflash_config": self.config.to_json()})
        return path

    @classmethod
    def load(cls, path: str | Path, target) -> "DFlashDrafter":
        """Load from a safetensors file written by :meth:`save` (config in its metadata), or a directory
        holding ``config.json`` (a DFlashConfig) and ``model.safetensors``. Missing, extra or misshapen
        tensors are errors that name the tensor."""
        path = Path(path)
        if path.is_dir():
            cfg = DFlashConfig.from_json((path / "config.json").read_text())
            file = path / "model.safetensors"
        else:
            file = path
            with safe_open(str(file), framework="pt") as sf:
                meta = sf.metadata() or {}
            if "dflash_config" not in meta:
                raise ValueError(f"{file} has no dflash_config metadata; pass a directory with config.json")
            cfg = DFlashConfig.from_json(meta["dflash_config"])
        drafter = cls(cfg, target)
        own = drafter.state_dict()
        seen = set()
        with safe_open(str(file), framework="pt") as sf:
            for k in sf.keys():
                if k not in own:
                    raise ValueError(f"unexpected tensor {k} in {file}")
                t = sf.get_tensor(k)
                if tuple(t.shape) != tuple(own[k].shape):
                    raise ValueError(f"tensor {k} has shape {tuple(t.shape)}, the config implies "
                                     f"{tuple(own[k].shape)}")
                own[k].copy_(t.to(own[k].dtype))
                seen.add(k)
        missing = sorted(set(own) - seen)
        if missing:
            raise ValueError(f"{file} lacks tensors: {', '.join(missing)}")
        return drafter.eval()

    @classmethod
    def random(cls, config: DFlashConfig, target, seed: int = 0, std: float = 0.05) -> "DFlashDrafter":
        """Random weights (norm weights 1) for tests and timing."""
        d = cls(config, target)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for k, p in d.named_parameters():
                if k.endswith("layernorm.weight") or k.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.copy_((torch.randn(p.shape, generator=g) * std).to(p.dtype))
        return d.eval()


class DFlashProgram:
    """A :class:`DFlashDrafter` inside the engine step: per row the last ``context_window`` committed tokens'
    target features (``ctx`` [rows, W, len(target_layers) x D] in the target dtype), their positions
    (``pos`` int64 [rows, W]) and how many are valid (``count`` int64 [rows]), right-aligned, oldest first,
    zeros where empty: exactly what :meth:`DFlashDrafter.draft` builds from the whole history, kept on the
    device and updated by :meth:`commit` with the accepted nodes' features (device ops only)."""

    def __init__(self, drafter: DFlashDrafter, rows: int):
        c, t = drafter.config, drafter._target
        self.drafter, self.target_layers = drafter, tuple(c.target_layers)
        nf = len(c.target_layers) * c.hidden_size
        dev = t.device
        self.ctx = torch.zeros(rows, c.context_window, nf, dtype=t.dtype, device=dev)
        self.pos = torch.zeros(rows, c.context_window, dtype=torch.int64, device=dev)
        self.count = torch.zeros(rows, dtype=torch.int64, device=dev)
        self._cols = torch.arange(max(c.context_window, c.block), device=dev)

    def admit(self, row: int, request: int, upto: int | None = None, features=None, positions=None) -> None:
        """Start ``row`` from the prompt's features [P, nf] and positions [P] (None: an empty window)."""
        W = self.ctx.shape[1]
        self.ctx[row] = 0
        self.pos[row] = 0
        n = 0 if features is None else min(W, features.shape[0])
        if n:
            self.ctx[row, W - n:] = features[-n:].to(self.ctx.dtype)
            self.pos[row, W - n:] = positions[-n:]
        self.count[row] = n

    def draft(self, num_generated, bonus, start) -> torch.Tensor:
        """bonus int64 [C] (the roots), start int64 [C] (their positions) -> logits float32 [C, L, V]."""
        c = self.drafter.config
        C, W = bonus.shape[0], self.ctx.shape[1]
        toks = torch.cat([bonus[:, None], torch.full_like(bonus[:, None], c.mask_token_id).expand(C, c.block - 1)], 1)
        pos = start[:, None] + self._cols[:c.block]
        mask = self._cols[:W] >= W - self.count[:C, None]
        return self.drafter.forward(toks, pos, self.ctx[:C], self.pos[:C], mask).float()

    def commit(self, features, nodes, count, positions) -> None:
        """Shift in the accepted nodes' features: features [C, T, nf], nodes int64 [C, T] (root first, -1
        padded), count int64 [C] (accepted, 0 where nothing is committed), positions int64 [C, T]."""
        C, T, nf = features.shape
        W = self.ctx.shape[1]
        at = nodes.clamp(min=0)
        acc_f = features.gather(1, at[..., None].expand(C, T, nf)).to(self.ctx.dtype)
        idx = self._cols[:W] + count[:, None]
        both = torch.cat([self.ctx[:C], acc_f], 1)
        self.ctx[:C] = both.gather(1, idx[..., None].expand(C, W, nf))
        self.pos[:C] = torch.cat([self.pos[:C], positions.gather(1, at)], 1).gather(1, idx)
        self.count[:C] = (self.count[:C] + count).clamp(max=W)
