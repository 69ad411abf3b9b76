"""The admission queue over HTTP: requests beyond the free rows wait (bounded depth, bounded wait) and are admitted
in arrival order as others finish; 429 with Retry-After only when the queue is full or the wait bound passes; a
client that leaves while queued gives its place up; n choices on one row run one after another; queue depth and
wait in /metrics. One row (``--max-requests 1``) and a slowed step make the queue observable."""
from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest

from test_serve_api import Server, _err, slow_down, wait_idle
from workbench.serve.cli import ServeOptions


@pytest.fixture(scope="module")
def srv():
    s = Server(ServeOptions(synthetic="tiny", layers=1, max_requests=1, capacity=64, max_tokens_limit=32,
                            max_queue=2, max_queue_wait=30))
    yield s
    s.close()


@pytest.fixture
def slow(srv, monkeypatch):
    """20 ms more per engine step: a 20-token request holds the row about 0.4 s."""
    slow_down(srv, monkeypatch, 0.02)


def metric(srv, name: str) -> float:
    for line in httpx.get(srv.url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def post(srv, body, timeout=60):
    return httpx.post(srv.url + "/v1/completions", json=body, timeout=timeout)


def test_queue_admits_in_arrival_order_and_refuses_only_when_full(srv, slow):
    full_before = metric(srv, 'workbench_queue_refused_total{reason="queue_full"}')
    waits_before = metric(srv, "workbench_queue_wait_seconds_count")
    done: list[str] = []

    def send(name):
        r = post(srv, {"prompt": name, "max_tokens": 20})
        done.append(name)
        return r

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        futs = []
        for name in ("first", "second", "third"):
            futs.append(ex.submit(send, name))
            time.sleep(0.1)  # arrival order
        h = httpx.get(srv.url + "/health").json()
        assert h["running"] == 1 and h["waiting"] == 2
        assert metric(srv, "workbench_requests_waiting") == 2
        # the queue (2) is full: the fourth is refused at once, with a Retry-After
        t0 = time.perf_counter()
        r = post(srv, {"prompt": "fourth", "max_tokens": 2})
        assert time.perf_counter() - t0 < 0.3
        e = _err(r, 429)
        assert e["code"] == "queue_full" and "retry later" in e["message"]
        assert int(r.headers["retry-after"]) >= 1
        rs = [f.result(timeout=60) for f in futs]
    assert [r.status_code for r in rs] == [200, 200, 200]
    assert done == ["first", "second", "third"]
    for name, r in zip(("first", "second", "third"), rs):
        assert r.json()["choices"][0]["token_ids"] == srv.greedy(srv.codec.encode(name), 20)
    q = [r.json()["meta_info"]["queue_s"] for r in rs]
    assert q[0] < 0.1 < q[1] < q[2]
    wait_idle(srv)
    assert metric(srv, 'workbench_queue_refused_total{reason="queue_full"}') == full_before + 1
    assert metric(srv, "workbench_queue_wait_seconds_count") == waits_before + 3
    assert metric(srv, "workbench_requests_waiting") == 0


def test_wait_bound_gives_429_with_retry_after(srv, slow, monkeypatch):
    monkeypatch.setattr(srv.scheduler, "max_queue_wait", 0.15)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        long = ex.submit(post, srv, {"prompt": "long", "max_tokens": 30})
        time.sleep(0.1)
        t0 = time.perf_counter()
        r = post(srv, {"prompt": "late", "max_tokens": 2})
        waited = time.perf_counter() - t0
        e = _err(r, 429)
        assert "waited" in e["message"] and "the bound is 0.15 s" in e["message"]
        assert int(r.headers["retry-after"]) >= 1 and 0.1 < waited < 1.0
        assert long.result(timeout=60).status_code == 200
    wait_idle(srv)
    assert metric(srv, 'workbench_queue_refused_total{reason="queue_timeout"}') >= 1


def test_a_client_leaving_the_queue_frees_its_place(srv, slow):
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        long = ex.submit(post, srv, {"prompt": "long", "max_tokens": 30})
        time.sleep(0.1)
        with pytest.raises(httpx.ReadTimeout):
            post(srv, {"prompt": "impatient", "max_tokens": 2}, timeout=0.15)
        time.sleep(0.1)
        assert httpx.get(srv.url + "/health").json()["waiting"] == 0
        assert long.result(timeout=60).status_code == 200
    wait_idle(srv)


def test_n_choices_share_one_row_in_turn_and_never_fitting_is_400_at_once(srv, slow):
    r = post(srv, {"prompt": "abc", "max_tokens": 5, "n": 2, "temperature": 0.9, "seed": 11})
    assert r.status_code == 200 and [c["index"] for c in r.json()["choices"]] == [0, 1]
    metas = r.json()["meta_info"]
    assert len(metas) == 2 and metas[1]["queue_s"] > 0.05  # the second choice waited for the row
    # n beyond the queue can never be queued; a prompt beyond the context never runs: 400 at once
    e = _err(post(srv, {"prompt": "abc", "max_tokens": 2, "n": 3}), 400, "n")
    assert "admission queue's 2" in e["message"]
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        long = ex.submit(post, srv, {"prompt": "long", "max_tokens": 30})
        time.sleep(0.1)
        t0 = time.perf_counter()
        e = _err(post(srv, {"prompt": list(range(60)), "max_tokens": 10}), 400)
        assert e["code"] == "context_length_exceeded" and time.perf_counter() - t0 < 0.3
        assert long.result(timeout=60).status_code == 200
    wait_idle(srv)
