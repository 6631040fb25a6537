# SPDX-License-Identifier: Apache-2.0
"""The cluster as this node's etcd watches say it: which node owns each address block, the
nodes' underlay addresses, the users' VNIs, the addresses the pod records hold (as
flannel gives its backend a subnet manager and a channel of events). Nothing here touches
the kernel or writes to etcd.

A watch event becomes a `Record` (watchrecords.py: `record_of`; an unreadable value is
logged and read as no record), `ClusterView.apply` takes it into the view and returns what
changed, as `Change`s for the node layer's appliers (node/etcd_sync.py: the IPAM view,
routes, the overlay's resolved entries, firewall sets):

* `AddressesChanged`: addresses a record no longer holds, addresses it holds;
* `BlockChanged`: an address block's owner (None: free);
* `NodesChanged`: the node table changed (the applier reads it whole: `set_nodes`);
* `UserChanged`: a user's VNI.

Where a pod of another node is, is its address block's: every node owns its blocks, so
`vtep_of(ip)` is the registered address (`nodes/`) of the node that owns the address's
block, never one a record names. A node needs no other node's pod records for its
overlay: a user's VXLAN asks for a remote pod when it meets one
(`podnet.node.overlay`). Jobs are not in the view: each node allocates its own pod from
its own blocks, and no node follows another's jobs (watchrecords.py); the addresses' own
records (`ips/`) are not watched, a resync reads them for the IPAM view.

`watchrecords.ClusterRead.of` reads everything the watches follow in one transaction (one
revision): `ClusterView.reset` takes it (the node's resync), and `ClusterView.load` reads
and takes it for a reader with no node's machinery (`podnet doctor`).
"""

from __future__ import annotations

import ipaddress
import threading
from dataclasses import dataclass

from podnet.names import Keys
from podnet.state.etcdops import KV
from podnet.state.store import Etcd
from podnet.state.watchrecords import (
    BlockRecord,
    ClusterRead,
    NodeRecord,
    PodRecord,
    Record,
    UserRecord,
    json_object,
    record_of,
)


# -- what changed in the view ---------------------------------------------------------------
@dataclass(frozen=True)
class AddressesChanged:
    freed: tuple[str, ...]
    used: tuple[str, ...]


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


Change = AddressesChanged | BlockChanged | NodesChanged | UserChanged


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
        #: the address blocks and their owners (`blocks/<cidr>`)
        self.blocks: dict[ipaddress.IPv4Network, str] = {}
        #: the block sizes in use (one, unless the pod network was re-cut)
        self._prefixes: set[int] = set()
        #: users' VNIs (users/<user>)
        self.user_vnis: dict[str, int] = {}
        #: the addresses each pod record holds (login and container keys)
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

    def owner_of(self, ip: str) -> str | None:
        """The node that owns the block of `ip` (None: no block holds it)."""
        try:
            addr = ipaddress.IPv4Address(ip)
        except ValueError:
            return None
        with self.mutex:
            for plen in self._prefixes:
                owner = self.blocks.get(
                    ipaddress.IPv4Network((int(addr) >> (32 - plen) << (32 - plen), plen))
                )
                if owner is not None:
                    return owner
        return None

    def vtep_of(self, ip: str) -> str | None:
        """The underlay address a frame to the pod `ip` goes to: its block owner's
        registered address; None if the block is this node's, free, or its owner has no
        registered address."""
        owner = self.owner_of(ip)
        if owner is None or owner == self.node:
            return None
        return self.node_ips.get(owner)

    # -- what changes it --------------------------------------------------------------------
    def apply(self, rec: Record) -> list[Change]:
        """Take a watch's record into the view; returns what changed."""
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
            self._set_block(rec.block, rec.node)
            return [BlockChanged(rec.block, rec.node)]
        if isinstance(rec, NodeRecord):
            return [NodesChanged(rec.node)]
        return []  # VniRecord: the reverse of users/, nothing of the view

    def _set_block(self, block: ipaddress.IPv4Network, node: str | None) -> None:
        with self.mutex:
            if node is None:
                self.blocks.pop(block, None)
            else:
                self.blocks[block] = node
                self._prefixes.add(block.prefixlen)

    def _pod(self, rec: PodRecord) -> list[Change]:
        if rec.deleted:
            return self.hold(rec.key, [])
        if rec.ip is None:
            return []
        return self.hold(rec.key, [rec.ip])

    def hold(self, key: str, ips: list[str]) -> list[Change]:
        """The record `key` now holds `ips` (none: it was deleted); returns the addresses
        freed and used."""
        with self.mutex:
            before = self._held.pop(key, [])
            if ips:
                self._held[key] = list(ips)
        gone = [ip for ip in before if ip not in ips]
        if gone or ips:
            return [AddressesChanged(tuple(gone), tuple(ips))]
        return []

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
        the blocks, the addresses the pod records hold, the node table. Returns what the
        pod records hold and, if the node table changed, `NodesChanged("")`; the caller
        resets the rest (the IPAM view)."""
        with self.mutex:
            self._held.clear()
            self.user_vnis.clear()
            self.user_vnis.update(
                (kv.key.rsplit("/", 1)[-1], v)
                for kv in read.kvs.get("users", [])
                if isinstance(v := json_object(kv).get("vni"), int)
            )
            self.blocks = {b: n for b, n in read.blocks().items() if n is not None}
            self._prefixes = {b.prefixlen for b in self.blocks}
        out: list[Change] = []
        for what in ("logins", "containers"):
            for kv in read.kvs.get(what, []):
                rec = record_of(read.keys, "put", kv.key, kv)
                if rec is not None:
                    out += self.apply(rec)
        if self.set_nodes(read.kvs.get("nodes", [])):
            out.append(NodesChanged(""))
        return out
