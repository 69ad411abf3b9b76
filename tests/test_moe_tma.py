"""CPU tests of the producer / consumer one-launch kernel (moe_small_tma_w4 / _w8 / _w4o5 in workbench/kernels/moe_int4.cu;
not dispatched, selected with fused.set_small_variant): the host's view of its instances (warps, ring, shared
memory), its choice of splits, the task decoding of producer and consumers (every weight stage of every tile
streamed once, at the split-K kernel's addresses), and the mbarrier ring protocol (parities as the kernel
computes them) under random interleavings of one producer and CW consumers."""
import random
import re

import pytest

from workbench.kernels import KERNEL_DIR
from workbench.moe.fused import SMALL_VARIANTS, TMA_KERNELS, splitk_choice, splitk_splits, tma_shared_bytes

SRC = (KERNEL_DIR / "moe_int4.cu").read_text()
STAGE_BYTES = 2304       # one tile x 256 K: FR_STAGE_U4 uint4
H200_SMEM_PER_SM = 228 * 1024
STATIC_SMEM = 3328       # ptxas (nvcc 13.0, sm_90): the prologue's arrays, meta, mbarriers (at most)
REGS = {"moe_small_tma_w4": 94, "moe_small_tma_w8": 94, "moe_small_tma_w4o5": 72}   # ptxas, nvcc 13.0 sm_90


def instances() -> dict[str, tuple[int, int, int]]:
    return {f"moe_small_tma_{tag}": (int(cw), int(rs), int(minb))
            for tag, cw, rs, minb in re.findall(r"^MOE_TMA_INSTANCE\((\w+), (\d+), (\d+), (\d+)\)", SRC, re.M)}


def test_instances_match_the_host():
    inst = instances()
    assert set(inst) == set(TMA_KERNELS) == {SMALL_VARIANTS[v][0] for v in ("tma_w4", "tma_w8", "tma_w4o5")}
    for name, (cw, rs, minb) in inst.items():
        assert TMA_KERNELS[name] == (cw, rs)
        assert tma_shared_bytes(name) == rs * cw * STAGE_BYTES
        # the occupancy the launch bounds ask for fits in shared memory (1 KB reserved per CTA) and registers
        assert minb * (tma_shared_bytes(name) + STATIC_SMEM + 1024) <= H200_SMEM_PER_SM, name
        assert minb * 32 * (cw + 1) * REGS[name] <= 65536, name


@pytest.mark.parametrize("variant,grid,items,want", [
    ("tma_w4", 528, 8, (4, 2)), ("tma_w4", 528, 16, (2, 1)), ("tma_w4", 528, 31, (1, 1)),
    ("tma_w8", 264, 8, (4, 2)), ("tma_w8", 264, 16, (2, 1)), ("tma_w8", 264, 31, (1, 1)),
    ("tma_w4o5", 660, 8, (4, 2)), ("tma_w4o5", 660, 16, (2, 1)), ("tma_w4o5", 660, 31, (1, 1))])
def test_splits_kimi(variant, grid, items, want):
    """Tasks are CW tiles; want = 2 tasks per resident CTA: at M = 1 (8 items) on w4, gate_up 8 x 64 groups x 4 =
    2048 tasks of 7 stages, down 8 x 112 x 2 = 1792 of 4 stages."""
    assert splitk_splits(items, 7168, 2048, variant, grid) == want


def decode(task, t_gu, sgu, sdn, groups_gu, groups_dn, cw):
    """(phase, item, part, first tile) of a CTA task, as producer and consumers decode it."""
    if task < t_gu:
        per = sgu * groups_gu
        item, r = divmod(task, per)
        part, grp = divmod(r, groups_gu)
        return "gu", item, part, grp * cw
    per = sdn * groups_dn
    item, r = divmod(task - t_gu, per)
    part, grp = divmod(r, groups_dn)
    return "dn", item, part, grp * cw


