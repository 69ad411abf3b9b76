"""The trained drafter's measured acceptance as the projection's input (issue 28 item 6), on a fixture
acceptance.json written here (the H200 file may or may not be committed: nothing here reads it)."""
import json

import pytest

from workbench.projection import project, trained
from workbench.projection.project import check_inputs
from workbench.validation import InvalidParameter

MATH_16_32 = 3.25   # the fixture's measured accepted length of math text at block 16, budget 32
COMMIT = "0123abc"


def fixture_file(tmp_path, rows=(("math", 16, 32, MATH_16_32), ("math", 16, 8, 2.75), ("code", 8, 8, 4.0))):
    """A small acceptance.json in the shape python -m workbench.bench.acceptance writes."""
    doc = {"name": "acceptance", "provenance": {"git_commit": COMMIT, "date_utc": "2026-01-02T03:04:05+00:00"},
           "notes": "fixture", "results": {"rows": [{"text_type": t, "block": b, "budget": k, "mean_accepted": a}
                                                    for t, b, k, a in rows],
                                           "drafter": {"steps": 7, "final_loss": 1.25}, "target": {"name": "tiny"}}}
    f = tmp_path / "acceptance.json"
    f.write_text(json.dumps(doc))
    return f


def test_trained_entry_projects_like_the_measured_number(tmp_path):
    f = fixture_file(tmp_path)
    res = project("b300", 16, 32, [MATH_16_32, "trained:math"], acceptance_file=f, use_measurements=False)
    assert res.accept == (MATH_16_32, MATH_16_32)
    given, measured = res.tokens_per_s
    assert measured == given  # the same accepted length: the same tokens/s at every corner
    src = res.accept_sources
    assert src[0] is None and src[1].text_type == "math" and src[1].git_commit == COMMIT
    assert (src[1].block, src[1].budget, src[1].drafter_steps, src[1].dry_run) == (16, 32, 7, False)
    d = res.to_dict()["inputs"]["accept_sources"]
    assert d[0] == {"source": "given"} and d[1]["source"] == "trained" and d[1]["file"] == str(f)
    assert f"trained drafter on math text, block 16, budget 32: measured 3.250 ({f} at {COMMIT})" in res.table()
    assert res.accept_label(1) == "3.25 (trained:math)" and res.accept_label(0) == "3.25"


def test_accept_trained_appends_and_resolves_at_the_projections_budget(tmp_path):
    f = fixture_file(tmp_path)
    res = project("b300", 16, 8, [4], accept_trained=["trained:math"], acceptance_file=f, use_measurements=False)
    assert res.accept == (4.0, 2.75) and res.accept_sources[1].budget == 8


@pytest.mark.parametrize("kw, name, message", [
    (dict(accept=["trained:poetry"]), "accept", "trained:chat, trained:math, trained:code"),
    (dict(accept=["math"]), "accept", "trained:chat, trained:math, trained:code"),
    (dict(accept=[12], accept_trained=["math"]), "accept_trained", "trained:chat, trained:math, trained:code"),
    (dict(accept=["trained:math"], budget=128), "accept", r"a measured \(block, budget\) for 'math': \(16, 8\), "
                                                          r"\(16, 32\)"),
    (dict(accept=["trained:chat"]), "accept", "one of the measured text types: code, math"),
])
def test_unknown_or_unmeasured_trained_entries_are_clear_errors(tmp_path, kw, name, message):
    args = dict(gpu="b300", block=16, budget=32, acceptance_file=fixture_file(tmp_path))
    args.update(kw)
    with pytest.raises(InvalidParameter, match=message) as e:
        check_inputs(**args)
    assert e.value.name == name


def test_a_measured_value_the_tree_cannot_reach_is_refused_not_clipped(tmp_path):
    f = fixture_file(tmp_path, rows=(("math", 16, 2, 3.5),))   # above budget + 1 = 3 nodes
    with pytest.raises(InvalidParameter, match=r"a measured accepted length in \[1, 3\]"):
        check_inputs("b300", 16, 2, ["trained:math"], acceptance_file=f)


def test_missing_file_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.json"):
        project("b300", 16, 32, ["trained:math"], acceptance_file=tmp_path / "nothing.json")


def test_cli_takes_trained_entries_and_exits_2_when_not_measured(tmp_path, capsys):
    from workbench.cli import main

    f = str(fixture_file(tmp_path))
    base = ["project", "--gpu", "b300", "--block", "16", "--anchors-only", "--acceptance-file", f]
    assert main(base + ["--budget", "32", "--accept", "12", "trained:math", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["inputs"]["accept"] == [12, MATH_16_32]
    assert doc["inputs"]["accept_sources"][1]["git_commit"] == COMMIT
    assert main(base + ["--budget", "512", "--accept", "trained:math"]) == 2
    err = capsys.readouterr().err
    assert "accept='trained:math' is not allowed" in err and "(16, 8), (16, 32)" in err


def test_notebook_parameter_checked_before_the_run(tmp_path, monkeypatch):
    from workbench import pipeline

    monkeypatch.setattr(trained, "default_file", lambda: fixture_file(tmp_path))
    nbs = pipeline.select(pipeline.discover(), ["04"])
    got = pipeline.resolve_parameters(nbs, [("accept_trained", "trained:math")], {})
    assert got[nbs[0].name]["accept_trained"] == ["trained:math"]
    with pytest.raises(ValueError, match="no notebook ran:\n.*accept_trained='math' is not allowed"):
        pipeline.resolve_parameters(nbs, [("accept_trained", "math")], {})
    with pytest.raises(ValueError, match=r"no notebook ran:\n.*accept='trained:math'.*\(16, 8\), \(16, 32\)"):
        pipeline.resolve_parameters(nbs, [("accept_trained", "trained:math"), ("budget", "128")], {})
