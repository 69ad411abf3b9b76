"""The engine sweep: decode rates over contexts, methods and concurrency, measured from one engine.

For each context and method (``greedy``; ``ddtree-high`` / ``ddtree-low``: DDTree with a
:class:`~workbench.engine.drafters.ScriptedDrafter` whose ``p_top`` is :data:`P_TOP`'s, scripted
on the greedy output so acceptance is set, not learned; ``trained:<type>``: DDTree with a ScriptedDrafter
calibrated to the trained drafter (:mod:`workbench.acceptance`) on text type ``<type>``, :func:`acceptance_source`) one
:class:`~workbench.engine.decode_engine.DecodeEngine` measures:

- TTFT (ms): the engine's prefill time of the prompt (one ragged forward: the CPU sweep keeps
  contexts small; a chunked prefill to 128k is engine work left for the H200 session);
- the whole ``generate``-token run: wall time (ms) and accepted length of every step;
- the sustained rate: committed tokens (sum of accepted lengths) / decode wall time (the step loop
  timed from outside, host work between steps included), and the two-point rate from requests of
  ``two_point`` = (A, B) max tokens (each request's time to its last token = prefill + the step loop's
  wall time; the ScriptedDrafter's host-side scripting at admission, which grows with max tokens and
  which a served drafter does not do, is left out; the fastest of ``repeats`` interleaved runs: the
  workload is deterministic, so the minimum is the estimate least disturbed by other work on the machine);
- both checked against mean accepted length / mean step time (:func:`workbench.rates.rate_check`).

:func:`concurrency_sweep` runs C = 1..N requests of one context together: per-request tokens/s
(its committed tokens over the sum of its steps' wall times) and the aggregate (every request's
tokens over the session's decode wall time). Times: ms unless a name ends in ``_s``; rates tokens/s.

Every DDTree row records its ``acceptance``: ``{"source": "scripted", "p_top"}``, or for ``trained:<type>`` the
trained drafter's measured mean accepted length at the sweep's block and budget with the measurement file's
provenance (:class:`workbench.projection.trained.TrainedAcceptance`), the calibrated ``p_top`` and the scripted
drafter's expected accepted length at that ``p_top``. The calibration reproduces the trained drafter's MEAN
accepted length only, not its per-step distribution: the scripted draws hit rank 0 independently with one
``p_top`` at every depth (a geometric-like histogram), where a trained drafter's hit rate falls with depth and
its misses may sit at ranks a wider tree catches; step time against accepted length is what the sweep measures,
and that depends on the mean (and on the tree's shape, which is the budget's, not the drafter's).
"""
from __future__ import annotations

import functools
import statistics
import time
from types import MappingProxyType
from typing import Any, Sequence

import torch

from workbench.config import load_config
from workbench.decode import MAX_L, DecodeConfig
from workbench.engine.decode_engine import DecodeEngine
from workbench.engine.drafters import ScriptedDrafter
from workbench.engine.synthetic import tiny_config
from workbench.measure import prompts_for
from workbench.projection.trained import is_trained, trained_acceptance, trained_choices
from workbench.rates import rate_check, sustained_rate, two_point_rate
from workbench.sweep.endpoint import check_endpoint
from workbench.sweep.phases import captured_step_terms, draft_ms
from workbench.validation import InvalidParameter, check_choice, check_int, check_list, check_two_point

METHODS = ("greedy", "ddtree-high", "ddtree-low")
P_TOP = MappingProxyType({"ddtree-high": 0.9, "ddtree-low": 0.4})  # ScriptedDrafter's p_top per method
MAX_CONCURRENCY = 64  # rows of one engine session the sweep allows (bucket 64)


def method_choices() -> tuple[str, ...]:
    """Every method the sweep takes: :data:`METHODS` (its defaults) and ``trained:<type>`` per text type."""
    return METHODS + trained_choices()


def model_config(synthetic: str, layers: int | None = None):
    """The config of ``synthetic``: ``"tiny"`` (workbench.engine.synthetic.tiny_config) or a shipped
    model name (``kimi-k2.6``) cut to ``layers`` layers."""
    cfg = tiny_config() if synthetic == "tiny" else load_config(synthetic)
    if layers is not None:
        check_int("layers", layers, lo=1, hi=cfg.num_hidden_layers)
        cfg = cfg.replace(num_hidden_layers=layers)
    return cfg


