"""The overhead term measured from the engine step (workbench.projection.overhead), in project() and the CLI."""
import json

import pytest

from workbench.cli import main
from workbench.projection import overhead as mo
from workbench.projection.calibration import load_calibration
from workbench.projection.model import FLOOR_TERMS
from workbench.projection.project import OVERHEAD_MODES, check_overhead, project
from workbench.projection.scenarios import overhead_comparison, overhead_projections, overhead_reading
from workbench.validation import InvalidParameter


def _row(method, fuse, wall, floor, busy, p_top=None, C=1, path="graph"):
    return {"method": method, "p_top": p_top, "path": path, "fuse": fuse, "C": C, "wall_ms": wall,
            "floor_ms": floor, "bytes_floor_ms": floor, "flops_floor_ms": floor / 10, "gpu_busy_ms_per_step": busy,
            "launches_per_step": 100.0, "mean_accepted": 1.0 if method == "greedy" else 4.0,
            "tokens_per_request_step": 1 if method == "greedy" else 33}


def synthetic_doc():
    rows = [_row("greedy", "eager", 20.0, 8.0, 18.0), _row("ddtree", "eager", 50.0, 16.0, 45.0, 0.8),
            _row("greedy", "compile", 16.0, 8.0, 14.0), _row("ddtree", "compile", 40.0, 16.0, 37.0, 0.8),
            _row("ddtree", "compile", 39.0, 16.0, 36.0, 0.95), _row("greedy", "compile", 30.0, 16.0, 28.0, C=8),
            _row("greedy", "eager", 150.0, 8.0, 18.0, path="eager-step")]
    return {"name": "engine_step", "provenance": {"git_commit": "abc1234", "gpu": "NVIDIA H200", "date_utc": "today"},
            "parameters": {"fuses": ["eager", "compile"], "p_tops": [0.8, 0.95], "layers": 61, "prefix": 4096},
            "results": {"rows": rows}}


def test_measured_steps_pick_c1_graph_default_fuse_and_split():
    s = mo.measured_steps(synthetic_doc(), "x.json")
    g, d = s["greedy"], s["ddtree"]
    assert (g.fuse, g.C, g.path, d.fuse, d.p_top) == ("compile", 1, "graph", "compile", 0.8)
    assert g.overhead_ms == pytest.approx(8.0) and g.host_ms == pytest.approx(2.0)
    assert g.kernel_excess_ms == pytest.approx(6.0)
    assert d.overhead_ms == pytest.approx(24.0) and d.host_ms == pytest.approx(3.0)
    assert d.kernel_excess_ms == pytest.approx(21.0)
    assert d.host_ms + d.kernel_excess_ms == pytest.approx(d.overhead_ms)
    assert d.git_commit == "abc1234" and "x.json" in d.provenance
    # other selections
    assert mo.measured_steps(synthetic_doc(), fuse="eager")["ddtree"].wall_ms == 50.0
    assert mo.measured_steps(synthetic_doc(), p_top=0.95)["ddtree"].wall_ms == 39.0


def test_measured_steps_missing_row_or_floor_is_a_clear_error():
    doc = synthetic_doc()
    with pytest.raises(ValueError, match="no greedy row at C=1, path 'graph', fuse 'fp8'"):
        mo.measured_steps(doc, fuse="fp8")
    doc["results"]["rows"] = [dict(r, floor_ms=None) for r in doc["results"]["rows"]]
    with pytest.raises(ValueError, match="lacks wall_ms or floor_ms"):
        mo.measured_steps(doc)
    with pytest.raises(ValueError, match="no results.rows"):
        mo.measured_steps({"results": {}})


def test_transfer_host_unchanged_kernels_scale_with_floor():
    d = mo.measured_steps(synthetic_doc())["ddtree"]
    t1 = mo.transfer(d, 4.0, 1.0)   # floor ratio 0.25
    assert t1["host_ms"] == pytest.approx(3.0) and t1["kernel_ms"] == pytest.approx(21.0 * 0.25)
    assert t1["overhead_ms"] == pytest.approx(3.0 + 5.25)
    t0 = mo.transfer(d, 4.0, 0.0)   # the slow end: the excess unchanged
    assert t0["overhead_ms"] == pytest.approx(d.overhead_ms)
    bad = mo.measured_steps({**synthetic_doc(), "results": {"rows": [
        _row("greedy", "compile", 16.0, 8.0, 17.0), _row("ddtree", "compile", 40.0, 16.0, 41.0, 0.8)]}})["ddtree"]
    with pytest.raises(ValueError, match="negative part"):
        mo.transfer(bad, 4.0, 1.0)


def test_project_measured_from_a_synthetic_doc():
    cal = load_calibration([synthetic_doc()], use_measurements=False)
    r = project("b300", 16, 32, (12, 16), calibration=cal, overhead="measured")
    tr = r.measured_overhead["transfer"]["central"]
    c = r.breakdown["central"]
    floor = sum(c[k] for k in FLOOR_TERMS)
    assert tr["target_floor_ms"] == pytest.approx(floor)
    assert c["overhead"] == pytest.approx(3.0 + 21.0 * floor / 16.0)
    assert r.overhead_kind == "measured" and "abc1234" in r.overhead_mode
    # the slow corner takes the excess unchanged (exponent 0), the fast one scaled
    assert r.breakdown["low"]["overhead"] >= c["overhead"] >= r.breakdown["high"]["overhead"]
    assert any(s["quantity"] == mo.EXPONENT_KEY for s in r.sensitivity)
    # device terms at their floors are never above the model's kernel-fraction terms
    ref = project("b300", 16, 32, (12, 16), calibration=cal)
    for k in FLOOR_TERMS:
        assert c[k] <= ref.breakdown["central"][k] + 1e-9
    assert json.dumps(r.to_dict())  # serialisable with the measured block


