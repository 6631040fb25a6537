# SPDX-License-Identifier: Apache-2.0
"""podnetd's rooms alone, with fakes for the kernel and etcd (`make unit`, no root): user
networks and their linger, login sessions, the sync queue, the pod table, the failure
policy, the job source parser and the nftables ruleset's security rules. The same rooms
run for real in tests/agent."""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fake_etcd import FakeEtcd
from podnet.config import ClusterConfig, ConfigError, NodeConfig
from podnet.kernel import firewall
from podnet.kernel.vxmiss import Miss
from podnet.names import Keys
from podnet.node import overlay as overlay_module
from podnet.node.agent import Agent
from podnet.node.etcd_sync import EtcdSync
from podnet.node.overlay import BURST, Overlay
from podnet.node.pods import Pod, PodTable, job_search
from podnet.node.reconcile import parse_job_ids
from podnet.node.repair import RecordGuard, RecordRepair
from podnet.node.sessions import LoginSessions
from podnet.node.usernets import UserNetworks
from podnet.node.workqueue import SyncQueue
from podnet.state.alloc import Allocator, Job, JobPod
from podnet.state.clusterview import ClusterView
from podnet.state.ipam import Ipam
from podnet.state.store import EtcdUnavailable
from podnet.state.watchrecords import BlockRecord

CC = ClusterConfig.from_dict(
    {"pod_cidr": "198.18.0.0/20", "block_prefix": 26, "zone": "lab"}, "test"
)


@dataclass
class FakeDataplane:
    """Records what the rooms ask the kernel for."""

    bridges: dict[int, int] = field(default_factory=dict)  # vni -> bridge index
    #: vni -> remote pod address -> the node address its entries send to
    remote: dict[int, dict[str, str]] = field(default_factory=dict)
    resolves: int = 0  # calls of `resolve` (one netlink batch each)
    announced: dict[int, list[str]] = field(default_factory=dict)  # vni -> ARP replies
    routes: tuple[dict[str, str], set[str]] = field(default_factory=lambda: ({}, set()))
    removed: list[int] = field(default_factory=list)

    @property
    def vxlans(self) -> dict[int, int]:
        return {200 + v: v for v in self.bridges}

    def user_bridge(self, vni: int) -> int | None:
        return self.bridges.get(vni)

    def ensure_user(self, vni: int) -> int:
        self.bridges[vni] = 100 + vni
        return 100 + vni

    def vni_of_vxlan(self, index: int) -> int | None:
        return self.vxlans.get(index)

    def announce(self, vni: int, ips: list[str]) -> None:
        self.announced.setdefault(vni, []).extend(ips)

    def set_block_routes(self, routes: dict[str, str], local: set[str]) -> None:
        self.routes = (routes, local)

    def resolve(self, vni: int, remote: list[tuple[str, str | None]]) -> None:
        self.resolves += 1
        mine = self.remote.setdefault(vni, {})
        for ip, vtep in remote:
            if vtep is None:
                mine.pop(ip, None)
            else:
                mine[ip] = vtep

    def user_ports(self) -> dict[int, int]:
        return {v: 100 + v for v in self.bridges}

    def remove_user(self, vni: int) -> None:
        self.bridges.pop(vni, None)
        self.removed.append(vni)


def _pod(vni: int, name: str = "pn-j1", uid: int = 2001) -> Pod:
    return Pod("job", name, f"/run/netns/{name}", "198.18.0.2", 20, "alice", uid, vni, 1, 0)


def _nets(linger: float) -> tuple[UserNetworks, FakeEtcd, FakeDataplane, PodTable]:
    etcd, dp, pods = FakeEtcd(), FakeDataplane(), PodTable()
    keys = Keys("u")
    alloc = Allocator(etcd, keys, Ipam(CC.pod_cidr, 26), "lab", 4096, 8191)  # type: ignore[arg-type]
    view = ClusterView("n1")
    view.node_ips = {"n1": "203.0.113.11"}
    nets = UserNetworks(etcd, keys, alloc, dp, pods, "n1", "203.0.113.11", linger, view)  # type: ignore[arg-type]
    return nets, etcd, dp, pods


