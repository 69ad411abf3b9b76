"""DDTree on a Hugging Face causal language model (transformers): the target adapter.

:class:`HFTarget` wraps a ``transformers`` causal LM (Llama-family; anything whose forward takes
``attention_mask`` as a ready 4D mask, ``position_ids`` and a ``DynamicCache``) and gives DDTree
what it needs from a target:

- :meth:`HFTarget.prefill` - the prompt's forward: KV of every prompt token, the logits of the
  last one, the hidden states of ``capture_layers`` for every token;
- :meth:`HFTarget.verify` - ONE forward over all nodes of a draft tree after the committed
  prefix, with a 4D visibility mask (prefix fully visible, tree: ancestor closure, from
  :meth:`workbench.ddtree.DraftTree.visibility`) and per-node positions ``start + depth``;
  returns float32 logits and the captured hidden states per node;
- :meth:`HFTarget.commit` - keep the KV rows of the accepted nodes (root first), drop the rest.

:func:`ddtree_generate` runs the whole DDTree loop with the workbench's own tree build and
accept references (:func:`workbench.ddtree.build_tree`, :func:`workbench.ddtree.accept_greedy`);
:func:`greedy_generate` is the one-token-per-forward baseline. Lossless: both return the same
tokens (``tests/test_acceptance_target.py`` on tiny random Llamas).

The adapter also exposes what :class:`workbench.engine.drafters.DFlashDrafter` reads from a
target: ``config`` (hidden_size, num_hidden_layers, vocab_size), ``embed_tokens``, ``lm_head``,
``device``, ``dtype``.
"""
from __future__ import annotations

import dataclasses
import inspect
import time
from typing import Sequence

import numpy as np
import torch

from workbench.ddtree import Accepted, DraftTree, accept_greedy, build_tree, topk_logprobs
from workbench.engine.drafters import DraftInput
from workbench.validation import check_int

__all__ = ["HFTarget", "TargetState", "tree_attention_mask", "tiny_llama", "ddtree_generate",
           "greedy_generate", "StepRecord", "Generation"]


