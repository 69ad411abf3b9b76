import json

import pytest

from workbench import display
from workbench import measure
from workbench.bench import clocks


def test_write_and_load_measurement_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_COMMIT", "abc123")
    p = measure.write_measurement("unit", parameters={"m": 1}, results={"ms": 1.5}, samples=[1.4, 1.5, 1.6],
                                  out_dir=tmp_path)
    doc = json.loads(p.read_text())
    assert doc["name"] == "unit" and doc["parameters"] == {"m": 1} and doc["samples"] == [1.4, 1.5, 1.6]
    prov = doc["provenance"]
    assert prov["git_commit"] == "abc123" and prov["python"] and prov["date_utc"].startswith("20")
    assert measure.median(doc["samples"]) == 1.5


def test_time_cpu_returns_samples():
    s = measure.time_cpu(lambda: sum(range(1000)), warmup=1, reps=5)
    assert len(s) == 5 and all(x > 0 for x in s)


def test_tables():
    rows = [{"a": 1, "b": 2.5, "c": True}, {"a": 12345, "b": 0.001, "c": None}]
    fig = display.table(rows, title="t")
    assert list(fig.data[0].header.values) == ["a", "b", "c"]
    txt = display.text_table(rows)
    assert "12,345" in txt and txt.splitlines()[0].split() == ["a", "b", "c"]


@pytest.mark.gpu
def test_clock_phases_sample_clocks_while_a_graph_runs():
    """clocks.clock_phases: every phase replayed, per-call times positive, nvidia-smi samples inside each phase."""
    import torch

    from workbench.bench.clocks import clock_phases
    from workbench.measure import capture_graphs

    x = torch.zeros(1 << 20, device="cuda")
    [g] = capture_graphs([lambda: [x.add_(1.0) for _ in range(8)]])
    rows, raw = clock_phases([("add", g.replay, 8)], seconds=0.5, idle_s=0.3)
    assert rows[0]["replays"] > 5 and rows[0]["first5_ms_per_call"] > 0
    assert rows[0]["smi_samples"] > 0 and rows[0]["sm_mhz_median"] > 0
    assert raw["idle_sm_mhz_median"] is not None


def test_smi_sampler_parses_a_fake_nvidia_smi(tmp_path, monkeypatch):
    """clocks.smi_sampler on a stand-in nvidia-smi (a script printing CSV lines as the real one does): samples
    parsed with nvidia-smi's own timestamps, the reason mask as hex, and no sample when the tool prints nothing."""
    import time

    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/usr/bin/env python3\n"
                   "import sys, time, datetime\n"
                   "if not any(a.startswith('-lms') for a in sys.argv): sys.exit(0)\n"
                   "while True:\n"
                   "    t = datetime.datetime.now().strftime('%Y/%m/%d %H:%M:%S.%f')[:-3]\n"
                   "    print(f'{t}, 1560, 3201, 690.5, 55, 0x0000000000000004', flush=True)\n"
                   "    time.sleep(0.02)\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    t0 = time.time()
    with clocks.smi_sampler(20) as smi:
        time.sleep(0.4)
    assert len(smi) >= 3
    s = smi[-1]
    assert (s["sm_mhz"], s["power_w"], s["temp_c"]) == (1560.0, 690.5, 55.0)
    assert clocks.clock_event_reason_names(s["reasons"]) == ["sw_power_cap"]
    assert t0 - 1 <= s["t"] <= time.time() + 1


def test_kernel_spans_group_calls_in_order():
    # two calls of two kernels each, records out of order; call 1's second kernel ends last
    recs = [(210.0, 260.0), (0.0, 40.0), (35.0, 57.5), (200.0, 230.0)]
    assert measure.kernel_spans_ms(recs, 2) == [0.0575, 0.06]


def test_kernel_spans_refuse_uneven_and_overlapping_calls():
    with pytest.raises(ValueError, match="do not split evenly into 2 calls"):
        measure.kernel_spans_ms([(0.0, 1.0), (2.0, 3.0), (4.0, 5.0)], 2)
    with pytest.raises(ValueError, match="overlapped"):
        measure.kernel_spans_ms([(0.0, 10.0), (1.0, 2.0), (5.0, 6.0), (7.0, 8.0)], 2)
    with pytest.raises(ValueError, match="calls must be >= 1"):
        measure.kernel_spans_ms([(0.0, 1.0)], 0)
    with pytest.raises(ValueError, match="0 kernel records"):
        measure.kernel_spans_ms([], 3)


@pytest.mark.gpu
def test_copy_timing_probe_times_the_copy_three_ways():
    got = measure.copy_timing_probe(nbytes=64 << 20, reps=6)
    assert got["bytes_moved"] == 2 * (64 << 20)
    for key in ("one", "queued", "span"):
        assert len(got[f"{key}_ms"]) == 6 and got[f"{key}_gb_per_s"] > 0


def test_busy_time_is_the_union_of_the_records_intervals():
    assert measure.busy_us([]) == 0.0
    assert measure.busy_us([(10, 20), (0, 5)]) == 15.0                # disjoint, any order
    assert measure.busy_us([(0, 10), (5, 15), (12, 13)]) == 15.0       # overlaps and containment count once
    assert measure.busy_us([(0, 10), (10, 20)]) == 20.0                # touching
