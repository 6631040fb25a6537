# SPDX-License-Identifier: Apache-2.0
"""etcd v3 over its gRPC API, with the few primitives podnet needs.

One gRPC channel per endpoint, shared by every thread (HTTP/2 multiplexes the calls),
TLS with the node's client certificate: with etcd's `--client-cert-auth` and
authentication on, etcd takes the certificate's common name as the user, so each node acts
with its own permissions (docs/security.md, "etcd authentication"). Proxy variables are
not read. Messages come from etcd's own .proto files (`podnet.state.etcdpb`). Endpoints are
tried in order; a failing endpoint is moved to the back.

Watches share one Watch stream per client (`Watches`): every `watch_prefix` is one watcher
on it, resumed from its next revision after a reconnect (the stream carries the
`hasleader` metadata, so a member cut off from its cluster ends it and another endpoint is
used), and re-listed through `resync` when etcd compacted the revision it needs.

Why this client and not another: docs/dependencies.md ("etcd client"), with the measured
CPU per request on both sides.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import queue
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from podnet.config import NodeConfig
from podnet.state.etcdpb import message

log = logging.getLogger("podnet.store")

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
_DELETE = 1

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


def _prefix_end(prefix: bytes) -> bytes:
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


def _kv(m: Any) -> KV:
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
        request_delete_range=DeleteRangeRequest(key=k, range_end=_prefix_end(k) if prefix else b"")
    )


def op_get(key: str, prefix: bool = False) -> Any:
    k = key.encode()
    return RequestOp(request_range=RangeRequest(key=k, range_end=_prefix_end(k) if prefix else b""))


def op_keys(prefix: str) -> Any:
    """The keys under `prefix`, without their values (read with `TxnResult.range_kvs`)."""
    k = prefix.encode()
    return RequestOp(request_range=RangeRequest(key=k, range_end=_prefix_end(k), keys_only=True))


def op_count(prefix: str) -> Any:
    """Count the keys under `prefix` (read with `TxnResult.range_count`)."""
    k = prefix.encode()
    return RequestOp(request_range=RangeRequest(key=k, range_end=_prefix_end(k), count_only=True))


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
        return [_kv(k) for k in self.responses[i].response_range.kvs]

    def range_count(self, i: int) -> int:
        return int(self.responses[i].response_range.count)


def _target(endpoint: str) -> tuple[str, bool]:
    """`https://10.0.0.1:2379` -> ("10.0.0.1:2379", TLS)."""
    u = urllib.parse.urlsplit(endpoint if "://" in endpoint else "http://" + endpoint)
    host = u.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{u.port or 2379}", u.scheme == "https"


class Etcd:
    def __init__(
        self,
        endpoints: list[str],
        ca: str | None,
        cert: str | None,
        key: str | None,
        timeout: float = 5.0,
        observe: Callable[[float], None] | None = None,
    ) -> None:
        """`observe`: called with each unary call's round trip in seconds (metrics)."""
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

    @classmethod
    def of_node(
        cls,
        cfg: NodeConfig,
        endpoints: list[str] | None = None,
        observe: Callable[[float], None] | None = None,
    ) -> Etcd:
        """The client a node's configuration (podnet.yml) describes: its endpoints (or
        `endpoints`), its client certificate and its timeout."""
        eps = cfg.etcd_endpoints if endpoints is None else endpoints
        return cls(eps, cfg.etcd_ca, cfg.etcd_cert, cfg.etcd_key, cfg.etcd_timeout, observe)

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
        return _kv(r.kvs[0]) if r.kvs else None

    def get_or_wait(self, key: str, timeout: float) -> KV | None:
        """`key`'s value, waiting up to `timeout` seconds for someone to write it: a
        serializable read, then (key absent) a watcher on the client's watch stream from
        the revision after the read, gone at the first put or at the deadline."""
        r = self.call("/etcdserverpb.KV/Range", RangeRequest(key=key.encode(), serializable=True))
        if r.kvs:
            return _kv(r.kvs[0])
        got: list[KV] = []
        seen = threading.Event()

        def on_event(kind: str, _key: str, kv: KV | None) -> None:
            if kind == "put" and kv is not None and not got:
                got.append(kv)
                seen.set()

        w = self.watches.add(key, None, r.header.revision, on_event, lambda: r.header.revision)
        try:
            seen.wait(timeout)
        finally:
            self.watches.cancel(w)
        return got[0] if got else self.get(key)

    def get_json(self, key: str) -> Any:
        kv = self.get(key)
        return kv.json() if kv else None

    def get_prefix(self, prefix: str, keys_only: bool = False) -> tuple[list[KV], int]:
        k = prefix.encode()
        r = self.call(
            "/etcdserverpb.KV/Range",
            RangeRequest(key=k, range_end=_prefix_end(k), keys_only=keys_only),
            timeout=max(self.timeout, 30.0),
        )
        return [_kv(m) for m in r.kvs], int(r.header.revision)

    def put(self, key: str, value: Any, lease: int = 0) -> int:
        r = self.call("/etcdserverpb.KV/Put", op_put(key, value, lease).request_put)
        return int(r.header.revision)

    def delete(self, key: str, prefix: bool = False, timeout: float | None = None) -> int:
        r = self.call(
            "/etcdserverpb.KV/DeleteRange", op_delete(key, prefix).request_delete_range, timeout
        )
        return int(r.deleted)

    def txn(
        self, compare: list[Any], success: list[Any], failure: list[Any] | None = None
    ) -> TxnResult:
        r = self.call(
            "/etcdserverpb.KV/Txn",
            TxnRequest(compare=compare, success=success, failure=failure or []),
        )
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
        return self.watches.add(prefix, _prefix_end(k), start_revision, callback, resync, stop)


