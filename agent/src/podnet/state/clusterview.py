# SPDX-License-Identifier: Apache-2.0
"""The cluster as this node's etcd watches say it: where each address of a user's network
is, the nodes' underlay addresses, the users' VNIs (as flannel gives its backend a subnet
manager and a channel of events). Nothing here touches the kernel or writes to etcd.

A watch event becomes a `Record` (watchrecords.py: `record_of`; an unreadable value is
logged and read as no record), `ClusterView.apply` takes it into the view and returns what
changed, as `Change`s for the node layer's appliers (node/etcd_sync.py: the IPAM view, the
job records, routes, FDB, firewall sets):

* `JobChanged`: a job's record (None: deleted);
* `AddressesChanged`: addresses a record no longer holds, addresses it holds;
* `UserPodsChanged(vni)`: the pods of that user's network on other nodes changed (FDB);
* `BlockChanged`: an address block's owner (None: free);
* `NodesChanged`: the node table changed (the applier reads it whole: `set_nodes`);
* `UserChanged`: a user's VNI.

A pod record (a job's, a login pod's, a container's) says where its address is: which
nodes are a VNI's VTEPs (flood entries) and which node each remote pod MAC is behind. A
VTEP's address is always its node's registered one (`nodes/`), never one a record names.
The addresses' own records (`ips/`) are not watched (a job's allocation writes one per node
in one transaction); a resync reads them for the IPAM view.

`watchrecords.ClusterRead.of` reads everything the watches follow in one transaction (one
revision): `ClusterView.reset` takes it (the node's resync), and `ClusterView.load` reads
and takes it for a reader with no node's machinery (`podnet doctor`).
"""

from __future__ import annotations

import ipaddress
import threading
from dataclasses import dataclass

from podnet.names import Keys, mac_for_ip
from podnet.state.alloc.common import Job
from podnet.state.etcdops import KV
from podnet.state.store import Etcd
from podnet.state.watchrecords import (
    BlockRecord,
    ClusterRead,
    JobRecord,
    NodeRecord,
    PodRecord,
    Record,
    UserRecord,
    json_object,
    record_of,
)


# -- what changed in the view ---------------------------------------------------------------
@dataclass(frozen=True)
class JobChanged:
    job_id: int
    job: Job | None  # None: deleted


@dataclass(frozen=True)
class AddressesChanged:
    freed: tuple[str, ...]
    used: tuple[str, ...]


@dataclass(frozen=True)
class UserPodsChanged:
    vni: int


@dataclass(frozen=True)
class BlockChanged:
    block: ipaddress.IPv4Network
    node: str | None


@dataclass(frozen=True)
class NodesChanged:
    node: str  # "" after a whole read


@dataclass(frozen=True)
class UserChanged:
    user: str
    vni: int | None


Change = JobChanged | AddressesChanged | UserPodsChanged | BlockChanged | NodesChanged | UserChanged


