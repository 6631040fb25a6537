# SPDX-License-Identifier: Apache-2.0
"""What this node's etcd watches say, and the work they queue, shared by the rooms that
write and read them (built first, handed to each at construction):

* `ClusterView`: the nodes' registered underlay addresses, where the pods of each user's
  network are (VNI -> pod address -> node), users' VNIs. `etcd_sync.EtcdSync` writes it
  from the watches; `usernets.UserNetworks` reads a network's VTEPs and a user's VNI from
  it; the reconciler the nodes the firewall lets in.
* `SyncQueue`: what the sync loop has to apply ('nodes', 'routes', 'fdb', 'restore', or a
  VNI: that user's FDB). The watches queue work in it, and so does `UserNetworks` when it
  made a user's network here (its FDB then gets the user's pods on other nodes).
"""

from __future__ import annotations

import threading

from podnet.kernel.nl import mac_for_ip


class ClusterView:
    def __init__(self, node: str) -> None:
        self.node = node
        #: the lock of the three tables below
        self.mutex = threading.Lock()
        #: each node's registered underlay address (`nodes/<node>`)
        self.node_ips: dict[str, str] = {}
        #: where the pods of each VNI are (vni -> ip -> node), from the pod records
        self.pods_at: dict[int, dict[str, str]] = {}
        self.ip_vni: dict[str, int] = {}
        #: users' VNIs (users/<user>)
        self.user_vnis: dict[str, int] = {}

    def user_vni(self, user: str) -> int | None:
        return self.user_vnis.get(user)

    def node_addresses(self) -> list[str]:
        """The nodes' underlay addresses (the firewall lets their VXLAN in)."""
        return sorted(set(self.node_ips.values()))

    def vteps_of(self, vni: int) -> list[str]:
        """Underlay addresses of the nodes with a pod of this VNI, this one included (a
        node's registered address: `nodes/<node>`)."""
        with self.mutex:
            nodes = set(self.pods_at.get(vni, {}).values())
        ips = {self.node_ips[n] for n in nodes if n in self.node_ips}
        if self.node in self.node_ips:
            ips.add(self.node_ips[self.node])
        return sorted(ips)

    def remote_macs(self, vni: int) -> dict[str, str]:
        """MAC -> underlay address of the pods of `vni` on other (live) nodes."""
        with self.mutex:
            pods = dict(self.pods_at.get(vni, {}))
        return {
            mac_for_ip(ip): self.node_ips[node]
            for ip, node in pods.items()
            if node != self.node and node in self.node_ips
        }

    def locate(self, ip: str, where: tuple[int, str] | None) -> set[int]:
        """Record that `ip` is a pod of VNI `where[0]` on node `where[1]` (None: no pod);
        returns the VNIs whose remote pods changed."""
        changed: set[int] = set()
        with self.mutex:
            old = self.ip_vni.pop(ip, None)
            if old is not None:
                node = self.pods_at.get(old, {}).pop(ip, None)
                if node != self.node:
                    changed.add(old)
            if where is not None:
                vni, node = where
                self.ip_vni[ip] = vni
                self.pods_at.setdefault(vni, {})[ip] = node
                if node != self.node:
                    changed.add(vni)
        return changed


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
