"""CPU tests of the MoE kernel timeline decoder (workbench/moe/trace.py) on synthetic trace words."""
import numpy as np
import pytest

from workbench.moe import trace


def _raw(ctas, tasks_per_cta, t_gu_tasks):
    """Trace words as the kernel writes them: CTA c enters at 1000 + 100 c ns; each task lasts 2 us, down
    tasks wait 500 ns for h; warps arrive at a task's barrier 0, 100, 200, 300 ns apart, the previous task's
    epilogue warp last; epilogues take 400 ns of which the fence 250; tasks are numbered in grab order,
    round-robin over the CTAs."""
    w = np.zeros(ctas * trace.WORDS, dtype=np.uint64)
    n = 0
    for j in range(tasks_per_cta):
        for c in range(ctas):
            base = c * trace.WORDS + 4 + trace.TW * j
            t = 1000 + 100 * c + 500 + j * 3000
            wait = 500 if n >= t_gu_tasks else 0
            end = t + wait + 2000
            last = (j - 1) % 4
            arrive = [end - 300 + 100 * ((wp - last - 1) % 4) for wp in range(4)]
            w[base: base + trace.TW] = [n, t, t + wait, end + 10, *arrive, end + 20, end + 100, end + 350, end + 420]
            n += 1
    for c in range(ctas):
        base = c * trace.WORDS
        w[base: base + 4] = [1000 + 100 * c, 1400 + 100 * c, 1000 + 100 * c + 500 + tasks_per_cta * 3000 + 100,
                             tasks_per_cta]
    return w


def test_constants_match_the_kernel_source():
    trace.check_constants()


def test_decode_and_summarize_synthetic():
    raw = _raw(ctas=4, tasks_per_cta=3, t_gu_tasks=8)
    recs = trace.decode(raw, 4, gate_up_tasks=8)
    assert [r["tasks_taken"] for r in recs] == [3, 3, 3, 3]
    assert [t["phase"] for t in recs[0]["tasks"]] == ["gate_up", "gate_up", "down"]
    s = trace.summarize(recs)
    assert s["tasks"] == {"gate_up": 8, "down": 4}
    assert s["entry_spread_us"] == pytest.approx(0.3)
    assert s["prologue_us_median"] == pytest.approx(0.4)
    assert s["task_us_median"]["gate_up"] == pytest.approx(2.01)
    assert s["down_wait_us_total"] == pytest.approx(4 * 0.5)
    assert s["span_us"] == pytest.approx(0.3 + 0.5 + 9.0 + 0.1)
    assert s["tail_us"] == pytest.approx(s["span_us"] - (0.15 + 0.5 + 9.0 + 0.1))
    busy = 8 * 2.01 + 4 * 2.01   # stages begin to barrier release
    assert s["busy_fraction"] == pytest.approx(busy / (4 * s["span_us"]))
    assert s["arrive_spread_us_median"] == {"gate_up": pytest.approx(0.3), "down": pytest.approx(0.3)}
    assert s["last_is_prev_epilogue"] == {"gate_up": 1.0, "down": 1.0}
    assert s["epilogue_us_median"]["gate_up"] == pytest.approx(0.4)
    assert s["fence_us_median"]["down"] == pytest.approx(0.25)
    assert max(s["busy_ctas"]) <= 4 and sum(s["busy_ctas"]) > 0


def test_decode_rejects_unwritten_and_overflowing_traces():
    raw = _raw(ctas=2, tasks_per_cta=2, t_gu_tasks=2)
    raw[trace.WORDS + 2] = 0                       # CTA 1 never wrote its exit
    with pytest.raises(ValueError, match="CTA 1: header words unwritten"):
        trace.decode(raw, 2, 2)
    raw = _raw(ctas=1, tasks_per_cta=1, t_gu_tasks=1)
    raw[3] = trace.TASKS + 1
    with pytest.raises(ValueError, match="raise MOE_TRACE_TASKS"):
        trace.decode(raw, 1, 1)
    with pytest.raises(ValueError, match="ctas must be in"):
        trace.decode(raw, 0, 1)
    with pytest.raises(ValueError, match="words"):
        trace.decode(raw[:10], 1, 1)


def test_trace_build_compiles_with_nvcc_where_present(tmp_path):
    import shutil
    import subprocess

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    src = trace.KERNEL_DIR / "moe_int4.cu"
    r = subprocess.run(["nvcc", "-arch=sm_90", "-DMOE_TRACE", "-c", str(src), "-o", str(tmp_path / "t.o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def test_committed_trace_tables_and_figure():
    """The notebook's timeline cell: the committed run gives a row per (variant, routing, M) and one line per
    variant at M = 1 (skipped if the file is not committed)."""
    from workbench.moe import plots

    doc = plots.load_moe_trace()
    if doc is None:
        pytest.skip("moe_ctasplit_trace.json not committed")
    rows = plots.trace_rows(doc)
    assert len(rows) == len(doc["results"]["rows"]) and {"span", "fence", "last = prev. epilogue warp"} <= set(rows[0])
    fig = plots.trace_busy_figure(doc, m=1)
    variants = {r["variant"] for r in doc["results"]["rows"]}
    assert len(fig.data) == len(variants) and all(max(t.y) <= 2048 for t in fig.data)
