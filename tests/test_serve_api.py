"""workbench serve over HTTP on a free loopback port: a tiny synthetic model and a byte-level BPE tokenizer trained
here with `tokenizers` (nothing downloaded). The official openai client's completion and streamed chat carry the
engine's greedy tokens; malformed requests get OpenAI-style error bodies naming the field; a prompt beyond the
context is refused alone, one beyond the free KV slots waits in the admission queue and then runs; a client that
leaves mid-stream frees its slots; a bounded burst of good and bad requests leaves every slot free; /metrics,
/health and --api-key."""
from __future__ import annotations

import concurrent.futures
import json
import math
import socket
import threading
import time

import httpx
import openai
import pytest
import uvicorn

from workbench.engine import generate
from workbench.serve.app import create_app
from workbench.serve.cli import ServeOptions, build

TEXT = ["The quick brown fox jumps over the lazy dog. ", "Speculative decoding drafts a tree of tokens and verifies "
        "it in one step of the target model.", "Hello, world! Serving tokens over HTTP, one step at a time."]


def train_tokenizer(dirpath, vocab_size=320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXT * 10, trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(str(dirpath / "tokenizer.json"))
    return dirpath


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, opts: ServeOptions):
        self.scheduler, self.codec, self.name = build(opts)
        self.model = self.scheduler.batch.runner.model
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = create_app(self.scheduler, self.codec, self.name, opts.api_key)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        t0 = time.time()
        while not self.server.started:
            assert time.time() - t0 < 20 and self.thread.is_alive(), "the server did not start"
            time.sleep(0.05)

    def greedy(self, ids, n):
        return generate(self.model, [ids], n)[0].tokens

    def close(self):
        self.server.should_exit = True
        self.thread.join(10)


KV_SLOTS = 160


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    d = train_tokenizer(tmp_path_factory.mktemp("tok"))
    # prompts are prefilled 8 tokens per step boundary (chunked prefill) on this server
    s = Server(ServeOptions(synthetic="tiny", tokenizer=str(d), max_requests=4, capacity=128, kv_slots=KV_SLOTS,
                            max_tokens_limit=64, prefill_chunk=8))
    yield s
    s.close()
    assert not s.scheduler.alive  # the app stopped the scheduler it started


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def slow_down(server, monkeypatch, seconds: float) -> None:
    """Make ``server``'s engine ``seconds`` slower per step (its batch's decode sleeps first)."""
    decode = server.scheduler.batch.decode

    def slow_decode():
        time.sleep(seconds)
        return decode()

    monkeypatch.setattr(server.scheduler.batch, "decode", slow_decode)


@pytest.fixture
def slow(srv, monkeypatch):
    """A slower model (20 ms more per step), so that a request is still live while the test acts on it."""
    slow_down(srv, monkeypatch, 0.02)


def wait_idle(srv, limit=10.0):
    t0 = time.time()
    while time.time() - t0 < limit:
        h = httpx.get(srv.url + "/health").json()
        if h["running"] == 0 and h["waiting"] == 0 and h["kv_slots_used"] == 0:
            return h
        time.sleep(0.05)
    raise AssertionError(f"not idle after {limit} s: {h}")


def test_models_and_health(srv, client):
    assert [m.id for m in client.models.list().data] == ["synthetic-tiny"]
    h = httpx.get(srv.url + "/health").json()
    assert h["status"] == "ok" and h["kv_slots"] == KV_SLOTS and h["rows"] == 4


def test_completion_tokens_equal_engine_greedy(srv, client):
    prompt = "The quick brown fox"
    r = client.completions.create(model="synthetic-tiny", prompt=prompt, max_tokens=12)
    want = srv.greedy(srv.codec.encode(prompt), 12)
    c = r.choices[0]
    assert c.token_ids == want and c.text == srv.codec.decode(want) and c.finish_reason == "length"
    assert r.usage.prompt_tokens == len(srv.codec.encode(prompt)) and r.usage.completion_tokens == 12
    m = r.meta_info
    # the first token comes from the prefill, the other 11 from one greedy step each
    assert m["spec_verify_ct"] == 11 and m["spec_accept_length"] == 1.0 and m["method"] == "greedy"
    assert 0 < m["ttft_s"] <= m["e2e_latency_s"]
    # a prompt of token ids gives the same
    r2 = client.completions.create(model="synthetic-tiny", prompt=srv.codec.encode(prompt), max_tokens=12)
    assert r2.choices[0].token_ids == want


