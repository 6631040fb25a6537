# SPDX-License-Identifier: Apache-2.0
"""The overlay's fast path: IPv4 frames between a pod and its user's VXLAN skip the
user's bridge (docs/bench.md, "The overlay's fast path").

Through the bridge, every frame of a pod stream pays the bridge, br_netfilter (which
hands bridged IPv4 frames to the node's inet hooks whenever the namespace's
`bridge-nf-call-iptables` is on, as it is once the module is loaded) and the bridge
family's rules, on both nodes: about 0.1 of the overlay's CPU per byte, which a bare
kernel VXLAN does not pay. Two kinds of netdev ingress chains (table `netdev podnet`)
forward what needs none of it, with `fwd`:

* one chain per pod, on the host end of its veth: an IPv4 frame whose source is the
  pod's own MAC and IPv4 address (exactly what the bridge's anti-spoofing accepts from
  that port), to a unicast MAC that is neither the gateway's nor a pod of this node
  (set `local_macs`), goes to the pod's user's VXLAN device (whose FDB sends it to the
  node of that pod, or floods it to the user's nodes, as the bridge would have);
* one chain per user with a pod here, on the user's VXLAN device: an IPv4 frame not from
  the gateway MAC, to a pod of this node, goes to that pod's veth; the pod is found in
  the map `local_pods` by the VXLAN device's name and the MAC, so a frame from one
  user's VXLAN reaches only that user's pods.

Everything else (ARP, broadcast, frames to the gateway MAC, to local pods, spoofed
frames, frames from a VXLAN to an unknown MAC) goes on to the bridge and its rules as
before: the fast path only ever takes a frame from a pod into its own user's network or
from a user's network to that user's pod, which the bridge would have done too. A
flushed `netdev podnet` leaves the bridge path alone (the bridge's rules apply to every
frame again); a flushed bridge table is what it was before.

The chains and elements are made per pod in one nf_tables batch (nftnl.py), with the
pod's anti-spoofing element: libnftables would re-read every chain of the table first.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

from podnet.kernel import nftnl
from podnet.names import GATEWAY_MAC, vxlan_name

log = logging.getLogger("podnet.fastpath")

TABLE = "podnet"  # family netdev
#: before any ingress hook a site may have (tc-like filters at 0)
PRIORITY = -300
LOCAL_MACS = "local_macs"
LOCAL_PODS = "local_pods"
SKELETON = f"""
add table netdev {TABLE}
delete table netdev {TABLE}
table netdev {TABLE} {{
    set {LOCAL_MACS} {{ type ether_addr; }}
    map {LOCAL_PODS} {{ type ifname . ether_addr : iface_index; }}
}}
"""
#: probe: the kernel has netdev chains and `fwd` (CONFIG_NF_TABLES_NETDEV,
#: CONFIG_NFT_FWD_NETDEV); made and removed in one transaction
PROBE = """
add table netdev podnet_probe
add chain netdev podnet_probe c { type filter hook ingress device "lo" priority 0; }
add rule netdev podnet_probe c fwd to "lo"
delete table netdev podnet_probe
"""
NETDEV = nftnl.NFPROTO_NETDEV
_GW = nftnl.mac(GATEWAY_MAC)
_MULTICAST = b"\x01" + bytes(5)


@dataclass(frozen=True)
class Port:
    """A pod's host-side port: veth, the pod's MAC and IPv4 address, its user's VNI."""

    veth: str
    mac: str
    ip: str
    vni: int


def _ifindex_data(index: int) -> bytes:
    return index.to_bytes(4, sys.byteorder)


def pod_rule(port: Port, vxlan_index: int) -> list[bytes]:
    """From the pod: its own IPv4 frames to another node's pod go to its VXLAN."""
    return [
        *nftnl.is_ipv4(),
        *nftnl.ether_field(6),
        nftnl.cmp(nftnl.mac(port.mac)),
        nftnl.payload(nftnl.NFT_PAYLOAD_NETWORK_HEADER, 12, 4),
        nftnl.cmp(nftnl.ipv4(port.ip)),
        *nftnl.ether_field(0),
        nftnl.bitwise(_MULTICAST, bytes(6)),
        nftnl.cmp(bytes(6)),
        *nftnl.ether_field(0),
        nftnl.cmp(_GW, nftnl.NFT_CMP_NEQ),
        *nftnl.ether_field(0),
        nftnl.lookup(LOCAL_MACS, invert=True),
        nftnl.immediate(_ifindex_data(vxlan_index)),
        nftnl.fwd(),
    ]