# -- user networks -------------------------------------------------------------------------


def test_first_pod_builds_the_users_network_once_and_registers_the_vtep() -> None:
    nets, etcd, dp, _ = _nets(linger=0)
    vni, bridge = nets.ensure("alice", 2001)
    assert nets.ensure("alice", 2001) == (vni, bridge)
    assert dp.bridges == {vni: bridge}
    nets._bg.submit(lambda: None).result()  # the legacy VTEP key is written in the background
    assert etcd.get(f"/podnet/u/vteps/{vni}/n1") is not None
    assert nets.vni("alice", 2001) == vni
    assert nets.ensure("bob", 2002)[0] != vni


def test_last_pod_gone_removes_the_network_at_once_without_linger() -> None:
    nets, etcd, dp, pods = _nets(linger=0)
    vni, _ = nets.ensure("alice", 2001)
    pods.add(_pod(vni))
    nets.release(vni, 2001)  # a pod of the VNI is still there
    assert vni in dp.bridges
    pods.pop("pn-j1")
    nets.release(vni, 2001)
    assert dp.removed == [vni]
    assert etcd.get(f"/podnet/u/vteps/{vni}/n1") is None


def test_network_lingers_and_a_new_pod_keeps_it() -> None:
    nets, etcd, dp, pods = _nets(linger=60)
    vni, _ = nets.ensure("alice", 2001)
    nets.release(vni, 2001)
    t = time.monotonic()
    assert nets.remove_idle(t + 30) == []  # not yet
    nets.ensure("alice", 2001)  # the user's next job: the idle mark goes
    pods.add(_pod(vni))
    assert nets.remove_idle(t + 120) == []
    pods.pop("pn-j1")
    nets.release(vni, 2001)
    assert nets.remove_idle(time.monotonic() + 61) == [vni]
    assert vni not in dp.bridges
    assert etcd.get(f"/podnet/u/vteps/{vni}/n1") is None
    assert nets.remove_idle(time.monotonic() + 200) == []  # once


def test_unused_bridges_are_removed_at_start() -> None:
    nets, _, dp, _ = _nets(linger=0)
    dp.bridges = {5000: [], 5001: []}
    nets.remove_unused({5001})
    assert list(dp.bridges) == [5001]


# -- login sessions ------------------------------------------------------------------------


def test_login_sessions_expire_after_grace_and_survive_a_restart(tmp_path: Path) -> None:
    alive = {100: 7, 200: 9}
    s = LoginSessions(tmp_path, starttime=lambda pid: alive.get(pid, 0))
    s.add(2001, 100)
    s.add(2001, 200)
    assert s.due(0.0, [2001], grace=5) == []
    del alive[100]
    alive[200] = 10  # pid 200 now belongs to another process: not the session
    assert s.due(1.0, [2001], grace=5) == []  # idle from now on
    assert s.due(5.9, [2001], grace=5) == []
    assert s.due(6.0, [2001], grace=5) == [2001]
    assert json.loads((tmp_path / "sessions.json").read_text()) == {"2001": {}}
    s.add(2002, 300)
    again = LoginSessions(tmp_path, starttime=lambda pid: 0)
    again.load()
    assert again.pids(2002) == {300: 0}
    s.drop(2002)
    assert s.pids(2002) == {}


def test_sessions_file_that_is_garbage_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "sessions.json").write_text('{"x": ')
    s = LoginSessions(tmp_path)
    s.load()
    assert s.pids(1) == {}


# -- the sync queue ------------------------------------------------------------------------


class _KV:
    def __init__(self, d: Any, key: str = "", rev: int = 1) -> None:
        self.value = d if isinstance(d, str) else json.dumps(d)
        self.key = key
        self.mod_revision = rev

    def json(self) -> Any:
        return json.loads(self.value)


def _job(job_id: int, nodes: list[str], vni: int) -> _KV:
    rec = {"job_id": job_id, "user": "alice", "uid": 2001, "name": "j", "label": "j"}
    key = f"/podnet/u/jobs/{job_id}"
    return _KV({**rec, "size": len(nodes), "vni": vni, "created": 0.0}, key)


