# SPDX-License-Identifier: Apache-2.0
"""A job's allocation, by each of its nodes for its own pod (podnet.state.alloc; docs/agent.md
"Allocation"): what a node reads and writes when a job starts does not grow with the job."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from podnet.names import job_label
from podnet.state.alloc.common import (
    AllocError,
    Job,
    JobPod,
    contended,
    log,
    name_owner,
    same_job,
)
from podnet.state.alloc.records import PodRecords
from podnet.state.etcdops import cmp_absent, cmp_value, op_get, op_if, op_keys, op_put


class JobAllocation(PodRecords):
    """A job's allocation (part of `Allocator`)."""

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
    ) -> JobPod:
        """This node's pod of the job (`nodes[node_index]`), allocated by this node alone;
        idempotent.

        Every node of a job writes its own pod in one transaction (`_place_pod`): an
        address of its own blocks (a new block claimed in the same transaction when they
        are full), the address record, its marker `jobnodes/<id>/<node>` (index and
        address), its DNS records under the job id and the PTR. No node waits for another
        nor reads what grows with the job. The first node (`node_index` 0) also writes the
        job's record and takes its name in the same transaction (newest job wins: the
        previous owner's records under the name go); AllocError if the id is another
        user's job.

        A node's record under the job name goes in the same transaction: the first
        node's with the name, another node's nested, if the job owns the name then (the
        first node came first: the usual case). The first node's transaction also reads
        the name's records and the job's markers: the records under the name of the pods
        that came before it and the previous owner's records left over follow in one more
        step when there are any (`settle_name`), appended to `defer` instead of made when
        `defer` is a list: the caller runs it while it wires the pod."""
        size = len(nodes)
        job = Job(job_id, user, uid, name, job_label(name), vni, size, created=time.time())
        first = node_index == 0
        steps: list[Callable[[], None]] = []
        pod = self._place_pod(job, node_index, nodes[node_index], first, steps)
        if not first and pod.job.label != job.label:
            # the record names the job otherwise than this node's request: its record
            # under the record's name (the transaction wrote none under the request's)
            steps.append(functools.partial(self.publish_name, pod))
        if defer is not None:
            defer.extend(steps)
        else:
            for run in steps:
                run()
        return pod

    def _claim_ops(self, pod: JobPod) -> list[Any]:
        """The job's record, its name and the first node's record under it, then reads of
        the name's records and of the job's markers (the last two responses)."""
        job = pod.job
        return [
            op_put(self.keys.job(job.job_id), job.to_json()),
            op_put(self.keys.name(job.user, job.label), name_owner(job.job_id)),
            self.named_op(pod),
            op_keys(self.name_records(job.user, job.label)),
            op_get(self.keys.prefix(f"jobnodes/{job.job_id}"), prefix=True),
        ]

    def _place_pod(
        self, job: Job, index: int, node: str, claim: bool, steps: list[Callable[[], None]]
    ) -> JobPod:
        """This node's pod: an address of its blocks and the pod's records in one
        transaction, guarded by the address's absence and the marker's (a marker there
        already: the pod it names, allocated before). With `claim` (the first node) the
        job's record and name go in the same transaction, guarded by the record's
        absence; otherwise the transaction reads the record: when the first node wrote it
        already (the usual case), the pod is of that record (its name, its time). A
        record of another user's job (an id Slurm gave again) is refused: AllocError (a
        pod placed already is undone). What the name needs after a claim is appended to
        `steps` (`settle_name`)."""
        marker, job_key = self.keys.job_node(job.job_id, node), self.keys.job(job.job_id)
        name_key = self.keys.name(job.user, job.label)

        def records(ip: str) -> tuple[list[Any], list[Any]]:
            pod = JobPod(job, index, node, ip)
            _named, *ops = self.pod_record_ops(pod)
            if claim:
                return [cmp_absent(marker), cmp_absent(job_key)], [
                    self.job_ip_op(pod),
                    *ops,
                    *self._claim_ops(pod),
                ]
            # its record under the job name in the same transaction, if the job owns the
            # name already (the first node came first: the usual case)
            named = op_if([cmp_value(name_key, name_owner(job.job_id))], [self.named_op(pod)])
            return [cmp_absent(marker)], [self.job_ip_op(pod), *ops, named, op_get(job_key)]

        def attempt() -> JobPod | None:
            ip, r = self._place(node, records, [op_get(marker), op_get(job_key)])
            if ip is not None:
                pod = JobPod(job, index, node, ip)
                if claim:
                    job.revision = r.revision
                    n = len(r.responses)
                    puts, stale = self.name_work(pod, r.range_kvs(n - 2), r.range_kvs(n - 1))
                    if puts or stale:
                        steps.append(functools.partial(self.settle_name, job, puts, stale))
                    log.debug("job %d: %s wrote it and its pod %s", job.job_id, node, ip)
                    return pod
                got = r.range_kvs(len(r.responses) - 1)
                if got:
                    record = Job.from_json(got[0].json(), got[0].mod_revision)
                    try:
                        pod = replace(pod, job=same_job(record, job.user, job.size))
                    except AllocError:
                        self.unpublish_pod(pod)
                        raise
                log.debug("job %d: %s allocated its pod %s", job.job_id, node, ip)
                return pod
            mark, record_kv = r.range_kvs(0), r.range_kvs(1)
            job_now = job
            if record_kv:
                job_now = Job.from_json(record_kv[0].json(), record_kv[0].mod_revision)
                same_job(job_now, job.user, job.size)
            if mark:
                before = JobPod.of_marker(job_now, node, mark[0].value)
                if before is None or before.index != index:
                    raise AllocError(f"job {job.job_id} has another pod on {node}")
                return before
            if record_kv and claim:
                # the record is there (this job's: a retry): the pod alone, of that record
                return self._place_pod(job_now, index, node, False, steps)
            return None  # lost a race on an address or a block

        return contended(f"allocate job {job.job_id}", attempt, self.load_view)
