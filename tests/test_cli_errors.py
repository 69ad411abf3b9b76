"""Bad invocations of every verb, as a new user makes them: each exits 2 before any work starts, with one line
``workbench <verb>: error: NAME=VALUE is not allowed: WHAT IS`` (workbench.validation), never a traceback."""
from __future__ import annotations

import http.server
import json
import socket
import threading

import pytest

from workbench import REPO_ROOT, pipeline
from workbench import validation
from workbench.cli import main


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def files(tmp_path):
    """Files a user might point a verb at by mistake."""
    f = {"text": tmp_path / "notes.txt", "broken": tmp_path / "broken.json", "file": tmp_path / "a_file",
         "list": tmp_path / "list.json", "folder": tmp_path / "empty_folder"}
    f["text"].write_text("not json {")
    f["broken"].write_text('{"a": 1\n')
    f["file"].write_text("x")
    f["list"].write_text("[1, 2]")
    f["folder"].mkdir()
    f["shipped"] = REPO_ROOT / "data" / "models" / "kimi-k2.6"  # a config.json alone, no tokenizer or weights
    f["acceptance"] = REPO_ROOT / "data" / "measurements" / "h200" / "acceptance.json"
    return {k: str(v) for k, v in f.items()}


def _run(argv, capsys):
    """(exit code, stderr) of ``workbench argv`` run in this process."""
    rc = main(argv)
    return rc, capsys.readouterr().err


PROJECT = ["project", "--gpu", "b300", "--block", "16", "--budget", "32"]

# (argv with {placeholders} from the files fixture, what the one error line must hold: the value and what is allowed)
ITEM_6 = [
    (["serve", "--synthetic", "tiny", "--tokenizer", "{text}"],
     "tokenizer='{text}' is not allowed: the path of a tokenizer.json (or a folder holding one); it is not JSON"),
    (["run", "05", "--out", "{file}"],
     "out='{file}' is not allowed: the run's output folder: an existing writable folder or a new one under a "
     "writable folder; this is an existing file"),
    (["tp", "--nproc", "2", "-m", "no.such.module"],
     "module='no.such.module' is not allowed: an importable module that python -m can run; No module named 'no'"),
    (["sweep", "--endpoint", "notaurl", "--model", "m"],
     "endpoint='notaurl' is not allowed: an http:// or https:// base URL"),
    (["sweep", "--endpoint", "http://127.0.0.1:{port}", "--model", "m", "--contexts", "8", "--concurrency", "1"],
     "endpoint='http://127.0.0.1:{port}' is not allowed: the base URL of a running server; connecting to "
     "127.0.0.1:{port} failed"),
    ([*PROJECT, "--accept", "12", "--acceptance-file", "/nope.json"],
     "acceptance_file='/nope.json' is not allowed: the path of an acceptance measurement"),
    ([*PROJECT, "--accept", "trained:math", "--acceptance-file", "/nope.json"], "it does not exist"),
    (["capacity", "--model", "{broken}"],
     "model='{broken}' is not allowed: the path of a model's config.json; it is not JSON (Expecting ',' delimiter "
     "at line 2, column 1)"),
    ([*PROJECT, "--accept", "trained:math", "--acceptance-file", "{broken}"],
     "acceptance_file='{broken}' is not allowed: the path of an acceptance measurement"),
    (["run", "05", "-p", "model", "{broken}"],
     "05_context_capacity: model='{broken}' is not allowed: the path of a model's config.json; it is not JSON"),
    (["capacity", "--model", "/etc"],
     "model='/etc' is not allowed: a shipped model (one of 'deepseek-v3', 'kimi-k2.6') or the path of a "
     "checkpoint folder holding config.json, or of a config.json; the folder /etc holds no config.json"),
    (["run", "04", "-p", "block", "0"],
     "04_b300_projection: block=0 is not allowed: an integer in [2, 33] (value from -p block)"),
    (["capacity", "--context", ""], "context='' is not allowed: an integer in [1, 262144] tokens"),
    (["sweep", "--engine", "--repeats", "0"], "repeats=0 is not allowed: an integer >= 1"),
    (["run", "05", "--notebooks", "/nope"],
     "notebooks='/nope' is not allowed: the path of a folder of numbered notebooks (NN_*.ipynb); it does not exist"),
    (["serve", "--synthetic", "tiny", "--host", "999.1.1.1"],
     "host='999.1.1.1' is not allowed: an IP address or a host name this machine resolves"),
    (["serve", "--synthetic", "tiny", "--served-model-name", ""],
     "served_model_name='' is not allowed: a non-empty string"),
]

