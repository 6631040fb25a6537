# SPDX-License-Identifier: Apache-2.0
"""podnet-gatewayd's metrics endpoint (gateway.yaml `metrics`, docs/monitoring.md): table
syncs by kind and their time, failed syncs, publications released, published ports, the
policy's set elements, whether this gateway holds the external address (VRRP master), etcd
round trips, conntrackd's flow-state sync (gateway/conntrackd.py), the build and the
process's own metrics."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)

from podnet import __version__
from podnet.gateway import conntrackd
from podnet.gateway.conntrackd import Conntrackd
from podnet.gateway.state import State
from podnet.stats import Histogram, Tally, counter_family, histogram_family, serve

__all__ = ["GatewayCollector", "Observed", "VrrpWatch", "holds_address", "start_metrics"]

Family = CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily | InfoMetricFamily


class Observed(Protocol):
    """What the metrics read of the gateway."""

    @property
    def cur(self) -> State | None: ...

    @property
    def external_ip(self) -> str: ...

    @property
    def syncs(self) -> Tally: ...

    @property
    def sync_seconds(self) -> Histogram: ...

    @property
    def etcd_seconds(self) -> Histogram: ...

    @property
    def sync_failures(self) -> int: ...

    @property
    def released(self) -> int: ...

    @property
    def vrrp(self) -> VrrpWatch: ...


def holds_address(ip: str, fib_trie: str = "/proc/net/fib_trie") -> bool:
    """Whether `ip` is an address of this host (a `/32 host LOCAL` route of the local
    table, what keepalived adds to the master): read, not bound (ip_nonlocal_bind would
    let a bind succeed anywhere)."""
    try:
        lines = Path(fib_trie).read_text().splitlines()
    except OSError:
        return False
    want = f"|-- {ip}"
    return any(
        line.strip() == want and "/32 host LOCAL" in nxt for line, nxt in itertools.pairwise(lines)
    )


class VrrpWatch:
    """Changes of whether this gateway holds the external address, as podnet-gatewayd's loop
    sees them (at least every 5 s): a failover shows as a transition to `master` on one
    gateway and to `backup` on the other, even between two scrapes."""

    def __init__(self) -> None:
        self.master: bool | None = None  # None: not looked yet
        self.transitions = Tally()

    def observe(self, master: bool) -> bool:
        """Record the state seen now; True when it changed since the last look."""
        before, self.master = self.master, master
        if before is None or before == master:
            return False
        self.transitions.add("master" if master else "backup")
        return True


class GatewayCollector:
    def __init__(
        self,
        gw: Observed,
        fib_trie: str = "/proc/net/fib_trie",
        ctd: Conntrackd | None = None,
    ) -> None:
        self.gw = gw
        self.fib_trie = fib_trie
        self.ctd = ctd  # None: conntrackd's statistics are not read (no metrics of it)

    def collect(self) -> Iterator[Family]:
        gw = self.gw
        yield InfoMetricFamily(
            "podnet_gateway_build", "podnet-gatewayd's version", value={"version": __version__}
        )
        yield GaugeMetricFamily(
            "podnet_gateway_vrrp_master",
            "1 when this gateway holds the external address (keepalived's master)",
            value=1 if holds_address(gw.external_ip, self.fib_trie) else 0,
        )
        yield counter_family(
            "podnet_gateway_vrrp_transitions",
            "Changes of this gateway's VRRP state seen by podnet-gatewayd, by the state it "
            "entered (master: took the external address; backup: lost it)",
            ["to"],
            gw.vrrp.transitions,
        )
        yield counter_family(
            "podnet_gateway_syncs",
            "Table updates applied, by kind (full: the whole table; update: incremental; "
            "replace: an update the kernel refused, then the whole table)",
            ["kind"],
            gw.syncs,
        )
        yield histogram_family(
            "podnet_gateway_sync_seconds",
            "Time of a sync: read etcd, build the table's change, apply it",
            gw.sync_seconds,
        )
        yield CounterMetricFamily(
            "podnet_gateway_sync_failures", "Syncs that failed (retried)", value=gw.sync_failures
        )
        yield CounterMetricFamily(
            "podnet_gateway_publications_released",
            "Publications deleted because their job is gone",
            value=gw.released,
        )
        yield histogram_family(
            "podnet_gateway_etcd_request_seconds",
            "Round trip of podnet-gatewayd's etcd requests (unary calls)",
            gw.etcd_seconds,
        )
        st = gw.cur
        yield GaugeMetricFamily(
            "podnet_gateway_published_ports",
            "Ports published on the external address (in the table now)",
            value=len(st.published) if st else 0,
        )
        g = GaugeMetricFamily(
            "podnet_gateway_policy_elements",
            "Elements of the egress policy's sets in the table now",
            labels=["set"],
        )
        c = st.compiled if st else None
        g.add_metric(["global_deny"], len(c.global_deny) if c else 0)
        g.add_metric(["global_allow"], len(c.global_allow) if c else 0)
        g.add_metric(["user_deny"], sum(len(d) for d, _a in c.users.values()) if c else 0)
        g.add_metric(["user_allow"], sum(len(a) for _d, a in c.users.values()) if c else 0)
        yield g
        yield GaugeMetricFamily(
            "podnet_gateway_policy_users",
            "Users with an egress policy of their own in the table now",
            value=len(c.users) if c else 0,
        )
        if self.ctd is not None:
            yield from conntrackd.families(self.ctd.latest())


def start_metrics(listen: str, gw: Observed) -> None:
    """Serve the metrics; conntrackd's statistics are read in a thread of their own."""
    ctd = Conntrackd()
    ctd.start()
    serve(listen, GatewayCollector(gw, ctd=ctd))
