"""Self-distillation of a DFlash-style block drafter for a Hugging Face target.

Data (:func:`greedy_continuations`): held-in text chunks are prompts; the target continues each
greedily (batched, KV-cached, argmax in float32), so every token after the prompt is the target's
own greedy choice given what precedes it. For an anchor ``a`` inside that continuation the
drafter's input is ``[x_a, MASK x L]`` at positions ``a .. a + L`` with the target's hidden states
(``capture_layers``) of the ``context_window`` tokens before ``a`` as context, and its labels are
``x_{a+1} .. x_{a+L}`` - exactly what DDTree must predict when ``x_a`` is the bonus token.

Loss (:func:`drafter_loss`): cross-entropy per drafted position, weighted ``exp(-(k - 1) / gamma)``
for position k (DFlash's decay: early positions decide the accepted length), averaged.

:func:`train` runs a time-boxed loop with a tqdm bar, a fixed seed for the batch and anchor draws,
AdamW, and resumable checkpoints (:func:`save_checkpoint`: the drafter's safetensors with its
:class:`DFlashConfig` in the metadata, the optimizer state as safetensors, ``state.json`` with the
step, the loss curve and the data's description).

Data provenance travels with the checkpoint (:func:`training_segments`): ``state["segments"]`` lists,
per call of :func:`train` that trained at least one step, the steps it trained (``first_step`` ..
``last_step``), the description of the data it trained them on (``data``, e.g. sequence count and
generation seconds) and its :class:`TrainConfig`; ``state["data"]`` / ``state["train_config"]`` are
those of the last segment, the run that trained the drafter's last step. A run that resumes a
checkpoint and trains no step adds no segment, so the data it generated is never reported as the
drafter's training data.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from workbench.acceptance.target import HFTarget
from workbench.engine.drafters import DFlashConfig, DFlashDrafter
from workbench.validation import check_float, check_int

__all__ = ["default_target_layers", "greedy_continuations", "drafter_batch", "drafter_loss", "TrainConfig",
           "train", "save_checkpoint", "load_checkpoint", "training_segments"]


def default_target_layers(num_layers: int, count: int = 4) -> tuple[int, ...]:
    """``count`` target layers spread evenly from layer 1 to ``num_layers - 3`` (as DFlash picks them),
    clipped to the model's layers and deduplicated."""
    check_int("num_layers", num_layers, lo=1)
    check_int("count", count, lo=1)
    lo, hi = min(1, num_layers - 1), max(min(1, num_layers - 1), num_layers - 3)
    if count == 1:
        return (hi,)
    return tuple(sorted({round(lo + (hi - lo) * i / (count - 1)) for i in range(count)}))


@torch.no_grad()
def greedy_continuations(target: HFTarget, prompts: torch.Tensor, new_tokens: int, batch: int = 64,
                         seconds: float | None = None, progress: bool = False) -> torch.Tensor:
    """The target's greedy continuations: prompts int64 [N, P] -> sequences int64 [N', P + new_tokens]
    (N' = N, or fewer when ``seconds`` runs out; whole batches only, at least one)."""
    from transformers import DynamicCache
    from tqdm.auto import tqdm

    check_int("new_tokens", new_tokens, lo=1)
    check_int("batch", batch, lo=1)
    out, t0 = [], time.perf_counter()
    dev = target.device
    bar = tqdm(range(0, prompts.shape[0], batch), desc="greedy continuations", disable=not progress)
    for i in bar:
        x = prompts[i:i + batch].to(dev)
        cache = DynamicCache()
        logits = target.model(input_ids=x, **{target._cache_kw: cache}, use_cache=True).logits[:, -1]
        toks = [logits.float().argmax(-1)]
        for _ in range(new_tokens - 1):
            logits = target.model(input_ids=toks[-1][:, None], **{target._cache_kw: cache}, use_cache=True).logits[:, -1]
            toks.append(logits.float().argmax(-1))
        out.append(torch.cat([x, torch.stack(toks, 1)], 1).cpu())
        if seconds is not None and time.perf_counter() - t0 > seconds:
            break
    return torch.cat(out, 0)


