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


SCHEMA = """
"01":
  parameters:
    n: {type: int, lo: 1, hi: 10}
    scale: {type: float, lo: 0}
    flag: {type: bool}
    sizes: {type: "list[int]", lo: 1, hi: n}
raises:   # a name selector: still matches after the fail-fast test renumbers it
  parameters:
    x: {type: int}
"""


@pytest.fixture()
def nbdir(tmp_path):
    d = tmp_path / "notebooks"
    d.mkdir()
    (d / "parameters.yaml").write_text(SCHEMA)
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
    params = pipeline.resolve_parameters(nbs, [("n", "7"), ("scale", "0.25"), ("flag", "true"), ("sizes", "[4, 7]")])
    assert params["01_small"] == {"n": 7, "scale": 0.25, "flag": True, "sizes": [4, 7]}
    # typed: an int for a float, a single value for a list, 1e1 as the integer 10
    params = pipeline.resolve_parameters(nbs, [("scale", "1"), ("sizes", "2"), ("n", "1e1")])
    assert params["01_small"] == {"scale": 1.0, "sizes": [2], "n": 10}
    assert isinstance(params["01_small"]["scale"], float)
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


@pytest.mark.parametrize("override, message", [
    (("n", "11"), "01_small: n=11 is not allowed: an integer in [1, 10] (value from -p n)"),
    (("n", "abc"), "01_small: n='abc' is not allowed: an integer in [1, 10] (value from -p n)"),
    (("n", "2.5"), "n=2.5 is not allowed"),
    (("scale", "-1"), "scale=-1 is not allowed: a finite number >= 0"),
    (("flag", "1"), "flag=1 is not allowed: true or false"),
    (("sizes", "[0]"), "sizes=[0] is not allowed: a non-empty list of integers in [1, 3] "
                       "(a single value counts as a one-element list) (value from -p sizes)"),
    (("sizes", "[]"), "sizes=[] is not allowed"),
    (("sizes", "[4]"), "sizes=[4] is not allowed"),  # above n = 3, the default
])
def test_bad_values_are_refused_before_anything_runs(nbdir, tmp_path, capsys, override, message):
    out = tmp_path / "out"
    assert main(["run", "--notebooks", str(nbdir), "--out", str(out), "-p", *override]) == 2
    err = capsys.readouterr().err
    assert message in err and "no notebook ran" in err, err
    assert not out.exists()  # nothing ran, nothing written


def test_every_bad_notebook_is_listed_and_defaults_are_checked(nbdir):
    nbs = pipeline.discover(nbdir)
    with pytest.raises(ValueError) as e:
        pipeline.resolve_parameters(nbs, [("01:n", "0"), ("x", "y")])
    assert "01_small: n=0" in str(e.value) and "02_raises: x='y'" in str(e.value)
    _nb(nbdir / "03_bad_default.ipynb", "n = 0\nscale = 0.5\nflag = False\nsizes = [1]", "pass")
    (nbdir / "parameters.yaml").write_text(SCHEMA + '"03": {parameters: {n: {type: int, lo: 1}, scale: {type: float},'
                                           ' flag: {type: bool}, sizes: {type: "list[int]"}}}\n')
    with pytest.raises(ValueError, match=r"03_bad_default: n=0 is not allowed: an integer >= 1 \(value from the "
                                         r"notebook default\)"):
        pipeline.resolve_parameters(pipeline.discover(nbdir), [])


def test_a_parameter_without_a_schema_entry_is_an_error(nbdir):
    (nbdir / "parameters.yaml").write_text(SCHEMA.replace("    flag: {type: bool}\n", ""))
    with pytest.raises(ValueError, match="parameter.s. flag have no entry in notebooks/parameters.yaml"):
        pipeline.resolve_parameters(pipeline.discover(nbdir), [])
    (nbdir / "parameters.yaml").unlink()
    with pytest.raises(ValueError, match="parameters.yaml is missing"):
        pipeline.resolve_parameters(pipeline.discover(nbdir), [])


