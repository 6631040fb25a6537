# SPDX-License-Identifier: Apache-2.0
"""What another writer changed in the records etcd lets every node write, undone by this
node (docs/security.md, "etcd authentication": what etcd's prefix permissions cannot
refuse is detected and undone by its owner). The one room of tamper repair:

* `RecordRepair`, on the watches (`etcd_sync.EtcdSync` screens each record through it
  before the view takes it): a user's VNI (`users/`, `vnis/`: created once, never changed
  nor deleted by podnet) is put back as this node first saw it, and the record of a job
  with a pod on this node as this node keeps it (`own_job`: reconcile.local's copy, the
  same but for the time it was made, `Job.same_as`; the view goes on with that copy
  meanwhile). A deleted job record is written back by the
  reconciler (`on_job_lost`: `Reconciler.reclaim_soon`, with the records etcd lost). The
  write back is guarded by the revision the change had, so of all the nodes that saw it
  one writes; it runs in the sync loop's pass ('restore' in its queue).
* `RecordGuard`, every `VERIFY_INTERVAL` seconds: the shared records of this node's own
  pods. Every node may write the records that allocations share (addresses, DNS records,
  markers: their keys are by address or by user, not by node), so a node with a stolen
  certificate could change or delete those of another node's pods. The owner compares
  them all with what they must hold, in read-only transactions of at most etcd's
  --max-txn-ops compares (the failure branch returns them: no second round trip to find
  the difference), and writes back the ones that differ: its job pods' address records,
  markers and DNS records (under the job id, the PTR, and under the job name while the
  job owns it); its login pods' address, DNS and PTR records. A write back is guarded by
  the pod's own record (the job's record, the login record), so a pod released meanwhile
  is never written back.

Each write back is logged (a warning: someone else wrote there).
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from podnet.names import Keys
from podnet.node.pods import PodTable
from podnet.node.workqueue import SyncQueue
from podnet.state.alloc import Allocator, Job, JobPod, name_owner
from podnet.state.etcdops import (
    cmp_mod,
    cmp_present,
    cmp_value,
    json_dumps,
    op_get,
    op_put,
)
from podnet.state.store import Etcd, EtcdRequestError, EtcdUnavailable
from podnet.state.watchrecords import (
    BlockRecord,
    ClusterRead,
    JobRecord,
    Record,
    UserRecord,
    VniRecord,
    record_of,
)

log = logging.getLogger("podnet.guard")
#: the watches' repair logs as the sync loop did
sync_log = logging.getLogger("podnet.sync")

#: how often a node checks its pods' shared records
VERIFY_INTERVAL = 5.0


class RecordRepair:
    """The watched records another writer changed: noted as each record comes (`screen`,
    `check_read` after a whole read), written back in the sync loop's pass (`restore`)."""

    def __init__(
        self,
        etcd: Etcd,
        work: SyncQueue,
        own_job: Callable[[int], Job | None] = lambda job_id: None,
        on_job_lost: Callable[[int], None] = lambda job_id: None,
        node: str = "",
        own_ips: Callable[[], Iterable[str]] = lambda: (),
    ) -> None:
        """`own_job`: this node's copy of a job's record, if it has a pod of it
        (reconcile.local); `on_job_lost`: a job with a pod here lost its record (the
        reconciler writes it back); `work`: 'restore' is queued there; `node`: this node,
        `own_ips`: the addresses of its pods (the blocks that hold one are kept its own)."""
        self.etcd = etcd
        self.work = work
        self.own_job = own_job
        self.on_job_lost = on_job_lost
        self.node = node
        self.own_ips = own_ips
        #: the lock of the two tables below
        self._mutex = threading.Lock()
        #: users' and VNIs' records as this node first saw them (key -> value)
        self._first_seen: dict[str, str] = {}
        #: records to write back (key -> (value, the revision of the change))
        self._restores: dict[str, tuple[str, int]] = {}

    def screen(self, rec: Record) -> Record | None:
        """The record as this node takes it into the view: a job record of a job with a
        pod here as this node keeps it, a block of this node as its own, a changed user's
        record not at all (None); what differs is noted to be written back."""
        if isinstance(rec, JobRecord):
            return self._screen_job(rec)
        if isinstance(rec, UserRecord | VniRecord):
            return None if self.changed_once_created(rec.key, rec.value, rec.revision) else rec
        if isinstance(rec, BlockRecord):
            mine = self.block_moved(rec)
            return rec if mine is None else replace(rec, node=self.node, value=mine)
        return rec

    def _screen_job(self, rec: JobRecord) -> JobRecord:
        mine = self.own_job(rec.job_id)
        if mine is None:
            return rec
        if rec.deleted:
            sync_log.warning("job %d: its record was deleted while its pod runs here", rec.job_id)
            self.on_job_lost(rec.job_id)
            return rec
        if rec.job is None or not rec.job.same_as(mine):
            self.tampered(rec.key, rec.revision, store_json(mine.to_json()))
            return replace(rec, job=mine)  # what this node keeps using meanwhile
        return rec

    def block_moved(
        self, rec: BlockRecord, own: list[ipaddress.IPv4Address] | None = None
    ) -> str | None:
        """A block that holds a pod of this node (`own`: their addresses, read once by a
        caller screening many blocks), given to another node or deleted: noted to be
        written back; returns the value this node writes (None: nothing to undo)."""
        if not self.node or rec.node == self.node:
            return None
        if own is None:
            own = self.own_addresses()
        if not any(ip in rec.block for ip in own):
            return None
        mine = store_json({"node": self.node})
        sync_log.warning(
            "%s holds a pod of this node and was %s by another writer: writing it back",
            rec.key,
            "deleted" if rec.value is None else f"changed to {rec.value}",
        )
        self.tampered(rec.key, rec.revision, mine)
        return mine

    def own_addresses(self) -> list[ipaddress.IPv4Address]:
        return [ipaddress.IPv4Address(ip) for ip in self.own_ips()]

    def check_read(self, read: ClusterRead) -> None:
        """After a whole read: the users' and VNIs' records, the records of the jobs with
        a pod here."""
        present = {kv.key: kv for what in ("users", "vnis") for kv in read.kvs[what]}
        with self._mutex:
            known = list(self._first_seen)
        for key in sorted(set(known) | set(present)):
            kv = present.get(key)
            self.changed_once_created(
                key, kv.value if kv is not None else None, kv.mod_revision if kv else 0
            )
        own = self.own_addresses()
        for kv in read.kvs.get("blocks", []):
            rec = record_of(read.keys, "put", kv.key, kv)
            if isinstance(rec, BlockRecord):
                self.block_moved(rec, own)
        for job in read.jobs():
            mine = self.own_job(job.job_id)
            if mine is not None and not job.same_as(mine):
                key = read.keys.job(job.job_id)
                self.tampered(key, job.revision, store_json(mine.to_json()))

    def changed_once_created(self, key: str, value: str | None, revision: int) -> bool:
        """A user's or a VNI's record is created once and never changed nor deleted by
        podnet: a change of one this node has seen is another writer's, to undo."""
        with self._mutex:
            first = self._first_seen.get(key)
            if first is None and value is not None:
                self._first_seen[key] = value
                return False
        if first is None or value == first:
            return False
        sync_log.warning(
            "%s was %s by another writer (it held %s): writing it back",
            key,
            "deleted" if value is None else f"changed to {value}",
            first,
        )
        self.tampered(key, revision, first)
        return True

    def tampered(self, key: str, revision: int, value: str) -> None:
        with self._mutex:
            self._restores[key] = (value, revision)
        self.work.put("restore")

    def restore(self) -> int:
        """Write back the records another writer changed (guarded by the revision of the
        change, so of all the nodes that saw it one writes); returns how many."""
        with self._mutex:
            todo, self._restores = self._restores, {}
        done = 0
        for key, (value, rev) in todo.items():
            try:
                r = self.etcd.txn([cmp_mod(key, rev)], [op_put(key, value)])
            except (EtcdUnavailable, EtcdRequestError) as e:
                sync_log.warning("%s: cannot write it back: %s (again later)", key, e)
                with self._mutex:
                    self._restores.setdefault(key, (value, rev))
                continue
            done += int(r.succeeded)
        return done


