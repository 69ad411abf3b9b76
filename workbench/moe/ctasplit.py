"""Host side and CPU model of the CTA-split one-launch kernel ``moe_small_ctasplit`` (moe_int4.cu).

Measured on the H200 (moe_small_ctasplit.json, code dda6540) and dispatched at M = 1 (``fused.SMALL_TABLE``).

A task of the kernel belongs to a CTA: (phase, item, group of 4 / s tiles); warp w computes tile
w // s of the group over K part w % s, and the s partial sums of a tile are added in shared memory
after one block barrier by the task's epilogue warp (warp j % 4 for the CTA's j-th task). Thread 0
grabs tasks from the global counter L + 1 ahead of the task being computed (a queue of 8 in shared
memory, published by each task's barrier), so every warp's ring of RS = 4 stages (3 in flight) runs on
into the next task's weights and never drains until the end.

:func:`ctasplit_splits` is the host's choice of s per phase; :func:`lookahead` the queue depth the
device computes; :func:`simulate_protocol` replays the kernel's task / queue / ring / barrier /
counter protocol for several CTAs of four warps under random interleavings (asynchronous ``cp.async``
completion included) and reports every violation it sees (a ring slot read before its stage landed or
overwritten before it was read, a queue entry read after it was overwritten, a partial-sum buffer
mixed between tasks, a down task reading h before its item is complete, a tile computed twice or
never, a counter not left at zero, a deadlock).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

RING_STAGES = 4          # CS_RS in moe_int4.cu
RING_AHEAD = RING_STAGES - 1
QUEUE = 8                # CS_Q
WARPS = 4
STAGE_K = 256            # K per ring stage
RULES = ("ring", "max")


def phase_split(stages: int, rule: str = "ring") -> int:
    """K parts per tile for a phase of ``stages`` 256-wide K stages.

    "ring": the largest s in (4, 2, 1) dividing ``stages`` with at least RING_AHEAD (3) stages per warp
    (so the ring looks at most one task ahead), else 1; "max": the largest s dividing ``stages``.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if stages < 1:
        raise ValueError(f"stages must be >= 1, got {stages}")
    for s in (4, 2, 1):
        if stages % s == 0 and (rule == "max" or stages // s >= RING_AHEAD):
            return s
    return 1


def ctasplit_splits(hidden: int, intermediate: int, rule: str | tuple[int, int] = "ring") -> tuple[int, int]:
    """(gate_up split, down split) of moe_small_ctasplit: gate_up streams K = hidden, down K = intermediate.

    Kimi K2.6 (7168, 2048): (4, 2), i.e. gate_up tasks of one tile with 7 stages per warp, down tasks of
    two tiles with 4 stages per warp. ``rule`` is "ring", "max" (:func:`phase_split`) or a fixed pair.
    """
    for name, v in (("hidden", hidden), ("intermediate", intermediate)):
        if v <= 0 or v % 512:
            raise ValueError(f"{name} must be a positive multiple of 512, got {v}")
    if isinstance(rule, tuple):   # fixed (gate_up split, down split), a tuning point
        for name, s, k in (("gate_up", rule[0], hidden), ("down", rule[1], intermediate)):
            if s not in (1, 2, 4) or (k // STAGE_K) % s:
                raise ValueError(f"{name} split must be 1, 2 or 4 and divide {k // STAGE_K} stages, got {s}")
        return int(rule[0]), int(rule[1])
    return phase_split(hidden // STAGE_K, rule), phase_split(intermediate // STAGE_K, rule)


def lookahead(hidden: int, intermediate: int, splits: tuple[int, int]) -> int:
    """Tasks the issuer may run ahead of the task being computed: ceil(RING_AHEAD / fewest stages per warp)."""
    spt = min(hidden // STAGE_K // splits[0], intermediate // STAGE_K // splits[1])
    return -(-RING_AHEAD // spt)


def task_counts(items: int, hidden: int, intermediate: int, splits: tuple[int, int]) -> tuple[int, int]:
    """(gate_up CTA tasks, down CTA tasks): items x tiles x s / 4 per phase (tiles: I/8 and H/16)."""
    return items * (intermediate // 8) * splits[0] // WARPS, items * (hidden // 16) * splits[1] // WARPS


# ----------------------------------------------------------------------------- protocol model

@dataclass
class _Cta:
    q: list                                   # (sequence number, task) per queue entry
    part: list                                # [buffer][warp] -> tag of the partial sums
    arrived: int = 0
    generation: int = 0
    warps_left: int = WARPS


@dataclass
class _Warp:
    cta: int
    w: int
    slots: list = field(default_factory=lambda: [None] * RING_STAGES)   # landed tag per slot, consumed flag
    pending: list = field(default_factory=list)                          # cp.async groups: [slot, tag, landed]


@dataclass
class ProtocolResult:
    errors: list[str]
    steps: int
    tasks: int
    finished: bool


def simulate_protocol(items: int, stages_gu: int, stages_dn: int, tiles_gu: int, tiles_dn: int,
                      splits: tuple[int, int], ctas: int, seed: int = 0, resident: int | None = None,
                      queue: int = QUEUE, part_buffers: int = 2, max_steps: int = 2_000_000) -> ProtocolResult:
    """Replay moe_small_ctasplit's protocol (not its arithmetic) for ``ctas`` CTAs of four warps.

    stages_gu / stages_dn: 256-K stages of each phase (H/256, I/256); tiles_gu / tiles_dn: I/8, H/16;
    splits: (s_gu, s_dn). ``resident``: CTAs running at once (default all; the others start when one
    exits). ``queue`` / ``part_buffers``: the kernel's 8 and 2 (smaller values are for tests that the
    model catches the resulting races). Each step runs one warp to its next shared or global action;
    cp.async groups land at random steps, in any order. Returns the violations seen.
    """
    rng = random.Random(seed)
    sgu, sdn = splits
    for s, st, tl in ((sgu, stages_gu, tiles_gu), (sdn, stages_dn, tiles_dn)):
        if s not in (1, 2, 4) or st % s or tl % (WARPS // s):
            raise ValueError(f"split {s} must be 1, 2 or 4, divide the stages ({st}) and 4/s divide the tiles ({tl})")
    groups_gu, groups_dn = tiles_gu * sgu // WARPS, tiles_dn * sdn // WARPS
    t_gu = items * groups_gu
    total = t_gu + items * groups_dn
    spt = min(stages_gu // sgu, stages_dn // sdn)
    L = -(-RING_AHEAD // spt)
    errors: list[str] = []
    g = {"ctr_task": 0, "ctr_fin": 0, "done_gu": [0] * max(items, 1), "done_dn": [0] * groups_dn}
    h_done: set = set()        # (item, tile) of gate_up whose h is stored and released
    y_done: set = set()        # (item, tile) of down whose Y is stored and released
    computed: dict = {}        # ("gu"|"dn", item, tile) -> times
    combined: dict = {}        # down group -> times
    nwarps_total = ctas * WARPS

    def decode(tn: int) -> tuple[bool, int, int, int]:
        gu = tn < t_gu
        s = sgu if gu else sdn
        groups = groups_gu if gu else groups_dn
        u = tn if gu else tn - t_gu
        return gu, s, u // groups, u % groups

    def tag_of(tn: int, w: int, k: int) -> tuple:
        gu, s, item, grp = decode(tn)
        return (tn, gu, item, grp * (WARPS // s) + w // s, w % s, k)

    def nper_of(tn: int) -> int:
        gu, s, _, _ = decode(tn)
        return (stages_gu if gu else stages_dn) // s

    ctas_state = [_Cta(q=[(-1, None)] * queue, part=[[None] * WARPS for _ in range(part_buffers)])
                  for _ in range(ctas)]

    def warp_prog(c: int, w: int, ws: _Warp):
        cta = ctas_state[c]
        # prologue: thread 0 grabs T_0 .. T_L; __syncthreads
        if w == 0:
            for n in range(L + 1):
                cta.q[n % queue] = (n, g["ctr_task"])
                g["ctr_task"] += 1
        yield from barrier(cta)

        def qread(n: int) -> int:
            seq, val = cta.q[n % queue]
            if seq != n:
                errors.append(f"cta {c} warp {w}: queue entry {n} read as entry {seq}")
            return val

        iss = {"iq": -1, "left": 0, "tn": None, "k": 0, "wslot": 0}

        def issue():
            if iss["left"] == 0:
                iss["iq"] += 1
                tn = qread(iss["iq"])
                iss["left"] = -1
                if tn is not None and tn < total:
                    iss["tn"], iss["k"], iss["left"] = tn, 0, nper_of(tn)
            tag = None
            if iss["left"] > 0:
                tag = tag_of(iss["tn"], w, iss["k"])
                iss["k"] += 1
                iss["left"] -= 1
            ws.pending.append([iss["wslot"], tag, False])
            iss["wslot"] = (iss["wslot"] + 1) % RING_STAGES

        for _ in range(RING_AHEAD):
            issue()
            yield
        ready = -1
        rslot = 0
        j = 0
        while True:
            tj = qread(j)
            yield
            if tj is None or tj >= total:
                break
            grab = None
            if w == 0:
                grab = g["ctr_task"]
                g["ctr_task"] += 1
                yield
            gu, s, item, grp = decode(tj)
            if not gu and item != ready:
                while g["done_gu"][item] < tiles_gu:
                    yield
                missing = [t for t in range(tiles_gu) if (item, t) not in h_done]
                if missing:
                    errors.append(f"down task {tj} read h of item {item} before tiles {missing[:4]} were stored")
                ready = item
            for k in range(nper_of(tj)):
                # cp.async.wait_group RS-2: every group but the newest RS-2 has landed
                while not all(p[2] for p in ws.pending[:max(0, len(ws.pending) - (RING_STAGES - 2))]):
                    yield
                while ws.pending and ws.pending[0][2]:   # forget the landed oldest groups
                    ws.pending.pop(0)
                yield                      # __syncwarp
                issue()
                yield
                want = tag_of(tj, w, k)
                got = ws.slots[rslot]
                if got is None or got[0] != want:
                    errors.append(f"cta {c} warp {w}: slot {rslot} holds {got and got[0]}, stage {want} expected")
                else:
                    ws.slots[rslot] = (got[0], True)   # consumed
                rslot = (rslot + 1) % RING_STAGES
                yield
            buf = cta.part[j % part_buffers]
            buf[w] = (j, tj, *tag_of(tj, w, 0)[3:5])
            if w == 0:
                cta.q[(j + L + 1) % queue] = (j + L + 1, grab)
            yield from barrier(cta)
            if w == j % WARPS:   # epilogue warp of task j
                ntile = WARPS // s
                for r in range(ntile):
                    for pp in range(s):
                        b = buf[r * s + pp]
                        if b is None or b[0] != j or b[2] != grp * ntile + r or b[3] != pp:
                            errors.append(f"cta {c} task {tj}: partial buffer entry {r * s + pp} holds {b}")
                    yield
                for r in range(ntile):
                    key = ("gu" if gu else "dn", item, grp * ntile + r)
                    computed[key] = computed.get(key, 0) + 1
                yield                       # fence
                if gu:
                    for r in range(ntile):
                        h_done.add((item, grp * ntile + r))
                    g["done_gu"][item] += ntile
                else:
                    for r in range(ntile):
                        y_done.add((item, grp * ntile + r))
                    old = g["done_dn"][grp]
                    g["done_dn"][grp] += 1
                    if old == items - 1:
                        yield
                        rows = [grp * ntile + r for r in range(ntile)]
                        miss = [(i, t) for i in range(items) for t in rows if (i, t) not in y_done]
                        if miss:
                            errors.append(f"group {grp} combined before Y of {miss[:4]}")
                        combined[grp] = combined.get(grp, 0) + 1
                        g["done_dn"][grp] = 0
                yield
            j += 1
        while any(not p[2] for p in ws.pending):   # cp.async.wait_group 0
            yield
        old = g["ctr_fin"]
        g["ctr_fin"] += 1
        if old == nwarps_total - 1:
            g["ctr_task"] = 0
            g["ctr_fin"] = 0
            g["done_gu"] = [0] * len(g["done_gu"])
        cta.warps_left -= 1

    def barrier(cta: _Cta):
        gen = cta.generation
        cta.arrived += 1
        if cta.arrived == WARPS:
            cta.arrived = 0
            cta.generation += 1
        while cta.generation == gen:
            yield

    running: list[tuple[_Warp, object]] = []
    started = 0
    limit = ctas if resident is None else max(1, min(resident, ctas))

    def start(c: int) -> None:
        for w in range(WARPS):
            ws = _Warp(c, w)
            running.append((ws, warp_prog(c, w, ws)))

    while started < limit:
        start(started)
        started += 1
    steps = 0
    while running and steps < max_steps:
        steps += 1
        ws, prog = running[rng.randrange(len(running))]
        # land a random pending cp.async group of a random running warp now and then
        if rng.random() < 0.5:
            ow, _ = running[rng.randrange(len(running))]
            open_groups = [p for p in ow.pending if not p[2]]
            if open_groups:
                p = rng.choice(open_groups)
                slot, tag = p[0], p[1]
                if tag is not None:
                    cur = ow.slots[slot]
                    if cur is not None and not cur[1]:
                        errors.append(f"cta {ow.cta} warp {ow.w}: stage {tag} landed on unread stage {cur[0]}")
                    ow.slots[slot] = (tag, False)
                p[2] = True
        try:
            next(prog)
        except StopIteration:
            running.remove((ws, prog))
            if ctas_state[ws.cta].warps_left == 0 and started < ctas:
                start(started)
                started += 1
        if len(errors) > 20:
            break
    finished = not running
    if not finished and len(errors) <= 20:
        errors.append(f"no progress after {steps} steps (deadlock or step limit)")
    if finished:
        want = {("gu", i, t) for i in range(items) for t in range(tiles_gu)} | \
               {("dn", i, t) for i in range(items) for t in range(tiles_dn)}
        bad = [k for k in want if computed.get(k, 0) != 1] + [k for k in computed if k not in want]
        if bad:
            errors.append(f"tiles not computed exactly once: {sorted(bad)[:4]}")
        if items and sorted(combined) != list(range(groups_dn)) or any(v != 1 for v in combined.values()):
            errors.append(f"down groups combined {combined}, want each of {groups_dn} once")
        if g["ctr_task"] or g["ctr_fin"] or any(g["done_gu"]) or any(g["done_dn"]):
            errors.append(f"counters not left zero: {g}")
    return ProtocolResult(errors=errors, steps=steps, tasks=total, finished=finished)