def request_error(what: str, code: grpc.StatusCode, details: str) -> EtcdRequestError:
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return EtcdPermissionDenied(f"etcd refused {what}: {details}")
    return EtcdRequestError(f"etcd refused {what}: {details or code.name}")


def too_large(e: Exception) -> bool:
    """etcd refused a transaction for its size (ops or bytes): smaller ones may pass."""
    text = str(e)
    return "too many operations" in text or "request is too large" in text


# -- the watch stream ---------------------------------------------------------------------
@dataclass(eq=False)
class Watcher:
    key: str
    range_end: bytes | None
    next_rev: int
    callback: Callable[[str, str, KV | None], None]
    resync: Callable[[], int]
    stop: threading.Event | None = None
    id: int = 0
    #: set once etcd confirmed the watcher (events after its start revision follow)
    created: threading.Event = field(default_factory=threading.Event)

    def create_request(self) -> Any:
        return WatchRequest(
            create_request={
                "key": self.key.encode(),
                "range_end": self.range_end or b"",
                "start_revision": self.next_rev,
                "progress_notify": True,
                "watch_id": self.id,
            }
        )


_CLOSE = object()


class Watches:
    """All watchers of one client on one Watch stream, kept open by a thread."""

    def __init__(self, etcd: Etcd) -> None:
        self.etcd = etcd
        self._lock = threading.Lock()
        self._watchers: dict[int, Watcher] = {}
        self._ids = itertools.count(1)
        self._queue: queue.Queue[Any] | None = None  # the open stream's requests
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="etcd watch", daemon=True)
        self._thread.start()

    def add(
        self,
        key: str,
        range_end: bytes | None,
        start_revision: int,
        callback: Callable[[str, str, KV | None], None],
        resync: Callable[[], int],
        stop: threading.Event | None = None,
    ) -> Watcher:
        w = Watcher(key, range_end, start_revision + 1, callback, resync, stop)
        with self._lock:
            w.id = next(self._ids)
            self._watchers[w.id] = w
            if self._queue is not None:
                self._queue.put(w.create_request())
        return w

    def cancel(self, w: Watcher) -> None:
        with self._lock:
            if self._watchers.pop(w.id, None) is not None and self._queue is not None:
                self._queue.put(WatchRequest(cancel_request={"watch_id": w.id}))

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            if self._queue is not None:
                self._queue.put(_CLOSE)

    def _requests(self, q: queue.Queue[Any]) -> Iterator[Any]:
        while True:
            item = q.get()
            if item is _CLOSE:
                return
            yield item

    def _run(self) -> None:
        while not self._closed.is_set():
            ep = self.etcd.first_endpoint()
            q: queue.Queue[Any] = queue.Queue()
            with self._lock:
                self._queue = q
                for w in self._watchers.values():
                    q.put(w.create_request())
            call = self.etcd._method(ep, "/etcdserverpb.Watch/Watch")(
                self._requests(q), metadata=(("hasleader", "true"),)
            )
            try:
                for resp in call:
                    self._dispatch(resp)
                    if self._closed.is_set():
                        break
            except grpc.RpcError as e:
                if self._closed.is_set():
                    break
                log.debug("watch stream to %s: %s; reconnecting", ep, e.details() or e.code())
                self.etcd.count_error()
                self.etcd.demote(ep)
            finally:
                with self._lock:
                    self._queue = None
                q.put(_CLOSE)
                call.cancel()
            self._closed.wait(0.5)

    def _dispatch(self, resp: Any) -> None:
        with self._lock:
            w = self._watchers.get(resp.watch_id)
        if w is None:
            return
        if w.stop is not None and w.stop.is_set():
            self.cancel(w)
            return
        if resp.canceled:
            self._canceled(w, resp)
            return
        if resp.created:
            w.created.set()
        try:
            for ev in resp.events:
                kv = _kv(ev.kv)
                if ev.type == _DELETE:
                    w.callback("delete", kv.key, None)
                else:
                    w.callback("put", kv.key, kv)
                w.next_rev = max(w.next_rev, ev.kv.mod_revision + 1)
        except Exception:  # a callback bug must not end the watch for good
            log.exception("watch %s: callback failed; resynchronising", w.key)
            self._restart(w, self._resync(w))
            return
        if not resp.events and not resp.created and resp.header.revision:
            w.next_rev = max(w.next_rev, resp.header.revision + 1)  # progress notification

    def _canceled(self, w: Watcher, resp: Any) -> None:
        if resp.compact_revision > 0:
            log.info("watch %s: revision %d compacted: re-listing", w.key, w.next_rev)
            self._restart(w, self._resync(w))
            return
        log.warning("watch %s canceled by etcd: %s; again in 1 s", w.key, resp.cancel_reason)
        self.etcd.count_error()
        threading.Timer(1.0, self._restart, (w, w.next_rev)).start()

    def _resync(self, w: Watcher) -> int:
        while not self._closed.is_set():
            try:
                return w.resync() + 1
            except Exception:
                log.exception("watch %s: resync failed; again in 1 s", w.key)
                self._closed.wait(1.0)
        return w.next_rev

    def _restart(self, w: Watcher, rev: int) -> None:
        with self._lock:
            if self._watchers.get(w.id) is not w:
                return
            w.next_rev = rev
            # a new id: the old one may still be open on the server (a failed callback)
            with contextlib.suppress(Exception):
                if self._queue is not None:
                    self._queue.put(WatchRequest(cancel_request={"watch_id": w.id}))
            del self._watchers[w.id]
            w.id = next(self._ids)
            self._watchers[w.id] = w
            if self._queue is not None:
                self._queue.put(w.create_request())