# more a new user tries: the wrong kind of file or folder, a value of the wrong kind, an option of the other mode
MORE = [
    (["run", "05", "--profile", "xyz"], "profile='xyz' is not allowed: one of 'auto', 'cpu', 'gpu'"),
    (["run", "05", "--out", ""], "out='' is not allowed: the run's output folder"),
    (["run", "05", "--notebooks", "{folder}"],
     "notebooks='{folder}' is not allowed: a folder of numbered notebooks (NN_*.ipynb); it holds none"),
    (["run", "05", "--out", "{file}/sub"], "out='{file}/sub' is not allowed: the run's output folder"),
    (["run", "06", "-p", "demo_prompts", "0"], "demo_prompts=0 is not allowed: an integer in [1, 64]"),
    (["run", "03", "-p", "measurement", "/nope.json"],
     "measurement='/nope.json' is not allowed: the path of a JSON file, or None; it does not exist "
     "(value from -p measurement)"),
    (["run", "03", "-p", "contexts", "[1e2, 1e9]"], "contexts=[100, 1000000000] is not allowed"),
    (["run", "05", "-p", "07:context", "1"], "-p 07:context: no selected notebook matches '07'; selected: "
                                             "05_context_capacity"),
    (["run", "05", "--out", "/proc/workbench_out"], "out='/proc/workbench_out' is not allowed: "),
    (["list", "--notebooks", "{file}"], "notebooks='{file}' is not allowed: the path of a folder of numbered "
                                        "notebooks (NN_*.ipynb); this is a file"),
    (["capacity", "--model", "{folder}"], "the folder {folder} holds no config.json"),
    (["capacity", "--model", "{list}"], "model='{list}' is not allowed: a shipped model"),
    (["capacity", "--model", ""], "model='' is not allowed: a shipped model"),
    ([*PROJECT, "--accept", "12", "--acceptance-file", "{acceptance}"],
     "acceptance_file='{acceptance}' is not allowed: given only with a trained:<type> "
     "entry in --accept"),
    ([*PROJECT, "--accept", "trained:math", "--acceptance-file", "{list}"], "it has no such rows"),
    ([*PROJECT, "--accept", "12", "--calibration", "{broken}"],
     "calibration='{broken}' is not allowed: the path of a measurement JSON file"),
    ([*PROJECT, "--accept", "12", "--calibration", "{folder}"], "this is a folder"),
    (["sweep", "--engine", "--sustained", "100"],
     "sustained=100 is not allowed: given only with --endpoint"),
    (["sweep", "--endpoint", "http://127.0.0.1:{port}", "--model", "m", "--block", "4"],
     "block=4 is not allowed: given only with --engine"),
    (["sweep", "--engine", "--synthetic", "kimi"], "synthetic='kimi' is not allowed: one of 'tiny', "),
    (["sweep", "--engine", "--device", "tpu"], "device='tpu' is not allowed: one of 'cpu', 'cuda'"),
    (["sweep", "--engine", "--contexts", "abc"], "contexts=['abc'] is not allowed"),
    (["sweep", "--endpoint", "http://127.0.0.1:{port}", "--model", "m", "--contexts", "0"],
     "contexts=[0] is not allowed: a non-empty list of integers >= 1"),
    (["sweep", "--endpoint", "http://127.0.0.1:99999", "--model", "m"],
     "endpoint='http://127.0.0.1:99999' is not allowed: an http:// or https:// base URL"),
    (["sweep", "--endpoint", "http://127.0.0.1:{port}"], "model=None is not allowed: the served model's name"),
    (["serve", "--synthetic", "tinyy"], "synthetic='tinyy' is not allowed: one of 'tiny', "),
    (["serve", "--synthetic", "tiny", "--layers", "100"], "layers=100 is not allowed: an integer in [1, 3]"),
    (["serve", "--synthetic", "tiny", "--api-key", ""], "api_key='' is not allowed: a non-empty string"),
    (["serve", "--synthetic", "tiny", "--tokenizer", "{folder}"],
     "tokenizer='{folder}' is not allowed: the path of a tokenizer.json (or a folder holding one); the folder "),
    (["serve", "--synthetic", "tiny", "--tokenizer", "{list}"], "is JSON but not a tokenizer"),
    (["serve", "--model", "/etc"], "model='/etc' is not allowed: the path of a checkpoint folder"),
    (["serve", "--model", "{file}"], "model='{file}' is not allowed: the path of a checkpoint folder"),
    (["serve", "--model", "{shipped}"],
     "model='{shipped}' is not allowed: the path of a checkpoint folder (config.json, tokenizer.json, "
     "*.safetensors); it holds no tokenizer.json (or give --tokenizer PATH)"),
    (["serve", "--synthetic", "tiny", "--drafter", "random"],
     "drafter='random' is not allowed: given only with --method ddtree"),
    (["serve", "--synthetic", "tiny", "--method", "ddtree", "--drafter", "{folder}"],
     "drafter='{folder}' is not allowed: 'random' or the path of a DFlash drafter"),
    (["serve", "--synthetic", "tiny", "--capacity", "64", "--max-tokens-limit", "100"],
     "max_tokens_limit=100 is not allowed: an integer in [1, 63]"),
    (["serve", "--synthetic", "tiny", "--host", "8.8.8.8"],
     "host='8.8.8.8' is not allowed: an address of this machine; binding it failed"),
    (["tp", "--nproc", "0", "-m", "workbench.parallel.parity"], "nproc=0 is not allowed: an integer >= 1"),
    (["tp", "--nproc", "two", "-m", "workbench.parallel.parity"], "nproc='two' is not allowed: an integer >= 1"),
    (["tp", "--nproc", "2", "-m", "workbench.parallel"],
     "module='workbench.parallel' is not allowed: an importable module that python -m can run; "
     "workbench.parallel is a package without __main__"),
]


