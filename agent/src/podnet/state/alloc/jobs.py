# SPDX-License-Identifier: Apache-2.0
"""A job's allocation: by its first node in one transaction, or by the next nodes in turn
when the first is late (podnet.state.alloc; docs/agent.md "Allocation")."""

from __future__ import annotations

import functools
import ipaddress
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from podnet.names import job_label
from podnet.state import etcdops, store
from podnet.state.alloc.common import (
    MAX_ATTEMPTS,
    AllocError,
    Job,
    log,
    name_owner,
    pause,
    same_job,
)
from podnet.state.alloc.records import PodRecords
from podnet.state.etcdops import KV, cmp_absent, cmp_value, op_delete, op_get, op_keys, op_put
from podnet.state.ipam import PoolExhausted

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


class JobAllocation(PodRecords):
    """A job's allocation (part of `Allocator`)."""

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
            return same_job(known, user, nodes)
        me = nodes[node_index]
        req = _Request(job_id, user, uid, name, nodes, vni, me, defer)
        if node_index == 0:
            return self._allocate(req, None)
        rank = min(node_index, BACKUPS + 1)
        wait = rank * first_node_grace(len(nodes)) if rank <= BACKUPS else LEADER_WAIT
        existing = self._await_job(job_id, wait)
        if existing is not None:
            return same_job(existing, user, nodes)
        return self._take_over(req)

    def _take_over(self, req: _Request) -> Job:
        """The job's first node is late: take the job's lock and allocate it, unless
        someone else has (then wait for their record, and take the lock from them after
        `LEADER_WAIT`)."""
        job_id, user, nodes, me = req.job_id, req.user, req.nodes, req.me
        job_key, lock = self.keys.job(job_id), self.keys.job_lock(job_id)
        mine = etcdops.json_dumps({"node": me, "at": time.time()})
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
                return same_job(Job.from_json(got[0].json(), got[0].mod_revision), user, nodes)
            held = r.range_kvs(1)
            existing = self._await_job(job_id, LEADER_WAIT)
            if existing is not None:
                return same_job(existing, user, nodes)
            # the holder did not finish: take the lock from it (unless it moved meanwhile)
            guard = [etcdops.cmp_mod(lock, held[0].mod_revision)] if held else [cmp_absent(lock)]
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
                    return same_job(existing, user, nodes)
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
                return same_job(Job.from_json(got[0].json(), got[0].mod_revision), user, nodes)
            if lock is None and self.etcd.get(self.keys.job_lock(job_id), True) is not None:
                # a late first node: another node took the job over
                existing = self._await_job(job_id, LEADER_WAIT)
                if existing is not None:
                    return same_job(existing, user, nodes)
                return self._take_over(req)
            # lost a race on an IP or a block: refresh the view and retry
            self.load_view()
            pause(attempt)
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
