# SPDX-License-Identifier: Apache-2.0
"""The cluster view in the state layer (`podnet.state.clusterview`, `watchrecords`), fed
watch events as plain values (`make unit`, no etcd): what each record does to the view and
which changes it reports for the node layer's appliers; the one-revision read `podnet
doctor` uses."""

from __future__ import annotations

import ipaddress
import json
import logging
from contextlib import nullcontext
from typing import Any

import pytest
from fake_etcd import FakeEtcd
from podnet.cli import podnet as cli
from podnet.config import NodeConfig
from podnet.names import Keys
from podnet.node.repair import RecordRepair
from podnet.node.workqueue import SyncQueue
from podnet.state.clusterview import (
    AddressesChanged,
    BlockChanged,
    ClusterView,
    NodesChanged,
    UserChanged,
)
from podnet.state.etcdops import KV
from podnet.state.watchrecords import BlockRecord, ClusterRead, PodRecord, job_of, record_of

KEYS = Keys("u")
ROOT = "/podnet/u/"
N1, N2, N3 = "203.0.113.11", "203.0.113.12", "203.0.113.13"


def _kv(key: str, value: Any, rev: int = 7) -> KV:
    text = value if isinstance(value, str) else json.dumps(value)
    return KV(ROOT + key, text, rev, rev)


def _job(job_id: int, size: int, vni: int) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "user": "alice",
        "uid": 2001,
        "name": "j",
        "label": "j",
        "size": size,
        "vni": vni,
    }


def _put(view: ClusterView, key: str, value: Any) -> list[Any]:
    rec = record_of(KEYS, "put", ROOT + key, _kv(key, value))
    return view.apply(rec) if rec is not None else []


def _delete(view: ClusterView, key: str) -> list[Any]:
    rec = record_of(KEYS, "delete", ROOT + key, None)
    return view.apply(rec) if rec is not None else []


def _view() -> ClusterView:
    view = ClusterView("n1")
    view.node_ips = {"n1": N1, "n2": N2, "n3": N3}
    return view


def test_a_node_put_or_deleted_says_the_node_table_changed() -> None:
    view = ClusterView("n1")
    assert _put(view, "nodes/n2", {"ip": N2}) == [NodesChanged("n2")]
    assert _delete(view, "nodes/n2") == [NodesChanged("n2")]
    # the table itself is read whole (one range): the pass's `set_nodes`
    assert view.set_nodes([_kv("nodes/n1", {"ip": N1}), _kv("nodes/n2", {"ip": N2})])
    assert not view.set_nodes([_kv("nodes/n1", {"ip": N1}), _kv("nodes/n2", {"ip": N2})])
    assert view.node_addresses() == [N1, N2]
    assert view.set_nodes([_kv("nodes/n1", {"ip": N1})])
    assert view.node_addresses() == [N1]


def test_no_node_follows_the_jobs_records_a_login_record_holds_an_address() -> None:
    view = _view()
    # a job's start reaches no node but its own (each allocates its pod itself)
    assert record_of(KEYS, "put", ROOT + "jobs/3", _kv("jobs/3", _job(3, 2, 5000))) is None
    assert _put(view, "jobs/3", _job(3, 2, 5000)) == [] and _delete(view, "jobs/3") == []
    # a job record as a podnetd before node-owned allocation wrote it: read (the GC, the
    # guard), no address
    old = {**_job(4, 2, 5000), "nodes": ["n1", "n2"], "ips": ["198.18.0.1", "198.18.0.66"]}
    del old["size"]
    job = job_of(_kv("jobs/4", old))
    assert job is not None and job.size == 2 and job.old_ips == ("198.18.0.1", "198.18.0.66")
    assert job_of(_kv("jobs/5", ["not", "a", "job"])) is None
    # a login pod's record, then the same key with another address
    assert _put(view, "logins/n2/alice", {"ip": "198.18.0.67", "uid": 2001}) == [
        AddressesChanged((), ("198.18.0.67",))
    ]
    assert _put(view, "logins/n2/alice", {"ip": "198.18.0.68", "uid": 2001}) == [
        AddressesChanged(("198.18.0.67",), ("198.18.0.68",))
    ]