@pytest.mark.parametrize("argv, message", ITEM_6 + MORE, ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else "")
def test_bad_invocation_exits_2_naming_value_and_allowed(argv, message, files, capsys):
    port = _closed_port()
    fill = {**files, "port": port}
    rc, err = _run([a.format(**fill) for a in argv], capsys)
    verb = argv[0]
    assert rc == 2, err
    assert err.startswith(f"workbench {verb}: error: ") and "Traceback" not in err, err
    assert message.format(**fill) in err, err


def test_run_blames_the_bound_not_the_default_it_bounds(capsys):
    """block=0 is refused as block (it bounds accept, whose default would fail against it); a block that is
    itself allowed but too small for accept's default names block as the bound the user set."""
    rc, err = _run(["run", "04", "-p", "block", "0"], capsys)
    assert rc == 2 and "block=0" in err and "accept" not in err, err
    rc, err = _run(["run", "06", "-p", "budget", "0"], capsys)
    assert rc == 2 and "budget=0 is not allowed: an integer in [1, 512]" in err, err


def test_cross_parameter_bound_named_with_its_origin(tmp_path, capsys):
    d = tmp_path / "nb"
    d.mkdir()
    (d / "parameters.yaml").write_text('"01":\n  parameters:\n    n: {type: int, lo: 1}\n'
                                       '    sizes: {type: "list[int]", lo: 1, hi: n}\n')
    _notebook(d / "01_x.ipynb", "n = 3\nsizes = [1, 2]")
    rc, err = _run(["run", "--notebooks", str(d), "--out", str(tmp_path / "o"), "-p", "n", "1"], capsys)
    assert rc == 2, err
    assert "sizes=[1, 2] is not allowed: a non-empty list of integers in [1, 1]" in err
    assert "(value from the notebook default; bounded by n=1 from -p n)" in err
    assert not (tmp_path / "o").exists()