def test_streamed_chat_equals_engine_greedy(srv, client):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, world!"}]
    stream = client.chat.completions.create(model="synthetic-tiny", messages=msgs, max_tokens=20, stream=True,
                                            stream_options={"include_usage": True})
    ids, text, finish, meta, usage = [], "", None, None, None
    for ch in stream:
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            ids += c.token_ids or []
            text += c.delta.content or ""
            finish = c.finish_reason or finish
        meta = getattr(ch, "meta_info", None) or meta
    prompt = srv.codec.encode(srv.codec.render_chat(msgs))
    assert prompt[:3] == srv.codec.encode("<|im")  # the documented default template
    want = srv.greedy(prompt, 20)
    assert ids == want and text == srv.codec.decode(want) and finish == "length"
    assert usage.completion_tokens == 20 and usage.prompt_tokens == len(prompt)
    assert meta["completion_tokens"] == 20 and meta["spec_verify_ct"] == 19
    # non-streamed chat agrees
    r = client.chat.completions.create(model="synthetic-tiny", messages=msgs, max_tokens=20)
    assert r.choices[0].message.content == text and r.choices[0].token_ids == want


def test_stop_string_ends_the_text_before_it(srv, client):
    prompt = "Hello, world!"
    full = srv.codec.decode(srv.greedy(srv.codec.encode(prompt), 30))
    stop = full[10:13]
    assert stop and full.find(stop) >= 1
    r = client.completions.create(model="synthetic-tiny", prompt=prompt, max_tokens=30, stop=[stop])
    assert r.choices[0].text == full[:full.find(stop)] and r.choices[0].finish_reason == "stop"
    s = client.completions.create(model="synthetic-tiny", prompt=prompt, max_tokens=30, stop=stop, stream=True)
    chunks = list(s)
    assert "".join(c.choices[0].text for c in chunks) == full[:full.find(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"
    wait_idle(srv)


def _err(resp, status, param=None):
    assert resp.status_code == status, resp.text
    e = resp.json()["error"]
    assert e["message"] and e["type"]
    if param:
        assert e["param"] == param
    return e


def test_error_bodies(srv, client):
    u = srv.url + "/v1/completions"
    e = _err(httpx.post(u, json={"prompt": "hi", "temperature": 2.5}), 400, "temperature")
    assert "temperature=2.5 is not allowed: a finite number in [0, 2]" in e["message"]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="synthetic-tiny", prompt="hi", temperature=-1.0)
    _err(httpx.post(u, content=b'{"prompt": "hi", "temperature": NaN}', headers={"content-type": "application/json"}),
         400, "temperature")
    _err(httpx.post(u, content=b'{"prompt": "hi", "top_p": Infinity}', headers={"content-type": "application/json"}),
         400, "top_p")
    e = _err(httpx.post(u, json={"prompt": "hi", "tools": [{"type": "function"}]}), 400, "tools")
    assert "unknown field 'tools'" in e["message"]
    e = _err(httpx.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                                "tools": [{"type": "function"}]}), 400, "tools")
    assert "tools are not supported by this server" in e["message"]
    for field, value in [("logit_bias", {"5": 1.0}), ("frequency_penalty", 0.5), ("presence_penalty", -1),
                         ("suffix", "end"), ("best_of", 3)]:
        e = _err(httpx.post(u, json={"prompt": "hi", field: value}), 400)
        assert field in e["message"] and "not supported" in e["message"], e
    e = _err(httpx.post(srv.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}), 400,
        "response_format")
    # neutral values of unimplemented fields are accepted
    r = httpx.post(u, json={"prompt": "hi", "max_tokens": 2, "frequency_penalty": 0, "logit_bias": {}, "user": "u"})
    assert r.status_code == 200, r.text
    # lone surrogate: a 400, not a 500
    e = _err(httpx.post(u, content=b'{"prompt": "\\ud800 x"}', headers={"content-type": "application/json"}),
             400, "prompt")
    assert "Unicode" in e["message"]
    # whole-number floats where OpenAI takes integers; strings are not numbers
    r = httpx.post(u, json={"prompt": "hi", "max_tokens": 3.0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    _err(httpx.post(u, json={"prompt": "hi", "max_tokens": 3.5}), 400, "max_tokens")
    _err(httpx.post(u, json={"prompt": "hi", "max_tokens": "3"}), 400, "max_tokens")
    # max_completion_tokens wins whatever max_tokens says
    r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                           "max_tokens": None, "max_completion_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                           "max_tokens": 9, "max_completion_tokens": 2})
    assert r.json()["usage"]["completion_tokens"] == 2
    # 405 names the allowed methods
    r = httpx.get(u)
    assert r.status_code == 405 and r.headers["allow"] == "POST" and r.json()["error"]["message"]
    assert "not valid JSON in UTF-8" in _err(httpx.post(u, content=b'{"prompt": "\xff"}', headers={
        "content-type": "application/json"}), 400)["message"]
    assert "Content-Type: application/json" in _err(httpx.post(u, content=b'{"prompt": "hi"}', headers={
        "content-type": "text/plain"}), 400)["message"]
    e = _err(httpx.post(u, json={"prompt": "hi", "stop": ["a"] * 17}), 400, "stop")
    assert "up to 16 strings" in e["message"]
    _err(httpx.post(u, content=b"{not json"), 400)
    _err(httpx.post(u, json=[1, 2]), 400)
    _err(httpx.post(u, json={"max_tokens": 3}), 400, "prompt")
    _err(httpx.post(u, json={"prompt": "hi", "max_tokens": 0}), 400, "max_tokens")
    _err(httpx.post(u, json={"prompt": "hi", "max_tokens": "many"}), 400, "max_tokens")
    _err(httpx.post(u, json={"prompt": "hi", "n": 65}), 400, "n")
    _err(httpx.post(u, json={"prompt": "hi", "stop": 5}), 400, "stop")
    _err(httpx.post(u, json={"prompt": [1, 99999]}), 400, "prompt")
    assert _err(httpx.post(u, json={"prompt": "hi", "model": "gpt-9"}), 404, "model")["code"] == "model_not_found"
    e = _err(httpx.post(u, json={"prompt": "hi", "max_tokens": 200}), 400)
    assert e["code"] == "context_length_exceeded"
    e = _err(httpx.post(u, json={"prompt": list(range(130)), "max_tokens": 1}), 400)
    assert "context limit 128" in e["message"]
    _err(httpx.post(srv.url + "/v1/chat/completions", json={"messages": "hi"}), 400, "messages")
    _err(httpx.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": 3}]}), 400)
    _err(httpx.get(srv.url + "/v1/nothing"), 404)
    wait_idle(srv)


def test_pool_full_waits_in_the_queue_and_harms_no_other_request(srv, slow):
    """A prompt that fits the context but not the free KV slots waits in the admission queue while another request
    decodes, then runs to its exact greedy tokens; the running request's tokens are unchanged."""
    a_prompt = list(range(1, 61))
    want = srv.greedy(a_prompt, 40)
    with httpx.Client(timeout=30) as h:
        with h.stream("POST", srv.url + "/v1/completions",
                      json={"prompt": a_prompt, "max_tokens": 40, "stream": True}) as resp:
            lines = resp.iter_lines()
            first = next(l for l in lines if l.startswith("data: "))
            ids = json.loads(first[6:])["choices"][0]["token_ids"]
            # A reserves 60 prompt + 40 output + 1 step slots: 100 + 4 + 1 more do not fit the 160-slot pool now
            with concurrent.futures.ThreadPoolExecutor(1) as ex:
                fut = ex.submit(h.post, srv.url + "/v1/completions",
                                json={"prompt": list(range(1, 101)), "max_tokens": 4})
                time.sleep(0.2)
                assert httpx.get(srv.url + "/health").json()["waiting"] == 1
                for line in lines:
                    if line.startswith("data: ") and line != "data: [DONE]":
                        ids += json.loads(line[6:])["choices"][0]["token_ids"]
                r = fut.result(timeout=30)
    assert ids == want
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == srv.greedy(list(range(1, 101)), 4)
    assert r.json()["meta_info"]["queue_s"] > 0.1
    wait_idle(srv)


def test_client_disconnect_mid_stream_frees_slots(srv, slow):
    def cancelled():
        text = httpx.get(srv.url + "/metrics").text
        line = [l for l in text.splitlines() if l.startswith('workbench_requests_total{status="cancelled"}')]
        return float(line[0].split()[-1]) if line else 0.0

    before = cancelled()
    with httpx.Client(timeout=30) as h:
        with h.stream("POST", srv.url + "/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": "go on"}], "max_tokens": 64,
                            "stream": True}) as resp:
            n, live = 0, None
            for line in resp.iter_lines():
                n += line.startswith("data: ")
                if n == 3:
                    live = httpx.get(srv.url + "/health").json()
                    break  # leaving the iteration closes the connection
            assert resp.status_code == 200 and live["running"] == 1 and live["kv_slots_used"] > 0
    wait_idle(srv)  # the row was retired before its 64 tokens
    assert cancelled() == before + 1


