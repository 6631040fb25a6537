# SPDX-License-Identifier: Apache-2.0
"""`podnet status --cluster` (cli/cluster.py, issue 37): what it reads of etcd and what it
calls a problem, on an in-memory etcd (the real one: tests/e2e/test_cluster_status.py)."""

from __future__ import annotations

from typing import Any

import pytest
from fake_etcd import FakeEtcd
from podnet.cli import cluster
from podnet.config import ConfigError
from podnet.names import Keys
from podnet.state.store import EtcdUnavailable

KEYS = Keys("lab")
CONFIG = {"pod_cidr": "198.18.0.0/24", "block_prefix": 28, "zone": "lab"}
LEADER = {"version": "3.5.16", "leader": "42", "revision": 9, "db_size": 20480}


class Etcd(FakeEtcd):
    def get_json(self, key: str) -> Any:
        kv = self.get(key)
        return kv.json() if kv else None


def healthy() -> Etcd:
    e = Etcd()
    e.put(KEYS.config, CONFIG)
    for node, ip in (("c1", "10.0.0.1"), ("c2", "10.0.0.2")):
        e.put(KEYS.node(node), {"ip": ip, "roles": ["compute"]})
        e.put(KEYS.alive(node), {"ip": ip, "version": "0.2.0"})
    e.put(KEYS.block("198.18.0.0/28"), {"node": "c1"})
    e.put(KEYS.vni(4097), {"user": "alice"})
    e.put(KEYS.vni(4098), {"user": "bob"})
    for i in range(3):
        e.put(KEYS.ip(f"198.18.0.{i + 1}"), {"job_id": 5, "node": "c1", "vni": 4097})
    e.put(KEYS.ip("198.18.0.9"), {"kind": "login", "node": "c2", "user": "bob", "vni": 4098})
    return e


def run(e: Etcd, status: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    status = status or {"https://ctl:2379": LEADER}

    def status_of(ep: str) -> dict[str, Any]:
        st = status[ep]
        if "raise" in st:
            raise EtcdUnavailable(st["raise"])
        return st

    return cluster.report(cluster.read(e, KEYS, list(status), status_of))


def test_a_healthy_cluster_has_no_problem() -> None:
    r = run(healthy())
    assert r["ok"] and r["problems"] == [], r["problems"]
    assert [n["node"] for n in r["nodes"]] == ["c1", "c2"] and all(n["alive"] for n in r["nodes"])
    assert r["pool"] == {
        "cidr": "198.18.0.0/24",
        "addresses": 256,
        "used": 4,
        "blocks": 1,
        "blocks_free": 15,
    }
    assert r["top_users"] == [{"user": "alice", "addresses": 3}, {"user": "bob", "addresses": 1}]
    assert "problems: none" in cluster.text(r)


def test_a_stopped_podnetd_and_its_addresses_are_problems() -> None:
    e = healthy()
    e.delete(KEYS.alive("c1"))  # its lease ran out
    r = run(e)
    assert not r["ok"]
    assert "node c1: podnetd is not running (no live record)" in r["problems"]
    assert any(p.startswith("node c1: 3 pod addresses held while its podnetd is down")
               for p in r["problems"])  # fmt: skip
    assert "podnetd DOWN" in cluster.text(r)


def test_version_skew_address_change_and_unregistered_nodes() -> None:
    e = healthy()
    e.put(KEYS.alive("c2"), {"ip": "10.0.0.2", "version": "0.2.1"})
    e.put(KEYS.alive("c3"), {"ip": "10.0.0.3", "version": "0.2.1"})
    e.put(KEYS.alive("c1"), {"ip": "10.0.0.11", "version": "0.2.1"})
    r = run(e)
    assert r["cluster_version"] == "0.2.1"
    assert r["problems"] == [
        "node c1: podnetd runs on 10.0.0.11, registered with 10.0.0.1",
        "node c3: podnetd runs but the node is not registered",
    ]
    e.put(KEYS.alive("c1"), {"ip": "10.0.0.1", "version": "0.2.0"})
    assert "node c1: podnetd 0.2.0, others run 0.2.1" in run(e)["problems"]


def test_etcd_endpoints_down_without_leader_or_split() -> None:
    r = run(
        healthy(),
        {
            "https://ctl:2379": LEADER,
            "https://ctl2:2379": {"raise": "connection refused"},
            "https://ctl3:2379": {**LEADER, "leader": "0"},
        },
    )
    assert r["problems"] == [
        "etcd https://ctl2:2379: connection refused",
        "etcd https://ctl3:2379: no leader",
    ]
    r = run(healthy(), {"https://a:2379": LEADER, "https://b:2379": {**LEADER, "leader": "7"}})
    assert r["problems"] == ["etcd: the endpoints name different leaders (['42', '7'])"]


def test_a_nearly_full_pool_is_a_problem() -> None:
    e = healthy()
    for i in range(10, 240):
        e.put(KEYS.ip(f"198.18.0.{i}"), {"job_id": 6, "node": "c2", "vni": 4098})
    r = run(e)
    assert r["problems"] == ["address pool 198.18.0.0/24: 234 of 256 addresses used"]
    assert r["top_users"][0] == {"user": "bob", "addresses": 231}


def test_no_cluster_configuration_is_a_clear_error() -> None:
    e = healthy()
    e.delete(KEYS.config)
    with pytest.raises(ConfigError, match="pod_cidr"):
        run(e)
