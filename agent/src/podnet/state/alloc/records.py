# SPDX-License-Identifier: Apache-2.0
"""A job's records in etcd: its record, each node's own pod (address record, marker, DNS
records under the job id and the PTR; under the job name while the job owns it), a pod
published again or withdrawn, a node leaving and the job's release when its last node
leaves."""

from __future__ import annotations

import json
from typing import Any

from podnet.names import ptr_key, zone_path
from podnet.state import etcdops
from podnet.state.alloc.base import AllocatorBase
from podnet.state.alloc.common import RECORD_TTL, Job, JobPod, name_owner
from podnet.state.etcdops import KV, cmp_mod, cmp_value, op_count, op_delete, op_get, op_put


class PodRecords(AllocatorBase):
    """A job's record and its pods' records (part of `Allocator`)."""

    def get_job(self, job_id: int) -> Job | None:
        kv = self.etcd.get(self.keys.job(job_id))
        return Job.from_json(kv.json(), kv.mod_revision) if kv else None

    def get_pod(self, job_id: int, node: str) -> JobPod | None:
        """`node`'s pod of the job as etcd has it (its marker and the job's record, one
        read); None if either is missing. A record of an older podnetd (its markers hold
        "1", the record every pod) is read too."""
        r = self.etcd.txn(
            [], [op_get(self.keys.job(job_id)), op_get(self.keys.job_node(job_id, node))]
        )
        jobs, markers = r.range_kvs(0), r.range_kvs(1)
        if not jobs or not markers:
            return None
        job = Job.from_json(jobs[0].json(), jobs[0].mod_revision)
        pod = JobPod.of_marker(job, node, markers[0].value)
        if pod is None:
            pod = JobPod.of_old_record(jobs[0].json(), node, jobs[0].mod_revision)
        return pod

    def pods_of(self, job: Job) -> list[JobPod]:
        """The job's pods as their nodes' markers say (a read that grows with the job:
        for a job's release and its name, never a job's start)."""
        prefix = self.keys.prefix(f"jobnodes/{job.job_id}")
        out = []
        for kv in self.etcd.get_prefix(prefix)[0]:
            pod = JobPod.of_marker(job, kv.key.rsplit("/", 1)[-1], kv.value)
            if pod is not None:
                out.append(pod)
        return out

    def name_records(self, user: str, label: str) -> str:
        """SkyDNS prefix of a job name's records (`<label>.<user>.<zone>`)."""
        return f"{zone_path(self.zone)}/{user}/{label}/"

    def _pod_records(self, pod: JobPod) -> tuple[str, list[str]]:
        """Keys of one pod's publication: (its record under the job name, [its record
        under the job id, its PTR, the node's marker])."""
        job = pod.job
        return f"{self.name_records(job.user, job.label)}pod{pod.index}", [
            f"{zone_path(self.zone)}/{job.user}/{job.job_id}/pod{pod.index}",
            ptr_key(pod.ip),
            self.keys.job_node(job.job_id, pod.node),
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

    def job_ip_op(self, pod: JobPod) -> Any:
        """The pod's address record (`ips/<ip>`: job, node, VNI)."""
        node = json.dumps(pod.node)
        return op_put(
            self.keys.ip(pod.ip),
            f'{{"job_id":{pod.job.job_id},"node":{node},"vni":{pod.job.vni}}}',
        )

    def named_op(self, pod: JobPod) -> Any:
        """The pod's record under the job name (written while the job owns it)."""
        named = self._pod_records(pod)[0]
        return op_put(named, etcdops.json_dumps({"host": pod.ip, "ttl": RECORD_TTL}))

    def pod_record_ops(self, pod: JobPod) -> list[Any]:
        """The pod's DNS records (under the job name, the job id, the PTR) and its node's
        marker."""
        named, (by_id, ptr, marker) = self._pod_records(pod)
        job = pod.job
        rec = etcdops.json_dumps({"host": pod.ip, "ttl": RECORD_TTL})
        host = f"pod{pod.index}.{job.job_id}.{job.user}.{self.zone}"
        return [
            op_put(named, rec),
            op_put(by_id, rec),
            op_put(ptr, {"host": host, "ttl": RECORD_TTL}),
            op_put(marker, pod.marker()),
        ]

    def publish_pod(self, pod: JobPod) -> None:
        """The pod's records and marker again, in one round trip (adoption after a
        restart, a job written back): the record under the job name only while the job
        owns it."""
        named, *common = self.pod_record_ops(pod)
        self._while_name_owner(pod.job, named, [self.job_ip_op(pod), *common])

    def publish_name(self, pod: JobPod) -> None:
        """The pod's record under the job name, if the job owns it (a node whose request
        named the job otherwise than the job's record: its allocation wrote none)."""
        self._while_name_owner(pod.job, self.named_op(pod), [])

    def name_work(self, pod: JobPod, had: list[KV], marks: list[KV]) -> tuple[list[Any], list[KV]]:
        """After the first node (`pod`) took the job name, with what its transaction read
        (`had`: the keys under the name; `marks`: the job's markers): (the records under
        the name of the pods that came before it, the previous owner's records none of
        this job's replaced)."""
        job = pod.job
        prefix = self.name_records(job.user, job.label)
        puts: dict[str, Any] = {}
        for kv in marks:
            other = JobPod.of_marker(job, kv.key.rsplit("/", 1)[-1], kv.value)
            if other is not None and other.node != pod.node:
                puts[f"{prefix}pod{other.index}"] = self.named_op(other)
        mine = f"{prefix}pod{pod.index}"
        stale = [kv for kv in had if kv.key != mine and kv.key not in puts]
        return list(puts.values()), stale

    def settle_name(self, job: Job, puts: list[Any], stale: list[KV]) -> None:
        """While the job owns its name: `name_work`'s records under it of the pods whose
        nodes came before the first node took it (their own transaction found the name
        another's), and the deletion of the previous owner's records none of this job's
        replaced (each only if unchanged since the first node read it: a node of this job
        may have written its own there since)."""
        owner = cmp_value(self.keys.name(job.user, job.label), name_owner(job.job_id))
        step = max(1, self.etcd.max_txn_ops - 1)
        for i in range(0, len(puts), step):
            self._while_name_owner(job, puts[i : i + step], [])
        for kv in stale:
            self.etcd.txn([owner, cmp_mod(kv.key, kv.mod_revision)], [op_delete(kv.key)])

    def _pod_deletes(self, pod: JobPod) -> tuple[Any, list[Any]]:
        """(the delete of the pod's record under the job name, the deletes of its address
        record, its other records and its marker)."""
        named, keys = self._pod_records(pod)
        return op_delete(named), [op_delete(self.keys.ip(pod.ip)), *map(op_delete, keys)]

    def unpublish_pod(self, pod: JobPod) -> None:
        """Undo the pod's allocation (its pod could not be built): its records, its
        address."""
        named, rest = self._pod_deletes(pod)
        self._while_name_owner(pod.job, named, rest)
        self.ipam.mark([pod.ip], used=False)

    def leave_job(self, pod: JobPod) -> None:
        """This node's pod of the job is gone: its records and marker go (under the job
        name only while the job owns it); the last node to leave releases the job
        (deletes are linearized: at least one node sees nobody left)."""
        job = pod.job
        named, rest = self._pod_deletes(pod)
        reads = [
            op_count(self.keys.prefix(f"jobnodes/{job.job_id}")),
            op_get(self.keys.job(job.job_id)),
        ]
        r = self.etcd.txn(
            [cmp_value(self.keys.name(job.user, job.label), name_owner(job.job_id))],
            [named, *rest, *reads],
            [*rest, *reads],
        )
        self.ipam.mark([pod.ip], used=False)
        first = len(rest) + int(r.succeeded)
        if r.range_count(first) == 0:
            kvs = r.range_kvs(first + 1)
            if kvs:
                self.release_job(Job.from_json(kvs[0].json(), kvs[0].mod_revision))

    def release_job(self, job: Job) -> None:
        """Delete a job, the records of the pods its markers still name (nodes that did
        not leave: the GC's case), its markers and DNS records (the name only if still
        ours)."""
        pods = self.pods_of(job)
        base = zone_path(self.zone) + f"/{job.user}"
        ops = [
            op_delete(self.keys.job(job.job_id)),
            op_delete(self.keys.prefix(f"jobnodes/{job.job_id}"), prefix=True),
            op_delete(f"{base}/{job.job_id}/", prefix=True),
        ]
        ips = sorted({p.ip for p in pods} | set(job.old_ips))
        for ip in ips:
            ops.append(op_delete(self.keys.ip(ip)))
            ops.append(op_delete(ptr_key(ip)))
        name_key = self.keys.name(job.user, job.label)
        # the job-name records belong to the newest live job with that name
        name_ops = [op_delete(name_key), op_delete(self.name_records(job.user, job.label), True)]
        owner = [cmp_value(name_key, name_owner(job.job_id))]
        if len(ops) + len(name_ops) <= self.etcd.max_txn_ops:
            self.etcd.txn(owner, ops + name_ops, ops)
        else:
            self.etcd.put_many(ops)
            self.etcd.txn(owner, name_ops)
        self.ipam.mark(ips, used=False)
