"""Model configuration for DeepSeek-V3-family models (DeepSeek-V3, Kimi K2 / K2.5 / K2.6).

:func:`load_config` reads a Hugging Face style ``config.json`` (a file, a
checkpoint directory, or a model name shipped under ``data/models/``) and
returns a :class:`ModelConfig`. It accepts the nested ``text_config`` of the
Kimi K2.5/K2.6 multimodal wrappers, and both rope forms: ``rope_scaling`` +
``rope_theta`` (published checkpoints) and ``rope_parameters`` (what current
transformers writes).
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from workbench import DATA_DIR
from workbench.validation import InvalidParameter, check_choice, check_divisor, check_int

MODELS_DIR = DATA_DIR / "models"
SUPPORTED_MODEL_TYPES = ("deepseek_v3", "kimi_k2")
WRAPPER_MODEL_TYPES = ("kimi_k25", "kimi_k26", "kimi_vl")

KV_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """YaRN parameters in the DeepSeek-V3 form (``type`` is ``yarn`` or ``none``)."""

    type: str = "none"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0


@dataclasses.dataclass(frozen=True)
class Int4Quant:
    """compressed-tensors pack-quantized routed experts: symmetric int4, group-wise."""

    num_bits: int = 4
    group_size: int = 32
    symmetric: bool = True


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The text model's hyper-parameters. Names follow config.json."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    n_shared_experts: int
    n_routed_experts: int
    num_experts_per_tok: int
    routed_scaling_factor: float
    kv_lora_rank: int
    q_lora_rank: int | None
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    n_group: int
    topk_group: int
    first_k_dense_replace: int
    norm_topk_prob: bool
    scoring_func: str
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling
    rope_interleave: bool = True
    tie_word_embeddings: bool = False
    topk_method: str = "noaux_tc"
    moe_layer_freq: int = 1
    expert_quant: Int4Quant | None = None
    name: str | None = None

    # ---- derived quantities -------------------------------------------------
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_row_width(self) -> int:
        """Values per token per layer in the absorbed MLA cache (c_kv + k_rope)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> int:
        """(kv_lora_rank + qk_rope_head_dim) x layers x bytes per element."""
        check_choice("kv_dtype", kv_dtype, KV_DTYPE_BYTES)
        return self.kv_row_width * self.num_hidden_layers * KV_DTYPE_BYTES[kv_dtype]

    @property
    def yarn_limit(self) -> int:
        """Longest context the rope scaling supports: factor x original, capped by max_position_embeddings."""
        rs = self.rope_scaling
        if rs.type == "yarn" and rs.original_max_position_embeddings:
            return min(int(rs.factor * rs.original_max_position_embeddings), self.max_position_embeddings)
        return self.max_position_embeddings

    def check_context(self, context: object, name: str = "context") -> int:
        """``context`` as a number of tokens this model can attend over: an integer in
        [1, yarn_limit]. The one rule every entry point applies (capacity, projection, notebooks)."""
        rs = self.rope_scaling
        why = (f"factor {rs.factor:g} x original {rs.original_max_position_embeddings:,}, capped by "
               f"max_position_embeddings {self.max_position_embeddings:,}" if rs.type == "yarn" else
               "max_position_embeddings")
        try:
            return check_int(name, context, lo=1, hi=self.yarn_limit)
        except InvalidParameter as e:
            raise InvalidParameter(name, context, f"{e.allowed} tokens ({self.name or self.model_type}'s "
                                                  f"YaRN limit: {why})") from None

    def check_tp(self, tp: object, name: str = "tp") -> int:
        """Tensor-parallel ranks: an integer that divides the attention heads (so at most the heads).
        The one rule every entry point applies (capacity, projection, notebooks)."""
        return check_divisor(name, tp, self.num_attention_heads,
                             f"the {self.num_attention_heads} attention heads of {self.name or self.model_type}")

    @property
    def mscale(self) -> float:
        """YaRN attention mscale, 0.1 * mscale_all_dim * ln(factor) + 1 (1 without YaRN)."""
        rs = self.rope_scaling
        if rs.type != "yarn" or rs.factor <= 1 or not rs.mscale_all_dim:
            return 1.0
        return 0.1 * rs.mscale_all_dim * math.log(rs.factor) + 1.0

    @property
    def softmax_scale(self) -> float:
        """mscale^2 / sqrt(qk_nope + qk_rope)."""
        return self.mscale**2 / math.sqrt(self.qk_head_dim)

    def is_moe_layer(self, layer: int) -> bool:
        return (self.n_routed_experts > 0 and layer >= self.first_k_dense_replace
                and layer % self.moe_layer_freq == 0)

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_hidden_layers))

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


