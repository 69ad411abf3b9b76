"""Capacity planning: does a context fit, and how many requests at once?

All arithmetic is per GPU under tensor parallelism (TP):

- Weights: routed experts INT4 group-wise with bf16 scales (0.5 B per weight
  + 2 B per group), sharded TP ways; everything else bf16. Under TP
  attention the head-parallel projections (q_b, kv_b, o), the dense and shared
  MLPs, the embedding and lm_head are sharded; q_a, kv_a, the router and the
  norms are replicated. Under data-parallel (DP) attention every rank holds
  the whole attention block.
- KV: MLA caches one latent row (kv_lora_rank + qk_rope_head_dim values) per
  token per layer. It has no head dimension, so it cannot be sharded by head:
  under TP attention every rank holds the full KV of every request. Under DP
  attention each rank holds the KV of its own requests only.
- KV pool per GPU = mem_fraction x GPU memory - weights - reserved activations.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from workbench.config import KV_DTYPE_BYTES, ModelConfig, available_models, config_from_dict, load_config
from workbench.hardware import get_gpu
from workbench.validation import InvalidParameter, check_choice, check_float, load_json_file, parse_text

BF16 = 2
GIB = 2**30
ATTENTION_MODES = ("tp", "dp")


@dataclasses.dataclass
class WeightBreakdown:
    """Bytes per GPU by component."""

    embedding_and_head: float
    attention: float
    dense_mlp: float
    shared_experts: float
    routed_experts: float
    router_and_norms: float

    @property
    def total(self) -> float:
        """All components."""
        return sum(dataclasses.asdict(self).values())


def routed_expert_bytes_per_weight(cfg: ModelConfig) -> float:
    """Bytes per routed-expert weight: 0.5 + 2/group for INT4 with bf16 scales, else 2 (bf16)."""
    q = cfg.expert_quant
    if q is None:
        return BF16
    return q.num_bits / 8 + BF16 / q.group_size


def weight_bytes_per_gpu(cfg: ModelConfig, tp: int = 1, attention: str = "tp") -> WeightBreakdown:
    """Weight bytes one GPU holds under ``tp``-way tensor parallelism.

    ``attention`` is ``"tp"`` (heads sharded) or ``"dp"`` (data-parallel
    attention: the attention block replicated on every rank).
    """
    cfg.check_tp(tp)
    check_choice("attention", attention, ATTENTION_MODES)
    h, H, L = cfg.hidden_size, cfg.num_attention_heads, cfg.num_hidden_layers
    q_in = cfg.q_lora_rank if cfg.q_lora_rank else h
    replicated_attn = h * cfg.kv_row_width + cfg.kv_lora_rank  # kv_a_proj_with_mqa + kv_a_layernorm
    sharded_attn = (q_in * H * cfg.qk_head_dim  # q_b_proj (or q_proj)
                    + cfg.kv_lora_rank * H * (cfg.qk_nope_head_dim + cfg.v_head_dim)  # kv_b_proj
                    + H * cfg.v_head_dim * h)  # o_proj
    if cfg.q_lora_rank:
        replicated_attn += h * cfg.q_lora_rank + cfg.q_lora_rank  # q_a_proj + q_a_layernorm
    attn_split = tp if attention == "tp" else 1
    attention_b = L * BF16 * (replicated_attn + sharded_attn / attn_split)
    n_moe = cfg.num_moe_layers
    n_dense = L - n_moe
    dense_b = n_dense * BF16 * 3 * h * cfg.intermediate_size / tp
    shared_b = n_moe * BF16 * 3 * h * cfg.moe_intermediate_size * cfg.n_shared_experts / tp
    routed_weights = n_moe * cfg.n_routed_experts * 3 * h * cfg.moe_intermediate_size
    routed_b = routed_weights * routed_expert_bytes_per_weight(cfg) / tp
    router_b = n_moe * (BF16 * cfg.n_routed_experts * h + 4 * cfg.n_routed_experts)  # gate + fp32 bias
    norms_b = BF16 * (2 * L + 1) * h
    embed_b = BF16 * cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2) / tp
    return WeightBreakdown(embedding_and_head=embed_b, attention=attention_b, dense_mlp=dense_b,
                           shared_experts=shared_b, routed_experts=routed_b,
                           router_and_norms=router_b + norms_b)


def model_config(model: str | Path | ModelConfig, name: str = "model") -> ModelConfig:
    """``model`` as a :class:`ModelConfig`: a shipped name, a checkpoint folder holding config.json, or a
    config.json. InvalidParameter (parameter ``name``) naming the path and why it is not a model config."""
    if isinstance(model, ModelConfig):
        return model
    allowed = ("a shipped model (one of " + ", ".join(map(repr, available_models()))
               + ") or the path of a checkpoint folder holding config.json, or of a config.json")
    if not isinstance(model, (str, os.PathLike)) or not str(model).strip():
        raise InvalidParameter(name, model, allowed)
    p = Path(model).expanduser()
    if not p.exists():
        return load_config(model)  # a shipped name, else the message listing them
    file = p / "config.json" if p.is_dir() else p
    if not file.exists():
        raise InvalidParameter(name, str(model), f"{allowed}; the folder {p} holds no config.json")
    raw = load_json_file(name, file, "a model's config.json")
    if not isinstance(raw, dict):
        raise InvalidParameter(name, str(model), f"{allowed}; {file} is JSON but not an object")
    try:
        return config_from_dict(raw, name=file.parent.name)
    except (ValueError, TypeError) as e:  # an unsupported model_type, a missing or malformed key
        raise InvalidParameter(name, str(model), f"{allowed}; {file} is not a supported model config: {e}") from None


def check_inputs(model: str | Path | ModelConfig, tp: Any, mem_fraction: Any, context: Any, kv_dtype: Any,
                 reserved_gib: Any, gpu: Any = None, attention: Any = None) -> ModelConfig:
    """The rules :func:`capacity` applies to its inputs (``gpu`` / ``attention`` None: not given,
    not checked); returns the model config. ``workbench run`` checks notebook 05's parameters
    with it before the notebook runs, so the CLI, the library and the notebook say the same."""
    cfg = model_config(model)
    cfg.check_tp(tp)
    cfg.check_context(context)
    check_float("mem_fraction", mem_fraction, lo=0, hi=1, lo_open=True)
    check_choice("kv_dtype", kv_dtype, KV_DTYPE_BYTES)
    check_float("reserved_gib", reserved_gib, lo=0)
    if gpu is not None:
        get_gpu(gpu)
    if attention is not None:
        check_choice("attention", attention, ATTENTION_MODES)
    return cfg


def host_memory_bytes() -> int:
    """This machine's physical memory (RAM)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def synthetic_weight_bytes(cfg: ModelConfig, float32: bool) -> float:
    """Bytes of a synthetic model of ``cfg`` on one device: INT4 routed experts where the config quantises
    them, the rest bf16, or float32 (``float32``: on the CPU) - a lower bound of what the process holds."""
    w = weight_bytes_per_gpu(cfg, tp=1)
    wide = 2 if float32 else 1
    routed = w.routed_experts * (1 if cfg.expert_quant is not None else wide)
    return routed + wide * (w.total - w.routed_experts)


