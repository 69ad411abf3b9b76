"""The decode step as one device program: batched, without host synchronisation, replayed as a CUDA graph.

:class:`DecodeEngine` owns a :class:`~workbench.engine.kv_device.DeviceKVCache`
(slot table, lengths and free slots on the device, page_size 1) and, per row,
the last token and the generated count on the device. One step over a bucket of
``C`` rows (1, 2, 4, 8, 16, ...; rows without a live request are padding) and
``T`` tokens per row (1 for greedy, the tree size ``<= budget + 1`` for DDTree):

- greedy: allocate one slot per row -> forward -> float32 logits -> argmax ->
  commit the slot;
- ddtree: the drafter's device program (logits [C, L, V]) -> top-K log-probs
  -> ``build_trees`` -> allocate T slots per row -> forward over all C x T nodes
  (one ``verify_attention_batched`` call per layer) -> argmax per node ->
  ``accept_greedy_batched`` -> commit (``scattered`` / ``compacted``).

Every shape is fixed by the bucket and nothing reads the device from the host,
so on CUDA the first step of a bucket runs eagerly (it compiles and warms the
kernels), the second captures the step into a ``torch.cuda.CUDAGraph`` and every
later step of that bucket replays it. A step ends with ONE device-to-host copy:
per row the new tokens, their count, a failure flag (the pool had no slots for
the row: that request ends with ``KVPoolFull``, the others continue) and, for
greedy, the two largest logits. On the CPU (and with ``graphs=False``) the same
step runs eagerly: the reference path, equal token for token to
:func:`workbench.engine.generate`.

What ran (attention path, MoE path, tree build, graph or eager) is in each
:class:`~workbench.engine.generate.StepRecord`'s ``paths``.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch

from workbench.decode import DecodeConfig
from workbench.engine.generate import GenerationResult, StepRecord, check_prompts
from workbench.engine.kv_cache import KVPoolFull
from workbench.engine.kv_device import DeviceKVCache, StepAttention
from workbench.engine.model import Segment

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def take_tokens(out: list[int], new, max_new: int, eos: int | None) -> tuple[list[int], str | None]:
    """Append ``new`` to ``out`` up to ``max_new`` tokens and through the first ``eos``; returns the tokens
    kept and why the request ended: ``"stop"`` (``eos``), ``"length"`` (``max_new``) or None (it goes on)."""
    kept: list[int] = []
    for t in new:
        if len(out) >= max_new:
            break
        out.append(int(t))
        kept.append(int(t))
        if eos is not None and int(t) == eos:
            return kept, "stop"
    return kept, "length" if len(out) >= max_new else None


def bucket_for(n: int) -> int:
    """The smallest bucket size that holds ``n`` rows."""
    for b in BUCKETS:
        if n <= b:
            return b
    raise ValueError(f"{n} concurrent requests is not allowed: at most {BUCKETS[-1]}")


@dataclasses.dataclass
class _Bucket:
    """Static state of one (bucket, method) step: its attention buffers and, once captured, its graph."""

    C: int
    T: int
    attention: StepAttention
    program: Any
    runs: int = 0
    graph: Any = None
    out: torch.Tensor | None = None


@dataclasses.dataclass(eq=False)
class _Live:
    index: int
    prompt: list[int]
    out: list[int]
    steps: list[StepRecord]
    prefill_ms: float = 0.0
    error: str | None = None
    done: bool = False


class DecodeEngine:
    """Greedy and DDTree decoding over a device slot table, each bucket's step captured once.

    model: a :class:`~workbench.engine.model.DeepseekV3`. max_requests: rows of the slot table
    (rounded up to a bucket). capacity: committed tokens per request (prompt + output; default
    the rope limit, at most 8192). kv_slots: pool size (default max_requests x capacity).
    graphs: capture and replay CUDA graphs (default: on CUDA). attention / moe: ``"auto"``,
    or force ``"kernel"``/``"torch"`` and ``"fused"``/``"torch"`` (graphs need the kernels; these set
    the model's modules' ``impl``). fuse: the torch work between the kernels, ``"eager"`` or
    ``"compile"`` (:func:`workbench.engine.step_ops.step_ops`; CUDA only).
    max_generated: the longest output a DDTree drafter program is prepared for.
    """

    def __init__(self, model, *, max_requests: int = 16, capacity: int | None = None,
                 kv_slots: int | None = None, graphs: bool | None = None, attention: str = "auto",
                 moe: str = "auto", max_generated: int = 1024, fuse: str = "eager"):
        from workbench.decode import MAX_L
        from workbench.engine.step_ops import step_ops

        self.model = model
        dev = model.device
        self.rows = bucket_for(max_requests)
        limit = model.rotary.max_positions
        self.capacity = min(limit - MAX_L - 1, 8192) if capacity is None else capacity
        if not 1 <= self.capacity <= limit - MAX_L - 1:
            raise ValueError(f"capacity={capacity!r} is not allowed: 1..{limit - MAX_L - 1} (the rope limit "
                             f"{limit} less the deepest tree)")
        self.graphs = dev.type == "cuda" if graphs is None else bool(graphs)
        if fuse == "compile" and dev.type != "cuda":
            raise ValueError("fuse='compile' is for CUDA models; the CPU step runs eager")
        self.ops = step_ops(fuse)
        if self.graphs and dev.type != "cuda":
            raise ValueError("graphs=True needs a model on a CUDA device")
        for layer in model.layers:
            layer.self_attn.impl = attention
            if layer.is_moe:
                layer.mlp.experts.impl = moe
        probe = torch.zeros(1, dtype=model.dtype, device=dev)
        self.attention_impl = model.layers[0].self_attn.attention_path(probe)
        moe_layers = [l for l in model.layers if l.is_moe]
        self.moe_impl = moe_layers[0].mlp.experts.path(probe) if moe_layers else "none"
        if self.graphs and (self.attention_impl != "kernel" or self.moe_impl == "torch"
                            or (moe_layers and not moe_layers[0].mlp.experts.int4)):
            raise ValueError(f"CUDA graphs need the verify-attention kernel and the fused INT4 MoE (attention "
                             f"{self.attention_impl}, moe {self.moe_impl}); pass graphs=False for the eager step")
        self.cache = DeviceKVCache.for_model(model, kv_slots or self.rows * self.capacity, self.rows, self.capacity)
        self.max_generated = max_generated
        cos, sin = model.rotary(torch.arange(self.capacity + MAX_L + 1, device=dev))
        self.cos, self.sin = cos.contiguous(), sin.contiguous()
        self.last_token = torch.zeros(self.rows, dtype=torch.int64, device=dev)
        self.num_generated = torch.zeros(self.rows, dtype=torch.int64, device=dev)
        self.active = torch.zeros(self.rows, dtype=torch.bool, device=dev)
        self._buckets: dict[tuple, _Bucket] = {}
        self._programs: dict[int, Any] = {}
        self.captures = 0

    def drop_graphs(self) -> None:
        """Forget every bucket's buffers and captured graph and every drafter program (their memory goes back
        to the allocator)."""
        self._buckets.clear()
        self._programs.clear()
        if self.model.device.type == "cuda":
            torch.cuda.empty_cache()

    # -- what ran ---------------------------------------------------------------
    def paths(self, method: str, graph: bool, tokens: int | None = None) -> dict[str, str]:
        """What a step of ``tokens`` = C x T tokens runs: attention, MoE (with the fused kernel the MoE
        dispatch picks for that many tokens), tree build, graph or eager, the step_ops mode."""
        moe = self.moe_impl
        if moe == "fused" and tokens:
            from workbench.moe.fused import moe_plan

            c = self.model.config
            layout = next((l.mlp.experts.layout for l in self.model.layers if l.is_moe), None)
            moe = "fused: " + str(moe_plan(tokens, c.num_experts_per_tok, self.model.device, hidden=c.hidden_size,
                                           intermediate=c.moe_intermediate_size, layout=layout)["kernel"])
        tree = "-"
        if method == "ddtree":
            tree = "workbench.ddtree.build_trees (CUDA kernel)" if self.model.device.type == "cuda" else \
                "workbench.ddtree.build_trees (CPU reference)"
        return {"attention": self.attention_impl, "moe": moe, "tree_build": tree,
                "step": "cuda graph replay" if graph else "eager", "fuse": self.ops.mode}

    # -- sessions ----------------------------------------------------------------
    def generate(self, prompts, max_new_tokens: int, config: DecodeConfig | None = None, drafter=None,
                 eos_token_id: int | None = None) -> list[GenerationResult]:
        """Decode ``prompts`` (a list of token-id lists or an int tensor) up to ``max_new_tokens`` each;
        ``config`` defaults to greedy. Same contract as :func:`workbench.engine.generate`."""
        s = self.start(prompts, max_new_tokens, config, drafter, eos_token_id)
        while not s.done:
            s.step()
        return s.results()

    def start(self, prompts, max_new_tokens: int, config: DecodeConfig | None = None, drafter=None,
              eos_token_id: int | None = None, synthetic_prefix: bool = False,
              prefill_chunk: int | None = None) -> "Session":
        """Admit the prompts (prefill) and return a :class:`Session` to step.

        ``synthetic_prefix`` (benchmarks): fill each prompt's KV rows with seeded random values
        instead of running the prefill, and continue from the prompt's last token. ``prefill_chunk``: prefill
        in forwards of at most that many tokens per prompt (each chunk attends to the rows before it), so long
        prompts need activations of one chunk only; None: one ragged forward over the whole prompts.
        """
        return Session(self, prompts, max_new_tokens, config or DecodeConfig(method="greedy"), drafter,
                       eos_token_id, synthetic_prefix, prefill_chunk)

    def _program(self, drafter, block: int):
        if not hasattr(drafter, "device_program"):
            raise ValueError(f"the engine step needs a drafter with a device program (ScriptedDrafter, "
                             f"DFlashDrafter); {type(drafter).__name__} has none: use workbench.engine.generate")
        if getattr(drafter, "block", block) < block:
            raise ValueError(f"block {block} needs {block - 1} drafted positions; the drafter's block is "
                             f"{drafter.block}")
        prog = self._programs.get(id(drafter))
        if prog is None or prog.drafter is not drafter:
            prog = self._programs[id(drafter)] = drafter.device_program(self.rows, self.max_generated,
                                                                        self.model.device)
        return prog

    def _bucket(self, C: int, config: DecodeConfig, program) -> _Bucket:
        T = 1
        if config.method == "ddtree":
            from workbench.ddtree import tree_size

            T = tree_size(config.depth, min(config.budget, self.model.config.vocab_size), config.budget)
        key = (C, config.method, config.block, config.budget, config.commit, id(program))
        b = self._buckets.get(key)
        if b is None:
            impl = "kernel" if self.attention_impl == "kernel" else "torch"
            b = self._buckets[key] = _Bucket(C, T, StepAttention(self.cache, C, T, impl), program)
        return b

    # -- the step body (captured) ------------------------------------------------
    def _greedy_body(self, b: _Bucket) -> torch.Tensor:
        C, cache = b.C, self.cache
        act = self.active[:C]
        slots, ok = cache.allocate(act, 1)
        pos = cache.lengths[:C]
        b.attention.prepare(None)
        logits, _ = self.model.forward_step(self.last_token[:C], self.cos[pos], self.sin[pos], slots.view(-1),
                                            cache.pool, b.attention, self.ops)
        nxt = logits.argmax(-1)
        top2 = logits.topk(2, dim=-1).values
        cache.commit_append(slots, ok)
        okl = ok.long()
        self.last_token[:C] = torch.where(ok, nxt, self.last_token[:C])
        self.num_generated[:C] += okl
        cols = [nxt[:, None], okl[:, None], (act & ~ok)[:, None]]
        return torch.cat([c.double() for c in cols] + [top2.double()], 1)

    def _ddtree_body(self, b: _Bucket, config: DecodeConfig) -> torch.Tensor:
        from workbench.ddtree import accept_greedy_batched, build_trees, topk_logprobs

        C, T, cache = b.C, b.T, self.cache
        L, V = config.depth, self.model.config.vocab_size
        act = self.active[:C]
        start = cache.lengths[:C]
        draft = b.program.draft(self.num_generated[:C], self.last_token[:C], start)[:, :L]
        lp, ids = topk_logprobs(draft, min(config.budget, V))
        if not isinstance(lp, torch.Tensor):
            lp, ids = torch.from_numpy(lp), torch.from_numpy(ids)
        trees = build_trees(lp, ids, config.budget, root_tokens=self.last_token[:C].contiguous())
        slots, ok = cache.allocate(act, T)
        pos = cache.lengths[:C, None] + trees.depths
        b.attention.prepare(trees.parents)
        layers = b.program.target_layers
        logits, cap = self.model.forward_step(trees.tokens.reshape(-1), self.cos[pos.reshape(-1)],
                                              self.sin[pos.reshape(-1)], slots.reshape(-1), cache.pool,
                                              b.attention, self.ops, layers)
        acc = accept_greedy_batched(trees, logits.argmax(-1).view(C, T))
        a = cache.commit_tree(slots, acc, ok, config.commit)
        if layers:
            feats = torch.cat([cap[l] for l in layers], -1).view(C, T, -1)
            b.program.commit(feats, acc.nodes, a, pos)
        width = L + 1
        toks = trees.tokens.gather(1, acc.nodes[:, 1:].clamp(min=0))
        if toks.shape[1] < width:
            toks = torch.cat([toks, toks.new_zeros(C, width - toks.shape[1])], 1)
        new = toks[:, :width].clone()
        new.scatter_(1, (acc.lengths - 1).clamp(min=0)[:, None], acc.bonus[:, None])
        self.last_token[:C] = torch.where(ok, acc.bonus, self.last_token[:C])
        self.num_generated[:C] += a
        nan = torch.full((C, 2), float("nan"), dtype=torch.float64, device=new.device)
        return torch.cat([new.double(), a[:, None].double(), (act & ~ok)[:, None].double(), nan], 1)

    def prefill_pieces(self, pieces, layers=()) -> tuple[list[int], list[torch.Tensor | None]]:
        """One ragged prefill forward over ``pieces``, each ``(done_slots int64 [d], new_slots int64 [n], tokens
        (n ints), first position d)``: the new tokens attend to the done rows and to each other, their KV rows are
        written to ``new_slots``. Returns each piece's greedy next token (float32 argmax at its last row; one
        device-to-host copy for all) and its captured features of ``layers`` ([n, len(layers) x D], None without
        layers). Used by :class:`Session` (whole prompts) and the continuous batch (prompt chunks)."""
        m, dev = self.model, self.model.device
        segs = [Segment(done, new) for done, new, _, _ in pieces]
        toks = torch.cat([torch.tensor(t, dtype=torch.int64) for _, _, t, _ in pieces]).to(dev)
        pos = torch.cat([torch.arange(d, d + len(t)) for _, _, t, d in pieces]).to(dev)
        with torch.no_grad():
            logits, cap = m.forward_batch(toks, pos, segs, self.cache, layers)
        lens = [len(t) for _, _, t, _ in pieces]
        ends = torch.tensor(np.cumsum(lens) - 1, device=dev)
        first = logits[ends].argmax(-1).tolist()
        allf = torch.cat([cap[l] for l in layers], -1) if layers else None
        offs = np.concatenate([[0], np.cumsum(lens)])
        feats = [allf[offs[i]:offs[i + 1]] if allf is not None else None for i in range(len(pieces))]
        return first, feats

    def step_to_host(self, b: _Bucket, config: DecodeConfig, host: torch.Tensor | None
                     ) -> tuple[torch.Tensor, float, bool]:
        """:meth:`run_step`, then its output rows in ONE device-to-host copy into ``host`` (float64 [C, width],
        pinned on CUDA; None or another shape: a new one is made). Returns (host, wall ms, graph replayed?).
        A row: the new tokens, their count, the pool-full flag, greedy's two largest logits."""
        t0 = time.perf_counter()
        out, graph = self.run_step(b, config)
        if host is None or host.shape != out.shape:
            host = torch.empty(out.shape, dtype=torch.float64, pin_memory=out.is_cuda)
        if out.is_cuda:
            host.copy_(out, non_blocking=True)
            torch.cuda.current_stream().synchronize()
        else:
            host.copy_(out)
        return host, (time.perf_counter() - t0) * 1e3, graph

    def run_step(self, b: _Bucket, config: DecodeConfig) -> tuple[torch.Tensor, bool]:
        """One step of bucket ``b`` (eager, capture or replay); returns the output rows (device) and
        whether a graph replay ran."""
        body = (lambda: self._greedy_body(b)) if config.method == "greedy" else \
            (lambda: self._ddtree_body(b, config))
        with torch.no_grad():
            if not self.graphs or b.runs == 0:
                b.runs += 1
                return body(), False
            if b.graph is None:
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    b.out = body()
                b.graph = g
                self.captures += 1
            b.graph.replay()
            b.runs += 1
            return b.out, True


