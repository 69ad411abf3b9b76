"""The server's Prometheus metrics (``GET /metrics``), in a registry of their own per server.

Names follow vLLM's (``vllm:time_to_first_token_seconds`` ...) with a ``workbench_`` prefix:
``workbench_requests_total{status}`` (ok: finished by length, eos or a stop string; cancelled: the client
left; error: failed while decoding; rejected: refused before running, 4xx),
``workbench_prompt_tokens_total``, ``workbench_generation_tokens_total``,
``workbench_time_to_first_token_seconds`` (arrival to the first token, queueing and prefill included),
``workbench_inter_token_latency_seconds`` (time between successive token events of one request: one engine step;
a DDTree step delivers its accepted tokens together), ``workbench_accepted_length`` (tokens committed per request
per step, the root counted: 1 for greedy), ``workbench_kv_slots_used`` / ``workbench_kv_slots_free``,
``workbench_kv_slots_reserved`` (the admitted requests' worst cases: prompt + max_tokens + one step's slots;
admission needs room below the pool),
``workbench_requests_running`` / ``workbench_requests_waiting`` (the admission queue's depth),
``workbench_queue_wait_seconds`` (time in the queue before admission), ``workbench_queue_refused_total{reason}``
(sequences refused by the queue: queue_full, queue_timeout, invalid; each also counts as a rejected request).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                   20.0, 60.0)
ACCEPT_BUCKETS = tuple(range(1, 34))


class Metrics:
    """The server's metrics (module docstring), in a registry of their own."""

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("workbench_requests", "Requests by how they ended", ["status"], registry=r)
        self.prompt_tokens = Counter("workbench_prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.generation_tokens = Counter("workbench_generation_tokens", "Tokens generated", registry=r)
        self.engine_failures = Counter("workbench_engine_failures", "Engine steps that raised (every live request "
                                       "ended with the error, the server kept serving)", registry=r)
        self.ttft = Histogram("workbench_time_to_first_token_seconds", "Arrival to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("workbench_inter_token_latency_seconds", "Time between token events of a request",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.accepted = Histogram("workbench_accepted_length", "Tokens committed per request per step",
                                  buckets=ACCEPT_BUCKETS, registry=r)
        self.kv_used = Gauge("workbench_kv_slots_used", "KV pool slots holding a live request's tokens", registry=r)
        self.kv_free = Gauge("workbench_kv_slots_free", "KV pool slots free", registry=r)
        self.kv_reserved = Gauge("workbench_kv_slots_reserved", "KV slots reserved by the admitted requests' worst "
                                 "cases", registry=r)
        self.running = Gauge("workbench_requests_running", "Requests with a row in the engine", registry=r)
        self.waiting = Gauge("workbench_requests_waiting", "Sequences waiting in the admission queue", registry=r)
        self.queue_wait = Histogram("workbench_queue_wait_seconds", "Time a sequence waited in the admission queue",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.refused = Counter("workbench_queue_refused", "Sequences the admission queue refused, by reason",
                               ["reason"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