def check_fits_memory(cfg: ModelConfig, memory_bytes: int, where: str, float32: bool, name: str = "layers") -> None:
    """A synthetic model of ``cfg`` fits ``memory_bytes`` (``where``: whose memory, for the message); else an
    InvalidParameter on ``name`` (its layers) giving the most layers that fit."""
    need = synthetic_weight_bytes(cfg, float32)
    if need <= memory_bytes:
        return
    fit = [n for n in range(1, cfg.num_hidden_layers) if
           synthetic_weight_bytes(cfg.replace(num_hidden_layers=n), float32) <= memory_bytes]
    allowed = f"an integer in [1, {fit[-1]}]" if fit else "a smaller model (not even one layer fits)"
    raise InvalidParameter(name, cfg.num_hidden_layers,
                           f"{allowed}: {cfg.num_hidden_layers} layers of {cfg.name or cfg.model_type} hold at least "
                           f"{need / 1e9:,.1f} GB of weights, more than the {memory_bytes / 1e9:,.1f} GB of {where}")


@dataclasses.dataclass
class CapacityAnswer:
    model: str
    gpu: str
    gpu_name: str
    tp: int
    attention: str
    mem_fraction: float
    kv_dtype: str
    context: int
    gpu_memory_bytes: int
    reserved_bytes: float
    kv_bytes_per_token: int
    yarn_limit: int
    weights: WeightBreakdown
    kv_pool_bytes: float
    pool_tokens: int
    max_context: int
    request_kv_bytes: int
    fits: bool
    concurrent_requests: int
    notes: list[str]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, the weights' total included."""
        d = dataclasses.asdict(self)
        d["weights"]["total"] = self.weights.total
        return d

    def explain(self) -> str:
        """The answer with its arithmetic, as plain text."""
        gb = lambda b: f"{b / 1e9:,.2f} GB"  # noqa: E731
        w = self.weights
        lines = [
            f"{self.model} on {self.tp} x {self.gpu_name} (TP={self.tp}, {self.attention.upper()} attention), "
            f"KV {self.kv_dtype}, context {self.context:,}",
            f"  KV per token   "
            f"= kv_row x layers x {KV_DTYPE_BYTES[self.kv_dtype]} B = {self.kv_bytes_per_token:,} B",
            f"  YaRN limit     = min(factor x original, max_position_embeddings) = {self.yarn_limit:,} tokens",
            f"  GPU memory     = {gb(self.gpu_memory_bytes)}; x mem_fraction {self.mem_fraction} "
            f"= {gb(self.mem_fraction * self.gpu_memory_bytes)}",
            f"  weights/GPU    = {gb(w.total)} (routed experts {gb(w.routed_experts)}, attention {gb(w.attention)}, "
            f"embedding+head {gb(w.embedding_and_head)}, shared experts {gb(w.shared_experts)}, "
            f"dense MLP {gb(w.dense_mlp)}, router+norms {gb(w.router_and_norms)})",
            f"  reserved       = {gb(self.reserved_bytes)} (activations, CUDA graphs, workspace: an assumption)",
            f"  KV pool/GPU    = {gb(self.mem_fraction * self.gpu_memory_bytes)} - {gb(w.total)} - "
            f"{gb(self.reserved_bytes)} = {gb(self.kv_pool_bytes)} = {self.pool_tokens:,} tokens",
            f"  request KV     = {self.context:,} x {self.kv_bytes_per_token:,} B = {gb(self.request_kv_bytes)}",
            f"  largest single-request context = min(pool, YaRN limit) = {self.max_context:,} tokens",
            f"  fits: {'YES' if self.fits else 'NO'}; concurrent requests at {self.context:,} tokens: "
            f"{self.concurrent_requests}",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def capacity(model: str | ModelConfig = "kimi-k2.6", gpu: str = "rtx-pro-6000", tp: int = 8,
             mem_fraction: float = 0.85, context: int = 200_000, kv_dtype: str = "bf16",
             reserved_gib: float = 2.0, attention: str = "tp") -> CapacityAnswer:
    """Does ``context`` fit for one request, and how many such requests fit at once.

    Raises :class:`~workbench.validation.InvalidParameter` (a ValueError) on an input outside
    :func:`check_inputs`'s rules."""
    cfg = check_inputs(model, tp, mem_fraction, context, kv_dtype, reserved_gib, gpu, attention)
    g = get_gpu(gpu)
    weights = weight_bytes_per_gpu(cfg, tp, attention)
    reserved = reserved_gib * GIB
    kv_tok = cfg.kv_bytes_per_token(kv_dtype)
    pool = mem_fraction * g.memory - weights.total - reserved
    pool_tokens = max(0, int(pool // kv_tok))
    notes = []
    if pool <= 0:
        notes.append("the weights and reserve do not fit in mem_fraction x memory: no KV pool at all")
    max_ctx = min(pool_tokens, cfg.yarn_limit)
    req = context * kv_tok
    fits = pool_tokens >= context
    per_rank = pool_tokens // context
    if attention == "tp":
        concurrent = per_rank
        notes.append("MLA's latent KV has no head dimension, so it is replicated on every tensor-parallel rank, "
                     "not sharded: adding GPUs under TP does not add KV capacity. Data-parallel attention "
                     "(attention='dp') keeps each request's KV on one rank instead.")
    else:
        concurrent = per_rank * tp
        notes.append(f"DP attention: each of the {tp} ranks holds its own requests' KV, so concurrency is "
                     f"{tp} x the per-rank count, but attention weights are replicated on every rank and a single "
                     f"request's context is still bounded by one rank's pool.")
    name = cfg.name or cfg.model_type
    return CapacityAnswer(model=name, gpu=gpu, gpu_name=g.name, tp=tp, attention=attention,
                          mem_fraction=mem_fraction, kv_dtype=kv_dtype, context=context,
                          gpu_memory_bytes=g.memory, reserved_bytes=reserved, kv_bytes_per_token=kv_tok,
                          yarn_limit=cfg.yarn_limit, weights=weights, kv_pool_bytes=pool,
                          pool_tokens=pool_tokens, max_context=max_ctx, request_kv_bytes=req, fits=fits,
                          concurrent_requests=concurrent, notes=notes)


def capacity_table(gpus: list[str], **kw: Any) -> list[dict[str, Any]]:
    """One summary row per GPU (same model, tp, context, ...)."""
    rows = []
    for g in gpus:
        a = capacity(gpu=g, **kw)
        rows.append({"gpu": a.gpu_name, "tp": a.tp, "attention": a.attention, "kv_dtype": a.kv_dtype,
                     "weights_GB_per_gpu": round(a.weights.total / 1e9, 2),
                     "kv_pool_GB_per_gpu": round(a.kv_pool_bytes / 1e9, 2),
                     "pool_tokens": a.pool_tokens, "request_GB": round(a.request_kv_bytes / 1e9, 2),
                     "max_context": a.max_context, "fits": a.fits,
                     "concurrent_requests": a.concurrent_requests})
    return rows


def context_curve(contexts: list[int], gpus: list[str], **kw: Any) -> dict[str, Any]:
    """Request KV bytes against context, and each GPU's KV pool (bytes), for plotting."""
    cfg = model_config(kw.get("model", "kimi-k2.6"))
    kv_tok = cfg.kv_bytes_per_token(kw.get("kv_dtype", "bf16"))
    pools = {g: capacity(gpu=g, context=1, **kw).kv_pool_bytes for g in gpus}
    return {"contexts": list(contexts), "request_bytes": [c * kv_tok for c in contexts],
            "pools": pools, "yarn_limit": cfg.yarn_limit}


# ---- CLI --------------------------------------------------------------------------
def register(sub: argparse._SubParsersAction) -> None:
    """The ``capacity`` verb, its defaults those of :func:`capacity`."""
    d = {k: v.default for k, v in inspect.signature(capacity).parameters.items()}  # defaults: capacity()'s
    p = sub.add_parser("capacity", help="does a context fit? KV pool, weights and concurrency per GPU",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=d["model"], metavar="NAME|PATH",
                   help="shipped model name or checkpoint dir / config.json")
    p.add_argument("--gpu", default=d["gpu"], metavar="GPU", help="GPU id from data/hardware.json")
    p.add_argument("--tp", type=parse_text, default=d["tp"], metavar="N",
                   help="tensor-parallel ranks (GPUs): divides the attention heads")
    p.add_argument("--mem-fraction", type=parse_text, default=d["mem_fraction"], metavar="F",
                   help="fraction of GPU memory for weights + KV, in (0, 1]")
    p.add_argument("--context", type=parse_text, default=d["context"], metavar="TOKENS",
                   help="tokens per request, 1 .. the model's YaRN limit")
    p.add_argument("--kv-dtype", default=d["kv_dtype"], metavar="|".join(KV_DTYPE_BYTES),
                   help="one of " + ", ".join(KV_DTYPE_BYTES))
    p.add_argument("--reserved-gib", type=parse_text, default=d["reserved_gib"], metavar="GIB",
                   help="activations/workspace reserve per GPU (GiB), >= 0")
    p.add_argument("--attention", default=d["attention"], metavar="|".join(ATTENTION_MODES),
                   help="tensor- (tp) or data-parallel (dp) attention")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    """``workbench capacity``: the answer with its arithmetic, or JSON."""
    a = capacity(model=args.model, gpu=args.gpu, tp=args.tp, mem_fraction=args.mem_fraction,
                 context=args.context, kv_dtype=args.kv_dtype, reserved_gib=args.reserved_gib,
                 attention=args.attention)
    print(json.dumps(a.as_dict(), indent=1) if args.json else a.explain())
    return 0


# ---- the source's 200k claim ---------------------------------------------------------
SOURCE_CLAIMS = {
    "kv_bytes_per_token": 8.6e3,  # "approximately 8.6 KB" (the source articles)
    "kv_sharded_across_tp": True,  # "not stored redundantly across TP ranks—each GPU holds only its shard"
    "verdict": "easily feasible",  # 200k context on 8x RTX PRO 6000, mem-fraction-static 0.85
}


def source_check(model: str = "kimi-k2.6", context: int = 200_000, mem_fraction: float = 0.85,
                 reserved_gib: float = 2.0) -> list[dict[str, Any]]:
    """The source's claims about 200k on 8x RTX PRO 6000 next to what the arithmetic gives."""
    cfg = load_config(model)
    kv = cfg.kv_bytes_per_token("bf16")
    rows = [{"claim": "KV per token ~8.6 KB", "computed": f"{kv:,} B per token (all 61 layers, bf16)",
             "holds": False,
             "why": f"8.6 KB is {kv:,} B / 8 = {kv / 8:,.0f} B: the full per-token KV divided by TP=8, "
                    "which is only right if the KV were sharded across ranks"},
            {"claim": "KV is sharded across TP ranks", "computed": "replicated on every TP rank",
             "holds": False,
             "why": "the MLA latent row has no head dimension, so head-parallel TP cannot split it"}]
    for kv_dtype in ("bf16", "fp8"):
        for att in ("tp", "dp"):
            a = capacity(model, "rtx-pro-6000", 8, mem_fraction, context, kv_dtype, reserved_gib, att)
            rows.append({"claim": f"200k 'easily feasible' ({kv_dtype} KV, {att.upper()} attention)",
                         "computed": f"pool {a.pool_tokens:,} tokens per GPU; request needs {context:,}",
                         "holds": a.fits,
                         "why": f"{a.kv_pool_bytes / 1e9:.2f} GB pool vs {a.request_kv_bytes / 1e9:.2f} GB request"})
    return rows


def verdict(model: str = "kimi-k2.6", context: int = 200_000, mem_fraction: float = 0.85,
            reserved_gib: float = 2.0) -> str:
    """One plain sentence on the source's 'easily feasible'."""
    bf = capacity(model, "rtx-pro-6000", 8, mem_fraction, context, "bf16", reserved_gib)
    f8 = capacity(model, "rtx-pro-6000", 8, mem_fraction, context, "fp8", reserved_gib)
    if bf.fits:
        return (f"'Easily feasible' holds: with bf16 KV one {context:,}-token request fits in the "
                f"{bf.pool_tokens:,}-token pool per GPU ({bf.concurrent_requests} at once).")
    tail = (f"with fp8 KV it fits ({f8.pool_tokens:,}-token pool, {f8.concurrent_requests} request(s) at once)"
            if f8.fits else "not even with fp8 KV")
    return (f"'Easily feasible' does not hold at bf16 KV: at mem-fraction {mem_fraction} and a "
            f"{reserved_gib:g} GiB reserve, 8 x RTX PRO 6000 leave {bf.kv_pool_bytes / 1e9:.2f} GB of KV pool per GPU "
            f"= {bf.pool_tokens:,} tokens, short of {context:,} ({bf.request_kv_bytes / 1e9:.2f} GB); "
            f"{tail}. The source's 8.6 KB per token assumed the KV sharded 8 ways; MLA's KV is replicated.")


def context_figure(contexts: list[int] | None = None, gpus: list[str] | None = None, **kw: Any):
    """Plotly figure: request KV (GB) against context, with each GPU's KV pool and the YaRN limit."""
    gpus = gpus or ["rtx-pro-6000", "h200", "b300"]
    contexts = contexts or [2**k for k in range(12, 19)] + [200_000, 262_144]
    contexts = sorted(set(contexts))
    curve = context_curve(contexts, gpus, **kw)
    fig = go.Figure()
    fig.add_scatter(x=curve["contexts"], y=[b / 1e9 for b in curve["request_bytes"]], mode="lines+markers",
                    name=f"one request's KV ({kw.get('kv_dtype', 'bf16')})")
    for g, pool in curve["pools"].items():
        fig.add_scatter(x=[contexts[0], contexts[-1]], y=[pool / 1e9] * 2, mode="lines",
                        line=dict(dash="dash"), name=f"KV pool per GPU: {get_gpu(g).name}")
    fig.add_vline(x=curve["yarn_limit"], line=dict(dash="dot"), annotation_text="YaRN limit")
    fig.update_layout(title="KV pool per GPU vs one request's KV", xaxis_title="context (tokens)",
                      yaxis_title="GB", xaxis_type="log", height=480)
    return fig
