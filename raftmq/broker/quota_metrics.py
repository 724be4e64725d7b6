"""The client quotas' figures in a broker's Prometheus registry (docs/metrics.md): the
throttle time given, per quota type, the time calls were held, and how many buckets are
kept. Read at scrape time
from :class:`~raftmq.broker.client_quotas.ClientQuotas`' plain counters, so enforcing a
quota costs no metric update on the request path. Three label values, whatever the
number of clients."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from raftmq.broker.client_quotas import KINDS, ClientQuotas


class QuotaCollector:
    def __init__(self, quotas: ClientQuotas) -> None:
        self.quotas = quotas

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        throttle = CounterMetricFamily(
            "raftmq_quota_throttle_seconds",
            "Throttle time given in answers to callers over a client quota, by quota type "
            "(produce, fetch: byte rates; request: request_percentage)",
            labels=("kind",),
        )
        for kind in KINDS:
            throttle.add_metric((kind,), self.quotas.throttle_s[kind])
        yield throttle
        held = CounterMetricFamily(
            "raftmq_quota_held_seconds",
            "Time calls were held before being served because their caller was still over a "
            "client quota, by the call's kind (produce: Produce and ProduceStream requests, "
            "fetch: Fetch, request: the others): clients that do not honour "
            "throttle_time_ms, or had calls in flight when throttled",
            labels=("kind",),
        )
        for kind in KINDS:
            held.add_metric((kind,), self.quotas.held_s[kind])
        yield held
        yield GaugeMetricFamily(
            "raftmq_quota_buckets",
            "Token buckets kept for callers under a client quota (bounded)",
            value=len(self.quotas.buckets),
        )