def _sync(nets: UserNetworks, etcd: FakeEtcd, dp: FakeDataplane, pods: PodTable) -> EtcdSync:
    work = SyncQueue()
    repair = RecordRepair(etcd, work, node="n1")  # type: ignore[arg-type]
    overlay = Overlay(dp, nets.view)  # type: ignore[arg-type]
    return EtcdSync(
        etcd, Keys("u"), "n1", nets.alloc, dp, None, pods, nets.view, work, repair, overlay
    )  # type: ignore[arg-type]


def test_events_update_the_ipam_view_and_queue_only_what_is_needed() -> None:
    nets, etcd, dp, pods = _nets(linger=0)
    alloc = nets.alloc
    sync = _sync(nets, etcd, dp, pods)
    sync.on_event("put", "/podnet/u/ips/198.18.0.5", None)  # not followed any more
    assert sync.take() == set()
    assert alloc.ipam.candidate("n1") is None  # no block of n1 yet
    sync.on_event("put", "/podnet/u/blocks/198.18.0.0-26", _KV({"node": "n1"}))
    assert sync.take() == {"routes", "overlay"}
    # a job of n1 and n2: no node follows the jobs' records (a job start would reach every
    # node of the cluster); each node marks its own pod's address; no kernel work: the
    # overlay asks when it needs
    alloc.ipam.mark(["198.18.0.1"])
    sync.on_event("put", "/podnet/u/jobs/3", _job(3, ["n1", "n2"], 5000))
    assert sync.take() == set()
    assert alloc.ipam.candidate("n1") not in (None, "198.18.0.1")
    sync.on_event("put", "/podnet/u/vteps/5001/n2", _KV({"ip": "192.0.2.66"}))  # ignored
    sync.on_event("delete", "/podnet/u/nodes/n3", None)
    assert sync.take() == {"nodes"}
    sync.on_event("delete", "/podnet/u/jobs/3", None)
    assert sync.take() == set()


def _miss(index: int, ip: str | None = None, mac: str | None = None) -> Miss:
    return Miss(index, ip, mac)


def test_the_overlay_resolves_a_miss_from_the_block_map_alone() -> None:
    """A pod's ARP request (an L3 miss: the address) or frame (an L2 miss: the MAC) for a
    pod of another node: its block's owner, at its registered address, whatever the pod
    records say; own blocks, unknown blocks and devices that are not a user's VXLAN get
    nothing."""
    nets, etcd, dp, pods = _nets(linger=0)
    sync = _sync(nets, etcd, dp, pods)
    overlay = sync.overlay
    nets.view.node_ips = {"n1": "203.0.113.11", "n2": "203.0.113.12", "n3": "203.0.113.13"}
    for blk, node in (("198.18.0.0-26", "n1"), ("198.18.0.64-26", "n2"), ("198.18.0.128-26", "n3")):
        sync.on_event("put", f"/podnet/u/blocks/{blk}", _KV({"node": node}))
    # a record naming another node for n2's address changes nothing
    sync.on_event("put", "/podnet/u/logins/n3/alice", _KV({"ip": "198.18.0.66", "uid": 2001}))
    a, _ = nets.ensure("alice", 2001)
    b, _ = nets.ensure("bob", 2002)
    got = overlay.handle(
        [
            _miss(200 + a, ip="198.18.0.66"),  # n2's
            _miss(200 + a, mac="0a:58:c6:12:00:82"),  # n3's 198.18.0.130, by its MAC
            _miss(200 + a, ip="198.18.0.5"),  # this node's own block
            _miss(200 + a, ip="198.18.1.5"),  # no block
            _miss(200 + a, mac="02:00:00:00:00:01"),  # not a pod's MAC
            _miss(999, ip="198.18.0.67"),  # not a user's VXLAN
            _miss(200 + b, ip="198.18.0.67"),
        ]
    )
    assert got == 3
    assert dp.remote == {
        a: {"198.18.0.66": "203.0.113.12", "198.18.0.130": "203.0.113.13"},
        b: {"198.18.0.67": "203.0.113.12"},
    }
    assert dp.resolves == 2  # one batch per user
    # the pods that asked (L3 misses) are answered at once; an L2 miss asked no ARP
    assert dp.announced == {a: ["198.18.0.66"], b: ["198.18.0.67"]}
    # n2's block moves to n3, n3's is freed: the entries follow, after the sync loop's pass
    sync.on_event("put", "/podnet/u/blocks/198.18.0.64-26", _KV({"node": "n3"}))
    sync.on_event("delete", "/podnet/u/blocks/198.18.0.128-26", None)
    sync.apply(sync.take())
    assert dp.remote == {a: {"198.18.0.66": "203.0.113.13"}, b: {"198.18.0.67": "203.0.113.13"}}
    # a node's address changes
    nets.view.node_ips["n3"] = "203.0.113.23"
    assert overlay.repoint() == 2
    assert dp.remote[a] == {"198.18.0.66": "203.0.113.23"}
    # bob's network goes: what it resolved is forgotten
    dp.bridges.pop(b)
    overlay.repoint()
    assert b not in overlay.resolved


