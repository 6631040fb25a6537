# SPDX-License-Identifier: Apache-2.0
"""A job's records in etcd once it is allocated: reading it, its pods' DNS records and
markers (published, unpublished), and its release when its last node leaves."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from podnet.names import ptr_key, zone_path
from podnet.state import etcdops, store
from podnet.state.alloc.base import AllocatorBase
from podnet.state.alloc.common import RECORD_TTL, Job, name_owner
from podnet.state.etcdops import cmp_value, op_count, op_delete, op_get, op_put


class PodRecords(AllocatorBase):
    """A job's record and its pods' records (part of `Allocator`)."""

    def get_job(self, job_id: int) -> Job | None:
        kv = self.etcd.get(self.keys.job(job_id))
        return Job.from_json(kv.json(), kv.mod_revision) if kv else None

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
        rec = etcdops.json_dumps({"host": job.ips[index], "ttl": RECORD_TTL})
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
