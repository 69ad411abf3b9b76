"""The engine: DeepSeek-V3 / Kimi K2.x in torch, a paged latent KV cache, greedy and DDTree generation.

Public API: :func:`load_model`, :func:`quantize_experts_int4`, :func:`generate` (the eager
reference), :class:`DecodeEngine` (the batched step, replayed as CUDA graphs; :class:`DeviceKVCache`),
:class:`ScriptedDrafter`, :class:`DFlashDrafter` (with :class:`DFlashConfig`),
:func:`synthetic_model`, :class:`PagedKVCache` (and :class:`KVPoolFull`).
"""
from workbench.engine.kv_cache import COMMIT_MODES, KVPoolFull, PagedKVCache  # noqa: F401
from workbench.engine.loader import load_model, quantize_experts_int4  # noqa: F401
from workbench.engine.model import DeepseekV3, Segment  # noqa: F401
from workbench.engine.drafters import (  # noqa: F401
    DFlashConfig, DFlashDrafter, DraftInput, Drafter, ScriptedDrafter)
from workbench.engine.generate import GenerationResult, StepRecord, generate  # noqa: F401
from workbench.engine.synthetic import synthetic_model, tiny_config  # noqa: F401
from workbench.engine.kv_device import DeviceKVCache  # noqa: F401
from workbench.engine.step import DecodeEngine  # noqa: F401

__all__ = ["COMMIT_MODES", "DFlashConfig", "DFlashDrafter", "DecodeEngine", "DeepseekV3",
           "DeviceKVCache", "DraftInput", "Drafter",
           "GenerationResult", "KVPoolFull", "PagedKVCache", "ScriptedDrafter", "Segment", "StepRecord",
           "generate", "load_model", "quantize_experts_int4", "synthetic_model", "tiny_config"]
