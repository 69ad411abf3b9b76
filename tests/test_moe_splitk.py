"""CPU tests of the split-K one-launch kernel's layout and arithmetic (moe_small_splitk_s3 / _s4 in
workbench/kernels/moe_int4.cu; splitk_s4 dispatched at M = 2-16, the others selected with fused.set_small_variant).

They replay, with :func:`tests.test_moe_fragments.emulate_tile` (the warp's register arithmetic), what
the split-K tasks do: the stage and activation offsets of K part ``q`` of a tile, the fp32 partial sums
stored to ``gpart`` and summed in part order by whichever part arrives last, the down partials stored
to ``ypart`` and summed over k then parts; and the host mirror of the device's choice of splits.
"""
import itertools

import pytest
import torch

try:
    from tests.test_moe_fragments import emulate_tile
except ImportError:   # pytest run from elsewhere: tests/ itself is on sys.path
    from test_moe_fragments import emulate_tile
from workbench.int4 import dequantize_int4
from workbench.moe.fused import (SMALL_TABLE, SMALL_VARIANT, SMALL_VARIANTS, set_small_table, set_small_variant, small_variant_for, splitk_choice,
                                 splitk_splits, work_items)
from workbench.moe.packing import FRAG_STAGE, FRAG_WORDS, random_int4_experts

KIMI_GRID = 132 * 6   # moe_small_fused / moe_small_splitk_s3 on an H200: 6 CTAs per SM


def test_default_variant_and_table_as_measured():
    """Run 28's processes (moe_small_phased*.json, moe_small_pdl*.json), H200: the phased form with programmatic
    dependent launch at every M <= 16 (run 23b's rule, report.run28_rule_rows, from the committed files), except at
    M = 2 its K-split gate/up form since run 29f (test_run29_candidates_not_dispatched); before run 28, run 27c's rule
    had put x4e_r3fstd at (4, 1) at M = 2 and kept x4e_r3fst at M = 1."""
    from workbench.moe.report import RUN27C_DISPATCHED, SMALL_RUN27C, run28_rule_rows, split_rule_rows

    assert SMALL_VARIANT["name"] is None and SMALL_VARIANTS["v3"] == ("moe_small_fused", None)
    assert SMALL_TABLE == [(1, "phased_r2_pdl"), (2, "phased_r3_pdl_k4"), (16, "phased_r3_pdl_gu2")]   # run 33
    assert [small_variant_for(m, 8) for m in (1, 2, 3, 16, 17)] == ["phased_r2_pdl", "phased_r3_pdl_k4",
                                                                   "phased_r3_pdl_gu2", "phased_r3_pdl_gu2", None]
    rule = run28_rule_rows()   # the committed files say so
    taken = [r for r in rule if r["processes"].startswith(("moe_small_phased", "moe_small_pdl"))]
    assert len(taken) == 8 and all(r["replaces"] == "yes" for r in taken), taken
    assert {r["best candidate"] for r in taken if r["processes"].startswith("moe_small_pdl")} == {"phased_r3_pdl"}
    # 28c (even rounds), 28d (one ring per warp) and 28e (4-stage rings) lost; 28c's M = 1 does phased_r3_pdl's work
    lost = {(r["processes"], r["M range"]): r["replaces"] for r in rule if r not in taken}
    assert len(lost) == 9 and all(v == "no" for (p, m), v in lost.items() if p.startswith(("moe_small_seq",
                                                                                            "moe_small_dn4")) or m != "1-1"), lost
    rule = {r["M range"]: r for r in split_rule_rows(SMALL_RUN27C, ("ctasplit_x4e_r3fstd", "ctasplit_x4e_r3fstd_g4d1"),
                                                     RUN27C_DISPATCHED)}
    assert rule["2-2"]["best candidate"] == "ctasplit_x4e_r3fstd_g4d1" and rule["2-2"]["replaces"] == "yes"
    with pytest.raises(ValueError, match="small variant"):
        set_small_variant("splitk_s9")
    saved = list(SMALL_TABLE)
    try:
        with pytest.raises(ValueError, match="SMALL_TABLE kernel"):
            set_small_table([(16, "splitk_s9")])
        assert SMALL_TABLE == saved
    finally:
        set_small_table(saved)


