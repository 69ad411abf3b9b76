"""The engine's KV cache: the latent pool, with slot table, lengths and free slots on the device.

:class:`DeviceKVCache` holds (page_size 1, one slot = one token in every layer):

- ``pool`` [layers, num_slots + 1, row_width]: latent rows; row ``num_slots`` is
  the spare row that padding rows and failed requests write to (never read).
- ``free`` int64 [num_slots + 1]: a stack, ``free[:top]`` are free slots (the
  last entry is a spare write target); ``top`` int64 [1].
- ``table`` int64 [rows, capacity]: each request row's committed slots in
  position order; ``lengths`` int64 [rows].

:meth:`allocate`, :meth:`commit_append` and :meth:`commit_tree` are tensor ops
with fixed shapes and no host synchronisation, so a CUDA graph captures them:
a row that cannot get its slots (pool empty, or its table full) gets ``ok =
False`` and the spare slot, and nothing of it is committed. Rows take slots in
row order, as :class:`~workbench.engine.kv_cache.PagedKVCache` serves requests
in order. :meth:`admit` (prefill) and :meth:`release` run between steps;
:meth:`admit` reads ``top`` on the host once.

Commit after a tree verify: ``scattered`` keeps the accepted nodes' slots
(``workbench.ddtree.commit_scattered``: the kept slots in path order and the
freed ones), ``compacted`` copies the accepted rows (every layer) to the first
``a`` tail slots of the request, as ``PagedKVCache.commit`` does: the tail
slots of a paged pool are not contiguous, so ``commit_compact`` (which writes
contiguous destination rows) does not apply and a gather and a scatter over
the pool do it.
"""
from __future__ import annotations

import torch

from workbench.ddtree import commit_scattered



class KVPoolFull(RuntimeError):
    """The KV pool has fewer free slots than a request asked for."""


