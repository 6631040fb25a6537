# SPDX-License-Identifier: Apache-2.0
"""etcd v3 over its gRPC API, with the few primitives podnet needs.

One gRPC channel per endpoint, shared by every thread (HTTP/2 multiplexes the calls),
TLS with the node's client certificate: with etcd's `--client-cert-auth` and
authentication on, etcd takes the certificate's common name as the user, so each node acts
with its own permissions (docs/security.md, "etcd authentication"). Proxy variables are
not read. Messages come from etcd's own .proto files (`podnet.state.etcdpb`). Endpoints are
tried in order; a failing endpoint is moved to the back.

This module is the client: channels, endpoints and retries, the calls and the errors they
raise. What a request says (messages, `op_*`, `cmp_*`, `KV`, `TxnResult`) is in
`podnet.state.etcdops`; the shared Watch stream (`Watches`) in `podnet.state.etcdwatch`.

Why this client and not another: docs/dependencies.md ("etcd client"), with the measured
CPU per request on both sides.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import grpc

from podnet.config import NodeConfig
from podnet.state.etcdops import (
    KV,
    DeleteRangeRequest,
    DeleteRangeResponse,
    LeaseGrantRequest,
    LeaseGrantResponse,
    LeaseKeepAliveRequest,
    LeaseKeepAliveResponse,
    LeaseRevokeRequest,
    LeaseRevokeResponse,
    LeaseTimeToLiveRequest,
    LeaseTimeToLiveResponse,
    PutRequest,
    PutResponse,
    RangeRequest,
    RangeResponse,
    StatusRequest,
    StatusResponse,
    TxnRequest,
    TxnResponse,
    TxnResult,
    WatchRequest,
    WatchResponse,
    kv_of,
    op_delete,
    op_put,
    prefix_end,
)
from podnet.state.etcdwatch import Watcher, Watches

log = logging.getLogger("podnet.store")

_UNARY: dict[str, tuple[Any, Any]] = {
    "/etcdserverpb.KV/Range": (RangeRequest, RangeResponse),
    "/etcdserverpb.KV/Put": (PutRequest, PutResponse),
    "/etcdserverpb.KV/DeleteRange": (DeleteRangeRequest, DeleteRangeResponse),
    "/etcdserverpb.KV/Txn": (TxnRequest, TxnResponse),
    "/etcdserverpb.Lease/LeaseGrant": (LeaseGrantRequest, LeaseGrantResponse),
    "/etcdserverpb.Lease/LeaseRevoke": (LeaseRevokeRequest, LeaseRevokeResponse),
    "/etcdserverpb.Lease/LeaseTimeToLive": (LeaseTimeToLiveRequest, LeaseTimeToLiveResponse),
    "/etcdserverpb.Maintenance/Status": (StatusRequest, StatusResponse),
}
_STREAMS: dict[str, tuple[Any, Any]] = {
    "/etcdserverpb.Watch/Watch": (WatchRequest, WatchResponse),
    "/etcdserverpb.Lease/LeaseKeepAlive": (LeaseKeepAliveRequest, LeaseKeepAliveResponse),
}

#: the channel's settings: no proxy variables; keepalive pings while a stream is open (etcd
#: refuses pings more often than every 5 s and pings without a call: --grpc-keepalive-*),
#: so a dead connection under a watch is noticed in about 15 s; no message size limit on
#: our side (etcd bounds requests with --max-request-bytes)
_CHANNEL_OPTIONS = [
    ("grpc.enable_http_proxy", 0),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    # after an outage, connect again within a second of etcd's return (gRPC's default
    # backoff grows to 120 s, and a call meanwhile fails at once: UNAVAILABLE). Not
    # grpc.min_reconnect_backoff_ms: gRPC takes it as the connect timeout too (default 20 s),
    # and at 200 ms a busy etcd (400 nodes connecting at once) never finished a handshake.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
#: codes after which another endpoint is tried (the request may not have been served)
_RETRY = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class EtcdUnavailable(Exception):
    """No endpoint answered (network, TLS or server error)."""


class EtcdRequestError(Exception):
    """etcd answered with an error for this request (bad request, too many ops...)."""


class EtcdPermissionDenied(EtcdRequestError):
    """etcd's authentication refused the request (this certificate's user may not)."""


def _target(endpoint: str) -> tuple[str, bool]:
    """`https://10.0.0.1:2379` -> ("10.0.0.1:2379", TLS)."""
    u = urllib.parse.urlsplit(endpoint if "://" in endpoint else "http://" + endpoint)
    host = u.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{u.port or 2379}", u.scheme == "https"


#: writes remembered for the watch lag (revisions no watch of this client covers age out)
WRITTEN_MAX = 1024


def _bounded_put(d: dict[int, float], key: int, value: float) -> None:
    d[key] = value
    while len(d) > WRITTEN_MAX:
        del d[next(iter(d))]


class Etcd:
    def __init__(
        self,
        endpoints: list[str],
        ca: str | None,
        cert: str | None,
        key: str | None,
        timeout: float = 5.0,
        observe: Callable[[float], None] | None = None,
        observe_watch: Callable[[float], None] | None = None,
    ) -> None:
        """`observe`: called with each unary call's round trip in seconds (metrics);
        `observe_watch`: with the delay from a write of this client to its event on one of
        this client's watches (the watch's lag, metrics)."""
        if not endpoints:
            raise ValueError("no etcd endpoint")
        self.endpoints = list(endpoints)
        self.ca, self.cert, self.key = ca, cert, key
        self.timeout = timeout
        self._ep_lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._calls: dict[tuple[str, str], Any] = {}
        self._creds: grpc.ChannelCredentials | None = None
        self.errors = 0  # counted for metrics
        self.on_error: Callable[[], None] | None = None
        self.max_txn_ops = 4096  # lowered automatically when the server refuses
        self.requests = 0  # unary calls sent (benchmarks count them)
        self._watches: Watches | None = None
        self._observe = observe
        self._observe_watch = observe_watch
        #: revision -> when this client's write of it returned (its watch lag is measured
        #: when the event arrives); bounded: a write no watch covers ages out
        self._written: dict[int, float] = {}
        #: revision -> when a watch delivered it (a write's answer can come after its event)
        self._seen: dict[int, float] = {}
        self._written_lock = threading.Lock()

    @classmethod
    def of_node(
        cls,
        cfg: NodeConfig,
        endpoints: list[str] | None = None,
        observe: Callable[[float], None] | None = None,
        observe_watch: Callable[[float], None] | None = None,
    ) -> Etcd:
        """The client a node's configuration (podnet.yml) describes: its endpoints (or
        `endpoints`), its client certificate and its timeout."""
        eps = cfg.etcd_endpoints if endpoints is None else endpoints
        return cls(
            eps, cfg.etcd_ca, cfg.etcd_cert, cfg.etcd_key, cfg.etcd_timeout, observe, observe_watch
        )

    # -- transport ------------------------------------------------------------------
    def _credentials(self) -> grpc.ChannelCredentials:
        if self._creds is None:
            ca = Path(self.ca).read_bytes() if self.ca else None
            if self.cert and self.key:
                self._creds = grpc.ssl_channel_credentials(
                    ca, Path(self.key).read_bytes(), Path(self.cert).read_bytes()
                )
            else:
                self._creds = grpc.ssl_channel_credentials(ca)
        return self._creds

    def channel(self, ep: str) -> grpc.Channel:
        with self._ep_lock:
            ch = self._channels.get(ep)
            if ch is None:
                target, tls = _target(ep)
                ch = (
                    grpc.secure_channel(target, self._credentials(), _CHANNEL_OPTIONS)
                    if tls
                    else grpc.insecure_channel(target, _CHANNEL_OPTIONS)
                )
                self._channels[ep] = ch
            return ch

    def _method(self, ep: str, path: str) -> Any:
        fn = self._calls.get((ep, path))
        if fn is None:
            req, resp = _UNARY.get(path) or _STREAMS[path]
            ch = self.channel(ep)
            make = ch.unary_unary if path in _UNARY else ch.stream_stream
            fn = make(
                path,
                request_serializer=req.SerializeToString,
                response_deserializer=resp.FromString,
            )
            self._calls[(ep, path)] = fn
        return fn

    def first_endpoint(self) -> str:
        with self._ep_lock:
            return self.endpoints[0]

    def demote(self, ep: str) -> None:
        """`ep` failed: try the others first from now on."""
        with self._ep_lock:
            if ep in self.endpoints and len(self.endpoints) > 1:
                self.endpoints.remove(ep)
                self.endpoints.append(ep)

    def call(self, path: str, request: Any, timeout: float | None = None) -> Any:
        """One unary call, on the first endpoint that answers."""
        with self._ep_lock:
            eps = list(self.endpoints)
        self.requests += 1
        last: Exception | None = None
        for ep in eps:
            t0 = time.monotonic()
            try:
                return self._method(ep, path)(request, timeout=timeout or self.timeout)
            except grpc.RpcError as e:
                self.count_error()
                code, details = e.code(), e.details() or ""
                if code in _RETRY:
                    last = EtcdUnavailable(f"{ep}: {details or code.name}")
                    self.demote(ep)
                    continue
                raise request_error(path, code, details) from None
            finally:
                if self._observe is not None:
                    self._observe(time.monotonic() - t0)
        raise EtcdUnavailable(f"etcd unreachable ({', '.join(eps)}): {last}")

    def wrote(self, revision: int) -> None:
        """This client's write made `revision` (measured when a watch sees it)."""
        if (
            self._observe_watch is not None
            and revision > 0
            and self._meet(revision, self._seen, self._written) is not None
        ):
            self._observe_watch(0.0)  # the event came before the write's answer: no lag

    def watched(self, revision: int) -> None:
        """A watch delivered the event of `revision`: its lag, if this client wrote it."""
        if self._observe_watch is not None:
            lag = self._meet(revision, self._written, self._seen)
            if lag is not None:
                self._observe_watch(lag)

    def _meet(self, revision: int, other: dict[int, float], mine: dict[int, float]) -> float | None:
        """The write and the event of `revision` meet: the seconds since the other side was
        noted in `other`, or None (this side is noted in `mine` until the other comes)."""
        now = time.monotonic()
        with self._written_lock:
            t = other.pop(revision, None)
            if t is None:
                _bounded_put(mine, revision, now)
        return None if t is None else now - t

    def count_error(self) -> None:
        self.errors += 1
        if self.on_error:
            self.on_error()

    def close(self) -> None:
        if self._watches is not None:
            self._watches.close()
        with self._ep_lock:
            channels, self._channels = list(self._channels.values()), {}
            self._calls = {}
        for ch in channels:
            ch.close()

    # -- kv ----------------------------------------------------------------------------
    def get(self, key: str, serializable: bool = False) -> KV | None:
        r = self.call(
            "/etcdserverpb.KV/Range", RangeRequest(key=key.encode(), serializable=serializable)
        )
        return kv_of(r.kvs[0]) if r.kvs else None

    def get_json(self, key: str) -> Any:
        kv = self.get(key)
        return kv.json() if kv else None

    def get_prefix(self, prefix: str, keys_only: bool = False) -> tuple[list[KV], int]:
        k = prefix.encode()
        r = self.call(
            "/etcdserverpb.KV/Range",
            RangeRequest(key=k, range_end=prefix_end(k), keys_only=keys_only),
            timeout=max(self.timeout, 30.0),
        )
        return [kv_of(m) for m in r.kvs], int(r.header.revision)

    def put(self, key: str, value: Any, lease: int = 0) -> int:
        r = self.call("/etcdserverpb.KV/Put", op_put(key, value, lease).request_put)
        self.wrote(int(r.header.revision))
        return int(r.header.revision)

    def delete(self, key: str, prefix: bool = False, timeout: float | None = None) -> int:
        r = self.call(
            "/etcdserverpb.KV/DeleteRange", op_delete(key, prefix).request_delete_range, timeout
        )
        if r.deleted:
            self.wrote(int(r.header.revision))
        return int(r.deleted)

    def txn(
        self, compare: list[Any], success: list[Any], failure: list[Any] | None = None
    ) -> TxnResult:
        r = self.call(
            "/etcdserverpb.KV/Txn",
            TxnRequest(compare=compare, success=success, failure=failure or []),
        )
        if r.succeeded and any(op.WhichOneof("request") != "request_range" for op in success):
            self.wrote(int(r.header.revision))
        return TxnResult(bool(r.succeeded), int(r.header.revision), list(r.responses))

    def put_many(self, ops: Iterable[Any]) -> None:
        """Unguarded puts/deletes, split into transactions the server accepts."""
        batch: list[Any] = []
        for op in ops:
            batch.append(op)
            if len(batch) >= self.max_txn_ops:
                self._txn_split(batch)
                batch = []
        if batch:
            self._txn_split(batch)

    def _txn_split(self, ops: list[Any]) -> None:
        try:
            self.txn([], ops)
        except EtcdRequestError as e:
            if not too_large(e) or len(ops) <= 1:
                raise
            self.max_txn_ops = max(1, len(ops) // 2)
            for i in range(0, len(ops), self.max_txn_ops):
                self._txn_split(ops[i : i + self.max_txn_ops])

    # -- leases ------------------------------------------------------------------------
    def lease_grant(self, ttl: int) -> int:
        return int(self.call("/etcdserverpb.Lease/LeaseGrant", LeaseGrantRequest(TTL=ttl)).ID)

    def lease_revoke(self, lease: int) -> None:
        self.call("/etcdserverpb.Lease/LeaseRevoke", LeaseRevokeRequest(ID=lease))

    def lease_keepalive(self, lease: int) -> int:
        """Refresh a lease once; returns the remaining TTL (0 = lease is gone)."""
        with self._ep_lock:
            eps = list(self.endpoints)
        self.requests += 1
        for ep in eps:
            call = self._method(ep, "/etcdserverpb.Lease/LeaseKeepAlive")(
                iter([LeaseKeepAliveRequest(ID=lease)]), timeout=self.timeout
            )
            try:
                for resp in call:
                    return int(resp.TTL)
                return 0
            except grpc.RpcError as e:
                self.count_error()
                if e.code() in _RETRY:
                    self.demote(ep)
                    continue
                raise request_error("LeaseKeepAlive", e.code(), e.details() or "") from None
            finally:
                call.cancel()
        raise EtcdUnavailable(f"etcd unreachable ({', '.join(eps)}): lease keepalive")

    def lease_ttl(self, lease: int) -> int:
        r = self.call("/etcdserverpb.Lease/LeaseTimeToLive", LeaseTimeToLiveRequest(ID=lease))
        return int(r.TTL)

    def status(self) -> dict[str, Any]:
        r = self.call("/etcdserverpb.Maintenance/Status", StatusRequest())
        return {
            "version": r.version,
            "leader": str(r.leader),
            "revision": int(r.header.revision),
            "db_size": int(r.dbSize),
        }

    # -- watch -------------------------------------------------------------------------
    @property
    def watches(self) -> Watches:
        with self._ep_lock:
            if self._watches is None:
                self._watches = Watches(self)
            return self._watches

    def watch_prefix(
        self,
        prefix: str,
        start_revision: int,
        callback: Callable[[str, str, KV | None], None],
        resync: Callable[[], int],
        stop: threading.Event | None = None,
    ) -> Watcher:
        """Watch `prefix` from the revision after `start_revision`.

        callback(kind, key, kv) with kind "put"/"delete", on the watch stream's thread (one
        for all of this client's watchers: callbacks must be quick). After a broken stream
        the watcher resumes from the revision after the last one it saw; when etcd
        compacted that revision away, `resync()` re-lists and returns the revision to
        continue after. `stop`, once set, ends the watcher.
        """
        k = prefix.encode()
        return self.watches.add(prefix, prefix_end(k), start_revision, callback, resync, stop)


def request_error(what: str, code: grpc.StatusCode, details: str) -> EtcdRequestError:
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return EtcdPermissionDenied(f"etcd refused {what}: {details}")
    return EtcdRequestError(f"etcd refused {what}: {details or code.name}")


def too_large(e: Exception) -> bool:
    """etcd refused a transaction for its size (ops or bytes): smaller ones may pass."""
    text = str(e)
    return "too many operations" in text or "request is too large" in text