def test_run29_candidates_not_dispatched():
    """Run 29's committed processes (moe_small_c2*.json, moe_small_g6*.json, moe_small_cm*.json, moe_small_k4*.json):
    the two-CTA-cluster down launch and the correction mma lose at every M range; g6 passes run 23b's rule only at
    M = 2, by less than the spread between processes (and loses in-graph there), so it is not dispatched; the K-split
    gate/up form passes it at M = 2 only (and leads in-graph there too), and runs there."""
    from workbench.moe.report import run29_rule_rows

    rule = {(r["processes"].split(",")[0], r["M range"]): r for r in run29_rule_rows()}
    assert len(rule) == 12
    assert [rule[("moe_small_k4", m)]["replaces"] for m in ("1-1", "2-2", "3-16")] == ["no", "yes", "no"]
    assert all(rule[(n, m)]["replaces"] == "no" for n in ("moe_small_c2", "moe_small_cm") for m in ("1-1", "2-2", "4-16"))
    assert all(rule[("moe_small_g6", m)]["replaces"] == "no" for m in ("1-1", "4-16"))
    g6 = rule[("moe_small_g6", "2-2")]
    assert g6["best candidate"] == "phased_r3_pdl_g6" and abs(float(g6["mean"])) < 1.0
    assert ("phased_r3_pdl_g6" not in dict(SMALL_TABLE).values()) and (2, "phased_r3_pdl_k4") in SMALL_TABLE


def test_run30_candidates_not_dispatched():
    """Run 30's and 30b's committed processes (moe_small_pf*.json, moe_small_ei*.json): the L2-prefetch pairs and the
    early-issue pairs lose by run 23b's rule at every M range they were timed at, and none is in the dispatch."""
    from workbench.moe.report import run30_rule_rows

    rule = {(r["processes"].split(",")[0], r["M range"]): r for r in run30_rule_rows()}
    assert set(rule) == {(n, m) for n in ("moe_small_pf", "moe_small_ei") for m in ("1-1", "2-2")} | {
        ("moe_small_pf", "4-16"), ("moe_small_ei", "4-4")}
    assert all(r["replaces"] == "no" and float(r["mean"]) < 0 for r in rule.values()), rule
    assert not any(("_pf" in v or "_ei" in v) for _, v in SMALL_TABLE if v)


def test_run31_fold_not_dispatched():
    """Run 31's committed processes (moe_small_fo*.json): every folded pair loses by run 23b's rule at every M range,
    and none is in the dispatch."""
    from workbench.moe.report import run31_rule_rows

    rule = {r["M range"]: r for r in run31_rule_rows()}
    assert set(rule) == {"1-1", "2-2", "4-16"}
    assert all(r["replaces"] == "no" and float(r["mean"]) < 0 for r in rule.values()), rule
    assert not any(v.endswith(("_fd", "_fgd", "_fg")) for _, v in SMALL_TABLE if v)


def test_run32_kspan_not_dispatched():
    """Run 32's committed processes (moe_small_ks*.json, moe_small_ksa*.json): every K-span pair loses by run 23b's
    rule at every M range, and none is in the dispatch."""
    from workbench.moe.report import run32_rule_rows

    rule = {(r["processes"].split(",")[0], r["M range"]): r for r in run32_rule_rows()}
    assert set(rule) == {(n, m) for n in ("moe_small_ks", "moe_small_ksa") for m in ("1-1", "2-2", "4-16")}
    assert all(r["replaces"] == "no" and float(r["mean"]) < 0 for r in rule.values()), rule
    assert not any("_ks" in v for _, v in SMALL_TABLE if v)


def test_run33_two_stage_rings_dispatched_by_the_rule():
    """Run 33's committed processes (moe_small_r2*.json): by run 23b's rule the two-stage rings replace phased_r3_pdl
    at M = 1 (both launches) and M = 4-16 (the gate/up launch), not phased_r3_pdl_k4 at M = 2; the table says so."""
    from workbench.moe.report import run33_rule_rows

    rule = {r["M range"]: r for r in run33_rule_rows()}
    assert set(rule) == {"1-1", "2-2", "4-16"}
    assert (rule["1-1"]["best candidate"], rule["1-1"]["replaces"]) == ("phased_r2_pdl", "yes")
    assert (rule["4-16"]["best candidate"], rule["4-16"]["replaces"]) == ("phased_r3_pdl_gu2", "yes")
    assert rule["2-2"]["replaces"] == "no"
    assert SMALL_TABLE == [(1, "phased_r2_pdl"), (2, "phased_r3_pdl_k4"), (16, "phased_r3_pdl_gu2")]


