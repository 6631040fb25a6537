# SPDX-License-Identifier: Apache-2.0
"""What the allocator's parts share: the constants, the errors, the job record (`Job`) and
this node's copy of them (`JobRecords`), the value a job name's owner holds, and the retry
of a transaction lost to another writer (`contended`)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from podnet.state import etcdops

log = logging.getLogger("podnet.alloc")

RECORD_TTL = 30
MAX_ATTEMPTS = 20

T = TypeVar("T")


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


def name_owner(job_id: int) -> str:
    """Value of `names/<user>/<label>`: the job that owns the name (compared verbatim)."""
    return etcdops.json_dumps({"job_id": job_id})


def pause(attempt: int) -> None:
    """The pause after attempt `attempt` (from 0) lost its transaction to another writer:
    10 ms longer each time, at most 0.2 s."""
    time.sleep(min(0.01 * (attempt + 1), 0.2))


def contended(
    what: str, attempt: Callable[[], T | None], refresh: Callable[[], object] | None = None
) -> T:
    """`attempt()` until it returns something other than None (its transaction won, or what
    it wanted is there already), at most MAX_ATTEMPTS times; after each lost attempt
    `refresh()` (a fresher view, if given) and a `pause`. AllocError "could not <what>
    (contention)" when every attempt lost."""
    for n in range(MAX_ATTEMPTS):
        got = attempt()
        if got is not None:
            return got
        if refresh is not None:
            refresh()
        pause(n)
    raise AllocError(f"could not {what} (contention)")


def json_or_none(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return None


def same_job(job: Job, user: str, nodes: list[str]) -> Job:
    if job.user != user or job.nodes != nodes:
        raise AllocError(f"job {job.job_id} already exists for another user or node list")
    return job
