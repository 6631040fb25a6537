# SPDX-License-Identifier: Apache-2.0
"""Concurrency, kill -9 at random points, GC of vanished jobs."""

from __future__ import annotations

import contextlib
import ipaddress
import random
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Node, set_dead_jobs, sh, wait_for
from test_pods import job_up, ping


@pytest.fixture(scope="module")
def eight(cluster: dict[str, Node], workdir: Path, etcd: Any) -> Iterator[dict[str, Node]]:
    extra = {f"n{i}": Node(i, workdir, etcd) for i in range(4, 9)}
    try:
        yield {**cluster, **extra}
    finally:
        for n in extra.values():
            n.teardown()


def test_no_ip_allocated_twice_8_nodes_x_50_concurrent(eight: dict[str, Node], etcd: Any) -> None:
    names = sorted(eight, key=lambda n: int(n[1:]))
    jobs = list(range(1000, 1050))
    results: dict[tuple[int, str], dict[str, Any]] = {}
    errors: list[str] = []

    def one(job_id: int, node: str) -> None:
        try:
            uid = 3000 + job_id % 5
            pod = job_up(eight[node], job_id, f"u{uid}", uid, f"c{job_id}", names)
            results[(job_id, node)] = pod
        except Exception as e:
            errors.append(f"{job_id}@{node}: {e}")

    threads = [threading.Thread(target=one, args=(j, n)) for j in jobs for n in names]
    random.Random(1).shuffle(threads)
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:5]
    assert len(results) == 400
    ips = [p["ip"] for p in results.values()]
    assert len(set(ips)) == 400, "an IP was handed out twice"
    kvs, _ = etcd.client.get_prefix("/podnet/t/ips/")
    owners = {kv.key.rsplit("/", 1)[-1]: kv.json() for kv in kvs}
    for (job_id, node), pod in results.items():
        assert owners[pod["ip"]]["job_id"] == job_id
        assert owners[pod["ip"]]["node"] == node
    # every node's pods come from that node's blocks
    blocks, _ = etcd.client.get_prefix("/podnet/t/blocks/")
    owner_of = {kv.key.rsplit("/", 1)[-1]: kv.json()["node"] for kv in blocks}
    for (_job, node), pod in results.items():
        blk = ipaddress.ip_network(f"{pod['ip']}/26", strict=False)
        assert owner_of[f"{blk.network_address}-26"] == node
    for j in jobs:
        for n in names:
            eight[n].call("job_down", job_id=j)
    kvs, _ = etcd.client.get_prefix("/podnet/t/jobs/")
    assert not [kv.key for kv in kvs if 1000 <= int(kv.key.rsplit("/", 1)[-1]) < 1050]


def test_kill9_during_create_leaves_nothing_behind(cluster: dict[str, Node], etcd: Any) -> None:
    n3, n1 = cluster["n3"], cluster["n1"]
    live = [job_up(n, 499, "alice", 2001, "survivor", ["n3", "n1"]) for n in (n3, n1)]
    ino = Path(live[0]["netns"]).stat().st_ino
    rnd = random.Random(42)
    attempted = []
    for i in range(12):
        job_id = 500 + i
        attempted.append(job_id)
        t = threading.Thread(target=lambda j=job_id: _quiet(n3, j), daemon=True)
        t.start()
        time.sleep(rnd.uniform(0.0, 0.06))
        n3.stop(signal.SIGKILL)
        t.join(30)
        n3.start()
        # the live pod is untouched: same namespace, still reachable
        assert Path(live[0]["netns"]).stat().st_ino == ino
        assert n3.call("job_get", job_id=499)["pod"]["ip"] == live[0]["ip"]
        # every pod namespace on the node is a pod the agent knows, with its port in nft
        known = {p["name"] for p in n3.call("pods")["pods"]}
        on_disk = {p.name for p in (n3.dir / "netns").iterdir()}
        assert on_disk <= known, on_disk - known
    assert wait_for(lambda: ping(n3, live[0], live[1]["ip"]), 10)
    # retries are idempotent, then everything is released
    for j in attempted:
        job_up(n3, j, "alice", 2001, "k", ["n3"])
        n3.call("job_down", job_id=j)
    for j in attempted:
        assert etcd.client.get(f"/podnet/t/jobs/{j}") is None
    kvs, _ = etcd.client.get_prefix("/podnet/t/ips/")
    assert not [kv for kv in kvs if 500 <= int(kv.json().get("job_id", 0)) < 520]
    netns = {p.name for p in (n3.dir / "netns").iterdir()}
    assert netns == {"pn-j499"}
    # the kernel reaps the veths of removed namespaces asynchronously (the spares' are in
    # no bridge: kernel/spares.py)
    wait_for(
        lambda: (
            len(
                re.findall(
                    r" pnv[0-9a-f]{12}@.* master pnbr",
                    sh("ip", "netns", "exec", n3.netns, "ip", "-o", "link").stdout,
                )
            )
            == 1
        ),
        15,
    )
    routes = sh("ip", "netns", "exec", n3.netns, "ip", "route").stdout
    assert routes.count("scope link") - routes.count("proto kernel") == 1, routes


def _quiet(node: Node, job_id: int) -> None:
    # the daemon is killed on purpose while it answers
    with contextlib.suppress(Exception):
        job_up(node, job_id, "alice", 2001, "k", ["n3"])


def test_gc_removes_pods_and_records_of_vanished_jobs(
    cluster: dict[str, Node], workdir: Path, etcd: Any
) -> None:
    n1, n2 = cluster["n1"], cluster["n2"]
    pods = [job_up(n, 600, "alice", 2001, "gc-me", ["n1", "n2"]) for n in (n1, n2)]
    time.sleep(5.5)  # GC spares pods younger than 5 s
    set_dead_jobs(workdir, [600])
    try:
        wait_for(lambda: all(not Path(p["netns"]).exists() for p in pods), 20)
        wait_for(lambda: etcd.client.get("/podnet/t/jobs/600") is None, 10)
        kvs, _ = etcd.client.get_prefix("/skydns/t/alice/600/")
        assert kvs == []
        assert etcd.client.get(f"/podnet/t/ips/{pods[0]['ip']}") is None
    finally:
        set_dead_jobs(workdir, [])