def test_a_remote_pod_is_where_its_block_owner_is_never_where_a_record_says() -> None:
    """The overlay's question (node/overlay.py): which node's underlay address a frame to
    a pod goes to. Only the block map and the node table answer it: a pod record naming
    another node changes nothing."""
    view = _view()
    _put(view, "blocks/198.18.0.0-26", {"node": "n1"})
    _put(view, "blocks/198.18.0.64-26", {"node": "n2"})
    assert view.vtep_of("198.18.0.66") == N2
    assert view.vtep_of("198.18.0.5") is None  # this node's own block
    assert view.vtep_of("198.18.0.130") is None  # no block holds it
    assert view.vtep_of("not an address") is None
    # a container record of n3 naming an address of n2's block: still n2
    _put(view, "containers/n3/pn-c0", {"ip": "198.18.0.67", "user": "alice", "vni": 5000})
    assert view.vtep_of("198.18.0.67") == N2
    # the block moves to n3, then is freed
    assert _put(view, "blocks/198.18.0.64-26", {"node": "n3"}) == [
        BlockChanged(ipaddress.IPv4Network("198.18.0.64/26"), "n3")
    ]
    assert view.vtep_of("198.18.0.66") == N3
    _delete(view, "blocks/198.18.0.64-26")
    assert view.vtep_of("198.18.0.66") is None
    # an owner without a registered address: nowhere
    _put(view, "blocks/198.18.0.192-26", {"node": "n9"})
    assert view.vtep_of("198.18.0.200") is None


def test_a_users_vni_comes_from_its_record() -> None:
    view = _view()
    assert _put(view, "users/bob", {"vni": 5002, "uid": 2002}) == [UserChanged("bob", 5002)]
    assert view.user_vni("bob") == 5002
    assert _delete(view, "users/bob") == [UserChanged("bob", None)]
    assert view.user_vni("bob") is None


def test_malformed_values_are_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    view = _view()
    with caplog.at_level(logging.WARNING, logger="podnet.sync"):
        assert job_of(_kv("jobs/6", "not json")) is None
        assert job_of(_kv("jobs/7", {"job_id": 7})) is None  # JSON, not a job record
        assert _put(view, "logins/n2/carol", "{") == []
        assert _put(view, "containers/n2/pn-c1", "[1, 2]") == []
        assert _put(view, "users/carol", "nope") == [UserChanged("carol", None)]
        assert _put(view, "blocks/198.18.0.0-26", "?") == [
            BlockChanged(ipaddress.IPv4Network("198.18.0.0/26"), None)
        ]
        assert _put(view, "blocks/not-a-block", {"node": "n2"}) == []
    unreadable = [r.getMessage() for r in caplog.records]
    assert len(unreadable) == 7, unreadable
    assert any("jobs/6" in m for m in unreadable) and any("not-a-block" in m for m in unreadable)


def test_blocks_and_keys_the_view_does_not_follow() -> None:
    view = _view()
    got = _put(view, "blocks/198.18.0.64-26", {"node": "n2"})
    assert got == [BlockChanged(ipaddress.IPv4Network("198.18.0.64/26"), "n2")]
    assert record_of(KEYS, "put", ROOT + "ips/198.18.0.5", _kv("ips/198.18.0.5", {})) is None
    assert record_of(KEYS, "put", ROOT + "vteps/5000/n2", _kv("vteps/5000/n2", {})) is None
    assert record_of(KEYS, "put", "/podnet/other/jobs/1", None) is None
    assert record_of(KEYS, "put", ROOT + "jobs/x", None) is None
    assert record_of(KEYS, "put", ROOT + "logins/n2", None) is None
    assert isinstance(record_of(KEYS, "delete", ROOT + "blocks/198.18.0.0-26", None), BlockRecord)


