"""The eager reference's paged latent KV cache (page_size 1, slot tables on the host).

The engine's own cache is :class:`~workbench.engine.kv_device.DeviceKVCache` (the same pool layout with the slot
table, lengths and free stack on the device, so a captured step can allocate and commit); this one is what
:func:`workbench.engine.generate.generate`, the reference the engine is tested against, and the prefill's
:meth:`~workbench.engine.model.DeepseekV3.forward_batch` write through.

The pool holds ``[layers, num_slots, kv_lora_rank + qk_rope_head_dim]`` values
(576 per layer per token for DeepSeek-V3 / K2.x). A slot is one token of one
request in every layer. Each request owns a slot table (int64, in position
order); slots need not be contiguous, which is what DDTree's scattered commit
needs: the accepted tree nodes keep the slots they were verified in.

Commit modes after a verify over ``tail_slots`` (one slot per tree node):

- ``scattered``: the accepted nodes' slots join the request's table; the other
  tail slots go back to the free list. No KV is moved.
- ``compacted``: the accepted nodes' rows are copied (every layer) to the first
  ``a`` tail slots, in acceptance order, which join the table; the rest is freed.

A full pool raises :class:`KVPoolFull` for the request that asked, before
anything changes: every other request's slots and rows stay intact.
"""
from __future__ import annotations

import torch

from workbench.decode import COMMIT_MODES
from workbench.engine.kv_device import KVPoolFull



class PagedKVCache:
    """Pool of latent rows, page_size 1, with per-request slot tables.

    num_layers, num_slots, row_width (kv_lora_rank + qk_rope_head_dim); ``pool`` is a tensor
    [num_layers, num_slots, row_width] of ``dtype`` on ``device``.
    """

    def __init__(self, num_layers: int, num_slots: int, row_width: int = 576,
                 dtype: torch.dtype = torch.bfloat16, device: str | torch.device | None = None):
        if num_layers < 1 or num_slots < 1 or row_width < 1:
            raise ValueError(f"num_layers, num_slots and row_width must be >= 1, got "
                             f"{num_layers}, {num_slots}, {row_width}")
        self.num_layers, self.num_slots, self.row_width = num_layers, num_slots, row_width
        self.pool = torch.zeros(num_layers, num_slots, row_width, dtype=dtype, device=device)
        self._free: list[int] = list(range(num_slots - 1, -1, -1))  # pop() hands out low slots first
        self._tables: dict[object, torch.Tensor] = {}
        self._pending: dict[object, list[torch.Tensor]] = {}

    @classmethod
    def for_model(cls, model, num_slots: int, dtype: torch.dtype | None = None) -> "PagedKVCache":
        """A pool sized for ``model`` (its layers and latent row width), in the model dtype by default."""
        c = model.config
        return cls(len(model.layers), num_slots, c.kv_row_width, dtype or model.dtype, model.device)

    # -- bookkeeping ------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.pool.device

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def bytes_per_slot(self) -> int:
        return self.num_layers * self.row_width * self.pool.element_size()

    def requests(self) -> list:
        return list(self._tables)

    def add_request(self, rid) -> None:
        if rid in self._tables:
            raise ValueError(f"request {rid!r} already has a slot table")
        self._tables[rid] = torch.zeros(0, dtype=torch.int64, device=self.device)
        self._pending[rid] = []

    def _check(self, rid) -> None:
        if rid not in self._tables:
            raise KeyError(f"unknown request {rid!r}; add_request first")

    def slots(self, rid) -> torch.Tensor:
        """int64 [length]: the request's committed slots in position order."""
        self._check(rid)
        return self._tables[rid]

    def length(self, rid) -> int:
        self._check(rid)
        return int(self._tables[rid].shape[0])

    def allocate(self, rid, n: int) -> torch.Tensor:
        """Reserve ``n`` free slots for request ``rid`` (pending until commit/append). int64 [n]."""
        self._check(rid)
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of slots ({n})")
        if n > len(self._free):
            raise KVPoolFull(f"KV pool full: request {rid!r} needs {n} slots, {len(self._free)} of "
                             f"{self.num_slots} are free ({self.length(rid)} held by this request, "
                             f"{len(self._tables)} requests in the pool)")
        out = self._free[len(self._free) - n:][::-1]
        del self._free[len(self._free) - n:]
        t = torch.tensor(out, dtype=torch.int64, device=self.device)
        self._pending[rid].append(t)
        return t

    def _unpend(self, rid, slots: torch.Tensor) -> None:
        pend = self._pending[rid]
        for i, p in enumerate(pend):
            if p is slots:
                del pend[i]
                return
        raise ValueError("these slots were not allocated to this request (or were committed already)")

    def free(self, slots: torch.Tensor | list[int]) -> None:
        """Return slots to the free list (they must not be in any table)."""
        s = slots.tolist() if isinstance(slots, torch.Tensor) else list(slots)
        self._free.extend(reversed(s))

    def append(self, rid, slots: torch.Tensor) -> None:
        """Commit all of ``slots`` (from :meth:`allocate`) to the end of the request's table."""
        self._unpend(rid, slots)
        self._tables[rid] = torch.cat([self._tables[rid], slots])

    def commit(self, rid, tail_slots: torch.Tensor, accepted: torch.Tensor | list[int],
               mode: str = "scattered") -> torch.Tensor:
        """Keep the accepted tail nodes (indices into ``tail_slots``, root first, increasing), free the rest.

        Returns the slots appended to the table (int64 [a]).
        """
        if mode not in COMMIT_MODES:
            raise ValueError(f"unknown commit mode {mode!r}; allowed: {', '.join(COMMIT_MODES)}")
        self._unpend(rid, tail_slots)
        acc = torch.as_tensor(accepted, dtype=torch.int64).to(tail_slots.device)
        T = tail_slots.shape[0]
        if acc.numel() and (int(acc.min()) < 0 or int(acc.max()) >= T):
            raise ValueError(f"accepted indices must lie in [0, {T}), got {acc.tolist()}")
        keep = torch.zeros(T, dtype=torch.bool, device=tail_slots.device)
        keep[acc] = True
        if mode == "scattered":
            kept = tail_slots[acc]
            dropped = tail_slots[~keep]
        else:
            a = acc.numel()
            kept = tail_slots[:a]
            src = tail_slots[acc]
            self.pool[:, kept] = self.pool[:, src]  # gather first, then scatter: safe for overlaps
            dropped = tail_slots[a:]
        self._tables[rid] = torch.cat([self._tables[rid], kept])
        self.free(dropped)
        return kept

    def release(self, rid) -> None:
        """Free every slot of the request (committed and pending) and forget it."""
        self._check(rid)
        self.free(self._tables.pop(rid))
        for p in self._pending.pop(rid):
            self.free(p)

    def write(self, layer: int, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """pool[layer, slots] = rows ([n, row_width])."""
        if rows.shape != (slots.shape[0], self.row_width):
            raise ValueError(f"rows must be [{slots.shape[0]}, {self.row_width}], got {tuple(rows.shape)}")
        self.pool[layer, slots] = rows.to(self.pool.dtype)

    def rows(self, rid, layer: int | None = None) -> torch.Tensor:
        """The request's committed rows in position order: [length, row_width] (one layer) or [layers, length, row]."""
        s = self.slots(rid)
        return self.pool[:, s] if layer is None else self.pool[layer, s]
