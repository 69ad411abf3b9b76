"""`workbench run` / `workbench list` on small throw-away notebooks."""
import json

import nbformat
import pytest

from workbench import pipeline
from workbench.cli import main


def _nb(path, params_src, body_src):
    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell(params_src)
    p.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# test"), p, nbformat.v4.new_code_cell(body_src)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


@pytest.fixture()
def nbdir(tmp_path):
    d = tmp_path / "notebooks"
    d.mkdir()
    _nb(d / "01_small.ipynb", "n = 3\nscale = 0.5\nflag = False\nsizes = [1, 2]",
        "assert isinstance(n, int) and isinstance(scale, float) and isinstance(sizes, list)\nprint(n * scale, flag)")
    _nb(d / "02_raises.ipynb", "x = 1", "y = x + 1\nraise RuntimeError('boom at cell two')")
    return d


def test_discover_select_and_params(nbdir):
    nbs = pipeline.discover(nbdir)
    assert [nb.name for nb in nbs] == ["01_small", "02_raises"]
    assert [nb.name for nb in pipeline.select(nbs, ["1"])] == ["01_small"]
    assert [nb.name for nb in pipeline.select(nbs, ["raises"])] == ["02_raises"]
    with pytest.raises(ValueError, match="no notebook matches"):
        pipeline.select(nbs, ["99"])
    params = pipeline.resolve_parameters(nbs, [("n", "7"), ("scale", "0.25"), ("flag", "true"), ("sizes", "[4, 8]")])
    assert params["01_small"] == {"n": 7, "scale": 0.25, "flag": True, "sizes": [4, 8]}
    assert params["02_raises"] == {}
    with pytest.raises(ValueError, match="unknown parameter 'bogus'.*01_small: n, scale, flag, sizes"):
        pipeline.resolve_parameters(nbs, [("bogus", "1")])
    with pytest.raises(ValueError, match="unknown parameter '02:n'"):
        pipeline.resolve_parameters(nbs, [("02:n", "1")])


def test_run_writes_run_json_and_outputs(nbdir, tmp_path):
    out = tmp_path / "out"
    rec = pipeline.run_notebooks(["01"], [("n", "5")], out_dir=out, notebook_dir=nbdir, progress=False)
    assert rec["failed"] == 0
    doc = json.loads((out / "run.json").read_text())
    (entry,) = doc["notebooks"]
    assert entry["notebook"] == "01_small" and entry["status"] == "ok"
    assert entry["parameters"] == {"n": 5} and entry["seconds"] > 0
    assert (out / "01_small.ipynb").exists() and (out / "01_small.html").exists()
    executed = nbformat.read(out / "01_small.ipynb", as_version=4)
    assert "2.5 False" in "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code"
                                  for o in c.get("outputs", []))


def test_failing_notebook_nonzero_exit_and_failing_cell(nbdir, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["run", "--notebooks", str(nbdir), "--out", str(out)])
    assert rc != 0
    doc = json.loads((out / "run.json").read_text())
    status = {e["notebook"]: e for e in doc["notebooks"]}
    assert status["01_small"]["status"] == "ok"  # a failure does not stop the others
    bad = status["02_raises"]
    assert bad["status"] == "failed"
    assert bad["error"]["ename"] == "RuntimeError" and "boom at cell two" in bad["error"]["evalue"]
    assert "raise RuntimeError" in bad["error"]["cell_source"]
    assert isinstance(bad["error"]["cell_index"], int)


def test_fail_fast_stops(nbdir, tmp_path):
    (nbdir / "02_raises.ipynb").rename(nbdir / "00_raises.ipynb")
    out = tmp_path / "ff"
    assert main(["run", "--notebooks", str(nbdir), "--out", str(out), "--fail-fast"]) != 0
    doc = json.loads((out / "run.json").read_text())
    assert [e["notebook"] for e in doc["notebooks"]] == ["00_raises"]


def test_cli_unknown_parameter_and_list(nbdir, capsys):
    assert main(["run", "--notebooks", str(nbdir), "-p", "nope", "1"]) != 0
    assert "n, scale, flag, sizes" in capsys.readouterr().err
    assert main(["list", "--notebooks", str(nbdir)]) == 0
    out = capsys.readouterr().out
    assert "01_small" in out and "n = 3" in out


def test_env_command(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "python" in out and "pipeline_runs_on" in out


def test_gpu_profile_names_are_declared():
    """Every parameter the shipped gpu profile sets exists in its notebook."""
    nbs = pipeline.discover()
    params = pipeline.resolve_parameters(nbs, [], pipeline.load_profile("gpu"))
    assert params["01_kernel_parity"]["timing_batch"] == 64
    assert params["02_moe_bandwidth"]["num_experts"] == 384


def test_profile_with_unknown_name_is_an_error(nbdir):
    with pytest.raises(ValueError, match="unknown parameter.*01_small"):
        pipeline.resolve_parameters(pipeline.discover(nbdir), [], {"01": {"nope": 1}})