def test_sweep_repeat_rows_pair_the_sweeps():
    """report.sweep_repeat_rows: the goal rows of run 28's sweep, its repeat at the same dispatched SASS, run 29f's,
    run 30's, run 33's and its repeat, run 34's and its repeat side by side, matched by goal (the profiler's span row
    only in run 34's two: "-" in the others), and one row per (routing, M <= 16) present in all, from the committed
    files."""
    from workbench.moe.report import SWEEPS, sweep_repeat_rows

    goals, rows = sweep_repeat_rows()
    assert len(goals) == 7 and all(g[n].endswith(("(met)", "(not met)")) or g[n] == "-" for g in goals for n in SWEEPS)
    span = [g for g in goals if "profiler" in g["goal"]]
    assert len(span) == 1 and [n for n in SWEEPS if span[0][n] != "-"] == list(SWEEPS[-2:])
    assert all(g[n] != "-" for g in goals if g is not span[0] for n in SWEEPS)
    assert len(rows) == 12 and {r["M"] for r in rows} == {1, 2, 4, 8, 9, 16}
    assert len(SWEEPS) == 8 and all(len(r["one replay ms"].split(" / ")) == len(SWEEPS) for r in rows)


def test_ncu_printout_parsed_with_units(tmp_path, monkeypatch):
    """report.ncu_kernel_metrics: the last launch of each kernel, byte counts in bytes and times in us whatever unit
    ncu printed; ncu_balance_rows: the SM-balance ratios."""
    from workbench.moe import report

    text = """  moe_k (4, 1, 1)x(128, 1, 1), Context 1
    dram__bytes_read.sum                     Mbyte        66.12
    Duration                         ms        1.50
  moe_k (4, 1, 1)x(128, 1, 1), Context 1
    dram__bytes_read.sum                     Gbyte         1.85
    gpc__cycles_elapsed.max                  cycle       1,000
    sm__cycles_active.avg                    cycle      800.00
    sm__cycles_active.max                    cycle         880
    Duration                         us       441.44
"""
    (tmp_path / "ncu.txt").write_text(text)
    monkeypatch.setattr(report, "REPO_ROOT", tmp_path)
    mt = report.ncu_kernel_metrics("ncu.txt")
    assert list(mt) == ["moe_k"] and mt["moe_k"]["dram__bytes_read.sum"] == pytest.approx(1.85e9)
    assert mt["moe_k"]["Duration"] == pytest.approx(441.44)
    (row,) = report.ncu_balance_rows(("ncu.txt",))
    assert row["MB read"] == "1850.0" and row["SM active max / mean"] == "1.100"
    assert row["SM active mean / elapsed"] == "0.800" and row["achieved occupancy %"] == "-"
    assert report.ncu_kernel_metrics("missing.txt") == {}


@pytest.mark.parametrize("items,want", [(8, (4, 2)), (16, (2, 1)), (15, (2, 1)), (31, (1, 1)), (109, (1, 1))])
def test_splitk_splits_kimi(items, want):
    """want = 2 x 3168 warps: M = 1 (8 items) -> gate_up 4 (8192 tasks), down 2 (7168); M = 2 -> 2, 1; M >= 4 -> 1, 1."""
    assert splitk_splits(items, 7168, 2048, "splitk_s3", KIMI_GRID) == want
    assert splitk_splits(items, 7168, 2048, "v3", KIMI_GRID) == (1, 1)
    assert splitk_splits(items, 7168, 2048, "splitk_s3_max", KIMI_GRID) == (4, 4)


def test_splitk_choice_rule():
    assert splitk_choice(1, 10, 28, 4, 10**9) == 4          # never enough tasks: the largest allowed
    assert splitk_choice(1, 10, 6, 4, 10**9) == 2           # 4 does not divide 6 stages
    assert splitk_choice(1, 10, 7, 4, 10**9) == 1           # odd stage count: no split
    assert splitk_choice(5, 10, 28, 4, 50) == 1             # already enough
    assert splitk_choice(5, 10, 28, 4, 51) == 2
    assert splitk_choice(5, 10, 28, 2, 10**9) == 2          # capped by the maximum


def test_work_items_counts_chunks_of_8():
    ids = torch.tensor([[0, 1], [0, 2], [0, 3]] * 3 + [[5, -1]], dtype=torch.int32)   # expert 0: 9 pairs
    assert work_items(ids, 4) == 2 + 1 + 1 + 1                                        # 5 and -1 dropped


