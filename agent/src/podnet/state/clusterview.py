# SPDX-License-Identifier: Apache-2.0
"""The cluster as this node's etcd watches say it: where each address of a user's network
is, the nodes' underlay addresses, the users' VNIs (as flannel gives its backend a subnet
manager and a channel of events). Nothing here touches the kernel or writes to etcd.

A watch event becomes a `Record` (`record_of`: `jobs/`, `logins/`, `containers/`,
`users/`, `vnis/`, `blocks/`, `nodes/`; an unreadable value is logged and read as no
record), `ClusterView.apply` takes it into the view and returns what changed, as `Change`s
for the node layer's appliers (node/etcd_sync.py: the IPAM view, the job records, routes,
FDB, firewall sets):

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

`ClusterRead.of` reads everything the watches follow in one transaction (one revision):
the node's resync, and `ClusterView.load` for a reader with no node's machinery (the CLI).
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from podnet.names import Keys, block_from_key, mac_for_ip
from podnet.state.alloc.common import Job
from podnet.state.etcdops import KV, op_get
from podnet.state.store import Etcd

log = logging.getLogger("podnet.sync")

#: the prefixes the node watches
WATCHED = ("jobs", "logins", "containers", "users", "vnis", "blocks", "nodes")


# -- what a watch event says ------------------------------------------------------------
@dataclass(frozen=True)
class JobRecord:
    """`jobs/<id>`: `job` None when deleted or unreadable."""

    key: str
    job_id: int
    job: Job | None
    deleted: bool
    revision: int


@dataclass(frozen=True)
class PodRecord:
    """`logins/<node>/<user>`, `containers/<node>/<name>`: a pod's address and VNI (a login
    record names no VNI: its user's); `ip` None when deleted or unreadable."""

    key: str
    node: str
    ip: str | None
    vni: int | None
    user: str
    deleted: bool


@dataclass(frozen=True)
class UserRecord:
    """`users/<user>`: created once, never changed nor deleted by podnet."""

    key: str
    user: str
    vni: int | None
    value: str | None  # None: deleted
    revision: int


@dataclass(frozen=True)
class VniRecord:
    """`vnis/<vni>`: created once, never changed nor deleted by podnet."""

    key: str
    value: str | None  # None: deleted
    revision: int


@dataclass(frozen=True)
class BlockRecord:
    block: ipaddress.IPv4Network
    node: str | None  # None: free


@dataclass(frozen=True)
class NodeRecord:
    node: str


Record = JobRecord | PodRecord | UserRecord | VniRecord | BlockRecord | NodeRecord


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


def record_of(keys: Keys, kind: str, key: str, kv: KV | None) -> Record | None:
    """What the watch event (`kind` 'put' or 'delete' of `key`, `kv` the value put) says;
    None for a key the view does not follow."""
    if not key.startswith(keys.root):
        return None
    what, _sep, rest = key[len(keys.root) :].partition("/")
    parse = _PARSERS.get(what)
    return parse(key, what, rest, kv if kind == "put" else None) if parse else None


def _job_record(key: str, _what: str, rest: str, put: KV | None) -> Record | None:
    if not rest.isdigit():
        return None
    rev = put.mod_revision if put is not None else 0
    return JobRecord(key, int(rest), job_of(put), put is None, rev)


def _pod_record(key: str, what: str, rest: str, put: KV | None) -> Record | None:
    node, _sep, name = rest.partition("/")
    if not node or not name:
        return None
    d = _json(put)
    ip, vni = d.get("ip"), d.get("vni")
    user = name if what == "logins" else str(d.get("user"))
    return PodRecord(
        key,
        node,
        ip if isinstance(ip, str) else None,
        vni if isinstance(vni, int) else None,
        user,
        put is None,
    )


def _user_record(key: str, _what: str, rest: str, put: KV | None) -> Record | None:
    vni = _json(put).get("vni")
    value, rev = (put.value, put.mod_revision) if put is not None else (None, 0)
    return UserRecord(key, rest, vni if isinstance(vni, int) else None, value, rev)


def _vni_record(key: str, _what: str, _rest: str, put: KV | None) -> Record | None:
    value, rev = (put.value, put.mod_revision) if put is not None else (None, 0)
    return VniRecord(key, value, rev)


def _block_record(key: str, _what: str, _rest: str, put: KV | None) -> Record | None:
    try:
        blk = ipaddress.IPv4Network(block_from_key(key))
    except ValueError:
        log.warning("ignoring the block record %s (not a block)", key)
        return None
    node = _json(put).get("node")
    return BlockRecord(blk, node if isinstance(node, str) else None)


def _node_record(_key: str, _what: str, rest: str, _put: KV | None) -> Record | None:
    return NodeRecord(rest)


_PARSERS: dict[str, Callable[[str, str, str, KV | None], Record | None]] = {
    "jobs": _job_record,
    "logins": _pod_record,
    "containers": _pod_record,
    "users": _user_record,
    "vnis": _vni_record,
    "blocks": _block_record,
    "nodes": _node_record,
}


def job_of(kv: KV | None) -> Job | None:
    """The job record `kv` holds (None: none, or unreadable: logged)."""
    if kv is None:
        return None
    try:
        return Job.from_json(kv.json(), kv.mod_revision)
    except (ValueError, KeyError, TypeError, AttributeError):
        log.warning("ignoring the unreadable job record %s", kv.key)
        return None


def _json(kv: KV | None) -> dict[str, Any]:
    """A record's JSON object ({} when it is something else: logged)."""
    if kv is None:
        return {}
    try:
        d = kv.json()
    except ValueError:
        d = None
    if not isinstance(d, dict):
        log.warning("ignoring the unreadable record %s", kv.key)
        return {}
    return d


# -- one read at one revision ---------------------------------------------------------------
@dataclass
class ClusterRead:
    """Everything the watches follow, and the addresses' records (`ips/`), read in one
    transaction: one revision for all of it (the watches resume after it)."""

    keys: Keys
    revision: int
    #: the records under each prefix (`WATCHED` and "ips")
    kvs: dict[str, list[KV]]
    _jobs: list[Job] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, etcd: Etcd, keys: Keys) -> ClusterRead:
        prefixes = (*WATCHED, "ips")
        r = etcd.txn([], [op_get(keys.prefix(p), prefix=True) for p in prefixes])
        return cls(keys, r.revision, {p: r.range_kvs(i) for i, p in enumerate(prefixes)})

    def jobs(self) -> list[Job]:
        """The readable job records (parsed once: an unreadable one is logged once)."""
        if self._jobs is None:
            self._jobs = [j for kv in self.kvs.get("jobs", []) if (j := job_of(kv)) is not None]
        return self._jobs

    def blocks(self) -> dict[ipaddress.IPv4Network, str | None]:
        out: dict[ipaddress.IPv4Network, str | None] = {}
        for kv in self.kvs.get("blocks", []):
            try:
                blk = ipaddress.IPv4Network(block_from_key(kv.key))
            except ValueError:
                log.warning("ignoring the block record %s (not a block)", kv.key)
                continue
            node = _json(kv).get("node")
            out[blk] = node if isinstance(node, str) else None
        return out

    def addresses(self) -> list[str]:
        """Every address in use (also those no pod record names: older podnetd's)."""
        return [kv.key.rsplit("/", 1)[-1] for kv in self.kvs.get("ips", [])]


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
        ips = {kv.key.rsplit("/", 1)[-1]: str(_json(kv).get("ip")) for kv in kvs}
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
                if isinstance(v := _json(kv).get("vni"), int)
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