def test_the_cli_loads_the_view_in_one_read_without_a_nodes_machinery() -> None:
    etcd = FakeEtcd()
    etcd.put(ROOT + "nodes/n1", {"ip": N1})
    etcd.put(ROOT + "nodes/n2", {"ip": N2})
    etcd.put(ROOT + "users/alice", {"vni": 5000, "uid": 2001})
    etcd.put(ROOT + "jobs/3", _job(3, 2, 5000))
    etcd.put(ROOT + "logins/n3/alice", {"ip": "198.18.0.130", "uid": 2001})
    etcd.put(ROOT + "blocks/198.18.0.0-26", {"node": "n1"})
    etcd.put(ROOT + "ips/198.18.0.1", {"vni": 5000})
    txns = etcd.txns
    view = ClusterView.load(etcd, KEYS, "n1")  # type: ignore[arg-type]
    assert etcd.txns == txns + 1
    assert view.user_vni("alice") == 5000
    assert view.vtep_of("198.18.0.1") is None  # n1's own block
    assert view.node_addresses() == [N1, N2]
    read = ClusterRead.of(etcd, KEYS)  # type: ignore[arg-type]
    assert "jobs" not in read.kvs
    assert read.blocks() == {ipaddress.IPv4Network("198.18.0.0/26"): "n1"}
    assert read.addresses() == ["198.18.0.1"]
    # a reset says what the records hold and that the node table changed
    changes = ClusterView("n1").reset(read)
    assert NodesChanged("") in changes
    used = {ip for c in changes if isinstance(c, AddressesChanged) for ip in c.used}
    assert used == {"198.18.0.130"}  # a login's (a job's are in ips/: the IPAM view's)


def test_the_repair_screens_a_tampered_user_record_before_the_view_takes_it() -> None:
    """Tamper repair in its own room: a user's record changed by another writer never
    reaches the view, the write back is queued."""
    work = SyncQueue()
    repair = RecordRepair(FakeEtcd(), work)  # type: ignore[arg-type]
    first = record_of(KEYS, "put", ROOT + "users/bob", _kv("users/bob", {"vni": 5002}))
    changed = record_of(KEYS, "put", ROOT + "users/bob", _kv("users/bob", {"vni": 5000}, 9))
    assert first is not None and changed is not None
    assert repair.screen(first) is first and repair.screen(changed) is None
    assert work.take() == {"restore"}
    pod = record_of(KEYS, "put", ROOT + "logins/n2/bob", _kv("logins/n2/bob", {"ip": "x"}))
    assert isinstance(pod, PodRecord) and repair.screen(pod) is pod


