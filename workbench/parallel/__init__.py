"""Tensor parallelism for the engine: one process per GPU over torch.distributed (NCCL; gloo on the CPU).

- :mod:`workbench.parallel.groups`: the launch environment (:data:`~workbench.parallel.groups.ENV`:
  NVLink multicast off), :func:`init_from_env` and :class:`TPGroup` (all-reduce, the
  vocabulary-parallel argmax, all-gather);
- :mod:`workbench.parallel.layers`: how each weight is split (attention by heads with the MLA latent
  KV replicated on every rank, dense MLP and shared experts by columns / rows, routed experts by
  expert, lm_head by vocabulary) and the layers that hold the splits;
- :mod:`workbench.parallel.model`: :class:`TensorParallelDeepseekV3` (the engine's ``generate`` and
  ``DecodeEngine`` run on it unchanged on every rank), :func:`shard_model`, :func:`synthetic_tp_model`;
- :mod:`workbench.parallel.parity`: TP = N against TP = 1 (logits, greedy and DDTree tokens);
- :mod:`workbench.parallel.launch`: torchrun with :data:`~workbench.parallel.groups.ENV` set
  (``workbench tp``).

The 8-GPU benchmark is :mod:`workbench.bench.engine_tp`; the design and what ran are in
``papers/tensor_parallel.md``.
"""
from workbench.parallel.groups import ENV, TPGroup, apply_env, init_from_env  # noqa: F401
from workbench.parallel.layers import check_tp_config, shard_dim, shard_tensor  # noqa: F401
from workbench.parallel.model import (TensorParallelDeepseekV3, build_empty_tp, shard_model,  # noqa: F401
                                      synthetic_tp_model)

__all__ = ["ENV", "TPGroup", "TensorParallelDeepseekV3", "apply_env", "build_empty_tp", "check_tp_config",
           "init_from_env", "shard_dim", "shard_model", "shard_tensor", "synthetic_tp_model"]
