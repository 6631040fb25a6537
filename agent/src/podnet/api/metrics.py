# SPDX-License-Identifier: Apache-2.0
"""Optional Prometheus endpoint: pods, users, setup latency, etcd errors."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.registry import Collector

    from podnet.node.agent import Agent

BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class AgentCollector:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        pods = self.agent.list_pods(None)
        g = GaugeMetricFamily("podnet_pods", "Pods on this node", labels=["kind"])
        for kind in ("job", "login"):
            g.add_metric([kind], sum(1 for p in pods if p.kind == kind))
        yield g
        yield GaugeMetricFamily(
            "podnet_users", "Users with pods on this node", value=len({p.uid for p in pods})
        )
        yield CounterMetricFamily(
            "podnet_etcd_errors", "etcd request errors", value=self.agent.etcd.errors
        )
        h = self.agent.setup_seconds
        with h.lock:
            buckets = [(str(b), n) for b, n in zip(h.bounds, h.counts, strict=True)]
            buckets.append(("+Inf", h.count))
            total = h.sum
        yield HistogramMetricFamily(
            "podnet_pod_setup_seconds",
            "Job pod setup time since podnetd started",
            buckets=buckets,
            sum_value=total,
        )


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


def start_metrics(listen: str, agent: Agent) -> None:
    host, _sep, port = listen.rpartition(":")
    registry = CollectorRegistry()
    collector: Collector = AgentCollector(agent)
    registry.register(collector)
    start_http_server(int(port), addr=host, registry=registry)
