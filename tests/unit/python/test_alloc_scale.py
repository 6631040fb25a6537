# SPDX-License-Identifier: Apache-2.0
"""The large-job path of the allocator: the first node allocates with one transaction and
no read, the others wait for its record with one read and a watch (`Etcd.get_or_wait`),
and fall back to allocating themselves (`make unit`). The last test runs
`Etcd.get_or_wait` against a real etcd when one is installed."""

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
from podnet.state import alloc
from podnet.state.alloc import Allocator
from podnet.state.ipam import Ipam
from podnet.state.store import KV, Etcd

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


def _allocator(etcd: Any) -> Allocator:
    return Allocator(
        etcd, Keys("u"), Ipam(ipaddress.IPv4Network("198.18.0.0/20"), 26), "u", 4096, 8191
    )


def test_first_node_sends_one_transaction_and_no_read() -> None:
    etcd = WatchingEtcd()
    first = _allocator(etcd)
    vni = first.user_vni("alice", 2001)
    reads, txns = etcd.reads, etcd.txns
    job = first.allocate_job(7, "alice", 2001, "big", NODES, vni, 0)
    assert (etcd.reads, etcd.txns) == (reads, txns + 1)
    assert len(set(job.ips)) == len(NODES)
    # asked again (podnetd restarted, Slurm retried): the transaction's failure branch
    # returns the job, with the same addresses and no new one taken
    again = _allocator(etcd)
    again.load_view()
    assert again.allocate_job(7, "alice", 2001, "big", NODES, vni, 0).ips == job.ips
    assert len(etcd.get_prefix("/podnet/u/ips/")[0]) == len(NODES)


def test_other_nodes_wait_with_one_watch_and_send_no_transaction() -> None:
    etcd = WatchingEtcd()
    first, others = _allocator(etcd), [_allocator(etcd) for _ in range(5)]
    vni = first.user_vni("alice", 2001)
    got: dict[int, Any] = {}

    def wait(i: int) -> None:
        got[i] = others[i].allocate_job(9, "alice", 2001, "big", NODES, vni, i + 1)

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    time.sleep(0.05)  # they are all waiting before the first node comes
    reads, txns = etcd.reads, etcd.txns
    job = first.allocate_job(9, "alice", 2001, "big", NODES, vni, 0)
    for t in threads:
        t.join(10)
    assert etcd.txns == txns + 1, "a waiting node sent a transaction"
    assert etcd.reads == reads and etcd.waits == 5
    assert all(g.ips == job.ips for g in got.values()) and len(got) == 5


def test_a_waiting_node_allocates_itself_when_the_first_never_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    etcd = WatchingEtcd()
    a, b = _allocator(etcd), _allocator(etcd)
    vni = a.user_vni("alice", 2001)
    monkeypatch.setattr(alloc, "LEADER_WAIT", 0.05)
    t0 = time.monotonic()
    job = a.allocate_job(11, "alice", 2001, "big", NODES, vni, 3)
    assert time.monotonic() - t0 >= 0.05
    assert len(set(job.ips)) == len(NODES) and etcd.get("/podnet/u/jobs/11") is not None
    # a late first node gets that job back, not a second allocation
    b.load_view()
    assert b.allocate_job(11, "alice", 2001, "big", NODES, vni, 0).ips == job.ips
    assert len(etcd.get_prefix("/podnet/u/ips/")[0]) == len(NODES)


def test_small_jobs_never_wait() -> None:
    etcd = WatchingEtcd()
    a = _allocator(etcd)
    vni = a.user_vni("alice", 2001)
    job = a.allocate_job(12, "alice", 2001, "small", NODES[:4], vni, 2)
    assert etcd.waits == 0 and len(job.ips) == 4


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
