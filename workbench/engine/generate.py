"""Greedy and DDTree speculative generation over the paged latent KV cache.

:func:`generate` runs several requests together (concurrency C = number of
prompts): each step is one ragged target forward over every active request.

- ``greedy``: one new token per request per step.
- ``ddtree``: per step, drafter -> top-K log-probs (K = min(budget, vocab))
  -> best-first tree of ``budget`` nodes under the bonus token -> one verify
  forward over all tree nodes (position = start + depth, tree visibility;
  the nodes' latent rows are written to freshly allocated slots) -> greedy
  accept -> commit (``scattered``: keep the accepted nodes' slots;
  ``compacted``: move their rows to the first slots) -> next bonus token.
  Output equals greedy decoding token for token (lossless) for any drafter.

Per step and request a :class:`StepRecord` holds the accepted length (root
counted: tokens committed this step), the tree size (verify width), the batch
and the phase times in ms (draft, tree_build, verify, accept, commit, total):
CUDA events on the GPU, ``time.perf_counter`` on the CPU. The phases use the
references of :mod:`workbench.ddtree` for top-k, tree build and accept, and
its GPU kernels where they exist (verify attention inside the model).
A full KV pool ends only the request that asked for slots (its result gets
``error``); the others continue. ``StepRecord.paths`` says what ran (attention,
MoE, tree build). The captured, batched step is :mod:`workbench.engine.runner`,
driven by the request loop :mod:`workbench.engine.batch`; this module is its
eager reference (over the host-side :class:`~workbench.engine.kv_cache.PagedKVCache`),
which the tests compare the engine against.
"""
from __future__ import annotations

import time
import types
from typing import Sequence

import numpy as np
import torch

from workbench.ddtree import accept_greedy, accept_greedy_batched, build_tree, build_trees, topk_logprobs
from workbench.decode import GREEDY, DecodeConfig
from workbench.engine.drafters import DraftInput
from workbench.engine.kv_cache import PagedKVCache
from workbench.engine.kv_device import KVPoolFull
from workbench.engine.model import Segment
from workbench.engine.request import Request, StepRecord, check_prompts

PHASES = ("draft", "tree_build", "verify", "accept", "commit")


