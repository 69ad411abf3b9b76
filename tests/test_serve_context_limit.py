"""Near the context limit, through the HTTP API, for greedy decoding and DDTree (a tree wider than its block: the
case that once ran out of slots mid-stream): every request the server admits finishes with all its tokens, whether
it asks for the most the context allows or waits in the queue for KV slots; one token more is a 400 at once. The
same seeds give the same sampled tokens under both methods (DDTree samples losslessly)."""
from __future__ import annotations

import concurrent.futures

import httpx
import openai

from test_serve_api import Server, wait_idle
from workbench.serve.cli import ServeOptions

CAPACITY = 96
PROMPTS = [[5] * 3, list(range(1, 20)), list(range(30, 70)), [7, 8, 9, 10, 11, 12, 13]]


def largest_max_tokens(srv, prompt_len: int) -> int:
    """The most tokens the server accepts for a prompt of ``prompt_len`` tokens (its own up-front check)."""
    b = srv.scheduler.batch
    return min(b.runner.max_generated, CAPACITY - prompt_len - b.config.extra_slots(b.runner.vocab_size))


def stream(srv, prompt, max_tokens, **kw):
    """(token ids, finish reason, error events) of one streamed completion."""
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="-", max_retries=0, timeout=120)
    ids, finish, errors = [], None, []
    for ch in c.completions.create(model="synthetic-tiny", prompt=prompt, max_tokens=max_tokens, stream=True, **kw):
        if getattr(ch, "error", None):
            errors.append(ch.error)
        for x in ch.choices:
            ids += x.token_ids
            finish = x.finish_reason or finish
    return ids, finish, errors


def run_at_the_limit(opts: ServeOptions):
    """Per prompt: greedy tokens at the largest max_tokens, then sampled ones (seed 5, temperature 1); checks that
    every request finished whole and that one token more is refused."""
    s = Server(opts)
    try:
        b = s.scheduler.batch
        worst = max(b.worst_case(len(p), largest_max_tokens(s, len(p))) for p in PROMPTS)
        assert b.runner.cache.num_slots < 2 * worst  # two at the limit do not fit together: the queue holds one
        jobs = [(p, largest_max_tokens(s, len(p)), {}) for p in PROMPTS]
        jobs += [(p, largest_max_tokens(s, len(p)), {"temperature": 1.0, "seed": 5}) for p in PROMPTS]
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as ex:
            outs = list(ex.map(lambda j: stream(s, j[0], j[1], **j[2]), jobs))
        for (p, m, kw), (ids, finish, errors) in zip(jobs, outs):
            assert errors == [] and finish == "length" and len(ids) == m, (len(p), m, kw, len(ids), finish, errors)
        for (p, m, kw), (ids, _, _) in zip(jobs[:len(PROMPTS)], outs):
            assert ids == s.greedy(p, m)
        for p in PROMPTS:
            r = httpx.post(s.url + "/v1/completions", json={"prompt": p, "max_tokens": largest_max_tokens(s, len(p))
                                                            + 1}, timeout=10)
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        h = wait_idle(s)
        assert h["kv_slots_reserved"] == 0 and h["kv_slots_free"] == h["kv_slots"]
        text = httpx.get(s.url + "/metrics").text
        assert 'status="error"' not in text and "workbench_engine_failures_total 0.0" in text
        return [ids for ids, _, _ in outs[len(PROMPTS):]]
    finally:
        s.close()


def test_every_admitted_request_finishes_at_the_context_limit_greedy_and_ddtree():
    common = dict(synthetic="tiny", layers=1, max_requests=4, capacity=CAPACITY, max_tokens_limit=CAPACITY - 1)
    greedy = run_at_the_limit(ServeOptions(**common, kv_slots=150))
    # block 16, budget 32: a step's tree (33 nodes) is wider than the block
    ddtree = run_at_the_limit(ServeOptions(**common, kv_slots=170, method="ddtree", drafter="random", block=16,
                                           budget=32))
    # lossless sampling: the same seed, the same tokens (DDTree's limit is lower: its last tree needs room)
    assert all(len(d) < len(g) and d == g[:len(d)] for d, g in zip(ddtree, greedy))
