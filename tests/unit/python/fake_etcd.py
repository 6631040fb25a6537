# SPDX-License-Identifier: Apache-2.0
"""An in-memory etcd with etcd's transaction semantics (unit tests only).

It implements what `podnet.state.store.Etcd` offers the allocator: get, get_prefix, txn
(compares on CREATE/VALUE/MOD revisions; put, delete_range, range and count requests),
put_many, and leases (granted, kept alive, revoked or `expire`d with their keys). The real
etcd is used by tests/agent and tests/integration.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from podnet.state.etcdops import KV, TxnResult, op_delete, op_put
from podnet.state.etcdpb import message

ResponseOp = message("etcdserverpb.ResponseOp")


class FakeEtcd:
    def __init__(self) -> None:
        self.data: dict[str, KV] = {}
        self.rev = 1
        self.lock = threading.Lock()
        self.max_txn_ops = 4096
        self.txns = 0  # transactions sent (the wait path must send none)
        self.reads = 0
        self.leases: dict[int, int] = {}  # lease -> TTL

    # -- reads ---------------------------------------------------------------------------
    def _range(self, key: str, end: str | None) -> list[KV]:
        if end is None:
            return [self.data[key]] if key in self.data else []
        return [self.data[k] for k in sorted(self.data) if key <= k < end]

    def get(self, key: str, serializable: bool = False) -> KV | None:
        del serializable
        with self.lock:
            self.reads += 1
            return self.data.get(key)

    def get_prefix(self, prefix: str, keys_only: bool = False) -> tuple[list[KV], int]:
        del keys_only
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        with self.lock:
            self.reads += 1
            return self._range(prefix, end), self.rev

    # -- writes --------------------------------------------------------------------------
    def _compare(self, c: Any) -> bool:
        kv = self.data.get(c.key.decode())
        if c.target == 0 and c.result == 1:  # VERSION GREATER (0: the key exists)
            return kv is not None
        assert c.result == 0, c  # EQUAL
        if c.target == 1:  # CREATE
            return (kv.create_revision if kv else 0) == c.create_revision
        if c.target == 2:  # MOD
            return (kv.mod_revision if kv else 0) == c.mod_revision
        if c.target == 3:  # VALUE
            return kv is not None and kv.value == c.value.decode()
        raise AssertionError(f"unknown compare {c}")

    def _apply(self, op: Any) -> Any:
        which = op.WhichOneof("request")
        if which == "request_put":
            r = op.request_put
            key, old = r.key.decode(), self.data.get(r.key.decode())
            created = old.create_revision if old else self.rev
            self.data[key] = KV(key, r.value.decode(), created, self.rev, r.lease)
            return ResponseOp(response_put={})
        if which == "request_delete_range":
            r = op.request_delete_range
            gone = self._range(r.key.decode(), r.range_end.decode() or None)
            for kv in gone:
                del self.data[kv.key]
            return ResponseOp(response_delete_range={"deleted": len(gone)})
        if which == "request_range":
            r = op.request_range
            kvs = self._range(r.key.decode(), r.range_end.decode() or None)
            if r.count_only:
                return ResponseOp(response_range={"count": len(kvs)})
            enc = [
                {
                    "key": kv.key.encode(),
                    "value": kv.value.encode(),
                    "create_revision": kv.create_revision,
                    "mod_revision": kv.mod_revision,
                }
                for kv in kvs
            ]
            return ResponseOp(response_range={"kvs": enc, "count": len(kvs)})
        if which == "request_txn":
            r = op.request_txn
            ok = all(self._compare(c) for c in r.compare)
            done = [self._apply(o) for o in (r.success if ok else r.failure)]
            return ResponseOp(response_txn={"succeeded": ok, "responses": done})
        raise AssertionError(f"unknown op {op}")

    def txn(
        self, compare: list[Any], success: list[Any], failure: list[Any] | None = None
    ) -> TxnResult:
        with self.lock:
            self.txns += 1
            ok = all(self._compare(c) for c in compare)
            self.rev += 1
            responses = [self._apply(op) for op in (success if ok else failure or [])]
            return TxnResult(ok, self.rev, responses)

    def put_many(self, ops: Iterable[Any]) -> None:
        todo = list(ops)
        for i in range(0, len(todo), self.max_txn_ops):
            self.txn([], todo[i : i + self.max_txn_ops])

    def put(self, key: str, value: Any, lease: int = 0) -> int:
        return self.txn([], [op_put(key, value, lease)]).revision

    def delete(self, key: str, prefix: bool = False) -> int:
        res = self.txn([], [op_delete(key, prefix)])
        return int(res.responses[0].response_delete_range.deleted)

    # -- leases ----------------------------------------------------------------------------
    def lease_grant(self, ttl: int) -> int:
        with self.lock:
            lease = 1000 + len(self.leases)
            self.leases[lease] = ttl
            return lease

    def lease_keepalive(self, lease: int) -> int:
        return self.leases.get(lease, 0)

    def lease_revoke(self, lease: int) -> None:
        self.expire(lease)

    def expire(self, lease: int) -> None:
        """The lease ends: its keys go, as etcd deletes them."""
        with self.lock:
            self.leases.pop(lease, None)
            for key in [k for k, kv in self.data.items() if kv.lease == lease]:
                del self.data[key]
