# SPDX-License-Identifier: Apache-2.0
"""The etcd sync loop: one place where the cluster's state in etcd becomes this node's
routes, the overlay's resolved entries and firewall sets (as flannel's vxlan network
loop): the applier of the `state.clusterview.ClusterView`'s changes.

Watchers on `logins/`, `containers/`, `users/`, `vnis/`, `blocks/` and `nodes/` (all on the
client's one watch stream; not `jobs/`: no node follows another's jobs) feed `on_event`:
the event becomes a record (`watchrecords.record_of`), `repair.RecordRepair` screens it
(what another writer changed is noted to be written back, and the view takes this node's
own copy instead), the view takes it and says what changed, and each change is applied
here: the allocator's IPAM view at once, and only the kernel work the change needs is
queued: a block moved (routes,
the overlay's entries of its pods: `Overlay.repoint`), a node came or went (node table,
firewall, routes, the overlay's entries), a record to write back ('restore'). No other
node's pod records are needed for the overlay (node/overlay.py). `run` applies the queue in
one pass per burst of events; a failed pass is retried in full. After a watch was
compacted away, `resync` re-reads everything in one transaction (`ClusterRead`: one
revision for all of it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from podnet.kernel.dataplane import Dataplane
from podnet.kernel.firewall import Firewall
from podnet.names import Keys
from podnet.node.overlay import Overlay
from podnet.node.pods import PodTable
from podnet.node.repair import RecordRepair
from podnet.node.workqueue import SyncQueue
from podnet.state.alloc import Allocator
from podnet.state.clusterview import (
    AddressesChanged,
    BlockChanged,
    Change,
    ClusterView,
    NodesChanged,
)
from podnet.state.etcdops import KV
from podnet.state.store import Etcd
from podnet.state.watchrecords import WATCHED, ClusterRead, record_of

log = logging.getLogger("podnet.sync")

#: a burst of events is applied in one pass after this quiet time
DEBOUNCE = 0.05


class EtcdSync:
    def __init__(
        self,
        etcd: Etcd,
        keys: Keys,
        node: str,
        alloc: Allocator,
        dp: Dataplane,
        fw: Firewall,
        pods: PodTable,
        view: ClusterView,
        work: SyncQueue,
        repair: RecordRepair,
        overlay: Overlay,
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        """`repair`: screens the watches' records (tamper repair) and writes back in the
        pass; `on_idle`: called on quiet passes (every 5 s without events): the egress
        route check."""
        self.etcd = etcd
        self.keys = keys
        self.node = node
        self.alloc = alloc
        self.dp = dp
        self.fw = fw
        self.pods = pods
        self.view = view
        self.work = work
        self.repair = repair
        self.overlay = overlay
        self.on_idle = on_idle

    # -- events ----------------------------------------------------------------------
    def on_event(self, kind: str, key: str, kv: KV | None) -> None:
        rec = record_of(self.keys, kind, key, kv)
        if rec is not None:
            rec = self.repair.screen(rec)
        if rec is not None:
            for change in self.view.apply(rec):
                self.act(change)

    def act(self, change: Change) -> None:
        """What a change of the view needs: the allocator's views at once, the kernel's
        work queued."""
        if isinstance(change, AddressesChanged):
            if change.freed:
                self.alloc.ipam.mark(change.freed, used=False)
            if change.used:
                self.alloc.ipam.mark(change.used)
        elif isinstance(change, BlockChanged):
            self.alloc.ipam.set_block(change.block, change.node)
            self.queue("routes")
            self.queue("overlay")
        elif isinstance(change, NodesChanged):
            self.queue("nodes")

    def restore(self) -> int:
        """Write back the records another writer changed (`RecordRepair.restore`)."""
        return self.repair.restore()

    def queue(self, what: str) -> None:
        """'nodes', 'routes', 'overlay' (the resolved remote pods looked up again)."""
        self.work.put(what)

    def resync(self) -> int:
        """Everything the watchers follow, read again in one transaction (one revision):
        the IPAM view, the blocks, the users' VNIs, the node table.
        Returns the revision to watch from."""
        read = ClusterRead.of(self.etcd, self.keys)
        self.repair.check_read(read)
        changes = self.view.reset(read)
        self.alloc.ipam.reset(read.blocks(), read.addresses())
        for change in changes:
            if isinstance(change, AddressesChanged):
                self.act(change)
        nodes_changed = any(isinstance(c, NodesChanged) for c in changes)
        if nodes_changed and self.fw is not None:  # no firewall: the tests' view only
            self.resync_firewall()
        for what in ("nodes", "routes", "overlay"):
            self.queue(what)
        return read.revision

    def watch(self, rev: int, stop: threading.Event) -> None:
        for prefix in WATCHED:
            self.etcd.watch_prefix(self.keys.prefix(prefix), rev, self.on_event, self.resync, stop)

    # -- the loop ----------------------------------------------------------------------
    def take(self) -> set[str]:
        return self.work.take()

    def apply(self, todo: set[str]) -> None:
        if "restore" in todo:
            self.restore()
        moved = "nodes" in todo and self.refresh_nodes()
        if "routes" in todo or "nodes" in todo:
            self.sync_routes()
        if "overlay" in todo or moved:
            self.overlay.repoint()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if not self.work.wait(5):
                # quiet: the kernel drops routes through a link that went down (a flap,
                # a gateway's failover test): put back what etcd says, if anything is gone
                try:
                    self.sync_routes()
                    if self.fw.stepd_moved():  # slurmstepd's cgroup made again: new id
                        self.resync_firewall()
                    if self.on_idle is not None:
                        self.on_idle()
                except Exception:
                    log.exception("route check failed")
                continue
            time.sleep(DEBOUNCE)
            self.work.clear_wake()
            try:
                self.apply(self.take())
            except Exception:  # keep syncing; the next pass redoes everything
                log.exception("sync failed")
                self.queue("nodes")
                self.queue("overlay")
                time.sleep(1)

    # -- what a pass does ----------------------------------------------------------------
    def refresh_nodes(self) -> bool:
        """The node table from etcd; True if it changed (firewall resynced)."""
        if not self.view.set_nodes(self.etcd.get_prefix(self.keys.prefix("nodes"))[0]):
            return False
        self.resync_firewall()
        return True

    def resync_firewall(self) -> None:
        self.fw.resync(self.view.node_addresses(), self.pods.fw_ports())

    def sync_routes(self) -> None:
        ipam = self.alloc.ipam
        with ipam.lock:
            blocks = dict(ipam.blocks)
        node_ips = self.view.node_ips
        routes = {str(b): node_ips[n] for b, n in blocks.items() if n in node_ips}
        local = {str(b) for b, n in blocks.items() if n == self.node}
        self.dp.set_block_routes(routes, local)
