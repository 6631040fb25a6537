# SPDX-License-Identifier: Apache-2.0
"""This node's own copy of the job record of each job pod it runs (`<state_dir>/jobs/<id>.json`:
the record as etcd had it, and the pod's index in it).

etcd is the truth while it has the record. The copy is what lets podnetd write a live job's
records back when etcd lost them (restored to a snapshot older than the job,
`reconcile.Reconciler`): the job's addresses on every node, its VNI and name.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

from podnet.state.alloc import Job

log = logging.getLogger("podnet.localjobs")


class LocalJobs:
    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / "jobs"

    def _path(self, job_id: int) -> Path:
        return self.dir / f"{int(job_id)}.json"

    def save(self, job: Job, index: int) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self._path(job.job_id)
        tmp = path.with_suffix(".tmp")
        data = json.dumps({"job": job.to_json(), "index": index}, separators=(",", ":"))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data.encode())
        finally:
            os.close(fd)
        tmp.replace(path)

    def load(self, job_id: int) -> tuple[Job, int] | None:
        try:
            d = json.loads(self._path(job_id).read_text())
            job, index = Job.from_json(d["job"]), int(d["index"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("local record of job %d is unreadable: %s", job_id, e)
            return None
        if job.job_id != job_id or not 0 <= index < len(job.nodes) == len(job.ips):
            log.warning("local record of job %d does not fit: ignored", job_id)
            return None
        return job, index

    def drop(self, job_id: int) -> None:
        with contextlib.suppress(OSError):
            self._path(job_id).unlink()

    def ids(self) -> list[int]:
        if not self.dir.is_dir():
            return []
        return sorted(int(p.stem) for p in self.dir.glob("*.json") if p.stem.isdigit())