def test_shipped_notebooks_refuse_what_the_cli_refuses():
    """`-p` values of the shipped notebooks get the library's own message (the CLI's and capacity()'s)."""
    nbs = pipeline.discover()
    cases = [("05", "tp", "1000", "tp=1000 is not allowed: an integer that divides the 64 attention heads"),
             ("05", "context", "1e6", "context=1000000 is not allowed: an integer in [1, 262144] tokens"),
             ("05", "context", "abc", "context='abc' is not allowed: an integer in [1, 262144] tokens"),
             ("05", "gpus", "[h200, tpu]", "gpus=['h200', 'tpu'] is not allowed"),
             ("04", "budget", "100000", "budget=100000 is not allowed: an integer in [1, 1024]"),
             ("04", "accept", "[0]", "accept=[0] is not allowed"),
             ("04", "accept", "17", "accept=17 is not allowed"),
             ("02", "m_values", "[0]", "m_values=[0] is not allowed: a non-empty list of integers >= 1")]
    for nb, name, raw, message in cases:
        with pytest.raises(ValueError) as e:
            pipeline.resolve_parameters(pipeline.select(nbs, [nb]), [(name, raw)])
        assert message in str(e.value) and f"(value from -p {name})" in str(e.value), str(e.value)
    params = pipeline.resolve_parameters(pipeline.select(nbs, ["04"]), [("accept", "12"), ("overhead_ms", "None")])
    assert params["04_b300_projection"] == {"accept": [12.0], "overhead_ms": None}


def test_run_json_records_commit_and_versions(nbdir, tmp_path):
    rec = pipeline.run_notebooks(["01"], [], out_dir=tmp_path / "o", notebook_dir=nbdir, progress=False)
    from workbench.measure import git_commit

    expected = git_commit()  # WORKBENCH_COMMIT where set (a copy without .git), else git rev-parse HEAD (+ -dirty)
    if expected is None:
        assert rec["git"] == {"commit": None, "dirty": None}
    else:
        assert rec["git"] == {"commit": expected.removesuffix("-dirty"), "dirty": expected.endswith("-dirty")}
    v = rec["versions"]
    assert {"python", "torch", "numpy", "plotly", "papermill"} <= set(v) and v["numpy"] and v["plotly"]


def test_html_carries_plotly_js_once(tmp_path):
    """Three figures: plotly.js once in the HTML (with the first), each figure drawn; a widget is a note."""
    d = tmp_path / "nbs"
    d.mkdir()
    (d / "parameters.yaml").write_text('"01": {parameters: {k: {type: int}}}\n')
    _nb(d / "01_figs.ipynb", "k = 3",
        "import plotly.graph_objects as go\n"
        "for i in range(k):\n    go.Figure(go.Bar(y=[i, 1])).show()\n"
        "import ipywidgets\nipywidgets.IntSlider()")
    import os

    before = {k: os.environ.get(k) for k in ("PLOTLY_RENDERER", "JUPYTER_PATH")}
    rec = pipeline.run_notebooks(["01"], [], out_dir=tmp_path / "o", notebook_dir=d, progress=False)
    assert rec["failed"] == 0 and rec["plotly_renderer"] == pipeline.PLOTLY_RENDERER
    assert {k: os.environ.get(k) for k in before} == before  # set for the run only, then restored
    html = (tmp_path / "o" / "01_figs.html").read_text()
    from plotly.offline import get_plotlyjs

    head = get_plotlyjs()[:200]
    assert html.count(head) == 1
    assert html.count("Plotly.newPlot(") == 3
    assert "widget-state" not in html and "An interactive widget" in html
    assert len(html) < len(get_plotlyjs()) + 400_000
    executed = (tmp_path / "o" / "01_figs.ipynb").read_text()
    assert head not in executed  # the executed notebook keeps plotly's mimetype only
