# SPDX-License-Identifier: Apache-2.0
"""podnetd's rooms alone, with fakes for the kernel and etcd (`make unit`, no root): user
networks and their linger, login sessions, the sync queue, the pod table, the failure
policy, the job source parser and the nftables ruleset's security rules. The same rooms
run for real in tests/agent."""

from __future__ import annotations

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
from podnet.names import Keys
from podnet.node.agent import Agent
from podnet.node.etcd_sync import EtcdSync
from podnet.node.pods import Pod, PodTable, job_search
from podnet.node.reconcile import parse_job_ids
from podnet.node.sessions import LoginSessions
from podnet.node.usernets import UserNetworks
from podnet.state.alloc import Allocator, Job
from podnet.state.ipam import Ipam
from podnet.state.store import EtcdUnavailable

CC = ClusterConfig.from_dict(
    {"pod_cidr": "198.18.0.0/20", "block_prefix": 26, "zone": "lab"}, "test"
)


@dataclass
class FakeDataplane:
    """Records what the rooms ask the kernel for."""

    bridges: dict[int, list[str]] = field(default_factory=dict)  # vni -> vteps
    macs: dict[int, dict[str, str]] = field(default_factory=dict)  # vni -> unicast FDB
    removed: list[int] = field(default_factory=list)

    def user_bridge(self, vni: int) -> int | None:
        return 100 + vni if vni in self.bridges else None

    def ensure_user(self, vni: int, vteps: list[str]) -> int:
        self.bridges[vni] = vteps
        return 100 + vni

    def set_vteps(self, vni: int, vteps: list[str], macs: dict[str, str] | None = None) -> None:
        self.bridges[vni] = vteps
        if macs is not None:
            self.macs[vni] = macs

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
    nets = UserNetworks(etcd, keys, alloc, dp, pods, "n1", "203.0.113.11", linger)  # type: ignore[arg-type]
    return nets, etcd, dp, pods


# -- user networks -------------------------------------------------------------------------


def test_first_pod_builds_the_users_network_once_and_registers_the_vtep() -> None:
    nets, etcd, dp, _ = _nets(linger=0)
    vni, bridge = nets.ensure("alice", 2001)
    assert nets.ensure("alice", 2001) == (vni, bridge)
    assert dp.bridges == {vni: ["203.0.113.11"]}
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


def test_events_update_the_ipam_view_and_queue_only_what_is_needed() -> None:
    nets, etcd, dp, pods = _nets(linger=0)
    alloc = nets.alloc
    sync = EtcdSync(etcd, Keys("u"), "n1", alloc, dp, None, pods, nets)  # type: ignore[arg-type]

    class KV:
        def __init__(self, d: dict[str, Any]) -> None:
            self.d = d

        def json(self) -> dict[str, Any]:
            return self.d

    sync.on_event("put", "/podnet/u/ips/198.18.0.5", None)
    assert sync.take() == set()
    assert alloc.ipam.candidate("n1") is None  # no block of n1 yet
    sync.on_event("put", "/podnet/u/blocks/198.18.0.0-26", KV({"node": "n1"}))
    assert sync.take() == {"routes"}
    assert alloc.ipam.candidate("n1") not in (None, "198.18.0.5")
    sync.on_event("put", "/podnet/u/vteps/5000/n2", KV({"ip": "203.0.113.12"}))
    sync.on_event("put", "/podnet/u/vteps/5001/n1", KV({"ip": "203.0.113.11"}))  # itself
    sync.on_event("delete", "/podnet/u/nodes/n3", None)
    assert sync.take() == {5000, "nodes"}
    dp.bridges = {5000: []}
    etcd.data.clear()
    nets.register_vteps([5000])
    sync.apply({5000})
    assert dp.bridges[5000] == ["203.0.113.11"]


def test_remote_pods_get_unicast_fdb_entries_own_and_unknown_ones_not() -> None:
    nets, etcd, dp, pods = _nets(linger=0)
    sync = EtcdSync(etcd, Keys("u"), "n1", nets.alloc, dp, None, pods, nets)  # type: ignore[arg-type]
    sync.node_ips = {"n1": "203.0.113.11", "n2": "203.0.113.12"}

    class KV:
        def __init__(self, v: str) -> None:
            self.value = v

        def json(self) -> Any:
            return json.loads(self.value)

    def put(ip: str, value: str) -> None:
        sync.on_event("put", f"/podnet/u/ips/{ip}", KV(value))

    put("198.18.0.2", '{"job_id":1,"node":"n1","vni":5000}')  # this node's own pod
    assert sync.take() == set()
    put("198.18.0.66", '{"job_id":1,"node":"n2","vni":5000}')
    put("198.18.0.67", '{"kind":"login","node":"n2","user":"alice","vni":5000}')
    put("198.18.0.68", '{"job_id":2,"node":"n3","vni":5000}')  # n3: no node record
    put("198.18.0.69", '{"job_id":3,"node":"n2","vni":5001}')  # another user
    put("198.18.0.70", '{"job_id":4,"node":"n2"}')  # an older podnetd's record: floods
    put("198.18.0.71", "not json")
    assert sync.take() == {5000, 5001}
    assert sync.remote_macs(5000) == {
        "0a:58:c6:12:00:42": "203.0.113.12",
        "0a:58:c6:12:00:43": "203.0.113.12",
    }
    dp.bridges = {5000: []}
    sync.apply({5000})
    assert dp.macs[5000] == sync.remote_macs(5000)
    sync.on_event("delete", "/podnet/u/ips/198.18.0.66", None)
    assert sync.take() == {5000}
    assert list(sync.remote_macs(5000)) == ["0a:58:c6:12:00:43"]
    # a resync rebuilds the same view from the records
    etcd.data.clear()
    etcd.put("/podnet/u/ips/198.18.0.67", {"node": "n2", "vni": 5000})
    sync.resync()
    assert list(sync.remote_macs(5000)) == ["0a:58:c6:12:00:43"]
    assert sync.remote_macs(5001) == {}


# -- pods ----------------------------------------------------------------------------------


def test_pod_names_and_search_list() -> None:
    job = Job(
        7, "alice", 2001, "My Sim", "my-sim", ["c1", "c2"], ["198.18.0.2", "198.18.0.66"], 5000
    )
    pod = Pod.of_job(job, 1, "pn-j7", "/run/netns/pn-j7", CC)
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


class _Rooms:
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
    a._rooms = _Rooms(policy, seconds)  # type: ignore[assignment]
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
