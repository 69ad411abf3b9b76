"""acceptance_for's ``path``: a measurement file read in place of data/measurements/h200/acceptance.json."""
import json

import pytest

from workbench.acceptance.measure import acceptance_for, measured_rows
from workbench.validation import InvalidParameter


def test_acceptance_for_reads_the_file_at_path_and_names_a_missing_one(tmp_path):
    rows = [{"text_type": "code", "block": 8, "budget": k, "mean_accepted": 1.5 + k / 64} for k in (1, 32)]
    f = tmp_path / "acceptance.json"
    f.write_text(json.dumps({"results": {"rows": rows}}))
    assert measured_rows(path=f) == rows
    assert acceptance_for("code", 8, 32, path=f) == rows[1]["mean_accepted"]
    with pytest.raises(InvalidParameter, match=r"a measured \(block, budget\) for 'code': \(8, 1\), \(8, 32\)"):
        acceptance_for("code", 16, 32, path=str(f))
    assert measured_rows(path=tmp_path / "absent.json") == []
    with pytest.raises(FileNotFoundError, match="absent.json"):
        acceptance_for("code", 8, 32, path=tmp_path / "absent.json")


def _doc(**drafter):
    rows = []
    for b in (8, 16):
        for k, a, s in ((1, 1.2, 0.9), (32, 1.5, 1.1), (512, 1.8, 1.3 if b == 8 else 1.0)):
            rows.append({"text_type": "math", "block": b, "budget": k, "mean_accepted": a, "prompts": 2,
                         "rounds": 40, "histogram": [30, 10] + [0] * (b - 2), "speedup": s,
                         "tokens_per_forward": a - 0.01})
    dr = {"steps": 100, "final_loss": 0.05, "loss_curve": [[1, 0.1, 20.0], [100, 9.0, 0.05]],
          "train_config": {"batch": 8}, **drafter}
    return {"results": {"rows": rows, "greedy": {"math": {"max_new": 48}}, "drafter": dr}}


def test_reading_says_goal_sample_level_overfitting_and_noise():
    from workbench.acceptance.figures import reading, training_data

    doc = _doc(segments=[{"first_step": 1, "last_step": 100, "data": {"sequences": 40, "generation_seconds": 45.0}}],
               data={"sequences": 40, "generation_seconds": 45.0}, resumed_from=None)
    assert training_data(doc) == ({"sequences": 40, "generation_seconds": 45.0}, "")
    text = reading(doc)
    assert "on 2 held-out prompt(s) x 48 new tokens per text type" in text
    assert "goal (math, budget 32 >= 1.25 x chain): met (1.25x), on 2 prompt(s) and 40 rounds" in text
    assert "still gaining >= 5% per budget step at 512" in text
    assert "below every reference line (source: reasoning text 2.9;" in text
    assert "on 40 sequences from 45 s of generation (about 20 passes over them)" in text
    assert "over-fitting of a small self-distillation set" in text
    assert "speedup over greedy 0.90-1.30" in text and "differ by up to 0.30 in speedup" in text
    # an older file whose run resumed a checkpoint and trained nothing: its data block is not the training data
    old = _doc(data={"sequences": 512}, resumed_from=100)
    assert training_data(old)[0] is None and "regenerated data" in training_data(old)[1]
    assert "512 sequences" not in reading(old) and "training data not recorded in this file" in reading(old)


def test_reading_of_the_committed_h200_file():
    from workbench.acceptance.figures import load_doc, reading

    doc = load_doc("h200")
    if doc is None:
        pytest.skip("no committed acceptance measurement")
    text = reading(doc)
    assert "goal (math, budget 32 >= 1.25 x chain)" in text and "Absolute level" in text
    if doc.get("provenance_note"):
        assert text.endswith("Provenance: " + doc["provenance_note"])
