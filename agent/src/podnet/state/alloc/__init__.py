# SPDX-License-Identifier: Apache-2.0
"""Allocation in etcd: user VNIs, node address blocks, job, login and container IPs, DNS
records.

Every allocation is one etcd transaction guarded by `create_revision == 0` on the keys it
creates (`ips/<ip>`, `blocks/<cidr>`, `users/<u>`, `vnis/<v>`, `jobs/<id>`), so two
agents can never hand out the same IP, block or VNI: the loser's transaction fails and it
retries with a fresher view (or, for a job, reads what the winner wrote).

A job is allocated by one of its nodes, in one transaction that writes everything its
pods need (addresses, the job record, its name, every pod's DNS records and marker); the
other nodes take the record from their watch of `jobs/` (`JobRecords`) and send nothing
(docs/agent.md "Allocation").

`Allocator` is the one entry point; its parts, by module (each imports only those above
it in this list):
  common       constants, errors, `Job`, `JobRecords`, `name_owner`; `contended`, the
               retry of a transaction lost to another writer
  base         the allocator's state (`AllocatorBase`), the user's VNI, the IPAM view, one
               address of a node's blocks (`_place`)
  records      a job's record and its pods' DNS records and markers, its release
  jobs         a job's allocation (the first node, or the next ones when it is late)
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
    JobRecords,
    NoAddress,
    name_owner,
)
from podnet.state.alloc.containers import ContainerAllocator, container_owner
from podnet.state.alloc.jobs import BACKUPS, LEADER_WAIT, JobAllocation, first_node_grace
from podnet.state.alloc.logins import LoginAllocator
from podnet.state.alloc.reclaim import JobReclaim

__all__ = [
    "BACKUPS",
    "LEADER_WAIT",
    "MAX_ATTEMPTS",
    "RECORD_TTL",
    "AllocError",
    "Allocator",
    "Job",
    "JobRecords",
    "NoAddress",
    "container_owner",
    "first_node_grace",
    "name_owner",
]


@dataclass
class Allocator(JobAllocation, JobReclaim, LoginAllocator, ContainerAllocator):
    """Jobs, logins and containers in etcd, on the fields of `AllocatorBase` (etcd, keys,
    ipam, zone, the VNI range, node_ips, jobs). The tuning constants are read where they
    are used: a test that patches `LEADER_WAIT` or `first_node_grace` patches
    `podnet.state.alloc.jobs`, not this package."""
