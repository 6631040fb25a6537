# SPDX-License-Identifier: Apache-2.0
"""podnetd's logic without a kernel or etcd: names, IPAM, config, request authorization,
socket admission, the CLI's arguments, the metrics histogram (`make unit`, no root)."""

from __future__ import annotations

import ipaddress
import itertools
import json
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from fake_etcd import FakeEtcd
from podnet import names
from podnet.api.handlers import Handler, Peer
from podnet.api.server import Admission, Limits, Waiting
from podnet.cli import podnet as cli
from podnet.config import ClusterConfig, ConfigError, NodeConfig
from podnet.errors import PodnetError
from podnet.names import Keys
from podnet.state.alloc import Allocator, AllocError
from podnet.state.ipam import Ipam, PoolExhausted
from podnet.stats import Histogram

# -- names -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("My_Sim 2", "my-sim-2"),
        ("--x--", "x"),
        ("", "job"),
        ("ÄÖÜ", "job"),
        ("a" * 80, "a" * 63),
        ("a" * 62 + "-b", "a" * 62),
    ],
)
def test_dns_label(text: str, label: str) -> None:
    assert names.dns_label(text) == label
    assert names.is_label(label)


def test_job_label_never_collides_with_login_or_job_ids() -> None:
    assert names.job_label("login") == "job-login"
    assert names.job_label("1234") == "job-1234"
    assert names.job_label("train") == "train"


def test_keys_and_paths() -> None:
    k = names.Keys("lab")
    assert k.block("198.18.0.0/26") == "/podnet/lab/blocks/198.18.0.0-26"
    assert names.block_from_key(k.block("198.18.0.0/26")) == "198.18.0.0/26"
    assert names.zone_path("hpc.example.org") == "/skydns/org/example/hpc"
    assert names.ptr_key("198.18.1.2") == "/skydns/arpa/in-addr/198/18/1/2"
    # the fast path for dotted addresses agrees with ipaddress; other forms are refused
    for ip in ("0.0.0.0", "255.255.255.255", "10.9.99.199", "100.64.0.10"):
        a, b, c, d = ipaddress.IPv4Address(ip).packed
        assert names.ptr_key(ip) == f"/skydns/arpa/in-addr/{a}/{b}/{c}/{d}"
    for bad in ("256.1.1.1", "01.2.3.4", "1.2.3", "1.2.3.4 ", "a.b.c.d", "1.2.3.4/32"):
        with pytest.raises(ValueError):
            names.ptr_key(bad)
    v = names.new_veth_name()
    assert names.is_veth_name(v) and len(v) <= 15
    assert not names.is_veth_name("pnbr4096")


# -- IPAM --------------------------------------------------------------------------------


def test_ipam_hands_out_each_address_of_a_block_once() -> None:
    ipam = Ipam(ipaddress.IPv4Network("203.0.113.0/24"), 28)
    block = ipam.free_blocks("n1", 1)[0]
    ipam.set_block(block, "n1")
    got = []
    while (ip := ipam.candidate("n1")) is not None:
        got.append(ip)
    # the pod network's own network/broadcast addresses are never handed out
    assert len(got) == len(set(got)) == 16 - (block.network_address.packed[-1] == 0)
    assert all(ipaddress.ip_address(ip) in block for ip in got)
    ipam.release_pending(got[:1])
    assert ipam.candidate("n1") == got[0]
    ipam.mark(got)
    ipam.release_pending(got)
    assert ipam.candidate("n1") is None


def test_ipam_blocks_are_per_node_and_run_out_cleanly() -> None:
    ipam = Ipam(ipaddress.IPv4Network("203.0.113.0/26"), 28)
    seen = set()
    for node in ("a", "b", "c", "d"):
        b = ipam.free_blocks(node, 1)[0]
        assert b not in seen
        seen.add(b)
        ipam.set_block(b, node)
    assert ipam.candidate("e") is None
    with pytest.raises(PoolExhausted, match="no free address block"):
        ipam.free_blocks("e", 1)


# -- configuration -----------------------------------------------------------------------

