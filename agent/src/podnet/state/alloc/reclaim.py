# SPDX-License-Identifier: Apache-2.0
"""A live job's records written back when etcd lost them (restored to an older snapshot:
docs/admin-guide.md "Backup and restore")."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from podnet.state.alloc.common import (
    MAX_ATTEMPTS,
    AllocError,
    Job,
    JobPod,
    json_or_none,
    log,
    name_owner,
    pause,
    same_job,
)
from podnet.state.alloc.records import PodRecords
from podnet.state.etcdops import cmp_absent, cmp_mod, cmp_value, op_delete, op_put


class JobReclaim(PodRecords):
    """A lost job written back (part of `Allocator`)."""

    def reclaim_job(self, pod: JobPod, running: Callable[[int], bool]) -> JobPod:
        """Write back this node's pod of a live job whose records etcd lost (restored to a
        snapshot older than the job: docs/admin-guide.md "Backup and restore"), from the
        node's own copy (`pod`); idempotent. Every node of the job does the same for its
        own pod.

        Create-if-absent on everything: the job record, the pod's address and its block,
        the user's VNI and, unless a newer job owns it, the job name. An address whose
        `ips/` record names a job that no longer runs (`running`) is a stale record of the
        snapshot (that job had released it before this one was allocated): that job's
        records are released first. An address record or a job name that is still the
        job's own (another writer deleted only the job record) is kept as it is, with the
        records under the name. Anything another owner holds (an address of a running job
        or a login, a block of another node, the VNI of another user) is never taken:
        AllocError says what. Returns the pod with the job record in etcd (this one, or
        the same job written by another of its nodes)."""
        job = pod.job
        for attempt in range(MAX_ATTEMPTS):
            existing = self.get_job(job.job_id)
            compare: list[Any] = []
            ops: list[Any] = []
            if existing is not None:
                if existing.vni != job.vni:
                    raise AllocError(f"job {job.job_id} is in etcd with another VNI")
                job = same_job(existing, job.user, job.size)
                compare.append(cmp_mod(self.keys.job(job.job_id), existing.revision))
            else:
                compare.append(cmp_absent(self.keys.job(job.job_id)))
                ops.append(op_put(self.keys.job(job.job_id), job.to_json()))
                self._reclaim_name(job, compare, ops)
            self._reclaim_user(job, compare, ops)
            mine = JobPod(job, pod.index, pod.node, pod.ip)
            stale = self._reclaim_address(mine, running, compare, ops)
            if stale is not None:
                log.warning(
                    "job %d: releasing the stale records of job %d (not running) that hold "
                    "its address",
                    job.job_id,
                    stale.job_id,
                )
                self.release_job(stale)
                continue
            r = self.etcd.txn(compare, ops)
            if r.succeeded:
                self.ipam.mark([pod.ip])
                if existing is None:
                    return replace(mine, job=replace(job, revision=r.revision))
                return mine
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

    def _reclaim_address(
        self,
        pod: JobPod,
        running: Callable[[int], bool],
        compare: list[Any],
        ops: list[Any],
    ) -> Job | None:
        """The pod's address and its block (created if absent); returns a job that no
        longer runs whose stale record holds the address (to release first)."""
        ip, node = pod.ip, pod.node
        blk = str(ipaddress.IPv4Network(f"{ip}/{self.ipam.block_prefix}", strict=False))
        bkv = self.etcd.get(self.keys.block(blk))
        if bkv is None:
            compare.append(cmp_absent(self.keys.block(blk)))
            ops.append(op_put(self.keys.block(blk), {"node": node}))
        elif bkv.json().get("node") != node:
            raise AllocError(f"block {blk} of {ip} belongs to {bkv.json().get('node')}")
        ikv = self.etcd.get(self.keys.ip(ip))
        if ikv is not None:
            owner = json_or_none(ikv.value)
            other = owner.get("job_id") if isinstance(owner, dict) else None
            if other == pod.job.job_id:
                # the job's own address record (only the job record was lost: another
                # writer deleted it): kept, in the allocator's form, if unchanged meanwhile
                compare.append(cmp_value(self.keys.ip(ip), ikv.value))
            elif isinstance(other, int) and not running(other):
                stale = self.get_job(other)
                if stale is not None:
                    return stale
                # no record of that job left: its address record alone is stale
                compare.append(cmp_value(self.keys.ip(ip), ikv.value))
            else:
                raise AllocError(f"address {ip} is taken: {ikv.value}")
        else:
            compare.append(cmp_absent(self.keys.ip(ip)))
        named, *rest = self.pod_record_ops(pod)
        del named  # written with `publish_pod`, while the job owns its name
        ops += [self.job_ip_op(pod), *rest]
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
