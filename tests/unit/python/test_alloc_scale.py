# SPDX-License-Identifier: Apache-2.0
"""How a job is allocated: its first node sends one transaction with everything (addresses,
record, name, every pod's DNS records and marker, those under the job name too) and no read,
and one more only to remove what the name's previous owner left; the other nodes take the
record from their watch and send nothing; a late first node is taken over by the next
nodes through the job's lock; a job too large for one transaction is split (`make unit`).
The last test runs `Etcd.get_or_wait` against a real etcd when one is installed."""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_etcd import FakeEtcd
from podnet.names import Keys
from podnet.state.alloc import Allocator, Job, JobRecords
from podnet.state.alloc import jobs as alloc_jobs
from podnet.state.etcdops import KV
from podnet.state.ipam import Ipam
from podnet.state.store import Etcd

NODES = [f"n{i:03d}" for i in range(40)]


class WatchingEtcd(FakeEtcd):
    """The in-memory etcd with `get_or_wait` (what the real store offers)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def get_or_wait(self, key: str, timeout: float) -> KV | None:
        with self.lock:
            self.waits += 1
        end = time.monotonic() + timeout
        while True:
            with self.lock:
                kv = self.data.get(key)
            if kv is not None or time.monotonic() >= end:
                return kv
            time.sleep(0.001)


def _allocator(etcd: Any, jobs: JobRecords | None = None) -> Allocator:
    return Allocator(
        etcd,
        Keys("u"),
        Ipam(ipaddress.IPv4Network("198.18.0.0/20"), 26),
        "u",
        4096,
        8191,
        jobs=jobs,
    )


def _fed(etcd: FakeEtcd, views: list[JobRecords], job_id: int) -> None:
    """What each node's watch of jobs/ does once the job record is written."""
    kv = etcd.data[f"/podnet/u/jobs/{job_id}"]
    for v in views:
        v.put(Job.from_json(kv.json(), kv.mod_revision))


def test_first_node_sends_one_transaction_with_every_pods_records() -> None:
    etcd = WatchingEtcd()
    first = _allocator(etcd)
    vni = first.user_vni("alice", 2001)
    reads, txns = etcd.reads, etcd.txns
    job = first.allocate_job(7, "alice", 2001, "big", NODES, vni, 0)
    # the allocation, the records under the job name with it (the name had none)
    assert (etcd.reads, etcd.txns) == (reads, txns + 1)
    assert len(set(job.ips)) == len(NODES)
    # every pod's DNS records and its node's marker came with the allocation
    for i, node in enumerate(NODES):
        assert etcd.data[f"/skydns/u/alice/big/pod{i}"].json()["host"] == job.ips[i]
        assert etcd.data[f"/skydns/u/alice/7/pod{i}"].json()["host"] == job.ips[i]
        assert f"/podnet/u/jobnodes/7/{node}" in etcd.data
    # asked again (podnetd restarted, Slurm retried): the transaction's failure branch
    # returns the job, with the same addresses and no new one taken
    again = _allocator(etcd)
    again.load_view()
    assert again.allocate_job(7, "alice", 2001, "big", NODES, vni, 0).ips == job.ips
    assert len(etcd.get_prefix("/podnet/u/ips/")[0]) == len(NODES)


def test_other_nodes_take_the_record_from_their_watch_and_send_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # no node takes over (test_the_second_node_takes_over_a_late_first_node does): on a
    # busy machine the first node may come later than the real grace (0.1 s here)
    monkeypatch.setattr(alloc_jobs, "first_node_grace", lambda n: 5.0)
    etcd = WatchingEtcd()
    views = [JobRecords() for _ in range(5)]
    for v in views:
        v.reset([])
    first, others = _allocator(etcd), [_allocator(etcd, v) for v in views]
    vni = first.user_vni("alice", 2001)
    got: dict[int, Any] = {}

    def wait(i: int) -> None:
        got[i] = others[i].allocate_job(9, "alice", 2001, "big", NODES, vni, i + 1)

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    time.sleep(0.3)  # they are all waiting before the first node comes (busy machine)
    reads, txns = etcd.reads, etcd.txns
    job = first.allocate_job(9, "alice", 2001, "big", NODES, vni, 0)
    _fed(etcd, views, 9)
    for t in threads:
        t.join(10)
    assert etcd.txns == txns + 1, "a waiting node sent a transaction"
    assert etcd.reads == reads and etcd.waits == 0, "a waiting node read etcd"
    assert all(g.ips == job.ips for g in got.values()) and len(got) == 5