def _rope(d: dict[str, Any]) -> tuple[float, RopeScaling]:
    params = d.get("rope_parameters")
    if params:  # transformers >= 5 form
        theta = float(params.get("rope_theta", d.get("rope_theta", 10000.0)))
        scaling = dict(params)
        kind = scaling.get("rope_type", scaling.get("type", "default"))
    else:
        theta = float(d.get("rope_theta", 10000.0))
        scaling = dict(d.get("rope_scaling") or {})
        kind = scaling.get("type", scaling.get("rope_type", "none")) if scaling else "none"
    if kind in ("default", None):
        kind = "none"
    if kind not in ("yarn", "none"):
        raise ValueError(f"unsupported rope scaling type {kind!r}; allowed: yarn, none")
    if kind == "none":
        return theta, RopeScaling()
    return theta, RopeScaling(
        type="yarn",
        factor=float(scaling.get("factor", 1.0)),
        original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        beta_fast=float(scaling.get("beta_fast", 32.0)),
        beta_slow=float(scaling.get("beta_slow", 1.0)),
        mscale=float(scaling.get("mscale", 1.0)),
        mscale_all_dim=float(scaling.get("mscale_all_dim", 0.0)),
    )


def _expert_quant(d: dict[str, Any]) -> Int4Quant | None:
    q = d.get("quantization_config")
    if not q or q.get("quant_method") != "compressed-tensors":
        return None
    if q.get("format") != "pack-quantized":
        raise ValueError(f"unsupported compressed-tensors format {q.get('format')!r}; allowed: pack-quantized")
    for group in (q.get("config_groups") or {}).values():
        w = group.get("weights") or {}
        if w.get("num_bits") != 4 or w.get("type", "int") != "int" or not w.get("symmetric", True):
            raise ValueError(f"unsupported expert quantization {w}; allowed: symmetric int4, group strategy")
        return Int4Quant(num_bits=4, group_size=int(w.get("group_size", 32)), symmetric=True)
    return None


def config_from_dict(raw: dict[str, Any], name: str | None = None) -> ModelConfig:
    """Build a :class:`ModelConfig` from a parsed config.json (wrapper or text model)."""
    d = raw
    if "text_config" in d and d.get("model_type") not in SUPPORTED_MODEL_TYPES:
        outer_quant = d.get("quantization_config")
        d = dict(d["text_config"])
        if outer_quant and "quantization_config" not in d:
            d["quantization_config"] = outer_quant
    mt = d.get("model_type")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"unsupported model_type {mt!r}; allowed: {', '.join(SUPPORTED_MODEL_TYPES)} "
                         f"(or a wrapper {', '.join(WRAPPER_MODEL_TYPES)} with a text_config)")
    theta, rs = _rope(d)
    try:
        return ModelConfig(
            model_type=mt,
            vocab_size=int(d["vocab_size"]),
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            moe_intermediate_size=int(d["moe_intermediate_size"]),
            num_hidden_layers=int(d["num_hidden_layers"]),
            num_attention_heads=int(d["num_attention_heads"]),
            n_shared_experts=int(d.get("n_shared_experts") or 0),
            n_routed_experts=int(d.get("n_routed_experts") or 0),
            num_experts_per_tok=int(d.get("num_experts_per_tok") or 0),
            routed_scaling_factor=float(d.get("routed_scaling_factor", 1.0)),
            kv_lora_rank=int(d["kv_lora_rank"]),
            q_lora_rank=None if d.get("q_lora_rank") is None else int(d["q_lora_rank"]),
            qk_rope_head_dim=int(d["qk_rope_head_dim"]),
            qk_nope_head_dim=int(d["qk_nope_head_dim"]),
            v_head_dim=int(d["v_head_dim"]),
            n_group=int(d.get("n_group") or 1),
            topk_group=int(d.get("topk_group") or 1),
            first_k_dense_replace=int(d.get("first_k_dense_replace", 0)),
            norm_topk_prob=bool(d.get("norm_topk_prob", True)),
            scoring_func=str(d.get("scoring_func", "sigmoid")),
            max_position_embeddings=int(d["max_position_embeddings"]),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=rs,
            rope_interleave=bool(d.get("rope_interleave", True)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            topk_method=str(d.get("topk_method", "noaux_tc")),
            moe_layer_freq=int(d.get("moe_layer_freq", 1)),
            expert_quant=_expert_quant(d),
            name=name,
        )
    except KeyError as e:
        raise ValueError(f"config.json lacks required key {e.args[0]!r}") from None


def available_models() -> list[str]:
    """Model names shipped under data/models/."""
    return sorted(p.parent.name for p in MODELS_DIR.glob("*/config.json"))


def load_config(model: str | Path) -> ModelConfig:
    """Load a config by shipped name (``kimi-k2.6``), directory, or config.json path."""
    p = Path(model)
    if p.is_dir():
        p = p / "config.json"
    elif not p.exists():
        named = MODELS_DIR / str(model) / "config.json"
        if not named.exists():
            raise InvalidParameter("model", str(model), "a shipped model (one of "
                                   + ", ".join(map(repr, available_models()))
                                   + ") or the path of a checkpoint directory or config.json")
        p = named
    return config_from_dict(json.loads(p.read_text()), name=p.parent.name)
