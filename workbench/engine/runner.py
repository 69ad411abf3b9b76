"""The model runner: the device side of decoding, one step of a batch bucket at a time, replayed as a CUDA graph.

:class:`ModelRunner` owns everything that lives on the device between steps: the
:class:`~workbench.engine.kv_device.DeviceKVCache` (slot table, lengths and free slots, page_size 1), the rope
tables, per row the last token, the generated count and whether it is live, the drafters' device programs, and per
(bucket, decode config) a :class:`Bucket` of static buffers with its captured graph. One step over a bucket of
``C`` rows (rows without a live request are padding) and ``T`` tokens per row
(:meth:`~workbench.decode.DecodeConfig.verify_width`: 1 for greedy, the tree's nodes for DDTree):

- greedy: allocate one slot per row -> forward -> float32 logits -> argmax -> commit the slot;
- ddtree: the drafter's device program (logits [C, L, V]) -> top-K log-probs -> ``build_trees`` -> allocate T
  slots per row -> forward over all C x T nodes (the model's step attention: one verify-attention call per layer)
  -> argmax per node -> ``accept_greedy_batched`` -> commit (``scattered`` / ``compacted``).

Every shape is fixed by the bucket and nothing reads the device from the host, so on CUDA a bucket's first step
runs eagerly (it compiles and warms the kernels), its second captures the step into a ``torch.cuda.CUDAGraph`` and
every later step replays it. A step ends with ONE device-to-host copy of its packed output, which
:meth:`ModelRunner.step` returns as a typed :class:`StepOutput` read by name. On the CPU (and with
``graphs=False``) the same step runs eagerly: the reference the captured step is tested against.

Between steps the request loop (:class:`workbench.engine.batch.Batch`) calls :meth:`ModelRunner.prefill` (one
ragged forward over prompt pieces), :meth:`ModelRunner.start_row` / :meth:`ModelRunner.stop_row` and the cache's
``admit`` / ``release``.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import numpy as np
import torch

from workbench.ddtree import accept_greedy_batched, build_trees, topk_logprobs
from workbench.decode import MAX_L, DecodeConfig, bucket_for
from workbench.engine.attention import StepAttention
from workbench.engine.kv_device import DeviceKVCache
from workbench.engine.model import Segment
from workbench.engine.request import GREEDY_SAMPLING, MAX_LOGPROBS, SamplingParams
from workbench.engine.sampling import choose, token_logprobs
from workbench.engine.step_ops import step_ops
from workbench.moe.fused import moe_plan

@dataclasses.dataclass(frozen=True)
class StepOutput:
    """One step's results on the host, for the C rows of its bucket (padding rows included), read by name.

    - ``tokens`` int64 [C, W]: the tokens the row committed this step, the first ``accepted[b]`` valid
      (W = 1 greedy, ``block`` DDTree: the accepted path after the root, then the bonus token);
    - ``accepted`` int64 [C]: tokens committed (the accepted length, root counted; 0 for padding and failed rows);
    - ``pool_full`` bool [C]: a live row that could not get its slots (that request alone ends);
    - ``bonus`` int64 [C]: the row's next root (the last committed token);
    - ``top2`` float64 [C, 2]: greedy's two largest float32 logits (NaN for DDTree);
    - ``logprobs`` float64 [C, W], ``top_ids`` int64 [C, W, N], ``top_logprobs`` float64 [C, W, N]: each committed
      token's log-probability and the N = ``MAX_LOGPROBS`` most likely ids at the node that chose it (a step of
      a bucket with logprobs; None otherwise);
    - ``tree_size``: tokens per row in the step's forward (T); ``ms``: host wall time of the step including the
      copy; ``graph``: a captured graph was replayed; ``paths``: what ran (attention, moe, tree_build, step, fuse).
    """

    tokens: np.ndarray
    accepted: np.ndarray
    pool_full: np.ndarray
    bonus: np.ndarray
    top2: np.ndarray
    tree_size: int
    ms: float
    graph: bool
    paths: dict[str, str]
    logprobs: np.ndarray | None = None
    top_ids: np.ndarray | None = None
    top_logprobs: np.ndarray | None = None

    def new_tokens(self, row: int) -> list[int]:
        """The tokens ``row`` committed this step."""
        return [int(t) for t in self.tokens[row, :int(self.accepted[row])]]

    def new_logprobs(self, row: int, n: int) -> tuple[list[float], list[list[tuple[int, float]]]]:
        """The log-probabilities of ``row``'s committed tokens and, per token, its ``n`` top (id, logprob)."""
        a = int(self.accepted[row])
        top = [[(int(i), float(v)) for i, v in zip(self.top_ids[row, j, :n], self.top_logprobs[row, j, :n])]
               for j in range(a)]
        return [float(x) for x in self.logprobs[row, :a]], top


