# SPDX-License-Identifier: Apache-2.0
"""etcd's Watch stream: every watcher of one client on one stream, kept open by a thread.

Each `Etcd.watch_prefix` (`podnet.state.store`) is one `Watcher` on the client's
`Watches`; after a reconnect it resumes from its next revision (the stream carries the
`hasleader` metadata, so a member cut off from its cluster ends it and another endpoint is
used), and it is re-listed through its `resync` when etcd compacted the revision it needs.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from podnet.state.etcdops import EVENT_DELETE, KV, WatchRequest, kv_of

log = logging.getLogger("podnet.store")


class Client(Protocol):
    """What the watch stream needs of its client (`podnet.state.store.Etcd`)."""

    def first_endpoint(self) -> str: ...

    def demote(self, ep: str) -> None: ...

    def count_error(self) -> None: ...

    def watched(self, revision: int) -> None: ...

    def _method(self, ep: str, path: str) -> Any: ...


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

    def __init__(self, etcd: Client) -> None:
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
                kv = kv_of(ev.kv)
                if ev.type == EVENT_DELETE:
                    w.callback("delete", kv.key, None)
                else:
                    w.callback("put", kv.key, kv)
                w.next_rev = max(w.next_rev, ev.kv.mod_revision + 1)
                self.etcd.watched(ev.kv.mod_revision)
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
