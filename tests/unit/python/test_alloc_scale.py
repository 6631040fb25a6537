# SPDX-License-Identifier: Apache-2.0
"""How a job is allocated: every node sends the same few small transactions for its own
pod whatever the job's size, reads nothing that grows with it and waits for no other node;
the first node writes the job's record and name and the records under the name of the
pods that came before it; a reused name holds the newest job's records only (`make
unit`)."""

from __future__ import annotations

import ipaddress
from typing import Any

from fake_etcd import FakeEtcd
from podnet.names import Keys
from podnet.state.alloc import Allocator
from podnet.state.ipam import Ipam

NODES = [f"n{i:03d}" for i in range(40)]


class CountingEtcd(FakeEtcd):
    """The in-memory etcd, counting each transaction's operations and compares."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def txn(self, compare: list[Any], success: list[Any], failure: list[Any] | None = None) -> Any:
        with self.lock:
            self.sizes.append(max(len(compare), len(success), len(failure or [])))
        if self.sizes[-1] > self.max_txn_ops:
            raise AssertionError(f"a transaction of {self.sizes[-1]} > {self.max_txn_ops}")
        return super().txn(compare, success, failure)


def _allocator(etcd: Any) -> Allocator:
    return Allocator(
        etcd, Keys("u"), Ipam(ipaddress.IPv4Network("198.18.0.0/16"), 26), "u", 4096, 8191
    )


def _start(etcd: CountingEtcd, job_id: int, nodes: list[str], order: list[int]) -> dict[int, Any]:
    """The job's nodes allocate in `order` (indices), each with its own allocator; returns
    each node's transactions (their sizes) and reads."""
    vni = _allocator(etcd).user_vni("alice", 2001)
    out: dict[int, Any] = {}
    for i in order:
        a = _allocator(etcd)
        before, reads = len(etcd.sizes), etcd.reads
        pod = a.allocate_job(job_id, "alice", 2001, "big", nodes, vni, i)
        out[i] = (pod, etcd.sizes[before:], etcd.reads - reads)
    return out


def test_a_nodes_transactions_do_not_grow_with_the_job() -> None:
    small = _start(CountingEtcd(), 7, NODES[:4], [0, 1, 2, 3])
    big = _start(CountingEtcd(), 7, NODES, list(range(len(NODES))))
    for i in (1, 2, 3):
        _pod, sizes, reads = big[i]
        assert (sizes, reads) == (small[i][1], small[i][2]) and reads == 0
        assert len(sizes) == 1 and max(sizes) <= 7  # its pod and its name, one transaction
    # the first node (first to come): the job's record and name with its pod, one
    # transaction (nothing under the name to settle)
    assert big[0][1] == small[0][1] and len(big[0][1]) == 1 and big[0][2] == 0


def test_the_first_node_names_the_pods_that_came_before_it() -> None:
    etcd = CountingEtcd()
    etcd.max_txn_ops = 16  # the first node names 39 pods in transactions etcd accepts
    got = _start(etcd, 9, NODES, [*range(1, len(NODES)), 0])
    assert etcd.get("/podnet/u/jobs/9") is not None
    for i, (pod, _sizes, _reads) in got.items():
        assert etcd.data[f"/skydns/u/alice/big/pod{i}"].json()["host"] == pod.ip
        assert etcd.data[f"/skydns/u/alice/9/pod{i}"].json()["host"] == pod.ip
        assert etcd.data[f"/podnet/u/jobnodes/9/{NODES[i]}"].json() == {"index": i, "ip": pod.ip}
    assert len({p.ip for p, _s, _r in got.values()}) == len(NODES)


def test_a_reused_job_name_holds_the_newest_jobs_records_only() -> None:
    etcd = CountingEtcd()
    a = _allocator(etcd)
    vni = a.user_vni("alice", 2001)
    big = [a.allocate_job(20, "alice", 2001, "same", NODES[:5], vni, i) for i in range(5)]
    etcd.put("/skydns/u/alice/same/ctr", {"host": "198.18.15.1"})  # a container's, older
    small = [a.allocate_job(21, "alice", 2001, "same", NODES[:2], vni, i) for i in range(2)]
    named = {k: kv.json()["host"] for k, kv in etcd.data.items() if "/alice/same/" in k}
    assert named == {f"/skydns/u/alice/same/pod{i}": small[i].ip for i in range(2)}
    assert etcd.data["/skydns/u/alice/20/pod4"].json()["host"] == big[4].ip  # its own


def test_a_record_under_a_name_that_moved_on_is_not_written() -> None:
    """A node that comes after a newer job took the name writes nothing under it."""
    etcd = CountingEtcd()
    a = _allocator(etcd)
    vni = a.user_vni("alice", 2001)
    a.allocate_job(30, "alice", 2001, "n", NODES[:3], vni, 0)
    later: list[Any] = []
    a.allocate_job(30, "alice", 2001, "n", NODES[:3], vni, 2, later)
    newest = [a.allocate_job(32, "alice", 2001, "n", NODES[:3], vni, i) for i in range(3)]
    for run in later:
        run()
    named = {k: kv.json()["host"] for k, kv in etcd.data.items() if "/alice/n/" in k}
    assert named == {f"/skydns/u/alice/n/pod{i}": newest[i].ip for i in range(3)}
