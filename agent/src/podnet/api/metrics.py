# SPDX-License-Identifier: Apache-2.0
"""Optional Prometheus endpoint (docs/monitoring.md): pods by kind, users, the address pool's
blocks taken and its size, pod setup time,
failed requests by op and error code, quota refusals by limit, etcd round trips and errors,
records written back by the guard, build information, and the process's own metrics (CPU,
memory, open file descriptors). Labels take a few known values each, never a user name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)

from podnet import __version__
from podnet.stats import BUCKETS, Histogram, Tally, counter_family, histogram_family, serve

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["BUCKETS", "KINDS", "AgentCollector", "Histogram", "Observed", "start_metrics"]

#: the kinds of pod a node holds (podnet_pods)
KINDS = ("job", "login", "container")

Family = CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily | InfoMetricFamily


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

    @property
    def etcd_seconds(self) -> Histogram: ...

    @property
    def watch_seconds(self) -> Histogram: ...

    @property
    def records_restored(self) -> int: ...

    @property
    def overlay_misses(self) -> tuple[int, int, int]: ...

    @property
    def pool_blocks(self) -> tuple[int, int]: ...

    def list_pods(self, uid: int | None) -> Sequence[_Pod]: ...


class Requests(Protocol):
    """What the metrics read of the request handler."""

    @property
    def failed(self) -> Tally: ...

    @property
    def quota_refused(self) -> Tally: ...


class AgentCollector:
    def __init__(self, agent: Observed, requests: Requests | None = None) -> None:
        self.agent = agent
        self.requests = requests

    def collect(self) -> Iterator[Family]:
        yield InfoMetricFamily("podnet_build", "podnetd's version", value={"version": __version__})
        pods = self.agent.list_pods(None)
        g = GaugeMetricFamily("podnet_pods", "Pods on this node", labels=["kind"])
        for kind in KINDS:
            g.add_metric([kind], sum(1 for p in pods if p.kind == kind))
        yield g
        yield GaugeMetricFamily(
            "podnet_users", "Users with pods on this node", value=len({p.uid for p in pods})
        )
        yield CounterMetricFamily(
            "podnet_etcd_errors", "etcd request errors", value=self.agent.etcd.errors
        )
        yield histogram_family(
            "podnet_etcd_request_seconds",
            "Round trip of podnetd's etcd requests (unary calls)",
            self.agent.etcd_seconds,
        )
        yield histogram_family(
            "podnet_etcd_watch_delay_seconds",
            "Delay from a write of podnetd's to its event on podnetd's etcd watch (watch lag)",
            self.agent.watch_seconds,
        )
        yield histogram_family(
            "podnet_pod_setup_seconds",
            "Job pod setup time since podnetd started",
            self.agent.setup_seconds,
        )
        taken, capacity = self.agent.pool_blocks
        yield GaugeMetricFamily(
            "podnet_pool_blocks",
            "Address blocks of the pod network taken, cluster-wide (this node's view of etcd)",
            value=taken,
        )
        yield GaugeMetricFamily(
            "podnet_pool_blocks_capacity",
            "Address blocks in the pod network (podnet_pod_cidr / podnet_pod_block_prefix)",
            value=capacity,
        )
        yield CounterMetricFamily(
            "podnet_records_restored",
            "Records of this node's pods written back after another writer changed them",
            value=self.agent.records_restored,
        )
        misses, resolved, dropped = self.agent.overlay_misses
        yield CounterMetricFamily(
            "podnet_overlay_misses",
            "Misses of the users' VXLANs on this node (a pod's first packet to a remote pod)",
            value=misses,
        )
        yield CounterMetricFamily(
            "podnet_overlay_resolved",
            "Remote pods the users' VXLANs were given entries of, from the block map",
            value=resolved,
        )
        yield CounterMetricFamily(
            "podnet_overlay_dropped",
            "VXLAN misses dropped: over a user's rate, or lost by the kernel (socket full)",
            value=dropped,
        )
        if self.requests is not None:
            yield counter_family(
                "podnet_requests_failed",
                "Requests to podnetd that failed, by op and error code (docs/api.md)",
                ["op", "code"],
                self.requests.failed,
            )
            yield counter_family(
                "podnet_quota_refusals",
                "Requests refused over a user's quota, by op and limit",
                ["op", "limit"],
                self.requests.quota_refused,
            )


def start_metrics(listen: str, agent: Observed, requests: Requests | None = None) -> None:
    serve(listen, AgentCollector(agent, requests))