class _Timer:
    """Phase timer: CUDA events on the GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = []

    def _now(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def start(self) -> None:
        self.marks = [("start", self._now())]

    def mark(self, phase: str) -> None:
        self.marks.append((phase, self._now()))

    def finish(self) -> dict[str, float]:
        out = {p: 0.0 for p in PHASES}
        if self.cuda:
            self.marks[-1][1].synchronize()
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            out[name] = out.get(name, 0.0) + (a.elapsed_time(b) if self.cuda else (b - a) * 1e3)
        out["total"] = sum(out[p] for p in out if p != "total")
        return out


def _features(captured: dict[int, torch.Tensor], layers: Sequence[int]) -> torch.Tensor | None:
    if not layers:
        return None
    return torch.cat([captured[l] for l in layers], -1)


def decode_config(config: DecodeConfig | None, **given) -> DecodeConfig:
    """``config`` (default greedy) with the keyword arguments that were given (not None) applied;
    both at once is an error. Validated by :class:`workbench.decode.DecodeConfig`."""
    given = {k: v for k, v in given.items() if v is not None}
    if config is not None and given:
        raise ValueError(f"pass either config= or {', '.join(sorted(given))}, not both")
    return config if config is not None else GREEDY.replace(**given)


@torch.no_grad()
def generate(model, prompts, max_new_tokens: int, method: str | None = None, drafter=None,
             block: int | None = None, budget: int | None = None, *, config: DecodeConfig | None = None,
             cache: PagedKVCache | None = None, kv_slots: int | None = None, commit: str | None = None,
             eos_token_id: int | None = None, keep_cache: bool = False,
             tree_impl: str | None = None) -> list[Request]:
    """Generate up to ``max_new_tokens`` per prompt; returns one :class:`~workbench.engine.request.Request` per prompt.

    prompts: a list of token-id sequences (lists or int tensors) or an int tensor [T] / [B, T].
    config: a :class:`workbench.decode.DecodeConfig` (default greedy; the keyword arguments
    method / block / budget / commit / tree_impl build one instead):
    method ``greedy`` or ``ddtree`` (needs ``drafter``, see :mod:`workbench.engine.drafters`);
    block: drafted positions are ``block - 1``; budget: tree nodes besides the root (verify
    width budget + 1); commit ``scattered`` or ``compacted``; tree_impl ``reference`` (NumPy tree
    build and accept on the host), ``batched`` (workbench.ddtree.build_trees /
    accept_greedy_batched: CUDA kernels on the GPU, their CPU path otherwise) or ``auto``
    (batched on CUDA, else reference).
    cache: a :class:`PagedKVCache` to use (default: a new one of ``kv_slots`` slots, enough for
    every request by default). keep_cache: leave the requests' slots in the cache (request ids
    are the prompt indices) instead of releasing them.
    """
    cfg = model.config
    dc = decode_config(config, method=method, block=block, budget=budget, commit=commit, tree_impl=tree_impl)
    method, block, budget, commit, tree_impl = dc.method, dc.block, dc.budget, dc.commit, dc.tree_impl
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} is not allowed: an integer >= 1")
    if method == "ddtree" and drafter is None:
        raise ValueError("method 'ddtree' needs a drafter (ScriptedDrafter, DFlashDrafter, ...)")
    prompts = check_prompts(prompts, cfg.vocab_size)
    dev = model.device
    tree_impl = _resolve_tree_impl(tree_impl, dev, block, budget) if method == "ddtree" else "reference"
    if cache is None:
        need = sum(dc.worst_case_slots(len(p), max_new_tokens, cfg.vocab_size) + 1 for p in prompts)
        cache = PagedKVCache.for_model(model, kv_slots or need)
    longest = max(len(p) for p in prompts) + max_new_tokens + dc.extra_positions
    if longest > model.rotary.max_positions:
        raise ValueError(f"prompt + max_new_tokens reaches position {longest}, beyond the context limit "
                         f"{model.rotary.max_positions}")
    layers = tuple(getattr(drafter, "target_layers", ()) or ()) if method == "ddtree" else ()
    reqs = [Request(i, p, max_new_tokens, row=i) for i, p in enumerate(prompts)]
    ctx: dict[int, tuple[list, list]] = {r.id: ([], []) for r in reqs}  # the drafter's context: features, positions
    timer = _Timer(dev)

    def fail(r: Request, err: Exception) -> None:
        r.fail(f"{type(err).__name__}: {err}")
        if r.id in cache.requests():
            cache.release(r.id)

    # ---- prefill: every prompt in one ragged forward -------------------------
    timer.start()
    segs, toks, pos, live = [], [], [], []
    for r in reqs:
        cache.add_request(r.id)
        try:
            s = cache.allocate(r.id, len(r.prompt))
        except KVPoolFull as e:
            fail(r, e)
            continue
        segs.append(Segment(cache.slots(r.id), s))
        toks.append(torch.tensor(r.prompt, dtype=torch.int64))
        pos.append(torch.arange(len(r.prompt)))
        live.append(r)
    if live:
        logits, cap = model.forward_batch(torch.cat(toks).to(dev), torch.cat(pos).to(dev), segs, cache, layers)
        ends = torch.tensor(np.cumsum([len(r.prompt) for r in live]) - 1, device=dev)
        first = logits[ends].argmax(-1).tolist()
        feats = _features(cap, layers)
        off = 0
        for r, s, t in zip(live, segs, first):
            cache.append(r.id, s.tail_slots)
            if feats is not None:
                ctx[r.id][0].append(feats[off:off + len(r.prompt)])
                ctx[r.id][1].append(torch.arange(len(r.prompt), device=dev))
            off += len(r.prompt)
            r.emit([t], eos_token_id)
    timer.mark("verify")
    prefill_ms = timer.finish()["total"]
    for r in reqs:
        r.prefill_ms = prefill_ms

    # ---- decode steps ----------------------------------------------------------
    step = 0
    while True:
        active = [r for r in reqs if not r.done]
        if not active:
            break
        timer.start()
        if method == "greedy":
            records = _greedy_step(model, cache, active, timer, fail)
            for r, (tok, rec) in records.items():
                r.emit([tok], eos_token_id)
        else:
            records = _ddtree_step(model, cache, active, ctx, timer, fail, drafter, block, budget, commit, layers,
                                   tree_impl)
            for r, (new, rec) in records.items():
                r.emit(new, eos_token_id)
        times = timer.finish()
        paths = _paths(model, method, tree_impl)
        for r, (_, rec) in records.items():
            rec.step, rec.times_ms, rec.batch, rec.paths = step, times, len(records), paths
            r.steps.append(rec)
        step += 1
    if not keep_cache:
        for r in reqs:
            if r.id in cache.requests():
                cache.release(r.id)
    return reqs


def _paths(model, method: str, tree_impl: str) -> dict[str, str]:
    """What the last forward ran (the modules' ``last_path``) and the tree implementation."""
    moe = next((l.mlp.experts.last_path for l in model.layers if l.is_moe), None)
    return {"attention": str(model.layers[0].self_attn.last_path), "moe": str(moe or "none"),
            "tree_build": tree_impl if method == "ddtree" else "-", "step": "eager (generate)"}


def _resolve_tree_impl(impl: str, dev: torch.device, block: int, budget: int) -> str:
    """``batched`` on CUDA for ``auto`` (DecodeConfig already bounds budget and block by the GPU builder's
    limits), else ``reference``; an explicit choice stands."""
    if impl not in ("auto", "reference", "batched"):
        raise ValueError(f"unknown tree_impl {impl!r}; allowed: auto, reference, batched")
    return "batched" if impl == "batched" or (impl == "auto" and dev.type == "cuda") else "reference"


def _np(x) -> np.ndarray:
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _allocate(cache, active, n_of, fail):
    got = []
    for r in active:
        try:
            got.append((r, cache.allocate(r.id, n_of(r))))
        except KVPoolFull as e:
            fail(r, e)
    return got


def _greedy_step(model, cache, active, timer, fail):
    dev = model.device
    timer.mark("draft")
    got = _allocate(cache, active, lambda r: 1, fail)
    if not got:
        return {}
    segs = [Segment(cache.slots(r.id), s) for r, s in got]
    toks = torch.tensor([r.tokens[-1] for r, _ in got], device=dev)
    pos = torch.tensor([cache.length(r.id) for r, _ in got], device=dev)
    logits, _ = model.forward_batch(toks, pos, segs, cache)
    timer.mark("verify")
    nxt = logits.argmax(-1).tolist()
    timer.mark("accept")
    for r, s in got:
        cache.append(r.id, s)
    timer.mark("commit")
    return {r: (t, StepRecord(0, 1, 1, 0, {})) for (r, _), t in zip(got, nxt)}


def _ddtree_step(model, cache, active, ctx, timer, fail, drafter, block, budget, commit, layers, tree_impl):
    dev = model.device
    L = block - 1
    V = model.config.vocab_size
    inp_feats = None
    if layers:
        inp_feats = [torch.cat(ctx[r.id][0]) for r in active]
        inp_pos = [torch.cat(ctx[r.id][1]) for r in active]
    inp = DraftInput(bonus=torch.tensor([r.tokens[-1] for r in active], device=dev),
                     positions=torch.tensor([cache.length(r.id) for r in active], device=dev),
                     request_index=[r.id for r in active], num_generated=[len(r.tokens) for r in active],
                     context_features=inp_feats, context_positions=inp_pos if layers else None)
    logits = drafter.draft(inp)
    if logits.dim() != 3 or logits.shape[0] != len(active) or logits.shape[2] != V:
        raise ValueError(f"drafter returned logits of shape {tuple(logits.shape)}; expected "
                         f"[{len(active)}, >= {L}, {V}]")
    if logits.shape[1] < L:
        raise ValueError(f"block {block} needs {L} drafted positions, the drafter produced {logits.shape[1]}")
    logits = logits[:, :L]
    timer.mark("draft")
    k = min(budget, V)
    lp, ids = topk_logprobs(logits.float(), k)
    if tree_impl == "batched":
        lp, ids = torch.as_tensor(lp, device=dev), torch.as_tensor(ids, device=dev)
        return _ddtree_batched_tail(model, cache, active, ctx, timer, fail, lp, ids, budget, commit, layers)
    lp, ids = _np(lp), _np(ids)
    trees = {r.id: build_tree(lp[b], ids[b], budget, root_token=r.tokens[-1]) for b, r in enumerate(active)}
    timer.mark("tree_build")
    got = _allocate(cache, active, lambda r: trees[r.id].n, fail)
    if not got:
        return {}
    segs, toks, pos = [], [], []
    for r, s in got:
        tr = trees[r.id]
        start = cache.length(r.id)
        segs.append(Segment(cache.slots(r.id), s, torch.as_tensor(tr.parents, device=dev)))
        toks.append(torch.as_tensor(tr.tokens))
        pos.append(torch.as_tensor(tr.depths) + start)
    logits, cap = model.forward_batch(torch.cat(toks).to(dev), torch.cat(pos).to(dev), segs, cache, layers)
    timer.mark("verify")
    am = logits.argmax(-1).cpu().numpy()
    accs, off = [], 0
    for r, s in got:
        n = trees[r.id].n
        accs.append(accept_greedy(trees[r.id], am[off:off + n]))
        off += n
    timer.mark("accept")
    feats = _features(cap, layers)
    out, off = {}, 0
    for (r, s), acc, p in zip(got, accs, pos):
        tr = trees[r.id]
        cache.commit(r.id, s, acc.nodes, mode=commit)
        if feats is not None:
            nodes = torch.as_tensor(acc.nodes, device=dev)
            ctx[r.id][0].append(feats[off:off + tr.n][nodes])
            ctx[r.id][1].append(p.to(dev)[nodes])
        off += tr.n
        new = [int(t) for t in tr.tokens[acc.nodes[1:]]] + [int(acc.bonus)]
        out[r] = (new, StepRecord(0, int(acc.length), int(tr.n), 0, {}))
    timer.mark("commit")
    return out


def _ddtree_batched_tail(model, cache, active, ctx, timer, fail, lp, ids, budget, commit, layers):
    """Tree build and accept with workbench.ddtree's batched API: its CUDA kernels on the GPU (one host
    copy, at accept), its CPU path otherwise."""
    dev = model.device
    roots = torch.tensor([r.tokens[-1] for r in active], dtype=torch.int64, device=dev)
    gt = build_trees(lp.float().contiguous(), ids.to(torch.int64).contiguous(), budget, root_tokens=roots)
    timer.mark("tree_build")
    n = gt.n
    row = {r.id: b for b, r in enumerate(active)}
    got = _allocate(cache, active, lambda r: n, fail)
    if not got:
        return {}
    rows = torch.tensor([row[r.id] for r, _ in got], device=dev)
    tokens, parents, depths = gt.tokens[rows], gt.parents[rows], gt.depths[rows]
    starts = torch.tensor([cache.length(r.id) for r, _ in got], device=dev)
    segs = [Segment(cache.slots(r.id), s, parents[j]) for j, (r, s) in enumerate(got)]
    pos = depths + starts[:, None]
    logits, cap = model.forward_batch(tokens.reshape(-1), pos.reshape(-1), segs, cache, layers)
    timer.mark("verify")
    am = logits.argmax(-1).view(len(got), n)
    acc = accept_greedy_batched(types.SimpleNamespace(tokens=tokens, parents=parents), am)
    nodes, lengths, bonus = acc.nodes.cpu(), acc.lengths.tolist(), acc.bonus.tolist()
    tok_host = tokens.cpu()
    timer.mark("accept")
    feats = _features(cap, layers)
    out = {}
    for j, (r, s) in enumerate(got):
        a = lengths[j]
        nd = nodes[j, :a]
        cache.commit(r.id, s, nd.to(dev), mode=commit)
        if feats is not None:
            ndd = nd.to(dev)
            ctx[r.id][0].append(feats[j * n:(j + 1) * n][ndd])
            ctx[r.id][1].append(pos[j][ndd])
        new = tok_host[j, nd[1:]].tolist() + [int(bonus[j])]
        out[r] = (new, StepRecord(0, int(a), int(n), 0, {}))
    timer.mark("commit")
    return out
