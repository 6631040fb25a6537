# SPDX-License-Identifier: Apache-2.0
"""This node's own copy of each job pod it runs (`<state_dir>/jobs/<id>.json`: the job's
record as etcd had it, the pod's index and address: `JobPod`).

etcd is the truth while it has the records. The copy is what lets podnetd write a live
job's records back when etcd lost them (restored to a snapshot older than the job,
`reconcile.Reconciler`): the job's record, VNI and name, and this node's pod.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

from podnet.state.alloc import JobPod

log = logging.getLogger("podnet.localjobs")


class LocalJobs:
    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / "jobs"

    def _path(self, job_id: int) -> Path:
        return self.dir / f"{int(job_id)}.json"

    def save(self, pod: JobPod) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self._path(pod.job.job_id)
        tmp = path.with_suffix(".tmp")
        data = json.dumps(pod.to_json(), separators=(",", ":"))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data.encode())
        finally:
            os.close(fd)
        tmp.replace(path)

    def load(self, job_id: int, node: str) -> JobPod | None:
        """The copy of `node`'s (this node's) pod of the job; one an older podnetd wrote
        (the job's record with every pod) is read too."""
        try:
            d = json.loads(self._path(job_id).read_text())
            if "ip" in d:
                pod: JobPod | None = JobPod.from_json(d)
            else:
                pod = JobPod.of_old_record(d["job"], node)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("local record of job %d is unreadable: %s", job_id, e)
            return None
        if (
            pod is None
            or pod.job.job_id != job_id
            or pod.node != node
            or not 0 <= pod.index < pod.job.size
        ):
            log.warning("local record of job %d does not fit: ignored", job_id)
            return None
        return pod

    def drop(self, job_id: int) -> None:
        with contextlib.suppress(OSError):
            self._path(job_id).unlink()

    def ids(self) -> list[int]:
        if not self.dir.is_dir():
            return []
        return sorted(int(p.stem) for p in self.dir.glob("*.json") if p.stem.isdigit())
