# SPDX-License-Identifier: Apache-2.0
"""etcd v3 through its JSON gateway, with the few primitives podnet needs.

Transactions, leases and watches are written against the v3 JSON API (the same on etcd
3.4 and 3.5; the grpc clients either fail to import with protobuf >= 4 or add a large
dependency, docs/dependencies.md) over the standard library's `http.client`: every thread
keeps one connection per endpoint (TLS with the node's client certificate; no proxy
variable is read). Measured here, a range request costs 0.31 ms of CPU this way and
1.23 ms through `requests` (docs/dependencies.md): on a node whose cores other jobs keep
busy, the client's CPU is most of a pod's etcd cost. Endpoints are tried in order; a
failing endpoint is moved to the back.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("podnet.store")


_HEADERS = {"Content-Type": "application/json"}
#: a watch stream silent this long is reopened from the last revision seen
WATCH_READ_TIMEOUT = 60.0


class EtcdUnavailable(Exception):
    """No endpoint answered (network, TLS or server error)."""


class EtcdRequestError(Exception):
    """etcd answered with an error for this request (bad request, too many ops...)."""


def b64(s: str | bytes) -> str:
    if isinstance(s, str):
        s = s.encode()
    return base64.b64encode(s).decode()


def unb64(s: str) -> str:
    return base64.b64decode(s).decode()


def _range_end_b64(prefix: str) -> str:
    b = bytearray(prefix.encode())
    b[-1] += 1
    return base64.b64encode(bytes(b)).decode()


@dataclass
class KV:
    key: str
    value: str
    create_revision: int
    mod_revision: int
    lease: int = 0

    def json(self) -> Any:
        return json.loads(self.value)


def _kv(d: dict[str, Any]) -> KV:
    return KV(
        key=unb64(d["key"]),
        value=unb64(d["value"]) if d.get("value") else "",
        create_revision=int(d.get("create_revision", 0)),
        mod_revision=int(d.get("mod_revision", 0)),
        lease=int(d.get("lease", 0)),
    )


# -- txn op builders (v3 JSON) --------------------------------------------------------
def op_put(key: str, value: Any, lease: int = 0) -> dict[str, Any]:
    v = value if isinstance(value, str) else json_dumps(value)
    req: dict[str, Any] = {"key": b64(key), "value": b64(v)}
    if lease:
        req["lease"] = lease
    return {"request_put": req}


def op_delete(key: str, prefix: bool = False) -> dict[str, Any]:
    req: dict[str, Any] = {"key": b64(key)}
    if prefix:
        req["range_end"] = _range_end_b64(key)
    return {"request_delete_range": req}


def op_get(key: str, prefix: bool = False) -> dict[str, Any]:
    req: dict[str, Any] = {"key": b64(key)}
    if prefix:
        req["range_end"] = _range_end_b64(key)
    return {"request_range": req}


def op_count(prefix: str) -> dict[str, Any]:
    """Count the keys under `prefix` (read with `TxnResult.range_count`)."""
    return {
        "request_range": {
            "key": b64(prefix),
            "range_end": _range_end_b64(prefix),
            "count_only": True,
        }
    }


def cmp_value(key: str, value: str) -> dict[str, Any]:
    """The key exists and holds exactly `value`."""
    return {"key": b64(key), "target": "VALUE", "result": "EQUAL", "value": b64(value)}


def cmp_absent(key: str) -> dict[str, Any]:
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}


def cmp_mod(key: str, revision: int) -> dict[str, Any]:
    """The key was last written at `revision` (0: the key is absent)."""
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}


@dataclass
class TxnResult:
    succeeded: bool
    revision: int
    responses: list[dict[str, Any]] = field(default_factory=list)

    def range_kvs(self, i: int) -> list[KV]:
        r = self.responses[i].get("response_range", {})
        return [_kv(k) for k in r.get("kvs", [])]

    def range_count(self, i: int) -> int:
        return int(self.responses[i].get("response_range", {}).get("count", 0))


class Etcd:
    def __init__(
        self,
        endpoints: list[str],
        ca: str | None,
        cert: str | None,
        key: str | None,
        timeout: float = 5.0,
    ) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoint")
        self.endpoints = list(endpoints)
        self.ca, self.cert, self.key = ca, cert, key
        self.timeout = timeout
        self._local = threading.local()
        self._ssl_ctx: ssl.SSLContext | None = None
        self._ep_lock = threading.Lock()
        self.errors = 0  # counted for metrics
        self.on_error: Callable[[], None] | None = None
        self.max_txn_ops = 4096  # lowered automatically when the server refuses

    # -- transport ------------------------------------------------------------------
    def _ssl(self) -> ssl.SSLContext:
        ctx = self._ssl_ctx
        if ctx is None:
            ctx = ssl.create_default_context(cafile=self.ca)
            if self.cert and self.key:
                ctx.load_cert_chain(self.cert, self.key)
            self._ssl_ctx = ctx
        return ctx

    def _connect(self, ep: str, timeout: float) -> http.client.HTTPConnection:
        u = urllib.parse.urlsplit(ep)
        host, port = u.hostname or "127.0.0.1", u.port or 2379
        if u.scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=self._ssl())
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def _exchange(self, ep: str, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        """One request on this thread's connection to `ep` (a new one if it has none or
        the kept one was closed by the server while idle)."""
        conns: dict[str, http.client.HTTPConnection] = self._local.__dict__.setdefault("conns", {})
        for attempt in (0, 1):
            conn = conns.get(ep)
            reused = conn is not None
            if conn is None:
                conn = conns[ep] = self._connect(ep, timeout)
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            try:
                conn.request("POST", "/v3/" + path, body, _HEADERS)
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                conns.pop(ep, None)
                stale = isinstance(
                    e,
                    (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError),
                )
                if not (reused and stale and attempt == 0):
                    raise
        raise AssertionError("unreachable")

    def post(self, path: str, payload: dict[str, Any], timeout: float | None = None) -> Any:
        with self._ep_lock:
            eps = list(self.endpoints)
        last: Exception | None = None
        body = json.dumps(payload).encode()
        for ep in eps:
            try:
                status, data = self._exchange(ep, path, body, timeout or self.timeout)
            except (OSError, http.client.HTTPException) as e:
                last = e
                self._count_error()
                with self._ep_lock:
                    if ep in self.endpoints and len(self.endpoints) > 1:
                        self.endpoints.remove(ep)
                        self.endpoints.append(ep)
                continue
            if status == 200:
                return json.loads(data)
            self._count_error()
            text = data.decode(errors="replace")
            try:
                err = json.loads(data)
                msg = str(err.get("message") or err.get("error") or text)
            except ValueError:
                msg = text
            if status >= 500 and "too many operations" not in msg:
                last = EtcdUnavailable(f"{ep}: HTTP {status}: {msg}")
                continue
            raise EtcdRequestError(f"etcd refused {path}: {msg}")
        raise EtcdUnavailable(f"etcd unreachable ({', '.join(eps)}): {last}")

    def _stream(
        self, ep: str, body: dict[str, Any], read_timeout: float
    ) -> Iterator[dict[str, Any]]:
        """A watch stream on its own connection: one result object per line."""
        conn = self._connect(ep, self.timeout)
        try:
            conn.request("POST", "/v3/watch", json.dumps(body).encode(), _HEADERS)
            resp = conn.getresponse()
            if resp.status != 200:
                raise http.client.HTTPException(f"watch: HTTP {resp.status}")
            if conn.sock is not None:
                conn.sock.settimeout(read_timeout)
            while True:
                line = resp.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line).get("result") or {}
        finally:
            conn.close()

    def _count_error(self) -> None:
        self.errors += 1
        if self.on_error:
            self.on_error()

    # -- kv ----------------------------------------------------------------------------
    def get(self, key: str) -> KV | None:
        r = self.post("kv/range", {"key": b64(key)})
        kvs = r.get("kvs") or []
        return _kv(kvs[0]) if kvs else None

    def get_or_wait(self, key: str, timeout: float) -> KV | None:
        """`key`'s value, waiting up to `timeout` seconds for someone to write it.

        Two requests however long the wait: a serializable read (no quorum round; if this
        member lags, the watch below replays what it has not seen yet), then, when the key
        is absent, a watch on that key alone from the revision after the read, closed at
        the first put or at the deadline. Polling sends a read per try and sees the write
        up to one pause late. None if the key is still absent at the deadline.
        """
        r = self.post("kv/range", {"key": b64(key), "serializable": True})
        kvs = r.get("kvs") or []
        if kvs:
            return _kv(kvs[0])
        body = {
            "create_request": {
                "key": b64(key),
                "start_revision": str(int(r["header"]["revision"]) + 1),
            }
        }
        end = time.monotonic() + timeout
        with self._ep_lock:
            ep = self.endpoints[0]
        try:
            for res in self._stream(ep, body, max(0.001, timeout)):
                for ev in res.get("events") or []:
                    if ev.get("type") != "DELETE":
                        return _kv(ev["kv"])
                if res.get("canceled") or time.monotonic() >= end:
                    break
        except (OSError, http.client.HTTPException, ValueError) as e:
            # the read timeout (the deadline passed) or a broken stream: one last read
            # below answers either way (and raises if etcd is gone)
            log.debug("watch %s: %s", key, e)
        return self.get(key)

    def get_json(self, key: str) -> Any:
        kv = self.get(key)
        return kv.json() if kv else None

    def get_prefix(self, prefix: str, keys_only: bool = False) -> tuple[list[KV], int]:
        payload: dict[str, Any] = {"key": b64(prefix), "range_end": _range_end_b64(prefix)}
        if keys_only:
            payload["keys_only"] = True
        r = self.post("kv/range", payload, timeout=max(self.timeout, 30.0))
        return [_kv(k) for k in r.get("kvs") or []], int(r["header"]["revision"])

    def put(self, key: str, value: Any, lease: int = 0) -> int:
        r = self.post("kv/put", op_put(key, value, lease)["request_put"])
        return int(r["header"]["revision"])

    def delete(self, key: str, prefix: bool = False) -> int:
        r = self.post("kv/deleterange", op_delete(key, prefix)["request_delete_range"])
        return int(r.get("deleted", 0))

    def txn(
        self,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]] | None = None,
    ) -> TxnResult:
        r = self.post("kv/txn", {"compare": compare, "success": success, "failure": failure or []})
        return TxnResult(
            bool(r.get("succeeded", False)), int(r["header"]["revision"]), r.get("responses") or []
        )

    def put_many(self, ops: Iterable[dict[str, Any]]) -> None:
        """Unguarded puts/deletes, split into transactions the server accepts."""
        batch: list[dict[str, Any]] = []
        for op in ops:
            batch.append(op)
            if len(batch) >= self.max_txn_ops:
                self._txn_split(batch)
                batch = []
        if batch:
            self._txn_split(batch)

    def _txn_split(self, ops: list[dict[str, Any]]) -> None:
        try:
            self.txn([], ops)
        except EtcdRequestError as e:
            if "too many operations" not in str(e) or len(ops) <= 1:
                raise
            self.max_txn_ops = max(1, len(ops) // 2)
            for i in range(0, len(ops), self.max_txn_ops):
                self._txn_split(ops[i : i + self.max_txn_ops])

    # -- leases ------------------------------------------------------------------------
    def lease_grant(self, ttl: int) -> int:
        r = self.post("lease/grant", {"TTL": ttl, "ID": 0})
        return int(r["ID"])

    def lease_keepalive(self, lease: int) -> int:
        """Refresh a lease once; returns the remaining TTL (0 = lease is gone)."""
        r = self.post("lease/keepalive", {"ID": lease})
        res = r.get("result", r)
        return int(res.get("TTL", 0))

    def lease_ttl(self, lease: int) -> int:
        r = self.post("kv/lease/timetolive", {"ID": lease})
        return int(r.get("TTL", -1))

    def status(self) -> dict[str, Any]:
        return dict(self.post("maintenance/status", {}))

    # -- watch -------------------------------------------------------------------------
    def watch_prefix(
        self,
        prefix: str,
        start_revision: int,
        callback: Callable[[str, str, KV | None], None],
        resync: Callable[[], int],
        stop: threading.Event,
    ) -> threading.Thread:
        """Watch `prefix` from `start_revision` in a thread.

        callback(kind, key, kv) with kind "put"/"delete". On any stream error the
        watch restarts from the last seen revision; on compaction it calls `resync()`
        (which must re-list and return the revision to continue from).
        """
        t = threading.Thread(
            target=self._watch_loop,
            name=f"watch {prefix}",
            daemon=True,
            args=(prefix, start_revision, callback, resync, stop),
        )
        t.start()
        return t

    def _watch_loop(
        self,
        prefix: str,
        rev: int,
        callback: Callable[[str, str, KV | None], None],
        resync: Callable[[], int],
        stop: threading.Event,
    ) -> None:
        next_rev = rev + 1
        while not stop.is_set():
            with self._ep_lock:
                ep = self.endpoints[0]
            body = {
                "create_request": {
                    "key": b64(prefix),
                    "range_end": _range_end_b64(prefix),
                    "start_revision": str(next_rev),
                    "progress_notify": True,
                }
            }
            try:
                next_rev = self._watch_stream(ep, body, next_rev, callback, resync, stop)
            except (OSError, http.client.HTTPException, ValueError) as e:
                if stop.is_set():
                    return
                log.debug("watch %s: %s; reconnecting", prefix, e)
                self._count_error()
                with self._ep_lock:
                    if len(self.endpoints) > 1:
                        self.endpoints.append(self.endpoints.pop(0))
                stop.wait(0.5)
            except Exception:  # a callback bug must not kill the watch for good
                log.exception("watch %s: callback failed; resynchronising", prefix)
                try:
                    next_rev = resync() + 1
                except Exception:
                    stop.wait(1)

    def _watch_stream(
        self,
        ep: str,
        body: dict[str, Any],
        next_rev: int,
        callback: Callable[[str, str, KV | None], None],
        resync: Callable[[], int],
        stop: threading.Event,
    ) -> int:
        """Follow one watch stream; returns the revision to resume from."""
        for res in self._stream(ep, body, WATCH_READ_TIMEOUT):
            if stop.is_set():
                return next_rev
            if res.get("compact_revision") and int(res["compact_revision"]) > 0:
                return resync() + 1
            if res.get("canceled"):
                return next_rev
            for ev in res.get("events") or []:
                kv = _kv(ev["kv"])
                kind = "delete" if ev.get("type") == "DELETE" else "put"
                callback(kind, kv.key, kv if kind == "put" else None)
                next_rev = max(next_rev, kv.mod_revision + 1)
            hdr = res.get("header") or {}
            if not res.get("events") and not res.get("created") and hdr.get("revision"):
                next_rev = max(next_rev, int(hdr["revision"]) + 1)
        return next_rev


def json_dumps(value: Any) -> str:
    """The exact text op_put stores for a JSON value (for VALUE comparisons)."""
    return json.dumps(value, separators=(",", ":"))