@pytest.mark.parametrize("split", [2, 4])
def test_task_order_covers_every_task_once(split):
    """task -> (item, part, tile) as the kernel decodes it: a bijection, item-major, then part, then tile."""
    nitems, tiles = 3, 16
    per = split * tiles
    seen = []
    for task in range(nitems * per):
        item, r = divmod(task, per)
        part, tile = divmod(r, tiles)
        seen.append((item, part, tile))
    assert sorted(seen) == list(itertools.product(range(nitems), range(split), range(tiles)))
    assert seen[:tiles] == [(0, 0, t) for t in range(tiles)]   # neighbouring warps: neighbouring tiles, one stage


def _part_blocks(stack: torch.Tensor, e: int, tile: int, tiles: int, nsup: int, split: int, part: int) -> torch.Tensor:
    """The 64-K blocks K part ``part`` of a tile streams: stages part*nper .. part*nper + nper - 1, from
    uint4 ((e * nsup + part * nper) * tiles + tile) * 144 on, stage stride tiles * 144 uint4 (the kernel's wt)."""
    flat = stack.reshape(-1)
    nper = nsup // split
    blocks = []
    for j in range(nper):
        base = ((e * nsup + part * nper + j) * tiles + tile) * FRAG_STAGE * FRAG_WORDS
        for q in range(FRAG_STAGE):
            blocks.append(flat[base + q * FRAG_WORDS: base + (q + 1) * FRAG_WORDS])
    return torch.stack(blocks)


@pytest.mark.parametrize("split", [2, 4])
def test_gate_up_split_partials_and_last_arriver_sum(split):
    """K parts of a gate_up tile, each from its own stages and activation offset (part * nper * 256), stored to
    gpart[((part * P + slot) * tiles + tile) * 16 + row] and summed in part order by the last arriver: the
    result is W x, and bit-identical in fp32 whichever part arrives last."""
    ex = random_int4_experts(3, 1024, 256, seed=4)          # gate_up [512, 1024]: 4 stages of 256 K
    gu, _ = ex.fragments()
    e, tile, tiles, nsup, h, i = 2, 3, 256 // 8, 1024 // 256, 1024, 256
    cnt, slot0, P = 3, 5, 8                                   # an item of 3 slots starting at slot 5
    x = torch.randn(8, h, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16).double()
    x[cnt:] = x[0]                                            # columns past the count repeat the first row
    gpart = torch.full((split * P * tiles * 16,), float("nan"), dtype=torch.float32)
    parts = []
    nper = nsup // split
    for part in range(split):
        k0 = part * nper * 256
        acc = emulate_tile(_part_blocks(gu, e, tile, tiles, nsup, split, part), x[:, k0:k0 + nper * 256]).float()
        parts.append(acc)
        for col in range(cnt):
            base = ((part * P + slot0 + col) * tiles + tile) * 16
            gpart[base:base + 16] = acc[:, col]
    sums = []
    for last in range(split):                                # whichever part is last: its own from "registers"
        tot = torch.zeros(16, cnt, dtype=torch.float32)
        for q in range(split):
            for col in range(cnt):
                base = ((q * P + slot0 + col) * tiles + tile) * 16
                v = parts[last][:, col] if q == last else gpart[base:base + 16]
                tot[:, col] = tot[:, col] + v
        sums.append(tot)
    assert all(torch.equal(sums[0], s_) for s_ in sums[1:])
    w = dequantize_int4(ex.gate_up_packed[e], ex.gate_up_scale[e], group_size=32).double()
    rows = torch.cat([torch.arange(8 * tile, 8 * tile + 8), i + torch.arange(8 * tile, 8 * tile + 8)])
    want = w[rows] @ x[:cnt].T
    assert torch.allclose(sums[0].double(), want, rtol=1e-5, atol=1e-5)
    # and exactly (in float64) the unsplit tile
    full = emulate_tile(_part_blocks(gu, e, tile, tiles, nsup, 1, 0), x)
    assert torch.allclose(sum(emulate_tile(_part_blocks(gu, e, tile, tiles, nsup, split, q),
                                           x[:, q * nper * 256:(q + 1) * nper * 256]) for q in range(split)),
                          full, rtol=1e-12, atol=1e-12)