def test_one_users_misses_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """At most `per_user` remote pods per user (the oldest go first), and at most RATE a
    second (BURST at once): another user's misses are still resolved."""
    nets, _etcd, dp, _pods = _nets(linger=0)
    nets.view.node_ips = {"n1": "203.0.113.11", "n2": "203.0.113.12"}
    nets.view.apply(BlockRecord(ipaddress.IPv4Network("198.18.0.0/16"), "n2"))
    overlay = Overlay(dp, nets.view, per_user=3)  # type: ignore[arg-type]
    monkeypatch.setattr(overlay_module, "RATE", 0.0)  # no refill while the test runs
    a, _ = nets.ensure("alice", 2001)
    b, _ = nets.ensure("bob", 2002)
    overlay.handle([_miss(200 + a, ip=f"198.18.0.{i}") for i in range(1, 6)])
    assert list(overlay.resolved[a]) == ["198.18.0.3", "198.18.0.4", "198.18.0.5"]
    assert dp.remote[a] == dict.fromkeys(["198.18.0.3", "198.18.0.4", "198.18.0.5"], "203.0.113.12")
    # a flood of misses: the burst is resolved, the rest dropped
    flood = [
        _miss(200 + a, ip=f"198.18.{1 + i // 250}.{1 + i % 250}") for i in range(int(BURST) + 500)
    ]
    overlay.handle(flood)
    assert overlay.dropped == 505  # the first 5 misses took 5 of the burst
    assert len(overlay.resolved[a]) == 3
    assert overlay.handle([_miss(200 + b, ip="198.18.0.9")]) == 1  # bob is not held up


# -- records another writer changed --------------------------------------------------------


def _etcd_kv(etcd: FakeEtcd, key: str) -> Any:
    return etcd.data.get(key)


def test_a_users_vni_changed_or_deleted_by_another_writer_is_written_back() -> None:
    nets, etcd, dp, pods = _nets(linger=0)
    sync = _sync(nets, etcd, dp, pods)
    key = "/podnet/u/users/bob"
    etcd.put(key, {"vni": 5002, "uid": 2002})
    sync.on_event("put", key, _etcd_kv(etcd, key))  # first seen: bob's
    assert sync.take() == set() and nets.view.user_vnis == {"bob": 5002}
    etcd.put(key, {"vni": 5000, "uid": 2002})  # alice's VNI
    sync.on_event("put", key, _etcd_kv(etcd, key))
    assert sync.take() == {"restore"} and nets.view.user_vnis == {"bob": 5002}
    assert sync.restore() == 1
    assert etcd.data[key].json() == {"vni": 5002, "uid": 2002}
    sync.on_event("put", key, _etcd_kv(etcd, key))  # the write back's own event: no loop
    assert sync.take() == set()
    etcd.delete(key)
    sync.on_event("delete", key, None)
    assert sync.take() == {"restore"} and sync.restore() == 1
    assert etcd.data[key].json()["vni"] == 5002
    # a VNI's reverse record too
    vkey = "/podnet/u/vnis/5002"
    etcd.put(vkey, {"user": "bob"})
    sync.on_event("put", vkey, _etcd_kv(etcd, vkey))
    etcd.delete(vkey)
    sync.on_event("delete", vkey, None)
    assert sync.take() == {"restore"} and sync.restore() == 1
    assert etcd.data[vkey].json() == {"user": "bob"}