INT_FIELDS = ("tokens", "accepted", "bonus", "top_ids")


def pack_output(columns: dict[str, torch.Tensor]) -> tuple[torch.Tensor, tuple[tuple[str, tuple[int, ...]], ...]]:
    """The step's named device columns (each [C, ...]) as ONE float64 tensor [C, sum of their widths] (token ids
    < 2^53 are exact), so a single device-to-host copy carries them, and its layout (name, per-row shape)."""
    layout = tuple((name, tuple(c.shape[1:])) for name, c in columns.items())
    return torch.cat([c.double().reshape(c.shape[0], -1) for c in columns.values()], 1), layout


def unpack_output(host: np.ndarray, layout) -> dict[str, np.ndarray]:
    """The named columns of a packed step output (:func:`pack_output`), in their dtypes and shapes."""
    out, at = {}, 0
    for name, shape in layout:
        width = int(np.prod(shape)) if shape else 1
        col = host[:, at:at + width].reshape((host.shape[0],) + shape)
        at += width
        out[name] = col.astype(np.int64) if name in INT_FIELDS else (col != 0 if name == "pool_full" else col)
    return out


@dataclasses.dataclass
class PrefillPiece:
    """One request's share of a prefill forward: ``tokens`` (n ids) at positions ``start`` .. ``start + n - 1``,
    written to ``new_slots`` int64 [n], attending to ``done_slots`` int64 [start]; ``next_token``: the prompt's
    token after the piece (None: the piece ends the prompt); ``sampling`` and ``seed`` pick the first generated
    token and say which log-probabilities to return."""

    done_slots: torch.Tensor
    new_slots: torch.Tensor
    tokens: Sequence[int]
    start: int
    next_token: int | None = None
    sampling: SamplingParams = GREEDY_SAMPLING
    seed: int = 0


@dataclasses.dataclass
class PrefillResult:
    """What a prefill forward gives one piece: the token after its last row (``first``: generated token 0 when
    the piece ends the prompt), its captured features ([n, len(layers) x D] or None) and, where asked, the
    log-probabilities of its tokens after the first (``prompt_logprobs``, ``prompt_top``: (id, logprob) pairs) and
    of ``first`` (``first_logprob``, ``first_top``)."""

    first: int
    features: torch.Tensor | None
    prompt_logprobs: list[float] = dataclasses.field(default_factory=list)
    prompt_top: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)
    first_logprob: float | None = None
    first_top: list[tuple[int, float]] | None = None


def dense(logits) -> torch.Tensor:
    """float32 [N, V] logits as one tensor: a model's own, or a tensor-parallel model's vocabulary shards gathered
    (their ``full()``: an all-gather, so a sharded step that samples or returns log-probs pays for it)."""
    return logits.float() if isinstance(logits, torch.Tensor) else logits.full()


def _pairs(ids: torch.Tensor, vals: torch.Tensor) -> list[list[tuple[int, float]]]:
    """Rows of (id, logprob) pairs from int64 [N, n] and float32 [N, n]."""
    return [list(zip(map(int, i), map(float, v))) for i, v in zip(ids.tolist(), vals.tolist())]


@dataclasses.dataclass
class Bucket:
    """Static state of one (bucket, decode config, drafter program, sampling, logprobs) step: C rows of T tokens,
    its attention buffers and, once captured, its graph and output buffer. ``sampled``: rows may sample (the step
    computes :func:`workbench.engine.sampling.choose`; else the argmax alone); ``logprobs``: the step returns each
    committed token's log-probability and top ``MAX_LOGPROBS``."""

    C: int
    T: int
    config: DecodeConfig
    attention: StepAttention
    program: Any
    sampled: bool = False
    logprobs: bool = False
    runs: int = 0
    graph: Any = None
    out: torch.Tensor | None = None
    host: torch.Tensor | None = None
    layout: tuple = ()
    paths: dict[bool, dict[str, str]] = dataclasses.field(default_factory=dict)


