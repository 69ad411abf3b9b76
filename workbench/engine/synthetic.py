"""Synthetic models: true K2.6 (or any config's) dimensions with random, never-zero weights.

:func:`synthetic_model` builds a :class:`~workbench.engine.model.DeepseekV3`
for a slice of a real config (a few layers, all or some routed experts) so
that step times can be measured at real shapes on one GPU. :func:`tiny_config`
gives a small config for CPU tests.
"""
from __future__ import annotations

import math

import torch

from workbench.config import Int4Quant, ModelConfig, RopeScaling, load_config
from workbench.engine.loader import build_empty
from workbench.moe import Int4Experts


def tiny_config(**overrides) -> ModelConfig:
    """A small DeepSeek-V3-shaped config (YaRN on, 2 groups, dense first layer) for CPU tests."""
    base = dict(model_type="deepseek_v3", vocab_size=96, hidden_size=64, intermediate_size=96,
                moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4, n_shared_experts=1,
                n_routed_experts=8, num_experts_per_tok=2, routed_scaling_factor=2.5, kv_lora_rank=32,
                q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, n_group=2,
                topk_group=1, first_k_dense_replace=1, norm_topk_prob=True, scoring_func="sigmoid",
                max_position_embeddings=1024, rms_norm_eps=1e-6, rope_theta=10000.0,
                rope_scaling=RopeScaling(type="yarn", factor=4.0, original_max_position_embeddings=256,
                                         beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0),
                rope_interleave=True, name="tiny")
    base.update(overrides)
    return ModelConfig(**base)