# -- the view -----------------------------------------------------------------------------
class ClusterView:
    """The cluster as `node`'s watches say it. Written by one feeder (the node's sync
    loop, or `load`), read by many: the tables change under `mutex`."""

    def __init__(self, node: str) -> None:
        self.node = node
        #: the lock of the tables below
        self.mutex = threading.Lock()
        #: each node's registered underlay address (`nodes/<node>`)
        self.node_ips: dict[str, str] = {}
        #: where the pods of each VNI are (vni -> ip -> node), from the pod records
        self.pods_at: dict[int, dict[str, str]] = {}
        self.ip_vni: dict[str, int] = {}
        #: users' VNIs (users/<user>)
        self.user_vnis: dict[str, int] = {}
        #: the addresses each pod record holds (`jobs/<id>`, login and container keys)
        self._held: dict[str, list[str]] = {}

    @classmethod
    def load(cls, etcd: Etcd, keys: Keys, node: str) -> ClusterView:
        """The view as etcd says now, in one read (no watch: a reader's, e.g. the CLI's)."""
        view = cls(node)
        view.reset(ClusterRead.of(etcd, keys))
        return view

    # -- what it says ---------------------------------------------------------------------
    def user_vni(self, user: str) -> int | None:
        return self.user_vnis.get(user)

    def node_addresses(self) -> list[str]:
        """The nodes' underlay addresses (the firewall lets their VXLAN in)."""
        return sorted(set(self.node_ips.values()))

    def vteps_of(self, vni: int) -> list[str]:
        """Underlay addresses of the nodes with a pod of this VNI, this one included (a
        node's registered address: `nodes/<node>`)."""
        with self.mutex:
            nodes = set(self.pods_at.get(vni, {}).values())
        ips = {self.node_ips[n] for n in nodes if n in self.node_ips}
        if self.node in self.node_ips:
            ips.add(self.node_ips[self.node])
        return sorted(ips)

    def remote_macs(self, vni: int) -> dict[str, str]:
        """MAC -> underlay address of the pods of `vni` on other (live) nodes."""
        with self.mutex:
            pods = dict(self.pods_at.get(vni, {}))
        return {
            mac_for_ip(ip): self.node_ips[node]
            for ip, node in pods.items()
            if node != self.node and node in self.node_ips
        }

    # -- what changes it --------------------------------------------------------------------
    def apply(self, rec: Record) -> list[Change]:
        """Take a watch's record into the view; returns what changed."""
        if isinstance(rec, JobRecord):
            return self._job(rec)
        if isinstance(rec, PodRecord):
            return self._pod(rec)
        if isinstance(rec, UserRecord):
            with self.mutex:
                if rec.vni is not None:
                    self.user_vnis[rec.user] = rec.vni
                else:
                    self.user_vnis.pop(rec.user, None)
            return [UserChanged(rec.user, rec.vni)]
        if isinstance(rec, BlockRecord):
            return [BlockChanged(rec.block, rec.node)]
        if isinstance(rec, NodeRecord):
            return [NodesChanged(rec.node)]
        return []  # VniRecord: the reverse of users/, nothing of the view

    def _job(self, rec: JobRecord) -> list[Change]:
        key = f"jobs/{rec.job_id}"
        if rec.deleted:
            return [JobChanged(rec.job_id, None), *self.hold(key, [], 0, [])]
        if rec.job is None:  # unreadable: what the view had stays
            return []
        job = rec.job
        return [JobChanged(rec.job_id, job), *self.hold(key, job.ips, job.vni, job.nodes)]

    def _pod(self, rec: PodRecord) -> list[Change]:
        if rec.deleted:
            return self.hold(rec.key, [], 0, [])
        vni = rec.vni if rec.vni is not None else self.user_vni(rec.user)
        if rec.ip is None or vni is None:
            return []
        return self.hold(rec.key, [rec.ip], vni, [rec.node])

    def hold(self, key: str, ips: list[str], vni: int, nodes: list[str]) -> list[Change]:
        """The record `key` now holds `ips` (each on the node at the same place in `nodes`)
        in VNI `vni` (none: it was deleted): the pods' locations; returns the addresses
        freed and used, and the VNIs whose remote pods changed."""
        with self.mutex:
            before = self._held.pop(key, [])
            if ips:
                self._held[key] = list(ips)
        gone = [ip for ip in before if ip not in ips]
        changed: set[int] = set()
        for ip in gone:
            changed |= self.locate(ip, None)
        for ip, node in zip(ips, nodes, strict=False):
            changed |= self.locate(ip, (vni, node))
        out: list[Change] = []
        if gone or ips:
            out.append(AddressesChanged(tuple(gone), tuple(ips)))
        out += [UserPodsChanged(v) for v in sorted(changed)]
        return out

    def locate(self, ip: str, where: tuple[int, str] | None) -> set[int]:
        """Record that `ip` is a pod of VNI `where[0]` on node `where[1]` (None: no pod);
        returns the VNIs whose remote pods changed."""
        changed: set[int] = set()
        with self.mutex:
            old = self.ip_vni.pop(ip, None)
            if old is not None:
                node = self.pods_at.get(old, {}).pop(ip, None)
                if node != self.node:
                    changed.add(old)
            if where is not None:
                vni, node = where
                self.ip_vni[ip] = vni
                self.pods_at.setdefault(vni, {})[ip] = node
                if node != self.node:
                    changed.add(vni)
        return changed

    def set_nodes(self, kvs: list[KV]) -> bool:
        """The node table from its records (`nodes/`, read whole); True if it changed."""
        ips = {kv.key.rsplit("/", 1)[-1]: str(json_object(kv).get("ip")) for kv in kvs}
        with self.mutex:
            if ips == self.node_ips:
                return False
            self.node_ips = ips
        return True

    def reset(self, read: ClusterRead) -> list[Change]:
        """The view from a whole read (after a watch was compacted away): the users' VNIs,
        the pods' locations, the node table. Returns what the pod records hold and, if the
        node table changed, `NodesChanged("")`; the caller resets the rest (jobs, blocks)."""
        with self.mutex:
            self.pods_at.clear()
            self.ip_vni.clear()
            self._held.clear()
            self.user_vnis.clear()
            self.user_vnis.update(
                (kv.key.rsplit("/", 1)[-1], v)
                for kv in read.kvs.get("users", [])
                if isinstance(v := json_object(kv).get("vni"), int)
            )
        out: list[Change] = []
        for job in read.jobs():
            out += self.hold(f"jobs/{job.job_id}", job.ips, job.vni, job.nodes)
        for what in ("logins", "containers"):
            for kv in read.kvs.get(what, []):
                rec = record_of(read.keys, "put", kv.key, kv)
                if rec is not None:
                    out += self.apply(rec)
        if self.set_nodes(read.kvs.get("nodes", [])):
            out.append(NodesChanged(""))
        return out
