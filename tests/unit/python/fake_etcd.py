# SPDX-License-Identifier: Apache-2.0
"""An in-memory etcd with the v3 JSON gateway's transaction semantics (unit tests only).

It implements what `podnet.state.store.Etcd` offers the allocator: get, get_prefix, txn
(compares on CREATE/VALUE/MOD revisions; put, delete_range, range and count requests),
put_many. The real etcd is used by tests/agent and tests/integration.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterable
from typing import Any

from podnet.state.store import KV, TxnResult, op_delete, op_put


def _d(s: str) -> str:
    return base64.b64decode(s).decode("latin-1")


class FakeEtcd:
    def __init__(self) -> None:
        self.data: dict[str, KV] = {}
        self.rev = 1
        self.lock = threading.Lock()
        self.max_txn_ops = 4096
        self.txns = 0  # transactions sent (the wait path must send none)
        self.reads = 0

    # -- reads ---------------------------------------------------------------------------
    def _range(self, key: str, end: str | None) -> list[KV]:
        if end is None:
            return [self.data[key]] if key in self.data else []
        return [self.data[k] for k in sorted(self.data) if key <= k < end]

    def get(self, key: str) -> KV | None:
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
    def _compare(self, c: dict[str, Any]) -> bool:
        kv = self.data.get(_d(c["key"]))
        target = c["target"]
        assert c["result"] == "EQUAL", c
        if target == "CREATE":
            return (kv.create_revision if kv else 0) == int(c["create_revision"])
        if target == "MOD":
            return (kv.mod_revision if kv else 0) == int(c["mod_revision"])
        if target == "VALUE":
            return kv is not None and kv.value == _d(c["value"])
        raise AssertionError(f"unknown compare {c}")

    def _apply(self, op: dict[str, Any]) -> dict[str, Any]:
        if "request_put" in op:
            r = op["request_put"]
            key, old = _d(r["key"]), self.data.get(_d(r["key"]))
            created = old.create_revision if old else self.rev
            self.data[key] = KV(key, _d(r["value"]), created, self.rev, int(r.get("lease", 0)))
            return {"response_put": {}}
        if "request_delete_range" in op:
            r = op["request_delete_range"]
            end = _d(r["range_end"]) if "range_end" in r else None
            gone = self._range(_d(r["key"]), end)
            for kv in gone:
                del self.data[kv.key]
            return {"response_delete_range": {"deleted": len(gone)}}
        if "request_range" in op:
            r = op["request_range"]
            end = _d(r["range_end"]) if "range_end" in r else None
            kvs = self._range(_d(r["key"]), end)
            if r.get("count_only"):
                return {"response_range": {"count": len(kvs)}}
            enc = [
                {
                    "key": base64.b64encode(kv.key.encode()).decode(),
                    "value": base64.b64encode(kv.value.encode()).decode(),
                    "create_revision": kv.create_revision,
                    "mod_revision": kv.mod_revision,
                }
                for kv in kvs
            ]
            return {"response_range": {"kvs": enc, "count": len(kvs)}}
        raise AssertionError(f"unknown op {op}")

    def txn(
        self,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]] | None = None,
    ) -> TxnResult:
        with self.lock:
            self.txns += 1
            ok = all(self._compare(c) for c in compare)
            self.rev += 1
            responses = [self._apply(op) for op in (success if ok else failure or [])]
            return TxnResult(ok, self.rev, responses)

    def put_many(self, ops: Iterable[dict[str, Any]]) -> None:
        self.txn([], list(ops))

    def put(self, key: str, value: Any, lease: int = 0) -> int:
        return self.txn([], [op_put(key, value, lease)]).revision

    def delete(self, key: str, prefix: bool = False) -> int:
        res = self.txn([], [op_delete(key, prefix)])
        return int(res.responses[0]["response_delete_range"]["deleted"])
