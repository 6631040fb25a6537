# SPDX-License-Identifier: Apache-2.0
"""A live job's records written back when etcd lost them (restored to an older snapshot:
docs/admin-guide.md "Backup and restore")."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from podnet.state.alloc.common import (
    MAX_ATTEMPTS,
    AllocError,
    Job,
    json_or_none,
    log,
    name_owner,
    pause,
    same_job,
)
from podnet.state.alloc.records import PodRecords
from podnet.state.etcdops import cmp_absent, cmp_value, op_delete, op_put


class JobReclaim(PodRecords):
    """A lost job written back (part of `Allocator`)."""

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
                return same_job(existing, job.user, job.nodes)
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
            pause(attempt)
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
                owner = json_or_none(ikv.value)
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
        holder = json_or_none(nkv.value) if nkv else None
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
