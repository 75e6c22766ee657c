"""Prometheus metrics of the server, in a registry of its own, every name prefixed ``hotloop:``.

Engine state (running / waiting requests, KV blocks) is read at scrape time; per-request counters
and latency histograms are recorded when a request's stream ends (finished, aborted or failed).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE  # noqa: N811
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from hotloop.engine.async_engine import RequestStream

__all__ = ["CONTENT_TYPE", "ServerMetrics"]

_TTFT_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
)
_ITL_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.025,
    0.04,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
_E2E_BUCKETS = (0.1, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 120.0, 240.0, 480.0)


class ServerMetrics:
    """The server's metrics. ``engine`` is read at scrape time; ``pending`` counts requests waiting
    for a ``--max-concurrent-requests`` slot."""

    def __init__(self, engine: Any) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self.engine = engine
        self.pending = 0
        sched = engine.scheduler
        Gauge("hotloop:num_requests_running", "Requests in the running batch.", registry=reg).set_function(
            lambda: sched.num_running
        )
        Gauge("hotloop:num_requests_waiting", "Requests queued in the engine.", registry=reg).set_function(
            lambda: sched.num_waiting
        )
        Gauge(
            "hotloop:num_requests_pending",
            "HTTP requests waiting for a --max-concurrent-requests slot.",
            registry=reg,
        ).set_function(lambda: self.pending)
        Gauge(
            "hotloop:kv_cache_usage_perc", "Fraction of KV blocks in use, 0 to 1.", registry=reg
        ).set_function(self._kv_usage)
        Gauge("hotloop:kv_cache_free_blocks", "Free KV blocks.", registry=reg).set_function(
            lambda: engine.num_free_blocks
        )
        Gauge("hotloop:kv_cache_total_blocks", "KV blocks in the pool.", registry=reg).set_function(
            lambda: engine.num_total_blocks
        )
        reg.register(_PrefixCacheCollector(engine))
        reg.register(_CompileCollector(engine))
        self.prompt_tokens = Counter(
            "hotloop:prompt_tokens", "Prompt tokens of finished requests.", registry=reg
        )
        self.generation_tokens = Counter("hotloop:generation_tokens", "Generated tokens.", registry=reg)
        self.request_success = Counter(
            "hotloop:request_success",
            "Requests that ended, by finish reason.",
            ["finished_reason"],
            registry=reg,
        )
        self.ttft = Histogram(
            "hotloop:time_to_first_token_seconds", "Time to first token.", buckets=_TTFT_BUCKETS, registry=reg
        )
        self.itl = Histogram(
            "hotloop:inter_token_latency_seconds",
            "Time between output tokens.",
            buckets=_ITL_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            "hotloop:e2e_request_latency_seconds",
            "Arrival to last output.",
            buckets=_E2E_BUCKETS,
            registry=reg,
        )
        self.queue_time = Histogram(
            "hotloop:request_queue_time_seconds",
            "Arrival to first scheduled.",
            buckets=_E2E_BUCKETS,
            registry=reg,
        )

    def _kv_usage(self) -> float:
        total = self.engine.num_total_blocks
        return 1.0 - self.engine.num_free_blocks / total if total else 0.0

    def observe_stream(
        self, s: RequestStream, count_prompt: bool = True, count_generated: bool = True
    ) -> None:
        """Record one request whose stream ended (finished, aborted, or failed). ``count_prompt``
        False: another choice (``n`` > 1) of the same prompt already counted its prompt tokens.
        ``count_generated`` False: a score-only request, whose generated token is dropped."""
        reason = s.finish_reason or "error"
        self.request_success.labels(finished_reason=reason).inc()
        if count_prompt:
            self.prompt_tokens.inc(s.num_prompt_tokens)
        if count_generated:
            self.generation_tokens.inc(s.num_generated_tokens)
        if s.first_token_time is not None:
            self.ttft.observe(max(0.0, s.first_token_time - s.arrival_time))
        for gap in s.inter_token_latencies:
            self.itl.observe(gap)
        if s.finish_time is not None:
            self.e2e.observe(max(0.0, s.finish_time - s.arrival_time))
        if s.first_scheduled_time is not None:
            self.queue_time.observe(max(0.0, s.first_scheduled_time - s.arrival_time))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _PrefixCacheCollector:
    """Prefix-cache queries and hits (in tokens), read from the block manager at scrape time."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def describe(self) -> list:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        bm = self.engine.block_manager
        yield CounterMetricFamily(
            "hotloop:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            value=getattr(bm, "prefix_queries", 0),
        )
        yield CounterMetricFamily(
            "hotloop:prefix_cache_hits",
            "Prompt tokens found in the prefix cache.",
            value=getattr(bm, "prefix_hits", 0),
        )


class _CompileCollector:
    """Triton kernel compiles (GPU), before and after the start-up warm-up, read from the executor at
    scrape time: a compile while serving stalls every request of its step."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def describe(self) -> list:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        read = getattr(getattr(self.engine, "executor", None), "compile_stats", None)
        startup, startup_s, serving, serving_s = read() if read is not None else (0, 0.0, 0, 0.0)
        count = CounterMetricFamily(
            "hotloop:kernel_compiles",
            "Triton kernel compiles (or loads from Triton's disk cache), by phase (startup: up to the end "
            "of the warm-up).",
            labels=["phase"],
        )
        count.add_metric(["startup"], startup)
        count.add_metric(["serving"], serving)
        yield count
        secs = CounterMetricFamily(
            "hotloop:kernel_compile_seconds",
            "Seconds spent in Triton kernel compiles or loads, by phase.",
            labels=["phase"],
        )
        secs.add_metric(["startup"], startup_s)
        secs.add_metric(["serving"], serving_s)
        yield secs
