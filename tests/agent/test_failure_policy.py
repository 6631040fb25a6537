# SPDX-License-Identifier: Apache-2.0
"""The cluster's failure_policy when etcd is unreachable, against a real etcd that is
stopped and started again: `fail` answers EUNAVAIL at once, `retry` keeps the request
until etcd is back (within failure_retry_seconds) and then makes the pod."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import EtcdServer, Node
from podnet.api.client import ApiError

CLUSTER = "patfp"
BASE_CONFIG = {
    "pod_cidr": "198.19.0.0/16",
    "block_prefix": 26,
    "zone": "fp",
    "vni_min": 6000,
    "vni_max": 6999,
    "login_lease_ttl": 10,
}


@pytest.fixture
def own_etcd(workdir: Path, underlay: str) -> Iterator[EtcdServer]:
    """An etcd of its own (the session's etcd serves the other tests meanwhile)."""
    e = EtcdServer(workdir, f"etcd-fp-{time.monotonic_ns()}")
    try:
        yield e
    finally:
        e.stop()


def node_with_policy(workdir: Path, e: EtcdServer, **policy: Any) -> Node:
    e.client.put(f"/podnet/{CLUSTER}/config", {**BASE_CONFIG, **policy})
    return Node(
        10, workdir, e, settings={"cluster": CLUSTER, "roles": ["compute"], "gc_interval": 3600}
    )


def job_up(node: Node, job_id: int) -> dict[str, Any]:
    return node.call(
        "job_up", job_id=job_id, user="fpuser", uid=2901, job_name="fp", nodes=["n10"], node_index=0
    )


def test_fail_policy_answers_at_once(workdir: Path, own_etcd: EtcdServer) -> None:
    node = node_with_policy(workdir, own_etcd, failure_policy="fail")
    try:
        assert job_up(node, 1)["pod"]["ip"]
        own_etcd.stop()
        t0 = time.monotonic()
        with pytest.raises(ApiError) as err:
            job_up(node, 2)
        assert err.value.code == "EUNAVAIL", err.value
        assert "unavailable" in str(err.value)
        assert time.monotonic() - t0 < 10
        own_etcd.start()
        # podnetd's connection comes back within its reconnect backoff (at most 1 s)
        deadline = time.monotonic() + 15
        while True:
            try:
                assert job_up(node, 2)["pod"]["ip"]
                break
            except ApiError as e:
                if e.code != "EUNAVAIL" or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        node.teardown()


def test_retry_policy_waits_for_etcd(workdir: Path, own_etcd: EtcdServer) -> None:
    node = node_with_policy(workdir, own_etcd, failure_policy="retry", failure_retry_seconds=20)
    try:
        first = job_up(node, 1)["pod"]
        own_etcd.stop()
        got: dict[str, Any] = {}

        def ask() -> None:
            try:
                got["reply"] = job_up(node, 2)
            except ApiError as e:
                got["error"] = e

        t = threading.Thread(target=ask)
        t.start()
        time.sleep(3)
        assert t.is_alive(), f"answered while etcd was down: {got}"
        own_etcd.start()
        t.join(30)
        assert not t.is_alive()
        pod = got["reply"]["pod"]
        assert pod["ip"] and pod["ip"] != first["ip"]
        # the pod is real: its address is on its eth0
        out = node.pod_exec(pod["netns"], "ip", "-4", "-o", "addr", "show", "eth0").stdout
        assert f"{pod['ip']}/" in out
    finally:
        node.teardown()


def test_retry_policy_gives_up_after_its_time(workdir: Path, own_etcd: EtcdServer) -> None:
    node = node_with_policy(workdir, own_etcd, failure_policy="retry", failure_retry_seconds=2)
    try:
        job_up(node, 1)
        own_etcd.stop()
        t0 = time.monotonic()
        with pytest.raises(ApiError) as err:
            job_up(node, 2)
        took = time.monotonic() - t0
        assert err.value.code == "EUNAVAIL"
        assert 1.5 < took < 15, took
    finally:
        own_etcd.start()
        node.teardown()