NODE = {
    "node": "c1",
    "underlay_interface": "eth0",
    "underlay_ip": "198.51.100.12",
    "cluster": "lab",
    "etcd_endpoints": ["http://127.0.0.1:2379"],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"nodes": "x"}, "unknown setting"),
        ({"node": "../x"}, "not a valid node name"),
        ({"cluster": "Lab!"}, "DNS label"),
        ({"etcd_endpoints": []}, "is empty"),
        ({"max_connections": 8, "root_connections": 8}, "must be smaller"),
        ({"max_connections_per_user": 0}, "max_connections_per_user"),
        ({"read_timeout": "soon"}, "read_timeout"),
        ({"max_waiting_per_user": -1}, "max_waiting_per_user"),
        ({"max_waiting": "many"}, "max_waiting"),
        ({"wait_timeout": 0}, "wait_timeout"),
    ],
)
def test_node_config_errors_are_one_clear_line(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as e:
        NodeConfig.from_dict({**NODE, **change}, "podnet.yaml")
    assert "\n" not in str(e.value)


def test_cluster_config_from_a_newer_podnet_is_read_without_its_new_settings() -> None:
    """A node not yet upgraded starts with the configuration a newer podnet wrote (rolling
    upgrades); strict reading (the default) still names the unknown keys."""
    newer = {"pod_cidr": "198.18.0.0/15", "block_prefix": 26, "zone": "lab", "warp_drive": 9}
    assert ClusterConfig.unknown_settings(newer) == ["warp_drive"]
    with pytest.raises(ConfigError, match=r"unknown setting.*warp_drive"):
        ClusterConfig.from_dict(newer)
    assert ClusterConfig.from_dict(newer, strict=False).block_prefix == 26
    with pytest.raises(ConfigError, match="block_prefix"):
        ClusterConfig.from_dict({**newer, "block_prefix": 99}, strict=False)


def test_cluster_config_refuses_overlaps_and_bad_ranges() -> None:
    base = {"pod_cidr": "198.18.0.0/15", "block_prefix": 26, "zone": "lab"}
    assert ClusterConfig.from_dict(base).pod_mtu == 1450
    with pytest.raises(ConfigError, match="overlaps pod_cidr"):
        ClusterConfig.from_dict({**base, "host_cidrs": ["198.19.0.0/24"]})
    with pytest.raises(ConfigError, match="vni_min > vni_max"):
        ClusterConfig.from_dict({**base, "vni_min": 10, "vni_max": 5})
    with pytest.raises(ConfigError, match="larger than pod_cidr"):
        ClusterConfig.from_dict({**base, "block_prefix": 14})


# -- requests and authorization ----------------------------------------------------------


@dataclass
class FakePod:
    uid: int
    kind: str = "job"

    def public(self) -> dict[str, Any]:
        return {"uid": self.uid, "kind": self.kind}


@dataclass
class FakeAgent:
    """Records what the handler asked; the real Agent is tested in tests/agent."""

    roles: list[str] = field(default_factory=lambda: ["compute"])
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    @property
    def cfg(self) -> NodeConfig:
        return NodeConfig.from_dict({**NODE, "roles": self.roles}, "test")

    def job_up(self, *a: Any) -> FakePod:
        self.calls.append(("job_up", *a))
        return FakePod(a[2])

    def job_pidns(self, job_id: int, pid: int) -> bool:
        self.calls.append(("job_pidns", job_id, pid))
        return True

    def job_get(self, job_id: int) -> FakePod:
        if job_id == 404:
            raise PodnetError("ENOENT", "no such job")
        return FakePod(2001)

    def login_acquire(self, uid: int, pid: int) -> FakePod:
        self.calls.append(("login_acquire", uid, pid))
        return FakePod(uid, "login")

    def join(self, uid: int, target: str, job_id: int | None) -> FakePod:
        self.calls.append(("join", uid, target, job_id))
        return FakePod(uid)


ROOT, ALICE, BOB = Peer(10, 0, 0), Peer(11, 2001, 2001), Peer(12, 2002, 2002)


def ask(agent: FakeAgent, peer: Peer, **req: Any) -> dict[str, Any]:
    h = Handler(agent)  # type: ignore[arg-type]
    return h.handle_line(peer, json.dumps({"v": 1, **req}).encode())


def code(reply: dict[str, Any]) -> str:
    return str(reply["error"]["code"]) if not reply["ok"] else "OK"


def test_only_root_creates_job_pods() -> None:
    a = FakeAgent()
    up = {"op": "job_up", "job_id": 5, "user": "alice", "uid": 2001, "nodes": ["c1"]}
    assert code(ask(a, ALICE, **up, node_index=0)) == "EPERM"
    assert code(ask(a, ROOT, **up, node_index=0)) == "OK"
    assert code(ask(a, ROOT, **up, node_index=1)) == "EINVAL"
    assert code(ask(a, ROOT, **{**up, "user": "../x"}, node_index=0)) == "EINVAL"
    assert code(ask(a, ROOT, **{**up, "uid": True}, node_index=0)) == "EINVAL"
    assert [c[0] for c in a.calls] == ["job_up"]


def test_only_root_hands_over_slurms_pid_namespace() -> None:
    """job_pidns (Slurm's namespace/linux): root only, a job id and a PID."""
    a = FakeAgent()
    assert code(ask(a, ALICE, op="job_pidns", job_id=5, pid=4242)) == "EPERM"
    assert code(ask(a, ROOT, op="job_pidns", job_id=5, pid=1)) == "EINVAL"
    assert code(ask(a, ROOT, op="job_pidns", job_id=5)) == "EINVAL"
    assert ask(a, ROOT, op="job_pidns", job_id=5, pid=4242)["adopted"] is True
    assert a.calls == [("job_pidns", 5, 4242)]


def test_users_see_and_join_only_their_own() -> None:
    a = FakeAgent(roles=["compute", "login"])
    assert code(ask(a, BOB, op="job_get", job_id=7)) == "EPERM"
    assert code(ask(a, ALICE, op="job_get", job_id=7)) == "OK"
    assert code(ask(a, ALICE, op="job_get", job_id=404)) == "ENOENT"
    # a user cannot act for another uid; root may (the SSH hooks)
    assert ask(a, ALICE, op="join", target="job", uid=2002)["pod"]["uid"] == 2001
    assert ask(a, ROOT, op="join", target="job", uid=2002)["pod"]["uid"] == 2002
    assert ask(a, ALICE, op="login_acquire", uid=2002)["pod"]["uid"] == 2001
    assert code(ask(a, ROOT, op="login_acquire")) == "EINVAL"
    assert ("login_acquire", 2001, ALICE.pid) in a.calls


def test_login_pods_only_on_login_nodes_and_bad_requests() -> None:
    a = FakeAgent(roles=["compute"])
    assert code(ask(a, ALICE, op="login_acquire")) == "EPERM"
    assert code(ask(a, ROOT, op="login_acquire", uid=2001, pid=1)) == "EPERM"
    h = Handler(a)  # type: ignore[arg-type]
    for line in (b"not json", b"[]", b'{"v":2,"op":"status"}', b'{"v":1,"op":"nope"}', b"\xff"):
        r = h.handle_line(ALICE, line)
        assert r["ok"] is False and code(r) in ("EINVAL", "EVERSION"), line
    assert code(ask(a, ALICE, op="join", target="other")) == "EINVAL"


def test_admission_keeps_root_slots_and_bounds_each_user() -> None:
    adm = Admission(Limits(max_connections=6, root_connections=2, max_connections_per_user=3))
    assert all(adm.enter(2001).admit for _ in range(3))
    refused = adm.enter(2001)  # nothing to queue: refused
    assert not refused.admit and not refused.wait and "uid 2001" in refused.reason
    assert adm.enter(2002).admit
    assert "too many user connections" in adm.enter(2003).reason  # 4 = 6 - 2 kept for root
    assert adm.enter(0).admit and adm.enter(0).admit
    assert not adm.enter(0).admit  # the total is a hard bound, root included
    adm.leave(0)
    assert not adm.enter(2003).admit  # a free root slot is not a user slot
    adm.leave(2001)
    assert adm.enter(2003).admit
    for uid in (2001, 2001, 2002, 2003, 0):
        adm.leave(uid)
    assert adm.total == 0 and adm.users == 0 and adm.by_uid == {}


def _w(uid: int, since: float = 0.0) -> Waiting:
    return Waiting(object(), Peer(100 + uid, uid, uid), since)


def test_a_users_surplus_waits_in_order_and_takes_the_freed_slot() -> None:
    lim = Limits(
        max_connections=20,
        root_connections=2,
        max_connections_per_user=2,
        max_waiting_per_user=3,
        max_waiting=4,
        wait_timeout=10.0,
    )
    adm = Admission(lim)
    assert adm.enter(2001, _w(2001)).admit and adm.enter(2001, _w(2001)).admit
    queued = [_w(2001, t) for t in (1.0, 2.0, 3.0)]
    assert all(adm.enter(2001, w).wait for w in queued)
    full = adm.enter(2001, _w(2001))
    assert not full.admit and not full.wait
    assert "too many connections from uid 2001 (2 at once, 3 waiting)" in full.reason
    # another user is admitted at once, never queued behind 2001
    assert adm.enter(2002, _w(2002)).admit
    assert adm.enter(2002, _w(2002)).admit
    assert adm.enter(2002, _w(2002, 4.0)).wait  # the 4th waiting connection of all
    assert not adm.enter(2002, _w(2002)).wait  # max_waiting reached
    assert adm.enter(2003, _w(2003)).admit  # a third user is still served at once
    # a slot of 2001 that frees goes to its oldest waiting connection; the counts stay
    before = (adm.total, adm.users, dict(adm.by_uid))
    nxt, expired = adm.next_or_leave(2001, now=5.0)
    assert nxt is queued[0] and expired == []
    assert (adm.total, adm.users, dict(adm.by_uid)) == before
    assert adm.n_waiting == 3
    # 2001's queue drains in order; then its slots are given back
    assert adm.next_or_leave(2001, 5.0)[0] is queued[1]
    assert adm.next_or_leave(2001, 5.0)[0] is queued[2]
    assert adm.next_or_leave(2001, 5.0) == (None, [])
    assert adm.by_uid[2001] == 1
    assert adm.next_or_leave(2001, 5.0) == (None, [])
    assert 2001 not in adm.by_uid and 2001 not in adm.waiting


def test_a_connection_that_waited_too_long_is_turned_away() -> None:
    lim = Limits(max_connections_per_user=1, max_waiting_per_user=5, wait_timeout=10.0)
    adm = Admission(lim)
    assert adm.enter(2001, _w(2001)).admit
    old, young = _w(2001, 0.0), _w(2001, 8.0)
    assert adm.enter(2001, old).wait and adm.enter(2001, young).wait
    # the accept loop's sweep takes out those older than wait_timeout
    assert adm.expire(now=5.0) == []
    assert adm.expire(now=10.5) == [old]
    assert adm.n_waiting == 1
    # the slot's end skips a waiting connection that is too old by then
    later = _w(2001, 10.0)
    assert adm.enter(2001, later).wait
    nxt, expired = adm.next_or_leave(2001, now=19.5)
    assert expired == [young] and nxt is later
    assert adm.next_or_leave(2001, now=19.5) == (None, [])
    assert adm.total == 0 and adm.n_waiting == 0 and adm.waiting == {}


def test_root_never_waits() -> None:
    adm = Admission(Limits(max_connections=3, root_connections=1, max_connections_per_user=1))
    assert all(adm.enter(0, _w(0)).admit for _ in range(3))
    v = adm.enter(0, _w(0))
    assert not v.admit and not v.wait and "too many connections to podnetd" in v.reason


# -- CLI and metrics ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv", [["--json", "pods"], ["pods", "--json"], ["--socket", "/x", "pods", "--json"]]
)
def test_cli_options_before_or_after_the_command(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: dict[str, Any] = {}

    def fake_call(op: str, sock: str, **kw: Any) -> dict[str, Any]:
        seen.update(op=op, sock=sock)
        return {"pods": [{"kind": "job", "name": "pn-j1", "ip": "198.18.0.1", "user": "a"}]}

    monkeypatch.setattr(cli, "call", fake_call)
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out)[0]["name"] == "pn-j1"
    assert seen["sock"] == ("/x" if "/x" in argv else cli.DEFAULT_SOCKET)