def store_json(d: dict[str, Any]) -> str:
    """A record's text as the allocator writes it (op_put's encoding)."""
    return json_dumps(d)


class RecordGuard:
    def __init__(
        self,
        etcd: Etcd,
        keys: Keys,
        node: str,
        alloc: Allocator,
        pods: PodTable,
        job_of: Callable[[int, str], JobPod | None],
        lease_id: Callable[[], int],
    ) -> None:
        self.etcd = etcd
        self.keys = keys
        self.node = node
        self.alloc = alloc
        self.pods = pods
        #: this node's own copy of its pod of a job (reconcile.local)
        self.job_of = job_of
        self.lease_id = lease_id
        self.restored = 0  # records written back (metrics, tests)

    def expected(self) -> list[tuple[str, str, str | None, str, Any]]:
        """(key, value, name key, its owner value, the pod's own record compare) of every
        shared record of this node's pods: a record under a job name is this pod's only
        while the job owns the name (name key and owner value; "" for the others)."""
        out: list[tuple[str, str, str | None, str, Any]] = []
        for p in self.pods.all():
            ops: list[Any] = []
            name_key, owner = None, ""
            if p.kind == "job" and p.job_id is not None:
                mine = self.job_of(p.job_id, self.node)
                if mine is None or mine.ip != p.ip:
                    continue
                job = mine.job
                # the job's record (tamper repair of the record itself is RecordRepair's)
                alive = cmp_present(self.keys.job(job.job_id))
                named, by_id, ptr, marker = self.alloc.pod_record_ops(mine)
                name_key, owner = self.keys.name(job.user, job.label), name_owner(job.job_id)
                out.append((*_kv(named), name_key, owner, alive))
                ops = [by_id, ptr, marker, self.alloc.job_ip_op(mine)]
            elif p.kind == "login":
                _login, *ops = self.alloc.login_record_ops(
                    self.node, p.user, p.uid, p.vni, p.ip, self.lease_id(), p.slots
                )
                alive = cmp_present(self.keys.login(self.node, p.user))
            else:
                continue
            out += [(*_kv(op), None, "", alive) for op in ops]
        return out

    def check_once(self) -> int:
        """Compare, then write back what differs; returns how many records were. One
        read-only transaction per chunk of records (etcd refuses a transaction of more
        than its --max-txn-ops compares or reads: a node of many pods needs several)."""
        want = self.expected()
        # a record takes one compare and one read, its job name at most one more of each
        size = max(1, int(getattr(self.etcd, "max_txn_ops", 4096)) // 2)
        done = sum(self._check(want[i : i + size]) for i in range(0, len(want), size))
        self.restored += done
        return done

    def _check(self, want: list[tuple[str, str, str | None, str, Any]]) -> int:
        if not want:
            return 0
        names = {n: o for _k, _v, n, o, _a in want if n is not None}
        compare = [cmp_value(k, v) for k, v, _n, _o, _a in want]
        compare += [cmp_value(n, o) for n, o in names.items()]
        reads = [op_get(k) for k, _v, _n, _o, _a in want] + [op_get(n) for n in names]
        r = self.etcd.txn(compare, [], reads)
        if r.succeeded:
            return 0
        got: dict[str, str] = {}
        for i in range(len(reads)):
            for kv in r.range_kvs(i):
                got[kv.key] = kv.value
        done = 0
        for key, value, name_key, owner, alive in want:
            if name_key is not None and got.get(name_key) != owner:
                continue  # the name is another job's now (the newest job wins): not ours
            if got.get(key) == value:
                continue
            guard = [alive] + ([cmp_value(name_key, owner)] if name_key is not None else [])
            if self.etcd.txn(guard, [op_put(key, value)]).succeeded:
                log.warning("%s was changed or deleted by another writer: written back", key)
                done += 1
        return done

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(VERIFY_INTERVAL):
            try:
                self.check_once()
            except (EtcdUnavailable, EtcdRequestError) as e:
                log.debug("record check: %s", e)
            except Exception:
                log.exception("record check failed")


def _kv(op: Any) -> tuple[str, str]:
    r = op.request_put
    return r.key.decode(), r.value.decode()