def reserve(block: int, budget: int) -> int:
    """Slots a request needs beyond prompt + generation: one block (the session's rule) and one verify tree
    (budget + 1 nodes allocated before the accept frees the rest)."""
    return block + budget + 1


def context_limit(rope_limit: int, generate: int, block: int, budget: int) -> int:
    """Longest prompt (tokens) an engine can take for ``generate`` new tokens: the rope/YaRN limit less the
    deepest tree (MAX_L + 1, the engine's capacity rule), the generation and :func:`reserve`."""
    return rope_limit - MAX_L - 1 - generate - reserve(block, budget)


def check_sweep(contexts: Sequence[int], concurrency: Sequence[int], generate: int, two_point: Sequence[int],
                methods: Sequence[str], rope_limit: int, block: int = 8, budget: int = 16, kv_slots: int | None = None,
                concurrency_context: int | None = None, acceptance_file=None) -> dict[str, Any]:
    """Check a sweep's inputs against the model's rope/YaRN limit (``rope_limit`` tokens) and the KV pool
    (``kv_slots``, None: the engine sizes it); raises :class:`~workbench.validation.InvalidParameter`
    naming the parameter. A ``trained:<type>`` method must be measured at ``block`` and ``budget`` (in
    ``acceptance_file``, default data/measurements/h200/acceptance.json; FileNotFoundError without one).
    Returns the checked values, ``trained`` holding each trained method's
    :class:`~workbench.projection.trained.TrainedAcceptance`."""
    generate = check_int("generate", generate, lo=2)
    tp = check_two_point("two_point", two_point, hi=generate)
    res = reserve(block, budget)
    hi = context_limit(rope_limit, generate, block, budget)
    if hi < 1:
        raise InvalidParameter("generate", generate, f"an integer that leaves room for a prompt under the rope "
                                                     f"limit {rope_limit} (at most {rope_limit - MAX_L - 2 - res})")
    allowed = f"integers in [1, {hi}] (the rope/YaRN limit {rope_limit} less the deepest tree {MAX_L + 1}, " \
              f"generate {generate} and block + budget + 1 = {res})"
    ctx = check_list("contexts", contexts, lambda n, v: check_int(n, v, lo=1, hi=hi), allowed)
    conc = check_list("concurrency", concurrency, lambda n, v: check_int(n, v, lo=1, hi=MAX_CONCURRENCY),
                      f"integers in [1, {MAX_CONCURRENCY}]")
    meth = check_list("methods", methods, lambda n, v: check_choice(n, v, method_choices()),
                      "entries among " + ", ".join(method_choices()) + " (trained:<type>: a ScriptedDrafter "
                      "calibrated to the trained drafter's measured accepted length at this block and budget)")
    trained = {m: trained_acceptance(m, block, budget, acceptance_file, "methods") for m in meth if is_trained(m)}
    cc = min(ctx) if concurrency_context is None else concurrency_context
    cc = check_int("concurrency_context", cc, lo=1, hi=hi)
    if kv_slots is not None:
        per = generate + res
        if max(ctx) + per > kv_slots:
            raise InvalidParameter("contexts", ctx, f"contexts whose KV (context + {per}) fits the pool of "
                                                    f"{kv_slots} slots: at most {kv_slots - per}")
        if max(conc) * (cc + per) > kv_slots:
            raise InvalidParameter("concurrency", conc, f"concurrencies whose KV (C x (concurrency_context {cc} + "
                                                        f"{per})) fits the pool of {kv_slots} slots: at most "
                                                        f"{kv_slots // (cc + per)}")
    return {"contexts": ctx, "concurrency": conc, "generate": generate, "two_point": tp, "methods": meth,
            "concurrency_context": cc, "trained": trained}


