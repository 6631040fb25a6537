# SPDX-License-Identifier: Apache-2.0
"""What the sync loop (`etcd_sync.EtcdSync`) has to apply: 'nodes', 'routes', 'fdb',
'restore', or a VNI (that user's FDB). The watches' changes queue work in it, and so does
`usernets.UserNetworks` when it made a user's network here (its FDB then gets the user's
pods on other nodes), and `repair.RecordRepair` when a record is to be written back. Built
first (with the `state.clusterview.ClusterView` the watches write), handed to each at
construction.
"""

from __future__ import annotations

import threading


class SyncQueue:
    def __init__(self) -> None:
        self._pending: set[str | int] = set()
        self._mutex = threading.Lock()
        self._wake = threading.Event()

    def put(self, what: str | int) -> None:
        """'nodes', 'routes', 'fdb' (every user), 'restore' or a VNI (that user's FDB)."""
        with self._mutex:
            self._pending.add(what)
        self._wake.set()

    def take(self) -> set[str | int]:
        with self._mutex:
            todo, self._pending = self._pending, set()
        return todo

    def wait(self, timeout: float) -> bool:
        """Whether work was queued within `timeout` seconds (it stays queued)."""
        return self._wake.wait(timeout)

    def clear_wake(self) -> None:
        self._wake.clear()
