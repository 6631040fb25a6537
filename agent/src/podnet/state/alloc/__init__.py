# SPDX-License-Identifier: Apache-2.0
"""Allocation in etcd: user VNIs, node address blocks, job, login and container IPs, DNS
records.

Every allocation is one etcd transaction guarded by `create_revision == 0` on the keys it
creates (`ips/<ip>`, `blocks/<cidr>`, `users/<u>`, `vnis/<v>`, `jobs/<id>`), so two
agents can never hand out the same IP, block or VNI: the loser's transaction fails and it
retries with a fresher view (or, for a job, reads what the winner wrote).

Each node of a job allocates its own pod, in one transaction of its own (an address of its
own blocks, the address record, its marker, its DNS records); the first node also writes
the job's small record and takes its name. No node waits for another nor reads anything
that grows with the job (docs/agent.md "Allocation").

`Allocator` is the one entry point; its parts, by module (each imports only those above
it in this list):
  common       constants, errors, `Job`, `JobPod`, `name_owner`; `contended`, the
               retry of a transaction lost to another writer
  base         the allocator's state (`AllocatorBase`), the user's VNI, the IPAM view, one
               address of a node's blocks (`_place`)
  records      a job's record and its pods' records and markers, its release
  jobs         a job's allocation (each node its own pod, the first node the record)
  reclaim      a lost job written back (etcd restored to an older snapshot)
  logins       login pods
  containers   containers
"""

from __future__ import annotations

from dataclasses import dataclass

from podnet.state.alloc.common import (
    MAX_ATTEMPTS,
    RECORD_TTL,
    AllocError,
    Job,
    JobPod,
    NoAddress,
    name_owner,
)
from podnet.state.alloc.containers import ContainerAllocator, container_owner
from podnet.state.alloc.jobs import JobAllocation
from podnet.state.alloc.logins import LoginAllocator
from podnet.state.alloc.reclaim import JobReclaim

__all__ = [
    "MAX_ATTEMPTS",
    "RECORD_TTL",
    "AllocError",
    "Allocator",
    "Job",
    "JobPod",
    "NoAddress",
    "container_owner",
    "name_owner",
]


@dataclass
class Allocator(JobAllocation, JobReclaim, LoginAllocator, ContainerAllocator):
    """Jobs, logins and containers in etcd, on the fields of `AllocatorBase` (etcd, keys,
    ipam, zone, the VNI range, node_ips, jobs)."""