def _notebook(path, params_src):
    import nbformat

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(params_src)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, nbformat.v4.new_code_cell("print('ran')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def test_missing_notebook_package_found_before_the_run(tmp_path, capsys):
    """A package a notebook ``needs`` (parameters.yaml) that is not installed stops the run before any notebook
    starts, naming the module and the command that installs it; ``when`` ties it to a parameter's value."""
    d = tmp_path / "nb"
    d.mkdir()
    (d / "parameters.yaml").write_text(
        '"01":\n  needs:\n    - {module: no_such_module_xyz, install: "pip install xyz", when: {kinds: b}}\n'
        '  parameters:\n    kinds: {type: "list[str]", choices: [a, b]}\n')
    _notebook(d / "01_x.ipynb", 'kinds = ["a"]')
    out = tmp_path / "o"
    assert pipeline.resolve_parameters(pipeline.discover(d), []) == {"01_x": {}}  # "a" needs nothing
    rc, err = _run(["run", "--notebooks", str(d), "--out", str(out), "-p", "kinds", "[a, b]"], capsys)
    assert rc == 2, err
    assert ("kinds=['a', 'b'] is not allowed: values whose packages are installed; 'b' needs the Python module "
            "no_such_module_xyz, which is not installed: install it with `pip install xyz` "
            "(value from -p kinds)") in err
    assert not out.exists()
    rc, err = _run(["list", "--notebooks", str(d)], capsys)
    assert rc == 0


def test_shipped_notebook_06_needs_transformers(monkeypatch, capsys):
    """Notebook 06's CPU demo builds a transformers Llama: without the package the run stops before it starts."""
    real = validation._find_module
    monkeypatch.setattr(validation, "_find_module",
                        lambda m: "No module named 'transformers'" if m == "transformers" else real(m))
    rc, err = _run(["run", "06"], capsys)
    assert rc == 2, err
    assert "06_drafter_acceptance: the notebook needs the Python module transformers, which is not installed: " \
           "install it with `pip install 'transformers>=4.48'" in err


def test_schema_keys_are_checked(tmp_path):
    (tmp_path / "parameters.yaml").write_text('"01":\n  need: []\n  parameters: {}\n')
    with pytest.raises(ValueError, match="unknown key.*need; allowed: parameters, check, needs"):
        pipeline.load_schema(tmp_path)


class _Stub(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible server that lists model 'm' and fails every completion."""

    def do_GET(self):  # noqa: N802 (the http.server API)
        body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"error": {"message": "engine exploded"}}).encode()
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture()
def stub_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_sweep_endpoint_model_not_served(stub_server, capsys):
    rc, err = _run(["sweep", "--endpoint", stub_server, "--model", "other", "--contexts", "8", "--concurrency", "1"],
                   capsys)
    assert rc == 2, err
    assert f"model='other' is not allowed: one of the models {stub_server} serves: 'm'" in err


def test_sweep_endpoint_every_request_failed_exits_1_with_the_reason(stub_server, capsys):
    rc = main(["sweep", "--endpoint", stub_server, "--model", "m", "--contexts", "8", "--concurrency", "1",
               "--max-tokens", "4", "--timeout", "10"])
    captured = capsys.readouterr()
    assert rc == 1, captured.err
    assert "0/1 ok (1 failed)" in captured.out
    assert "workbench sweep: error: every request failed (1 of 1); the reasons: HTTP 500: engine exploded" \
        in captured.err


@pytest.mark.parametrize("argv", [["serve", "--synthetic", "kimi-k2.6"],
                                  ["sweep", "--engine", "--synthetic", "kimi-k2.6", "--device", "cpu"]])
def test_synthetic_model_larger_than_memory_refused_before_it_is_built(argv, monkeypatch, capsys):
    """All 61 layers of the K2.6 config hold hundreds of GB: refused with the most layers that fit, not built."""
    from workbench.serve import cli as serve_cli
    from workbench.sweep import cli as sweep_cli

    monkeypatch.setattr(serve_cli, "device_memory", lambda: (16 * 10**9, "this machine's RAM", True))
    monkeypatch.setattr(sweep_cli, "host_memory_bytes", lambda: 16 * 10**9)
    rc, err = _run(argv, capsys)
    assert rc == 2, err
    assert "layers=61 is not allowed: an integer in [1, " in err and "]: 61 layers of kimi-k2.6 hold at least" in err
    assert "GB of weights, more than the 16.0 GB of this machine's RAM" in err


def test_a_list_option_given_twice_holds_both(capsys):
    """``--accept 12 --accept 14`` is 12 and 14 (not the last one alone, the first silently dropped)."""
    rc, err = _run([*PROJECT, "--accept", "12", "--accept", "17", "--anchors-only"], capsys)
    assert rc == 2 and "accept=[12, 17] is not allowed" in err, err
    rc, err = _run(["sweep", "--engine", "--contexts", "8", "--contexts", "0"], capsys)
    assert rc == 2 and "contexts=[8, 0] is not allowed" in err, err


def test_gpu_profile_needs_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(pipeline, "has_cuda", lambda: False)
    rc, err = _run(["run", "05", "--profile", "gpu"], capsys)
    assert rc == 2 and "profile='gpu' is not allowed: 'auto' or 'cpu' on this machine (no CUDA GPU found" in err, err
