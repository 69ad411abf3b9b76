"""Training a DFlash-style block drafter on the target's own greedy continuations, with validation.

Data (:class:`SeqData`): each row is a prompt in the chat template followed by the target's greedy continuation,
right-padded; ``lengths`` counts the valid tokens (up to and including the first end-of-turn), ``prompt_lens`` the
prompt's. An anchor ``a`` lies in the continuation (``prompt_len <= a <= length - 2``): the drafter's input is
``[x_a, MASK x L]`` at positions ``a .. a + L`` with the target's hidden states (``target_layers``, several spread
over the depth) of the ``context_window`` tokens before ``a`` as context, and its labels are ``x_{a+1} .. x_{a+L}``
(positions past the valid length are ignored) - what DDTree must predict when ``x_a`` is the bonus token.

Loss (:func:`drafter_loss`): per drafted position k, hard-label cross-entropy plus ``kl_weight`` x KL(target's
softmax at ``a + k - 1`` || drafter), weighted ``exp(-(k - 1) / gamma)`` (DFlash's decay: early positions decide
the accepted length), averaged over valid labels. The embedding and LM head are the target's, frozen and shared.

:func:`train_drafters` trains several drafters side by side on the same batches (one target forward feeds all):
the run compares drafter layers initialised from target layers (:func:`init_from_target`) with random ones.
AdamW, linear warm-up then cosine to 10% over the time box (``TrainConfig.seconds``), validation on held-out
sequences every ``eval_every_s`` seconds (loss, top-1 accuracy per position, the chain's accepted length under
teacher forcing), the best checkpoint by validation loss kept, early stopping after ``patience`` validations
without improvement, a tqdm bar, checkpoints in ``checkpoint_dir`` that a later call resumes (a warm restart of
the schedule over that call's time box).
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from workbench.engine.drafters import DFlashConfig, DFlashDrafter
from workbench.validation import InvalidParameter, check_choice, check_float, check_int

__all__ = ["default_target_layers", "SeqData", "drafter_batch", "drafter_loss", "TrainConfig", "init_from_target",
           "train_drafters", "INITS", "sample_anchors", "validation_anchors", "evaluate"]

INITS = ("target", "random")


def default_target_layers(num_layers: int, count: int = 5) -> tuple[int, ...]:
    """``count`` target layers spread evenly from layer 1 to ``num_layers - 3`` (as DFlash picks them),
    clipped to the model's layers and deduplicated."""
    check_int("num_layers", num_layers, lo=1)
    check_int("count", count, lo=1)
    lo, hi = min(1, num_layers - 1), max(min(1, num_layers - 1), num_layers - 3)
    if count == 1:
        return (hi,)
    return tuple(sorted({round(lo + (hi - lo) * i / (count - 1)) for i in range(count)}))


@dataclasses.dataclass
class SeqData:
    """Sequences for training or validation: ``tokens`` int64 [N, T] (right-padded), ``lengths`` int64 [N] (valid
    tokens), ``prompt_lens`` int64 [N] (the prompt's tokens; anchors start there)."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    prompt_lens: torch.Tensor

    def __post_init__(self):
        N, T = self.tokens.shape
        if self.lengths.shape != (N,) or self.prompt_lens.shape != (N,):
            raise ValueError(f"lengths and prompt_lens must be [N]=[{N}], got {tuple(self.lengths.shape)} and "
                             f"{tuple(self.prompt_lens.shape)}")
        if bool((self.lengths > T).any()) or bool((self.prompt_lens < 1).any()):
            raise ValueError("lengths must be <= T and prompt_lens >= 1")

    @property
    def usable(self) -> torch.Tensor:
        """bool [N]: rows with at least one anchor (two or more continuation tokens)."""
        return self.lengths - self.prompt_lens >= 2

    def subset(self, rows: torch.Tensor) -> "SeqData":
        return SeqData(self.tokens[rows], self.lengths[rows], self.prompt_lens[rows])

    @classmethod
    def from_lists(cls, prompts, continuations, eos: int | None, pad: int = 0) -> "SeqData":
        """Rows ``prompt + continuation`` cut after the first ``eos`` of the continuation (kept)."""
        rows, lens, plens = [], [], []
        for p, c in zip(prompts, continuations):
            c = list(c)
            if eos is not None and eos in c:
                c = c[:c.index(eos) + 1]
            rows.append(list(p) + c)
            lens.append(len(p) + len(c))
            plens.append(len(p))
        T = max(lens)
        tok = torch.full((len(rows), T), pad, dtype=torch.int64)
        for i, r in enumerate(rows):
            tok[i, :len(r)] = torch.as_tensor(r, dtype=torch.int64)
        return cls(tok, torch.tensor(lens), torch.tensor(plens))


def sample_anchors(data: SeqData, rows: torch.Tensor, per_row: int, g: torch.Generator) -> torch.Tensor:
    """int64 [len(rows), per_row] anchors uniform in each row's ``[prompt_len, length - 2]``."""
    lo = data.prompt_lens[rows].float()
    span = (data.lengths[rows] - 1 - data.prompt_lens[rows]).clamp(min=1).float()
    u = torch.rand(rows.shape[0], per_row, generator=g)
    return (lo[:, None] + (u * span[:, None]).floor()).long()