def test_setup_histogram_is_cumulative() -> None:
    h = Histogram((0.01, 0.1))
    before = []
    for i in range(3000):
        h.observe(0.005 if i % 2 else 0.05)
        before.append((list(h.counts), h.count))
    assert h.count == 3000 and h.counts == [1500, 3000]
    for (c0, n0), (c1, n1) in itertools.pairwise(before):
        assert n0 < n1 and all(x <= y for x, y in zip(c0, c1, strict=True))
    assert h.sum == pytest.approx(1500 * 0.055)


# -- the allocation transaction (fake etcd) ----------------------------------------------


def _allocator(etcd: Any) -> Allocator:
    return Allocator(
        etcd, Keys("u"), Ipam(ipaddress.IPv4Network("198.18.0.0/20"), 26), "u", 4096, 8191
    )


def _in_blocks_of(etcd: Any, ip: str) -> list[str]:
    blocks = {
        kv.key.rsplit("/", 1)[-1]: kv.json()["node"]
        for kv in etcd.get_prefix("/podnet/u/blocks/")[0]
    }
    return [
        n
        for blk, n in blocks.items()
        if ipaddress.ip_address(ip) in ipaddress.ip_network(blk.replace("-", "/"))
    ]


def test_allocation_is_idempotent_and_takes_ips_from_each_nodes_block() -> None:
    etcd = FakeEtcd()
    a, b = _allocator(etcd), _allocator(etcd)
    vni = a.user_vni("alice", 2001)
    assert b.user_vni("alice", 2001) == vni  # once, for ever
    first = a.allocate_job(5, "alice", 2001, "My Job", ["n1", "n2"], vni)
    second = b.allocate_job(5, "alice", 2001, "My Job", ["n1", "n2"], vni, 1)
    assert first.job.label == "my-job" and (first.index, second.index) == (0, 1)
    assert first.ip != second.ip
    assert _in_blocks_of(etcd, first.ip) == ["n1"] and _in_blocks_of(etcd, second.ip) == ["n2"]
    assert a.allocate_job(5, "alice", 2001, "My Job", ["n1", "n2"], vni).ip == first.ip
    assert b.allocate_job(5, "alice", 2001, "My Job", ["n1", "n2"], vni, 1).ip == second.ip
    assert etcd.get("/podnet/u/jobnodes/5/n2").json() == {"index": 1, "ip": second.ip}
    record = etcd.get("/podnet/u/jobs/5").json()
    assert "ips" not in record and "nodes" not in record and record["size"] == 2
    a.leave_job(first)
    assert etcd.get("/podnet/u/jobs/5") is not None  # n2 is still in it
    b.leave_job(second)
    assert etcd.get_prefix("/podnet/u/ips/")[0] == []
    assert etcd.get("/podnet/u/jobs/5") is None
    assert etcd.get_prefix("/skydns/u/")[0] == []
    assert etcd.get("/podnet/u/names/alice/my-job") is None