def test_down_split_partials_summed_over_k_then_parts():
    """ypart[q, pair, n] = w_pair * (part q of W_down h), out[m, n] = sum_k sum_q (both ascending) = the
    routed sum over k of w_k W_down[e_k] h_k, for one 16-row tile of H."""
    ex = random_int4_experts(4, 512, 1024, seed=8)          # down [512, 1024]: 4 stages of 256 K
    _, dn = ex.fragments()
    split, tile, tiles, nsup, h = 2, 7, 512 // 16, 1024 // 256, 512
    topk, m = 3, 2
    gen = torch.Generator().manual_seed(6)
    ids = torch.tensor([[0, 2, 3], [1, 2, 0]])
    wts = torch.rand(m, topk, generator=gen) + 0.1
    hact = torch.randn(m * topk, 1024, generator=gen).to(torch.bfloat16).double()   # h per pair
    P = m * topk
    ypart = torch.zeros(split, P, h, dtype=torch.float32)
    nper = nsup // split
    for pair in range(P):
        e = int(ids.reshape(-1)[pair])
        xcol = hact[pair].expand(8, -1)                          # the pair's item column (others repeat it)
        for q in range(split):
            k0 = q * nper * 256
            acc = emulate_tile(_part_blocks(dn, e, tile, tiles, nsup, split, q), xcol[:, k0:k0 + nper * 256])
            ypart[q, pair, 16 * tile:16 * tile + 16] = (float(wts.reshape(-1)[pair]) * acc[:, 0]).float()
    out = torch.zeros(m, 16, dtype=torch.float32)
    for mm in range(m):
        s_ = torch.zeros(16, dtype=torch.float32)
        for k in range(topk):
            for q in range(split):
                s_ = s_ + ypart[q, mm * topk + k, 16 * tile:16 * tile + 16]
        out[mm] = s_
    want = torch.zeros(m, 16, dtype=torch.float64)
    for mm in range(m):
        for k in range(topk):
            e = int(ids[mm, k])
            w = dequantize_int4(ex.down_packed[e], ex.down_scale[e], group_size=32).double()
            want[mm] += float(wts[mm, k]) * (w[16 * tile:16 * tile + 16] @ hact[mm * topk + k])
    assert torch.allclose(out.double(), want, rtol=1e-5, atol=1e-5)


def test_compare_path_switch_and_table_format():
    """bench --small-compare's path switch (restores nothing itself: run_small_compare does) and its text table."""
    from workbench.moe import bench
    from workbench.moe.fused import SMALL_MAX_PAIRS, set_small_table, uses_small_path

    saved, saved_variant = list(SMALL_TABLE), SMALL_VARIANT["name"]
    try:
        bench._set_compare_path("four_launch")
        assert not uses_small_path(1, 8)
        bench._set_compare_path("splitk_s4")
        assert uses_small_path(1, 8) and bench.path_name(1, 8) == "small_splitk_s4"
        bench._set_compare_path("small_fused")
        assert bench.path_name(16, 8) == "small_fused" and SMALL_TABLE == [(SMALL_MAX_PAIRS, "splitk_s4x4e")]
    finally:
        set_small_table(saved)
        set_small_variant(saved_variant)
    paths = ["small_fused", "four_launch", "splitk_s3"]
    row = {"routing": "uniform", "m": 1, "distinct_experts_median": 8.0}
    for i, p in enumerate(paths):
        row[f"{p}_ms_median"] = 0.1 - 0.01 * i
        row[f"{p}_pct_of_copy"] = 50.0 + i
    doc = {"parameters": {"paths": paths}, "results": {"copy_gb_per_s": 4137.0, "all_checks_ok": True, "rows": [row]}}
    text = bench.format_small_compare(doc)
    assert "splitk_s3" in text and "0.0800" in text and "52.0" in text
    with pytest.raises(ValueError, match="four_launch"):
        bench.run_small_compare(None, paths=("small_fused", "splitk_s3"))