def _zero_mean_nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 words of 8 packed nibbles (stored as q + 8, :mod:`workbench.int4`) with every q = -8 nibble (0b0000)
    set to q = 0 (0b1000): q in -7..7 with 0 twice as likely, mean 0."""
    out = words
    for k in range(8):
        is_min = ((out >> (4 * k)) & 0xF) == 0
        out = torch.where(is_min, out | (8 << (4 * k)) if k < 7 else out | torch.iinfo(torch.int32).min, out)
    return out


@torch.no_grad()
def synthetic_model(config: ModelConfig | str = "kimi-k2.6", layers: int | None = 4, experts: int | None = None,
                    seed: int = 0, device: str | torch.device | None = None, dtype: torch.dtype = torch.bfloat16,
                    int4: bool | None = None, next_token: str = "permutation"):
    """A model with ``config``'s dimensions, its first ``layers`` layers and ``experts`` routed experts
    (default: all), random weights (Gaussian, std 1/sqrt(fan_in); norms near 1; INT4 experts as random
    nibbles with q in -7..7, 0 twice as likely, so that the weights have mean zero as trained weights do,
    and positive scales), reproducible from ``seed``. Uniform nibbles (q in -8..7, mean -0.5) give every
    expert's output a shared direction: on the H200 at 61 layers every token of 16 requests then chose the
    same ~8-10 of 32 experts in every layer. The residual branches' output projections (o_proj, down_proj,
    the routed experts' down scales) are scaled by 1/sqrt(2 x layers), as GPT-2 initialises them, so the
    residual stream stays near unit scale through the depth.

    int4: routed experts in INT4 (default: when the config says its experts are quantised).
    next_token: ``"permutation"`` (default) sets lm_head row ``perm[t]`` to token t's embedding / sqrt(hidden),
    so the greedy next token is a fixed random permutation of the current one with a margin of tens of logits,
    as a trained model is confident on predictable text; ``"random"`` keeps a Gaussian lm_head, whose top-2
    logits differ by hundredths (at K2.6 dims on the H200, bf16 rounding in the verify forward then flipped the
    argmax against the one-token step at the first or second token, and a scripted drafter accepted nothing).
    Example: ``synthetic_model("kimi-k2.6", layers=4, device="cuda")`` is one dense and three MoE
    layers with all 384 INT4 experts (about 30 GB). ``model.device_bytes()`` reports what it holds.
    """
    cfg = load_config(config) if isinstance(config, str) else config
    changes = {}
    if layers is not None:
        if not 1 <= layers <= cfg.num_hidden_layers:
            raise ValueError(f"layers must be in 1..{cfg.num_hidden_layers}, got {layers}")
        changes["num_hidden_layers"] = layers
    if experts is not None:
        if not cfg.num_experts_per_tok <= experts <= cfg.n_routed_experts or experts % cfg.n_group:
            raise ValueError(f"experts must be in {cfg.num_experts_per_tok}..{cfg.n_routed_experts} and a "
                             f"multiple of n_group={cfg.n_group}, got {experts}")
        changes["n_routed_experts"] = experts
    if int4 is None:
        int4 = cfg.expert_quant is not None
    if int4 and cfg.expert_quant is None:
        changes["expert_quant"] = Int4Quant()
    cfg = cfg.replace(**changes)
    device = torch.device(device or "cpu")
    model = build_empty(cfg, dtype, device, int4)
    g = torch.Generator(device=device).manual_seed(seed)
    out_scale = 1.0 / math.sqrt(2 * cfg.num_hidden_layers)  # residual branches' output projections
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if name.endswith("_packed"):
            t.copy_(_zero_mean_nibbles(torch.randint(-2**31, 2**31 - 1, t.shape, generator=g, device=device,
                                                     dtype=torch.int32)))
        elif name.endswith("_scale"):
            fan_in = t.shape[-1] * (model.layers[int(name.split(".")[1])].mlp.experts.group_size)
            std_q = math.sqrt(17.5)  # std of q in -7..7 with 0 twice as likely
            s = (1.0 + 0.25 * torch.rand(t.shape, generator=g, device=device)) / (std_q * math.sqrt(fan_in))
            t.copy_((s * (out_scale if name.endswith("down_scale") else 1.0)).to(t.dtype))
        elif name.endswith("e_score_correction_bias"):
            t.copy_(0.01 * torch.randn(t.shape, generator=g, device=device))
        elif t.dim() == 1:  # norm weights
            t.copy_(1.0 + 0.1 * torch.randn(t.shape, generator=g, device=device))
        elif name == "embed_tokens.weight":
            t.copy_(torch.randn(t.shape, generator=g, device=device, dtype=t.dtype))
        else:
            std = 1.0 / math.sqrt(t.shape[-1])
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                std *= out_scale
            t.copy_(torch.randn(t.shape, generator=g, device=device, dtype=t.dtype) * std)
    if next_token == "permutation":
        perm = torch.randperm(cfg.vocab_size, generator=g, device=device)
        emb = model.embed_tokens.weight
        model.lm_head.weight.copy_((emb[torch.argsort(perm)].float() / math.sqrt(cfg.hidden_size)).to(emb.dtype))
    elif next_token != "random":
        raise ValueError(f"next_token={next_token!r} is not allowed: one of 'permutation', 'random'")
    for layer in model.layers:  # the fused MoE's view (and any layout it keeps) is made now: device_bytes() is final
        if layer.is_moe:
            layer.mlp.experts.prepare(model.dtype)
    return model


def default_experts(cfg, layers: int, rows: int, capacity: int, reserve_gb: float = 16.0) -> int:
    """The most routed experts per layer that fit the current GPU beside the dense weights, a KV pool of
    ``rows x capacity`` tokens and ``reserve_gb`` of work space (an expert's bytes in the one layout the
    engine holds it in on this GPU)."""
    c = cfg.replace(num_hidden_layers=layers, n_routed_experts=cfg.num_experts_per_tok)
    meta = build_empty(c, torch.bfloat16, "meta", True)
    wb = meta.weight_bytes()
    dense = sum(v for k, v in wb.items() if k != "routed_per_expert")
    D, I = cfg.hidden_size, cfg.moe_intermediate_size
    one = Int4Experts(torch.zeros(1, 2 * I, D // 8, dtype=torch.int32, device="cuda"),
                      torch.ones(1, 2 * I, D // 32, dtype=torch.bfloat16, device="cuda"),
                      torch.zeros(1, D, I // 8, dtype=torch.int32, device="cuda"),
                      torch.ones(1, D, I // 32, dtype=torch.bfloat16, device="cuda"))
    per_expert = one.nbytes
    del one
    torch.cuda.empty_cache()
    moe_layers = sum(c.is_moe_layer(i) for i in range(layers))
    kv = rows * capacity * c.kv_row_width * layers * 2
    free = torch.cuda.mem_get_info()[0]
    e = int((free - dense - kv - reserve_gb * 2**30) // (moe_layers * per_expert))
    return max(cfg.num_experts_per_tok, min(cfg.n_routed_experts, e - e % 8))