def test_another_users_job_of_the_same_id_is_refused_on_its_first_node() -> None:
    etcd = FakeEtcd()
    a = _allocator(etcd)
    a.allocate_job(6, "alice", 2001, "j", ["n1"], a.user_vni("alice", 2001))
    with pytest.raises(AllocError, match="another user"):
        a.allocate_job(6, "bob", 2002, "j", ["n1"], a.user_vni("bob", 2002))


def test_concurrent_jobs_never_share_an_ip() -> None:
    etcd = FakeEtcd()
    nodes = [f"n{i}" for i in range(4)]
    allocs = {n: _allocator(etcd) for n in nodes}
    vni = allocs["n0"].user_vni("alice", 2001)
    pods: dict[tuple[int, str], Any] = {}

    def one(job_id: int, node: str) -> None:
        pods[(job_id, node)] = allocs[node].allocate_job(
            job_id, "alice", 2001, f"j{job_id}", nodes, vni, nodes.index(node)
        )

    threads = [threading.Thread(target=one, args=(j, n)) for j in range(10, 40) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(pods) == 30 * 4
    every = [p.ip for p in pods.values()]
    assert len(every) == len(set(every)) == 30 * 4
    for (j, node), p in pods.items():
        assert _in_blocks_of(etcd, p.ip) == [node] and p.index == nodes.index(node)
        # every pod has its record under the job name, whichever node came first
        named = etcd.get(f"/skydns/u/alice/j{j}/pod{p.index}")
        assert named is not None and named.json()["host"] == p.ip


def test_a_node_sends_its_own_transactions_and_never_waits_for_the_first() -> None:
    etcd = FakeEtcd()
    nodes = [f"n{i}" for i in range(40)]
    first, other = _allocator(etcd), _allocator(etcd)
    vni = first.user_vni("alice", 2001)
    before = etcd.txns
    late = other.allocate_job(7, "alice", 2001, "big", nodes, vni, 5)
    # its own pod in one transaction (its record under the name: not the job's yet, none)
    assert etcd.txns - before == 1 and etcd.get("/podnet/u/jobs/7") is None
    assert etcd.get("/skydns/u/alice/big/pod5") is None
    before = etcd.txns
    mine = first.allocate_job(7, "alice", 2001, "big", nodes, vni, 0)
    # the record, the name and its pod; the record under the name of the node before it
    assert etcd.txns - before == 2
    assert etcd.get("/skydns/u/alice/big/pod5").json()["host"] == late.ip
    assert etcd.get("/skydns/u/alice/big/pod0").json()["host"] == mine.ip
    # a node after the first writes its own record under the name
    after = other.allocate_job(7, "alice", 2001, "big", nodes, vni, 9)
    assert etcd.get("/skydns/u/alice/big/pod9").json()["host"] == after.ip
