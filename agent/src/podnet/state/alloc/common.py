# SPDX-License-Identifier: Apache-2.0
"""What the allocator's parts share: the constants, the errors, the job record (`Job`), a
node's pod of a job (`JobPod`), the value a job name's owner holds, and the retry of a
transaction lost to another writer (`contended`)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
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
    """A job's record (`jobs/<id>`), written by its first node: who it is and its name.
    Its pods are not in it: each node writes its own (`JobPod`), so what every node reads
    of a job does not grow with the job (docs/agent.md "Allocation")."""

    job_id: int
    user: str
    uid: int
    name: str
    label: str
    vni: int
    size: int
    #: the record's mod revision in etcd (not part of what the job is)
    revision: int = field(default=0, compare=False)
    created: float = 0.0
    #: the addresses of a record an older podnetd wrote (every pod's; released with it)
    old_ips: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "user": self.user,
            "uid": self.uid,
            "name": self.name,
            "label": self.label,
            "vni": self.vni,
            "size": self.size,
            "created": self.created,
        }

    def same_as(self, other: Job) -> bool:
        """Whether `other` is this job's record: the same but for `created` (each node
        makes its own copy when the job starts; the record in etcd is the first node's)."""
        mine, theirs = self.to_json(), other.to_json()
        mine.pop("created")
        theirs.pop("created")
        return mine == theirs

    @classmethod
    def from_json(cls, d: dict[str, Any], revision: int = 0) -> Job:
        """The record, also as a podnetd before node-owned allocation wrote it (with the
        job's `nodes` and `ips`, read by `JobPod.of_old_record`)."""
        return cls(
            job_id=int(d["job_id"]),
            user=str(d["user"]),
            uid=int(d["uid"]),
            name=str(d.get("name", "")),
            label=str(d["label"]),
            vni=int(d["vni"]),
            size=int(d["size"]) if "size" in d else len(d.get("nodes", [])),
            revision=revision,
            created=float(d.get("created", 0)),
            old_ips=tuple(str(ip) for ip in d.get("ips", ())),
        )


@dataclass(frozen=True)
class JobPod:
    """One node's pod of a job: its index in the job's node list and its address (from
    the node's own blocks). The node's marker `jobnodes/<id>/<node>` holds `marker()`."""

    job: Job
    index: int
    node: str
    ip: str

    def marker(self) -> dict[str, Any]:
        return {"index": self.index, "ip": self.ip}

    def to_json(self) -> dict[str, Any]:
        """This node's own copy (node/localjobs.py): the job's record and the pod."""
        return {"job": self.job.to_json(), "index": self.index, "node": self.node, "ip": self.ip}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JobPod:
        return cls(Job.from_json(d["job"]), int(d["index"]), str(d["node"]), str(d["ip"]))

    @classmethod
    def of_marker(cls, job: Job, node: str, value: str) -> JobPod | None:
        """The pod a node's marker names (None: not a marker of this form)."""
        d = json_or_none(value)
        if not isinstance(d, dict):
            return None
        index, ip = d.get("index"), d.get("ip")
        if not isinstance(index, int) or not isinstance(ip, str) or not 0 <= index < job.size:
            return None
        return cls(job, index, node, ip)

    @classmethod
    def of_old_record(cls, d: dict[str, Any], node: str, revision: int = 0) -> JobPod | None:
        """`node`'s pod in a job record as a podnetd before node-owned allocation wrote it
        (the job's `nodes` and `ips` in it; its markers held "1"): adopted on upgrade."""
        nodes, ips = d.get("nodes"), d.get("ips")
        if not isinstance(nodes, list) or not isinstance(ips, list) or node not in nodes:
            return None
        i = nodes.index(node)
        if len(ips) != len(nodes) or not isinstance(ips[i], str):
            return None
        return cls(Job.from_json(d, revision), i, node, ips[i])


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


def same_job(job: Job, user: str, size: int) -> Job:
    """`job` as a node of a job of `user` of `size` nodes asks for it; AllocError if the
    record is another job's (an id Slurm gave again, a record of another user)."""
    if job.user != user or job.size != size:
        raise AllocError(f"job {job.job_id} already exists for another user or node list")
    return job