def test_a_record_of_a_job_with_a_pod_here_is_written_back() -> None:
    """The record guard checks the records of the jobs with a pod here: one changed by
    another writer is written back as this node keeps it; one deleted goes to the
    reconciler (which asks Slurm whether the job runs); an older podnetd's record of the
    same job (its pods in it) is left alone."""
    nets, etcd, _dp, pods = _nets(linger=0)
    mine = nets.alloc.allocate_job(7, "alice", 2001, "j", ["n1", "n2"], 5000, 0)
    job = mine.job
    pods.add(Pod("job", "pn-j7", "/run/netns/pn-j7", mine.ip, 20, "alice", 2001, 5000, 7, 0))
    lost: list[list[int]] = []
    guard = RecordGuard(
        etcd, Keys("u"), "n1", nets.alloc, pods, lambda j, n: mine, lambda: 0, lost.append
    )  # type: ignore[arg-type]
    key = "/podnet/u/jobs/7"
    assert guard.check_once() == 0
    forged = {**job.to_json(), "user": "mallory", "uid": 6666}
    etcd.put(key, forged)
    assert guard.check_once() == 1
    assert etcd.data[key].json() == job.to_json() and lost == []
    older = {**job.to_json(), "created": job.created - 5, "nodes": ["n1", "n2"]}
    etcd.put(key, older)
    assert guard.check_once() == 0 and etcd.data[key].json() == older
    etcd.delete(key)
    assert guard.check_once() == 0 and lost == [[7]]
    assert key not in etcd.data  # the reconciler's to write back, not the guard's


def test_the_owner_writes_back_its_pods_changed_dns_and_address_records() -> None:
    nets, etcd, _dp, pods = _nets(linger=0)
    alloc = nets.alloc
    mine = alloc.allocate_job(9, "alice", 2001, "sim", ["n1", "n2"], 5000, 0)
    pods.add(Pod("job", "pn-j9", "/run/netns/pn-j9", mine.ip, 20, "alice", 2001, 5000, 9, 0))
    guard = RecordGuard(etcd, Keys("u"), "n1", alloc, pods, lambda j, n: mine, lambda: 0)
    assert guard.check_once() == 0
    txns = etcd.txns
    assert guard.check_once() == 0 and etcd.txns == txns + 1  # one read-only transaction
    by_id, named = "/skydns/lab/alice/9/pod0", "/skydns/lab/alice/sim/pod0"
    etcd.delete(by_id)
    etcd.put(named, {"host": "198.18.99.99", "ttl": 30})  # a wrong address
    etcd.put(f"/podnet/u/ips/{mine.ip}", {"job_id": 9, "node": "n2", "vni": 5000})
    etcd.delete("/podnet/u/jobnodes/9/n1")  # its marker
    assert guard.check_once() == 4
    assert etcd.data[by_id].json()["host"] == mine.ip
    assert etcd.data[named].json()["host"] == mine.ip
    assert etcd.data[f"/podnet/u/ips/{mine.ip}"].json()["node"] == "n1"
    assert etcd.data["/podnet/u/jobnodes/9/n1"].json() == {"index": 0, "ip": mine.ip}
    # the other node's pod is its own to check; a newer job took the name: its record
    # under the name is that job's, not put back
    etcd.put("/podnet/u/names/alice/sim", {"job_id": 10})
    etcd.put(named, {"host": "198.18.0.200", "ttl": 30})
    assert guard.check_once() == 0
    assert etcd.data[named].json()["host"] == "198.18.0.200"


