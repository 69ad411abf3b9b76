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