def vxlan_rule() -> list[bytes]:
    """From a user's VXLAN: IPv4 frames to a pod of that user here go to its veth."""
    return [
        *nftnl.ether_field(6),
        nftnl.cmp(_GW, nftnl.NFT_CMP_NEQ),
        *nftnl.is_ipv4(),
        nftnl.meta(nftnl.NFT_META_IIFNAME),
        nftnl.payload(nftnl.NFT_PAYLOAD_LL_HEADER, 0, 6, nftnl.NFT_REG_2),
        nftnl.lookup(LOCAL_PODS, dreg=nftnl.NFT_REG_1),
        nftnl.fwd(),
    ]


class FastPath:
    """The fast path's per-pod and per-user objects (callers hold the firewall's lock)."""

    def __init__(self, sock: nftnl.Socket, enabled: bool) -> None:
        self.sock = sock
        self.enabled = enabled
        self.ports: dict[str, Port] = {}  # veth -> the port, while its chain exists

    def _users(self) -> set[int]:
        return {p.vni for p in self.ports.values()}

    def add(self, port: Port) -> list[nftnl.Message]:
        """The messages that add a pod's objects (and its user's chain if it is the user's
        first pod here); `added` once they are in. OSError: a link is gone."""
        vx = vxlan_name(port.vni)
        pod_mac = nftnl.mac(port.mac)
        msgs = [
            nftnl.add_elements(NETDEV, TABLE, LOCAL_MACS, [(pod_mac, b"")]),
            nftnl.add_elements(
                NETDEV,
                TABLE,
                LOCAL_PODS,
                [
                    (
                        nftnl.concat(nftnl.ifname(vx), pod_mac),
                        _ifindex_data(self.sock.ifindex(port.veth)),
                    )
                ],
            ),
            nftnl.new_chain(NETDEV, TABLE, port.veth, port.veth, PRIORITY),
            nftnl.new_rule(NETDEV, TABLE, port.veth, pod_rule(port, self.sock.ifindex(vx))),
        ]
        if port.vni not in self._users():
            msgs += [
                nftnl.new_chain(NETDEV, TABLE, vx, vx, PRIORITY),
                nftnl.new_rule(NETDEV, TABLE, vx, vxlan_rule()),
            ]
        return msgs

    def added(self, port: Port) -> None:
        self.ports[port.veth] = port

    def remove(self, veth: str) -> list[nftnl.Message]:
        """The messages that remove a pod's objects (and its user's chain after the
        user's last pod here); nothing for a port without them."""
        port = self.ports.pop(veth, None)
        if port is None:
            return []
        vx = vxlan_name(port.vni)
        pod_mac = nftnl.mac(port.mac)
        msgs = [
            nftnl.del_chain(NETDEV, TABLE, port.veth),
            nftnl.del_elements(
                NETDEV, TABLE, LOCAL_PODS, [(nftnl.concat(nftnl.ifname(vx), pod_mac), b"")]
            ),
            nftnl.del_elements(NETDEV, TABLE, LOCAL_MACS, [(pod_mac, b"")]),
        ]
        if port.vni not in self._users():
            msgs.append(nftnl.del_chain(NETDEV, TABLE, vx))
        return msgs

    def fill(self, ports: list[Port]) -> None:
        """After SKELETON was loaded (an empty table): every pod's objects again."""
        self.ports.clear()
        for port in ports:
            try:
                self.sock.commit(self.add(port))
            except OSError as e:  # that pod keeps the bridge path
                log.warning("fast path of %s (%s) not made: %s", port.veth, port.ip, e)
                continue
            self.added(port)