def _simulate_splitk(nitems: int, tiles_gu: int, tiles_dn: int, sgu: int, sdn: int, warps: int, seed: int):
    """Python port of moe_small_splitk's task loop and counters, run with warps interleaved at random at every
    atomic and every poll. Returns the final counters and what was written (asserting each read sees its writes)."""
    import random

    rnd = random.Random(seed)
    ws = {"task": 0, "fin": 0}
    done_gu = [0] * nitems
    done_dn = [0] * tiles_dn
    red_gu = [0] * (nitems * tiles_gu)
    gpart, hbuf, ypart, out = set(), set(), set(), {}
    per_gu, per_dn = sgu * tiles_gu, sdn * tiles_dn
    t_gu = nitems * per_gu
    t_all = t_gu + nitems * per_dn

    def warp():
        task = ws["task"]
        ws["task"] += 1
        yield
        while task < t_all:
            nxt = ws["task"]
            ws["task"] += 1
            yield
            if task < t_gu:
                item, r = divmod(task, per_gu)
                part, tile = divmod(r, tiles_gu)
                if sgu > 1:
                    gpart.add((item, part, tile))
                    old = red_gu[item * tiles_gu + tile]
                    red_gu[item * tiles_gu + tile] += 1
                    yield
                    if old == sgu - 1:
                        assert all((item, q, tile) in gpart for q in range(sgu))
                        red_gu[item * tiles_gu + tile] = 0
                    else:
                        task = nxt
                        continue
                assert (item, tile) not in hbuf
                hbuf.add((item, tile))
                done_gu[item] += 1
                yield
            else:
                u = task - t_gu
                item, r = divmod(u, per_dn)
                part, tile = divmod(r, tiles_dn)
                while done_gu[item] < tiles_gu:   # frag_gemm's poll (after the first weight copies)
                    yield "poll"
                assert all((item, tt) in hbuf for tt in range(tiles_gu))
                ypart.add((item, part, tile))
                old = done_dn[tile]
                done_dn[tile] += 1
                yield
                if old == nitems * sdn - 1:
                    assert all((it_, q, tile) in ypart for it_ in range(nitems) for q in range(sdn))
                    assert tile not in out
                    out[tile] = True
                    done_dn[tile] = 0
            task = nxt
        old = ws["fin"]
        ws["fin"] += 1
        if old == warps - 1:
            ws["task"] = ws["fin"] = 0
            done_gu[:] = [0] * nitems

    live = [warp() for _ in range(warps)]
    spins = 0
    while live:
        w = rnd.choice(live)
        try:
            spins = spins + 1 if next(w) == "poll" else 0
        except StopIteration:
            live.remove(w)
            spins = 0
        assert spins < 10000, "every live warp is polling: deadlock"
    return ws, done_gu, done_dn, red_gu, out, hbuf


@pytest.mark.parametrize("sgu,sdn,warps", [(1, 1, 3), (2, 1, 5), (4, 2, 7), (4, 4, 2), (2, 2, 40)])
def test_splitk_task_protocol_simulation(sgu, sdn, warps):
    """Every gate_up tile reduced once after all its parts, every down tile combined once after all (item,
    part) arrivals, no deadlock whatever the interleaving, and every counter back to zero (graph replays)."""
    nitems, tiles_gu, tiles_dn = 3, 4, 3
    for seed in range(5):
        ws, done_gu, done_dn, red_gu, out, hbuf = _simulate_splitk(nitems, tiles_gu, tiles_dn, sgu, sdn, warps, seed)
        assert ws == {"task": 0, "fin": 0} and not any(done_gu) and not any(done_dn) and not any(red_gu)
        assert sorted(out) == list(range(tiles_dn)) and len(hbuf) == nitems * tiles_gu


def test_forced_small_variant_restores_table_and_variant():
    from workbench.moe.fused import forced_small_variant

    saved, saved_variant = list(SMALL_TABLE), SMALL_VARIANT["name"]
    with forced_small_variant("ctasplit"):
        assert [small_variant_for(m, 8) for m in (1, 9, 16, 17)] == ["ctasplit", "ctasplit", "ctasplit", None]
    assert SMALL_TABLE == saved and SMALL_VARIANT["name"] == saved_variant
    with pytest.raises(ValueError, match="small variant"):
        with forced_small_variant("splitk_s9"):
            pass
    assert SMALL_TABLE == saved and SMALL_VARIANT["name"] == saved_variant
    with pytest.raises(RuntimeError, match="inside"):
        with forced_small_variant("v3"):
            raise RuntimeError("inside")
    assert SMALL_TABLE == saved and SMALL_VARIANT["name"] == saved_variant


def test_run29g_profile_sections_read_both_kernels():
    """report.run29g_sections: the committed per-instruction profile of the dispatched pair at M = 1 gives one section
    per kernel, each with its stage loops and its most-stalled instructions (the down kernel's ring wait among them)."""
    from workbench.moe.report import run29g_sections

    parts = run29g_sections()
    assert len(parts) == 2 and "gate/up kernel" in parts[0] and "down kernel" in parts[1]
    assert all("instructions per stage" in p and "% of stall samples" in p for p in parts)
    assert "BRA.DIV" in parts[1]
