"""The engine: DeepSeek-V3 / Kimi K2.x in torch, a latent KV cache on the device, greedy and DDTree decoding.

Who owns what (lowest first):

- :mod:`~workbench.engine.model` (with :mod:`~workbench.engine.attention`, :mod:`~workbench.engine.moe`,
  :mod:`~workbench.engine.rope`, :mod:`~workbench.engine.step_ops`): the model and its forwards; it chooses its
  attention path. :mod:`~workbench.engine.loader` / :mod:`~workbench.engine.synthetic` build one.
- :mod:`~workbench.engine.kv_device`: the engine's KV cache (device slot table; it only stores).
- :mod:`~workbench.engine.drafters`: the drafter protocol, :class:`ScriptedDrafter`, :class:`DFlashDrafter`.
- :mod:`~workbench.engine.request`: :class:`Request` and :class:`StepRecord`, the one per-request record.
- :mod:`~workbench.engine.runner`: :class:`ModelRunner`, the device side: buckets, CUDA-graph capture and replay,
  the step bodies, a typed :class:`StepOutput`.
- :mod:`~workbench.engine.batch`: :class:`Batch`, the one request loop (schedule -> run -> postprocess).
- :mod:`~workbench.engine.decode_engine`: :class:`DecodeEngine` (``generate`` / ``start`` for a set of prompts).
- :mod:`~workbench.engine.generate` with :mod:`~workbench.engine.kv_cache`: the eager reference :func:`generate`
  over a host-side paged cache, which the tests compare the engine against.
"""
from workbench.engine.batch import Batch  # noqa: F401
from workbench.engine.decode_engine import DecodeEngine, Session  # noqa: F401
from workbench.engine.drafters import (  # noqa: F401
    DFlashConfig, DFlashDrafter, DraftInput, Drafter, ScriptedDrafter)
from workbench.engine.generate import generate  # noqa: F401
from workbench.engine.kv_cache import COMMIT_MODES, PagedKVCache  # noqa: F401
from workbench.engine.kv_device import DeviceKVCache, KVPoolFull  # noqa: F401
from workbench.engine.loader import load_model, quantize_experts_int4  # noqa: F401
from workbench.engine.model import DeepseekV3, Segment  # noqa: F401
from workbench.engine.request import Request, StepRecord  # noqa: F401
from workbench.engine.runner import ModelRunner, StepOutput  # noqa: F401
from workbench.engine.synthetic import synthetic_model, tiny_config  # noqa: F401

__all__ = ["Batch", "COMMIT_MODES", "DFlashConfig", "DFlashDrafter", "DecodeEngine", "DeepseekV3",
           "DeviceKVCache", "DraftInput", "Drafter", "KVPoolFull", "ModelRunner", "PagedKVCache", "Request",
           "ScriptedDrafter", "Segment", "Session", "StepOutput", "StepRecord", "generate", "load_model",
           "quantize_experts_int4", "synthetic_model", "tiny_config"]
