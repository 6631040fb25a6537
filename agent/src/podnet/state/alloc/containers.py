# SPDX-License-Identifier: Apache-2.0
"""A container's address and records on its node, and the name it may claim."""

from __future__ import annotations

from typing import Any

from podnet.errors import PodnetError
from podnet.names import ptr_key, zone_path
from podnet.state import etcdops, quota
from podnet.state.alloc.base import AllocatorBase
from podnet.state.alloc.common import RECORD_TTL, contended
from podnet.state.etcdops import cmp_absent, cmp_value, op_delete, op_get, op_put


class ContainerAllocator(AllocatorBase):
    """Containers (part of `Allocator`)."""

    def allocate_container(
        self,
        node: str,
        ns: str,
        user: str,
        vni: int,
        dns_name: str,
        record: dict[str, Any],
        limits: dict[str, int] | None = None,
    ) -> str:
        """An address of this node's block for the container `ns` and its records, one
        transaction (the address and the name are created if absent); returns the IP,
        also set as `record["ip"]` (the container's record, `Keys.container`).
        `dns_name`: `<label>.<user>.<zone>` (or "": none). `limits` (kind -> limit:
        `containers`, `addresses`; None: not limited): quota slots taken in the same
        transaction (QuotaExceeded when one is full), set as `record["slots"]`."""
        label = _label(dns_name)
        name_key = self.keys.name(user, label) if label else ""
        owner = self.keys.container(node, ns)

        def attempt() -> str | None:
            claim = self.slots.claim(user, limits or {}, owner)
            if claim.slots:
                record["slots"] = claim.slots

            def records(ip: str) -> tuple[list[Any], list[Any]]:
                record["ip"] = ip
                claims = [op_put(name_key, container_owner(ns, node))] if name_key else []
                ops = self.container_record_ops(node, ns, user, vni, ip, dns_name, record)
                compare = [cmp_absent(name_key)] if name_key else []
                return [*compare, *claim.compare], [*claims, *claim.ops, *ops]

            ip, r = self._place(node, records, [op_get(name_key)] if name_key else [])
            if ip is None and name_key and r.range_kvs(0):
                raise PodnetError(
                    "EEXIST", f"the name {label}.{user}.{self.zone} is taken (a job or container)"
                )
            return ip

        return contended(f"allocate a container address for {user}", attempt, self.load_view)

    def container_record_ops(
        self,
        node: str,
        ns: str,
        user: str,
        vni: int,
        ip: str,
        dns_name: str,
        record: dict[str, Any],
    ) -> list[Any]:
        """A container's keys: its IP, its record, `<label>/ctr` of its DNS name and the PTR."""
        label = _label(dns_name)
        ops = [
            op_put(
                self.keys.ip(ip),
                {"kind": "container", "node": node, "user": user, "vni": vni, "ns": ns},
            ),
            op_put(self.keys.container(node, ns), record),
        ]
        if label:
            ops.append(op_put(self._ctr_key(user, label), {"host": ip, "ttl": RECORD_TTL}))
            ops.append(op_put(ptr_key(ip), {"host": dns_name, "ttl": RECORD_TTL}))
        return ops

    def get_container(self, node: str, ns: str) -> dict[str, Any] | None:
        """The record of the container `ns` on `node` (None: etcd has none)."""
        kv = self.etcd.get(self.keys.container(node, ns))
        return None if kv is None else dict(kv.json())

    def republish_container(
        self,
        node: str,
        ns: str,
        user: str,
        vni: int,
        ip: str,
        dns_name: str,
        record: dict[str, Any],
    ) -> None:
        """The container's records again (adopted after a restart), with the quota slots
        `record` lists (kept, or others if they were taken meanwhile: a live container
        is never refused; `record["slots"]` is updated)."""
        owner = self.keys.container(node, ns)

        def attempt() -> bool | None:
            claim = self.slots.keep(user, quota.slots_of(record), owner)
            if claim.slots:
                record["slots"] = claim.slots
            ops = self.container_record_ops(node, ns, user, vni, ip, dns_name, record)
            return True if self.etcd.txn(claim.compare, [*claim.ops, *ops]).succeeded else None

        contended(f"write the records of container {ns} back", attempt)

    def container_names(self, node: str) -> list[str]:
        """The containers etcd has records of on `node` (their netns names)."""
        prefix = self.keys.container(node, "")
        kvs = self.etcd.get_prefix(prefix, keys_only=True)[0]
        return [kv.key[len(prefix) :] for kv in kvs]

    def release_container(
        self,
        node: str,
        ns: str,
        user: str,
        ip: str,
        dns_name: str,
        slots: dict[str, int] | None = None,
    ) -> None:
        """Delete a container's records, its name (while it is the container's) and the
        quota slots it holds."""
        label = _label(dns_name)
        ops = [
            op_delete(self.keys.ip(ip)),
            op_delete(self.keys.container(node, ns)),
            op_delete(ptr_key(ip)),
            *self.slots.release_ops(user, slots or {}),
        ]
        if label:
            ops.append(op_delete(self._ctr_key(user, label)))
            name_key = self.keys.name(user, label)
            # one round trip: the name's claim goes only while it is this container's
            self.etcd.txn(
                [cmp_value(name_key, container_owner(ns, node))], [*ops, op_delete(name_key)], ops
            )
        else:
            self.etcd.put_many(ops)
        self.ipam.mark([ip], used=False)

    def _ctr_key(self, user: str, label: str) -> str:
        """SkyDNS record of a container's name (`<label>.<user>.<zone>`)."""
        return f"{zone_path(self.zone)}/{user}/{label}/ctr"


def _label(dns_name: str) -> str:
    return dns_name.split(".", 1)[0] if dns_name else ""


def container_owner(ns: str, node: str) -> str:
    """Value of `names/<user>/<label>` a container holds (compared verbatim)."""
    return etcdops.json_dumps({"container": ns, "node": node})