def check_notebook(synthetic: str, layers: int | None, contexts, concurrency, generate: int, two_point,
                   methods, block: int, budget: int, endpoint: str | None = None,
                   served_model: str | None = None) -> None:
    """Notebook 03's input check (notebooks/parameters.yaml ``check``): the same rules as the CLI. With an
    ``endpoint`` (a live server) the URL and ``served_model`` are checked and the contexts against nothing but
    >= 1 (the server enforces its own limit and a refusal is counted as a failure); the engine's limits otherwise."""
    if endpoint is not None:
        check_endpoint(endpoint, served_model)
        generate = check_int("generate", generate, lo=2)
        check_two_point("two_point", two_point, hi=generate)
        check_list("contexts", contexts, lambda n, v: check_int(n, v, lo=1), "integers >= 1")
        check_list("concurrency", concurrency, lambda n, v: check_int(n, v, lo=1, hi=MAX_CONCURRENCY),
                   f"integers in [1, {MAX_CONCURRENCY}]")
        return
    cfg = model_config(synthetic, layers)
    check_sweep(contexts, concurrency, generate, two_point, methods, cfg.yarn_limit, block, budget)


def decode_config(method: str, block: int, budget: int, commit: str = "scattered") -> DecodeConfig:
    return DecodeConfig(method="greedy" if method == "greedy" else "ddtree", block=block, budget=budget,
                        commit=commit)


@functools.lru_cache(maxsize=64)
def calibrated_p_top(target: float, block: int, budget: int, vocab: int) -> float:
    """The constant ``p_top`` at which a :class:`~workbench.engine.drafters.ScriptedDrafter` (block ``block``,
    vocabulary ``vocab``, misses absent from the tree) has ``expected_accepted_length(budget)`` = ``target``
    (root included), by bisection to 1e-12 on that exact expectation (it grows with p_top, from 1 at 0 to the
    longest path of the tree at 1). A target above that longest path is an InvalidParameter, not clipped."""
    def expected(p: float) -> float:
        return ScriptedDrafter([], vocab, block=block, p_top=p).expected_accepted_length(budget)

    if target == 1.0:
        return 0.0
    top = expected(1.0)
    if not 1.0 <= target <= top:
        raise InvalidParameter("mean_accepted", target, f"an accepted length in [1, {top:g}] (what a scripted "
                                                        f"drafter reaches at block {block}, budget {budget})")
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-12:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected(mid) < target else (lo, mid)
    return hi


def acceptance_source(method: str, block: int, budget: int, vocab: int, p_top: float | None = None,
                      trained: Any = None, acceptance_file=None) -> dict[str, Any] | None:
    """What sets a method's acceptance, as recorded in its rows: None for greedy; ``{"source": "scripted",
    "p_top"}`` (``p_top`` given, else :data:`P_TOP`'s); for ``trained:<type>`` the trained drafter's measured mean
    accepted length at ``block`` and ``budget`` with its file's provenance (``trained``: the
    :class:`~workbench.projection.trained.TrainedAcceptance`, looked up in ``acceptance_file`` when None), the
    ``p_top`` that :func:`calibrated_p_top` gives it for this ``vocab`` and the ``expected_accepted`` length at
    that p_top. Mean acceptance only: module docstring."""
    if method == "greedy":
        return None
    if p_top is not None or not is_trained(method):
        return {"source": "scripted", "p_top": float(P_TOP[method] if p_top is None else p_top)}
    t = trained if trained is not None else trained_acceptance(method, block, budget, acceptance_file, "methods")
    profile = t.p_top_profile(block)
    if profile is not None:  # replay the measured per-step histogram: per-depth hit rates
        exp = ScriptedDrafter([], vocab, block=block, p_top=profile).expected_accepted_length(budget)
        return {**t.to_dict(), "p_top": profile, "expected_accepted": exp, "replay": "per-step histogram"}
    p = calibrated_p_top(t.mean_accepted, block, budget, vocab)
    exp = ScriptedDrafter([], vocab, block=block, p_top=p).expected_accepted_length(budget)
    return {**t.to_dict(), "p_top": p, "expected_accepted": exp, "replay": "mean (constant p_top)"}


