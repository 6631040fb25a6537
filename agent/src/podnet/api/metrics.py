# SPDX-License-Identifier: Apache-2.0
"""Optional Prometheus endpoint: pods, users, setup latency, etcd errors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from podnet.node.stats import BUCKETS, Histogram

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.registry import Collector

__all__ = ["BUCKETS", "AgentCollector", "Histogram", "Observed", "start_metrics"]


class _Pod(Protocol):
    @property
    def kind(self) -> str: ...

    @property
    def uid(self) -> int: ...


class _Errors(Protocol):
    @property
    def errors(self) -> int: ...


class Observed(Protocol):
    """What the metrics read of the agent."""

    @property
    def etcd(self) -> _Errors: ...

    @property
    def setup_seconds(self) -> Histogram: ...

    def list_pods(self, uid: int | None) -> Sequence[_Pod]: ...


class AgentCollector:
    def __init__(self, agent: Observed) -> None:
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


def start_metrics(listen: str, agent: Observed) -> None:
    host, _sep, port = listen.rpartition(":")
    registry = CollectorRegistry()
    collector: Collector = AgentCollector(agent)
    registry.register(collector)
    start_http_server(int(port), addr=host, registry=registry)