def drafter_batch(seqs: torch.Tensor, features: torch.Tensor, anchors: torch.Tensor, config: DFlashConfig):
    """Inputs and labels for anchors: seqs int64 [B, T], features [B, T, nf], anchors int64 [B, A]
    (each in [1, T - block]) -> (block_tokens int64 [B*A, block], positions int64 [B*A, block],
    context [B*A, W, nf], context_positions int64 [B*A, W], context_mask bool [B*A, W],
    labels int64 [B*A, block - 1]); W = config.context_window, right-aligned (oldest first)."""
    B, T = seqs.shape
    A, W, blk = anchors.shape[1], config.context_window, config.block
    if int(anchors.min()) < 1 or int(anchors.max()) > T - blk:
        raise ValueError(f"anchors must lie in [1, {T - blk}] for sequences of {T} tokens and block {blk}")
    dev = seqs.device
    rows = torch.arange(B, device=dev)[:, None, None]
    cidx = anchors[..., None] - W + torch.arange(W, device=dev)          # [B, A, W]
    cmask = cidx >= 0
    cidx = cidx.clamp(min=0)
    ctx = features[rows, cidx]                                           # [B, A, W, nf]
    bidx = anchors[..., None] + torch.arange(blk, device=dev)            # [B, A, blk]
    toks = seqs[rows, bidx]
    labels = toks[..., 1:].reshape(B * A, blk - 1)
    block = torch.full_like(toks, config.mask_token_id)
    block[..., 0] = toks[..., 0]
    return (block.reshape(B * A, blk), bidx.reshape(B * A, blk), ctx.reshape(B * A, W, -1),
            cidx.reshape(B * A, W), cmask.reshape(B * A, W), labels)


def drafter_loss(logits: torch.Tensor, labels: torch.Tensor, gamma: float) -> torch.Tensor:
    """Weighted cross-entropy: logits [R, L, V], labels int64 [R, L]; position k (1-based) weighs
    exp(-(k - 1) / gamma). Returns a float32 scalar."""
    L = logits.shape[1]
    w = torch.exp(-torch.arange(L, device=logits.device, dtype=torch.float32) / gamma)
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
                         reduction="none").reshape(labels.shape)
    return (ce * w).sum(1).mean() / w.sum()


@dataclasses.dataclass
class TrainConfig:
    """Training settings. ``prompt_len``: tokens of each sequence that are real text (anchors start
    after them); ``batch``: sequences per step; ``anchors``: anchors per sequence; ``seconds``:
    the time box (None: only ``max_steps``)."""

    max_steps: int = 100
    seconds: float | None = None
    batch: int = 8
    anchors: int = 4
    lr: float = 1e-3
    warmup: int = 20
    weight_decay: float = 0.01
    gamma: float = 7.0
    prompt_len: int = 32
    seed: int = 0
    checkpoint_every_s: float = 60.0

    def check(self) -> "TrainConfig":
        check_int("max_steps", self.max_steps, lo=1)
        if self.seconds is not None:
            check_float("seconds", self.seconds, lo=0, lo_open=True)
        check_int("batch", self.batch, lo=1)
        check_int("anchors", self.anchors, lo=1)
        check_float("lr", self.lr, lo=0, lo_open=True)
        check_int("warmup", self.warmup, lo=0)
        check_float("gamma", self.gamma, lo=0, lo_open=True)
        check_int("prompt_len", self.prompt_len, lo=1)
        check_int("seed", self.seed, lo=0)
        return self