def drafter_for(method: str, continuations, vocab: int, block: int, seed: int = 0, p_top: float | None = None,
                budget: int | None = None, acceptance: dict[str, Any] | None = None):
    """None for greedy, else a ScriptedDrafter over the greedy ``continuations`` whose ``p_top`` is the one
    given, else ``acceptance["p_top"]`` (:func:`acceptance_source`), else :data:`P_TOP`'s; a ``trained:<type>``
    method without either is calibrated here at ``budget`` (required then)."""
    if method == "greedy":
        return None
    if p_top is None and acceptance is None:
        if is_trained(method) and budget is None:
            raise InvalidParameter("budget", budget, f"the tree budget: {method} is calibrated to the trained "
                                                     "drafter's accepted length measured at a block and budget")
        acceptance = acceptance_source(method, block, budget, vocab)
    p = p_top if p_top is not None else acceptance["p_top"]
    return ScriptedDrafter(continuations, vocab, block=block, p_top=p, seed=seed)


def run_session(engine, prompts, max_new: int, config: DecodeConfig, drafter=None,
                synthetic_prefix: bool = False, prefill_chunk: int | None = None) -> dict[str, Any]:
    """One engine session: {wall_ms (admission to last token), start_ms (admission: prefill and the drafter's
    setup), ttft_ms (the prefill; None with ``synthetic_prefix``: seeded random KV rows, no prefill), decode_ms (the
    step loop),
    step_ms and accepted per step per request, steps_ms (each step's wall), tokens per request, results}.
    ``prefill_chunk``: the real prefill in forwards of that many tokens per prompt (None: one pass)."""
    t0 = time.perf_counter()
    s = engine.start(prompts, max_new, config, drafter, synthetic_prefix=synthetic_prefix,
                     prefill_chunk=None if synthetic_prefix else prefill_chunk)
    t1 = time.perf_counter()
    steps_ms = []
    while not s.done:
        steps_ms.append(s.step().ms)
    t2 = time.perf_counter()
    res = s.results()
    bad = [r.error for r in res if r.error]
    if bad:
        raise RuntimeError(f"the engine failed a request: {bad[0]}")
    return {"wall_ms": (t2 - t0) * 1e3, "start_ms": (t1 - t0) * 1e3, "decode_ms": (t2 - t1) * 1e3,
            "ttft_ms": None if synthetic_prefix else res[0].prefill_ms, "steps_ms": steps_ms,
            "step_ms": [[st.times_ms["total"] for st in r.steps] for r in res],
            "accepted": [[st.accepted_length for st in r.steps] for r in res],
            "tokens": [len(r.tokens) for r in res], "results": res}


def make_engine(model, contexts: Sequence[int], generate: int, block: int, budget: int, max_requests: int = 1,
                **kw):
    """A DecodeEngine sized for the sweep: capacity = longest context + generate + :func:`reserve`."""
    return DecodeEngine(model, max_requests=max_requests, capacity=max(contexts) + generate + reserve(block, budget),
                        max_generated=generate, **kw)


