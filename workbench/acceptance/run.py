"""The whole drafter pipeline on one target: data, training, measurement - the device run and the notebook's demo.

:func:`run_pipeline` takes a transformers Llama-family model and tokenised prompt sets (:func:`load_prompts`, written
by ``python -m workbench.bench.acceptance --prepare``) and

1. continues the training and validation prompts greedily with :class:`~workbench.acceptance.fastllama.StaticLlama`
   (static KV cache, CUDA graph; time-boxed, tokens/s recorded), cutting each continuation after its first
   end-of-turn token;
2. trains drafters side by side (:func:`~workbench.acceptance.train.train_drafters`): drafter layers initialised
   from target layers and random ones, validation, best checkpoint, early stopping, LR schedule;
3. measures every trained drafter (its weights rounded to bf16, as shipped) on the held-out test prompts of each
   text type: greedy continuations (float32, no TF32), the drafter at every anchor, and replayed decodes
   (:mod:`workbench.acceptance.simulate`) for the chain, the tree at each budget and prompt lookup; then a live
   DDTree loop (:func:`~workbench.acceptance.target.ddtree_generate` on the transformers model) on the first
   ``live_prompts`` prompts of each type at ``live_budget``: lossless against greedy, wall-clock tokens/s beside
   greedy's, and the per-round accepted lengths against the replay's;
4. returns the results document (``acceptance.json``'s ``results``) and the best drafter.

Time: ``deadline`` (seconds from the start) shrinks the training time box so that the measurement still fits
(``measure_reserve`` seconds are kept for it).
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from workbench.acceptance.fastllama import StaticLlama
from workbench.acceptance.simulate import draft_all, prompt_lookup, replay, summarize
from workbench.acceptance.target import HFTarget, ddtree_generate, greedy_generate
from workbench.acceptance.train import SeqData, TrainConfig, default_target_layers, train_drafters
from workbench.engine.drafters import DFlashConfig
from workbench.validation import InvalidParameter, check_int, check_list

__all__ = ["PipelineConfig", "run_pipeline", "save_prompts", "load_prompts", "GOALS", "goal_check"]

# the goals at block 16, budget 32
GOALS = {"mean_accepted": {"math": 4.0, "code": 4.0, "chat": 3.0}, "moonshot": {"math": 6.0, "code": 6.0},
         "first_position_hit": 0.7, "tree_over_chain": 1.3}


@dataclasses.dataclass
class PipelineConfig:
    """Every setting of :func:`run_pipeline` (recorded in the measurement's parameters)."""

    seed: int = 0
    new_tokens: int = 256
    max_prompt: int = 224
    gen_batch: int = 1024
    gen_seconds: float = 150.0
    max_train_prompts: int | None = None
    max_validation_prompts: int | None = None
    train_seconds: float = 220.0
    max_steps: int = 1_000_000
    batch: int = 32
    anchors: int = 16
    lr: float = 6e-4
    warmup: int = 100
    gamma: float = 7.0
    kl_weight: float = 1.0
    eval_every_s: float = 20.0
    val_anchors: int = 2048
    patience: int = 4
    block: int = 16
    drafter_layers: int = 3
    target_layer_count: int = 5
    context_window: int = 128
    mask_token_id: int = 16
    inits: tuple[str, ...] = ("target", "random")
    budgets: tuple[int, ...] = (8, 32, 128, 512)
    top_k: int = 512
    test_prompts: int | None = None
    live_prompts: int = 4
    live_new: int = 128
    live_budget: int = 32
    deadline: float | None = None
    measure_reserve: float = 120.0
    eos_token_id: int | None = 2
    amp: bool = True

    def check(self) -> "PipelineConfig":
        check_int("new_tokens", self.new_tokens, lo=4)
        check_int("block", self.block, lo=2, hi=32)
        check_list("budgets", list(self.budgets), lambda n, v: check_int(n, v, lo=1, hi=1024), "integers in [1, 1024]")
        check_int("top_k", self.top_k, lo=max(self.budgets))
        check_int("live_budget", self.live_budget, lo=1, hi=1024)
        return self


def save_prompts(path: str | Path, sets: dict[str, list[list[int]]], meta: dict) -> Path:
    """Tokenised prompt sets to one safetensors file: per set ``<set>/tokens`` (flat, uint16 when the ids fit) and
    ``<set>/offsets`` int64 [n + 1]; ``meta`` in the metadata."""
    tensors = {}
    for name, rows in sets.items():
        flat = [t for r in rows for t in r]
        hi = max(flat) if flat else 0
        tensors[f"{name}/tokens"] = torch.tensor(flat, dtype=torch.int32).to(torch.uint16 if hi < 65536 else torch.int32)
        tensors[f"{name}/offsets"] = torch.tensor(np.cumsum([0] + [len(r) for r in rows]), dtype=torch.int64)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"meta": json.dumps(meta)})
    return path