def _lr_factor(step: int, cfg: TrainConfig, elapsed: float) -> float:
    warm = min(1.0, (step + 1) / max(1, cfg.warmup))
    frac = step / cfg.max_steps
    if cfg.seconds is not None:
        frac = max(frac, elapsed / cfg.seconds)
    return warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))  # cosine to 10%


def save_checkpoint(directory: str | Path, drafter: DFlashDrafter, opt: torch.optim.Optimizer, state: dict) -> Path:
    """``directory``/drafter.safetensors (weights + config), optimizer.safetensors, state.json."""
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    drafter.save(d / "drafter.safetensors.tmp")
    names = {id(p): n for n, p in drafter.named_parameters()}
    ost = {}
    for group in opt.param_groups:
        for p in group["params"]:
            for k, v in opt.state.get(p, {}).items():
                if torch.is_tensor(v):
                    ost[f"{names[id(p)]}::{k}"] = v.detach().float().contiguous().cpu()
    save_file(ost, str(d / "optimizer.safetensors.tmp"))
    (d / "state.json.tmp").write_text(json.dumps(state, indent=1))
    for f in ("drafter.safetensors", "optimizer.safetensors", "state.json"):  # replace together, last
        (d / f"{f}.tmp").replace(d / f)
    return d


def load_checkpoint(directory: str | Path, target: HFTarget, opt_factory=None):
    """(drafter, optimizer or None, state dict) from :func:`save_checkpoint`'s directory."""
    from safetensors import safe_open

    d = Path(directory)
    drafter = DFlashDrafter.load(d / "drafter.safetensors", target).float().train()
    state = json.loads((d / "state.json").read_text())
    opt = None
    if opt_factory is not None:
        opt = opt_factory(drafter)
        params = dict(drafter.named_parameters())
        with safe_open(str(d / "optimizer.safetensors"), framework="pt") as f:
            for key in f.keys():
                name, k = key.split("::")
                p = params[name]
                v = f.get_tensor(key).to(p.device)
                opt.state[p][k] = v if k != "step" else v.cpu()
    return drafter, opt, state


def training_segments(state: dict) -> list[dict]:
    """The checkpoint's training segments (module docstring): ``state["segments"]``, or for a checkpoint written
    before segments were kept one segment over all its steps whose ``data`` is the state's ``data`` - the data of
    the last run that saved it, which trained those steps only if that run trained any (``legacy`` says so)."""
    if "segments" in state:
        return [dict(s) for s in state["segments"]]
    if not state.get("steps"):
        return []
    return [{"first_step": 1, "last_step": state["steps"], "data": state.get("data") or {},
             "train_config": state.get("train_config"),
             "legacy": "checkpoint without segments: data and train_config are those of the last run that saved it"}]


def _with_segment(segments: list[dict], first: int, last: int, data: dict, train_config: dict) -> list[dict]:
    """``segments`` plus this call's segment (steps ``first`` .. ``last``) when it trained any step."""
    if last < first:
        return segments
    return segments + [{"first_step": first, "last_step": last, "data": data, "train_config": train_config}]


def _set_segments(state: dict, segments: list[dict]) -> None:
    state["segments"] = segments
    state["data"] = segments[-1]["data"] if segments else {}
    state["train_config"] = segments[-1]["train_config"] if segments else None