class ModelRunner:
    """The device side of greedy and DDTree decoding over a device slot table, each bucket's step captured once.

    model: a :class:`~workbench.engine.model.DeepseekV3`. max_requests: rows of the slot table (rounded up to a
    bucket). capacity: positions per request (prompt + output + the deepest tree; default the rope limit less the
    deepest tree, at most 8192). kv_slots: pool size (default rows x capacity). graphs: capture and replay CUDA
    graphs (default: on CUDA). attention / moe: ``"auto"``, or force ``"kernel"``/``"torch"`` and
    ``"fused"``/``"torch"`` (graphs need the kernels; these set the model's modules' ``impl``). fuse: the torch work
    between the kernels, ``"eager"`` or ``"compile"`` (:func:`workbench.engine.step_ops.step_ops`; CUDA only).
    max_generated: the longest output a DDTree drafter program is prepared for.
    """

    def __init__(self, model, *, max_requests: int = 16, capacity: int | None = None,
                 kv_slots: int | None = None, graphs: bool | None = None, attention: str = "auto",
                 moe: str = "auto", max_generated: int = 1024, fuse: str = "eager"):
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
        self.attention_impl = model.attention_path()
        moe_layers = [l for l in model.layers if l.is_moe]
        probe = torch.zeros(1, dtype=model.dtype, device=dev)
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
        # per row sampling (workbench.engine.sampling): temperature 0 is the argmax
        self.temperature = torch.zeros(self.rows, dtype=torch.float32, device=dev)
        self.top_p = torch.ones(self.rows, dtype=torch.float32, device=dev)
        self.top_k = torch.zeros(self.rows, dtype=torch.int64, device=dev)
        self.seed = torch.zeros(self.rows, dtype=torch.int64, device=dev)
        self._buckets: dict[tuple, Bucket] = {}
        self._programs: dict[int, Any] = {}
        self.captures = 0

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

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

    # -- buckets and drafter programs --------------------------------------------
    def program(self, drafter, block: int):
        """``drafter``'s device program for this runner's rows (made once per drafter)."""
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

    def bucket(self, C: int, config: DecodeConfig, program, sampled: bool = False,
               logprobs: bool = False) -> Bucket:
        """The static state of a step of C rows under ``config`` (made on first use, kept with its graph);
        ``sampled`` / ``logprobs``: the variant whose rows may sample / that returns log-probabilities."""
        key = (C, config.method, config.block, config.budget, config.commit, id(program), sampled, logprobs)
        b = self._buckets.get(key)
        if b is None:
            T = config.verify_width(self.vocab_size)
            b = self._buckets[key] = Bucket(C, T, config, self.model.step_attention(self.cache, C, T), program,
                                            sampled, logprobs)
        return b

    # -- between steps ------------------------------------------------------------
    def start_row(self, row: int, first_token: int, sampling: SamplingParams = GREEDY_SAMPLING,
                  seed: int = 0) -> None:
        """Row ``row`` decodes next from ``first_token`` (its prefill's token) with ``sampling`` and ``seed``, and
        is live."""
        self.last_token[row] = first_token
        self.num_generated[row] = 1
        self.temperature[row] = sampling.temperature
        self.top_p[row] = sampling.top_p
        self.top_k[row] = sampling.top_k
        self.seed[row] = seed
        self.active[row] = True

    def stop_row(self, row: int) -> None:
        """Row ``row`` is padding from the next step on; its KV slots go back to the pool."""
        self.active[row] = False
        self.cache.release(row)

    def fill_synthetic(self, slots: torch.Tensor, seed: int) -> None:
        """Benchmarks: seeded random latent rows (0.5 x N(0, 1)) in ``slots`` int64 [n] of every layer, instead of
        a prefill; one layer at a time (128k rows x 61 layers is 17 GiB in float32)."""
        c = self.cache
        g = torch.Generator(device=c.device).manual_seed(seed)
        for layer in range(c.num_layers):
            rows = torch.randn(len(slots), c.row_width, generator=g, device=c.device)
            c.pool[layer, slots] = (0.5 * rows).to(c.pool.dtype)

    def prefill(self, pieces: Sequence[PrefillPiece], layers=()) -> list[PrefillResult]:
        """One ragged prefill forward over ``pieces``: each piece's new tokens attend to its done rows and to each
        other, their KV rows are written to its new slots. Per piece: the next token after its last row (the
        float32 argmax, or its sample: the request's generated token 0), its captured features of ``layers``
        ([n, len(layers) x D], None without layers) and, where its sampling asks, log-probabilities (one
        device-to-host copy of the tokens for all pieces)."""
        m, dev = self.model, self.model.device
        segs = [Segment(p.done_slots, p.new_slots) for p in pieces]
        toks = torch.cat([torch.tensor(p.tokens, dtype=torch.int64) for p in pieces]).to(dev)
        pos = torch.cat([torch.arange(p.start, p.start + len(p.tokens)) for p in pieces]).to(dev)
        with torch.no_grad():
            logits, cap = m.forward_batch(toks, pos, segs, self.cache, layers)
        lens = [len(p.tokens) for p in pieces]
        offs = np.concatenate([[0], np.cumsum(lens)])
        sp = [p.sampling for p in pieces]
        if any(s.sampled or s.logprobs is not None or s.prompt_logprobs is not None for s in sp):
            logits = dense(logits)
        last = logits[torch.tensor(offs[1:] - 1, device=dev)]
        if any(s.sampled for s in sp):
            first = choose(last, torch.tensor([s.temperature for s in sp], device=dev),
                           torch.tensor([s.top_p for s in sp], device=dev),
                           torch.tensor([s.top_k for s in sp], device=dev), torch.tensor([p.seed for p in pieces],
                                                                                         device=dev),
                           torch.zeros(len(pieces), dtype=torch.int64, device=dev)).tolist()
        else:
            first = last.argmax(-1).tolist()
        allf = torch.cat([cap[l] for l in layers], -1) if layers else None
        out = []
        for i, p in enumerate(pieces):
            r = PrefillResult(first[i], allf[offs[i]:offs[i + 1]] if allf is not None else None)
            if p.sampling.prompt_logprobs is not None:
                nxt = list(p.tokens[1:]) + ([p.next_token] if p.next_token is not None else [])
                rows = logits[offs[i]:offs[i] + len(nxt)]
                lp, ids, vals = token_logprobs(rows, torch.tensor(nxt, dtype=torch.int64, device=dev),
                                               p.sampling.prompt_logprobs)
                r.prompt_logprobs = lp.tolist()
                r.prompt_top = _pairs(ids, vals)
            if p.sampling.logprobs is not None and p.next_token is None:
                lp, ids, vals = token_logprobs(last[i:i + 1], torch.tensor([first[i]], device=dev), p.sampling.logprobs)
                r.first_logprob, r.first_top = float(lp[0]), _pairs(ids, vals)[0]
            out.append(r)
        return out

    # -- the step -------------------------------------------------------------------
    def step(self, b: Bucket) -> StepOutput:
        """One step of bucket ``b`` (eager, capture or replay), its packed output in ONE device-to-host copy
        (into a pinned buffer on CUDA), returned as a :class:`StepOutput`."""
        t0 = time.perf_counter()
        out, graph = self.run(b)
        if b.host is None or b.host.shape != out.shape:
            b.host = torch.empty(out.shape, dtype=torch.float64, pin_memory=out.is_cuda)
        if out.is_cuda:
            b.host.copy_(out, non_blocking=True)
            torch.cuda.current_stream().synchronize()
        else:
            b.host.copy_(out)
        ms = (time.perf_counter() - t0) * 1e3
        if graph not in b.paths:
            b.paths[graph] = self.paths(b.config.method, graph, b.C * b.T)
        return StepOutput(**unpack_output(b.host.numpy(), b.layout), tree_size=b.T, ms=ms, graph=graph,
                          paths=b.paths[graph])

    def run(self, b: Bucket) -> tuple[torch.Tensor, bool]:
        """One step of bucket ``b`` on the device (eager, capture or replay); returns the packed output (device,
        float64, :func:`pack_output`; its layout kept in ``b.layout``) and whether a graph replay ran. No host
        synchronisation."""
        body = self._greedy_body if b.config.method == "greedy" else self._ddtree_body
        with torch.no_grad():
            if not self.graphs or b.runs == 0:
                b.runs += 1
                out, b.layout = pack_output(body(b))
                return out, False
            if b.graph is None:
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    b.out, b.layout = pack_output(body(b))
                b.graph = g
                self.captures += 1
            b.graph.replay()
            b.runs += 1
            return b.out, True

    def _choose(self, b: Bucket, logits: torch.Tensor, rows: int, depths: torch.Tensor | None) -> torch.Tensor:
        """Each node's token: the argmax, or (a sampled bucket) :func:`choose` with its row's parameters; logits
        float32 [C x rows, V] (``rows`` nodes per request), depths int64 [C, rows] (each node's depth below the
        root, None: 0), so that a node picks generated token ``num_generated + depth``. Returns int64 [C x rows].
        A bucket without sampling runs the argmax alone."""
        if not b.sampled:
            return logits.argmax(-1)
        C, logits = b.C, dense(logits)

        def per_node(x: torch.Tensor) -> torch.Tensor:
            return x[:C, None].expand(C, rows).reshape(-1)

        index = per_node(self.num_generated) + (depths.reshape(-1) if depths is not None else 0)
        return choose(logits, per_node(self.temperature), per_node(self.top_p), per_node(self.top_k),
                      per_node(self.seed), index)

    def _logprob_columns(self, b: Bucket, logits: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """A logprobs bucket's extra output: logits float32 [C, W, V] of the node that chose each committed token
        ``tokens`` int64 [C, W] -> their log-probabilities and top ``MAX_LOGPROBS`` (empty for other buckets)."""
        if not b.logprobs:
            return {}
        C, W, V = logits.shape
        lp, ids, vals = token_logprobs(logits.reshape(C * W, V), tokens.reshape(-1), MAX_LOGPROBS)
        return {"logprobs": lp.view(C, W), "top_ids": ids.view(C, W, -1), "top_logprobs": vals.view(C, W, -1)}

    def _greedy_body(self, b: Bucket) -> dict[str, torch.Tensor]:
        C, cache = b.C, self.cache
        act = self.active[:C]
        slots, ok = cache.allocate(act, 1)
        pos = cache.lengths[:C]
        b.attention.prepare(None)
        logits, _ = self.model.forward_step(self.last_token[:C], self.cos[pos], self.sin[pos], slots.view(-1),
                                            cache.pool, b.attention, self.ops)
        nxt = self._choose(b, logits, 1, None)
        top2 = logits.topk(2, dim=-1).values
        cache.commit_append(slots, ok)
        okl = ok.long()
        self.last_token[:C] = torch.where(ok, nxt, self.last_token[:C])
        self.num_generated[:C] += okl
        cols = {"tokens": nxt[:, None], "accepted": okl, "pool_full": act & ~ok, "bonus": nxt, "top2": top2}
        if b.logprobs:
            cols.update(self._logprob_columns(b, dense(logits)[:, None], nxt[:, None]))
        return cols

    def _ddtree_body(self, b: Bucket) -> dict[str, torch.Tensor]:
        C, T, cache, config = b.C, b.T, self.cache, b.config
        L, V = config.depth, self.vocab_size
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
        picks = self._choose(b, logits, T, trees.depths)
        acc = accept_greedy_batched(trees, picks.view(C, T))
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
        cols = {"tokens": new, "accepted": a, "pool_full": act & ~ok, "bonus": acc.bonus, "top2": nan}
        if b.logprobs:  # the node that chose each committed token: the accepted path's nodes, root first
            choosers = acc.nodes[:, :width].clamp(min=0)
            if choosers.shape[1] < width:
                choosers = torch.cat([choosers, choosers.new_zeros(C, width - choosers.shape[1])], 1)
            node_logits = dense(logits).view(C, T, -1).gather(1, choosers[:, :, None].expand(C, width, V))
            cols.update(self._logprob_columns(b, node_logits, new))
        return cols
