# SPDX-License-Identifier: Apache-2.0
"""What another writer changed in the records etcd lets every node write, undone by this
node (docs/security.md, "etcd authentication": what etcd's prefix permissions cannot
refuse is detected and undone by its owner). The one room of tamper repair:

* `RecordRepair`, on the watches (`etcd_sync.EtcdSync` screens each record through it
  before the view takes it): a user's VNI (`users/`, `vnis/`: created once, never changed
  nor deleted by podnet) is put back as this node first saw it, and a block that holds a
  pod of this node as this node's. The write back is guarded by the revision the change
  had, so of all the nodes that saw it one writes; it runs in the sync loop's pass
  ('restore' in its queue).
* `RecordGuard`, every `VERIFY_INTERVAL` seconds: the shared records of this node's own
  pods. Every node may write the records that allocations share (addresses, DNS records,
  markers, jobs' records: their keys are by address, by user or by job, not by node), so
  a node with a stolen certificate could change or delete those of another node's pods.
  The owner compares them all with what they must hold, in read-only transactions of at
  most etcd's --max-txn-ops compares (the failure branch returns them: no second round
  trip to find the difference), and writes back the ones that differ: its jobs' records
  (as its own copy holds them, reconcile.local's: the same but for the time it was made,
  `Job.same_as`; guarded by the revision of the change, so of the job's nodes one
  writes), its job pods' address records, markers and DNS records (under the job id, the
  PTR, and under the job name while the job owns it); its login pods' address, DNS and
  PTR records. A write back is guarded by the pod's own record (the job's record, the
  login record), so a pod released meanwhile is never written back; a job's record that
  is gone is written back by the reconciler (`on_job_lost`: `Reconciler.reclaim_soon`,
  with the records etcd lost), which first asks Slurm whether the job still runs.

Each write back is logged (a warning: someone else wrote there).
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from podnet.names import Keys
from podnet.node.pods import PodTable
from podnet.node.workqueue import SyncQueue
from podnet.state.alloc import Allocator, Job, JobPod, name_owner
from podnet.state.etcdops import (
    KV,
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
    Record,
    UserRecord,
    VniRecord,
    record_of,
)
from podnet.state.watchrecords import job_of as read_job

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
        node: str = "",
        own_ips: Callable[[], Iterable[str]] = lambda: (),
    ) -> None:
        """`work`: 'restore' is queued there; `node`: this node, `own_ips`: the addresses
        of its pods (the blocks that hold one are kept its own)."""
        self.etcd = etcd
        self.work = work
        self.node = node
        self.own_ips = own_ips
        #: the lock of the two tables below
        self._mutex = threading.Lock()
        #: users' and VNIs' records as this node first saw them (key -> value)
        self._first_seen: dict[str, str] = {}
        #: records to write back (key -> (value, the revision of the change))
        self._restores: dict[str, tuple[str, int]] = {}

    def screen(self, rec: Record) -> Record | None:
        """The record as this node takes it into the view: a block of this node as its
        own, a changed user's record not at all (None); what differs is noted to be
        written back."""
        if isinstance(rec, UserRecord | VniRecord):
            return None if self.changed_once_created(rec.key, rec.value, rec.revision) else rec
        if isinstance(rec, BlockRecord):
            mine = self.block_moved(rec)
            return rec if mine is None else replace(rec, node=self.node, value=mine)
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
        """After a whole read: the users' and VNIs' records, the blocks."""
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


@dataclass(frozen=True)
class Expected:
    """A shared record of one of this node's pods: what `key` must hold (`value`). A record
    under a job name is the pod's only while the job owns the name (`name_key` holds
    `owner`); `alive` compares that the pod's own record is there (a write back is guarded
    by it); `job`: this node's copy of the job, for the job's record itself."""

    key: str
    value: str
    alive: Any = None
    name_key: str | None = None
    owner: str = ""
    job: Job | None = None


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
        on_job_lost: Callable[[list[int]], None] = lambda job_ids: None,
    ) -> None:
        """`on_job_lost`: jobs with a pod here whose record is gone (the reconciler writes
        them back if Slurm runs them)."""
        self.etcd = etcd
        self.keys = keys
        self.node = node
        self.alloc = alloc
        self.pods = pods
        #: this node's own copy of its pod of a job (reconcile.local)
        self.job_of = job_of
        self.lease_id = lease_id
        self.on_job_lost = on_job_lost
        self.restored = 0  # records written back (metrics, tests)

    def expected(self) -> list[Expected]:
        """Every shared record of this node's pods, with what it must hold."""
        out: list[Expected] = []
        for p in self.pods.all():
            ops: list[Any] = []
            if p.kind == "job" and p.job_id is not None:
                mine = self.job_of(p.job_id, self.node)
                if mine is None or mine.ip != p.ip:
                    continue
                job = mine.job
                key = self.keys.job(job.job_id)
                out.append(Expected(key, store_json(job.to_json()), job=job))
                alive = cmp_present(key)
                named, by_id, ptr, marker = self.alloc.pod_record_ops(mine)
                name_key, owner = self.keys.name(job.user, job.label), name_owner(job.job_id)
                out.append(Expected(*_kv(named), alive, name_key, owner))
                ops = [by_id, ptr, marker, self.alloc.job_ip_op(mine)]
            elif p.kind == "login":
                _login, *ops = self.alloc.login_record_ops(
                    self.node, p.user, p.uid, p.vni, p.ip, self.lease_id(), p.slots
                )
                alive = cmp_present(self.keys.login(self.node, p.user))
            else:
                continue
            out += [Expected(*_kv(op), alive) for op in ops]
        return out

    def check_once(self) -> int:
        """Compare, then write back what differs; returns how many records were. One
        read-only transaction per chunk of records (etcd refuses a transaction of more
        than its --max-txn-ops compares or reads: a node of many pods needs several)."""
        want = self.expected()
        # a record takes one compare and one read, its job name at most one more of each
        size = max(1, self.etcd.max_txn_ops // 2)
        lost: list[int] = []
        done = sum(self._check(want[i : i + size], lost) for i in range(0, len(want), size))
        self.restored += done
        if lost:
            log.warning("jobs %s: their records were deleted while their pods run here", lost)
            self.on_job_lost(lost)
        return done

    def _check(self, want: list[Expected], lost: list[int]) -> int:
        if not want:
            return 0
        names = {e.name_key: e.owner for e in want if e.name_key is not None}
        compare = [cmp_value(e.key, e.value) for e in want]
        compare += [cmp_value(n, o) for n, o in names.items()]
        reads = [op_get(e.key) for e in want] + [op_get(n) for n in names]
        r = self.etcd.txn(compare, [], reads)
        if r.succeeded:
            return 0
        got: dict[str, KV] = {kv.key: kv for i in range(len(reads)) for kv in r.range_kvs(i)}
        done = 0
        for e in want:
            kv = got.get(e.key)
            if e.job is not None:
                if kv is None:
                    lost.append(e.job.job_id)
                elif not self._same_job(kv, e.job):
                    done += self._put(e.key, e.value, cmp_mod(e.key, kv.mod_revision))
                continue
            if e.name_key is not None and getattr(got.get(e.name_key), "value", None) != e.owner:
                continue  # the name is another job's now (the newest job wins): not ours
            if kv is not None and kv.value == e.value:
                continue
            guard = [e.alive] + ([cmp_value(e.name_key, e.owner)] if e.name_key else [])
            done += self._put(e.key, e.value, *guard)
        return done

    @staticmethod
    def _same_job(kv: KV, mine: Job) -> bool:
        """A job's record as etcd holds it is this node's copy but for the time it was made
        (an older podnetd's record, with its pods in it, too)."""
        theirs = read_job(kv)
        return theirs is not None and theirs.same_as(mine)

    def _put(self, key: str, value: str, *guard: Any) -> bool:
        if not self.etcd.txn(list(guard), [op_put(key, value)]).succeeded:
            return False
        log.warning("%s was changed or deleted by another writer: written back", key)
        return True

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