def measure_point(engine, prompt: list[int], method: str, generate: int, two_point: Sequence[int], block: int,
                  budget: int, continuation: list[int] | None = None, repeats: int = 5, seed: int = 0,
                  commit: str = "scattered", p_top: float | None = None, synthetic_prefix: bool = False,
                  full: bool = True, profile_steps: int = 0, trained: Any = None,
                  acceptance_file=None, prefill_chunk: int | None = None) -> dict[str, Any]:
    """One (context, method) point on ``engine``: the long run's per-step record, TTFT, sustained and
    two-point rates, and both rates checked against mean accepted / mean step time (module docstring).
    ``continuation``: the greedy output of ``prompt`` (needed by the DDTree methods); ``p_top`` overrides
    the method's scripted acceptance (1.0: every step accepts the whole depth); ``trained`` / ``acceptance_file``: a
    ``trained:<type>`` method's measurement (:func:`acceptance_source`; recorded as the row's ``acceptance``).
    ``synthetic_prefix``: the prompt's
    KV rows are seeded random values (no prefill: TTFT not measured; the two-point walls are then the step loops');
    else the engine's prefill, in ``prefill_chunk``-token forwards (None: one pass).
    ``full``: the long run is ``generate`` tokens; else the two-point's B (the sustained rate then over B tokens,
    recorded as ``sustained_tokens``). ``profile_steps`` (CUDA): the per-step terms of the captured step
    (:func:`workbench.sweep.phases.captured_step_terms`) over that many steps of a further run."""
    vocab = engine.model.config.vocab_size
    cfg = decode_config(method, block, budget, commit)
    source = acceptance_source(method, block, budget, vocab, p_top, trained, acceptance_file)
    drafter = drafter_for(method, [continuation or []], vocab, block, seed, acceptance=source)
    if drafter is not None:
        p_top = drafter.p_top[0]
    syn = synthetic_prefix
    run_session(engine, [prompt], two_point[0], cfg, drafter, syn, prefill_chunk)  # warm-up (first run of the bucket)
    long = run_session(engine, [prompt], generate if full else two_point[1], cfg, drafter, syn, prefill_chunk)
    acc, ms = long["accepted"][0], long["step_ms"][0]
    committed = sum(acc)
    sustained = sustained_rate(committed, long["decode_ms"] / 1e3)
    walls = {n: [] for n in two_point}
    for _ in range(repeats):  # A and B interleaved, so a slow spell of a shared machine hits both
        for n in two_point:
            r = run_session(engine, [prompt], n, cfg, drafter, syn, prefill_chunk)
            walls[n].append((r["ttft_ms"] or 0.0) + r["decode_ms"])
    walls = {n: min(w) for n, w in walls.items()}
    a, b = two_point
    # t_B <= t_A (a disturbed machine, or A and B too close): no rate, said so in the row (never a clipped one)
    two = two_point_rate(a, b, walls[a] / 1e3, walls[b] / 1e3) if walls[b] > walls[a] else None
    secs = [m / 1e3 for m in ms]
    return {"context": len(prompt), "method": method, "p_top": p_top, "acceptance": source, "block": block,
            "budget": budget, "commit": commit, "ttft_ms": long["ttft_ms"], "generated": long["tokens"][0],
            "committed": committed, "decode_ms": long["decode_ms"],
            "mean_step_ms": statistics.fmean(ms), "mean_accepted": statistics.fmean(acc),
            "sustained": sustained, "two_point": two, "two_point_tokens": [a, b],
            "two_point_wall_ms": [walls[a], walls[b]],
            "check_sustained": rate_check(sustained, acc, secs),
            "check_two_point": rate_check(two, acc, secs) if two is not None else None,
            "sustained_tokens": long["tokens"][0], "_tokens": long["results"][0].tokens,
            "prefill": "synthetic" if syn else f"real ({prefill_chunk or 'one pass'} tokens per forward)",
            "terms": _terms(engine, prompt, cfg, drafter, syn, profile_steps, prefill_chunk) if profile_steps else None,
            "step_ms": ms, "accepted": acc}


def _terms(engine, prompt, cfg, drafter, syn: bool, steps: int, prefill_chunk: int | None = None
           ) -> dict[str, Any] | None:
    """The captured step's per-step terms at this point (CUDA only; None elsewhere)."""
    if engine.model.device.type != "cuda":
        return None
    # enough tokens that the session outlives the profiled steps whatever they accept (a step commits <= block)
    s = engine.start([prompt], (steps + 3) * cfg.block, cfg, drafter, synthetic_prefix=syn,
                     prefill_chunk=None if syn else prefill_chunk)
    s.step()
    s.step()  # eager, then capture: the profiled steps are replays
    d = draft_ms(engine.program(drafter, cfg.block), 1, vocab_k=min(cfg.budget, engine.model.config.vocab_size)) \
        if drafter is not None else 0.0
    return captured_step_terms(s, steps, d)