def test_bounded_burst_of_good_and_bad_requests(srv):
    prompts = [TEXT[i % 3][:10 + 3 * i] for i in range(8)]
    good = [{"prompt": p, "max_tokens": 6 + i, "stream": bool(i % 2)} for i, p in enumerate(prompts)]
    bad = [{"prompt": "x", "temperature": 5}, {"prompt": list(range(140))}, {"prompt": ""}, "{oops"]

    def send(body):
        with httpx.Client(timeout=60) as h:
            if isinstance(body, str):
                r = h.post(srv.url + "/v1/completions", content=body.encode())
                return r.status_code, None
            if not body["stream"]:
                r = h.post(srv.url + "/v1/completions", json=body)
                return r.status_code, r.json()["choices"][0]["token_ids"] if r.status_code == 200 else r.json()
            ids = []
            with h.stream("POST", srv.url + "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        ids += json.loads(line[6:])["choices"][0]["token_ids"]
            return r.status_code, ids

    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(12) as ex:
        futs = [ex.submit(send, b) for b in good + [{"stream": False, **b} if isinstance(b, dict) else b
                                                    for b in bad]]
        out = [f.result(timeout=60) for f in futs]
    assert time.time() - t0 < 60
    for (status, ids), body in zip(out[:8], good):
        assert status == 200 and ids == srv.greedy(srv.codec.encode(body["prompt"]), body["max_tokens"])
    assert [s for s, _ in out[8:]] == [400, 400, 400, 400]
    h = wait_idle(srv)
    assert h["kv_slots_free"] == KV_SLOTS and h["status"] == "ok"


def test_metrics(srv, client):
    client.completions.create(model="synthetic-tiny", prompt="metrics", max_tokens=5)
    wait_idle(srv)
    text = httpx.get(srv.url + "/metrics").text
    vals = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith("#")}
    assert vals['workbench_requests_total{status="ok"}'] >= 1
    assert vals["workbench_time_to_first_token_seconds_count"] >= 1
    assert vals["workbench_inter_token_latency_seconds_count"] >= 4
    assert vals["workbench_accepted_length_sum"] == vals["workbench_accepted_length_count"]  # greedy: 1 per step
    assert vals["workbench_kv_slots_free"] == KV_SLOTS and vals["workbench_kv_slots_used"] == 0
    assert vals['workbench_requests_total{status="rejected"}'] >= 1


