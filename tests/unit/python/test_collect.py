# SPDX-License-Identifier: Apache-2.0
"""The container collector's decision (agent/src/podnet/node/collect.py) with a fake /proc:
which containers are dead, and that /proc is scanned only when a namespace's known process
left. The same on real namespaces and podnetd: tests/agent/test_collect.py."""

from __future__ import annotations

import os

import pytest
from podnet.errors import PodnetError
from podnet.kernel.nsscan import NsId, scan
from podnet.node.collect import Collector
from podnet.node.containers import Containers
from podnet.node.pods import Pod, PodTable
from podnet.state.quota import Limits


class FakeProc:
    """Processes and the namespace each is in; the bind mounts podnetd holds."""

    def __init__(self) -> None:
        self.procs: dict[int, NsId] = {}
        self.mounts: dict[str, NsId] = {}
        self.alive: set[int] = set()

    def collector(self, grace: float = 30.0) -> Collector:
        return Collector(
            grace=grace,
            scan=lambda: {ns: pid for pid, ns in sorted(self.procs.items(), reverse=True)},
            holds=lambda pid, ns: self.procs.get(pid) == ns,
            ns_at=self.mounts.get,
            pid_alive=lambda pid, start: pid in self.alive,
        )


def _ctr(name: str, ino: int, created: float = 0.0, pid: int = 0) -> Pod:
    p = Pod("container", name, f"/run/netns/{name}", "198.18.0.9", 15, "alice", 2001, 4096)
    p.ns_id, p.created, p.pid, p.pid_start = NsId(4, ino), created, pid, 1 if pid else 0
    return p


def test_a_namespace_without_a_process_is_dead_whatever_named_it() -> None:
    fp = FakeProc()
    a, b = _ctr("pn-ca", 100), _ctr("pn-cb", 200)
    fp.mounts = {"/run/netns/pn-ca": NsId(4, 100), "/run/netns/pn-cb": NsId(4, 200)}
    fp.procs = {10: NsId(4, 100), 11: NsId(4, 200), 12: NsId(4, 1)}
    c = fp.collector()
    assert c.dead([a, b], now=1000) == [] and c.scans == 1
    assert c.witness == {"pn-ca": 10, "pn-cb": 11}
    # nothing changed: no scan, a stat per container
    assert c.dead([a, b], now=1001) == [] and c.scans == 1
    del fp.procs[11]
    out = c.dead([a, b], now=1002)
    assert [v.pod.name for v in out] == ["pn-cb"] and "no process" in out[0].why
    assert c.scans == 2
    # another process of the namespace is found when the witness leaves
    fp.procs[13] = NsId(4, 100)
    del fp.procs[10]
    assert c.dead([a], now=1003) == [] and c.witness == {"pn-ca": 13}


def test_grace_for_a_namespace_never_seen_with_a_process() -> None:
    fp = FakeProc()
    a = _ctr("pn-ca", 100, created=1000)
    fp.mounts = {"/run/netns/pn-ca": NsId(4, 100)}
    c = fp.collector(grace=30)
    assert c.dead([a], now=1010) == []  # the runtime starts its process after ADD
    assert [v.pod.name for v in c.dead([a], now=1031)] == ["pn-ca"]
    # seen once: no grace once the last process left
    b = _ctr("pn-cb", 200, created=1000)
    fp.mounts["/run/netns/pn-cb"] = NsId(4, 200)
    fp.procs = {20: NsId(4, 200)}
    assert c.dead([b], now=1001) == [] and b.ns_seen
    fp.procs = {}
    assert [v.pod.name for v in c.dead([b], now=1002)] == ["pn-cb"]


def test_a_namespace_with_a_process_at_add_is_collected_once_it_leaves_without_grace() -> None:
    """ADD of a namespace named by no process (a symlink): podnetd looks for its process at
    once, so one killed before the loop's first cycle is collected then, not after grace
    (the e2e flake of CI stop 26: collected 31 s after the kill)."""
    fp = FakeProc()
    a = _ctr("pn-ca", 100, created=1000)
    fp.mounts = {"/run/netns/pn-ca": NsId(4, 100)}
    fp.procs = {10: NsId(4, 100)}
    c = fp.collector(grace=30)
    assert c.look(a) and a.ns_seen and c.witness == {"pn-ca": 10} and c.scans == 1
    fp.procs = {}  # killed before the first cycle
    assert [v.pod.name for v in c.dead([a], now=1001)] == ["pn-ca"]
    # a runtime that wires first and starts its process after keeps its grace
    b = _ctr("pn-cb", 200, created=1000)
    fp.mounts["/run/netns/pn-cb"] = NsId(4, 200)
    assert not c.look(b) and not b.ns_seen
    assert c.dead([b], now=1010) == []
    fp.procs = {21: NsId(4, 200)}
    assert c.dead([b], now=1011) == [] and c.witness["pn-cb"] == 21


def test_a_namespace_no_longer_held_by_podnetd_is_dead_even_if_its_inode_is_in_use() -> None:
    """The bind mount is what keeps the inode number the namespace's: without it a new
    namespace may get the number, with a process in it."""
    fp = FakeProc()
    a = _ctr("pn-ca", 100)
    fp.procs = {10: NsId(4, 100)}  # a process in "a namespace with inode 100"
    fp.mounts = {}  # but podnetd's bind mount is gone
    out = fp.collector().dead([a], now=1000)
    assert [v.pod.name for v in out] == ["pn-ca"] and "no longer held" in out[0].why


def test_a_recorded_process_that_is_gone_still_releases_at_once() -> None:
    fp = FakeProc()
    a = _ctr("pn-ca", 100, pid=77)
    fp.mounts = {"/run/netns/pn-ca": NsId(4, 100)}
    fp.procs = {10: NsId(4, 100)}
    out = fp.collector().dead([a], now=1000)
    assert [v.pod.name for v in out] == ["pn-ca"] and "process 77" in out[0].why
    fp.alive = {77}
    assert fp.collector().dead([a], now=1000) == []


def test_only_containers_with_a_known_namespace_are_judged() -> None:
    fp = FakeProc()
    job = Pod("job", "pn-j1", "/run/netns/pn-j1", "198.18.0.2", 15, "alice", 2001, 4096)
    wiring = _ctr("pn-cw", 1)
    wiring.ns_id = None
    assert fp.collector().dead([job, wiring], now=1e9) == []


def test_scan_of_this_hosts_proc_finds_its_own_namespace() -> None:
    me = os.stat("/proc/self/ns/net")
    found = scan()
    assert NsId(me.st_dev, me.st_ino) in found


def test_quota_of_containers_spares_root_and_host_users() -> None:
    """Containers._limits: the per-node count refuses a limited user at the limit; root and
    host_users (`unlimited`) take no slot and are never refused."""
    c = Containers.__new__(Containers)
    c.node, c.pods, c.unlimited = "login", PodTable(), frozenset({0, 64030})
    c.limits = lambda: Limits(2, 10, 12, 8)
    for i in range(2):
        c.pods.add(_ctr(f"pn-c{i}", 100 + i))
    with pytest.raises(PodnetError) as e:
        c._limits(2001, "alice")
    assert e.value.code == "EQUOTA" and "on a node on login is 2, and alice holds 2" in str(e.value)
    assert c._limits(64030, "slurm") is None and c._limits(0, "root") is None
    assert c._limits(2002, "bob") == {"containers": 10, "addresses": 12}
