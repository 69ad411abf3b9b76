"""`workbench serve` on the command line: a real process on a free loopback port answers the openai client with
the engine's greedy tokens (byte-level fallback tokenizer); option values are checked; a non-loopback bind warns."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from workbench.cli import main
from workbench.engine import generate
from workbench.serve import cli as serve_cli
from workbench.serve.tokenizer import TextCodec


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_workbench_serve_process_answers_openai_client():
    port = _port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "workbench", "serve", "--synthetic", "tiny", "--layers", "2",
                          "--port", str(port), "--capacity", "64", "--max-requests", "2", "--max-tokens-limit", "32"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        t0 = time.time()
        while True:
            assert p.poll() is None, p.stdout.read().decode()
            assert time.time() - t0 < 45, "workbench serve did not start"
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)
        r = client.completions.create(model="synthetic-tiny", prompt="héllo", max_tokens=9)
        codec = TextCodec.bytes()
        ids = codec.encode("héllo")
        assert ids == list("héllo".encode())  # the byte-level fallback: id = byte value
        model = serve_cli.synthetic_for("tiny", 256, 2, "cpu")
        assert r.choices[0].token_ids == generate(model, [ids], 9)[0].tokens
        assert httpx.get(url + "/health").json()["kv_slots_used"] == 0
    finally:
        p.terminate()
        p.wait(15)


@pytest.mark.parametrize("argv,match", [
    (["--synthetic", "tiny", "--port", "-1"], "port=-1 is not allowed"),
    (["--synthetic", "tiny", "--method", "beam"], "method='beam' is not allowed"),
    (["--synthetic", "tiny", "--method", "ddtree"], "needs --drafter"),
    (["--synthetic", "tiny", "--block", "1"], "block=1 is not allowed"),
    (["--synthetic", "tiny", "--kv-slots", "0"], "kv_slots=0 is not allowed"),
    (["--synthetic", "tiny", "--max-requests", "500"], "max_requests=500 is not allowed"),
    (["--model", "/nonexistent", "--layers", "2"], "--layers is for --synthetic"),
    (["--synthetic", "tiny", "--prefill-chunk", "0"], "prefill_chunk=0 is not allowed"),
])
def test_serve_options_checked(argv, match, capsys):
    assert main(["serve", *argv]) == 2
    assert match in capsys.readouterr().err


def test_serve_needs_one_model_source(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--port", "1"])
    with pytest.raises(SystemExit):
        main(["serve", "--synthetic", "tiny", "--model", "x"])


def test_non_loopback_bind_warns(monkeypatch, capsys):
    ran = {}
    port = _port()  # free: the address and port are checked bindable before the model is built
    monkeypatch.setattr("uvicorn.run", lambda app, host, port, log_level: ran.update(host=host, port=port))
    assert main(["serve", "--synthetic", "tiny", "--layers", "1", "--host", "0.0.0.0", "--port", str(port)]) == 0
    err = capsys.readouterr().err
    assert "warning: binding 0.0.0.0, not loopback" in err and "no --api-key" in err
    assert ran == {"host": "0.0.0.0", "port": port}
    assert main(["serve", "--synthetic", "tiny", "--layers", "1", "--port", str(port)]) == 0
    assert "warning" not in capsys.readouterr().err and ran["host"] == "127.0.0.1"


def test_checkpoint_tokenizer_and_chat_template(tmp_path):
    import json

    from test_serve_api import train_tokenizer
    from tokenizers import Tokenizer

    train_tokenizer(tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}[assistant] {% endif %}",
        "eos_token": {"content": "<|endoftext|>"}}))
    c = TextCodec.from_dir(tmp_path)
    assert c.has_own_template and c.render_chat([{"role": "user", "content": "hi"}]) == "[user] hi\n[assistant] "
    assert c.decode(c.encode("The quick brown fox")) == "The quick brown fox"
    assert c.eos_token_id == 320 and c.vocab_size == 321
    d = TextCodec.bytes()
    assert not d.has_own_template and d.render_chat([{"role": "user", "content": "hi"}]) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(FileNotFoundError):
        TextCodec.from_dir(tmp_path / "none")
