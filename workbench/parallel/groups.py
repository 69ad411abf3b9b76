"""Tensor-parallel process group: the launch environment, start-up and the collectives the engine uses.

One process per rank (``torchrun --nproc-per-node N``, or :func:`workbench.parallel.launch.torchrun`).
:func:`init_from_env` reads torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` / ``MASTER_PORT``), applies :data:`ENV` and starts ``torch.distributed`` with NCCL
on CUDA (one GPU per rank, ``cuda:LOCAL_RANK``) or gloo on the CPU.

:data:`ENV` is the one place that sets the environment of everything this package starts: NVLink
multicast (NVLS) off in NCCL, PyTorch symmetric memory and NVSHMEM. The shared machines this runs
on require it (a program that uses multicast can take the host's GPUs out of service); the
engine's all-reduces are ordinary NCCL ring / tree all-reduces.

:class:`TPGroup` is what the model holds: ``rank``, ``size``, the ``torch.distributed`` group and
the collectives, each a no-op at size 1 (so a ``TPGroup.single()`` model runs the single-device
code path exactly):

- :meth:`TPGroup.all_reduce`: sum in place (the row-parallel outputs: attention's ``o_proj``, the
  MLP / MoE down projections); on CUDA an NCCL all-reduce, captured inside the engine step's CUDA
  graph like any kernel (the step's first run of a bucket is eager, which starts the communicator).
- :meth:`TPGroup.argmax`: the vocabulary-parallel argmax (:func:`pack_argmax`): ONE int64
  all-reduce (MAX) of N values; equal to ``torch.argmax`` of the full float32 logits, ties broken
  toward the lower token id.
- :meth:`TPGroup.all_gather_last`: shards concatenated along the last dimension (full logits for
  checks and the naive prefill; not on the engine step's path).

``trace``: when a list, every collective appends ``(name, shape, dtype)``; the benchmark replays
the recorded list alone to measure the all-reduce time of a step.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import sys
from types import MappingProxyType
from typing import Any

import torch
import torch.distributed as dist

from workbench.validation import check_choice, check_int

ENV = MappingProxyType({
    "NCCL_NVLS_ENABLE": "0",                  # NCCL: no NVLink SHARP / multicast all-reduce
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",  # PyTorch symmetric memory: no multicast objects
    "NVSHMEM_DISABLE_NVLS": "1",              # NVSHMEM: no NVLS
})

BACKENDS = ("auto", "nccl", "gloo")


def apply_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Set every :data:`ENV` variable in ``environ`` (default ``os.environ``), overriding what was there;
    returns the values set. Called by :func:`init_from_env` and by the launchers before any child starts."""
    env = os.environ if environ is None else environ
    env.update(ENV)
    return dict(ENV)


def env_record() -> dict[str, str | None]:
    """The :data:`ENV` variables as this process sees them (for a measurement's provenance)."""
    return {k: os.environ.get(k) for k in ENV}


# ----------------------------------------------------------------------------- argmax across vocabulary shards

_LOW = (1 << 32) - 1


def value_keys(values: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """float32 logits and their token ids (int64, same shape) -> int64 keys whose integer order is (value, then
    lower id first): (order-preserving int32 of the float32 bits) << 32 | (vocab - 1 - id). -0.0 counts as +0.0,
    as in float comparison; finite values (a NaN is not ordered as ``torch.argmax`` orders it)."""
    if values.dtype != torch.float32:
        raise ValueError(f"argmax keys need float32 logits, got {values.dtype}")
    if vocab >= 1 << 31:
        raise ValueError(f"vocab {vocab} does not fit the 31-bit id field of the argmax key")
    bits = (values + 0.0).view(torch.int32)  # + 0.0: -0.0 -> +0.0
    order = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)
    return (order << 32) | (vocab - 1 - ids)


def pack_argmax(shard: torch.Tensor, offset: int, vocab: int) -> torch.Tensor:
    """Each row's largest logit of a vocabulary shard and its token id as ONE :func:`value_keys` key: float32
    ``shard`` [N, V_local] holding token ids ``offset .. offset + V_local - 1`` of a ``vocab``-token vocabulary
    -> int64 [N]. The max over ranks of the keys (:func:`unpack_argmax`) is the full row's ``torch.argmax``:
    the largest value, on a tie the lowest id (torch.argmax takes the first)."""
    local = shard.argmax(-1)
    return value_keys(shard.gather(-1, local.unsqueeze(-1)).squeeze(-1), local + offset, vocab)


