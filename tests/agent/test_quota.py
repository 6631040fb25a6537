# SPDX-License-Identifier: Apache-2.0
"""Quotas on real podnetds and a real etcd (issue 22, item 1; docs/security.md "Quotas").

Three nodes of their own (n20-n22) on an etcd of their own whose cluster configuration has
small quotas. Attack tests: a user over a quota is refused with the limit, its value and
what they hold (EQUOTA through the socket, and `podnet status` shows it) while another user
is not; requests racing on several nodes for a user's last slot never pass the limit
together. Before quotas (issue 22) every one of these requests succeeded.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import CLUSTER, HOST_IP, POD_CIDR, ZONE, EtcdServer, Node, sh, user_call, wait_for
from podnet.api.client import ApiError

# real users of the test host (no user is created): daemon and bin
A_UID, B_UID = 1, 2
A_USER = "daemon"
NODES = (20, 21, 22)
QUOTAS = {
    "quota_containers_per_node": 2,
    "quota_containers": 3,
    "quota_login_pods": 2,
    "quota_addresses": 4,
}


@pytest.fixture(scope="module")
def qetcd(workdir: Path, underlay: str) -> Iterator[EtcdServer]:
    e = EtcdServer(workdir, f"etcd-quota-{time.monotonic_ns()}")
    e.client.put(
        f"/podnet/{CLUSTER}/config",
        {
            "pod_cidr": POD_CIDR,
            "block_prefix": 26,
            "zone": ZONE,
            "underlay_mtu": 1500,
            "vni_min": 5000,
            "vni_max": 5999,
            "host_cidrs": ["203.0.113.0/26"],
            "dns_servers": [HOST_IP],
            "login_lease_ttl": 10,
            "login_grace": 1.0,
            **QUOTAS,
        },
    )
    try:
        yield e
    finally:
        e.stop()


@pytest.fixture(scope="module")
def qnodes(workdir: Path, qetcd: EtcdServer) -> Iterator[list[Node]]:
    nodes: list[Node] = []
    try:
        for i in NODES:
            nodes.append(
                Node(
                    i,
                    workdir,
                    qetcd,
                    settings={"containers_outside_jobs": True, "gc_interval": 3600},
                )
            )
        yield nodes
    finally:
        for n in nodes:
            n.teardown()


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes that hold login pods (root asks for them with their pid)."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def hold_login(node: Node, uid: int, procs: list[subprocess.Popen[bytes]]) -> dict[str, Any]:
    p = subprocess.Popen(["sleep", "600"])
    procs.append(p)
    return dict(node.call("login_acquire", uid=uid, pid=p.pid)["pod"])


def release_all_logins(nodes: list[Node], uid: int) -> None:
    for n in nodes:
        n.call("login_release", uid=uid)


def test_login_pod_over_quota_is_refused_with_the_limit_other_user_unaffected(
    qnodes: list[Node], holders: list[subprocess.Popen[bytes]]
) -> None:
    n20, n21, n22 = qnodes
    try:
        hold_login(n20, A_UID, holders)
        hold_login(n21, A_UID, holders)
        r = user_call(n22, A_UID, "login_acquire")
        assert r.get("code") == "EQUOTA", r
        assert f"login pods per user is 2, and {A_USER} holds 2" in r["message"]
        assert not [p for p in n22.call("pods")["pods"] if p["uid"] == A_UID]
        # bob is not affected
        b = user_call(n22, B_UID, "login_acquire")
        assert b.get("ok") and b["pod"]["kind"] == "login", b
        # one released: the next one passes
        n20.call("login_release", uid=A_UID)
        assert hold_login(n22, A_UID, holders)["kind"] == "login"
    finally:
        release_all_logins(qnodes, A_UID)
        release_all_logins(qnodes, B_UID)


def race(*calls: Callable[[], dict[str, Any]]) -> list[dict[str, Any]]:
    """The calls at once (threads released together); their replies, refusals as
    `{"ok": False, "code": ..., "message": ...}`."""
    results: list[dict[str, Any]] = []
    start = threading.Barrier(len(calls))

    def one(fn: Callable[[], dict[str, Any]]) -> None:
        start.wait()
        try:
            results.append(fn())
        except ApiError as e:
            results.append({"ok": False, "code": e.code, "message": e.message})

    threads = [threading.Thread(target=one, args=(fn,)) for fn in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_logins_racing_on_three_nodes_never_pass_the_limit(
    qnodes: list[Node], holders: list[subprocess.Popen[bytes]]
) -> None:
    for _round in range(4):
        procs = [subprocess.Popen(["sleep", "600"]) for _ in qnodes]
        holders.extend(procs)
        results = race(
            *(
                functools.partial(n.call, "login_acquire", uid=A_UID, pid=p.pid)
                for n, p in zip(qnodes, procs, strict=True)
            )
        )
        try:
            ok = [r for r in results if r.get("ok")]
            refused = [r for r in results if not r.get("ok")]
            assert len(ok) == 2, results
            assert len(refused) == 1 and refused[0]["code"] == "EQUOTA", results
            pods = [p for n in qnodes for p in n.call("pods")["pods"] if p["uid"] == A_UID]
            assert len(pods) == 2
        finally:
            release_all_logins(qnodes, A_UID)


def test_podnet_status_shows_a_user_their_usage(
    qnodes: list[Node], holders: list[subprocess.Popen[bytes]]
) -> None:
    n20, n21, _n22 = qnodes
    try:
        hold_login(n20, A_UID, holders)
        hold_login(n21, A_UID, holders)
        r = sh(
            "setpriv",
            f"--reuid={A_UID}",
            f"--regid={A_UID}",
            "--clear-groups",
            sys.executable,
            "-m",
            "podnet.cli.podnet",
            "--socket",
            n20.socket,
            "status",
        )
        lines = r.stdout.splitlines()
        assert f"quotas of {A_USER} (held / limit):" in lines, r.stdout
        row = next(x for x in lines if "login pods per user" in x)
        assert "2 / 2  at the limit" in row, row
        row = next(x for x in lines if "addresses per user" in x)
        assert "2 / 4" in row
        row = next(x for x in lines if "containers per user on a node (n20)" in x)
        assert "0 / 2" in row
        # root: not limited; and root may look at a user's
        out = json.loads(
            sh(
                sys.executable,
                "-m",
                "podnet.cli.podnet",
                "--socket",
                n20.socket,
                "--json",
                "status",
            ).stdout
        )
        assert out["quota"]["limited"] is False
        q = n20.call("quota", user=A_USER)["quota"]
        held = {x["limit"]: x["held"] for x in q["limits"]}
        assert held["logins"] == 2 and held["addresses"] == 2
    finally:
        release_all_logins(qnodes, A_UID)


def test_published_ports_racing_never_pass_the_gateway_policy_limit(
    qnodes: list[Node], qetcd: EtcdServer
) -> None:
    n20, n21, _ = qnodes
    root = f"/podnet/{CLUSTER}/"
    qetcd.client.put(
        root + "gateway/config", {"external_ip": "203.0.113.60", "ports": "20000-20099"}
    )
    qetcd.client.put(root + "gateway/policy/global", {"default": "deny", "publish": {"max": 1}})
    job = {"job_id": 2201, "user": A_USER, "uid": A_UID, "job_name": "pub", "nodes": ["n20", "n21"]}
    n20.call("job_up", node_index=0, **job)
    n21.call("job_up", node_index=1, **job)
    try:
        for _round in range(3):
            results = race(
                *(
                    functools.partial(
                        user_call, n, A_UID, "publish", job="2201", pod=0, port=8000 + i
                    )
                    for i, n in enumerate((n20, n21))
                )
            )
            ok = [r for r in results if r.get("ok")]
            refused = [r for r in results if not r.get("ok")]
            assert len(ok) == 1 and len(refused) == 1, results
            assert refused[0]["code"] == "EQUOTA", results
            assert f"published ports per user is 1, and {A_USER} holds 1" in refused[0]["message"]
            port = ok[0]["published"]["port"]
            r = user_call(n20, A_UID, "unpublish", job="2201", pod=0, port=port)
            assert r["removed"] == 1, r
        # bob's limit is his own: with alice holding one, bob (no job) is refused for
        # another reason, never for her quota
        user_call(n20, A_UID, "publish", job="2201", pod=0, port=9000)
        r = user_call(n20, B_UID, "publish", job="2201", pod=0, port=9001)
        assert r["code"] == "EPERM", r
    finally:
        for n in (n20, n21):
            n.call("job_down", job_id=2201)


class Containers:
    """A user's containers: `unshare -rn sleep` processes wired through their /proc path
    (what a CNI runtime passes), deleted at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.added: list[tuple[Node, str, int]] = []

    def netns(self, uid: int) -> str:
        setpriv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        p = subprocess.Popen([*setpriv, "unshare", "-rn", "sleep", "600"])
        self.procs.append(p)
        me = os.readlink("/proc/self/ns/net")
        wait_for(lambda: os.readlink(f"/proc/{p.pid}/ns/net") != me)
        return f"/proc/{p.pid}/ns/net"

    def add(self, node: Node, uid: int, cid: str) -> dict[str, Any]:
        """container_add as the user; the reply (a refusal: ok False, code, message)."""
        r = user_call(
            node, uid, "container_add", container_id=cid, ifname="eth0", netns=self.netns(uid)
        )
        if r.get("ok"):
            self.added.append((node, cid, uid))
        return r

    def close(self) -> None:
        for node, cid, uid in self.added:
            node.call("container_del", container_id=cid, ifname="eth0", uid=uid)
        for p in self.procs:
            p.kill()
            p.wait()


