"""Prometheus metrics of the server process (``radixserve:`` prefix, own registry).

Request-level metrics are observed by the TokenizerManager as outputs arrive; the gauges
mirror the scheduler's periodic ``SchedulerStats``.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from radixserve.ipc.server_link import SchedulerStats

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = "radixserve:"
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Time to first token", buckets=_LATENCY_BUCKETS,
                              registry=r)
        self.itl = Histogram(p + "inter_token_latency_seconds", "Time between output tokens", buckets=_ITL_BUCKETS,
                             registry=r)
        self.e2e = Histogram(p + "e2e_request_latency_seconds", "End-to-end request latency",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.queue = Histogram(p + "queue_time_seconds", "Time waiting before the first scheduling",
                               buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Generated tokens", registry=r)
        self.cached_tokens = Counter(p + "cached_tokens", "Prompt tokens served from the prefix cache", registry=r)
        self.requests = Counter(p + "requests", "Finished requests", ["finish_type"], registry=r)
        self.aborts = Counter(p + "aborted_requests", "Aborted requests", registry=r)
        self.running = Gauge(p + "num_running_reqs", "Running requests", registry=r)
        self.queued = Gauge(p + "num_queued_reqs", "Waiting requests", registry=r)
        self.kv_usage = Gauge(p + "kv_slot_usage", "Share of KV slots not free (running + cached)", registry=r)
        self.spec_proposed = Counter(p + "spec_proposed_tokens", "Speculative tokens proposed and verified",
                                     registry=r)
        self.spec_accepted = Counter(p + "spec_accepted_tokens", "Speculative tokens accepted by the target",
                                     registry=r)
        self.spec_rate = Gauge(p + "spec_acceptance_rate", "Accepted / proposed speculative tokens (finished requests)",
                               registry=r)
        self._spec_totals = [0, 0]  # proposed, accepted: the gauge's ratio
        self.cache_hit_rate = Gauge(p + "cache_hit_rate", "Prefix cache hit rate (tokens)", registry=r)
        # per API key name (server/tenancy/accounting.py): what each key was charged
        self.key_prompt = Counter(p + "key_prompt_tokens", "Prompt tokens charged", ["key"], registry=r)
        self.key_cached = Counter(p + "key_cached_tokens", "Charged prompt tokens served from the prefix cache",
                                  ["key"], registry=r)
        self.key_completion = Counter(p + "key_completion_tokens", "Completion tokens charged", ["key"], registry=r)
        self.key_requests = Counter(p + "key_requests", "Requests charged", ["key"], registry=r)
        self.key_rejected = Counter(p + "key_rejected_requests", "Requests refused with 429 (budget or rate_limit)",
                                    ["key", "reason"], registry=r)

    def observe_finish(self, finish_type: str, prompt: int, completion: int, cached: int, e2e: float,
                       spec_proposed: int = 0, spec_accepted: int = 0) -> None:
        self.requests.labels(finish_type=finish_type).inc()
        if finish_type == "abort":
            self.aborts.inc()
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(completion)
        self.cached_tokens.inc(cached)
        self.e2e.observe(e2e)
        if spec_proposed:
            self.spec_proposed.inc(spec_proposed)
            self.spec_accepted.inc(spec_accepted)
            self._spec_totals[0] += spec_proposed
            self._spec_totals[1] += spec_accepted
            self.spec_rate.set(self._spec_totals[1] / self._spec_totals[0])

    def observe_key(self, key: str, prompt: int, cached: int, completion: int, requests: int) -> None:
        self.key_prompt.labels(key=key).inc(prompt)
        self.key_cached.labels(key=key).inc(cached)
        self.key_completion.labels(key=key).inc(completion)
        self.key_requests.labels(key=key).inc(requests)

    def observe_key_rejected(self, key: str, reason: str) -> None:
        self.key_rejected.labels(key=key, reason=reason).inc()

    def observe_stats(self, s: SchedulerStats) -> None:
        self.running.set(s.running)
        self.queued.set(s.waiting)
        capacity = max(1, s.num_slots)
        self.kv_usage.set((capacity - s.free_slots) / capacity)
        self.cache_hit_rate.set(s.hit_rate)

    def render(self) -> bytes:
        return generate_latest(self.registry)
