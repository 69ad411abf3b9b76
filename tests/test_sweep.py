"""The engine sweep, the KV churn and the sweep's input checks on the CPU with the tiny model; the
trained:<type> methods on a fixture acceptance.json."""
import json

import pytest
import torch

from workbench.engine.synthetic import synthetic_model, tiny_config
from workbench.sweep import engine as sweep
from workbench.sweep.layout import churn, fragmentation, runs
from workbench.validation import InvalidParameter


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)  # a 2-core shared machine: no oversubscription spin in the timed steps
    return synthetic_model(tiny_config(), layers=None)


def test_constant_acceptance_engine_rates_match_accepted_over_step_time(model):
    eng = sweep.make_engine(model, [48], 41, 4, 8)
    prompt = sweep.prompts_for(48, 1, model.config.vocab_size)[0]
    cont = sweep.run_session(eng, [prompt], 41, sweep.decode_config("greedy", 4, 8))["results"][0].tokens
    for method, p_top, acc in (("greedy", None, 1), ("ddtree-high", 1.0, 4)):
        r = sweep.measure_point(eng, prompt, method, 41, (9, 41), 4, 8, cont, repeats=2, p_top=p_top)
        assert set(r["accepted"]) == {acc}  # constant acceptance: greedy 1, p_top 1 the whole depth + root
        assert r["committed"] == sum(r["accepted"]) and r["generated"] == 41
        c = r["check_sustained"]
        assert c["mean_accepted"] == acc and c["within"], c  # same run: within the 5%
        t = r["check_two_point"]
        assert t["identity"] == pytest.approx(c["identity"]) and t["measured"] == r["two_point"] > 0
        assert t["disagreement"] == pytest.approx(r["two_point"] / c["identity"] - 1)


def test_context_and_concurrency_sweeps_return_one_row_per_point(model):
    rows = sweep.context_sweep(model, [16, 64], ["greedy", "ddtree-low"], generate=24, two_point=(4, 20),
                               block=4, budget=8, repeats=1)
    assert [(r["context"], r["method"]) for r in rows] == [(16, "greedy"), (16, "ddtree-low"),
                                                          (64, "greedy"), (64, "ddtree-low")]
    assert all(r["ttft_ms"] > 0 and len(r["step_ms"]) == len(r["accepted"]) for r in rows)
    conc = sweep.concurrency_sweep(model, [1, 3], 16, ["greedy"], generate=12, block=4, budget=8)
    assert [r["concurrency"] for r in conc] == [1, 3] and len(conc[1]["per_request"]) == 3
    assert conc[1]["committed"] == 3 * conc[0]["committed"]


def test_churn_scatters_slots_and_the_metric_sees_it():
    assert runs([5, 6, 7, 3, 2, 9]) == [3, 2, 1]
    base = churn("contiguous")["fragmentation"]
    assert base["runs_per_request"] == 1.0
    sc = churn("scattered")["fragmentation"]
    assert sc["runs_per_request"] > 20 and sc["mean_run_length"] < 2.0
    co = churn("compacted")["fragmentation"]
    # the engine's compacted commit keeps each step's accepted rows in its allocation's first slots: longer runs
    # than scattered, but the free stack still interleaves steps and requests (it does not restore contiguity)
    assert co["mean_run_length"] > 1.2 * sc["mean_run_length"] and co["runs_per_request"] > 10
    alone = churn("greedy", rows=1, requests=1)["fragmentation"]  # no churn: prompt run + decode run
    assert alone["runs_per_request"] == 2.0
    with pytest.raises(InvalidParameter) as e:
        fragmentation([])
    assert e.value.name == "requests"


@pytest.mark.parametrize("kw, name", [
    (dict(contexts=[0]), "contexts"),
    (dict(contexts=[2000]), "contexts"),
    (dict(concurrency=[0]), "concurrency"),
    (dict(concurrency=[65]), "concurrency"),
    (dict(two_point=[40, 8]), "two_point"),
    (dict(methods=["beam"]), "methods"),
    (dict(generate=2000), "generate"),
    (dict(kv_slots=120), "contexts"),
    (dict(concurrency=[8], kv_slots=600), "concurrency"),
])
def test_out_of_range_inputs_are_clear_errors(kw, name):
    args = dict(contexts=[64], concurrency=[1], generate=64, two_point=[8, 40], methods=["greedy"],
                rope_limit=1024, block=8, budget=16)
    args.update(kw)
    with pytest.raises(InvalidParameter) as e:
        sweep.check_sweep(**args)
    assert e.value.name == name and "is not allowed" in str(e.value)


