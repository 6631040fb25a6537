# SPDX-License-Identifier: Apache-2.0
"""podnet-gatewayd's metrics (issue 37): what the collector exposes of a gateway, whether
it holds the external address (from the kernel's local routes), and the `metrics` setting
of gateway.yaml (the endpoint itself is scraped on the lab's gateways, tests/e2e)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from podnet.config import ConfigError
from podnet.gateway.config import GatewayConfig
from podnet.gateway.metrics import GatewayCollector, VrrpWatch, holds_address
from podnet.gateway.state import State
from podnet.state.gwpolicy import Compiled
from podnet.stats import ETCD_BUCKETS, Histogram, Tally
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 203.0.113.160
        /27 link UNICAST
     |-- 203.0.113.170
        /32 host LOCAL
Local:
  +-- 203.0.113.160/27 2 0 2
     |-- 203.0.113.161
        /32 host LOCAL
"""


@dataclass
class Gw:
    cur: State | None = None
    external_ip: str = "203.0.113.170"
    syncs: Tally = field(default_factory=Tally)
    sync_seconds: Histogram = field(default_factory=Histogram)
    etcd_seconds: Histogram = field(default_factory=lambda: Histogram(ETCD_BUCKETS))
    sync_failures: int = 0
    released: int = 0
    vrrp: VrrpWatch = field(default_factory=VrrpWatch)


def scrape(gw: Gw, fib: Path) -> dict[tuple[str, str], float]:
    reg = CollectorRegistry()
    reg.register(GatewayCollector(gw, str(fib)))  # type: ignore[arg-type]
    return {
        (s.name, ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(generate_latest(reg).decode())
        for s in fam.samples
    }


def test_the_master_holds_the_external_address_the_backup_not(tmp_path: Path) -> None:
    fib = tmp_path / "fib_trie"
    fib.write_text(FIB_TRIE)
    assert holds_address("203.0.113.170", str(fib))
    assert holds_address("203.0.113.161", str(fib))
    assert not holds_address("203.0.113.160", str(fib))  # a network, not an address here
    assert not holds_address("203.0.113.17", str(fib))  # a prefix of it is not it
    assert not holds_address("203.0.113.170", str(tmp_path / "missing"))
    got = scrape(Gw(), fib)
    assert got[("podnet_gateway_vrrp_master", "")] == 1
    assert scrape(Gw(external_ip="203.0.113.171"), fib)[("podnet_gateway_vrrp_master", "")] == 0


def test_syncs_publications_and_policy_sets(tmp_path: Path) -> None:
    fib = tmp_path / "fib_trie"
    fib.write_text(FIB_TRIE)
    gw = Gw()
    assert scrape(gw, fib)[("podnet_gateway_published_ports", "")] == 0  # before the first sync
    gw.syncs.add("full")
    for _ in range(3):
        gw.syncs.add("update")
    gw.sync_seconds.observe(0.02)
    gw.sync_failures, gw.released = 2, 1
    compiled = Compiled(
        "deny", ["10.0.0.0/8 . tcp . 0-65535"], ["0.0.0.0/0 . tcp . 443"],
        {4097: ([], ["192.0.2.1 . tcp . 22", "192.0.2.2 . tcp . 22"])},
    )  # fmt: skip
    gw.cur = State({"198.18.0.2": 4097}, {20001: ("198.18.0.2", 8888)}, compiled)
    got = scrape(gw, fib)
    assert got[("podnet_gateway_syncs_total", "kind=full")] == 1
    assert got[("podnet_gateway_syncs_total", "kind=update")] == 3
    assert got[("podnet_gateway_sync_seconds_count", "")] == 1
    assert got[("podnet_gateway_sync_failures_total", "")] == 2
    assert got[("podnet_gateway_publications_released_total", "")] == 1
    assert got[("podnet_gateway_published_ports", "")] == 1
    assert got[("podnet_gateway_policy_elements", "set=global_deny")] == 1
    assert got[("podnet_gateway_policy_elements", "set=user_allow")] == 2
    assert got[("podnet_gateway_policy_users", "")] == 1
    assert (
        "podnet_gateway_build_info",
        next(k for n, k in got if n == "podnet_gateway_build_info"),
    ) in got


def test_gateway_yaml_metrics_setting(tmp_path: Path) -> None:
    base = "external_interface: ext0\nexternal_ip: 203.0.113.170\n"
    f = tmp_path / "gateway.yaml"
    f.write_text(base)
    assert GatewayConfig.load(str(f)).metrics is None
    f.write_text(base + "metrics: 198.51.100.20:9465\n")
    assert GatewayConfig.load(str(f)).metrics == "198.51.100.20:9465"
    for bad in ("9465", ":9465", "host:http", "host:70000"):
        f.write_text(base + f"metrics: '{bad}'\n")
        with pytest.raises(ConfigError, match="'metrics' must be host:port"):
            GatewayConfig.load(str(f))


def test_vrrp_transitions_count_failovers_not_the_first_look(tmp_path: Path) -> None:
    fib = tmp_path / "fib_trie"
    fib.write_text(FIB_TRIE)
    gw = Gw()
    assert gw.vrrp.observe(False) is False  # the first look is a state, not a change
    assert gw.vrrp.observe(False) is False
    assert gw.vrrp.observe(True) is True  # took the address: a failover to this gateway
    assert gw.vrrp.observe(True) is False
    assert gw.vrrp.observe(False) is True
    got = scrape(gw, fib)
    assert got[("podnet_gateway_vrrp_transitions_total", "to=master")] == 1
    assert got[("podnet_gateway_vrrp_transitions_total", "to=backup")] == 1
