"""Paged latent KV cache: allocate/free, scattered and compacted commit, full pool."""
from __future__ import annotations

import pytest
import torch

from workbench.engine import KVPoolFull, PagedKVCache


def filled(cache: PagedKVCache, rid, n: int, seed: int) -> torch.Tensor:
    s = cache.allocate(rid, n)
    for layer in range(cache.num_layers):
        cache.write(layer, s, torch.randn(n, cache.row_width, generator=torch.Generator().manual_seed(seed + layer)))
    cache.append(rid, s)
    return s


def test_allocate_append_release():
    c = PagedKVCache(2, 10, row_width=6, dtype=torch.float32)
    c.add_request("a")
    c.add_request("b")
    sa = filled(c, "a", 3, 0)
    sb = filled(c, "b", 4, 10)
    assert c.free_slots == 3 and c.length("a") == 3 and c.length("b") == 4
    assert set(sa.tolist()).isdisjoint(sb.tolist())
    assert torch.equal(c.rows("a", 1), c.pool[1, sa])
    c.release("a")
    assert c.free_slots == 6 and "a" not in c.requests()
    with pytest.raises(KeyError):
        c.slots("a")
    with pytest.raises(ValueError, match="already has a slot table"):
        c.add_request("b")
    with pytest.raises(ValueError, match=r"rows must be \[2, 6\]"):
        c.write(0, sb[:2], torch.zeros(2, 5))


@pytest.mark.parametrize("mode", ["scattered", "compacted"])
def test_commit_modes(mode):
    c = PagedKVCache(3, 32, row_width=5, dtype=torch.float32)
    c.add_request(0)
    filled(c, 0, 4, 0)
    before = c.rows(0).clone()
    tail = c.allocate(0, 7)
    rows = torch.randn(3, 7, 5)
    for layer in range(3):
        c.write(layer, tail, rows[layer])
    accepted = [0, 2, 5]
    kept = c.commit(0, tail, accepted, mode=mode)
    assert c.length(0) == 7 and c.free_slots == 32 - 7
    assert torch.equal(c.rows(0)[:, :4], before)  # the prefix is untouched
    assert torch.equal(c.rows(0)[:, 4:], rows[:, accepted])  # accepted rows, in order, every layer
    if mode == "scattered":
        assert kept.tolist() == tail[accepted].tolist()
    else:
        assert kept.tolist() == tail[:3].tolist()
    with pytest.raises(ValueError, match="unknown commit mode"):
        c.commit(0, c.allocate(0, 2), [0], mode="bogus")


def test_full_pool_is_an_error_for_that_request_only():
    c = PagedKVCache(2, 12, row_width=4, dtype=torch.float32)
    c.add_request("a")
    c.add_request("b")
    sa = filled(c, "a", 5, 0)
    rows_a = c.rows("a").clone()
    filled(c, "b", 4, 7)
    with pytest.raises(KVPoolFull, match=r"request 'b' needs 4 slots, 3 of 12 are free"):
        c.allocate("b", 4)
    assert c.free_slots == 3  # nothing changed
    assert torch.equal(c.slots("a"), sa) and torch.equal(c.rows("a"), rows_a)
    c.release("b")
    assert c.free_slots == 7
    filled(c, "a", 7, 3)
    assert c.length("a") == 12 and torch.equal(c.rows("a")[:, :5], rows_a)