class DeviceKVCache:
    """Pool, free stack, slot table and lengths on one device (module docstring)."""

    def __init__(self, num_layers: int, num_slots: int, rows: int, capacity: int, row_width: int = 576,
                 dtype: torch.dtype = torch.bfloat16, device: str | torch.device | None = None):
        for name, v in (("num_layers", num_layers), ("num_slots", num_slots), ("rows", rows),
                        ("capacity", capacity), ("row_width", row_width)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} is not allowed: an integer >= 1")
        dev = torch.device(device or "cpu")
        self.num_layers, self.num_slots, self.rows, self.capacity, self.row_width = (
            num_layers, num_slots, rows, capacity, row_width)
        self.pool = torch.zeros(num_layers, num_slots + 1, row_width, dtype=dtype, device=dev)
        self.free = torch.cat([torch.arange(num_slots - 1, -1, -1), torch.tensor([num_slots])]).to(dev)
        self.top = torch.full((1,), num_slots, dtype=torch.int64, device=dev)
        self.table = torch.full((rows, capacity), num_slots, dtype=torch.int64, device=dev)
        self.lengths = torch.zeros(rows, dtype=torch.int64, device=dev)
        self._cols = torch.arange(capacity, device=dev)

    @classmethod
    def for_model(cls, model, num_slots: int, rows: int, capacity: int) -> "DeviceKVCache":
        """A pool with ``model``'s layers and latent row width, in the model dtype."""
        return cls(len(model.layers), num_slots, rows, capacity, model.config.kv_row_width, model.dtype,
                   model.device)

    @property
    def device(self) -> torch.device:
        return self.pool.device

    @property
    def spare(self) -> int:
        """The slot id padding and failed rows write to."""
        return self.num_slots

    # -- between steps (host reads allowed) -------------------------------------
    def admit(self, row: int, n: int) -> torch.Tensor:
        """Give empty row ``row`` ``n`` committed slots (a prefill's); int64 [n]. One host read of ``top``."""
        if not 0 <= row < self.rows:
            raise ValueError(f"row={row} is not allowed: 0..{self.rows - 1}")
        if not 1 <= n <= self.capacity:
            raise ValueError(f"a prompt of {n} tokens does not fit the slot table (capacity {self.capacity})")
        top = int(self.top)
        if n > top:
            raise KVPoolFull(f"KV pool full: row {row} needs {n} slots, {top} of {self.num_slots} are free")
        slots = self.free[top - n:top].clone()
        self.top.sub_(n)
        self.table[row, :n] = slots
        self.table[row, n:] = self.spare
        self.lengths[row] = n
        return slots

    def release(self, row: int) -> None:
        """Return every committed slot of ``row`` to the free stack (device ops only)."""
        valid = self._cols < self.lengths[row]
        pos = torch.where(valid, self.top + self._cols, self.spare)
        self.free.scatter_(0, pos, torch.where(valid, self.table[row], self.spare))
        self.top.add_(self.lengths[row])
        self.lengths[row] = 0

    # -- inside the step (no host synchronisation) --------------------------------
    def allocate(self, active: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Pop ``n`` slots for each active row of the first ``C = active.shape[0]`` rows.

        active bool [C]. Returns slots int64 [C, n] (the spare slot where not ok) and ok bool [C].
        """
        C = active.shape[0]
        want = active & (self.lengths[:C] + n <= self.capacity)
        cum = torch.cumsum(want.long() * n, 0)
        ok = want & (cum <= self.top)
        idx = (self.top - cum)[:, None] + self._cols[:n]
        slots = torch.where(ok[:, None], self.free[idx.clamp(0, self.num_slots)], self.spare)
        self.top.sub_((ok.long() * n).sum())
        return slots, ok

    def _append(self, values: torch.Tensor, count: torch.Tensor) -> None:
        """table[b, lengths[b] + j] = values[b, j] for j < count[b]; lengths += count (count 0 where not ok)."""
        C, n = values.shape
        tab = self.table[:C]
        idx = (self.lengths[:C, None] + self._cols[:n]).clamp(max=self.capacity - 1)
        keep = self._cols[:n] < count[:, None]
        tab.scatter_(1, idx, torch.where(keep, values, tab.gather(1, idx)))
        self.lengths[:C] += count

    def _push(self, values: torch.Tensor, count: torch.Tensor) -> None:
        """Push values[b, :count[b]] of every row onto the free stack."""
        n = values.shape[1]
        off = torch.cumsum(count, 0) - count
        valid = self._cols[:n] < count[:, None]
        pos = torch.where(valid, self.top + off[:, None] + self._cols[:n], self.spare)
        self.free.scatter_(0, pos.reshape(-1), torch.where(valid, values, self.spare).reshape(-1))
        self.top.add_(count.sum())

    def commit_append(self, slots: torch.Tensor, ok: torch.Tensor) -> None:
        """Commit every allocated slot (greedy: slots [C, 1]) of the ok rows."""
        self._append(slots, ok.long() * slots.shape[1])

    def commit_tree(self, slots: torch.Tensor, accepted, ok: torch.Tensor, mode: str) -> torch.Tensor:
        """Commit a verified tree: slots int64 [C, n] (node i's slot), ``accepted`` a
        ``workbench.ddtree.GpuAccepted`` (nodes [C, n] root first, -1 padded; lengths [C]).
        Returns the committed count int64 [C] (0 where not ok)."""
        C, n = slots.shape
        a = accepted.lengths * ok.long()
        if mode == "scattered":
            keep, freed, nfree = commit_scattered(slots, accepted)
            self._append(keep, a)
            self._push(freed, nfree * ok.long())
        elif mode == "compacted":
            j = self._cols[:n]
            valid = j < a[:, None]
            src = torch.where(valid, slots.gather(1, accepted.nodes.clamp(min=0)), self.spare).reshape(-1)
            dst = torch.where(valid, slots, self.spare).reshape(-1)
            self.pool[:, dst] = self.pool[:, src]  # gathered first, then scattered: safe for overlaps
            self._append(slots, a)
            rest = slots.gather(1, (a[:, None] + j).clamp(max=n - 1))
            self._push(rest, (n - a) * ok.long())
        else:
            raise ValueError(f"commit={mode!r} is not allowed: one of 'scattered', 'compacted'")
        return a