def test_api_key_and_ddtree(tmp_path):
    """--api-key: a bearer token is required on /v1; DDTree (a random DFlash drafter): the same greedy tokens."""
    from starlette.testclient import TestClient

    sched, codec, name = build(ServeOptions(synthetic="tiny", layers=2, method="ddtree", drafter="random", block=4,
                                            budget=6, max_requests=2, capacity=64, max_tokens_limit=32))
    app = create_app(sched, codec, name, api_key="s3cret")
    with TestClient(app) as tc:
        e = _err(tc.post("/v1/completions", json={"prompt": "hi"}), 401)
        assert e["code"] == "invalid_api_key"
        _err(tc.get("/v1/models", headers={"Authorization": "Bearer nope"}), 401)
        assert tc.get("/health").status_code == 200
        r = tc.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 10},
                    headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200, r.text
        body = r.json()
        want = generate(sched.batch.runner.model, [codec.encode("Hello")], 10)[0].tokens
        assert body["choices"][0]["token_ids"] == want
        m = body["meta_info"]
        assert m["method"] == "ddtree" and m["spec_verify_ct"] >= 1 and m["spec_accept_length"] >= 1.0
    assert not sched.alive


def test_measuring_client_reports_finite_consistent_numbers(srv):
    from workbench.client import sweep

    res = sweep(srv.url, "synthetic-tiny", contexts=[16, 24], concurrency=[1, 4], max_tokens=8, two_point=[2, 24],
                sustained=12, timeout=30)
    assert [(p["context"], p["concurrency"]) for p in res["points"]] == [(16, 1), (16, 4), (24, 1), (24, 4)]
    for p in res["points"]:
        a = p["aggregate"]
        assert a["failed"] == 0 and a["completed"] == p["concurrency"] and a["errors"] == []
        assert a["output_tokens"] == 8 * p["concurrency"]
        assert a["output_tokens_per_s"] == pytest.approx(a["output_tokens"] / a["wall_s"])
        assert a["accept_length"] == 1.0  # greedy, reported by the server's meta_info
        for r in p["requests"]:
            assert r["ok"] and r["prompt_tokens"] == p["context"] and r["output_tokens"] == 8
            assert 0 < r["ttft_s"] <= r["e2e_s"] and len(r["itl_s"]) == 7 and all(x >= 0 for x in r["itl_s"])
            # TPOT x (n - 1) + TTFT is the request's time
            assert r["tpot_s"] * 7 + r["ttft_s"] == pytest.approx(r["e2e_s"])
            assert sum(r["itl_s"]) <= r["e2e_s"] - r["ttft_s"] + 1e-9
        assert 0 < a["ttft_s"]["median"] <= a["e2e_s"]["median"] and a["itl_s"]["n"] == 7 * p["concurrency"]
    for row in res["rates"]:
        tp, su = row["two_point"], row["sustained"]
        assert tp["ok"] and tp["tokens"] == [2, 24] and math.isfinite(tp["tokens_per_s"]) and tp["tokens_per_s"] > 0
        assert su["ok"] and su["tokens"] == 12
        assert su["tokens_per_s"] == pytest.approx(11 / su["decode_s"])
    json.dumps(res)  # JSON-ready
    wait_idle(srv)