def test_the_second_node_takes_over_a_late_first_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(alloc_jobs, "first_node_grace", lambda n: 0.05)
    etcd = WatchingEtcd()
    first, second = _allocator(etcd), _allocator(etcd)
    vni = first.user_vni("alice", 2001)
    txns = etcd.txns
    t0 = time.monotonic()
    job = second.allocate_job(11, "alice", 2001, "big", NODES, vni, 1)
    assert time.monotonic() - t0 >= 0.05
    # one small transaction for the job's lock, one for the job
    assert etcd.txns == txns + 2 and len(set(job.ips)) == len(NODES)
    assert etcd.get("/podnet/u/joblocks/11") is None, "the lock outlived the allocation"
    assert etcd.data["/skydns/u/alice/11/pod0"].json()["host"] == job.ips[0]
    # the late first node gets that job back, not a second allocation
    first.load_view()
    assert first.allocate_job(11, "alice", 2001, "big", NODES, vni, 0).ips == job.ips
    assert len(etcd.get_prefix("/podnet/u/ips/")[0]) == len(NODES)


def test_a_lock_whose_holder_died_is_taken_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(alloc_jobs, "first_node_grace", lambda n: 0.02)
    monkeypatch.setattr(alloc_jobs, "LEADER_WAIT", 0.05)
    etcd = WatchingEtcd()
    a = _allocator(etcd)
    vni = a.user_vni("alice", 2001)
    etcd.put("/podnet/u/joblocks/12", {"node": NODES[1], "at": 0})  # then it died
    # the first node finds the job taken over: it waits, then takes the lock itself
    job = a.allocate_job(12, "alice", 2001, "big", NODES, vni, 0)
    assert len(set(job.ips)) == len(NODES) and etcd.get("/podnet/u/joblocks/12") is None
    assert etcd.get("/podnet/u/jobs/12") is not None


def test_a_reused_job_name_holds_the_newest_jobs_records_only() -> None:
    """A job takes its name from the previous owner in its one transaction (overwriting
    the records of the pods both have); what the previous owner had beyond that (more pods,
    a container's record) goes in a second one, before the pod is ready (`defer`)."""
    etcd = WatchingEtcd()
    a = _allocator(etcd)
    vni = a.user_vni("alice", 2001)
    big = a.allocate_job(20, "alice", 2001, "same", NODES[:5], vni, 0)
    etcd.put("/skydns/u/alice/same/ctr", {"host": "198.18.15.1"})  # a container's, older
    txns = etcd.txns
    later: list[Any] = []
    small = a.allocate_job(21, "alice", 2001, "same", NODES[:2], vni, 0, later)
    assert etcd.txns == txns + 1 and len(later) == 1
    named = {k: kv.json()["host"] for k, kv in etcd.data.items() if "/alice/same/" in k}
    assert named["/skydns/u/alice/same/pod0"] == small.ips[0]
    assert named["/skydns/u/alice/same/pod1"] == small.ips[1]
    assert len(named) == 6  # the 3 of the bigger job's other pods and the container's
    for run in later:
        run()
    assert etcd.txns == txns + 2
    named = {k: kv.json()["host"] for k, kv in etcd.data.items() if "/alice/same/" in k}
    assert named == {f"/skydns/u/alice/same/pod{i}": small.ips[i] for i in range(2)}
    assert etcd.data["/skydns/u/alice/20/pod4"].json()["host"] == big.ips[4]  # its own
    # the same size again: everything overwritten, nothing left to remove
    later = []
    again = a.allocate_job(22, "alice", 2001, "same", NODES[:2], vni, 0, later)
    assert later == [] and etcd.txns == txns + 3
    named = {k: kv.json()["host"] for k, kv in etcd.data.items() if "/alice/same/" in k}
    assert named == {f"/skydns/u/alice/same/pod{i}": again.ips[i] for i in range(2)}