def test_context_beyond_the_rope_limit_names_it(model):
    with pytest.raises(InvalidParameter, match="rope/YaRN limit 1024"):
        sweep.context_sweep(model, [1000], ["greedy"], generate=16, two_point=(4, 8))


def test_cli_sweep_prints_every_part_and_rejects_bad_input(capsys):
    from workbench.cli import main

    rc = main(["sweep", "--engine", "--contexts", "16", "--concurrency", "1", "--method", "greedy",
               "--generate", "12", "--two-point", "4", "12", "--block", "4", "--budget", "8", "--repeats", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and all(t in out for t in ("contexts", "concurrency", "KV layout", "decomposition"))
    assert "source (seed-000)" in out and "20.14" in out  # 2.9 / 0.144 s from data/anchors/source_context.json
    rc = main(["sweep", "--engine", "--contexts", "5000", "--method", "greedy"])
    err = capsys.readouterr().err
    assert rc == 2 and "contexts=" in err and "rope/YaRN limit 1024" in err
    rc = main(["sweep", "--engine", "--concurrency", "0", "--method", "greedy"])
    assert rc == 2 and "concurrency=" in capsys.readouterr().err


def test_bench_entry_writes_context_sweep_with_provenance(tmp_path):
    import json

    from workbench.bench.sweep import main

    rc = main(["--out", str(tmp_path), "--contexts", "16", "--concurrency", "1", "--method", "greedy",
               "--generate", "12", "--two-point", "4", "12", "--block", "4", "--budget", "8", "--repeats", "1"])
    doc = json.loads((tmp_path / "context_sweep.json").read_text())
    assert rc == 0 and doc["name"] == "context_sweep" and doc["provenance"]["git_commit"]
    assert doc["notes"] == "CPU dry run: not H200 data" and doc["parameters"]["contexts"] == [16]
    assert len(doc["samples"][0]["step_ms"]) == len(doc["samples"][0]["accepted"]) > 0
    assert main(["--out", str(tmp_path), "--contexts", "0"]) == 2


def test_phase_breakdown_sums_to_the_step(model):
    from workbench.engine.generate import PHASES
    from workbench.sweep.eager_phases import phase_breakdown

    rows = phase_breakdown(model, [16], ["greedy", "ddtree-high"], generate=12, block=4, budget=8)
    assert [r["method"] for r in rows] == ["greedy", "ddtree-high"]
    for r in rows:
        assert r["total"] == pytest.approx(sum(r[p] for p in PHASES), rel=1e-9) and r["verify"] > 0
    assert rows[0]["tree_build"] == 0.0 and rows[1]["tree_build"] > 0 and rows[1]["mean_accepted"] > 1


# ---------------------------------------------------------------- trained:<type> (issue 28 item 6), fixture file

COMMIT = "0123abc"


def acceptance_json(tmp_path, rows=(("math", 4, 8, 2.5), ("math", 8, 4, 3.0), ("code", 4, 8, 4.0))):
    """A small acceptance.json (text type, block, budget, mean accepted length) with a provenance commit."""
    f = tmp_path / "acceptance.json"
    f.write_text(json.dumps({"provenance": {"git_commit": COMMIT}, "notes": "fixture", "results": {"rows": [
        {"text_type": t, "block": b, "budget": k, "mean_accepted": a} for t, b, k, a in rows]}}))
    return f


def test_trained_method_is_a_scripted_drafter_calibrated_to_the_measured_mean(tmp_path):
    from workbench.engine.drafters import ScriptedDrafter

    f, vocab = acceptance_json(tmp_path), tiny_config().vocab_size
    for block, budget in ((4, 8), (8, 4)):  # budget >= depth, and a budget that cuts the chain short
        src = sweep.acceptance_source("trained:math", block, budget, vocab, acceptance_file=f)
        assert src["source"] == "trained" and src["git_commit"] == COMMIT and 0 < src["p_top"] < 1
        assert (src["text_type"], src["block"], src["budget"]) == ("math", block, budget)
        d = ScriptedDrafter([], vocab, block=block, p_top=src["p_top"])
        assert d.expected_accepted_length(budget) == pytest.approx(src["mean_accepted"], abs=1e-9)
        assert src["expected_accepted"] == pytest.approx(src["mean_accepted"], abs=1e-9)
    assert sweep.acceptance_source("trained:code", 4, 8, vocab, acceptance_file=f)["p_top"] == 1.0  # = block
    assert sweep.calibrated_p_top(1.0, 4, 8, vocab) == 0.0
    with pytest.raises(InvalidParameter, match=r"in \[1, 4\]"):
        sweep.calibrated_p_top(4.5, 4, 8, vocab)
    assert sweep.acceptance_source("ddtree-low", 4, 8, vocab) == {"source": "scripted",
                                                                  "p_top": sweep.P_TOP["ddtree-low"]}
    assert sweep.acceptance_source("greedy", 4, 8, vocab) is None


def test_trained_methods_run_in_both_sweeps_and_record_their_source(model, tmp_path):
    f = acceptance_json(tmp_path)
    rows = sweep.context_sweep(model, [16], ["greedy", "trained:code", "trained:math"], generate=21,
                               two_point=(5, 21), block=4, budget=8, repeats=1, acceptance_file=f)
    greedy, code, math = rows
    assert greedy["acceptance"] is None and greedy["p_top"] is None
    assert set(code["accepted"]) == {4} and code["p_top"] == 1.0  # measured = block: the whole depth every step
    for r, t in ((code, "code"), (math, "math")):
        a = r["acceptance"]
        assert (a["source"], a["text_type"], a["git_commit"], a["file"]) == ("trained", t, COMMIT, str(f))
        assert r["p_top"] == a["p_top"] and 1 <= r["mean_accepted"] <= 4
    conc = sweep.concurrency_sweep(model, [2], 16, ["trained:math"], generate=12, block=4, budget=8,
                                   acceptance_file=f)
    assert conc[0]["p_top"] == conc[0]["acceptance"]["p_top"] == math["p_top"]


def test_trained_methods_unknown_unmeasured_or_without_file_are_clear_errors(tmp_path):
    args = dict(contexts=[64], concurrency=[1], generate=64, two_point=[8, 40], rope_limit=1024, block=8,
                budget=16, acceptance_file=acceptance_json(tmp_path))
    with pytest.raises(InvalidParameter, match="greedy, ddtree-high, ddtree-low, trained:chat, trained:math, "
                                               "trained:code") as e:
        sweep.check_sweep(methods=["greedy", "trained:poetry"], **args)
    assert e.value.name == "methods"
    with pytest.raises(InvalidParameter, match=r"methods='trained:math'.*\(4, 8\), \(8, 4\)") as e:
        sweep.check_sweep(methods=["trained:math"], **args)
    with pytest.raises(InvalidParameter, match="one of the measured text types: code, math"):
        sweep.check_sweep(methods=["trained:chat"], **args)
    with pytest.raises(FileNotFoundError, match="none.json"):
        sweep.check_sweep(methods=["trained:math"], **{**args, "acceptance_file": tmp_path / "none.json"})
    with pytest.raises(InvalidParameter) as e:
        sweep.drafter_for("trained:math", [[1, 2]], 64, 4)
    assert e.value.name == "budget" and "calibrated" in e.value.allowed


def test_cli_sweep_takes_a_trained_method(tmp_path, monkeypatch, capsys):
    from workbench.cli import main
    from workbench.projection import trained

    f = acceptance_json(tmp_path)
    monkeypatch.setattr(trained, "default_file", lambda: f)  # in place of data/measurements/h200/acceptance.json
    argv = ["sweep", "--engine", "--contexts", "16", "--concurrency", "1", "--method", "trained:math",
            "--generate", "12", "--two-point", "4", "12", "--block", "4", "--repeats", "1"]
    assert main(argv + ["--budget", "8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["acceptance"]["git_commit"] for r in doc["contexts"] + doc["concurrency"]] == [COMMIT, COMMIT]
    assert main(argv + ["--budget", "16"]) == 2
    assert "methods='trained:math' is not allowed" in capsys.readouterr().err