def test_the_guard_checks_many_pods_in_transactions_etcd_accepts() -> None:
    """A node of many pods: each read-only check stays within etcd's --max-txn-ops (here
    8), and a record changed in the last chunk is still found and written back."""
    nets, etcd, _dp, pods = _nets(linger=0)
    alloc = nets.alloc
    jobs = {}
    for j in range(20, 30):
        jobs[j] = alloc.allocate_job(j, "alice", 2001, f"s{j}", ["n1"], 5000, 0)
        ip = jobs[j].ip
        pods.add(Pod("job", f"pn-j{j}", f"/run/netns/pn-j{j}", ip, 20, "alice", 2001, 5000, j, 0))
    guard = RecordGuard(etcd, Keys("u"), "n1", alloc, pods, lambda j, n: jobs[j], lambda: 0)
    etcd.max_txn_ops = 8
    sizes: list[int] = []
    txn = etcd.txn

    def limited(compare: list[Any], success: list[Any], failure: list[Any] | None = None) -> Any:
        sizes.append(max(len(compare), len(success), len(failure or [])))
        assert sizes[-1] <= etcd.max_txn_ops, "etcd refuses: too many operations"
        return txn(compare, success, failure)

    etcd.txn = limited  # type: ignore[method-assign]
    assert guard.check_once() == 0 and len(sizes) > 1
    etcd.delete("/skydns/lab/alice/29/pod0")
    assert guard.check_once() == 1
    assert etcd.data["/skydns/lab/alice/29/pod0"].json()["host"] == jobs[29].ip


# -- pods ----------------------------------------------------------------------------------


def test_pod_names_and_search_list() -> None:
    job = Job(7, "alice", 2001, "My Sim", "my-sim", 5000, 2)
    pod = Pod.of_job(JobPod(job, 1, "c2", "198.18.0.66"), "pn-j7", "/run/netns/pn-j7", CC)
    assert pod.ip == "198.18.0.66" and pod.prefix == 20 and pod.index == 1
    assert pod.names == ["pod1.my-sim.alice.lab", "pod1.7.alice.lab"]
    assert job_search(job, "lab") == ["my-sim.alice.lab", "7.alice.lab", "alice.lab"]
    login = Pod.of_login("login1", "alice", 2001, "198.18.0.9", 5000, "pn-l2001", "/x", CC)
    assert login.names == ["login1.login.alice.lab"]
    assert "vni" not in login.public() and "veth" not in login.public()
    table = PodTable()
    table.add(pod)
    table.add(login)
    assert table.uses_vni(5000) and not table.uses_vni(5001)
    assert table.fw_ports() == []  # not wired: no veth
    assert {p.name for p in table.all(2001)} == {"pn-j7", "pn-l2001"}
    assert table.all(2002) == []


# -- the failure policy --------------------------------------------------------------------


class _Plane:
    def __init__(self, policy: str, seconds: float) -> None:
        self.cc = ClusterConfig.from_dict(
            {
                "pod_cidr": "198.18.0.0/20",
                "block_prefix": 26,
                "zone": "lab",
                "failure_policy": policy,
                "failure_retry_seconds": seconds,
            }
        )


def _agent(tmp_path: Path, policy: str, seconds: float) -> Agent:
    cfg = NodeConfig.from_dict(
        {
            "node": "n1",
            "underlay_interface": "ul0",
            "underlay_ip": "203.0.113.11",
            "cluster": "u",
            "etcd_endpoints": ["http://127.0.0.1:1"],
            "state_dir": str(tmp_path),
        },
        "test",
    )
    a = Agent(cfg)
    a._plane = _Plane(policy, seconds)  # type: ignore[assignment]
    return a


def _flaky(failures: int) -> tuple[list[int], Any]:
    calls: list[int] = []

    def attempt() -> str:
        calls.append(1)
        if len(calls) <= failures:
            raise EtcdUnavailable("etcd unreachable (test)")
        return "pod"

    return calls, attempt


def test_fail_policy_fails_at_once(tmp_path: Path) -> None:
    calls, attempt = _flaky(1)
    with pytest.raises(EtcdUnavailable):
        _agent(tmp_path, "fail", 30).per_policy("job 1", attempt)
    assert len(calls) == 1


def test_retry_policy_retries_until_etcd_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("podnet.node.agent.RETRY_FIRST", 0.01)
    calls, attempt = _flaky(3)
    assert _agent(tmp_path, "retry", 30).per_policy("job 1", attempt) == "pod"
    assert len(calls) == 4