def load_prompts(path: str | Path) -> tuple[dict[str, list[list[int]]], dict]:
    """:func:`save_prompts`' file: ({set: [token list]}, meta)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no tokenised prompts there (python -m workbench.bench.acceptance --prepare "
                                "writes them where the tokenizer and the corpus packages are)")
    out = {}
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["meta"])
        names = sorted({k.split("/")[0] for k in f.keys()})
        for n in names:
            flat = f.get_tensor(f"{n}/tokens").to(torch.int64).tolist()
            off = f.get_tensor(f"{n}/offsets").tolist()
            out[n] = [flat[off[i]:off[i + 1]] for i in range(len(off) - 1)]
    return out, meta


def _bf16_round(drafter):
    with torch.no_grad():
        for p in drafter.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))
    return drafter


def _seqdata(target: StaticLlama, prompts, cfg: PipelineConfig, seconds, progress, label: str):
    gens, stats = target.generate(prompts, cfg.new_tokens, batch=min(cfg.gen_batch, max(1, len(prompts))),
                                  max_prompt=cfg.max_prompt, seconds=seconds, progress=progress)
    data = SeqData.from_lists(prompts[:len(gens)], gens, cfg.eos_token_id)
    stats["continuation_tokens_to_eos"] = int((data.lengths - data.prompt_lens).sum())
    stats["prompt_tokens"] = int(data.prompt_lens.sum())
    print(f"{label}: {stats['prompts']} prompts, {stats['tokens']} tokens in {stats['seconds']:.1f} s "
          f"({stats['tokens_per_s']:.0f} tokens/s); {stats['continuation_tokens_to_eos']} up to end of turn",
          flush=True)
    return data, stats


def goal_check(rows: list[dict], best: str, block: int) -> dict:
    """The issue's goals at block 16, budget 32 for the drafter ``best``: per text type the measured value, the
    goal and met / missed by how much."""
    out = {}
    get = lambda t, m, b: next((r for r in rows if (r["text_type"], r["drafter"], r["method"], r["budget"])  # noqa: E731
                                == (t, best if m != "lookup" else None, m, b)), None)
    for t in sorted({r["text_type"] for r in rows}):
        tree = get(t, "tree", 32)
        chain = get(t, "chain", block - 1)
        if tree is None:
            continue
        g = GOALS["mean_accepted"].get(t)
        first = tree["hit_by_sibling_rank"][0][0] if tree.get("hit_by_sibling_rank") else None
        ratio = tree["mean_accepted"] / chain["mean_accepted"] if chain else None
        out[t] = {"mean_accepted": tree["mean_accepted"], "ci95": tree["ci95"], "goal": g,
                  "met": g is not None and tree["mean_accepted"] >= g,
                  "short_by": None if g is None else max(0.0, g - tree["mean_accepted"]),
                  "moonshot": GOALS["moonshot"].get(t),
                  "first_position_hit": first, "first_position_goal": GOALS["first_position_hit"],
                  "first_position_met": first is not None and first >= GOALS["first_position_hit"],
                  "tree_over_chain": ratio, "tree_over_chain_goal": GOALS["tree_over_chain"],
                  "tree_over_chain_met": ratio is not None and ratio >= GOALS["tree_over_chain"]}
    return out


def run_pipeline(model, prompt_sets: dict[str, list[list[int]]], cfg: PipelineConfig, progress: bool = True,
                 checkpoint_dir: str | Path | None = None, data_cache: str | Path | None = None,
                 dflash_kw: dict | None = None, t_start: float | None = None,
                 on_partial=None) -> tuple[dict, object, dict]:
    """The pipeline (module docstring). ``prompt_sets``: "train", "validation", "test_chat", "test_math",
    "test_code" token lists (:func:`load_prompts`). ``dflash_kw``: the drafter's num_heads / head_dim /
    intermediate_size (default the target's, which layer initialisation needs). ``on_partial(results, drafter,
    state, complete)`` is called after training and after each text type is measured (the bench writes its files
    there, so a call stopped mid-measurement keeps what it measured). ``data_cache``: where the generated
    data is kept (reused when it exists, so a second call trains on the same data). Returns (results, the best
    drafter in float32, the best drafter's training state)."""
    cfg.check()
    t_start = time.perf_counter() if t_start is None else t_start
    missing = [k for k in ("train", "validation") if k not in prompt_sets]
    types = [k[5:] for k in prompt_sets if k.startswith("test_")]
    if missing or not types:
        raise InvalidParameter("prompt_sets", sorted(prompt_sets), "train, validation and test_<type> sets")
    dev = next(model.parameters()).device
    mc = model.config
    layers = default_target_layers(mc.num_hidden_layers, cfg.target_layer_count)
    target = StaticLlama(model, capture_layers=layers)
    res: dict = {"target_layers": list(layers)}
    # ---- 1. data
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    train_prompts = prompt_sets["train"][:cfg.max_train_prompts] if cfg.max_train_prompts else prompt_sets["train"]
    cache = Path(data_cache) if data_cache is not None else None
    if cache is not None and cache.exists():
        saved = torch.load(cache)
        data, valid = SeqData(**saved["data"]), SeqData(**saved["valid"])
        res["data"] = dict(saved["stats"], reused_from=str(cache))
        print(f"data: reusing {cache} ({data.tokens.shape[0]} sequences)", flush=True)
    else:
        data, gstats = _seqdata(target, train_prompts, cfg, cfg.gen_seconds, progress, "training data")
        valid, vstats = _seqdata(target, prompt_sets["validation"][:cfg.max_validation_prompts], cfg, None, progress, "validation data")
        if cuda:
            torch.cuda.empty_cache()
        res["data"] = {"train": gstats, "validation": vstats,
                       "train_prompts_available": len(train_prompts), "tf32": cuda}
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"data": dataclasses.asdict(data), "valid": dataclasses.asdict(valid), "stats": res["data"]},
                       cache)
    # ---- 2. training
    kw = dflash_kw or {"num_heads": mc.num_attention_heads,
                       "head_dim": getattr(mc, "head_dim", None) or mc.hidden_size // mc.num_attention_heads,
                       "intermediate_size": mc.intermediate_size}
    theta = float(getattr(mc, "rope_theta", None) or mc.rope_parameters["rope_theta"])
    dcfg = DFlashConfig(hidden_size=mc.hidden_size, num_layers=cfg.drafter_layers, block=cfg.block,
                        target_layers=layers, mask_token_id=cfg.mask_token_id, rope_theta=theta,
                        context_window=cfg.context_window, **kw)
    train_s = cfg.train_seconds
    if cfg.deadline is not None:
        left = cfg.deadline - (time.perf_counter() - t_start) - cfg.measure_reserve
        train_s = max(10.0, min(train_s, left))
    tcfg = TrainConfig(max_steps=cfg.max_steps, seconds=train_s, batch=cfg.batch, anchors=cfg.anchors, lr=cfg.lr,
                       warmup=cfg.warmup, gamma=cfg.gamma, kl_weight=cfg.kl_weight, seed=cfg.seed,
                       eval_every_s=cfg.eval_every_s, val_anchors=cfg.val_anchors, patience=cfg.patience,
                       amp=cfg.amp)
    print(f"training {len(cfg.inits)} drafters for <= {train_s:.0f} s", flush=True)
    trained = train_drafters(target, {f"init_{i}": (dcfg, i) for i in cfg.inits}, data, valid, tcfg,
                             checkpoint_dir=checkpoint_dir, progress=progress,
                             data_info={"sequences": int(data.tokens.shape[0]),
                                        "continuation_tokens": int((data.lengths - data.prompt_lens).sum())})
    res["training"] = {n: st for n, (_, st) in trained.items()}
    res["train_config"] = dataclasses.asdict(tcfg)
    best = min(trained, key=lambda n: trained[n][1]["best"]["loss"])
    res["best_drafter"] = best
    if on_partial is not None:
        on_partial(dict(res, rows=[], rounds={}), trained[best][0], trained[best][1], False)
    # ---- 3. measurement
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    t_meas = time.perf_counter()
    rows, samples, greedy, live = [], {}, {}, {}
    hf = HFTarget(model, capture_layers=layers)
    drafters = {n: _bf16_round(d.float()) for n, (d, _) in trained.items()}
    L = cfg.block - 1
    for t in types:
        prompts = prompt_sets[f"test_{t}"][:cfg.test_prompts] if cfg.test_prompts else prompt_sets[f"test_{t}"]
        gens, gst = target.generate(prompts, cfg.new_tokens, batch=len(prompts), max_prompt=cfg.max_prompt)
        sd = SeqData.from_lists(prompts, gens, cfg.eos_token_id)
        glen = sd.lengths - sd.prompt_lens
        greedy[t] = {"prompts": len(prompts), "new_tokens": cfg.new_tokens, "stats": gst,
                     "tokens_to_eos": glen.tolist()}
        with torch.no_grad():
            _, feats = target.forward(sd.tokens)
        seqs = sd.tokens.to(dev)
        for name, d in drafters.items():
            dr = draft_all(d, feats, seqs, sd.prompt_lens, glen, k=min(cfg.top_k, target.vocab_size))
            for method, budget, k in [("chain", L, 1)] + [("tree", b, None) for b in cfg.budgets]:
                rp = replay(dr, seqs, sd.prompt_lens, glen, budget, k=k)
                row = {"text_type": t, "drafter": name, "method": method, "budget": budget, "block": cfg.block}
                row.update(summarize(rp, seed=cfg.seed))
                rows.append(row)
                if name == best:
                    samples[f"{t}/{method}/{budget}"] = rp["rounds"]
            ranks = dr["true_rank"]
            valid_r = ranks >= 0
            rows[-1 - len(cfg.budgets)]["anchor_top1_by_depth"] = [
                float(((ranks[..., j] == 0) & valid_r[..., j]).sum() / valid_r[..., j].sum().clamp(min=1))
                for j in range(L)]
            del dr
        lk = [prompt_lookup(p, g[:int(n) + 1], L) for p, g, n in zip(prompts, gens, glen.tolist())]
        row = {"text_type": t, "drafter": None, "method": "lookup", "budget": L, "block": cfg.block}
        row.update(summarize({"rounds": lk}, seed=cfg.seed))
        rows.append(row)
        samples[f"{t}/lookup/{L}"] = lk
        # live DDTree on the transformers model: lossless, wall clock, agreement with the replay
        lv = []
        for i, p in enumerate(prompts[:cfg.live_prompts]):
            gr = greedy_generate(hf, p, cfg.live_new)
            dd = ddtree_generate(hf, drafters[best], p, cfg.live_new, cfg.live_budget)
            rep = samples[f"{t}/tree/{cfg.live_budget}"][i] if f"{t}/tree/{cfg.live_budget}" in samples else []
            live_acc = [s.accepted for s in dd.steps]
            m = 0
            while m < min(len(rep), len(live_acc)) and rep[m] == live_acc[m] and sum(live_acc[:m + 1]) < int(glen[i]):
                m += 1
            lv.append({"lossless_vs_hf_greedy": dd.tokens == gr.tokens,
                       "equal_static_greedy": gr.tokens == gens[i][:cfg.live_new],
                       "ddtree_seconds": dd.seconds, "greedy_seconds": gr.seconds,
                       "ddtree_tokens_per_s": (len(dd.tokens) - 1) / dd.seconds if dd.seconds else None,
                       "greedy_tokens_per_s": (len(gr.tokens) - 1) / gr.seconds if gr.seconds else None,
                       "live_mean_accepted": float(np.mean(live_acc)) if live_acc else None,
                       "rounds_agreeing_with_replay": m, "live_rounds": len(live_acc)})
        live[t] = lv
        print(f"{t}: measured ({time.perf_counter() - t_meas:.0f} s)", flush=True)
        if on_partial is not None and t != types[-1]:
            on_partial(dict(res, rows=list(rows), greedy=greedy, live=live, rounds=dict(samples),
                            goals=goal_check(rows, best, cfg.block)), drafters[best], trained[best][1], False)
    res.update(rows=rows, greedy=greedy, live=live, live_settings={"prompts": cfg.live_prompts,
                                                                   "new_tokens": cfg.live_new,
                                                                   "budget": cfg.live_budget},
               goals=goal_check(rows, best, cfg.block), measure_seconds=time.perf_counter() - t_meas,
               total_seconds=time.perf_counter() - t_start, samples_key="results.rounds (per prompt, per round)")
    res["rounds"] = samples
    return res, drafters[best], trained[best][1]