def context_sweep(model, contexts: Sequence[int], methods: Sequence[str] = METHODS, generate: int = 64,
                  two_point: Sequence[int] = (8, 40), block: int = 8, budget: int = 16, repeats: int = 5,
                  seed: int = 0, engine=None, synthetic_prefix: bool = False,
                  sustained_at: Sequence[int] | None = None, profile_steps: int = 0, acceptance_file=None,
                  real_prefill_upto: int | None = None, prefill_chunk: int | None = None,
                  **engine_kw) -> list[dict[str, Any]]:
    """:func:`measure_point` for every context and method, on one engine (made here unless given).
    ``acceptance_file``: the acceptance measurement the ``trained:<type>`` methods read (default the committed
    H200 one). ``real_prefill_upto``: with ``synthetic_prefix``, the contexts up to this length are prefilled by
    the engine all the same (TTFT recorded there), in ``prefill_chunk``-token forwards.
    ``sustained_at``: the contexts whose long run is ``generate`` tokens (None: all); the others run the
    two-point's B. The DDTree methods' drafter is scripted on greedy's long-run tokens (greedy runs first; without
    greedy among the methods, one greedy run gives them). Returns one row per (context, method)."""
    chk = check_sweep(contexts, [1], generate, two_point, methods, model.rotary.max_positions, block,
                      budget, engine.cache.num_slots if engine is not None else None, acceptance_file=acceptance_file)
    full_at = set(chk["contexts"] if sustained_at is None else sustained_at)
    engine = engine or make_engine(model, chk["contexts"], generate, block, budget, **engine_kw)
    order = sorted(chk["methods"], key=lambda m: m != "greedy")
    rows = []
    for c in chk["contexts"]:
        prompt = prompts_for(c, 1, model.config.vocab_size, seed)[0]
        n = generate if c in full_at else chk["two_point"][1]
        syn = synthetic_prefix and not (real_prefill_upto is not None and c <= real_prefill_upto)
        cont = None
        if "greedy" not in order and order:
            cont = run_session(engine, [prompt], n, decode_config("greedy", block, budget), None,
                               syn, prefill_chunk)["results"][0].tokens
        at = []
        for m in order:
            r = measure_point(engine, prompt, m, generate, chk["two_point"], block, budget, cont, repeats, seed,
                              synthetic_prefix=syn, full=c in full_at, profile_steps=profile_steps,
                              prefill_chunk=prefill_chunk,
                              trained=chk["trained"].get(m))
            toks = r.pop("_tokens")
            if m == "greedy":
                cont = toks
            at.append(r)
        rows += sorted(at, key=lambda r: chk["methods"].index(r["method"]))
    return rows


def concurrency_sweep(model, concurrency: Sequence[int], context: int, methods: Sequence[str] = METHODS,
                      generate: int = 64, block: int = 8, budget: int = 16, seed: int = 0,
                      engine=None, synthetic_prefix: bool = False, acceptance_file=None,
                      **engine_kw) -> list[dict[str, Any]]:
    """C requests of ``context`` tokens decoded together for each C: per-request tokens/s (its committed
    tokens / the sum of its steps' wall times) and aggregate tokens/s (all committed tokens / the session's
    decode wall). One row per (C, method), with its ``acceptance`` (:func:`acceptance_source`)."""
    chk = check_sweep([context], concurrency, generate, [1, generate], methods, model.rotary.max_positions, block,
                      budget, engine.cache.num_slots if engine is not None else None, context, acceptance_file)
    engine = engine or make_engine(model, [context], generate, block, budget, max_requests=max(chk["concurrency"]),
                                   **engine_kw)
    rows = []
    for C in chk["concurrency"]:
        prompts = prompts_for(context, C, model.config.vocab_size, seed)
        greedy_cfg = decode_config("greedy", block, budget)
        conts = [r.tokens for r in run_session(engine, prompts, generate, greedy_cfg, None,
                                               synthetic_prefix)["results"]]
        for m in chk["methods"]:
            cfg = decode_config(m, block, budget)
            source = acceptance_source(m, block, budget, model.config.vocab_size, trained=chk["trained"].get(m))
            drafter = drafter_for(m, conts, model.config.vocab_size, block, seed, acceptance=source)
            run_session(engine, prompts, 3, cfg, drafter, synthetic_prefix)  # warm-up (and capture) of this bucket
            s = run_session(engine, prompts, generate, cfg, drafter, synthetic_prefix)
            per = [sum(a) / (sum(ms) / 1e3) for a, ms in zip(s["accepted"], s["step_ms"])]
            total = sum(sum(a) for a in s["accepted"])
            rows.append({"concurrency": C, "method": m, "p_top": None if source is None else source["p_top"],
                         "acceptance": source, "context": context,
                         "per_request": per, "per_request_mean": statistics.fmean(per),
                         "aggregate": total / (s["decode_ms"] / 1e3), "committed": total,
                         "steps": len(s["steps_ms"]), "mean_step_ms": statistics.fmean(s["steps_ms"]),
                         "mean_accepted": statistics.fmean(x for a in s["accepted"] for x in a)})
    return rows