def train(target: HFTarget, config: DFlashConfig, seqs: torch.Tensor, cfg: TrainConfig,
          checkpoint_dir: str | Path | None = None, progress: bool = True, data_info: dict | None = None,
          stop_after: int | None = None):
    """Train a drafter on ``seqs`` int64 [N, T] (prompt_len real tokens + the target's greedy
    continuation). Resumes from ``checkpoint_dir`` when it holds a checkpoint; ``stop_after``: stop
    after that many steps in this call (an interruption: the schedule still runs to ``max_steps``). Returns (drafter in
    eval mode, state dict: steps, seconds, final_loss (mean of the last 20 steps), loss_curve
    [[step, seconds, loss], ...], resumed_from, segments, and data / train_config of the run that trained the
    last step (module docstring; ``data_info`` describes ``seqs`` and is recorded only for steps trained on them))."""
    from tqdm.auto import tqdm

    cfg.check()
    N, T = seqs.shape
    if T - config.block < cfg.prompt_len:
        raise ValueError(f"sequences of {T} tokens leave no anchor after prompt_len {cfg.prompt_len} "
                         f"for block {config.block}")
    if tuple(config.target_layers) != target.capture_layers:
        raise ValueError(f"drafter target_layers {config.target_layers} != the target's capture_layers "
                         f"{target.capture_layers}")
    dev = target.device
    make_opt = lambda d: torch.optim.AdamW(d.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,  # noqa: E731
                                           betas=(0.9, 0.95))
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if ckpt is not None and (ckpt / "state.json").exists():
        drafter, opt, state = load_checkpoint(ckpt, target, make_opt)
        state["resumed_from"] = state["steps"]
    else:
        drafter = DFlashDrafter.random(config, target, seed=cfg.seed, std=0.02).float().train()
        opt = make_opt(drafter)
        state = {"steps": 0, "seconds": 0.0, "loss_curve": [], "resumed_from": None}
    earlier, first = training_segments(state), state["steps"] + 1
    this_data, this_cfg = data_info or {}, dataclasses.asdict(cfg)
    _set_segments(state, earlier)
    g = torch.Generator().manual_seed(cfg.seed)
    for _ in range(state["steps"]):  # replay the draws so a resumed run sees the same batches
        torch.randint(0, N, (cfg.batch,), generator=g)
        torch.randint(cfg.prompt_len, T - config.block + 1, (cfg.batch, cfg.anchors), generator=g)
    use_amp = dev.type == "cuda"
    t0, last_ckpt = time.perf_counter() - state["seconds"], time.perf_counter()
    bar = tqdm(total=cfg.max_steps, initial=state["steps"], desc="drafter training", disable=not progress)
    recent: list[float] = [c[2] for c in state["loss_curve"][-20:]]
    stop = cfg.max_steps if stop_after is None else min(cfg.max_steps, state["steps"] + stop_after)
    while state["steps"] < stop:
        elapsed = time.perf_counter() - t0
        if cfg.seconds is not None and elapsed >= cfg.seconds:
            break
        step = state["steps"]
        rows = torch.randint(0, N, (cfg.batch,), generator=g)
        anchors = torch.randint(cfg.prompt_len, T - config.block + 1, (cfg.batch, cfg.anchors), generator=g)
        x = seqs[rows].to(dev)
        _, feats = target.forward_features(x)
        inputs = drafter_batch(x, feats, anchors.to(dev), config)
        for group in opt.param_groups:
            group["lr"] = cfg.lr * _lr_factor(step, cfg, elapsed)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_amp):
            logits = drafter(*[t.to(torch.float32) if t.is_floating_point() else t for t in inputs[:5]])
        loss = drafter_loss(logits, inputs[5], cfg.gamma)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        lv = loss.item()
        recent = (recent + [lv])[-20:]
        state["steps"] = step + 1
        state["seconds"] = time.perf_counter() - t0
        state["loss_curve"].append([step + 1, round(state["seconds"], 3), lv])
        bar.update(1)
        bar.set_postfix(loss=f"{lv:.3f}")
        _set_segments(state, _with_segment(earlier, first, state["steps"], this_data, this_cfg))
        if ckpt is not None and time.perf_counter() - last_ckpt >= cfg.checkpoint_every_s:
            state["final_loss"] = sum(recent) / len(recent)
            save_checkpoint(ckpt, drafter, opt, state)
            last_ckpt = time.perf_counter()
    bar.close()
    state["final_loss"] = sum(recent) / len(recent) if recent else None
    if ckpt is not None:
        save_checkpoint(ckpt, drafter, opt, state)
    return drafter.eval(), state