@pytest.fixture
def ctrs() -> Iterator[Containers]:
    c = Containers()
    yield c
    c.close()


def test_containers_over_the_node_and_cluster_quotas_refused_other_user_unaffected(
    qnodes: list[Node], ctrs: Containers
) -> None:
    n20, n21, _n22 = qnodes
    assert ctrs.add(n20, A_UID, "q-a1")["ok"]
    assert ctrs.add(n20, A_UID, "q-a2")["ok"]
    r = ctrs.add(n20, A_UID, "q-a3")
    assert r.get("code") == "EQUOTA", r
    assert f"containers per user on a node on n20 is 2, and {A_USER} holds 2" in r["message"]
    # bob's containers on the same node are his own count
    assert ctrs.add(n20, B_UID, "q-b1")["ok"]
    # the cluster's: 3 (two on n20, one on n21), the next one anywhere is refused
    assert ctrs.add(n21, A_UID, "q-a4")["ok"]
    r = ctrs.add(n21, A_UID, "q-a5")
    assert r.get("code") == "EQUOTA", r
    assert f"containers per user is 3, and {A_USER} holds 3" in r["message"]
    mine = [p for n in qnodes for p in n.call("pods")["pods"] if p["uid"] == A_UID]
    assert len(mine) == 3


def test_addresses_count_login_pods_and_containers_together(
    qnodes: list[Node], ctrs: Containers, holders: list[subprocess.Popen[bytes]]
) -> None:
    n20, n21, n22 = qnodes
    try:
        hold_login(n20, A_UID, holders)
        hold_login(n21, A_UID, holders)
        assert ctrs.add(n22, A_UID, "q-ad1")["ok"]
        assert ctrs.add(n22, A_UID, "q-ad2")["ok"]
        r = ctrs.add(n21, A_UID, "q-ad3")
        assert r.get("code") == "EQUOTA", r
        assert "addresses per user (containers and login pods) is 4" in r["message"]
        assert f"{A_USER} holds 4" in r["message"]
        # a released login pod gives its address back
        n20.call("login_release", uid=A_UID)
        assert ctrs.add(n21, A_UID, "q-ad3")["ok"]
    finally:
        release_all_logins(qnodes, A_UID)