def test_measuring_client_counts_failures_and_timeouts(srv, slow):
    from workbench.client import sweep

    bad = sweep(srv.url, "no-such-model", contexts=[8], concurrency=[3], max_tokens=4, timeout=30)
    a = bad["points"][0]["aggregate"]
    assert a["failed"] == 3 and a["completed"] == 0 and all(e.startswith("HTTP 404") for e in a["errors"])
    assert a["output_tokens"] == 0 and a["ttft_s"]["n"] == 0
    slow_res = sweep(srv.url, "synthetic-tiny", contexts=[8], concurrency=[2], max_tokens=40, timeout=0.3)
    a = slow_res["points"][0]["aggregate"]
    assert a["failed"] == 2 and all("timeout" in e for e in a["errors"]) and len(slow_res["points"][0]["requests"]) == 2
    wait_idle(srv)  # the timed-out clients left: their rows were retired
    with pytest.raises(ValueError, match="two_point"):
        sweep(srv.url, "synthetic-tiny", two_point=[12, 4])


def test_measuring_client_command_line(srv, capsys):
    from workbench.client import main

    assert main(["--endpoint", srv.url, "--model", "synthetic-tiny", "--contexts", "8", "--concurrency", "1", "2",
                 "--max-tokens", "5", "--sustained", "6", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [p["aggregate"]["completed"] for p in res["points"]] == [1, 2]
    assert res["rates"][0]["sustained"]["tokens"] == 6
    assert main(["--endpoint", srv.url, "--model", "synthetic-tiny", "--contexts", "8", "--max-tokens", "3"]) == 0
    assert "context      8 C   1: 1/1 ok (0 failed)" in capsys.readouterr().out
    assert main(["--endpoint", srv.url, "--model", "synthetic-tiny", "--concurrency", "0"]) == 2
    assert "concurrency=[0] is not allowed" in capsys.readouterr().err
    wait_idle(srv)


def test_workbench_sweep_endpoint(srv, capsys):
    """``workbench sweep --endpoint`` is the same client behind the sweep verb: finite, consistent numbers."""
    from workbench.cli import main as cli

    assert cli(["sweep", "--endpoint", srv.url, "--model", "synthetic-tiny", "--contexts", "8",
                "--concurrency", "1", "2", "--max-tokens", "4", "--two-point", "2", "6", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [p["aggregate"]["completed"] for p in res["points"]] == [1, 2]
    tp = res["rates"][0]["two_point"]
    assert tp["ok"] and tp["tokens"] == [2, 6] and tp["tokens_per_s"] > 0
    assert cli(["sweep", "--endpoint", srv.url, "--contexts", "8"]) == 2
    assert "model=None is not allowed" in capsys.readouterr().err
    wait_idle(srv)


def test_slot_reservation_queues_what_could_run_dry_and_no_decode_fails(monkeypatch):
    """Two requests that each fit the 40-slot pool but not together (10 prompt + 25 output + 1 per step = 36
    worst-case slots each): the second waits in the admission queue (not failed mid-decode, not refused) and runs
    when the first has finished; both get their exact greedy tokens; nothing ends as an engine error; every slot and
    every reservation is free after."""
    s = Server(ServeOptions(synthetic="tiny", layers=2, max_requests=2, capacity=64, kv_slots=40,
                            max_tokens_limit=32))
    try:
        slow_down(s, monkeypatch, 0.01)
        prompts = ["0123456789", "abcdefghij"]  # 10 byte-level tokens each

        def send(p):
            return httpx.post(s.url + "/v1/completions", json={"prompt": p, "max_tokens": 25}, timeout=60)

        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            rs = list(ex.map(send, prompts))
        assert [r.status_code for r in rs] == [200, 200], [r.text for r in rs]
        for p, r in zip(prompts, rs):
            assert r.json()["choices"][0]["token_ids"] == s.greedy(s.codec.encode(p), 25)
        waits = sorted(r.json()["meta_info"]["queue_s"] for r in rs)
        assert waits[1] > 0.1  # the second waited for the first's 25 steps
        h = wait_idle(s)
        assert h["kv_slots_free"] == 40 and h["kv_slots_reserved"] == 0
        text = httpx.get(s.url + "/metrics").text
        assert 'status="error"' not in text and 'status="rejected"' not in text
        assert "workbench_queue_wait_seconds_count 2.0" in text
    finally:
        s.close()


def test_notebook_03_endpoint_draws_from_the_live_server(srv):
    """Notebook 03 with ``endpoint``: the client's measurements in the sweep document's shape; tokens per event
    are the accepted lengths (1 for greedy), the rates positive and the sustained one checked against tokens /
    gaps; every table and figure of the notebook builds; bad endpoint values name the parameter."""
    from workbench.sweep import figures
    from workbench.sweep.engine import check_notebook
    from workbench.sweep.run import decomposition, notebook_doc
    from workbench.sweep.tables import tables
    from workbench.validation import InvalidParameter

    doc = notebook_doc(srv.url, "synthetic-tiny", contexts=[8, 16], concurrency=[1, 2], generate=12, two_point=[2, 6])
    assert doc["source"] == "endpoint" and doc["failures"] == []
    assert [r["context"] for r in doc["contexts"]] == [8, 16]
    for r in doc["contexts"]:
        assert r["accepted"] == [1.0] * 11 and r["committed"] == 11 and len(r["step_ms"]) == 11
        assert r["sustained"] > 0 and r["two_point"] > 0 and r["mean_step_ms"] > 0
        c = r["check_sustained"]
        assert c["identity"] == pytest.approx(1e3 / c["mean_step_ms"]) and c["measured"] <= c["identity"] * 1.001
    assert [(r["concurrency"], r["context"]) for r in doc["concurrency"]] == [(1, 8), (2, 8), (1, 16), (2, 16)]
    assert all(r["aggregate"] > 0 and r["mean_accepted"] == 1.0 for r in doc["concurrency"])
    parts = tables(doc)
    assert "not measured" in parts["KV layout"][0]["note"]
    assert len(decomposition(doc)) == 3
    for f in (figures.rate_vs_context, figures.step_vs_context, figures.accepted_over_generation,
              figures.layout_figure, figures.concurrency_figure, figures.phases_figure):
        f(doc)
    json.dumps(doc)
    base = dict(synthetic="tiny", layers=None, contexts=[8], concurrency=[1], generate=12, two_point=[2, 6],
                methods=["greedy"], block=8, budget=16)
    check_notebook(**base, endpoint=srv.url, served_model="synthetic-tiny")
    with pytest.raises(InvalidParameter, match="endpoint='ftp://x' is not allowed"):
        check_notebook(**base, endpoint="ftp://x", served_model="m")
    with pytest.raises(InvalidParameter, match="served_model=None is not allowed"):
        check_notebook(**base, endpoint=srv.url)
    wait_idle(srv)
