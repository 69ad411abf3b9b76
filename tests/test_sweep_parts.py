"""A long sweep split over processes: ``python -m workbench.bench.sweep --part ... --name ...`` per part, then
``--merge`` into one context_sweep.json that the paper's generator reads (CPU, tiny model)."""
import json

import pytest

from workbench.bench import sweep as bench_sweep
from workbench.sweep.run import merge
from workbench.validation import InvalidParameter

TINY = ["--synthetic", "tiny", "--generate", "12", "--two-point", "4", "8", "--repeats", "1", "--block", "4",
        "--budget", "4", "--concurrency", "1", "2", "--threads", "1"]


def _run(tmp_path, *args) -> dict:
    assert bench_sweep.main([*TINY, "--out", str(tmp_path), *args]) == 0
    return json.loads((tmp_path / f"{args[args.index('--name') + 1]}.json").read_text())


def test_parts_merge_into_one_sweep_the_report_reads(tmp_path):
    a = _run(tmp_path, "--part", "contexts", "--contexts", "16", "--name", "part_a")
    b = _run(tmp_path, "--part", "contexts", "concurrency", "layout", "--contexts", "48", "--name", "part_b")
    assert a["parameters"]["parts"] == ["contexts"] and a["results"]["concurrency"] == []
    assert set(a["parameters"]["part_seconds"]) == {"contexts"} and a["parameters"]["part_seconds"]["contexts"] > 0
    assert b["results"]["layout"] and b["results"]["concurrency"]
    assert bench_sweep.main(["--merge", str(tmp_path / "part_a.json"), str(tmp_path / "part_b.json"),
                             "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "context_sweep.json").read_text())
    assert [r["context"] for r in doc["results"]["contexts"]] == sorted([r["context"] for r in doc["results"]["contexts"]])
    assert {r["context"] for r in doc["results"]["contexts"]} == {16, 48}
    assert doc["parameters"]["contexts"] == [16, 48] and doc["parameters"]["merged_runs"] == 2
    assert len(doc["samples"]) == len(doc["results"]["contexts"])
    assert doc["results"]["concurrency"] == b["results"]["concurrency"]
    assert doc["provenance"] == a["provenance"]   # the parts' machine, not the merging one
    assert [m["file"] for m in doc["parameters"]["merged_from"]] == ["part_a.json", "part_b.json"]
    from workbench.reports import context

    text = context.render(context.PAPER.read_text(), doc)   # every generated block of the paper from the merged file
    assert "context 48" in text or "48" in text


def test_merge_refuses_runs_of_different_plans_and_repeats():
    base = {"parameters": {"synthetic": "tiny", "layers": 3, "contexts": [16], "parts": ["contexts"],
                           "sustained_at": [16]}, "model": "tiny",
            "contexts": [{"context": 16, "method": "greedy"}], "concurrency": [], "layout": [], "phases": []}
    other = {**base, "parameters": {**base["parameters"], "layers": 4}}
    with pytest.raises(InvalidParameter, match="layers"):
        merge([base, other])
    with pytest.raises(InvalidParameter, match="each \\(context, method\\) once"):
        merge([base, base])
    lay = {**base, "contexts": [], "parameters": {**base["parameters"], "parts": ["layout"]}}
    with pytest.raises(InvalidParameter, match="both took 'layout'"):
        merge([lay, lay])
    with pytest.raises(InvalidParameter, match="at least one"):
        merge([])


def test_real_prefill_up_to_a_context_beside_synthetic_rows(tmp_path):
    """--prefill synthetic --real-prefill-upto N --prefill-chunk K: contexts up to N are prefilled by the engine in
    K-token forwards (TTFT recorded), longer ones get seeded random KV rows (no TTFT); the estimate counts the
    prefills."""
    doc = _run(tmp_path, "--part", "contexts", "--contexts", "16", "48", "--prefill", "synthetic",
               "--real-prefill-upto", "16", "--prefill-chunk", "4", "--method", "greedy", "--name", "mixed")
    rows = {r["context"]: r for r in doc["results"]["contexts"]}
    assert rows[16]["prefill"].startswith("real (4") and rows[16]["ttft_ms"] > 0
    assert rows[48]["prefill"] == "synthetic" and rows[48]["ttft_ms"] is None
    assert doc["parameters"]["real_prefill_upto"] == 16 and doc["parameters"]["prefill_chunk"] == 4
    from workbench.bench.sweep import H200_PLAN, plan_seconds

    with_real = plan_seconds({**H200_PLAN, "sustained_at": [4096]}, None)["total_s"]
    without = plan_seconds({**H200_PLAN, "sustained_at": [4096], "real_prefill_upto": None}, None)["total_s"]
    assert with_real > without


def test_plan_estimate_counts_only_the_parts_run():
    from workbench.bench.sweep import H200_PLAN, plan_seconds

    whole = plan_seconds({**H200_PLAN, "contexts": [65536, 131072], "sustained_at": []}, None)
    ctx = plan_seconds({**H200_PLAN, "contexts": [65536, 131072], "sustained_at": []}, None, parts=("contexts",))
    assert ctx["concurrency_s"] == 0 and ctx["contexts_s"] == whole["contexts_s"] > 0
    # an empty sustained_at means no long run (not "all contexts"): the long run costs more
    every = plan_seconds({**H200_PLAN, "contexts": [65536, 131072], "sustained_at": None}, None, parts=("contexts",))
    assert every["contexts_s"] > ctx["contexts_s"]


def test_notebook_shows_a_committed_measurement(tmp_path):
    """Notebook 03's ``measurement``: a context_sweep.json shown in the sweep's shape, its samples put back; a
    path that is not one is a clear error."""
    from workbench.sweep.run import decomposition, notebook_doc
    from workbench.sweep.tables import tables
    from workbench.validation import InvalidParameter

    doc = _run(tmp_path, "--part", "contexts", "--contexts", "16", "--method", "greedy", "--name", "one")
    shown = notebook_doc(measurement=str(tmp_path / "one.json"))
    assert [r["context"] for r in shown["contexts"]] == [16]
    assert shown["contexts"][0]["step_ms"] == doc["samples"][0]["step_ms"]
    assert tables(shown)["contexts"] and decomposition(shown)
    with pytest.raises(InvalidParameter, match="measurement"):
        notebook_doc(measurement=str(tmp_path / "absent.json"))
