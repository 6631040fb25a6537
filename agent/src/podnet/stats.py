# SPDX-License-Identifier: Apache-2.0
"""What the daemons count for their metrics endpoints (podnetd: api.metrics; podnet-gatewayd:
gateway.metrics): cumulative histograms and counters by label values."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from prometheus_client import (
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: etcd round trips (a unary call on the LAN: about a millisecond)
ETCD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Histogram:
    """A cumulative histogram (what Prometheus expects: counts never go down)."""

    def __init__(self, bounds: tuple[float, ...] = BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.count = 0
        self.sum = 0.0
        self.lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self.lock:
            self.count += 1
            self.sum += value
            for i, b in enumerate(self.bounds):
                if value <= b:
                    self.counts[i] += 1


class Tally:
    """Counters by label values (a few known values each: never a user name)."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, ...], int] = {}
        self._lock = threading.Lock()

    def add(self, *labels: str) -> None:
        with self._lock:
            self._counts[labels] = self._counts.get(labels, 0) + 1

    def items(self) -> list[tuple[tuple[str, ...], int]]:
        with self._lock:
            return sorted(self._counts.items())


def histogram_family(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
    with h.lock:
        buckets = [(str(b), n) for b, n in zip(h.bounds, h.counts, strict=True)]
        buckets.append(("+Inf", h.count))
        total = h.sum
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total)


def counter_family(name: str, doc: str, labels: list[str], tally: Tally) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc, labels=labels)
    for values, n in tally.items():
        c.add_metric(list(values), n)
    return c


def serve(listen: str, collector: Collector) -> None:
    """`/metrics` on `listen` (host:port): `collector`'s metrics and the process's own."""
    host, _sep, port = listen.rpartition(":")
    registry = CollectorRegistry()
    registry.register(collector)
    registry.register(PROCESS_COLLECTOR)
    registry.register(PLATFORM_COLLECTOR)
    start_http_server(int(port), addr=host, registry=registry)