@pytest.mark.parametrize("cw", [4, 8])
@pytest.mark.parametrize("h,i,nitems", [(1024, 1024, 3), (7168, 2048, 8)])
def test_tasks_stream_every_stage_of_every_tile_once(cw, h, i, nitems):
    tiles_gu, tiles_dn = i // 8, h // 16
    nsup_gu, nsup_dn = h // 256, i // 256
    groups_gu, groups_dn = tiles_gu // cw, tiles_dn // cw
    sgu = splitk_choice(nitems, groups_gu, nsup_gu, 4, 10**9)
    sdn = splitk_choice(nitems, groups_dn, nsup_dn, 2, 10**9)
    t_gu = nitems * sgu * groups_gu
    t_all = t_gu + nitems * sdn * groups_dn
    seen = {"gu": set(), "dn": set()}
    for task in range(t_all):
        phase, item, part, tile0 = decode(task, t_gu, sgu, sdn, groups_gu, groups_dn, cw)
        tiles, nsup, s = (tiles_gu, nsup_gu, sgu) if phase == "gu" else (tiles_dn, nsup_dn, sdn)
        nst = nsup // s
        ex = 100 + item   # any expert id: the address is linear in it
        src = ((ex * nsup + part * nst) * tiles + tile0) * STAGE_BYTES   # producer, bytes
        for j in range(nst):
            for w in range(cw):   # consumer warp w reads CW x 2304 bytes at w * 2304
                addr = src + j * tiles * STAGE_BYTES + w * STAGE_BYTES
                stage, tile = divmod(addr // STAGE_BYTES - ex * nsup * tiles, tiles)
                assert tile == tile0 + w and stage == part * nst + j
                key = (item, tile, stage)
                assert key not in seen[phase]
                seen[phase].add(key)
    assert len(seen["gu"]) == nitems * tiles_gu * nsup_gu and len(seen["dn"]) == nitems * tiles_dn * nsup_dn


class MBarrier:
    """A phase counter: completes a phase when `count` arrivals and every expected byte are in."""

    def __init__(self, count):
        self.count, self.phase, self.arrived, self.tx = count, 0, 0, 0

    def arrive(self, expect_tx=0):
        self.arrived += 1
        self.tx += expect_tx
        self._complete()

    def complete_tx(self, nbytes):
        self.tx -= nbytes
        self._complete()

    def _complete(self):
        if self.arrived == self.count and self.tx == 0:
            self.phase, self.arrived = self.phase + 1, 0

    def try_wait_parity(self, parity):
        return (self.phase & 1) != parity   # the phase of that parity has completed


@pytest.mark.parametrize("seed", range(20))
def test_ring_protocol_random_interleavings(seed):
    """One producer and CW consumers with the kernel's parities; copies land late and in any order. Every
    consumer sees every stage in order with the right contents, and no slot is refilled while read."""
    rng = random.Random(seed)
    cw, rs = rng.choice(sorted(TMA_KERNELS.values()))
    stages = rng.randint(1, 40)
    full = [MBarrier(1) for _ in range(rs)]
    empty = [MBarrier(cw) for _ in range(rs)]
    slot_data = [None] * rs
    readers = [set() for _ in range(rs)]
    in_flight = []   # (slot, value) copies issued, not landed
    prod_n = 0
    cons_n = [0] * cw
    cons_reading = [None] * cw   # slot being read
    got = [[] for _ in range(cw)]

    def producer_step():
        nonlocal prod_n
        if prod_n > stages:
            return False
        q = prod_n % rs
        if prod_n >= rs and not empty[q].try_wait_parity(((prod_n // rs) - 1) & 1):
            return False
        assert not readers[q], "slot refilled while a consumer reads it"
        if prod_n == stages:   # the end mark: plain arrive
            slot_data[q] = -1
            full[q].arrive()
        else:
            full[q].arrive(expect_tx=1)
            in_flight.append((q, prod_n))
        prod_n += 1
        return True

    def land_step():
        if not in_flight:
            return False
        q, v = in_flight.pop(rng.randrange(len(in_flight)))
        slot_data[q] = v
        full[q].complete_tx(1)
        return True

    def consumer_step(w):
        n = cons_n[w]
        q = n % rs
        if cons_reading[w] is None:
            if n > stages or not full[q].try_wait_parity((n // rs) & 1):
                return False
            if slot_data[q] == -1:
                cons_n[w] = stages + 1
                return True
            readers[q].add(w)
            cons_reading[w] = q
            got[w].append(slot_data[q])
            return True
        readers[q].discard(w)   # done reading: arrive on empty
        cons_reading[w] = None
        empty[q].arrive()
        cons_n[w] += 1
        return True

    for _ in range(100000):
        actors = [producer_step, land_step] + [lambda w=w: consumer_step(w) for w in range(cw)]
        rng.shuffle(actors)
        if not any(a() for a in actors):
            break
    assert all(g == list(range(stages)) for g in got), got
    assert all(n == stages + 1 for n in cons_n) and prod_n == stages + 1 and not in_flight