def test_the_repair_keeps_the_blocks_of_this_nodes_pods() -> None:
    """A block that holds a pod of this node, given to another node or deleted by another
    writer: the view keeps it this node's, the write back is queued (a node with a stolen
    certificate would otherwise have every node's overlay and routes send this node's pods'
    traffic to it). A block given to this node by another writer holds none of its pods: it
    is not defended (two honest nodes never fight over it), nor is another node's."""
    work = SyncQueue()
    ips = ["198.18.0.5"]
    repair = RecordRepair(FakeEtcd(), work, node="n1", own_ips=lambda: ips)  # type: ignore[arg-type]
    key = "blocks/198.18.0.0-26"
    own = record_of(KEYS, "put", ROOT + key, _kv(key, {"node": "n1"}, 4))
    assert isinstance(own, BlockRecord) and repair.screen(own) is own
    assert work.take() == set()
    stolen = record_of(KEYS, "put", ROOT + key, _kv(key, {"node": "n2"}, 9))
    assert isinstance(stolen, BlockRecord)
    screened = repair.screen(stolen)
    assert isinstance(screened, BlockRecord) and screened.node == "n1"
    assert work.take() == {"restore"}
    assert repair._restores[ROOT + key] == ('{"node":"n1"}', 9)
    gone = record_of(KEYS, "delete", ROOT + key, None)
    assert isinstance(gone, BlockRecord)
    screened = repair.screen(gone)
    assert isinstance(screened, BlockRecord) and screened.node == "n1"
    # n2's block given to n1 by another writer, and moved on: none of n1's pods is in it
    other = "blocks/198.18.0.64-26"
    for node in ("n1", "n3"):
        rec = record_of(KEYS, "put", ROOT + other, _kv(other, {"node": node}))
        assert rec is not None and repair.screen(rec) is rec
    # after a whole read (a resync): the same
    etcd = FakeEtcd()
    etcd.put(ROOT + key, {"node": "n3"})
    etcd.put(ROOT + other, {"node": "n3"})
    work.take()
    repair.check_read(ClusterRead.of(etcd, KEYS))  # type: ignore[arg-type]
    assert work.take() == {"restore"} and set(repair._restores) == {ROOT + key}
    # the pod gone: its block is no longer this node's to defend
    ips.clear()
    assert repair.screen(stolen) is stolen


def test_podnet_doctor_checks_the_overlay_with_the_view_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`podnet doctor`'s overlay check reads the view with `ClusterView.load` (one read, no
    allocator, dataplane, firewall or sync loop): each user VXLAN is one that asks for
    remote pods (no flooding), and each remote pod it has met goes to its block's owner."""
    etcd = FakeEtcd()
    lab = "/podnet/lab/"
    for n, ip in (("c1", N1), ("c2", N2), ("c3", N3)):
        etcd.put(f"{lab}nodes/{n}", {"ip": ip})
    etcd.put(f"{lab}blocks/198.18.0.64-26", {"node": "c2"})
    etcd.put(f"{lab}blocks/198.18.0.128-26", {"node": "c3"})
    cfg = NodeConfig.from_dict(
        {
            "node": "c1",
            "underlay_interface": "eth0",
            "underlay_ip": N1,
            "cluster": "lab",
            "etcd_endpoints": ["http://127.0.0.1:2379"],
        },
        "test",
    )
    links = {
        "pnvx5000": {"kind": "vxlan", "vni": 5000, "index": 10, "l3miss": True},
        "pnvx5001": {"kind": "vxlan", "vni": 5001, "index": 11, "l3miss": True},
        "pnvx5002": {"kind": "vxlan", "vni": 5002, "index": 12, "l3miss": False},
        "eth0": {"kind": "", "index": 2},
    }
    fdb: dict[int, tuple[set[str], dict[str, str]]] = {
        10: (set(), {"0a:58:c6:12:00:42": N2, "0a:58:c6:12:00:82": N3}),
        11: (set(), {"0a:58:c6:12:00:83": N2}),  # c3's pod sent to c2
        12: ({N2}, {}),  # an older podnetd's device
    }
    monkeypatch.setattr(cli.Etcd, "of_node", staticmethod(lambda _cfg: etcd))
    monkeypatch.setattr(cli.nl, "Netlink", lambda: nullcontext(None))
    monkeypatch.setattr(cli.nlquery, "links", lambda _sock: links)
    monkeypatch.setattr(cli.nlquery, "fdb_entries", lambda _sock, index: fdb[index])
    txns = etcd.txns
    got = {c["check"]: (c["ok"], c["detail"]) for c in cli._fdb_drift(cfg)}
    assert etcd.txns == txns + 1
    assert got == {
        "fdb:pnvx5000": (True, "in sync (2 remote pods met)"),
        "fdb:pnvx5001": (
            False,
            f"sends to the wrong node: 198.18.0.131 -> {N2} (owner: {N3})",
        ),
        "fdb:pnvx5002": (
            False,
            f"made by an older podnetd (restart podnetd); floods to ['{N2}']",
        ),
    }
