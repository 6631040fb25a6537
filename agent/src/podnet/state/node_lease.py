# SPDX-License-Identifier: Apache-2.0
"""This node in etcd: its liveness key (`alive/<node>`) on its lease, which also carries its
login pods' records, and (when the collection has not written it) its record
(`nodes/<node>`: underlay address, roles).

The lease id is kept in `<state_dir>/lease`: a restart of podnetd shorter than the TTL
reuses the lease, so nothing of a running login pod expires. If the lease is lost
anyway (etcd unreachable for longer than the TTL), `run` registers the node again and
calls `on_new_lease` so the records it carried are written again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from podnet import __version__
from podnet.names import Keys
from podnet.state.etcdops import json_dumps
from podnet.state.store import Etcd, EtcdPermissionDenied, EtcdRequestError, EtcdUnavailable

log = logging.getLogger("podnet.lease")


class NodeLease:
    def __init__(
        self,
        etcd: Etcd,
        keys: Keys,
        node: str,
        underlay_ip: str,
        roles: list[str],
        state_dir: Path,
        ttl: int,
    ) -> None:
        self.etcd = etcd
        self.keys = keys
        self.node = node
        self.underlay_ip = underlay_ip
        self.roles = roles
        self.file = state_dir / "lease"
        self.ttl = max(10, ttl)
        self.id = 0

    def register(self) -> None:
        old = 0
        with contextlib.suppress(OSError, ValueError):
            old = int(self.file.read_text())
        if old and self.etcd.lease_ttl(old) > 0:
            self.id = old
        else:
            self.id = self.etcd.lease_grant(self.ttl)
            self.file.write_text(str(self.id))
        self.etcd.put(
            self.keys.alive(self.node), {"ip": self.underlay_ip, "version": __version__}, self.id
        )
        # the node's record is the collection's (hpc.podnet.agent registers the nodes; with
        # etcd authentication on a node may not write it): written here only when missing
        # or different, where podnetd runs without the collection
        want = {"ip": self.underlay_ip, "roles": self.roles}
        kv = self.etcd.get(self.keys.node(self.node))
        if kv is None or kv.json() != want:
            try:
                self.etcd.put(self.keys.node(self.node), want)
            except EtcdPermissionDenied:
                log.warning(
                    "etcd %s is %s, not %s, and this node may not write it: run the "
                    "collection (hpc.podnet.agent) for this node",
                    self.keys.node(self.node),
                    kv.value if kv else "missing",
                    json_dumps(want),
                )

    def withdraw(self) -> None:
        """podnetd stops: its `alive/<node>` record goes at once (`podnet status --cluster`
        then says it is down; a crash lets the lease expire instead). The lease stays: the
        login pods' records live on it, and podnetd takes it again when it starts within
        its TTL. Best effort, bounded: a stop never waits long for etcd."""
        try:
            self.etcd.delete(self.keys.alive(self.node), timeout=2.0)
        except (EtcdUnavailable, EtcdRequestError) as e:
            log.info("alive record of %s left to its lease: %s", self.node, e)

    def run(self, stop: threading.Event, on_new_lease: Callable[[], None]) -> None:
        period = max(1.0, self.ttl / 3)
        while not stop.wait(period):
            try:
                if self.etcd.lease_keepalive(self.id) <= 0:
                    log.warning("node lease expired: registering again")
                    self.register()
                    on_new_lease()
            except (EtcdUnavailable, EtcdRequestError) as e:
                log.warning("lease keepalive: %s", e)
