# SPDX-License-Identifier: Apache-2.0
"""A job pod whose records etcd lost (etcd restored to a snapshot older than the job):
what podnetd decides and writes back, on the in-memory etcd (`make unit`). The real thing
runs in tests/agent/test_restore.py (netns, etcd) and tests/day2 (restore.yml on the lab).

The attacks: a pod whose job ended is never written back; an address, block, VNI or job
name another owner holds is never taken."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fake_etcd import FakeEtcd
from podnet.config import ClusterConfig, NodeConfig
from podnet.names import Keys
from podnet.node.localjobs import LocalJobs
from podnet.node.pods import Pod, PodTable
from podnet.node.reconcile import Reconciler, decide_lost_pod, records_gc_ttl
from podnet.state.alloc import Allocator, AllocError, Job, JobPod
from podnet.state.clusterview import ClusterView
from podnet.state.ipam import Ipam

CC = ClusterConfig.from_dict({"pod_cidr": "198.18.0.0/20", "block_prefix": 26, "zone": "lab"}, "t")
R = "/podnet/u/"


def _alloc(etcd: FakeEtcd) -> Allocator:
    return Allocator(etcd, Keys("u"), Ipam(CC.pod_cidr, 26), "lab", 4096, 8191)  # type: ignore[arg-type]


def _job(job_id: int = 7) -> Job:
    return Job(job_id, "bob", 2002, "late", "late", 5000, 2, created=1.0)


IPS = ("198.18.0.2", "198.18.0.66")


def _pod(index: int = 0, job: Job | None = None) -> JobPod:
    """Pod `index` of job 7 of bob: on c1 (198.18.0.2) or on c2 (198.18.0.66)."""
    return JobPod(job or _job(), index, ("c1", "c2")[index], IPS[index])


def _job9() -> Job:
    """A running job of another user."""
    return Job(9, "al", 2001, "x", "x", 4100, 1)


def _val(etcd: FakeEtcd, key: str) -> object:
    kv = etcd.get(key)
    return None if kv is None else json.loads(kv.value)


def _running(*ids: int) -> object:
    return set(ids).__contains__


# -- what to do ------------------------------------------------------------------------


def test_decision_keeps_running_jobs_removes_ended_and_waits_when_slurm_is_silent() -> None:
    assert decide_lost_pod(7, {7, 8}) == "keep"
    assert decide_lost_pod(7, {8}) == "remove"
    assert decide_lost_pod(7, set()) == "remove"
    assert decide_lost_pod(7, None) == "wait"


# -- writing back (Allocator.reclaim_job) ----------------------------------------------


def test_reclaim_writes_everything_back_with_the_same_addresses() -> None:
    etcd = FakeEtcd()  # the snapshot knew nothing of bob
    a = _alloc(etcd)
    got = a.reclaim_job(_pod(0), _running(7))
    assert got == _pod(0)
    assert _val(etcd, R + "jobs/7") == _job().to_json()
    assert _val(etcd, R + "ips/198.18.0.2") == {"job_id": 7, "node": "c1", "vni": 5000}
    assert _val(etcd, R + "jobnodes/7/c1") == {"index": 0, "ip": "198.18.0.2"}
    assert _val(etcd, R + "blocks/198.18.0.0-26") == {"node": "c1"}
    assert _val(etcd, R + "users/bob") == {"vni": 5000, "uid": 2002}
    assert _val(etcd, R + "vnis/5000") == {"user": "bob"}
    assert _val(etcd, R + "names/bob/late") == {"job_id": 7}
    assert etcd.get(R + "ips/198.18.0.66") is None  # c2's pod: c2 writes it back
    # the job's other node does the same for its pod: the job's record is there already
    other = _alloc(etcd).reclaim_job(_pod(1), _running(7))
    assert other.job.same_as(_job()) and other.ip == "198.18.0.66"
    assert _val(etcd, R + "blocks/198.18.0.64-26") == {"node": "c2"}
    assert _val(etcd, R + "jobnodes/7/c2") == {"index": 1, "ip": "198.18.0.66"}
    before = {k: kv.value for k, kv in etcd.data.items()}
    assert _alloc(etcd).reclaim_job(_pod(1), _running(7)).ip == "198.18.0.66"
    assert {k: kv.value for k, kv in etcd.data.items()} == before  # again: the same
    # and the pod's record under the job name comes back with publish_pod
    a.publish_pod(got)
    assert _val(etcd, "/skydns/lab/bob/late/pod0")["host"] == "198.18.0.2"  # type: ignore[index]
    assert _val(etcd, "/skydns/lab/bob/7/pod0")["host"] == "198.18.0.2"  # type: ignore[index]


def test_reclaim_releases_a_stale_record_of_an_ended_job_holding_the_address() -> None:
    etcd = FakeEtcd()
    a = _alloc(etcd)
    # the snapshot's job 3 had 198.18.0.2, ended, then job 7 got it; the restore brought 3 back
    old = Job(3, "alice", 2001, "old", "old", 4100, 1, created=1.0)
    etcd.put(R + "jobs/3", old.to_json())
    etcd.put(R + "jobnodes/3/c1", {"index": 0, "ip": "198.18.0.2"})
    etcd.put(R + "ips/198.18.0.2", {"job_id": 3, "node": "c1", "vni": 4100})
    etcd.put(R + "blocks/198.18.0.0-26", {"node": "c1"})
    got = a.reclaim_job(_pod(0), _running(7))
    assert got.ip == "198.18.0.2"
    assert etcd.get(R + "jobs/3") is None and etcd.get(R + "jobnodes/3/c1") is None
    assert _val(etcd, R + "ips/198.18.0.2") == {"job_id": 7, "node": "c1", "vni": 5000}
    # an address record alone of an ended job (its record went before the snapshot)
    etcd = FakeEtcd()
    etcd.put(R + "ips/198.18.0.2", {"job_id": 3, "node": "c1", "vni": 4100})
    assert _alloc(etcd).reclaim_job(_pod(0), _running(7)).ip == "198.18.0.2"
    assert _val(etcd, R + "ips/198.18.0.2") == {"job_id": 7, "node": "c1", "vni": 5000}


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        # another running job's address (attack: take the address of a live pod)
        (R + "ips/198.18.0.66", {"job_id": 9, "node": "c2", "vni": 4100}, "198.18.0.66 is taken"),
        # a login pod's address
        (R + "ips/198.18.0.66", {"kind": "login", "node": "c2", "user": "al"}, "is taken"),
        # the block went to another node
        (R + "blocks/198.18.0.64-26", {"node": "c3"}, "belongs to c3"),
        # the VNI went to another user, or bob got another VNI
        (R + "vnis/5000", {"user": "carol"}, "VNI 5000 of bob is taken"),
        (R + "users/bob", {"vni": 5001, "uid": 2002}, "has VNI 5001"),
    ],
)
def test_reclaim_never_takes_what_another_owner_holds(key: str, value: object, why: str) -> None:
    etcd = FakeEtcd()
    etcd.put(key, value)
    if "job_id" in str(value):
        etcd.put(R + "jobs/9", _job9().to_json())
    before = dict(etcd.data)
    with pytest.raises(AllocError, match=why):
        _alloc(etcd).reclaim_job(_pod(1), _running(7, 9))
    assert etcd.data == before  # nothing written, nothing released


def test_reclaim_takes_the_job_name_back_unless_a_newer_job_owns_it() -> None:
    etcd = FakeEtcd()
    etcd.put(R + "names/bob/late", {"job_id": 5})  # an older job of that name
    etcd.put("/skydns/lab/bob/late/pod0", {"host": "198.18.1.9"})
    _alloc(etcd).reclaim_job(_pod(0), _running(7))
    assert _val(etcd, R + "names/bob/late") == {"job_id": 7}
    assert etcd.get("/skydns/lab/bob/late/pod0") is None  # the old job's records went
    etcd = FakeEtcd()
    etcd.put(R + "names/bob/late", {"job_id": 8})  # a newer job: it keeps the name
    a = _alloc(etcd)
    got = a.reclaim_job(_pod(0), _running(7, 8))
    assert _val(etcd, R + "names/bob/late") == {"job_id": 8}
    a.publish_pod(got)
    assert etcd.get("/skydns/lab/bob/late/pod0") is None
    assert _val(etcd, "/skydns/lab/bob/7/pod0")["host"] == "198.18.0.2"  # type: ignore[index]


def test_reclaim_after_only_the_job_record_was_deleted_keeps_the_rest() -> None:
    """Another writer (a node's certificate: jobs/ is shared) deleted the job record and
    nothing else: the job's own address records and its name are not "taken", and the
    other node's records under the job name stay (tests/e2e/test_attack_etcd.py)."""
    etcd = FakeEtcd()
    a, b = _alloc(etcd), _alloc(etcd)
    mine = a.reclaim_job(_pod(0), _running(7))
    a.publish_pod(mine)
    b.publish_pod(b.reclaim_job(_pod(1), _running(7)))
    assert _val(etcd, "/skydns/lab/bob/late/pod1")["host"] == "198.18.0.66"  # type: ignore[index]
    etcd.delete(R + "jobs/7")
    before = {k: kv.value for k, kv in etcd.data.items() if k != R + "jobs/7"}
    got = _alloc(etcd).reclaim_job(_pod(0), _running(7))
    assert got.ip == mine.ip and _val(etcd, R + "jobs/7") == _job().to_json()
    after = {k: kv.value for k, kv in etcd.data.items() if k != R + "jobs/7"}
    assert after == before  # addresses, name, every pod's DNS records: as they were


# -- the node's own copy ----------------------------------------------------------------


def test_local_records_round_trip_and_garbage_is_ignored(tmp_path: Path) -> None:
    loc = LocalJobs(tmp_path)
    loc.save(_pod(1))
    assert loc.load(7, "c2") == _pod(1)
    assert loc.load(7, "c1") is None  # not this node's pod
    assert loc.ids() == [7]
    (tmp_path / "jobs" / "8.json").write_text('{"job": ')
    assert loc.load(8, "c2") is None
    bad = {**_pod(1, _job(9)).to_json(), "index": 5}
    (tmp_path / "jobs" / "9.json").write_text(json.dumps(bad))
    assert loc.load(9, "c2") is None  # index out of the job
    # a copy an older podnetd wrote (the job's record with every pod, the index)
    old = {**_job(10).to_json(), "nodes": ["c1", "c2"], "ips": list(IPS)}
    del old["size"]
    (tmp_path / "jobs" / "10.json").write_text(json.dumps({"job": old, "index": 1}))
    got = loc.load(10, "c2")
    assert got is not None and (got.index, got.ip, got.job.size) == (1, "198.18.0.66", 2)
    loc.drop(7)
    assert loc.load(7, "c2") is None


# -- the reconciler: GC notices, decides, writes back ----------------------------------


class _Nets:
    def __init__(self) -> None:
        self.vteps: set[int] = set()

    def register_vteps(self, vnis: set[int]) -> None:
        self.vteps |= set(vnis)


def _reconciler(
    tmp_path: Path, running: str, etcd: FakeEtcd | None = None, node: str = "c1", lease: int = 0
) -> tuple[Reconciler, FakeEtcd, list[int]]:
    etcd = etcd or FakeEtcd()
    cfg = NodeConfig(node, "eth0", "198.51.100.2", "u", ["http://127.0.0.1:1"])
    cfg.state_dir = str(tmp_path / node)
    cfg.running_job_source = cfg.job_source = ["sh", "-c", running]
    pods = PodTable()
    nothing: Any = None
    r = Reconciler(
        cfg,
        CC,
        etcd,
        Keys("u"),
        _alloc(etcd),
        nothing,
        nothing,
        pods,
        _Nets(),  # type: ignore[arg-type]
        ClusterView(node),
        nothing,
        lambda: lease,
    )
    downs: list[int] = []
    r.local.save(_pod(0))
    pod = Pod.of_job(_pod(0), "pn-j7", "/run/netns/pn-j7", CC, "pnv000000000001")
    pod.created = 0.0
    pods.add(pod)
    return r, etcd, downs


def test_gc_writes_back_a_running_jobs_lost_records(tmp_path: Path) -> None:
    r, etcd, downs = _reconciler(tmp_path, "echo 7; echo 12_3")
    assert r.find_lost(recorded={12}) == [7]
    assert r.reclaim_lost(downs.append) == [7]
    assert downs == [] and r.unclaimed == {}
    assert _val(etcd, R + "ips/198.18.0.2") == {"job_id": 7, "node": "c1", "vni": 5000}
    assert _val(etcd, R + "jobnodes/7/c1") == {"index": 0, "ip": "198.18.0.2"}
    assert _val(etcd, "/skydns/lab/bob/late/pod0")["host"] == "198.18.0.2"  # type: ignore[index]
    assert r.nets.vteps == {5000}  # type: ignore[attr-defined]
    assert r.find_lost(recorded={7}) == []


def test_gc_never_brings_back_an_ended_job(tmp_path: Path) -> None:
    r, etcd, downs = _reconciler(tmp_path, "echo 8")  # job 7 ended (Slurm runs 8 only)
    r.find_lost(recorded=set())
    assert r.reclaim_lost(downs.append) == []
    assert downs == [7] and r.unclaimed == {}
    assert etcd.data == {}


def test_gc_waits_while_slurm_cannot_say(tmp_path: Path) -> None:
    r, etcd, downs = _reconciler(tmp_path, "exit 1")
    r.find_lost(recorded=set())
    assert r.reclaim_lost(downs.append) == []
    assert downs == [] and "pn-j7" in r.unclaimed and etcd.data == {}


def test_gc_retries_while_the_address_is_held(tmp_path: Path) -> None:
    r, etcd, downs = _reconciler(tmp_path, "echo 7; echo 9")
    etcd.put(R + "ips/198.18.0.2", {"job_id": 9, "node": "c1", "vni": 4100})
    etcd.put(R + "jobs/9", _job9().to_json())
    r.find_lost(recorded={9})
    assert r.reclaim_lost(downs.append) == []
    assert "pn-j7" in r.unclaimed and etcd.get(R + "jobs/7") is None
    etcd.delete(R + "ips/198.18.0.2")  # job 9 let it go
    assert r.reclaim_lost(downs.append) == [7]
    assert r.unclaimed == {}


def test_a_node_reads_the_records_of_its_own_jobs_only(tmp_path: Path) -> None:
    r, etcd, _downs = _reconciler(tmp_path, "echo 7")
    etcd.put(R + "jobs/9", _job9().to_json())  # another job: not this node's business
    assert r.own_recorded() == set()
    etcd.put(R + "jobs/7", _job().to_json())
    assert r.own_recorded() == {7}


def test_one_node_at_a_time_releases_the_records_of_jobs_whose_nodes_died(
    tmp_path: Path,
) -> None:
    """No node follows every job's record: the node `gc/records` names (a key on a lease
    of its own, kept alive each round) releases those of jobs Slurm forgot; another node
    takes over when it is gone."""
    etcd = FakeEtcd()
    c1, _e, _d = _reconciler(tmp_path, "echo 7", etcd, "c1", lease=11)
    c2, _e, _d = _reconciler(tmp_path, "echo 7", etcd, "c2", lease=12)
    assert c1.records_gc_turn() is True and c2.records_gc_turn() is False
    lease = etcd.data[R + "gc/records"].lease
    assert lease not in (0, 11) and etcd.leases[lease] == records_gc_ttl(60.0) == 150
    assert _val(etcd, R + "gc/records") == {"node": "c1", "lease": lease}
    txns = etcd.txns
    assert c1.records_gc_turn() is True and etcd.txns == txns  # kept alive, no write
    dead = _job9()  # its nodes died: nobody left it, Slurm forgot it
    etcd.put(R + "jobs/9", dead.to_json())
    etcd.put(R + "jobnodes/9/c9", {"index": 0, "ip": "198.18.0.200"})
    etcd.put(R + "ips/198.18.0.200", {"job_id": 9, "node": "c9", "vni": 4100})
    c2.gc_once(lambda j: None)
    assert R + "jobs/9" in etcd.data  # not c2's turn
    c1.gc_once(lambda j: None)
    assert R + "jobs/9" not in etcd.data and R + "ips/198.18.0.200" not in etcd.data
    assert R + "jobnodes/9/c9" not in etcd.data
    etcd.expire(lease)  # c1 stopped: its lease ran out
    assert c2.records_gc_turn() is True and c1.records_gc_turn() is False
    # c2's lease lost (etcd unreachable longer than the TTL) while its key stays: not c2's
    etcd.leases.pop(etcd.data[R + "gc/records"].lease)
    assert c2.records_gc_turn() is False
