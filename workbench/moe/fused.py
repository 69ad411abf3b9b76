"""Fused INT4 (W4A16) routed-expert MoE: ``fused_moe_int4``.

On a CUDA tensor (with CuPy present) this runs workbench/kernels/moe_int4.cu.
Up to :data:`SMALL_MAX_PAIRS` (token, expert) pairs (M <= 16 at top-8), where
:data:`SMALL_TABLE` says so (M = 1-16 on the H200), it is one persistent
launch or launch pair, the kernel that table names for M (:data:`SMALL_VARIANTS`; on the H200 at M = 1-16 the phased
form: a gate/up launch and a down launch with the sum over k, the second under programmatic dependent launch, at
M = 1 ``phased_r2_pdl`` (two-stage weight rings in both launches), at M = 3-16 ``phased_r3_pdl_gu2`` (a two-stage ring
in the gate/up launch), and at M = 2 ``phased_r3_pdl_k4``, whose gate/up tasks split K over a CTA's four warps; the
one-launch CTA-split and warp-split kernels remain as variants): grouping, gate/up with SiLU,
down and the sum over k without the four-launch path's align and combine kernels, weights in the fragment layout of
:meth:`Int4Experts.fragments`,
made once and cached: a second copy of the routed experts, as many bytes as
the compressed-tensors packing, so a full model pays its expert memory twice;
``set_small_path(False)`` keeps only the four-launch path and no copy). Otherwise four launches:
an alignment kernel groups the (token, k) pairs by expert on the GPU (no host
synchronisation), a gate/up kernel with SiLU(gate)*up fused, a down kernel,
and a fixed-order combine over k. Each touched expert's weights are streamed
once per call for every chunk of up to ``8 * NT`` of its tokens (NT = 1, 2
or 4, chosen from M by :data:`KERNEL_TABLE`). Elsewhere it runs :func:`workbench.moe.reference.moe_reference`
and rounds to bf16.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from workbench.kernels import gpu_available, launch, launch_dependent, load_module
from workbench.moe.ctasplit import ctasplit_splits
from workbench.moe.packing import Int4Experts
from workbench.moe.reference import check_ids_range, check_moe_inputs, moe_reference

FAMILY = "moe_int4"
MAX_EXPERTS = 1024
THREADS = 128
SMALL_MAX_PAIRS = 128   # moe_small_fused: one thread per (token, expert) pair in its prologue
SMALL_PATH = {"enabled": True}   # the benchmark switches it off to time the four-launch path at small M
# Kernels of the one-launch path: name -> (kernel, (max gate_up split, max down split, tasks wanted per phase
# per resident warp)) or None for no split (moe_small_fused, version 3).
# The split-K forms (moe_int4.cu, moe_small_splitk_s<RS>, RS ring stages) pick each phase's split on the
# device (splitk_choice); "_max" always takes the largest split (a control at M >= 4).
# The CTA-split form (moe_small_ctasplit) takes ("cta", rule): the four warps of a CTA share each task's tiles
# and K range (workbench/moe/ctasplit.py: ctasplit_splits; rule "ring", "max" or a fixed (gate_up, down) pair).
SMALL_VARIANTS: dict[str, tuple[str, tuple | None]] = {
    "v3": ("moe_small_fused", None),
    "splitk_s3": ("moe_small_splitk_s3", (4, 2, 2)),
    "splitk_s4": ("moe_small_splitk_s4", (4, 2, 2)),
    "splitk_s3_max": ("moe_small_splitk_s3", (4, 4, 1 << 20)),
    # activations 4 steps of 64 K ahead instead of 2 (moe_small_xprefetch*.json; the 4-CTA-per-SM forms timed
    # there, splitk_s4x4_b4 and splitk_s4x2_b4, were slower and are removed)
    "splitk_s4x4": ("moe_small_splitk_s4x4_b5", (4, 2, 2)),
    "ctasplit_x4": ("moe_small_ctasplit_x4", ("cta", "ring")),
    # the x4 kernel at the fixed splits that were best for the CTA-split kernel at M = 2 and M >= 4 in the split
    # sweep (moe_small_ctasplit_splits.json); timed in moe_small_x4_splits*.json (g1d1 dispatched at M = 5-16)
    "ctasplit_x4_g2d1": ("moe_small_ctasplit_x4", ("cta", (2, 1))),
    "ctasplit_x4_g1d1": ("moe_small_ctasplit_x4", ("cta", (1, 1))),
    # the x4 kernels with the next stage's activations loaded after the stage's last step into the same registers
    # (no buffer-rotation moves waiting for the loads: moe_profile_8c7598f); timed in moe_small_xend*.json, dispatched
    "splitk_s4x4e": ("moe_small_splitk_s4x4e_b5", (4, 2, 2)),
    "ctasplit_x4e": ("moe_small_ctasplit_x4e", ("cta", "ring")),
    "ctasplit_x4e_g1d1": ("moe_small_ctasplit_x4e", ("cta", (1, 1))),
    # its other fixed splits (host-side; the split sweep of run 17, moe_small_xend_splits*.json: g4d1 runs at M = 2)
    **{f"ctasplit_x4e_g{a}d{b}": ("moe_small_ctasplit_x4e", ("cta", (a, b))) for a, b in ((2, 1), (4, 1), (2, 2))},
    # x4e with a 3-stage ring (two stages in flight instead of three): the control of run 19 (moe_small_xs*.json),
    # where it was at or ahead of x4e in most rows; its forms at the dispatched splits (moe_small_r3*.json)
    # ... and with one fence per publish and acquire loads for the h waits (x4e_r3f; moe_small_r3f*.json)
    # ... and with the h wait spinning on relaxed loads, then one acquire (x4e_r3fs; run 22, moe_small_r3fs*.json)
    # ... and with each CTA's first tasks static, no atomics before the first weight issue (x4e_r3fst; run 23)
    # ... and with one more static task per CTA, so the first counter grab is at task 1 (x4e_r3fstd; run 27c)
    **{f"ctasplit_x4e_{k}{sfx}": (f"moe_small_ctasplit_x4e_{k}", ("cta", sp))
       for k in ("r3", "r3f", "r3fs", "r3fst", "r3fstd")
       for sfx, sp in (("", "ring"), ("_g4d1", (4, 1)), ("_g2d1", (2, 1)), ("_g1d1", (1, 1)))},
    # the warp-split form (run 25): every warp on its own, units of one K part of one tile, split-K partials reduced
    # by the last part to arrive; ("ws", rule, ring stages); "wsplit_r3" takes ctasplit_splits' "ring" rule
    **{f"wsplit_r{rs}{sfx}": (f"moe_small_wsplit_r{rs}", ("ws", sp, rs)) for rs in (3, 4)
       for sfx, sp in (("", "ring"), ("_g4d1", (4, 1)), ("_g2d1", (2, 1)), ("_g1d1", (1, 1)))},
    # (run 26's x4e_r3nb, the CTA-split kernel without its block barrier, was slower everywhere: reverted, in git
    # history at a62ea3b; moe_small_nb*.json)
    # the phased form (run 28): two launches (gate/up, then down with the sum over k per tile), whole-K tiles, no
    # counters, fences or atomics; ("ph", ring stages); the down kernel is the name with "_gu_" -> "_dn_"
    **{f"phased_r{rs}": (f"moe_small_phased_gu_r{rs}", ("ph", rs)) for rs in (3, 4)},
    # ... with the down launch under programmatic dependent launch (kernels.launch_dependent): its CTAs start while
    # gate/up runs, group the pairs and issue their first weight stages, then wait for gate/up's h
    "phased_r3_pdl": ("moe_small_phased_gu_r3p", ("ph", 3, "pdl")),
    # ... with the gate/up tasks split in K over a CTA's four warps, the parts added in shared memory (run 29f; "k4":
    # one task per CTA, grid min(resident CTAs, tasks); not bit-identical to version 3)
    "phased_r3_pdl_k4": ("moe_small_phased_gu_r3p_k4", ("ph", 3, "pdl", "k4")),
    # run 33: two-stage rings (one stage in flight while one is computed) in both launches (dispatched at M = 1), in
    # the down launch only, in the gate/up launch only (dispatched at M = 3-16); bit-identical to version 3
    "phased_r2_pdl": ("moe_small_phased_gu_r2p", ("ph", 2, "pdl")),
    "phased_r3_pdl_dn2": ("moe_small_phased_gu_r3p_dn2", ("ph", 3, "pdl")),
    "phased_r3_pdl_gu2": ("moe_small_phased_gu_r3p_gu2", ("ph", 2, "pdl")),
    # (run 28c's phased_r3_pdl_even, gate/up warps in full rounds, was slower at M = 2-4: reverted, in git history at
    # 475fe6f; moe_small_even*.json; run 28d's phased_r3_pdl_seq, each warp's tasks and items through one ring without
    # a drain, slower at M = 1-8: reverted, in git history at 804159d; moe_small_seq*.json; run 28e's 4-stage PDL pairs,
    # phased_r4_pdl and phased_r3_pdl_dn4, slower at M = 1-2: reverted, in git history at 6fe5fd0; moe_small_dn4*.json;
    # run 29's phased_r3_pdl_c2, the down launch as two-CTA clusters per tile, slower at M = 1-4: reverted, in git
    # history at 00df147; moe_small_c2*.json; run 29b's phased_r3_pdl_g6 / _g6d5, launch bounds (128, 6) for gate/up
    # and (128, 5) for down, level or behind: reverted, in git history at 5593ac9; moe_small_g6*.json; run 29e's
    # phased_r3_pdl_cm, a correction mma instead of frag_step's subtractions, 5-17 points slower: reverted, in git
    # history at 7de299f; moe_small_cm*.json; run 30's phased_r3_pdl_pfg / _pfd / _pfgd / _k4_pfgd, L2 prefetches of
    # the down weights, 3-10 points slower at M = 1: reverted, in git history at 4e1a5c6; moe_small_pf*.json; run 30b's
    # phased_r3_pdl_ei / _k4_ei, the gate/up warps' first stages issued before the CTA's prologue, level or behind at
    # M = 1-4: reverted, in git history at aded977; moe_small_ei*.json; run 31's phased_r3_pdl_fd / _fgd / _fg /
    # _k4_fd, the dequantisation's -136 folded into one mma per stage, slower at every M: reverted, in git history at
    # d11ae6f; moe_small_fo*.json; run 32's phased_r3_pdl_ks6 / _ks7 / _ks6a, the K-span gate/up form (each CTA T
    # consecutive tasks, its warps equal quarters of their stages; ks6a stage-aligned at T = 3), slower at every M, its
    # gate/up launch alone 4.4-10.5 us slower at M = 1: reverted, in git history at 40fdae4; moe_small_ks*.json)
    "ctasplit": ("moe_small_ctasplit", ("cta", "ring")),
    "ctasplit_max": ("moe_small_ctasplit", ("cta", "max")),
    # fixed (gate_up, down) splits of the CTA-split form: the split sweep at M = 1-16
    **{f"ctasplit_g{a}d{b}": ("moe_small_ctasplit", ("cta", (a, b))) for a, b in ((4, 1), (2, 2), (2, 1), (1, 1))},
}
DEFAULT_SMALL_VARIANT = "splitk_s4x4e"   # what ``True`` means in set_small_table

# (largest M, one-launch kernel or None) in increasing M, for M * topk <= SMALL_MAX_PAIRS: a SMALL_VARIANTS
# key runs that kernel in one launch, None the four launches; beyond the last entry the four-launch kernels
# run. Set from two runs of the same comparison on the H200 (moe_small_xend.json and moe_small_xend_2.json, code
# e544bfd, separate processes: the four-launch path, splitk_s4, splitk_s4x4(e), ctasplit_x4(e) and
# ctasplit_x4(e)_g1d1, uniform and skewed routing): the XEND forms (the next stage's activations loaded after a
# stage's last step, no buffer-rotation moves) lead their x4 counterparts in 23 of the 24 (form, routing, M)
# rows where they are dispatched; ctasplit_x4e is the fastest path at M = 1 and 2 in both runs and both
# routings; splitk_s4x4e at M = 4 in all four rows; ctasplit_x4e_g1d1 at M = 8-16 in 11 of 12 rows. Then the
# split sweep of ctasplit_x4e at M = 1-4 (moe_small_xend_splits*.json, code 1088c4d, two processes): at M = 2 the
# fixed split (4, 1) leads the rule's (4, 2) by more than 1.5 points of copy in both runs and both routings, so
# it runs there; at M = 3-4 no form leads splitk_s4x4e by that much in every row (ctasplit_x4e_g2d1 does under
# uniform routing only); at M = 1 the rule's split stays the fastest. M = 5-7 were not measured: M = 8's kernel.
# Run 18 timed ctasplit_x4e_g2d1 and splitk_s4x4e at M = 3-4 in two more processes (moe_small_f16*.json, code
# c8de03a) and the dispatch check (595cffc): over those five processes g2d1 is ahead in most (routing, run) rows at
# M = 3 and at M = 4 and ahead on average at both (papers/moe_int4.md, block small_m34), so it runs at M = 3-4.
# (Before: moe_small_x4_splits*.json, 0c55f60 / 8c7598f: ctasplit_x4 at M = 1, splitk_s4 at M = 2, splitk_s4x4 at
# M = 3-4, ctasplit_x4_g1d1 at M = 5-16; moe_small_xprefetch*.json: ctasplit_x4, splitk_s4, splitk_s4x4 at
# M = 3-16; moe_small_ctasplit.json: ctasplit at M = 1, splitk_s4 at M = 2-16; moe_small_splitk.json: four
# launches at M = 1, splitk_s4 at M = 2-16; version 3, moe_small_v3.json, from M = 4.)
# Run 19 (moe_small_xs*.json, 709c28f) and its follow-up (moe_small_r3*.json, 26489aa): the same kernel with a 3-stage
# ring (x4e_r3) is ahead of x4e on average in every M range at that range's split, with no row's mean over the
# processes behind by more than 1.5 points (the rule in bench.SMALL_R3_PREDICTION, written before the run; paper block
# small_r3), so every range runs its r3 form. Run 20 (moe_small_r3f*.json, ccd154f; block small_r3f): x4e_r3f (one
# fence per publish, acquire loads) passes the same rule against x4e_r3 at M = 1-4 and fails it at M = 5-16. Run 22
# (moe_small_r3fs*.json, 0310cea; block small_r3fs): x4e_r3fs (the h wait spins relaxed, then one acquire) passes it
# against x4e_r3f at M = 1 only. Run 23 (moe_small_r3fst*.json, 5fd4788; block small_r3fst): x4e_r3fst (static first
# tasks) passes it against x4e_r3fs at M = 1.
# Run 25 (moe_small_wsplit*.json, 42799f6; block small_wsplit): by run 23b's rule (report.split_rule_rows) the
# warp-split kernel replaces the CTA-split one at M = 2 (wsplit_r3 at (2, 1)) and M = 3-16 (at (1, 1): no split-K,
# every warp a whole tile's K); at M = 1 its split forms are far behind and x4e_r3fst stays.
# Run 27 (moe_small_il*.json, moe_small_ew*.json, moe_small_ew5*.json: six processes in three device sessions, code
# ecf3f6f / 08fe44a / 584fb2f, each timing x4e_r3fst at (4, 1) beside wsplit_r3_g2d1 at M = 2; report.RUN27_RULE):
# by run 23b's rule x4e_r3fst at (4, 1) replaces wsplit_r3_g2d1 at M = 2 (one replay: mean +0.2 points, no row's
# mean below -0.1; in-graph it leads in all twelve rows).
# Run 27c (moe_small_sd*.json, 412a5af; report.SMALL_RUN27C): by run 23b's rule x4e_r3fstd (one more static first
# task per CTA) at (4, 1) replaces x4e_r3fst at (4, 1) at M = 2 (one replay: mean +0.2 points, worst row +0.1); at
# M = 1 it does not (mean -0.4).
# Run 28 (moe_small_phased*.json, 44bb7ad; moe_small_pdl*.json, ac0a0ce; report.run28_rule_rows, block small_run28): the
# phased form (two launches, no counters) passes run 23b's rule against every dispatched kernel at every M <= 16, and
# its PDL variant passes it against the phased form at M = 1-2 and 3-16 (one replay); so one kernel pair runs at
# M = 1-16. (Before: x4e_r3fst at M = 1, x4e_r3fstd at (4, 1) at M = 2, wsplit_r3 unsplit at M = 3-16.)
# Run 29f (moe_small_k4*.json, fe7a863; report.run29_rule_rows, block small_run29): the K-split gate/up form passes
# run 23b's rule at M = 2 (one replay: mean +0.9 points, worst row -0.0; in-graph ahead in all four rows) and loses at
# M = 1 and 3-16.
# Run 33 (moe_small_r2*.json, 60ec73d; report.run33_rule_rows, block small_run33): two-stage rings pass run 23b's rule
# at M = 1 (phased_r2_pdl, both launches: one replay mean +1.5 points, worst row +0.4) and at M = 4-16
# (phased_r3_pdl_gu2, the gate/up launch only: mean +0.7, worst row -0.5), and lose at M = 2 (-1.4 against k4).
SMALL_TABLE: list[tuple[int, str | None]] = [(1, "phased_r2_pdl"), (2, "phased_r3_pdl_k4"), (16, "phased_r3_pdl_gu2")]
# set_small_variant forces one kernel wherever SMALL_TABLE runs the one-launch path (benchmarks, tests);
# None (the default) keeps each row's own kernel.
SMALL_VARIANT: dict[str, str | None] = {"name": None}
# NVRTC options of the module the one-launch path runs (diagnostic builds only: workbench.moe.diag's
# ``-DMOE_DIAG_*``); () is the default build.
SMALL_OPTIONS: dict[str, tuple[str, ...]] = {"options": ()}


# Compiled variants (NT, RT, D, S, LINE) of moe_gate_up_* / moe_down_* (see moe_int4.cu): NT token
# tiles of 8 per work item, RT row tiles of 16 per warp, and either D weight steps prefetched in
# registers (S = 0), or an S-stage cp.async shared-memory ring filled in fragment order
# (LINE = 0) or by whole 128-byte lines, two K steps per stage (LINE = 1; K a multiple of 1024).
Variant = tuple[int, int, int, int, int]
VARIANTS: tuple[Variant, ...] = (
    (1, 1, 4, 0, 0), (1, 2, 2, 0, 0), (2, 2, 2, 0, 0), (4, 2, 2, 0, 0),
    (1, 2, 0, 4, 0), (2, 2, 0, 4, 0),
    (1, 1, 0, 4, 1), (1, 1, 0, 5, 1), (1, 2, 0, 2, 1), (2, 1, 0, 4, 1), (2, 2, 0, 2, 1))

# (largest M, variant) in increasing M; the last entry covers every larger M. Set from the
# variant timings of data/measurements/h200/moe_bandwidth.json (results.tuning, H200, commit
# c24392b): whole-line ring with 2 row tiles up to M = 511, then register prefetch with 16 and
# 32 tokens per work item.
KERNEL_TABLE: list[tuple[int, Variant]] = [
    (511, (1, 2, 0, 2, 1)), (1023, (2, 2, 2, 0, 0)), (1 << 30, (4, 2, 2, 0, 0))]


def variant_name(var: Variant) -> str:
    """Kernel-name suffix of a variant: ``nt1_rt2_d2``, ``nt1_rt2_s4`` or ``nt1_rt1_l4``."""
    nt, rt, d, s, line = var
    return f"nt{nt}_rt{rt}_" + (f"l{s}" if line else f"s{s}" if s else f"d{d}")


def kernel_config(m: int) -> Variant:
    """(NT, RT, D, S, LINE) variant used for M tokens (from :data:`KERNEL_TABLE`)."""
    for max_m, var in KERNEL_TABLE:
        if m <= max_m:
            return var
    return KERNEL_TABLE[-1][1]


def set_kernel_table(table: list[tuple[int, Variant]]) -> None:
    """Replace :data:`KERNEL_TABLE` (the benchmark's tuning uses this); variants must be compiled ones."""
    for _, var in table:
        if tuple(var) not in VARIANTS:
            raise ValueError(f"variant {var} is not compiled; choose from {VARIANTS}")
    KERNEL_TABLE[:] = [(int(mx), tuple(v)) for mx, v in sorted(table)]


def set_small_path(enabled: bool) -> None:
    """Use (True, the default) or bypass the one-launch small-M kernel for M * topk <= SMALL_MAX_PAIRS."""
    SMALL_PATH["enabled"] = bool(enabled)


def small_variant_for(m: int, topk: int) -> str | None:
    """The one-launch kernel (a :data:`SMALL_VARIANTS` key) ``fused_moe_int4`` runs for M tokens of ``topk``
    experts each, or None for the four launches: :data:`SMALL_TABLE`'s row for M, unless
    :func:`set_small_variant` forced a kernel."""
    if not (SMALL_PATH["enabled"] and 0 < m * topk <= SMALL_MAX_PAIRS):
        return None
    variant = table_small_kernel(m)
    return None if variant is None else SMALL_VARIANT["name"] or variant


def table_small_kernel(m: int) -> str | None:
    """:data:`SMALL_TABLE`'s kernel for M tokens (None: four launches), whatever forces or switches apply."""
    for max_m, variant in SMALL_TABLE:
        if m <= max_m:
            return variant
    return None


def uses_small_path(m: int, topk: int) -> bool:
    """True when ``fused_moe_int4`` runs a one-launch kernel (:func:`small_variant_for`) for M tokens of
    ``topk`` experts each."""
    return small_variant_for(m, topk) is not None


def set_small_variant(name: str | None) -> None:
    """Force one kernel of the one-launch path wherever :data:`SMALL_TABLE` runs that path: a key of
    :data:`SMALL_VARIANTS` ("splitk_s4", "ctasplit", "v3", another split-K or CTA-split form); None goes
    back to each table row's own kernel (the default)."""
    if name is not None and name not in SMALL_VARIANTS:
        raise ValueError(f"small variant must be None or one of {sorted(SMALL_VARIANTS)}, got {name!r}")
    SMALL_VARIANT["name"] = name


@contextlib.contextmanager
def forced_small_variant(name: str) -> Iterator[str]:
    """Within the block, every M * topk <= SMALL_MAX_PAIRS runs the one-launch kernel ``name`` (a
    :data:`SMALL_VARIANTS` key), whatever :data:`SMALL_TABLE` says; the table and :data:`SMALL_VARIANT` are
    restored afterwards (benchmarks, tests, workbench.moe.trace)."""
    saved_table, saved_variant = list(SMALL_TABLE), SMALL_VARIANT["name"]
    try:
        set_small_variant(name)
        set_small_table([(SMALL_MAX_PAIRS, True)])
        yield name
    finally:
        set_small_table(saved_table)
        set_small_variant(saved_variant)


@contextlib.contextmanager
def diagnostic_build(options: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    """Within the block the one-launch path runs the moe_int4 module compiled with ``options`` (``-DMOE_DIAG_*``
    or ``-DMOE_TRACE`` builds, whose results may be wrong by design: timing probes only); restored afterwards."""
    if any(not o.startswith("-D") for o in options):
        raise ValueError(f"diagnostic options must be -D macros, got {options!r}")
    saved = SMALL_OPTIONS["options"]
    try:
        SMALL_OPTIONS["options"] = tuple(options)
        yield SMALL_OPTIONS["options"]
    finally:
        SMALL_OPTIONS["options"] = saved


def splitk_choice(items: int, tiles: int, stages: int, max_split: int, want: int) -> int:
    """Split of one phase of moe_small_splitk (the kernel's ``splitk_pick``, same rule).

    The smallest s in (1, 2, 4), s <= ``max_split`` and dividing ``stages`` (256-wide K stages of the
    phase), with ``items * tiles * s >= want``; else the largest such s.
    """
    best = 1
    s = 1
    while s <= min(max_split, 4):
        if stages % s:
            break
        best = s
        if items * tiles * s >= want:
            break
        s *= 2
    return best


def work_items(topk_ids: torch.Tensor, num_experts: int, chunk: int = 8) -> int:
    """Items of the one-launch kernels for these ids: sum over experts of ceil(pairs / chunk) (invalid ids dropped)."""
    flat = topk_ids.reshape(-1).long().cpu()
    flat = flat[(flat >= 0) & (flat < num_experts)]
    counts = torch.bincount(flat, minlength=num_experts)
    return int(((counts + chunk - 1) // chunk).sum())


def splitk_splits(items: int, hidden: int, intermediate: int, variant: str, grid_ctas: int) -> tuple[int, int]:
    """(gate_up split, down split) moe_small_splitk takes for ``items`` work items on ``grid_ctas`` CTAs."""
    spec = SMALL_VARIANTS[variant][1]
    if spec is None or spec[0] == "ph":   # version 3 and the phased form: whole-K tasks
        return (1, 1)
    if spec[0] in ("cta", "ws"):
        raise ValueError(f"{variant} is a CTA-split or warp-split form: its splits are "
                         "workbench.moe.ctasplit.ctasplit_splits")
    sgu, sdn, per_warp = spec
    want = min(per_warp * grid_ctas * (THREADS // 32), 1 << 30)
    return (splitk_choice(items, intermediate // 8, hidden // 256, sgu, want),
            splitk_choice(items, hidden // 16, intermediate // 256, sdn, want))


def set_small_table(table: list[tuple[int, str | bool | None]]) -> None:
    """Replace :data:`SMALL_TABLE`: (largest M, kernel) pairs, the kernel a :data:`SMALL_VARIANTS` key or
    None for the four launches; True stands for :data:`DEFAULT_SMALL_VARIANT`, False for None."""
    rows = []
    for mx, v in table:
        v = DEFAULT_SMALL_VARIANT if v is True else None if v is False else v
        if v is not None and v not in SMALL_VARIANTS:
            raise ValueError(f"SMALL_TABLE kernel must be None, a bool or one of {sorted(SMALL_VARIANTS)}, got {v!r}")
        rows.append((int(mx), v))
    SMALL_TABLE[:] = sorted(rows, key=lambda r: r[0])


_WORKSPACE: dict[tuple, torch.Tensor] = {}
_GRID: dict[tuple[int, str], int] = {}


def _small_workspace(device: torch.device, hidden: int) -> torch.Tensor:
    """Zeroed int32 counters of moe_small_fused [2 + 128 + H/16], one per (device, H).

    The kernel leaves them zero when it ends, so one allocation serves every
    call and every CUDA-graph replay, provided calls do not overlap in time:
    the small path is not for concurrent calls on several streams. The first
    call must come before any graph capture (a warm-up call, as torch's own
    capture recipe does), so the counters are not allocated inside a graph.
    """
    key = (device.index if device.index is not None else torch.cuda.current_device(), hidden)
    ws = _WORKSPACE.get(key)
    if ws is None:
        ws = torch.zeros(2 + SMALL_MAX_PAIRS + hidden // 16, dtype=torch.int32, device=device)
        _WORKSPACE[key] = ws
    return ws


def _splitk_workspace(device: torch.device, hidden: int, intermediate: int) -> torch.Tensor:
    """Zeroed int32 counters of moe_small_splitk [2 + 128 + H/16 + 128 * I/8] (as :func:`_small_workspace`:
    left zero by every launch; the split-K reduction counters come last)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    key = ("splitk", idx, hidden, intermediate)
    ws = _WORKSPACE.get(key)
    if ws is None:
        ws = torch.zeros(2 + SMALL_MAX_PAIRS + hidden // 16 + SMALL_MAX_PAIRS * (intermediate // 8),
                         dtype=torch.int32, device=device)
        _WORKSPACE[key] = ws
    return ws


def _ctasplit_workspace(device: torch.device, hidden: int) -> torch.Tensor:
    """Zeroed int32 counters of moe_small_ctasplit [2 + 128 + H/16] (as :func:`_small_workspace`, its own copy)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    key = ("ctasplit", idx, hidden)
    ws = _WORKSPACE.get(key)
    if ws is None:
        ws = torch.zeros(2 + SMALL_MAX_PAIRS + hidden // 16, dtype=torch.int32, device=device)
        _WORKSPACE[key] = ws
    return ws


def _wsplit_workspace(device: torch.device, hidden: int, intermediate: int) -> torch.Tensor:
    """Zeroed int32 counters of moe_small_wsplit [2 + 128 + H/16 + 128 * I/8 + 128 * H/16] (as
    :func:`_small_workspace`: left zero by every launch; the per-tile part counters of both phases come last)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    key = ("wsplit", idx, hidden, intermediate)
    ws = _WORKSPACE.get(key)
    if ws is None:
        ws = torch.zeros(2 + SMALL_MAX_PAIRS + hidden // 16 + SMALL_MAX_PAIRS * (intermediate // 8 + hidden // 16),
                         dtype=torch.int32, device=device)
        _WORKSPACE[key] = ws
    return ws


def wsplit_splits(hidden: int, intermediate: int, rule: str | tuple[int, int], ring_stages: int) -> tuple[int, int]:
    """(gate_up split, down split) of moe_small_wsplit_r<ring_stages>: ``ctasplit_splits``' choice, each phase's
    units (stages / split) at least ring_stages - 1 stages long (the issuer runs at most one unit ahead)."""
    sgu, sdn = ctasplit_splits(hidden, intermediate, rule)
    for name, k, sp in (("gate_up", hidden, sgu), ("down", intermediate, sdn)):
        if k // 256 // sp < ring_stages - 1:
            raise ValueError(f"{name} split {sp} leaves {k // 256 // sp} stages per unit; moe_small_wsplit_r"
                             f"{ring_stages} needs at least {ring_stages - 1}")
    return sgu, sdn


def _small_grid(kernel, device: torch.device, name: str = "moe_small_fused") -> int:
    """CTAs of a one-launch kernel that fit on the device at once (occupancy x SMs)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if (idx, name) not in _GRID:
        sms = torch.cuda.get_device_properties(idx).multi_processor_count
        per_sm = 0
        try:
            from cupy.cuda import driver

            fptr = getattr(kernel, "ptr", None) or kernel.kernel.ptr
            per_sm = int(driver.occupancyMaxActiveBlocksPerMultiprocessor(fptr, THREADS, 0))
        except Exception:  # noqa: BLE001 - estimate from registers (64K per SM, allocated per warp in 256s)
            regs = int(getattr(kernel, "num_regs", 128))
            per_warp = ((regs * 32 + 255) // 256) * 256
            per_sm = max(1, min(65536 // (per_warp * (THREADS // 32)), 2048 // THREADS))
        _GRID[(idx, name)] = max(1, per_sm) * sms
    return _GRID[(idx, name)]


def small_grid(name: str = "moe_small_fused") -> int | None:
    """CTAs of the one-launch kernel ``name`` on the current device (None before its first launch)."""
    return _GRID.get((torch.cuda.current_device(), name)) if torch.cuda.is_available() else None


def max_work_items(pairs: int, num_experts: int, chunk: int) -> int:
    """Upper bound on sum_e ceil(c_e / chunk) over experts, given sum_e c_e = pairs."""
    active = min(num_experts, pairs)
    return max(1, (pairs + active * (chunk - 1)) // chunk)


def _kernel(name: str, options: tuple[str, ...] = ()):
    return load_module(FAMILY, options=options).get_function(name)


def gpu_supported(experts: Int4Experts) -> str | None:
    """None when the CUDA kernel handles these shapes, else the reason it does not."""
    if experts.hidden % 512 or experts.intermediate % 512:
        return f"hidden {experts.hidden} and intermediate {experts.intermediate} must be multiples of 512"
    if experts.num_experts > MAX_EXPERTS:
        return f"at most {MAX_EXPERTS} experts, got {experts.num_experts}"
    return None


def fused_moe_int4(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                   experts: Int4Experts, *, validate: bool = True) -> torch.Tensor:
    """Routed-expert MoE output, bf16 [M, H].

    hidden [M, H] bf16; topk_ids [M, k] int32/int64 in [0, E); topk_weights
    [M, k] float (multiplies each expert's output; apply routed_scaling_factor
    before or after, as the model does). ``experts`` is an :class:`Int4Experts`
    on hidden's device. ``validate`` checks the id range on the host (one
    synchronisation on a GPU); without it an out-of-range id makes its token's
    output row NaN on the GPU path rather than raising.
    """
    check_moe_inputs(hidden, topk_ids, topk_weights, experts)
    if hidden.dtype != torch.bfloat16:
        raise ValueError(f"hidden must be bf16, got {hidden.dtype}")
    if experts.device != hidden.device:
        raise ValueError(f"experts are on {experts.device}, hidden on {hidden.device}")
    if not hidden.is_cuda or not gpu_available():
        return moe_reference(hidden, topk_ids, topk_weights, experts).to(torch.bfloat16)
    why = gpu_supported(experts)
    if why is not None:
        raise ValueError(f"fused_moe_int4 on the GPU: {why}")
    if validate:
        check_ids_range(topk_ids, experts.num_experts)
    return _fused_cuda(hidden.contiguous(), topk_ids, topk_weights, experts)


def _fused_cuda(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                experts: Int4Experts) -> torch.Tensor:
    m, k = topk_ids.shape
    h, i, e = experts.hidden, experts.intermediate, experts.num_experts
    dev = hidden.device
    out = torch.empty(m, h, dtype=torch.bfloat16, device=dev)
    if m == 0:
        return out
    if m > 65535:
        raise ValueError(f"at most 65535 tokens per call on the GPU, got {m}")
    if hidden.data_ptr() % 16:
        hidden = hidden.clone()
    p = m * k
    if uses_small_path(m, k):
        return _fused_small(hidden, topk_ids, topk_weights, experts, out)
    var = kernel_config(m)
    if var[4] and (h % 1024 or i % 1024):  # whole-line variants need an even number of steps per warp
        var = (var[0], 2, 2, 0, 0)
    nt, rt, name = var[0], var[1], variant_name(var)
    chunk = 8 * nt
    nitems = max_work_items(p, e, chunk)
    ids = topk_ids.reshape(-1).to(torch.int32).contiguous()
    wts = topk_weights.reshape(-1).to(torch.float32).contiguous()
    sorted_pair = torch.empty(p, dtype=torch.int32, device=dev)
    items = torch.empty(nitems, 3, dtype=torch.int32, device=dev)
    num_items = torch.empty(1, dtype=torch.int32, device=dev)
    hbuf = torch.empty(p, i, dtype=torch.bfloat16, device=dev)
    ybuf = torch.empty(p, h, dtype=torch.float32, device=dev)

    launch(_kernel("moe_align"), (1,), (1024,),
           (ids, p, e, chunk, sorted_pair, items, num_items, nitems))
    launch(_kernel(f"moe_gate_up_{name}"), (i // 8 // rt, nitems), (THREADS,),
           (experts.gate_up_packed, experts.gate_up_scale, hidden, sorted_pair, items, num_items, k, h, i, hbuf))
    launch(_kernel(f"moe_down_{name}"), (h // 16 // rt, nitems), (THREADS,),
           (experts.down_packed, experts.down_scale, hbuf, sorted_pair, items, num_items, wts, k, h, i, ybuf))
    launch(_kernel("moe_combine"), ((h // 4 + 255) // 256, m), (256,),
           (ybuf, ids, k, e, h, out))
    return out


def _fused_small(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                 experts: Int4Experts, out: torch.Tensor, options: tuple[str, ...] = ()) -> torch.Tensor:
    """One launch for M * topk <= SMALL_MAX_PAIRS: the kernel :func:`small_variant_for` names, from the
    module compiled with ``options`` (a diagnostic build such as workbench.moe.trace's ``-DMOE_TRACE``; default:
    :func:`diagnostic_build`'s, normally none)."""
    m, k = topk_ids.shape
    h, i, e = experts.hidden, experts.intermediate, experts.num_experts
    dev = hidden.device
    p = m * k
    options = options or SMALL_OPTIONS["options"]
    gu_frag, dn_frag = experts.fragments()
    ids = topk_ids.reshape(-1).to(torch.int32).contiguous()
    wts = topk_weights.reshape(-1).to(torch.float32).contiguous()
    hbuf = torch.empty(p, i, dtype=torch.bfloat16, device=dev)
    variant = small_variant_for(m, k)
    if variant is None:
        raise RuntimeError(f"the one-launch path does not run M={m}, topk={k} (fused.SMALL_TABLE {SMALL_TABLE})")
    kname, spec = SMALL_VARIANTS[variant]
    if spec is not None and spec[0] == "ph":   # two launches, each with its own kernel and grid
        return phased_launcher(experts, m, k, variant, options)(hidden, ids, wts, hbuf, out)
    kern = _kernel(kname, options)
    grid = _small_grid(kern, dev, kname + "".join(options))
    if spec is None:
        ybuf = torch.empty(p, h, dtype=torch.float32, device=dev)
        ws = _small_workspace(dev, h)
        launch(kern, (grid,), (THREADS,),
               (gu_frag, dn_frag, hidden, ids, wts, m, k, e, h, i, hbuf, ybuf, ws, out))
        return out
    if spec[0] == "cta":
        sgu, sdn = ctasplit_splits(h, i, spec[1])
        ybuf = torch.empty(p, h, dtype=torch.float32, device=dev)
        ws = _ctasplit_workspace(dev, h)
        launch(kern, (grid,), (THREADS,),
               (gu_frag, dn_frag, hidden, ids, wts, m, k, e, h, i, sgu, sdn, hbuf, ybuf, ws, out))
        return out
    if spec[0] == "ws":
        sgu, sdn = wsplit_splits(h, i, spec[1], spec[2])
        gpart = torch.empty(sgu * p * (i // 8) * 16 if sgu > 1 else 1, dtype=torch.float32, device=dev)
        ypart = torch.empty(sdn * p * h if sdn > 1 else 1, dtype=torch.float32, device=dev)
        ybuf = torch.empty(p, h, dtype=torch.float32, device=dev)
        ws = _wsplit_workspace(dev, h, i)
        launch(kern, (grid,), (THREADS,),
               (gu_frag, dn_frag, hidden, ids, wts, m, k, e, h, i, sgu, sdn, hbuf, gpart, ypart, ybuf, ws, out))
        return out
    sgu, sdn, per_warp = spec
    want = min(per_warp * grid * (THREADS // 32), 1 << 30)
    gpart = torch.empty(sgu * p * (i // 8) * 16 if sgu > 1 else 1, dtype=torch.float32, device=dev)
    ypart = torch.empty(sdn * p * h, dtype=torch.float32, device=dev)
    ws = _splitk_workspace(dev, h, i)
    launch(kern, (grid,), (THREADS,),
           (gu_frag, dn_frag, hidden, ids, wts, m, k, e, h, i, sgu, sdn, want, hbuf, gpart, ypart, ws, out))
    return out


def phased_grids(pairs: int, num_experts: int, hidden: int, intermediate: int, resident_gu: int,
                 resident_dn: int, tasks_per_cta: int = THREADS // 32) -> tuple[int, int]:
    """(gate/up CTAs, down CTAs) of the phased form: enough CTAs for the gate/up tasks at the most work items
    ``pairs`` can make (:func:`max_work_items`, chunks of 8), ``tasks_per_cta`` at a time (four: one whole-K task per
    warp; one: the K-split form, phased_gate_up_k4, whose four warps share a task), and one CTA per 16-row tile of the
    output, each capped at the CTAs resident at once (both kernels stride over what is left)."""
    if min(pairs, num_experts, hidden, intermediate, resident_gu, resident_dn, tasks_per_cta) < 1:
        raise ValueError(f"need positive pairs, experts, shapes, resident CTAs and tasks per CTA, got {pairs}, "
                         f"{num_experts}, {hidden}, {intermediate}, {resident_gu}, {resident_dn}, {tasks_per_cta}")
    tasks = max_work_items(pairs, num_experts, 8) * (intermediate // 8)
    return (min(resident_gu, -(-tasks // tasks_per_cta)), min(resident_dn, hidden // 16))


def phased_spec(variant: str) -> tuple[str, tuple]:
    """(gate/up kernel name, spec) of the phased form ``variant``; a clear error for any other name."""
    kname, spec = SMALL_VARIANTS.get(variant, ("", None))
    if spec is None or spec[0] != "ph":
        raise ValueError(f"variant must be a phased form, one of "
                         f"{[v for v, (_, s) in SMALL_VARIANTS.items() if s and s[0] == 'ph']}, got {variant!r}")
    return kname, spec


def phased_launcher(experts: Int4Experts, m: int, topk: int, variant: str, options: tuple[str, ...] = ()):
    """The phased form ``variant`` (a :data:`SMALL_VARIANTS` key of kind "ph") for M tokens of ``topk`` experts:
    a callable ``run(hidden, ids, wts, hbuf, out, parts="gu+dn")`` that launches it on the current stream, with
    hidden bf16 [M, H], ids int32 [M * topk], wts float32 [M * topk], hbuf bf16 [M * topk, I] (h, written by the
    gate/up launch), out bf16 [M, H]; ``parts`` as :func:`_phased`'s."""
    kname, spec = phased_spec(variant)
    e, h, i, dev = experts.num_experts, experts.hidden, experts.intermediate, experts.device
    dname = kname.replace("_gu_", "_dn_")
    gu, dn = _kernel(kname, options), _kernel(dname, options)
    key = "".join(options)
    # the K-split form ("k4", phased_gate_up_k4) runs one (item, tile) task per CTA, its K split over the four warps
    grids = phased_grids(m * topk, e, h, i, _small_grid(gu, dev, kname + key), _small_grid(dn, dev, dname + key),
                         1 if "k4" in spec[2:] else THREADS // 32)
    gu_frag, dn_frag = experts.fragments()

    def run(hidden: torch.Tensor, ids: torch.Tensor, wts: torch.Tensor, hbuf: torch.Tensor, out: torch.Tensor,
            parts: str = "gu+dn") -> torch.Tensor:
        return _phased(gu, dn, grids, gu_frag, dn_frag, hidden, ids, wts, (m, topk, e, h, i), hbuf, out,
                       pdl="pdl" in spec[2:], parts=parts)
    return run


def _phased(gu_kern, dn_kern, grids: tuple[int, int], gu_frag: torch.Tensor, dn_frag: torch.Tensor,
            hidden: torch.Tensor, ids: torch.Tensor, wts: torch.Tensor, dims: tuple[int, int, int, int, int],
            hbuf: torch.Tensor, out: torch.Tensor, *, pdl: bool = False, parts: str = "gu+dn") -> torch.Tensor:
    """The phased form's two launches on the current stream (moe_int4.cu, "Phased form"), at ``grids``
    (:func:`phased_grids`); ``pdl``: the down launch with programmatic dependent launch. ``parts`` "gu" or "dn"
    launches one of them alone (workbench.moe.phased's breakdown; "dn" reads the h a previous "gu" left)."""
    m, k, e, h, i = dims
    grid_gu, grid_dn = grids
    if parts not in ("gu+dn", "gu", "dn"):
        raise ValueError(f"parts must be 'gu+dn', 'gu' or 'dn', got {parts!r}")
    if "gu" in parts:
        launch(gu_kern, (grid_gu,), (THREADS,), (gu_frag, hidden, ids, m, k, e, h, i, hbuf, out))
    if "dn" in parts:
        (launch_dependent if pdl else launch)(dn_kern, grid_dn, THREADS, (dn_frag, hbuf, ids, wts, m, k, e, h, i, out))
    return out