def test_containers_racing_on_two_nodes_never_pass_the_cluster_limit(
    qnodes: list[Node], ctrs: Containers
) -> None:
    """Two slots left of 3, three requests at once on two other nodes: exactly two pass."""
    n20, n21, n22 = qnodes
    assert ctrs.add(n20, A_UID, "q-base")["ok"]
    for i in range(4):
        results = race(
            functools.partial(ctrs.add, n21, A_UID, f"q-r{i}a"),
            functools.partial(ctrs.add, n22, A_UID, f"q-r{i}b"),
            functools.partial(ctrs.add, n22, A_UID, f"q-r{i}c"),
        )
        ok = [r for r in results if r.get("ok")]
        refused = [r for r in results if not r.get("ok")]
        assert len(ok) == 2 and len(refused) == 1, results
        assert refused[0]["code"] == "EQUOTA", results
        for node, cid, uid in [a for a in ctrs.added if a[1].startswith(f"q-r{i}")]:
            node.call("container_del", container_id=cid, ifname="eth0", uid=uid)
            ctrs.added.remove((node, cid, uid))


def test_a_changed_limit_applies_without_a_restart(
    qnodes: list[Node], qetcd: EtcdServer, holders: list[subprocess.Popen[bytes]]
) -> None:
    """The role writes the inventory's limits to the cluster configuration; podnetd reads
    them again within 10 s (quota.LiveLimits)."""
    n20, n21, _ = qnodes
    key = f"/podnet/{CLUSTER}/config"
    config = qetcd.client.get_json(key)
    try:
        hold_login(n20, A_UID, holders)
        qetcd.client.put(key, {**config, "quota_login_pods": 1})

        def refused() -> bool:
            r = user_call(n21, A_UID, "login_acquire")
            n21.call("login_release", uid=A_UID)
            return r.get("code") == "EQUOTA" and "login pods per user is 1" in r["message"]

        wait_for(refused, 30, 1.0)
    finally:
        qetcd.client.put(key, config)
        release_all_logins(qnodes, A_UID)