def test_retry_policy_gives_up_after_its_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("podnet.node.agent.RETRY_FIRST", 0.01)
    monkeypatch.setattr("podnet.node.agent.RETRY_MAX", 0.02)
    calls, attempt = _flaky(10**6)
    t0 = time.monotonic()
    with pytest.raises(EtcdUnavailable):
        _agent(tmp_path, "retry", 0.2).per_policy("job 1", attempt)
    assert 0.2 <= time.monotonic() - t0 < 2
    assert len(calls) > 2


# -- the job source ------------------------------------------------------------------------


def test_job_ids_from_squeue_output() -> None:
    out = "12\n13_4\n13_[5-9]\n14+0\n14+1\nJOBID\n\n  15 \n"
    assert parse_job_ids(out) == {12, 13, 14, 15}


# -- the ruleset -----------------------------------------------------------------------------


def _rules() -> str:
    return firewall.ruleset(
        "198.18.0.0/15",
        4789,
        ["203.0.113.0/26"],
        ["203.0.113.11"],
        [("pnv0abc", "02:00:c6:12:00:02", "198.18.0.2")],
        [0, 64030],
    )


def test_ruleset_keeps_the_isolation_rules() -> None:
    text = _rules()
    out = text[text.index("chain output {", text.index("table inet podnet")) :]
    out = out[: out.index("}")]
    # user sockets never send VXLAN; hosts reach pods only as replies or as system uids
    assert "udp dport @vxlan_ports meta mark & 0x504e0000 != 0x504e0000 meta skuid" in out
    assert 'udp dport @vxlan_ports meta oifkind "vxlan" meta skuid' in out
    assert "ip daddr 198.18.0.0/15 ct state established,related accept" in out
    assert "meta skuid @host_uids accept" in out
    assert out.rstrip().splitlines()[-1].strip().endswith("drop")
    assert "elements = { 0, 64030 }" in text
    assert '"pnv0abc" . 02:00:c6:12:00:02 . 198.18.0.2' in text
    # the pod network is never forwarded to anything but the allowed host networks
    fwd = text[text.index("chain forward {") :]
    assert fwd.index("ip saddr 198.18.0.0/15 ip daddr @hosts accept") < fwd.index(
        "ip saddr 198.18.0.0/15 drop"
    )


@pytest.mark.skipif(shutil.which("nft") is None, reason="nft not installed")
def test_ruleset_is_valid_nftables(tmp_path: Path) -> None:
    f = tmp_path / "rules.nft"
    f.write_text(_rules())
    r = subprocess.run(["nft", "-c", "-f", str(f)], capture_output=True, text=True, check=False)
    if r.returncode != 0 and "Operation not permitted" in r.stderr:
        pytest.skip("nft -c needs CAP_NET_ADMIN")
    assert r.returncode == 0, r.stderr


def test_other_vxlan_ports_are_guarded_like_podnets() -> None:
    """Flannel's port (roles/flannel): received from registered VTEPs only, never sent by a
    user socket or a pod; the cluster configuration sets the list, 8472 by default."""
    default = _rules()
    assert "set vxlan_ports { type inet_service; elements = { 4789, 8472 } }" in default
    inp = default[default.index("chain input {", default.index("table inet podnet")) :]
    assert "udp dport @vxlan_ports ip saddr != @vteps drop" in inp[: inp.index("}")]
    assert 'meta iifkind "vxlan" udp dport @vxlan_ports drop' in inp[: inp.index("}")]
    text = firewall.ruleset("198.18.0.0/15", 4789, [], [], [], [0], other_vxlan_ports=[9000])
    assert "elements = { 4789, 9000 }" in text
    assert "elements = { 4789 }" in firewall.ruleset(
        "198.18.0.0/15", 4789, [], [], [], [0], other_vxlan_ports=[]
    )
    base = {"pod_cidr": "198.18.0.0/15", "block_prefix": 26, "zone": "lab"}
    assert ClusterConfig.from_dict(base).other_vxlan_ports == [8472]
    assert ClusterConfig.from_dict(
        {**base, "other_vxlan_ports": [8472, 8473]}
    ).other_vxlan_ports == [
        8472,
        8473,
    ]
    for bad in ("8472", [0], ["x"]):
        with pytest.raises(ConfigError):
            ClusterConfig.from_dict({**base, "other_vxlan_ports": bad})
