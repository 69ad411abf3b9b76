"""CPU tests of workbench.moe.sass: stage loops found in ncu source-page CSVs (synthetic and committed)."""
from pathlib import Path

import pytest

from workbench import REPO_ROOT
from workbench.moe.sass import read_source_csv, stage_loop_costs, stage_loops


def _csv(tmp_path: Path, body: list[str]) -> Path:
    lines = ['==PROF== Connected', '"Address","Source","Warp Stall Sampling (All Samples)"']
    lines += [f'"{hex(0x1000 + 16 * i)}","{t}","0"' for i, t in enumerate(body)]
    p = tmp_path / "sass.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_a_loop_with_its_loads_and_moves(tmp_path):
    body = ["S2R R0, SR_TID.X"]                       # before the loop
    loop = ["DEPBAR.LE SB0, 0x2", "LDG.E.128.CONSTANT R8, desc[UR4][R2.64]"]
    loop += [f"HMMA.16816.F32.BF16 R{20 + k}, R4, R8, RZ" for k in range(16)]
    loop += ["LDG.E.128.CONSTANT R40, desc[UR4][R2.64+0x40]", "IMAD.MOV.U32 R8, RZ, RZ, R40", "MOV R9, R41",
             "LDGSTS.E.BYPASS.128 [R1], desc[UR4][R6.64]"]
    top = 0x1000 + 16 * len(body)
    body += loop + [f"@!P0 BRA {hex(top)}", "EXIT"]
    [row] = stage_loops(read_source_csv(_csv(tmp_path, body)))
    assert row["instructions"] == len(loop) + 1 and row["load"] == "LDG.E.128.CONSTANT"
    assert row["loads"] == [1, 18] and (row["first_hmma"], row["last_hmma"]) == (2, 17)
    assert row["loads_after_last_hmma"] == 1 and row["moves_after_last_hmma"] == 2   # LDGSTS is not a load here
    # a loop without 16 HMMA is not a stage loop; a forward branch is not a loop
    assert stage_loops(read_source_csv(_csv(tmp_path, ["HMMA.16816 R1, R2, R3, RZ", "BRA 0x1000"]))) == []
    assert stage_loops(read_source_csv(_csv(tmp_path, loop + ["BRA 0x9000"]))) == []


def test_not_a_source_page_is_an_error(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text('"ID","Kernel"\n"1","k"\n')
    with pytest.raises(ValueError, match="Address"):
        read_source_csv(p)


def test_committed_profiles_show_the_moves_and_their_removal():
    """Runs 14 and 16 (papers/moe_int4.md): ctasplit_x4's stage loops end with moves after the last HMMA, the
    XEND form's do not."""
    base = REPO_ROOT / "data" / "measurements" / "h200"
    x4, x4e = base / "moe_profile_8c7598f" / "sass_ctasplit_x4_m1.csv", base / "moe_small_xend_logs" / "sass_ctasplit_x4e_m1.csv"
    if not (x4.exists() and x4e.exists()):
        pytest.skip("profiles not committed")
    a, b = stage_loops(read_source_csv(x4)), stage_loops(read_source_csv(x4e))
    assert len(a) == len(b) == 2                       # gate/up and down
    assert all(r["moves_after_last_hmma"] > 0 for r in a) and all(r["moves_after_last_hmma"] == 0 for r in b)
    assert {r["load"] for r in a} == {"LDG.E.128.CONSTANT", "LDG.E.128.STRONG.GPU"}


def test_stage_loop_rows_of_the_committed_profiles():
    """plots.stage_loop_rows (notebook 02, the paper's stage_loops block): two loops per committed profile."""
    from workbench.moe import plots

    rows = plots.stage_loop_rows("h200")
    committed = [rel for _, _, rel in plots.STAGE_LOOP_PROFILES
                 if (REPO_ROOT / "data" / "measurements" / "h200" / rel).exists()]
    assert len(rows) == 2 * len(committed)
    assert plots.stage_loop_rows("no_such_gpu") == []
    for r in rows:
        if r["kernel"] == "ctasplit_x4e":
            assert r["moves after the last HMMA"] == 0


def test_stage_loop_costs_of_the_committed_run_18_profiles():
    """Stages counted at the first HMMA match the Kimi shapes at M = 1 (8 experts): gate/up 8 x (2 x 2048 / 16)
    x (7168 / 256), down 8 x (7168 / 16) x (2048 / 256); the fp16 form's gate/up loop issues fewer instructions
    per stage than the bf16 form's, its down loop (unchanged code) the same."""
    folder = REPO_ROOT / "data/measurements/h200/moe_small_f16_logs"
    if not folder.exists():
        pytest.skip("run 18's profiles are not committed")
    loops = {v: {("gu" if r["load"].endswith("CONSTANT") else "dn"): r
                 for r in stage_loop_costs(folder / f"sass_{v}_m1.csv")} for v in ("ctasplit_x4e", "ctasplit_x4eh")}
    for v in loops:
        assert loops[v]["gu"]["stages"] == 8 * 256 * 28 and loops[v]["dn"]["stages"] == 8 * 448 * 8
        assert 0 < loops[v]["gu"]["share of samples"] < 1 and loops[v]["gu"]["samples per stage"] > 0
    assert loops["ctasplit_x4eh"]["gu"]["instructions per stage"] < loops["ctasplit_x4e"]["gu"]["instructions per stage"] - 20
    assert loops["ctasplit_x4eh"]["dn"]["instructions per stage"] == pytest.approx(loops["ctasplit_x4e"]["dn"]["instructions per stage"])


def test_stage_loop_costs_synthetic(tmp_path):
    hdr = '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_long_sb","stall_wait"'
    body = [("S2R R0, SR_TID.X", 1, 4, 1, 0)]
    body += [(f"HMMA.16816.F32.BF16 R{20 + k}, R4, R8, RZ", 10, 2, 8, 2) for k in range(16)]
    body += [("LDG.E.128.CONSTANT R40, desc[UR4][R2.64]", 10, 1, 1, 0), ("@!P0 BRA 0x1010", 10, 1, 0, 1), ("EXIT", 1, 0, 0, 0)]
    lines = ["==PROF== x", hdr] + [f'"{hex(0x1000 + 16 * i)}","{t}","{sm}","{ex}","{lsb}","{w}"'
                                   for i, (t, ex, sm, lsb, w) in enumerate(body)]
    p = tmp_path / "s.csv"
    p.write_text("\n".join(lines) + "\n")
    [r] = stage_loop_costs(p)
    assert r["stages"] == 10 and r["instructions per stage"] == 18.0
    assert r["samples per stage"] == pytest.approx(34 / 10) and r["share of samples"] == pytest.approx(34 / 38)
    # reasons as shares of the loop's samples column (here the synthetic reason counts exceed it)
    assert r["long_sb %"] == pytest.approx(100 * 129 / 34) and r["wait %"] == pytest.approx(100 * 33 / 34)
