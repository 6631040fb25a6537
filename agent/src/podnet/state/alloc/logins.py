# SPDX-License-Identifier: Apache-2.0
"""A user's login pod on a node: its address and records, on the node's lease."""

from __future__ import annotations

from typing import Any

from podnet.names import login_label, ptr_key, zone_path
from podnet.state import quota
from podnet.state.alloc.base import AllocatorBase
from podnet.state.alloc.common import RECORD_TTL, contended
from podnet.state.etcdops import cmp_absent, op_delete, op_put


class LoginAllocator(AllocatorBase):
    """Login pods (part of `Allocator`)."""

    def allocate_login(
        self,
        node: str,
        user: str,
        uid: int,
        vni: int,
        lease: int,
        limits: dict[str, int] | None = None,
    ) -> tuple[str, dict[str, int]]:
        """The login IP of `user` on `node` (on `lease`) and the quota slots it holds;
        idempotent. `limits` (kind -> limit: `logins`, `addresses`; None: not limited)
        are taken in the same transaction (QuotaExceeded when one is full)."""
        key = self.keys.login(node, user)

        def attempt() -> tuple[str, dict[str, int]] | None:
            kv = self.etcd.get(key)
            if kv:
                d = kv.json()
                return str(d["ip"]), quota.slots_of(d)
            claim = self.slots.claim(user, limits or {}, key, lease)

            def records(ip: str) -> tuple[list[Any], list[Any]]:
                ops = self.login_record_ops(node, user, uid, vni, ip, lease, claim.slots)
                return [cmp_absent(key), *claim.compare], [*claim.ops, *ops]

            ip, _r = self._place(node, records, [])
            return None if ip is None else (ip, claim.slots)

        return contended(f"allocate a login address for {user}", attempt, self.load_view)

    def login_record_ops(
        self,
        node: str,
        user: str,
        uid: int,
        vni: int,
        ip: str,
        lease: int,
        slots: dict[str, int] | None = None,
    ) -> list[Any]:
        """The keys of a login pod, all on the node's lease: `logins/<node>/<user>` (with
        the quota slots it holds), its IP, `<node>.login.<user>.<zone>` and the PTR."""
        label = login_label(node)
        record: dict[str, Any] = {"ip": ip, "uid": uid, "vni": vni}
        if slots:
            record["slots"] = slots
        return [
            op_put(self.keys.login(node, user), record, lease),
            op_put(
                self.keys.ip(ip), {"kind": "login", "node": node, "user": user, "vni": vni}, lease
            ),
            op_put(
                f"{zone_path(self.zone)}/{user}/login/{label}",
                {"host": ip, "ttl": RECORD_TTL},
                lease,
            ),
            op_put(
                ptr_key(ip), {"host": f"{label}.login.{user}.{self.zone}", "ttl": RECORD_TTL}, lease
            ),
        ]

    def republish_login(
        self,
        node: str,
        user: str,
        uid: int,
        vni: int,
        ip: str,
        lease: int,
        slots: dict[str, int],
    ) -> dict[str, int]:
        """A live login pod's records again (adoption after a restart, the node's new
        lease), with its quota slots (kept, or others if another login took them while
        the records were gone: a live pod is never refused). Returns the slots."""
        key = self.keys.login(node, user)

        def attempt() -> dict[str, int] | None:
            kv = self.etcd.get(key)
            held = quota.slots_of(kv.json()) if kv else {}
            claim = self.slots.keep(user, held or slots, key, lease)
            r = self.etcd.txn(
                claim.compare,
                [*claim.ops, *self.login_record_ops(node, user, uid, vni, ip, lease, claim.slots)],
            )
            return claim.slots if r.succeeded else None

        return contended(f"write the login records of {user}", attempt)

    def release_login(self, node: str, user: str) -> None:
        key = self.keys.login(node, user)
        kv = self.etcd.get(key)
        if not kv:
            return
        d = kv.json()
        ip = str(d["ip"])
        self.etcd.put_many(
            [
                op_delete(key),
                op_delete(self.keys.ip(ip)),
                op_delete(ptr_key(ip)),
                op_delete(f"{zone_path(self.zone)}/{user}/login/{login_label(node)}"),
                *self.slots.release_ops(user, quota.slots_of(d)),
            ]
        )
        self.ipam.mark([ip], used=False)