def tiny_llama(vocab_size: int = 320, hidden_size: int = 64, layers: int = 2, heads: int = 4,
               kv_heads: int = 2, intermediate: int = 128, seed: int = 0, dtype: torch.dtype = torch.float32,
               max_positions: int = 4096, init_std: float = 0.25):
    """A small randomly initialised ``LlamaForCausalLM`` built locally (no download): the CPU stand-in
    for a real target in tests and the notebook's CPU defaults. Tied embeddings like SmolLM2. ``init_std``
    is larger than transformers' 0.02 so that greedy decoding does not just repeat one token."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=max_positions, tie_word_embeddings=True,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None, initializer_range=init_std)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).to(dtype)
    return model.eval()


def tree_attention_mask(tree: DraftTree, prefix: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """The verify forward's additive mask, float ``dtype`` [1, 1, n, prefix + n]: 0 where node i may
    attend (every prefix token; itself and its ancestors in the tree), the dtype's most negative
    value elsewhere. ``prefix``: committed tokens before the root."""
    vis = torch.from_numpy(tree.visibility())
    full = torch.cat([torch.ones(tree.n, prefix, dtype=torch.bool), vis], 1)
    mask = torch.zeros(full.shape, dtype=dtype)
    mask.masked_fill_(~full, torch.finfo(dtype).min)
    return mask[None, None].to(device)


@dataclasses.dataclass
class TargetState:
    """One request's committed state: ``cache`` (a transformers ``DynamicCache`` holding ``length``
    tokens' KV), ``features`` [length, len(capture_layers) x hidden] (target dtype) of the committed
    tokens, oldest first (None when nothing is captured)."""

    cache: object
    length: int
    features: torch.Tensor | None


class ModelFacts:
    """What a target wrapper of a transformers model (``self.model``, ``self.config``) tells about it: its device,
    dtype and vocabulary size."""

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)


class HFTarget(ModelFacts):
    """A transformers causal LM as a DDTree target (module docstring). ``capture_layers``: decoder
    layers whose output hidden states are captured (forward hooks on ``model.model.layers``)."""

    def __init__(self, model, capture_layers: Sequence[int] = ()):
        inner = getattr(model, "model", None)
        layers = getattr(inner, "layers", None)
        if layers is None:
            raise TypeError(f"{type(model).__name__} has no model.layers: only decoder-only causal LMs "
                            "of the Llama family are supported")
        n = len(layers)
        for l in capture_layers:
            check_int("capture_layers item", l, lo=0, hi=n - 1)
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.config = model.config
        self.capture_layers = tuple(int(l) for l in capture_layers)
        self.embed_tokens = model.get_input_embeddings()
        self.lm_head = model.get_output_embeddings()
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks = [layers[l].register_forward_hook(self._hook(l)) for l in self.capture_layers]
        # transformers >= 5.2x names the KV argument `cache` (past_key_values deprecated); older: past_key_values
        self._cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def _hook(self, layer: int):
        def fn(module, args, out):
            self._captured[layer] = out[0] if isinstance(out, tuple) else out
        return fn

    def _features(self) -> torch.Tensor | None:
        """Captured hidden states of the last forward, [B, T, len(capture_layers) x hidden]."""
        if not self.capture_layers:
            return None
        return torch.cat([self._captured[l] for l in self.capture_layers], -1)

    @torch.no_grad()
    def forward_features(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Plain causal forward over whole sequences (training): input_ids int64 [B, T] ->
        (logits float32 [B, T, V], features [B, T, len(capture_layers) x hidden] or None)."""
        out = self.model(input_ids=input_ids.to(self.device), use_cache=False)
        return out.logits.float(), self._features()

    @torch.no_grad()
    def prefill(self, prompt: Sequence[int] | torch.Tensor) -> tuple[TargetState, torch.Tensor]:
        """Forward over the prompt (int64 [P], P >= 1). Returns the state (KV of all P tokens) and the
        float32 logits [V] of the last prompt token (its argmax is the first bonus token)."""
        from transformers import DynamicCache

        ids = torch.as_tensor(prompt, dtype=torch.int64).reshape(1, -1).to(self.device)
        if ids.shape[1] < 1:
            raise ValueError("prompt must hold at least one token")
        cache = DynamicCache()
        out = self.model(input_ids=ids, **{self._cache_kw: cache}, use_cache=True)
        f = self._features()
        return TargetState(cache, ids.shape[1], None if f is None else f[0]), out.logits[0, -1].float()

    @torch.no_grad()
    def verify(self, state: TargetState, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward over the tree's n nodes after ``state``'s prefix (root = ``tree.tokens[0]`` at
        position ``state.length``). Appends the n nodes' KV to the cache (uncommitted until
        :meth:`commit`). Returns (logits float32 [n, V], features [n, nf] or None)."""
        if int(tree.tokens[0]) < 0:
            raise ValueError("tree root token is unknown (-1): build the tree with root_token=bonus")
        dev = self.device
        ids = torch.from_numpy(tree.tokens).to(dev)[None]
        pos = torch.from_numpy(tree.positions(state.length)).to(dev)[None]
        mask = tree_attention_mask(tree, state.length, self.dtype, dev)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                         **{self._cache_kw: state.cache}, use_cache=True)
        f = self._features()
        return out.logits[0].float(), None if f is None else f[0]

    @torch.no_grad()
    def step(self, state: TargetState, token: int) -> torch.Tensor:
        """Greedy decoding's forward: one token at position ``state.length``, committed at once.
        Returns float32 logits [V]."""
        ids = torch.tensor([[int(token)]], device=self.device)
        out = self.model(input_ids=ids, **{self._cache_kw: state.cache}, use_cache=True)
        state.length += 1
        f = self._features()
        if f is not None:
            state.features = torch.cat([state.features, f[0]], 0)
        return out.logits[0, -1].float()

    def commit(self, state: TargetState, accepted_nodes: Sequence[int] | np.ndarray, n_tree: int,
               tree_features: torch.Tensor | None = None) -> None:
        """Keep the KV (and features) of the accepted nodes (indices into the last verified tree,
        root first) after the prefix; drop the other ``n_tree`` tree rows. Positions stay
        ``start + depth`` = consecutive along the accepted path."""
        nodes = torch.as_tensor(np.asarray(accepted_nodes, dtype=np.int64), device=self.device)
        keep = torch.cat([torch.arange(state.length, device=self.device), state.length + nodes])
        for layer in state.cache.layers:
            if layer.keys.shape[-2] != state.length + n_tree:
                raise RuntimeError(f"cache holds {layer.keys.shape[-2]} rows, expected prefix {state.length} "
                                   f"+ tree {n_tree}: commit must follow exactly one verify")
            layer.keys = layer.keys.index_select(-2, keep)
            layer.values = layer.values.index_select(-2, keep)
        state.length += int(nodes.numel())
        if tree_features is not None:
            state.features = torch.cat([state.features, tree_features.index_select(0, nodes)], 0)


# ---------------------------------------------------------------------------------------------
# generation loops
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class StepRecord:
    """One DDTree round: ``accepted`` (nodes accepted, root included), ``nodes`` (tree size n),
    ``true_tokens`` (the target's tokens at depths 1..accepted: accepted drafts then the bonus),
    ``top_tokens`` (the drafter's rank-0 token per depth, length L), ``path_ranks`` (the ranks of
    the accepted nodes, depth 1..accepted-1)."""

    accepted: int
    nodes: int
    true_tokens: list[int]
    top_tokens: list[int]
    path_ranks: list[int]


@dataclasses.dataclass
class Generation:
    """Output of a generation loop: ``tokens`` (generated, the first bonus included), ``steps``
    (DDTree rounds; empty for greedy), ``forwards`` (target forwards after the prefill),
    ``seconds`` (wall time after the prefill; synchronised on CUDA)."""

    tokens: list[int]
    steps: list[StepRecord]
    forwards: int
    seconds: float


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def greedy_generate(target: HFTarget, prompt: Sequence[int], max_new: int) -> Generation:
    """Greedy decoding, one target forward per token: ``max_new`` tokens after the prompt."""
    check_int("max_new", max_new, lo=1)
    state, logits = target.prefill(prompt)
    _sync(target.device)
    t0 = time.perf_counter()
    tok = int(logits.argmax())
    out = [tok]
    while len(out) < max_new:
        tok = int(target.step(state, tok).argmax())
        out.append(tok)
    _sync(target.device)
    return Generation(out, [], max_new - 1, time.perf_counter() - t0)


def _draft_logits(drafter, target: HFTarget, state: TargetState, bonus: int, generated: int) -> torch.Tensor:
    """The drafter's logits float32 [L, V] for the bonus at position state.length."""
    want = tuple(getattr(drafter, "target_layers", ()))
    feats = pos = None
    if want:
        if want != target.capture_layers:
            raise ValueError(f"drafter wants target layers {want}; the target captures {target.capture_layers}")
        feats = [state.features]
        pos = [torch.arange(state.length, device=target.device)]
    inp = DraftInput(bonus=torch.tensor([bonus], device=target.device),
                     positions=torch.tensor([state.length], device=target.device),
                     request_index=[0], num_generated=[generated],
                     context_features=feats, context_positions=pos)
    return drafter.draft(inp)[0].float()


def ddtree_generate(target: HFTarget, drafter, prompt: Sequence[int], max_new: int, budget: int,
                    depth: int | None = None) -> Generation:
    """DDTree decoding of ``max_new`` tokens after ``prompt`` with ``drafter`` (the
    :class:`workbench.engine.drafters.Drafter` protocol). Each round: drafter logits -> top-K
    log-probs (K = min(budget, V)) -> :func:`workbench.ddtree.build_tree` -> one
    :meth:`HFTarget.verify` -> argmax per node -> :func:`workbench.ddtree.accept_greedy` ->
    :meth:`HFTarget.commit`. ``depth``: use only the first ``depth`` drafted positions (a block of
    ``depth + 1``; default all ``block - 1``). Output equals :func:`greedy_generate`'s."""
    check_int("max_new", max_new, lo=1)
    check_int("budget", budget, lo=1)
    L = drafter.block - 1
    if depth is not None:
        check_int("depth", depth, lo=1, hi=L)
        L = depth
    state, logits = target.prefill(prompt)
    _sync(target.device)
    t0 = time.perf_counter()
    bonus = int(logits.argmax())
    out, steps, forwards = [bonus], [], 0
    k = min(budget, target.vocab_size)
    while len(out) < max_new:
        dl = _draft_logits(drafter, target, state, bonus, len(out))[:L]
        lp, ids = topk_logprobs(dl, k)
        lp = lp.cpu().numpy() if isinstance(lp, torch.Tensor) else lp
        ids = ids.cpu().numpy() if isinstance(ids, torch.Tensor) else ids
        tree = build_tree(lp.astype(np.float32), ids, budget, root_token=bonus)
        vlogits, vfeat = target.verify(state, tree)
        forwards += 1
        am = vlogits.argmax(-1).cpu().numpy()
        acc: Accepted = accept_greedy(tree, am)
        target.commit(state, acc.nodes, tree.n, vfeat)
        new = [int(t) for t in tree.tokens[acc.nodes[1:]]] + [acc.bonus]
        steps.append(StepRecord(acc.length, tree.n, new, [int(t) for t in ids[:, 0]],
                                [int(r) for r in tree.ranks[acc.nodes[1:]]]))
        out.extend(new)
        bonus = acc.bonus
    _sync(target.device)
    return Generation(out[:max_new], steps, forwards, time.perf_counter() - t0)
