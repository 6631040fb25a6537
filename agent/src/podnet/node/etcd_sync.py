# SPDX-License-Identifier: Apache-2.0
"""The etcd sync loop: one place where the cluster's state in etcd becomes this node's
routes, VXLAN forwarding entries and firewall sets (as flannel's vxlan network loop).

Watches on `blocks/`, `ips/`, `vteps/` and `nodes/` feed `on_event`, which keeps the
allocator's IPAM view current at once and queues only the sync an event needs: a block
moved (routes), a node came or went (node table, firewall, routes), a user's VTEP set
changed or a pod of theirs came or went on another node (that user's FDB: flood entries
for the VTEPs, and a unicast entry per remote pod MAC, so a frame to a pod is sent to
its node alone instead of to every node of the user). `run` applies the queue in one
pass per burst of events; a failed pass is retried in full. After a watch was compacted
away, `resync` re-reads everything.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from podnet.kernel.dataplane import Dataplane
from podnet.kernel.firewall import Firewall
from podnet.kernel.nl import mac_for_ip
from podnet.names import Keys, block_from_key
from podnet.node.pods import PodTable
from podnet.node.usernets import UserNetworks
from podnet.state.alloc import Allocator
from podnet.state.store import KV, Etcd

log = logging.getLogger("podnet.sync")

#: a burst of events is applied in one pass after this quiet time
DEBOUNCE = 0.05
WATCHED = ("blocks", "ips", "vteps", "nodes")


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
        nets: UserNetworks,
    ) -> None:
        self.etcd = etcd
        self.keys = keys
        self.node = node
        self.alloc = alloc
        self.dp = dp
        self.fw = fw
        self.pods = pods
        self.nets = nets
        self.node_ips: dict[str, str] = {}
        # where the pods of each VNI are (vni -> ip -> node), from the `ips/` records
        self.pods_at: dict[int, dict[str, str]] = {}
        self._ip_vni: dict[str, int] = {}
        self._pending: set[str | int] = set()
        self._mutex = threading.Lock()
        self._wake = threading.Event()
        #: called on quiet passes (every 5 s without events): the egress route check
        self.on_idle: Callable[[], None] | None = None

    # -- events ----------------------------------------------------------------------
    def on_event(self, kind: str, key: str, kv: Any) -> None:
        rel = key[len(self.keys.root) :]
        if rel.startswith("ips/"):
            ip = rel[4:]
            self.alloc.ipam.mark([ip], used=(kind == "put"))
            for vni in self._locate(ip, _location(kv) if kind == "put" else None):
                self.queue(vni)
            return
        if rel.startswith("blocks/"):
            blk = ipaddress.IPv4Network(block_from_key(key))
            node = kv.json().get("node") if kv is not None else None
            self.alloc.ipam.set_block(blk, node)
            self.queue("routes")
        elif rel.startswith("nodes/"):
            self.queue("nodes")
        elif rel.startswith("vteps/"):
            parts = rel.split("/")
            if len(parts) == 3 and parts[1].isdigit() and parts[2] != self.node:
                self.queue(int(parts[1]))

    def queue(self, what: str | int) -> None:
        """'nodes', 'routes', 'fdb' (every user) or a VNI (that user's FDB)."""
        with self._mutex:
            self._pending.add(what)
        self._wake.set()

    def _locate(self, ip: str, where: tuple[int, str] | None) -> set[int]:
        """Record that `ip` is a pod of VNI `where[0]` on node `where[1]` (None: no pod);
        returns the VNIs whose remote pods changed."""
        changed: set[int] = set()
        with self._mutex:
            old = self._ip_vni.pop(ip, None)
            if old is not None:
                node = self.pods_at.get(old, {}).pop(ip, None)
                if node != self.node:
                    changed.add(old)
            if where is not None:
                vni, node = where
                self._ip_vni[ip] = vni
                self.pods_at.setdefault(vni, {})[ip] = node
                if node != self.node:
                    changed.add(vni)
        return changed

    def _load_locations(self, kvs: list[KV]) -> None:
        with self._mutex:
            self.pods_at.clear()
            self._ip_vni.clear()
        for kv in kvs:
            where = _location(kv)
            if where is not None:
                self._locate(kv.key.rsplit("/", 1)[-1], where)

    def remote_macs(self, vni: int) -> dict[str, str]:
        """MAC -> underlay address of the pods of `vni` on other (live) nodes."""
        with self._mutex:
            pods = dict(self.pods_at.get(vni, {}))
        return {
            mac_for_ip(ip): self.node_ips[node]
            for ip, node in pods.items()
            if node != self.node and node in self.node_ips
        }

    def user_fdb(self, vni: int) -> None:
        """The user's FDB as etcd says (after their network was made here)."""
        self.dp.set_vteps(vni, self.nets.vteps_of(vni), self.remote_macs(vni))

    def resync(self) -> int:
        rev = self.alloc.load_view(self._load_locations)
        for what in ("nodes", "routes", "fdb"):
            self.queue(what)
        return rev

    def watch(self, rev: int, stop: threading.Event) -> None:
        for prefix in WATCHED:
            self.etcd.watch_prefix(self.keys.prefix(prefix), rev, self.on_event, self.resync, stop)

    # -- the loop ----------------------------------------------------------------------
    def take(self) -> set[str | int]:
        with self._mutex:
            todo, self._pending = self._pending, set()
        return todo

    def apply(self, todo: set[str | int]) -> None:
        moved = "nodes" in todo and self.refresh_nodes()
        if "routes" in todo or "nodes" in todo:
            self.sync_routes()
        if "fdb" in todo or moved:
            self.sync_fdb()
        else:
            for vni in (t for t in todo if isinstance(t, int)):
                self.user_fdb(vni)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if not self._wake.wait(5):
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
            self._wake.clear()
            try:
                self.apply(self.take())
            except Exception:  # keep syncing; the next pass redoes everything
                log.exception("sync failed")
                self.queue("nodes")
                self.queue("fdb")
                time.sleep(1)

    # -- what a pass does ----------------------------------------------------------------
    def refresh_nodes(self) -> bool:
        """The node table from etcd; True if it changed (firewall resynced)."""
        kvs = self.etcd.get_prefix(self.keys.prefix("nodes"))[0]
        ips = {kv.key.rsplit("/", 1)[-1]: str(kv.json().get("ip")) for kv in kvs}
        if ips == self.node_ips:
            return False
        self.node_ips = ips
        self.resync_firewall()
        return True

    def resync_firewall(self) -> None:
        self.fw.resync(sorted(set(self.node_ips.values())), self.pods.fw_ports())

    def sync_routes(self) -> None:
        ipam = self.alloc.ipam
        with ipam.lock:
            blocks = dict(ipam.blocks)
        routes = {str(b): self.node_ips[n] for b, n in blocks.items() if n in self.node_ips}
        local = {str(b) for b, n in blocks.items() if n == self.node}
        self.dp.set_block_routes(routes, local)

    def sync_fdb(self) -> None:
        for vni in list(self.dp.user_ports()):
            self.user_fdb(vni)


def _location(kv: KV | None) -> tuple[int, str] | None:
    """(vni, node) of an `ips/` record; None for records without them (older podnetd's:
    their pods are reached through the flood entries)."""
    try:
        d = kv.json() if kv is not None else None
    except ValueError:
        return None
    if not isinstance(d, dict):
        return None
    vni, node = d.get("vni"), d.get("node")
    if isinstance(vni, int) and isinstance(node, str):
        return vni, node
    return None