def unpack_argmax(key: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 keys of :func:`pack_argmax` -> (token ids int64 [N], their float32 logits [N])."""
    ids = vocab - 1 - (key & _LOW)
    order = (key >> 32).to(torch.int32)
    bits = torch.where(order < 0, order ^ 0x7FFFFFFF, order)
    return ids, bits.view(torch.float32)


# ----------------------------------------------------------------------------- the group

@dataclasses.dataclass(eq=False)
class TPGroup:
    """Rank ``rank`` of ``size`` tensor-parallel ranks. ``group``: the ``torch.distributed`` process group
    (None at size 1, or for a *layout-only* group: weights can be sharded for it, collectives raise)."""

    rank: int
    size: int
    group: Any = None
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None
    trace: list | None = None

    def __post_init__(self):
        check_int("tp", self.size, lo=1)
        check_int("rank", self.rank, lo=0, hi=self.size - 1)
        self.device = torch.device(self.device)

    @classmethod
    def single(cls, device: str | torch.device = "cpu") -> "TPGroup":
        """One rank: every collective is the identity (the single-device engine, exactly)."""
        return cls(0, 1, None, torch.device(device))

    @classmethod
    def layout(cls, rank: int, size: int, device: str | torch.device = "cpu") -> "TPGroup":
        """Rank ``rank`` of ``size`` without a process group: to build or check a rank's shard in one process."""
        return cls(rank, size, None, torch.device(device))

    def _check(self, name: str, t: torch.Tensor) -> bool:
        """True when the collective must run (size > 1); records it in ``trace``."""
        if self.size == 1:
            return False
        if self.group is None:
            raise RuntimeError(f"TPGroup(rank={self.rank}, size={self.size}) is layout-only (no process group): "
                               f"{name} needs torch.distributed (init_from_env)")
        if self.trace is not None:
            self.trace.append((name, tuple(t.shape), t.dtype))
        return True

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over the ranks in place (any shape, the model dtype); returns ``t``."""
        if self._check("all_reduce", t):
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return t

    def argmax(self, shard: torch.Tensor, offset: int, vocab: int) -> torch.Tensor:
        """Token ids int64 [N] of the largest logits of the full rows whose float32 shard [N, V_local] (ids
        ``offset ..``) this rank holds; ties toward the lower id (:func:`pack_argmax`). One all-reduce (MAX)."""
        if self.size == 1:
            return shard.argmax(-1)
        key = pack_argmax(shard, offset, vocab)
        if self._check("all_reduce_max", key):
            dist.all_reduce(key, op=dist.ReduceOp.MAX, group=self.group)
        return unpack_argmax(key, vocab)[0]

    def all_gather_last(self, shard: torch.Tensor) -> torch.Tensor:
        """The ranks' shards [..., n] concatenated in rank order along the last dimension -> [..., size x n]."""
        if not self._check("all_gather", shard):
            return shard

        flat = shard.reshape(1, -1).contiguous()
        out = flat.new_empty((self.size, flat.shape[1]))   # the concatenation form (gloo takes no other)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # the name since 2.13
        gather(out, flat, group=self.group)
        return out.view(self.size, *shard.shape).movedim(0, -2).reshape(*shard.shape[:-1], -1)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, in rank order (host-side; checks and reports only)."""
        if self.size == 1:
            return [obj]
        self._check("all_gather_object", torch.empty(0))

        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        if self.size > 1 and self.group is not None:
            dist.barrier(group=self.group)


def init_from_env(backend: str = "auto", timeout_s: float = 300.0) -> TPGroup:
    """Start (or join) the default process group from torchrun's environment and return this rank's
    :class:`TPGroup`. ``backend``: ``"nccl"`` (CUDA; device ``cuda:LOCAL_RANK``), ``"gloo"`` (CPU) or
    ``"auto"`` (NCCL when CUDA is available). :data:`ENV` is applied first. Without ``WORLD_SIZE`` in the
    environment (not launched by torchrun) a single-rank group is returned and nothing is started."""
    check_choice("backend", backend, BACKENDS)
    apply_env()
    if "WORLD_SIZE" not in os.environ:
        dev = "cuda" if backend != "gloo" and torch.cuda.is_available() else "cpu"
        return TPGroup.single(dev)
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    local = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ValueError("backend='nccl' needs CUDA; use 'gloo' on the CPU")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        kw = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kw)
    return TPGroup(dist.get_rank(), dist.get_world_size(), dist.group.WORLD, device, backend)


def shutdown() -> None:
    """Destroy the default process group if this process started one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def exit_rank(code: int) -> None:
    """End a rank's process with ``code`` after :func:`shutdown`: flush Python's streams, then ``os._exit``. The
    interpreter's own exit runs C++ static destructors, and under load (CI's 2 cores) a gloo worker thread's
    teardown there has aborted the process (SIGABRT, "terminate called without an active exception") after the
    work had finished and its results were written; nothing is left to clean up by then."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
