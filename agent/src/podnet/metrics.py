"""Optional Prometheus endpoint: pods, users, setup latency, etcd errors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.registry import Collector

    from podnet.agent import Agent

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
        samples = list(self.agent.setup_seconds)
        buckets = [(str(b), sum(1 for s in samples if s <= b)) for b in BUCKETS]
        buckets.append(("+Inf", len(samples)))
        yield HistogramMetricFamily(
            "podnet_pod_setup_seconds",
            "Job pod setup time (last 1000 pods)",
            buckets=buckets,
            sum_value=sum(samples),
        )


def start_metrics(listen: str, agent: Agent) -> None:
    host, _, port = listen.rpartition(":")
    registry = CollectorRegistry()
    collector: Collector = AgentCollector(agent)
    registry.register(collector)
    start_http_server(int(port), addr=host, registry=registry)