def validation_anchors(data: SeqData, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed set of (row, anchor) pairs: rows int64 [count] and anchors int64 [count, 1]."""
    g = torch.Generator().manual_seed(seed)
    usable = torch.nonzero(data.usable).flatten()
    if usable.numel() == 0:
        raise ValueError("no validation row has two continuation tokens")
    rows = usable[torch.randint(0, usable.numel(), (count,), generator=g)]
    return rows, sample_anchors(data, rows, 1, g)


def drafter_batch(seqs: torch.Tensor, features: torch.Tensor, anchors: torch.Tensor, config: DFlashConfig,
                  lengths: torch.Tensor | None = None):
    """Inputs and labels for anchors: seqs int64 [B, T], features [B, T, nf], anchors int64 [B, A] (each in
    [1, T - 2]) -> (block_tokens int64 [B*A, block], positions int64 [B*A, block], context [B*A, W, nf],
    context_positions int64 [B*A, W], context_mask bool [B*A, W], labels int64 [B*A, block - 1] with -100 where
    the label lies at or past ``lengths`` (int64 [B], default T) or past the sequence); W = config.context_window,
    right-aligned (oldest first)."""
    B, T = seqs.shape
    A, W, blk = anchors.shape[1], config.context_window, config.block
    if int(anchors.min()) < 1 or int(anchors.max()) > T - 2:
        raise ValueError(f"anchors must lie in [1, {T - 2}] for sequences of {T} tokens")
    dev = seqs.device
    lengths = torch.full((B,), T, dtype=torch.int64, device=dev) if lengths is None else lengths.to(dev)
    rows = torch.arange(B, device=dev)[:, None, None]
    cidx = anchors[..., None] - W + torch.arange(W, device=dev)          # [B, A, W]
    cmask = cidx >= 0
    cidx = cidx.clamp(min=0)
    ctx = features[rows, cidx]                                           # [B, A, W, nf]
    bidx = anchors[..., None] + torch.arange(blk, device=dev)            # [B, A, blk]
    inside = bidx < lengths[:, None, None]
    toks = seqs[rows, bidx.clamp(max=T - 1)]
    labels = torch.where(inside, toks, torch.full_like(toks, -100))[..., 1:].reshape(B * A, blk - 1)
    block = torch.full_like(toks, config.mask_token_id)
    block[..., 0] = toks[..., 0]
    return (block.reshape(B * A, blk), bidx.reshape(B * A, blk), ctx.reshape(B * A, W, -1),
            cidx.reshape(B * A, W), cmask.reshape(B * A, W), labels)


def drafter_loss(logits: torch.Tensor, labels: torch.Tensor, gamma: float, target_logits: torch.Tensor | None = None,
                 kl_weight: float = 0.0) -> torch.Tensor:
    """Weighted loss: logits [R, L, V], labels int64 [R, L] (-100: ignored), target_logits [R, L, V] or None;
    position k (1-based) weighs exp(-(k - 1) / gamma). Per position: cross-entropy to the label plus
    ``kl_weight`` x KL(softmax(target_logits) || softmax(logits)). Returns a float32 scalar."""
    R, L, V = logits.shape
    w = torch.exp(-torch.arange(L, device=logits.device, dtype=torch.float32) / gamma)
    valid = labels >= 0
    lq = torch.log_softmax(logits.float(), -1)
    ce = -lq.gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    per = ce
    if target_logits is not None and kl_weight > 0:
        lp = torch.log_softmax(target_logits.float(), -1)
        per = per + kl_weight * (lp.exp() * (lp - lq)).sum(-1)
    wv = w[None] * valid
    return (per * wv).sum() / wv.sum().clamp(min=1e-9)


@dataclasses.dataclass
class TrainConfig:
    """Training settings. ``batch``: sequences per step; ``anchors``: anchors per sequence; ``seconds``: the time
    box of this call's schedule (None: only ``max_steps``); ``eval_every_s``: seconds between validations;
    ``patience``: validations without a better loss before a drafter stops; ``kl_weight``: weight of the KL to
    the target's soft distribution beside the hard-label cross-entropy."""

    max_steps: int = 100
    seconds: float | None = None
    batch: int = 8
    anchors: int = 4
    lr: float = 1e-3
    warmup: int = 20
    weight_decay: float = 0.01
    gamma: float = 7.0
    kl_weight: float = 1.0
    seed: int = 0
    eval_every_s: float = 30.0
    eval_every_steps: int | None = None
    val_anchors: int = 512
    patience: int = 4
    min_delta: float = 1e-3
    checkpoint_every_s: float = 120.0
    amp: bool = True

    def check(self) -> "TrainConfig":
        check_int("max_steps", self.max_steps, lo=1)
        if self.seconds is not None:
            check_float("seconds", self.seconds, lo=0, lo_open=True)
        check_int("batch", self.batch, lo=1)
        check_int("anchors", self.anchors, lo=1)
        check_float("lr", self.lr, lo=0, lo_open=True)
        check_int("warmup", self.warmup, lo=0)
        check_float("gamma", self.gamma, lo=0, lo_open=True)
        check_float("kl_weight", self.kl_weight, lo=0)
        check_int("seed", self.seed, lo=0)
        check_float("eval_every_s", self.eval_every_s, lo=0, lo_open=True)
        check_int("val_anchors", self.val_anchors, lo=1)
        check_int("patience", self.patience, lo=1)
        return self


def _lr_factor(step: int, cfg: TrainConfig, elapsed: float) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine from 1 to 0.1 over the time box (or ``max_steps``)."""
    warm = min(1.0, (step + 1) / max(1, cfg.warmup))
    frac = step / cfg.max_steps
    if cfg.seconds is not None:
        frac = max(frac, elapsed / cfg.seconds)
    return warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def init_from_target(drafter: DFlashDrafter, target, layers: tuple[int, ...] | None = None) -> list[int]:
    """Copy target decoder layers into the drafter's layers (norms, q/o projections, MLP; the target's grouped K/V
    heads repeated to the drafter's full heads, which computes the same attention). ``layers``: which target
    layers (default: spread evenly from the first to the last). Needs the drafter's heads and head size to equal
    the target's. Returns the layers used."""
    c = drafter.config
    tl = list(target.model.model.layers) if hasattr(target, "model") else list(target.layers)
    nh = target.config.num_attention_heads
    kvh = getattr(target.config, "num_key_value_heads", None) or nh
    hd = getattr(target.config, "head_dim", None) or target.config.hidden_size // nh
    if (c.num_heads, c.head_dim) != (nh, hd):
        raise InvalidParameter("drafter heads", (c.num_heads, c.head_dim),
                               f"the target's (num_heads, head_dim) = {(nh, hd)} to initialise from its layers")
    n = len(tl)
    if layers is None:
        layers = tuple(round(i * (n - 1) / max(1, c.num_layers - 1)) for i in range(c.num_layers)) \
            if c.num_layers > 1 else (n - 1,)
    g = nh // kvh
    with torch.no_grad():
        for dl, li in zip(drafter.layers, layers):
            t = tl[li]
            a, m = t.self_attn, t.mlp
            if dl.gate_proj.weight.shape != m.gate_proj.weight.shape:
                raise InvalidParameter("intermediate_size", c.intermediate_size,
                                       f"the target's {m.gate_proj.weight.shape[0]} to initialise from its layers")
            dl.input_layernorm.weight.copy_(t.input_layernorm.weight)
            dl.post_attention_layernorm.weight.copy_(t.post_attention_layernorm.weight)
            dl.q_proj.weight.copy_(a.q_proj.weight)
            dl.o_proj.weight.copy_(a.o_proj.weight)
            for src, dst in ((a.k_proj, dl.k_proj), (a.v_proj, dl.v_proj)):
                w = src.weight.view(kvh, hd, -1).repeat_interleave(g, 0).reshape(nh * hd, -1)
                dst.weight.copy_(w)
            for nm in ("gate_proj", "up_proj", "down_proj"):
                getattr(dl, nm).weight.copy_(getattr(m, nm).weight)
    return list(layers)


def _features_and_head(target, x: torch.Tensor, amp: bool):
    """(final normed hidden [B, T, D], features [B, T, nf]) of the target over x (bf16 autocast on CUDA if amp)."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp and x.device.type == "cuda"):
        return target.forward(x)


def _step_inputs(target, data: SeqData, rows: torch.Tensor, anchors: torch.Tensor, config: DFlashConfig, amp: bool):
    dev = target.device
    T = int(data.lengths[rows].max())
    x = data.tokens[rows, :T].to(dev)
    hid, feats = _features_and_head(target, x, amp)
    inputs = drafter_batch(x, feats, anchors.to(dev), config, data.lengths[rows].to(dev))
    # the target's logits for the label at a + k come from its hidden state at a + k - 1 (k = 1..L)
    L = config.block - 1
    pos = (anchors.to(dev)[..., None] + torch.arange(L, device=dev)).clamp(max=T - 1)      # [B, A, L]
    h = hid[torch.arange(x.shape[0], device=dev)[:, None, None], pos].reshape(-1, L, hid.shape[-1])
    return inputs, h


def _drafter_logits(drafter, inputs, amp: bool):
    dev = inputs[0].device
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp and dev.type == "cuda"):
        return drafter(*[t.float() if t.is_floating_point() else t for t in inputs[:5]])


@torch.no_grad()
def evaluate(target, drafter, config: DFlashConfig, data: SeqData, rows: torch.Tensor, anchors: torch.Tensor,
             cfg: TrainConfig, chunk: int = 256) -> dict:
    """Validation of ``drafter`` on fixed (row, anchor) pairs: loss (as trained), top-1 accuracy per drafted
    position [L] and the chain's accepted length under teacher forcing (1 + leading top-1 hits; root counted)."""
    was = drafter.training
    drafter.eval()
    L = config.block - 1
    tot, wsum = 0.0, 0
    hits = torch.zeros(L, dtype=torch.float64)
    counts = torch.zeros(L, dtype=torch.float64)
    chain = []
    for i in range(0, rows.shape[0], chunk):
        r, a = rows[i:i + chunk], anchors[i:i + chunk]
        inputs, h = _step_inputs(target, data, r, a, config, cfg.amp)
        logits = _drafter_logits(drafter, inputs, cfg.amp).float()
        tl = target.lm_head(h.to(target.dtype)).float() if cfg.kl_weight > 0 else None
        loss = drafter_loss(logits, inputs[5], cfg.gamma, tl, cfg.kl_weight)
        tot += float(loss) * r.shape[0]
        wsum += r.shape[0]
        lab = inputs[5]
        ok = (logits.argmax(-1) == lab) & (lab >= 0)
        hits += ok.sum(0).double().cpu()
        counts += (lab >= 0).sum(0).double().cpu()
        chain.append(1 + ok.long().cumprod(1).sum(1).float().cpu())
    drafter.train(was)
    acc = (hits / counts.clamp(min=1)).tolist()
    return {"loss": tot / max(1, wsum), "top1": acc, "chain_accepted": float(torch.cat(chain).mean())}


def _save(d: Path, name: str, drafter: DFlashDrafter, opt, state: dict, best_sd: dict | None) -> None:
    d.mkdir(parents=True, exist_ok=True)
    drafter.save(d / f"{name}.safetensors")
    if best_sd is not None:
        save_file({k: v.contiguous() for k, v in best_sd.items()}, str(d / f"{name}.best.safetensors"),
                  metadata={"dflash_config": drafter.config.to_json()})
    names = {id(p): n for n, p in drafter.named_parameters()}
    ost = {f"{names[id(p)]}::{k}": v.detach().float().contiguous().cpu()
           for group in opt.param_groups for p in group["params"] for k, v in opt.state.get(p, {}).items()
           if torch.is_tensor(v)}
    save_file(ost, str(d / f"{name}.optimizer.safetensors"))
    (d / f"{name}.state.json").write_text(json.dumps(state))


def _load(d: Path, name: str, target, opt_factory):
    drafter = DFlashDrafter.load(d / f"{name}.safetensors", target).float().train()
    opt = opt_factory(drafter)
    params = dict(drafter.named_parameters())
    with safe_open(str(d / f"{name}.optimizer.safetensors"), framework="pt") as f:
        for key in f.keys():
            pname, k = key.split("::")
            p = params[pname]
            v = f.get_tensor(key)
            opt.state[p][k] = v if k == "step" else v.to(p.device)
    best = None
    if (d / f"{name}.best.safetensors").exists():
        with safe_open(str(d / f"{name}.best.safetensors"), framework="pt") as f:
            best = {k: f.get_tensor(k).to(target.device) for k in f.keys()}
    return drafter, opt, json.loads((d / f"{name}.state.json").read_text()), best


def train_drafters(target, configs: dict[str, tuple[DFlashConfig, str]], data: SeqData, valid: SeqData,
                   cfg: TrainConfig, checkpoint_dir: str | Path | None = None, progress: bool = True,
                   data_info: dict | None = None) -> dict[str, tuple[DFlashDrafter, dict]]:
    """Train one drafter per entry of ``configs`` (name -> (config, init in :data:`INITS`)) on the same batches
    of ``data``, validating on ``valid`` (module docstring). Resumes each from ``checkpoint_dir`` when it holds
    that name's checkpoint. Returns name -> (the BEST drafter by validation loss, in eval mode; state: steps,
    seconds, loss_curve [[step, s, loss]], val_curve [{step, seconds, loss, top1, chain_accepted}], best
    {step, loss, ...}, stopped (why), init, init_layers, resumed_from, segments)."""
    cfg.check()
    if not configs:
        raise InvalidParameter("configs", configs, "at least one drafter to train")
    for name, (c, init) in configs.items():
        check_choice(f"{name} init", init, INITS)
        if tuple(c.target_layers) != target.capture_layers:
            raise ValueError(f"drafter {name} target_layers {c.target_layers} != the target's capture_layers "
                             f"{target.capture_layers}")
    c0 = next(iter(configs.values()))[0]
    if any((c.block, c.context_window) != (c0.block, c0.context_window) for c, _ in configs.values()):
        raise InvalidParameter("configs", [n for n in configs], "drafters of one block and context window")
    usable = torch.nonzero(data.usable).flatten()
    if usable.numel() == 0:
        raise ValueError("no training row has two continuation tokens")
    make_opt = lambda d: torch.optim.AdamW(d.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,  # noqa: E731
                                           betas=(0.9, 0.95))
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
    runs = {}
    for name, (c, init) in configs.items():
        if ckpt is not None and (ckpt / f"{name}.state.json").exists():
            d, opt, st, best = _load(ckpt, name, target, make_opt)
            st["resumed_from"] = st["steps"]
            st.pop("stopped", None)
            st["bad_evals"] = 0
        else:
            d = DFlashDrafter.random(c, target, seed=cfg.seed, std=0.02).float().train()
            layers_used = init_from_target(d, target) if init == "target" else None
            opt = make_opt(d)
            st = {"steps": 0, "seconds": 0.0, "loss_curve": [], "val_curve": [], "best": None, "init": init,
                  "init_layers": layers_used, "resumed_from": None, "segments": [], "bad_evals": 0}
            best = None
        st["seconds_before"] = st["seconds"]
        runs[name] = {"drafter": d, "opt": opt, "state": st, "best_sd": best, "first": st["steps"] + 1}
    vrows, vanch = validation_anchors(valid, cfg.val_anchors, cfg.seed + 1)
    g = torch.Generator().manual_seed(cfg.seed + 1000 * max(r["state"]["steps"] for r in runs.values()))
    t0 = time.perf_counter()
    last_eval = last_ckpt = t0
    start_steps = max(r["state"]["steps"] for r in runs.values())
    bar = tqdm(total=cfg.max_steps, desc="drafter training", disable=not progress)
    k = 0

    def validate(now_s: float):
        for name, r in runs.items():
            if r["state"].get("stopped"):
                continue
            ev = evaluate(target, r["drafter"], r["drafter"].config, valid, vrows, vanch, cfg)
            st = r["state"]
            ev.update(step=st["steps"], seconds=round(st["seconds"], 2))
            st["val_curve"].append(ev)
            if st["best"] is None or ev["loss"] < st["best"]["loss"] - cfg.min_delta:
                st["best"] = dict(ev)
                st["bad_evals"] = 0
                r["best_sd"] = {kk: v.detach().clone() for kk, v in r["drafter"].state_dict().items()}
            else:
                st["bad_evals"] += 1
                if st["bad_evals"] >= cfg.patience:
                    st["stopped"] = f"early stop: no better validation loss in {cfg.patience} validations"

    validate(0.0)
    while k < cfg.max_steps:
        elapsed = time.perf_counter() - t0
        if cfg.seconds is not None and elapsed >= cfg.seconds:
            break
        active = [n for n, r in runs.items() if not r["state"].get("stopped")]
        if not active:
            break
        rows = usable[torch.randint(0, usable.numel(), (cfg.batch,), generator=g)]
        anchors = sample_anchors(data, rows, cfg.anchors, g)
        inputs, h = _step_inputs(target, data, rows, anchors, c0, cfg.amp)
        with torch.no_grad():
            tl = target.lm_head(h.to(target.dtype)).float() if cfg.kl_weight > 0 else None
        losses = {}
        for name in active:
            r = runs[name]
            for group in r["opt"].param_groups:
                group["lr"] = cfg.lr * _lr_factor(k, cfg, elapsed)
            logits = _drafter_logits(r["drafter"], inputs, cfg.amp)
            loss = drafter_loss(logits, inputs[5], cfg.gamma, tl, cfg.kl_weight)
            r["opt"].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(r["drafter"].parameters(), 1.0)
            r["opt"].step()
            st = r["state"]
            st["steps"] += 1
            lv = loss.item()
            losses[name] = lv
            st["loss_curve"].append([st["steps"], round(elapsed, 2), round(lv, 5)])
        k += 1
        now = time.perf_counter()
        for name in active:
            runs[name]["state"]["seconds"] = runs[name]["state"].get("seconds_before", 0.0) + (now - t0)
        bar.update(1)
        bar.set_postfix({n[:8]: f"{v:.3f}" for n, v in losses.items()})
        due = (cfg.eval_every_steps is not None and k % cfg.eval_every_steps == 0) or \
            (cfg.eval_every_steps is None and now - last_eval >= cfg.eval_every_s)
        if due:
            validate(now - t0)
            last_eval = time.perf_counter()
        if ckpt is not None and time.perf_counter() - last_ckpt >= cfg.checkpoint_every_s:
            for name, r in runs.items():
                _save(ckpt, name, r["drafter"], r["opt"], r["state"], r["best_sd"])
            last_ckpt = time.perf_counter()
    bar.close()
    if not runs[next(iter(runs))]["state"]["val_curve"] or runs[next(iter(runs))]["state"]["val_curve"][-1]["step"] \
            != runs[next(iter(runs))]["state"]["steps"]:
        validate(time.perf_counter() - t0)
    out = {}
    for name, r in runs.items():
        st = r["state"]
        st.setdefault("stopped", None)
        if st["stopped"] is None:
            st["stopped"] = "time box" if cfg.seconds is not None and k < cfg.max_steps else "max_steps"
        if st["steps"] >= r["first"]:
            st["segments"] = st["segments"] + [{"first_step": r["first"], "last_step": st["steps"],
                                                "data": data_info or {}, "train_config": dataclasses.asdict(cfg),
                                                "steps_this_call": k, "start_steps": start_steps}]
        if ckpt is not None:
            _save(ckpt, name, r["drafter"], r["opt"], st, r["best_sd"])
        d = r["drafter"]
        if r["best_sd"] is not None:
            d.load_state_dict(r["best_sd"])
        st["returned"] = "best by validation loss" if r["best_sd"] is not None else "last"
        out[name] = (d.eval(), st)
    return out
