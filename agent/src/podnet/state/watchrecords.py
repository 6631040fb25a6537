# SPDX-License-Identifier: Apache-2.0
"""What this node's etcd watches say, record by record: a watch event of `logins/`,
`containers/`, `users/`, `vnis/`, `blocks/` or `nodes/` becomes a typed `Record`
(`record_of`; an unreadable value is logged and read as no record), and `ClusterRead` is
everything the watches follow (and the addresses' records, `ips/`) read in one
transaction: one revision for all of it. Plain values: no view, no node.
`clusterview.ClusterView` takes the records; node/repair.py screens them first.

No node watches `jobs/`: a job's start would otherwise reach every node of the cluster
(docs/scale.md). A node checks the records of its own jobs (node/repair.py,
`RecordGuard`); one node at a time releases the records of jobs whose nodes died
(node/reconcile.py); `job_of` reads a job record for both.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from podnet.names import Keys, block_from_key
from podnet.state.alloc.common import Job
from podnet.state.etcdops import KV, op_get
from podnet.state.store import Etcd

log = logging.getLogger("podnet.sync")

#: the prefixes the node watches
WATCHED = ("logins", "containers", "users", "vnis", "blocks", "nodes")


# -- what a watch event says ------------------------------------------------------------
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
    """`blocks/<cidr>`: an address block and its owner; a node's blocks stay its own (the
    overlay and the routes send its pods' traffic to the owner: `node/repair.py`)."""

    block: ipaddress.IPv4Network
    node: str | None  # None: free
    key: str = ""
    value: str | None = None  # None: deleted
    revision: int = 0


@dataclass(frozen=True)
class NodeRecord:
    node: str


Record = PodRecord | UserRecord | VniRecord | BlockRecord | NodeRecord


def record_of(keys: Keys, kind: str, key: str, kv: KV | None) -> Record | None:
    """What the watch event (`kind` 'put' or 'delete' of `key`, `kv` the value put) says;
    None for a key the view does not follow."""
    if not key.startswith(keys.root):
        return None
    what, _sep, rest = key[len(keys.root) :].partition("/")
    parse = _PARSERS.get(what)
    return parse(key, what, rest, kv if kind == "put" else None) if parse else None


def _pod_record(key: str, what: str, rest: str, put: KV | None) -> Record | None:
    node, _sep, name = rest.partition("/")
    if not node or not name:
        return None
    d = json_object(put)
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
    vni = json_object(put).get("vni")
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
    node = json_object(put).get("node")
    value, rev = (put.value, put.mod_revision) if put is not None else (None, 0)
    return BlockRecord(blk, node if isinstance(node, str) else None, key, value, rev)


def _node_record(_key: str, _what: str, rest: str, _put: KV | None) -> Record | None:
    return NodeRecord(rest)


_PARSERS: dict[str, Callable[[str, str, str, KV | None], Record | None]] = {
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


def json_object(kv: KV | None) -> dict[str, Any]:
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

    @classmethod
    def of(cls, etcd: Etcd, keys: Keys) -> ClusterRead:
        prefixes = (*WATCHED, "ips")
        r = etcd.txn([], [op_get(keys.prefix(p), prefix=True) for p in prefixes])
        return cls(keys, r.revision, {p: r.range_kvs(i) for i, p in enumerate(prefixes)})

    def blocks(self) -> dict[ipaddress.IPv4Network, str | None]:
        out: dict[ipaddress.IPv4Network, str | None] = {}
        for kv in self.kvs.get("blocks", []):
            try:
                blk = ipaddress.IPv4Network(block_from_key(kv.key))
            except ValueError:
                log.warning("ignoring the block record %s (not a block)", kv.key)
                continue
            node = json_object(kv).get("node")
            out[blk] = node if isinstance(node, str) else None
        return out

    def addresses(self) -> list[str]:
        """Every address in use (also those no pod record names: older podnetd's)."""
        return [kv.key.rsplit("/", 1)[-1] for kv in self.kvs.get("ips", [])]