def test_project_measured_from_the_committed_file():
    doc = load_calibration(use_measurements=True).engine_step  # data/measurements/h200/engine_step.json
    if doc is None:
        pytest.skip("engine_step.json not committed")
    steps = mo.measured_steps(doc)
    fuse = doc["parameters"]["fuses"][-1]
    for method, st in steps.items():
        rows = [x for x in doc["results"]["rows"] if x["method"] == method and x["C"] == 1 and x["path"] == "graph"
                and x["fuse"] == fuse and (method == "greedy" or x["p_top"] == doc["parameters"]["p_tops"][0])]
        assert st.wall_ms == rows[0]["wall_ms"] and st.floor_ms == rows[0]["floor_ms"]
        assert st.overhead_ms == pytest.approx(rows[0]["wall_ms"] - rows[0]["floor_ms"])
        assert st.host_ms == pytest.approx(rows[0]["wall_ms"] - rows[0]["gpu_busy_ms_per_step"])
        assert st.git_commit == doc["provenance"]["git_commit"]
    r = project("b300", 16, 32, (12, 16), overhead="measured")
    tr = r.measured_overhead["transfer"]["central"]
    d = steps["ddtree"]
    assert r.breakdown["central"]["overhead"] == pytest.approx(
        d.host_ms + d.kernel_excess_ms * tr["target_floor_ms"] / d.floor_ms)
    assert r.tokens_per_s[0]["low"] <= r.tokens_per_s[0]["central"] <= r.tokens_per_s[0]["high"]
    rows = overhead_comparison()
    assert "12.5" in rows[0]["ms"] and any(d.git_commit in x["source"] for x in rows)
    text = overhead_reading(overhead_projections())
    assert "source-anchor" in text and "measured" in text and "largest term" in text


@pytest.mark.parametrize("kw,match", [
    ({"overhead": "anchor"}, "overhead='anchor' is not allowed: one of 'source-anchor', 'measured', a number"),
    ({"overhead": -1}, "overhead=-1 is not allowed"),
    ({"overhead": "measured", "overhead_ms": 8}, "overhead='measured' is not allowed: None when overhead_ms"),
    ({"overhead": "measured", "overhead_cut_ms": 1}, "overhead_cut_ms=1 is not allowed: None unless overhead is"),
    ({"overhead": True}, "overhead=True is not allowed"),
])
def test_overhead_choice_errors(kw, match):
    with pytest.raises(InvalidParameter, match=match.replace("(", r"\(").replace("[", r"\[")):
        project("b300", 16, 32, 12, use_measurements=False, **kw)


def test_overhead_choices():
    assert OVERHEAD_MODES == ("source-anchor", "measured")
    assert check_overhead(None) is None and check_overhead(8) == 8.0
    assert check_overhead("source-anchor", overhead_cut_ms=4.5) == "source-anchor"
    a = project("b300", 16, 32, 12, use_measurements=False, overhead=8)
    b = project("b300", 16, 32, 12, use_measurements=False, overhead_ms=8)
    assert a.step_ms == b.step_ms
    c = project("b300", 16, 32, 12, use_measurements=False, overhead="source-anchor")
    d = project("b300", 16, 32, 12, use_measurements=False)
    assert c.step_ms == d.step_ms
    with pytest.raises(ValueError, match="needs data/measurements/h200/engine_step.json"):
        project("b300", 16, 32, 12, use_measurements=False, overhead="measured")


def _args(*extra):
    return ["project", "--gpu", "b300", "--block", "16", "--budget", "32", "--accept", "12", "16", *extra]


def test_cli_overhead_option(tmp_path, capsys):
    p = tmp_path / "engine_step.json"
    p.write_text(json.dumps(synthetic_doc()))
    assert main(_args("--overhead", "measured", "--calibration", str(p), "--anchors-only", "--json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["inputs"]["overhead"].startswith("measured") and doc["measured_overhead"]["step"]["host_ms"] == 3.0
    assert main(_args("--overhead", "measured", "--calibration", str(p), "--anchors-only")) == 0
    assert "measured overhead: ddtree C=1" in capsys.readouterr().out
    assert main(_args("--overhead", "8", "--anchors-only")) == 0
    assert "fixed 8 ms" in capsys.readouterr().out
    assert main(_args("--overhead", "source-anchor", "--anchors-only")) == 0
    assert "calibrated on the B300 anchor" in capsys.readouterr().out


@pytest.mark.parametrize("extra,message", [
    (("--overhead", "anchor"), "overhead='anchor' is not allowed: one of 'source-anchor', 'measured'"),
    (("--overhead", "-2"), "overhead=-2 is not allowed"),
    (("--overhead", "measured", "--overhead-ms", "3"), "None when overhead_ms is given"),
    (("--overhead", "measured", "--overhead-cut-ms", "1"), "overhead_cut_ms=1 is not allowed"),
    (("--overhead", "measured", "--anchors-only"), "needs data/measurements/h200/engine_step.json"),
])
def test_cli_overhead_errors(capsys, extra, message):
    assert main(_args(*extra)) != 0
    assert message in capsys.readouterr().err
