# SPDX-License-Identifier: Apache-2.0
"""Allocation in etcd: user VNIs, node address blocks, job, login and container IPs, DNS
records.

Every allocation is one etcd transaction guarded by `create_revision == 0` on the keys it
creates (`ips/<ip>`, `blocks/<cidr>`, `users/<u>`, `vnis/<v>`, `jobs/<id>`), so two
agents can never hand out the same IP, block or VNI: the loser's transaction fails and it
retries with a fresher view (or, for a job, reads what the winner wrote).

A job is allocated by one of its nodes, in one transaction that writes everything its
pods need (addresses, the job record, its name, every pod's DNS records and marker); the
other nodes take the record from their watch of `jobs/` (`JobRecords`) and send nothing
(docs/agent.md "Allocation").
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from podnet.errors import PodnetError
from podnet.names import Keys, block_from_key, job_label, login_label, ptr_key, zone_path
from podnet.state import quota, store
from podnet.state.ipam import Ipam, PoolExhausted
from podnet.state.store import (
    KV,
    Etcd,
    cmp_absent,
    cmp_value,
    op_count,
    op_delete,
    op_get,
    op_keys,
    op_put,
)

log = logging.getLogger("podnet.alloc")

RECORD_TTL = 30
MAX_ATTEMPTS = 20
#: the nodes after the first that take over a job's allocation when it is late, in turn
BACKUPS = 3
#: seconds any other node waits for the job's record before it takes over
LEADER_WAIT = 3.0


def first_node_grace(nodes: int) -> float:
    """How long the second node of a job waits for the first node's allocation before it
    allocates the job itself (the third node twice as long, ...): well above what the first
    node needs when it is not starved (its transaction grows with the job: `make
    bench-scale`, first_node_committed_ms), well below what a starved node can take."""
    return 0.1 + 0.0004 * nodes


class AllocError(RuntimeError):
    pass


class NoAddress(AllocError):
    """The pod network has no address left for this node (the request, not podnetd, fails)."""


@dataclass
class Job:
    job_id: int
    user: str
    uid: int
    name: str
    label: str
    nodes: list[str]
    ips: list[str]
    vni: int
    revision: int = 0
    created: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "user": self.user,
            "uid": self.uid,
            "name": self.name,
            "label": self.label,
            "nodes": self.nodes,
            "ips": self.ips,
            "vni": self.vni,
            "created": self.created,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], revision: int = 0) -> Job:
        return cls(
            job_id=int(d["job_id"]),
            user=str(d["user"]),
            uid=int(d["uid"]),
            name=str(d.get("name", "")),
            label=str(d["label"]),
            nodes=[str(n) for n in d["nodes"]],
            ips=[str(i) for i in d["ips"]],
            vni=int(d["vni"]),
            revision=revision,
            created=float(d.get("created", 0)),
        )


class JobRecords:
    """The job records of the cluster as this node's watch of `jobs/` delivers them (the
    node layer's sync loop feeds `put`/`remove`; `reset` after a re-list). The allocator
    takes a job from here instead of reading it, and the other nodes of a job wait here
    for the record its allocating node writes. `live` is false until the first `reset`
    (no watch: the allocator reads etcd instead)."""

    def __init__(self) -> None:
        self._jobs: dict[int, Job] = {}
        self._cond = threading.Condition()
        self.live = False

    def reset(self, jobs: list[Job]) -> None:
        with self._cond:
            self._jobs = {j.job_id: j for j in jobs}
            self.live = True
            self._cond.notify_all()

    def put(self, job: Job) -> Job | None:
        """Store `job`; returns the record it replaces."""
        with self._cond:
            old = self._jobs.get(job.job_id)
            self._jobs[job.job_id] = job
            self._cond.notify_all()
            return old

    def remove(self, job_id: int) -> Job | None:
        with self._cond:
            return self._jobs.pop(job_id, None)

    def get(self, job_id: int) -> Job | None:
        with self._cond:
            return self._jobs.get(job_id)

    def all(self) -> list[Job]:
        with self._cond:
            return list(self._jobs.values())

    def wait(self, job_id: int, timeout: float) -> Job | None:
        """The record of `job_id` once it is here, or None after `timeout` seconds."""
        end = time.monotonic() + timeout
        with self._cond:
            while (job := self._jobs.get(job_id)) is None:
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return job


@dataclass(frozen=True)
class _Request:
    """A node's request for a job's record: `Allocator.allocate_job`'s arguments, `me` the
    requesting node (the allocating one, if it comes to that), `defer` where the allocating
    node's last step goes (allocate_job's docstring)."""

    job_id: int
    user: str
    uid: int
    name: str
    nodes: list[str]
    vni: int
    me: str
    defer: list[Callable[[], None]] | None


@dataclass(frozen=True)
class _Plan:
    """An allocation's transaction (`Allocator._allocate`): `compare`, the `sent` ops;
    `whole`: the records under the job name are in it (the name's keys read first);
    `split`: too large, the pods' `records` follow in transactions of their own (and the
    `named` ones after, as when not `whole`)."""

    compare: list[Any]
    sent: list[Any]
    whole: bool
    split: bool
    records: list[Any]
    named: list[Any]


@dataclass
class Allocator:
    etcd: Etcd
    keys: Keys
    ipam: Ipam
    zone: str
    vni_min: int
    vni_max: int
    node_ips: dict[str, str] = field(default_factory=dict)
    #: the job records from this node's watch (None or not live: read from etcd)
    jobs: JobRecords | None = None

    @property
    def slots(self) -> quota.Slots:
        """Users' quota slots (state/quota.py)."""
        return quota.Slots(self.etcd, self.keys)

    # -- users -------------------------------------------------------------------------
    def user_vni(self, user: str, uid: int) -> int:
        """The user's VNI, allocated once for ever (create-if-absent)."""
        for _attempt in range(MAX_ATTEMPTS):
            kv = self.etcd.get(self.keys.user(user))
            if kv:
                return int(kv.json()["vni"])
            span = self.vni_max - self.vni_min + 1
            # start from a hash of the name so that users rarely race for the same VNI
            start = self.vni_min + (sum(user.encode()) * 2654435761 + uid) % span
            taken = {
                int(k.key.rsplit("/", 1)[-1])
                for k in self.etcd.get_prefix(self.keys.prefix("vnis"), keys_only=True)[0]
            }
            if len(taken) >= span:
                raise AllocError("no free VNI left in the configured range")
            vni = start
            while vni in taken:
                vni = self.vni_min + (vni - self.vni_min + 1) % span
            r = self.etcd.txn(
                [cmp_absent(self.keys.user(user)), cmp_absent(self.keys.vni(vni))],
                [
                    op_put(self.keys.user(user), {"vni": vni, "uid": uid}),
                    op_put(self.keys.vni(vni), {"user": user}),
                ],
            )
            if r.succeeded:
                log.info("user %s: VNI %d", user, vni)
                return vni
        raise AllocError(f"could not allocate a VNI for {user} (contention)")

    # -- views -------------------------------------------------------------------------
    def load_view(self, ips_seen: Callable[[list[KV]], None] | None = None) -> int:
        """(Re)load blocks and used IPs into the IPAM view; returns the etcd revision.
        `ips_seen` gets the `ips/` records (read with their values only then)."""
        blocks, rev = self.etcd.get_prefix(self.keys.prefix("blocks"))
        ips, rev2 = self.etcd.get_prefix(self.keys.prefix("ips"), keys_only=ips_seen is None)
        if ips_seen is not None:
            ips_seen(ips)
        with self.ipam.lock:
            self.ipam.used.clear()
            self.ipam.blocks.clear()
            self.ipam.node_blocks.clear()
            self.ipam.claims.clear()
        for kv in blocks:
            self.ipam.set_block(
                ipaddress.IPv4Network(block_from_key(kv.key)), str(kv.json().get("node"))
            )
        self.ipam.mark(k.key.rsplit("/", 1)[-1] for k in ips)
        return max(rev, rev2)

    # -- jobs --------------------------------------------------------------------------
    def get_job(self, job_id: int) -> Job | None:
        kv = self.etcd.get(self.keys.job(job_id))
        return Job.from_json(kv.json(), kv.mod_revision) if kv else None

    def _known_job(self, job_id: int) -> Job | None:
        """The job's record if this node's watch delivered it already."""
        return self.jobs.get(job_id) if self.jobs is not None and self.jobs.live else None

    def allocate_job(
        self,
        job_id: int,
        user: str,
        uid: int,
        name: str,
        nodes: list[str],
        vni: int,
        node_index: int = 0,
        defer: list[Callable[[], None]] | None = None,
    ) -> Job:
        """The job's record, allocated once by one of its nodes; idempotent.

        `defer`: the allocating node's last step (its pods' records under the job name,
        one more transaction) is appended there instead of made; the caller runs it (while
        it wires its pod) before it relies on those records.

        The first node (`node_index` 0) allocates at once (`_allocate`: one transaction
        with the job's addresses, its record and name, and every pod's DNS records and
        marker). Every other node sends nothing: the record reaches it on its watch of
        `jobs/` (`JobRecords`). If the first node is late (a busy node), the next nodes
        take over one after the other (`first_node_grace`), each by taking the job's
        lock (`joblocks/<id>`, one small transaction) before it allocates; after
        `LEADER_WAIT` any node does. Without a watch (`jobs` not live) the record is read
        and watched on etcd (`Etcd.get_or_wait`)."""
        known = self._known_job(job_id)
        if known is not None:
            return _same_job(known, user, nodes)
        me = nodes[node_index]
        req = _Request(job_id, user, uid, name, nodes, vni, me, defer)
        if node_index == 0:
            return self._allocate(req, None)
        rank = min(node_index, BACKUPS + 1)
        wait = rank * first_node_grace(len(nodes)) if rank <= BACKUPS else LEADER_WAIT
        existing = self._await_job(job_id, wait)
        if existing is not None:
            return _same_job(existing, user, nodes)
        return self._take_over(req)

    def _take_over(self, req: _Request) -> Job:
        """The job's first node is late: take the job's lock and allocate it, unless
        someone else has (then wait for their record, and take the lock from them after
        `LEADER_WAIT`)."""
        job_id, user, nodes, me = req.job_id, req.user, req.nodes, req.me
        job_key, lock = self.keys.job(job_id), self.keys.job_lock(job_id)
        mine = store.json_dumps({"node": me, "at": time.time()})
        guard = [cmp_absent(lock)]
        for _attempt in range(MAX_ATTEMPTS):
            r = self.etcd.txn(
                [cmp_absent(job_key), *guard],
                [op_put(lock, mine)],
                [op_get(job_key), op_get(lock)],
            )
            if r.succeeded:
                log.info("job %d: its first node is late: %s allocates it", job_id, me)
                return self._allocate(req, mine)
            got = r.range_kvs(0)
            if got:
                return _same_job(Job.from_json(got[0].json(), got[0].mod_revision), user, nodes)
            held = r.range_kvs(1)
            existing = self._await_job(job_id, LEADER_WAIT)
            if existing is not None:
                return _same_job(existing, user, nodes)
            # the holder did not finish: take the lock from it (unless it moved meanwhile)
            guard = [store.cmp_mod(lock, held[0].mod_revision)] if held else [cmp_absent(lock)]
        raise AllocError(f"could not allocate job {job_id} (contention)")

    def _allocate(self, req: _Request, lock: str | None) -> Job:
        """All of a job in one transaction: its addresses (each node's from that node's
        blocks, a new block claimed in the same transaction for a node that has no free
        address), the job record, the job name (newest job wins: the previous owner's name
        records go), and each pod's DNS records (under the job name and the job id, the
        PTR) and marker `jobnodes/<id>/<node>`. Guarded by the job's absence and its lock
        (absent, or `lock`: ours). When it loses because the job exists, its failure
        branch returns the job (one round trip either way).

        The pods' records under the job name go in the same transaction when it has room
        (`_whole`): instead of deleting the name's records (etcd refuses a put under a
        range the same transaction deletes), it reads their keys first and overwrites
        them; the previous owner's records that none of this job's overwrote (its pods
        beyond this job's count, a container's) go after, while the job owns the name
        (one more transaction, to `defer` like `_name_records`; none when nothing is
        left). Otherwise the name's records are deleted in the transaction and this job's
        follow (`_name_records`). Too large for the server's `--max-txn-ops`: the records
        and markers follow in transactions of their own."""
        job_id, user, name, nodes = req.job_id, req.user, req.name, req.nodes
        job_key = self.keys.job(job_id)
        for attempt in range(MAX_ATTEMPTS):
            if attempt:
                existing = self.get_job(job_id)
                if existing:
                    return _same_job(existing, user, nodes)
            job = Job(
                job_id,
                user,
                req.uid,
                name,
                job_label(name),
                list(nodes),
                [],
                req.vni,
                created=time.time(),
            )
            new_blocks: list[tuple[ipaddress.IPv4Network, str]] = []
            job.ips = self._pick_ips(nodes, new_blocks)
            plan = self._plan(job, new_blocks, lock)
            try:
                r = self.etcd.txn(plan.compare, plan.sent, [op_get(job_key)])
            except store.EtcdRequestError as e:
                self._release(job.ips, new_blocks)
                if store.too_large(e) and not plan.split:
                    self.etcd.max_txn_ops = max(1, len(plan.sent) - 1)
                    continue
                raise
            if r.succeeded:
                self.ipam.mark(job.ips)
                self.ipam.release_pending(job.ips)
                self.ipam.confirm_blocks(blk for blk, _node in new_blocks)
                job.revision = r.revision
                if plan.whole:
                    self._drop_old_name_records(job, r.range_kvs(0), req.defer)
                else:
                    if plan.split:
                        self.etcd.put_many(plan.records)
                    self._name_records(job, plan.named, None if plan.split else req.defer)
                log.debug("job %d: allocated by %s (%d nodes)", job_id, req.me, len(nodes))
                return job
            self._release(job.ips, new_blocks)
            got = r.range_kvs(0)
            if got:  # another node allocated the job
                return _same_job(Job.from_json(got[0].json(), got[0].mod_revision), user, nodes)
            if lock is None and self.etcd.get(self.keys.job_lock(job_id), True) is not None:
                # a late first node: another node took the job over
                existing = self._await_job(job_id, LEADER_WAIT)
                if existing is not None:
                    return _same_job(existing, user, nodes)
                return self._take_over(req)
            # lost a race on an IP or a block: refresh the view and retry
            self.load_view()
            time.sleep(min(0.01 * (attempt + 1), 0.2))
        raise AllocError(f"could not allocate job {job_id} (contention)")

    def _name_records(
        self, job: Job, named: list[Any], defer: list[Callable[[], None]] | None
    ) -> None:
        """The records under the job name, after the name's old records went (etcd refuses
        a put under a range the same transaction deletes), while the job still owns the
        name; appended to `defer` instead if it is a list. (Any ops under the name: also
        the deletes of `_drop_old_name_records`.)"""
        step = max(1, self.etcd.max_txn_ops)
        steps = [
            functools.partial(self._while_name_owner, job, named[i : i + step], [])
            for i in range(0, len(named), step)
        ]
        if defer is not None:
            defer.extend(steps)
            return
        for run in steps:
            run()

    def _plan(
        self, job: Job, new_blocks: list[tuple[ipaddress.IPv4Network, str]], lock: str | None
    ) -> _Plan:
        """What `_allocate` sends for `job` (`_Plan`), by the server's `max_txn_ops`."""
        named, records = self._all_records(job)
        compare, ops = self._job_ops(job, new_blocks, lock, clear_name=False)
        # the name's keys (read first), then everything of the job, its named records too
        sent = [op_keys(self.name_records(job.user, job.label)), *ops, *records, *named]
        if len(sent) <= self.etcd.max_txn_ops:
            return _Plan(compare, sent, True, False, records, named)
        compare, ops = self._job_ops(job, new_blocks, lock)
        if len(ops) + len(records) <= self.etcd.max_txn_ops:
            return _Plan(compare, ops + records, False, False, records, named)
        return _Plan(compare, ops, False, True, records, named)

    def _drop_old_name_records(
        self, job: Job, had: list[KV], defer: list[Callable[[], None]] | None
    ) -> None:
        """The records the job name held before `job` took it (`had`, keys read in the
        allocation's transaction) that none of `job`'s overwrote, deleted while the job owns
        the name; appended to `defer` instead if it is a list."""
        prefix = self.name_records(job.user, job.label)
        mine = {f"{prefix}pod{i}" for i in range(len(job.nodes))}
        old = [op_delete(kv.key) for kv in had if kv.key not in mine]
        self._name_records(job, old, defer)

    def _job_ops(
        self,
        job: Job,
        new_blocks: list[tuple[ipaddress.IPv4Network, str]],
        lock: str | None,
        clear_name: bool = True,
    ) -> tuple[list[Any], list[Any]]:
        """(compare, ops) of a job's allocation: absent job, its lock absent or ours,
        absent addresses and new blocks; the blocks, addresses, record and name (with
        `clear_name`, the name's records are deleted too)."""
        job_key, lock_key = self.keys.job(job.job_id), self.keys.job_lock(job.job_id)
        compare = [
            cmp_absent(job_key),
            cmp_absent(lock_key) if lock is None else cmp_value(lock_key, lock),
        ]
        ops: list[Any] = []
        for blk, node in new_blocks:
            compare.append(cmp_absent(self.keys.block(str(blk))))
            ops.append(op_put(self.keys.block(str(blk)), {"node": node}))
        for i, ip in enumerate(job.ips):
            compare.append(cmp_absent(self.keys.ip(ip)))
            ops.append(self.job_ip_op(job, i))
        ops.append(op_put(job_key, job.to_json()))
        # the job name is this job's now: the previous owner's records go with it
        if clear_name:
            ops.append(op_delete(self.name_records(job.user, job.label), prefix=True))
        ops.append(op_put(self.keys.name(job.user, job.label), name_owner(job.job_id)))
        if lock is not None:
            ops.append(op_delete(lock_key))
        return compare, ops

    def _await_job(self, job_id: int, timeout: float) -> Job | None:
        """The job record once another node wrote it, or None after `timeout` seconds:
        from this node's watch of `jobs/` (no request), else a read and a watch on the
        record (`Etcd.get_or_wait`), else (a store without watches: the unit tests'
        in-memory etcd) short reads."""
        if self.jobs is not None and self.jobs.live:
            return self.jobs.wait(job_id, timeout)
        wait = getattr(self.etcd, "get_or_wait", None)
        if wait is not None:
            kv = wait(self.keys.job(job_id), timeout)
            return Job.from_json(kv.json(), kv.mod_revision) if kv else None
        end = time.monotonic() + timeout
        pause = 0.002
        while True:
            job = self.get_job(job_id)
            if job is not None or time.monotonic() >= end:
                return job
            time.sleep(min(pause, max(0.0, end - time.monotonic())))
            pause = min(pause * 2, 0.064)

    def name_records(self, user: str, label: str) -> str:
        """SkyDNS prefix of a job name's records (`<label>.<user>.<zone>`)."""
        return f"{zone_path(self.zone)}/{user}/{label}/"

    def _pod_records(self, job: Job, index: int, node: str) -> tuple[str, list[str]]:
        """Keys of one pod's publication: (its record under the job name, [its record
        under the job id, its PTR, the node's marker])."""
        return f"{self.name_records(job.user, job.label)}pod{index}", [
            f"{zone_path(self.zone)}/{job.user}/{job.job_id}/pod{index}",
            ptr_key(job.ips[index]),
            self.keys.job_node(job.job_id, node),
        ]

    def _while_name_owner(self, job: Job, named: Any, common: list[Any]) -> None:
        """`named` (one op, a list of them, or None) + `common` if the job still owns its
        name, else `common` only."""
        mine = named if isinstance(named, list) else [] if named is None else [named]
        self.etcd.txn(
            [cmp_value(self.keys.name(job.user, job.label), name_owner(job.job_id))],
            [*mine, *common],
            common,
        )

    def _all_records(self, job: Job) -> tuple[list[Any], list[Any]]:
        """(the pods' records under the job name, everything else of every pod)."""
        named: list[Any] = []
        rest: list[Any] = []
        for i, node in enumerate(job.nodes):
            n, *others = self.pod_record_ops(job, i, node)
            named.append(n)
            rest += others
        return named, rest

    def job_ip_op(self, job: Job, index: int) -> Any:
        """The address record of pod `index` (`ips/<ip>`: job, node, VNI)."""
        node = json.dumps(job.nodes[index])
        return op_put(
            self.keys.ip(job.ips[index]),
            f'{{"job_id":{job.job_id},"node":{node},"vni":{job.vni}}}',
        )

    def pod_record_ops(self, job: Job, index: int, node: str) -> list[Any]:
        """Pod `index`'s DNS records (under the job name, the job id, the PTR) and its
        node's marker, as the allocating node writes them while the job owns its name."""
        named, (by_id, ptr, marker) = self._pod_records(job, index, node)
        rec = store.json_dumps({"host": job.ips[index], "ttl": RECORD_TTL})
        host = f"pod{index}.{job.job_id}.{job.user}.{self.zone}"
        return [
            op_put(named, rec),
            op_put(by_id, rec),
            op_put(ptr, {"host": host, "ttl": RECORD_TTL}),
            op_put(marker, "1"),
        ]

    def publish_pod(self, job: Job, index: int, node: str) -> None:
        """This node's pod's records and marker again, in one round trip (adoption after
        a restart, a job written back): the record under the job name only while the job
        owns it."""
        named, *common = self.pod_record_ops(job, index, node)
        self._while_name_owner(job, named, common)

    def unpublish_pod(self, job: Job, index: int, node: str) -> None:
        """Undo `publish_pod` (this node's pod could not be built)."""
        named, keys = self._pod_records(job, index, node)
        self._while_name_owner(job, op_delete(named), [op_delete(k) for k in keys])

    def leave_job(self, job_id: int, node: str) -> None:
        """This node's pod of the job is gone: drop its marker; the last node to leave
        releases the job (deletes are linearized: at least one node sees nobody left)."""
        r = self.etcd.txn(
            [],
            [
                op_delete(self.keys.job_node(job_id, node)),
                op_count(self.keys.prefix(f"jobnodes/{job_id}")),
                op_get(self.keys.job(job_id)),
            ],
        )
        if r.range_count(1) == 0:
            kvs = r.range_kvs(2)
            if kvs:
                self.release_job(Job.from_json(kvs[0].json(), kvs[0].mod_revision))

    def reclaim_job(self, job: Job, running: Callable[[int], bool]) -> Job:
        """Write back the records of a live job that etcd lost (restored to a snapshot
        older than the job: docs/admin-guide.md "Backup and restore"), from a node's own
        copy of the job record; idempotent, and another node of the job may do the same.

        Create-if-absent on everything: the job record, its addresses, the address blocks
        (for the nodes the record names), the user's VNI and, unless a newer job owns it,
        the job name. An address whose `ips/` record names a job that no longer runs
        (`running`) is a stale record of the snapshot (that job had released it before this
        one was allocated): that job's records are released first. An address record or a
        job name that is still the job's own (another writer deleted only the job record) is
        kept as it is, with every node's records under the name. Anything another owner
        holds (an address of a running job or a login, a block of another node, the VNI of
        another user) is never taken: AllocError says what. Returns the job record in
        etcd (this one, or the same job written by another of its nodes)."""
        for attempt in range(MAX_ATTEMPTS):
            existing = self.get_job(job.job_id)
            if existing:
                if existing.ips != job.ips or existing.vni != job.vni:
                    raise AllocError(f"job {job.job_id} is in etcd with other addresses")
                return _same_job(existing, job.user, job.nodes)
            compare = [cmp_absent(self.keys.job(job.job_id))]
            ops: list[Any] = []
            self._reclaim_user(job, compare, ops)
            blocks: dict[str, str] = {}
            stale = self._reclaim_addresses(job, running, blocks, compare, ops)
            if stale is not None:
                log.warning(
                    "job %d: releasing the stale records of job %d (not running) that hold "
                    "its address",
                    job.job_id,
                    stale.job_id,
                )
                self.release_job(stale)
                continue
            ops.append(op_put(self.keys.job(job.job_id), job.to_json()))
            self._reclaim_name(job, compare, ops)
            r = self.etcd.txn(compare, ops)
            if r.succeeded:
                self.ipam.mark(job.ips)
                for blk, node in blocks.items():
                    self.ipam.set_block(ipaddress.IPv4Network(blk), node)
                job.revision = r.revision
                return job
            time.sleep(min(0.01 * (attempt + 1), 0.2))
        raise AllocError(f"could not write job {job.job_id} back (contention)")

    def _reclaim_user(self, job: Job, compare: list[Any], ops: list[Any]) -> None:
        """The user's VNI as the job had it (created if absent, never another's)."""
        ukv = self.etcd.get(self.keys.user(job.user))
        if ukv is not None:
            if int(ukv.json()["vni"]) != job.vni:
                raise AllocError(f"{job.user} has VNI {ukv.json()['vni']} now, not {job.vni}")
            return
        vkv = self.etcd.get(self.keys.vni(job.vni))
        if vkv is not None:
            raise AllocError(f"VNI {job.vni} of {job.user} is taken: {vkv.value}")
        compare += [cmp_absent(self.keys.user(job.user)), cmp_absent(self.keys.vni(job.vni))]
        ops += [
            op_put(self.keys.user(job.user), {"vni": job.vni, "uid": job.uid}),
            op_put(self.keys.vni(job.vni), {"user": job.user}),
        ]

    def _reclaim_addresses(
        self,
        job: Job,
        running: Callable[[int], bool],
        blocks: dict[str, str],
        compare: list[Any],
        ops: list[Any],
    ) -> Job | None:
        """The job's addresses and their blocks (created if absent); returns a job that
        no longer runs whose stale record holds one of them (to release first)."""
        for i, (node, ip) in enumerate(zip(job.nodes, job.ips, strict=True)):
            blk = str(ipaddress.IPv4Network(f"{ip}/{self.ipam.block_prefix}", strict=False))
            if blk not in blocks:
                bkv = self.etcd.get(self.keys.block(blk))
                if bkv is None:
                    compare.append(cmp_absent(self.keys.block(blk)))
                    ops.append(op_put(self.keys.block(blk), {"node": node}))
                elif bkv.json().get("node") != node:
                    raise AllocError(f"block {blk} of {ip} belongs to {bkv.json().get('node')}")
                blocks[blk] = node
            ikv = self.etcd.get(self.keys.ip(ip))
            if ikv is not None:
                owner = _json_or_none(ikv.value)
                other = owner.get("job_id") if isinstance(owner, dict) else None
                if other == job.job_id:
                    # the job's own address record (only the job record was lost: another
                    # writer deleted it): kept, in the allocator's form, if unchanged meanwhile
                    compare.append(cmp_value(self.keys.ip(ip), ikv.value))
                    ops.append(self.job_ip_op(job, i))
                    continue
                if isinstance(other, int) and not running(other):
                    stale = self.get_job(other)
                    if stale is not None and ip in stale.ips:
                        return stale
                raise AllocError(f"address {ip} is taken: {ikv.value}")
            compare.append(cmp_absent(self.keys.ip(ip)))
            ops.append(self.job_ip_op(job, i))
        return None

    def _reclaim_name(self, job: Job, compare: list[Any], ops: list[Any]) -> None:
        """The job name is the job's again unless a newer job owns it (newest job wins,
        as in allocate_job)."""
        name_key = self.keys.name(job.user, job.label)
        nkv = self.etcd.get(name_key)
        holder = _json_or_none(nkv.value) if nkv else None
        hid = holder.get("job_id") if isinstance(holder, dict) else None
        if isinstance(hid, int) and hid > job.job_id:
            return
        if nkv is not None and hid == job.job_id:
            # the job still owns its name: its records there (every node's) stay
            compare.append(cmp_value(name_key, nkv.value))
            return
        compare.append(cmp_value(name_key, nkv.value) if nkv else cmp_absent(name_key))
        ops.append(op_delete(self.name_records(job.user, job.label), prefix=True))
        ops.append(op_put(name_key, name_owner(job.job_id)))

    def _pick_ips(
        self, nodes: list[str], new_blocks: list[tuple[ipaddress.IPv4Network, str]]
    ) -> list[str]:
        """One candidate address per node, from that node's blocks (claiming new ones)."""
        ips: list[str] = []
        try:
            for node in nodes:
                ip = self.next_address(node, new_blocks)
                if ip is None:
                    raise AllocError(f"no address in new block {new_blocks[-1][0]}")
                ips.append(ip)
        except PoolExhausted:
            self._release(ips, new_blocks)
            raise AllocError("the pod network has no free address block") from None
        except AllocError:
            self._release(ips, new_blocks)
            raise
        return ips

    def next_address(
        self, node: str, new_blocks: list[tuple[ipaddress.IPv4Network, str]]
    ) -> str | None:
        """A candidate address of the node's blocks; when they are full, a new block is
        claimed (appended to new_blocks; PoolExhausted when none is left) and asked again:
        None only if even the new block has no free address."""
        ip = self.ipam.candidate(node)
        if ip is None:
            self._claim_block(node, new_blocks)
            ip = self.ipam.candidate(node)
        return ip

    def _claim_block(
        self, node: str, new_blocks: list[tuple[ipaddress.IPv4Network, str]]
    ) -> ipaddress.IPv4Network:
        blk = self.ipam.claim_block(node)
        new_blocks.append((blk, node))
        return blk

    def _release(self, ips: list[str], new_blocks: list[tuple[ipaddress.IPv4Network, str]]) -> None:
        self.ipam.release_pending(ips)
        self.ipam.unclaim_blocks(blk for blk, _node in new_blocks)

    def release_job(self, job: Job) -> None:
        """Delete a job, its IPs, markers and DNS records (the name only if still ours)."""
        base = zone_path(self.zone) + f"/{job.user}"
        ops = [
            op_delete(self.keys.job(job.job_id)),
            op_delete(self.keys.prefix(f"jobnodes/{job.job_id}"), prefix=True),
            op_delete(f"{base}/{job.job_id}/", prefix=True),
        ]
        for ip in job.ips:
            ops.append(op_delete(self.keys.ip(ip)))
            ops.append(op_delete(ptr_key(ip)))
        name_key = self.keys.name(job.user, job.label)
        # the job-name records belong to the newest live job with that name
        name_ops = [op_delete(name_key), op_delete(self.name_records(job.user, job.label), True)]
        owner = [cmp_value(name_key, name_owner(job.job_id))]
        if len(ops) + len(name_ops) <= self.etcd.max_txn_ops:
            with contextlib.suppress(store.EtcdRequestError):  # too many ops: in batches
                self.etcd.txn(owner, ops + name_ops, ops)
                self.ipam.mark(job.ips, used=False)
                return
        self.etcd.put_many(ops)
        self.etcd.txn(owner, name_ops)
        self.ipam.mark(job.ips, used=False)

    # -- one address of a node (logins, containers) --------------------------------------
    def _place(
        self,
        node: str,
        records: Callable[[str], tuple[list[Any], list[Any]]],
        reads: list[Any],
    ) -> tuple[str | None, store.TxnResult]:
        """One attempt at an address of `node`'s blocks (claiming a block if they are full)
        and its records (`records(ip)`: what else to compare, what to put), in one
        transaction that creates the address if absent; (the address, or None when the
        transaction lost, and its result: `reads` are read when it lost)."""
        new_blocks: list[tuple[ipaddress.IPv4Network, str]] = []
        try:
            ip = self.next_address(node, new_blocks)
        except PoolExhausted:
            self._release([], new_blocks)
            raise NoAddress("the pod network has no free address block") from None
        if ip is None:
            raise NoAddress("no free address")
        compare, puts = records(ip)
        compare = [*compare, cmp_absent(self.keys.ip(ip))]
        ops = []
        for blk, n in new_blocks:
            compare.append(cmp_absent(self.keys.block(str(blk))))
            ops.append(op_put(self.keys.block(str(blk)), {"node": n}))
        r = self.etcd.txn(compare, ops + puts, reads)
        if r.succeeded:
            self.ipam.mark([ip])
            self.ipam.release_pending([ip])
            self.ipam.confirm_blocks(blk for blk, _n in new_blocks)
            return ip, r
        self._release([ip], new_blocks)
        return None, r

    # -- logins ------------------------------------------------------------------------
    def allocate_login(
        self,
        node: str,
        user: str,
        uid: int,
        vni: int,
        lease: int,
        limits: dict[str, int] | None = None,
    ) -> tuple[str, dict[str, int]]:
        """The login IP of `user` on `node` (on `lease`) and the quota slots it holds;
        idempotent. `limits` (kind -> limit: `logins`, `addresses`; None: not limited)
        are taken in the same transaction (QuotaExceeded when one is full)."""
        key = self.keys.login(node, user)
        for attempt in range(MAX_ATTEMPTS):
            kv = self.etcd.get(key)
            if kv:
                d = kv.json()
                return str(d["ip"]), quota.slots_of(d)
            claim = self.slots.claim(user, limits or {}, key, lease)

            def records(ip: str, claim: quota.Claim = claim) -> tuple[list[Any], list[Any]]:
                ops = self.login_record_ops(node, user, uid, vni, ip, lease, claim.slots)
                return [cmp_absent(key), *claim.compare], [*claim.ops, *ops]

            ip, _r = self._place(node, records, [])
            if ip is not None:
                return ip, claim.slots
            self.load_view()
            time.sleep(min(0.01 * (attempt + 1), 0.2))
        raise AllocError(f"could not allocate a login address for {user} (contention)")

    def login_record_ops(
        self,
        node: str,
        user: str,
        uid: int,
        vni: int,
        ip: str,
        lease: int,
        slots: dict[str, int] | None = None,
    ) -> list[Any]:
        """The keys of a login pod, all on the node's lease: `logins/<node>/<user>` (with
        the quota slots it holds), its IP, `<node>.login.<user>.<zone>` and the PTR."""
        label = login_label(node)
        record: dict[str, Any] = {"ip": ip, "uid": uid, "vni": vni}
        if slots:
            record["slots"] = slots
        return [
            op_put(self.keys.login(node, user), record, lease),
            op_put(
                self.keys.ip(ip), {"kind": "login", "node": node, "user": user, "vni": vni}, lease
            ),
            op_put(
                f"{zone_path(self.zone)}/{user}/login/{label}",
                {"host": ip, "ttl": RECORD_TTL},
                lease,
            ),
            op_put(
                ptr_key(ip), {"host": f"{label}.login.{user}.{self.zone}", "ttl": RECORD_TTL}, lease
            ),
        ]

    def republish_login(
        self,
        node: str,
        user: str,
        uid: int,
        vni: int,
        ip: str,
        lease: int,
        slots: dict[str, int],
    ) -> dict[str, int]:
        """A live login pod's records again (adoption after a restart, the node's new
        lease), with its quota slots (kept, or others if another login took them while
        the records were gone: a live pod is never refused). Returns the slots."""
        key = self.keys.login(node, user)
        for attempt in range(MAX_ATTEMPTS):
            kv = self.etcd.get(key)
            held = quota.slots_of(kv.json()) if kv else {}
            claim = self.slots.keep(user, held or slots, key, lease)
            r = self.etcd.txn(
                claim.compare,
                [*claim.ops, *self.login_record_ops(node, user, uid, vni, ip, lease, claim.slots)],
            )
            if r.succeeded:
                return claim.slots
            time.sleep(min(0.01 * (attempt + 1), 0.2))
        raise AllocError(f"could not write the login records of {user} (contention)")

    def release_login(self, node: str, user: str) -> None:
        key = self.keys.login(node, user)
        kv = self.etcd.get(key)
        if not kv:
            return
        d = kv.json()
        ip = str(d["ip"])
        self.etcd.put_many(
            [
                op_delete(key),
                op_delete(self.keys.ip(ip)),
                op_delete(ptr_key(ip)),
                op_delete(f"{zone_path(self.zone)}/{user}/login/{login_label(node)}"),
                *self.slots.release_ops(user, quota.slots_of(d)),
            ]
        )
        self.ipam.mark([ip], used=False)

    # -- containers --------------------------------------------------------------------
    def allocate_container(
        self,
        node: str,
        ns: str,
        user: str,
        vni: int,
        dns_name: str,
        record: dict[str, Any],
        limits: dict[str, int] | None = None,
    ) -> str:
        """An address of this node's block for the container `ns` and its records, one
        transaction (the address and the name are created if absent); returns the IP,
        also set as `record["ip"]` (the container's record, `Keys.container`).
        `dns_name`: `<label>.<user>.<zone>` (or "": none). `limits` (kind -> limit:
        `containers`, `addresses`; None: not limited): quota slots taken in the same
        transaction (QuotaExceeded when one is full), set as `record["slots"]`."""
        label = _label(dns_name)
        name_key = self.keys.name(user, label) if label else ""
        owner = self.keys.container(node, ns)

        for attempt in range(MAX_ATTEMPTS):
            claim = self.slots.claim(user, limits or {}, owner)
            if claim.slots:
                record["slots"] = claim.slots

            def records(ip: str, claim: quota.Claim = claim) -> tuple[list[Any], list[Any]]:
                record["ip"] = ip
                claims = [op_put(name_key, container_owner(ns, node))] if name_key else []
                ops = self.container_record_ops(node, ns, user, vni, ip, dns_name, record)
                compare = [cmp_absent(name_key)] if name_key else []
                return [*compare, *claim.compare], [*claims, *claim.ops, *ops]

            ip, r = self._place(node, records, [op_get(name_key)] if name_key else [])
            if ip is not None:
                return ip
            if name_key and r.range_kvs(0):
                raise PodnetError(
                    "EEXIST", f"the name {label}.{user}.{self.zone} is taken (a job or container)"
                )
            self.load_view()
            time.sleep(min(0.01 * (attempt + 1), 0.2))
        raise AllocError(f"could not allocate a container address for {user} (contention)")

    def container_record_ops(
        self,
        node: str,
        ns: str,
        user: str,
        vni: int,
        ip: str,
        dns_name: str,
        record: dict[str, Any],
    ) -> list[Any]:
        """A container's keys: its IP, its record, `<label>/ctr` of its DNS name and the PTR."""
        label = _label(dns_name)
        ops = [
            op_put(
                self.keys.ip(ip),
                {"kind": "container", "node": node, "user": user, "vni": vni, "ns": ns},
            ),
            op_put(self.keys.container(node, ns), record),
        ]
        if label:
            ops.append(op_put(self._ctr_key(user, label), {"host": ip, "ttl": RECORD_TTL}))
            ops.append(op_put(ptr_key(ip), {"host": dns_name, "ttl": RECORD_TTL}))
        return ops

    def get_container(self, node: str, ns: str) -> dict[str, Any] | None:
        """The record of the container `ns` on `node` (None: etcd has none)."""
        kv = self.etcd.get(self.keys.container(node, ns))
        return None if kv is None else dict(kv.json())

    def republish_container(
        self,
        node: str,
        ns: str,
        user: str,
        vni: int,
        ip: str,
        dns_name: str,
        record: dict[str, Any],
    ) -> None:
        """The container's records again (adopted after a restart), with the quota slots
        `record` lists (kept, or others if they were taken meanwhile: a live container
        is never refused; `record["slots"]` is updated)."""
        owner = self.keys.container(node, ns)
        for attempt in range(MAX_ATTEMPTS):
            claim = self.slots.keep(user, quota.slots_of(record), owner)
            if claim.slots:
                record["slots"] = claim.slots
            ops = self.container_record_ops(node, ns, user, vni, ip, dns_name, record)
            if self.etcd.txn(claim.compare, [*claim.ops, *ops]).succeeded:
                return
            time.sleep(min(0.01 * (attempt + 1), 0.2))
        raise AllocError(f"could not write the records of container {ns} back (contention)")

    def container_names(self, node: str) -> list[str]:
        """The containers etcd has records of on `node` (their netns names)."""
        prefix = self.keys.container(node, "")
        kvs = self.etcd.get_prefix(prefix, keys_only=True)[0]
        return [kv.key[len(prefix) :] for kv in kvs]

    def release_container(
        self,
        node: str,
        ns: str,
        user: str,
        ip: str,
        dns_name: str,
        slots: dict[str, int] | None = None,
    ) -> None:
        """Delete a container's records, its name (while it is the container's) and the
        quota slots it holds."""
        label = _label(dns_name)
        ops = [
            op_delete(self.keys.ip(ip)),
            op_delete(self.keys.container(node, ns)),
            op_delete(ptr_key(ip)),
            *self.slots.release_ops(user, slots or {}),
        ]
        if label:
            ops.append(op_delete(self._ctr_key(user, label)))
            name_key = self.keys.name(user, label)
            # one round trip: the name's claim goes only while it is this container's
            self.etcd.txn(
                [cmp_value(name_key, container_owner(ns, node))], [*ops, op_delete(name_key)], ops
            )
        else:
            self.etcd.put_many(ops)
        self.ipam.mark([ip], used=False)

    def _ctr_key(self, user: str, label: str) -> str:
        """SkyDNS record of a container's name (`<label>.<user>.<zone>`)."""
        return f"{zone_path(self.zone)}/{user}/{label}/ctr"


def _label(dns_name: str) -> str:
    return dns_name.split(".", 1)[0] if dns_name else ""


def container_owner(ns: str, node: str) -> str:
    """Value of `names/<user>/<label>` a container holds (compared verbatim)."""
    return store.json_dumps({"container": ns, "node": node})


def name_owner(job_id: int) -> str:
    """Value of `names/<user>/<label>`: the job that owns the name (compared verbatim)."""
    return store.json_dumps({"job_id": job_id})


def _json_or_none(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return None


def _same_job(job: Job, user: str, nodes: list[str]) -> Job:
    if job.user != user or job.nodes != nodes:
        raise AllocError(f"job {job.job_id} already exists for another user or node list")
    return job
