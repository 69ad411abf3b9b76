"""Reading a measurement: acceptance_for / histogram_for on both file layouts, the goals and the reading."""
import json

import pytest

from workbench.acceptance.measure import acceptance_for, histogram_for, measured_rows
from workbench.acceptance.run import goal_check
from workbench.validation import InvalidParameter


def _row(t, drafter, method, budget, mean, hist, first=0.5):
    L = 15
    return {"text_type": t, "drafter": drafter, "method": method, "budget": budget, "block": 16,
            "mean_accepted": mean, "ci95": [mean - 0.1, mean + 0.1], "rounds": sum(hist), "tokens": 0, "prompts": 4,
            "histogram": hist, "hit_by_depth": [first] + [0.5] * (L - 1), "reached_by_depth": [10] * L,
            "hit_by_sibling_rank": [[first, 0.1] + [0.0] * 7] + [[0.5] + [0.0] * 8] * (L - 1)}


def _doc():
    rows = []
    for t, base in (("chat", 2.0), ("math", 4.5)):
        rows.append(_row(t, "init_target", "chain", 15, base, [5, 5], 0.6))
        rows.append(_row(t, "init_target", "tree", 32, base * 1.4, [2, 4, 4], 0.75))
        rows.append(_row(t, "init_random", "tree", 32, base, [5, 5], 0.5))
        rows.append(_row(t, None, "lookup", 15, 1.2, [8, 2]))
    st = {"steps": 10, "best": {"loss": 1.0, "chain_accepted": 2.0, "step": 10}, "stopped": "time box",
          "val_curve": [{"step": s, "loss": 2.0 - 0.1 * s} for s in range(0, 11, 5)], "loss_curve": [[1, 0.1, 2.0]]}
    res = {"rows": rows, "best_drafter": "init_target", "training": {"init_target": st},
           "train_config": {"batch": 4}, "data": {"train": {"prompts": 100}}}
    res["goals"] = goal_check(rows, "init_target", 16)
    return {"results": res}


def test_acceptance_for_picks_the_best_drafters_tree_rows(tmp_path):
    doc = _doc()
    assert acceptance_for("math", 16, 32, doc=doc) == pytest.approx(6.3)
    assert histogram_for("chat", 16, 32, doc=doc) == [2, 4, 4]
    assert all(r["method"] == "tree" and r["drafter"] == "init_target" for r in measured_rows(doc))
    with pytest.raises(InvalidParameter, match="text_type"):
        acceptance_for("prose", 16, 32, doc=doc)
    with pytest.raises(InvalidParameter, match=r"\(16, 32\)"):
        acceptance_for("math", 16, 8, doc=doc)
    missing = tmp_path / "none.json"
    with pytest.raises(FileNotFoundError, match="none.json"):
        acceptance_for("math", 16, 32, path=missing)
    p = tmp_path / "a.json"
    p.write_text(json.dumps(doc))
    assert acceptance_for("chat", 16, 32, path=p) == pytest.approx(2.8)


def test_goals_and_reading():
    from workbench.acceptance.figures import reading

    g = _doc()["results"]["goals"]
    assert g["math"]["met"] and not g["chat"]["met"] and g["chat"]["short_by"] == pytest.approx(0.2)
    assert g["math"]["tree_over_chain"] == pytest.approx(1.4) and g["math"]["tree_over_chain_met"]
    assert g["chat"]["first_position_hit"] == 0.75 and g["chat"]["first_position_met"]
    text = reading(_doc())
    assert "chat: 2.80 [2.70, 2.90] vs goal 3.0 (short by 0.20)" in text
    assert "math: 6.30" in text and "prompt lookup 1.20" in text and "still falling" in text


def test_reading_of_the_committed_file():
    from workbench.acceptance.figures import load_doc, reading

    doc = load_doc("h100")
    if doc is None:
        pytest.skip("no committed chat/math/code acceptance measurement")
    text = reading(doc)
    assert "Best drafter" in text and "Predictable vs reasoning" in text
