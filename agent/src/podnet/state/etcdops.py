# SPDX-License-Identifier: Apache-2.0
"""What podnet says to etcd: its messages, keys and values, transaction builders.

The request and response classes come from etcd's own .proto files
(`podnet.state.etcdpb`); `op_*` and `cmp_*` make the operations and guards of a
transaction (`Etcd.txn`, `podnet.state.store`), `KV` and `TxnResult` are what comes back.
Nothing here talks to a server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from podnet.state.etcdpb import message

# -- messages ---------------------------------------------------------------------------
RangeRequest = message("etcdserverpb.RangeRequest")
RangeResponse = message("etcdserverpb.RangeResponse")
PutRequest = message("etcdserverpb.PutRequest")
PutResponse = message("etcdserverpb.PutResponse")
DeleteRangeRequest = message("etcdserverpb.DeleteRangeRequest")
DeleteRangeResponse = message("etcdserverpb.DeleteRangeResponse")
TxnRequest = message("etcdserverpb.TxnRequest")
TxnResponse = message("etcdserverpb.TxnResponse")
Compare = message("etcdserverpb.Compare")
RequestOp = message("etcdserverpb.RequestOp")
WatchRequest = message("etcdserverpb.WatchRequest")
WatchResponse = message("etcdserverpb.WatchResponse")
LeaseGrantRequest = message("etcdserverpb.LeaseGrantRequest")
LeaseGrantResponse = message("etcdserverpb.LeaseGrantResponse")
LeaseRevokeRequest = message("etcdserverpb.LeaseRevokeRequest")
LeaseRevokeResponse = message("etcdserverpb.LeaseRevokeResponse")
LeaseKeepAliveRequest = message("etcdserverpb.LeaseKeepAliveRequest")
LeaseKeepAliveResponse = message("etcdserverpb.LeaseKeepAliveResponse")
LeaseTimeToLiveRequest = message("etcdserverpb.LeaseTimeToLiveRequest")
LeaseTimeToLiveResponse = message("etcdserverpb.LeaseTimeToLiveResponse")
StatusRequest = message("etcdserverpb.StatusRequest")
StatusResponse = message("etcdserverpb.StatusResponse")

# Compare.target / Compare.result (rpc.proto)
_VERSION, _CREATE, _MOD, _VALUE = 0, 1, 2, 3
_EQUAL, _GREATER = 0, 1
#: mvccpb.Event.type
EVENT_DELETE = 1


def prefix_end(prefix: bytes) -> bytes:
    """The end of the key range of every key that starts with `prefix`."""
    b = bytearray(prefix)
    b[-1] += 1
    return bytes(b)


@dataclass
class KV:
    key: str
    value: str
    create_revision: int
    mod_revision: int
    lease: int = 0

    def json(self) -> Any:
        return json.loads(self.value)


def kv_of(m: Any) -> KV:
    return KV(m.key.decode(), m.value.decode(), m.create_revision, m.mod_revision, m.lease)


_COMPACT = json.JSONEncoder(separators=(",", ":"))


def json_dumps(value: Any) -> str:
    """The exact text op_put stores for a JSON value (for VALUE comparisons); one encoder
    (json.dumps with separators makes a new one per call: a 1000-node job puts 5000 keys)."""
    return _COMPACT.encode(value)


# -- transaction builders -----------------------------------------------------------------
def op_put(key: str, value: Any, lease: int = 0) -> Any:
    v = value if isinstance(value, str) else json_dumps(value)
    return RequestOp(request_put=PutRequest(key=key.encode(), value=v.encode(), lease=lease))


def op_delete(key: str, prefix: bool = False) -> Any:
    k = key.encode()
    return RequestOp(
        request_delete_range=DeleteRangeRequest(key=k, range_end=prefix_end(k) if prefix else b"")
    )


def op_get(key: str, prefix: bool = False) -> Any:
    k = key.encode()
    return RequestOp(request_range=RangeRequest(key=k, range_end=prefix_end(k) if prefix else b""))


def op_if(compare: list[Any], then: list[Any]) -> Any:
    """A transaction nested in another (etcd >= 3.3): `then` if `compare` holds, else
    nothing; its keys must not be among the outer transaction's puts and deletes."""
    return RequestOp(request_txn=TxnRequest(compare=compare, success=then, failure=[]))


def op_keys(prefix: str) -> Any:
    """The keys under `prefix`, without their values (read with `TxnResult.range_kvs`)."""
    k = prefix.encode()
    return RequestOp(request_range=RangeRequest(key=k, range_end=prefix_end(k), keys_only=True))


def op_count(prefix: str) -> Any:
    """Count the keys under `prefix` (read with `TxnResult.range_count`)."""
    k = prefix.encode()
    return RequestOp(request_range=RangeRequest(key=k, range_end=prefix_end(k), count_only=True))


def cmp_value(key: str, value: str) -> Any:
    """The key exists and holds exactly `value`."""
    return Compare(key=key.encode(), target=_VALUE, result=_EQUAL, value=value.encode())


def cmp_absent(key: str) -> Any:
    return Compare(key=key.encode(), target=_CREATE, result=_EQUAL, create_revision=0)


def cmp_present(key: str) -> Any:
    """The key exists."""
    return Compare(key=key.encode(), target=_VERSION, result=_GREATER, version=0)


def cmp_mod(key: str, revision: int) -> Any:
    """The key was last written at `revision` (0: the key is absent)."""
    return Compare(key=key.encode(), target=_MOD, result=_EQUAL, mod_revision=revision)


@dataclass
class TxnResult:
    succeeded: bool
    revision: int
    responses: list[Any] = field(default_factory=list)

    def range_kvs(self, i: int) -> list[KV]:
        return [kv_of(k) for k in self.responses[i].response_range.kvs]

    def range_count(self, i: int) -> int:
        return int(self.responses[i].response_range.count)