class Session:
    """One :meth:`DecodeEngine.start` call: the live requests, stepped by :meth:`step`."""

    def __init__(self, engine: DecodeEngine, prompts, max_new_tokens: int, config: DecodeConfig, drafter,
                 eos_token_id: int | None, synthetic_prefix: bool, prefill_chunk: int | None = None):
        from workbench.validation import check_int

        self.prefill_chunk = None if prefill_chunk is None else check_int("prefill_chunk", prefill_chunk, lo=1)
        m = engine.model
        self.engine, self.config, self.eos = engine, config, eos_token_id
        check_int("max_new_tokens", max_new_tokens, lo=1, hi=engine.max_generated)
        if config.method == "ddtree" and drafter is None:
            raise ValueError("method 'ddtree' needs a drafter (ScriptedDrafter, ...)")
        self.max_new = max_new_tokens
        prompts = check_prompts(prompts, m.config.vocab_size)
        if len(prompts) > engine.rows:
            raise ValueError(f"{len(prompts)} prompts is not allowed: the engine has {engine.rows} rows")
        longest = max(len(p) for p in prompts) + max_new_tokens + config.block
        if longest > engine.capacity:
            raise ValueError(f"prompt + max_new_tokens + block reaches {longest} tokens, beyond the engine's "
                             f"capacity {engine.capacity} per request")
        self.reqs = [_Live(i, p, [], []) for i, p in enumerate(prompts)]
        self.C = bucket_for(len(prompts))
        self.step_index = 0
        cache = engine.cache
        for row in range(engine.rows):
            cache.release(row)
        program = engine._program(drafter, config.block) if config.method == "ddtree" else None
        self.bucket = engine._bucket(self.C, config, program)
        feats = self._prefill(synthetic_prefix, program.target_layers if program is not None else ())
        if program is not None:
            for r in self.reqs:
                f, p = feats.get(r.index, (None, None))
                program.admit(r.index, r.index, upto=max_new_tokens, features=f, positions=p)
        self._active_host = torch.zeros(engine.rows, dtype=torch.bool)
        for r in self.reqs:
            self._active_host[r.index] = not r.done
        engine.active.copy_(self._active_host)
        self._host: torch.Tensor | None = None   # the step's host rows, made at the first step
        self.top2: list[list[tuple[float, float]]] = [[] for _ in self.reqs]

    @property
    def done(self) -> bool:
        return all(r.done for r in self.reqs)

    def _finish(self, r: _Live, new: list[int]) -> None:
        if take_tokens(r.out, new, self.max_new, self.eos)[1] is not None:
            r.done = True

    def _fail(self, r: _Live, msg: str) -> None:
        r.error, r.done = msg, True
        self.engine.cache.release(r.index)

    def _prefill(self, synthetic: bool, layers=()) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Admit and prefill every prompt in one ragged forward (or, with ``prefill_chunk``, in rounds of one chunk
        of every unfinished prompt); returns each request's features of ``layers`` ([P, len(layers) x D]) and
        positions [P] (none for a synthetic prefix)."""
        e, m = self.engine, self.engine.model
        cache, dev = e.cache, m.device
        t0 = time.perf_counter()
        live = []   # (request, its slots) of the prompts the engine prefills
        for r in self.reqs:
            try:
                slots = cache.admit(r.index, len(r.prompt))
            except KVPoolFull as err:
                self._fail(r, f"KVPoolFull: {err}")
                continue
            if synthetic:
                g = torch.Generator(device=dev).manual_seed(1000 + r.index)
                for layer in range(cache.num_layers):   # one layer at a time: 128k rows x 61 layers is 17 GiB in fp32
                    rows = torch.randn(len(r.prompt), cache.row_width, generator=g, device=dev)
                    cache.pool[layer, slots] = (0.5 * rows).to(cache.pool.dtype)
                first = r.prompt[-1]
                self._finish(r, [first])
                e.last_token[r.index] = first
                e.num_generated[r.index] = 1
                continue
            live.append((r, slots))
        feats: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        longest = max((len(r.prompt) for r, _ in live), default=0)
        chunk = self.prefill_chunk or max(longest, 1)
        parts: dict[int, list[torch.Tensor]] = {r.index: [] for r, _ in live}
        for d in range(0, longest, chunk):
            now = [(r, slots) for r, slots in live if d < len(r.prompt)]
            first, fs = e.prefill_pieces([(slots[:d], slots[d:d + chunk], r.prompt[d:d + chunk], d)
                                          for r, slots in now], layers)
            for (r, _), t, f in zip(now, first, fs):
                if f is not None:
                    parts[r.index].append(f)
                if d + chunk >= len(r.prompt):   # the prompt's last chunk: its next token is the first generated
                    self._finish(r, [t])
                    e.last_token[r.index] = t
                    e.num_generated[r.index] = 1
                    if layers:
                        feats[r.index] = (torch.cat(parts[r.index]), torch.arange(len(r.prompt), device=dev))
        ms = (time.perf_counter() - t0) * 1e3
        for r in self.reqs:
            r.prefill_ms = ms
        return feats

    def step(self) -> dict[str, Any]:
        """Run one step over the bucket; returns {"ms": wall ms, "graph": replayed?, "rows": output rows}."""
        e = self.engine
        if self.done:
            raise ValueError("every request of this session is done")
        self._host, ms, graph = e.step_to_host(self.bucket, self.config, self._host)
        rows = self._host.numpy()
        L1 = self._host.shape[1] - 4
        live = [r for r in self.reqs if not r.done]
        paths = e.paths(self.config.method, graph, self.C * self.bucket.T)
        changed = False
        for r in live:
            row = rows[r.index]
            if row[L1 + 1]:
                self._fail(r, f"KVPoolFull: KV pool full: request {r.index} could not get {self.bucket.T} slots "
                              f"({e.cache.num_slots} slots in the pool, {e.capacity} per request)")
            else:
                n = int(row[L1])
                if self.config.method == "greedy":
                    self.top2[r.index].append((float(row[L1 + 2]), float(row[L1 + 3])))
                self._finish(r, [int(t) for t in row[:n]])
                r.steps.append(StepRecord(self.step_index, n, self.bucket.T, len(live), {"total": ms}, paths))
            if r.done:
                self._active_host[r.index] = False
                changed = True
        if changed:
            e.active.copy_(self._active_host, non_blocking=True)
        self.step_index += 1
        return {"ms": ms, "graph": graph, "rows": rows}

    def results(self) -> list[GenerationResult]:
        return [GenerationResult(r.prompt, r.out, r.steps, r.prefill_ms, r.error) for r in self.reqs]
