# SPDX-License-Identifier: Apache-2.0
"""What the sync loop (`etcd_sync.EtcdSync`) has to apply: 'nodes', 'routes', 'overlay',
'restore'. The watches' changes queue work in it, and so does `repair.RecordRepair` when a
record is to be written back. Built first (with the `state.clusterview.ClusterView` the
watches write), handed to each at construction.
"""

from __future__ import annotations

import threading


class SyncQueue:
    def __init__(self) -> None:
        self._pending: set[str] = set()
        self._mutex = threading.Lock()
        self._wake = threading.Event()

    def put(self, what: str) -> None:
        """'nodes', 'routes', 'overlay' (the resolved remote pods looked up again) or
        'restore'."""
        with self._mutex:
            self._pending.add(what)
        self._wake.set()

    def take(self) -> set[str]:
        with self._mutex:
            todo, self._pending = self._pending, set()
        return todo

    def wait(self, timeout: float) -> bool:
        """Whether work was queued within `timeout` seconds (it stays queued)."""
        return self._wake.wait(timeout)

    def clear_wake(self) -> None:
        self._wake.clear()