def test_a_removal_after_the_name_moved_on_removes_nothing() -> None:
    """The previous owner's leftovers are removed only while the job owns its name: a
    newer job's records stay."""
    etcd = WatchingEtcd()
    a = _allocator(etcd)
    vni = a.user_vni("alice", 2001)
    a.allocate_job(30, "alice", 2001, "n", NODES[:3], vni, 0)
    later: list[Any] = []
    a.allocate_job(31, "alice", 2001, "n", NODES[:1], vni, 0, later)
    newest = a.allocate_job(32, "alice", 2001, "n", NODES[:3], vni, 0)
    for run in later:
        run()
    named = {k: kv.json()["host"] for k, kv in etcd.data.items() if "/alice/n/" in k}
    assert named == {f"/skydns/u/alice/n/pod{i}": newest.ips[i] for i in range(3)}


def test_a_job_too_large_for_one_transaction_is_split() -> None:
    etcd = WatchingEtcd()
    etcd.max_txn_ops = 60  # 40 addresses + record + name fit; the 160 records do not
    a = _allocator(etcd)
    vni = a.user_vni("alice", 2001)
    txns = etcd.txns
    job = a.allocate_job(13, "alice", 2001, "big", NODES, vni, 0)
    # the guarded allocation, 120 records by 60, then the 40 under the job name
    assert etcd.txns == txns + 1 + 2 + 1
    assert all(f"/skydns/u/alice/13/pod{i}" in etcd.data for i in range(len(NODES)))
    assert len(set(job.ips)) == len(NODES)


# -- Etcd.get_or_wait against a real etcd (skipped when none is installed) -----------------


def _etcd_binary() -> str | None:
    cache = os.environ.get("PODNET_CACHE_DIR", "/var/cache/podnet-dev")
    for path in (
        os.environ.get("PODNET_TEST_ETCD"),
        f"{cache}/artifacts/etcd-server/usr/bin/etcd",
        shutil.which("etcd"),
    ):
        if path and os.access(path, os.X_OK):
            return path
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def real_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Etcd]:
    binary = _etcd_binary()
    if binary is None:
        pytest.skip("no etcd binary")
    d: Path = tmp_path_factory.mktemp("etcd")
    port, peer = _free_port(), _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            binary,
            "--name=u",
            f"--data-dir={d / 'data'}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=u=http://127.0.0.1:{peer}",
            "--log-level=error",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    etcd = Etcd([url], None, None, None, 5.0)
    try:
        end = time.monotonic() + 20
        while True:
            try:
                etcd.status()
                break
            except Exception:
                if time.monotonic() > end:
                    raise
                time.sleep(0.05)
        yield etcd
    finally:
        proc.terminate()
        proc.wait(10)


def test_get_or_wait_on_a_real_etcd(real_etcd: Etcd) -> None:
    etcd = real_etcd
    etcd.put("/u/there", {"a": 1})
    kv = etcd.get_or_wait("/u/there", 1.0)
    assert kv is not None and kv.json() == {"a": 1}

    t0 = time.monotonic()
    assert etcd.get_or_wait("/u/never", 0.2) is None
    assert 0.2 <= time.monotonic() - t0 < 2.0

    # written while waiting: seen at once, not at the deadline; a delete or another key
    # under the same prefix does not end the wait
    def later() -> None:
        time.sleep(0.1)
        etcd.put("/u/late/other", "x")
        etcd.delete("/u/late")
        etcd.put("/u/late", {"ips": ["198.18.0.1"] * 1000})

    threading.Thread(target=later).start()
    t0 = time.monotonic()
    kv = etcd.get_or_wait("/u/late", 5.0)
    assert kv is not None and len(kv.json()["ips"]) == 1000
    assert time.monotonic() - t0 < 2.0
    # the thread's session still works after the watch stream was closed
    assert etcd.get("/u/there") is not None
