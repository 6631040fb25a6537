# SPDX-License-Identifier: Apache-2.0
"""A user's network on this node, the part of `Dataplane` that is not one pod's: the
user's bridge `pnbr<vni>` and VXLAN `pnvx<vni>` (made with the user's first pod, removed
with the last), the remote pods the VXLAN has met (a neighbour entry that answers a pod's
ARP request, a forwarding entry to the pod's node: `resolve`, on the device's misses), and
the routes to other nodes' address blocks. podnet's host-side links carry no address, IPv4
or IPv6 (`scrub_host_links` removes an older podnetd's).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
import threading

from podnet.kernel import nl, nlquery, nlreq
from podnet.names import GATEWAY_MAC, bridge_name, is_veth_name, mac_for_ip, vxlan_name

#: a netlink socket (the name `nl` is a method inside UserLinks)
Socket = nl.Netlink
ETH_P_ARP = 0x0806
_BROADCAST = b"\xff" * 6


def arp_reply(ip: str, mac: str) -> bytes:
    """An Ethernet frame: `ip` is at `mac`, an ARP reply broadcast (sender and target the
    same address: what a host sends when its address comes up)."""
    hw, addr = bytes.fromhex(mac.replace(":", "")), socket.inet_aton(ip)
    arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 2) + hw + addr + _BROADCAST + addr
    return _BROADCAST + hw + struct.pack("!H", ETH_P_ARP) + arp


class UserLinks:
    """Mixed into `Dataplane` (`podnet.kernel.dataplane`), which sets these attributes."""

    underlay_ip: str
    underlay_index: int
    underlay_mtu: int
    vxlan_port: int
    #: vni -> bridge ifindex of users present here
    bridges: dict[int, int]
    #: VXLAN ifindex -> vni of users present here (their misses come by ifindex)
    vxlans: dict[int, int]
    #: user bridge/VXLAN creation and removal
    lock: threading.Lock

    def nl(self) -> Socket:
        """This thread's rtnetlink socket in the daemon's netns (`Dataplane.nl`)."""
        raise NotImplementedError

    def ensure_user(self, vni: int) -> int:
        """Bridge + VXLAN of a user (created if missing); returns the bridge's ifindex. A
        VXLAN of an older podnetd (flooding to the user's nodes, entries for every remote
        pod: no `l3miss`) is made again as this one makes it."""
        br, vx = bridge_name(vni), vxlan_name(vni)
        with self.lock:
            links = nlquery.links(self.nl())
            if br not in links:
                self.nl().batch(
                    [nlreq.bridge(br, GATEWAY_MAC, self.underlay_mtu - 50), *nlreq.host_link_up(br)]
                )
                links = nlquery.links(self.nl())
            else:  # no address: reconcile removed an older podnetd's (scrub_host_links)
                self.nl().batch(nlreq.host_link_up(br))
            bri = int(links[br]["index"])
            if vx in links and not links[vx].get("l3miss"):
                self.nl().batch([nlreq.del_link(int(links[vx]["index"]), vx)])
                del links[vx]
            if vx not in links:
                self.nl().batch(
                    [
                        nlreq.vxlan(
                            vx,
                            vni,
                            self.underlay_ip,
                            self.underlay_index,
                            self.vxlan_port,
                            self.underlay_mtu - 50,
                            bri,
                        ),
                        *nlreq.host_link_up(vx),
                    ]
                )
                links = nlquery.links(self.nl())
            vxi = int(links[vx]["index"])
            self.vxlans = {i: v for i, v in self.vxlans.items() if v != vni} | {vxi: vni}
            self.bridges[vni] = bri
        return bri

    def user_bridge(self, vni: int) -> int | None:
        """The user's bridge index if this agent set it up (no netlink dump)."""
        return self.bridges.get(vni)

    def vni_of_vxlan(self, index: int) -> int | None:
        """The VNI of the user's VXLAN `index` (None: not one this agent set up)."""
        return self.vxlans.get(index)

    def resolve(self, vni: int, remote: list[tuple[str, str | None]]) -> None:
        """The remote pods `(ip, its node's underlay address)` of the user's VXLAN: the
        device answers ARP for each (a neighbour entry, the MAC derived from the address)
        and sends its frames to that node alone (a forwarding entry); None: forgotten
        (both entries removed). Nothing if the user has no VXLAN here."""
        index = next((i for i, v in self.vxlans.items() if v == vni), None)
        if index is None:
            return
        reqs: list[nl.Request] = []
        for ip, vtep in remote:
            mac = mac_for_ip(ip)
            if vtep is None:
                reqs += [
                    nlreq.neigh(index, ip, mac, delete=True),
                    nlreq.fdb_unicast(index, mac, None, delete=True),
                ]
            else:
                reqs += [nlreq.neigh(index, ip, mac), nlreq.fdb_unicast(index, mac, vtep)]
        for chunk in nl.chunks(reqs, 256):
            # a VXLAN removed meanwhile (the user's last pod went): nothing to resolve
            try:
                self.nl().batch(chunk)
            except nl.NetlinkError as e:
                if e.code != errno.ENODEV:
                    raise

    def announce(self, vni: int, ips: list[str]) -> None:
        """Tell the user's pods here that the remote pods `ips` are resolved: an ARP reply
        of each (its derived MAC), broadcast into the user's bridge. A pod waiting for one
        of them (its ARP request was a miss) takes it at once instead of at its next
        request (`ARP_RETRANS_MS` later, each way); a pod that did not ask ignores it (the
        kernel creates no entry from an unsolicited reply: `arp_accept` 0). It reaches the
        user's pods only: the VXLAN (`proxy`) drops ARP replies, and the frame leaves from
        the bridge itself, which learns no address from what it sends."""
        if vni not in self.bridges:
            return
        name = bridge_name(vni)
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as sock:
            for ip in ips:
                try:
                    sock.sendto(arp_reply(ip, mac_for_ip(ip)), (name, ETH_P_ARP))
                except OSError as e:  # the bridge went meanwhile: the pod asks again
                    if e.errno not in (errno.ENODEV, errno.ENXIO):
                        raise
                    return

    def remove_user(self, vni: int) -> None:
        with self.lock:
            self.bridges.pop(vni, None)
            self.vxlans = {i: v for i, v in self.vxlans.items() if v != vni}
            links = nlquery.links(self.nl())
            reqs = [
                nlreq.del_link(int(links[n]["index"]), n)
                for n in (vxlan_name(vni), bridge_name(vni))
                if n in links
            ]
            if reqs:
                self.nl().batch(reqs)

    def scrub_host_links(self) -> int:
        """Remove every address from podnet's host-side links and turn their IPv6 address
        generation off (links made by an older podnetd carried the gateway address and an
        fe80:: address); returns the number of addresses removed."""
        links = nlquery.links(self.nl())
        ours = {
            int(v["index"]): k
            for k, v in links.items()
            if is_veth_name(k) or k.startswith(("pnbr", "pnvx"))
        }
        reqs = [
            nlreq.del_addr(i, fam, ip, plen)
            for i, fam, ip, plen in nlquery.addresses(self.nl())
            if i in ours
        ]
        n = len(reqs)
        reqs += [nlreq.no_ipv6_ll(i) for i in sorted(ours)]
        for chunk in nl.chunks(reqs, 256):
            self.nl().batch(chunk)
        return n

    def user_ports(self) -> dict[int, int]:
        """vni -> number of pod ports in that user's bridge."""
        links = nlquery.links(self.nl())
        by_index = {int(v["index"]): k for k, v in links.items()}
        out: dict[int, int] = {}
        for name in links:
            if name.startswith("pnbr") and name[4:].isdigit():
                out.setdefault(int(name[4:]), 0)
        for name, info in links.items():
            master = by_index.get(int(info["master"] or 0), "")
            if is_veth_name(name) and master.startswith("pnbr") and master[4:].isdigit():
                out[int(master[4:])] = out.get(int(master[4:]), 0) + 1
        return out

    # -- routes to other nodes' address blocks ----------------------------------------
    def set_block_routes(self, routes: dict[str, str], local_blocks: set[str]) -> None:
        """Routes `block -> node underlay IP` for other nodes' blocks (exactly these)."""
        have = {
            (f"{d}/{plen}"): gw
            for d, plen, _oif, gw, _t in nlquery.podnet_routes(self.nl())
            if plen < 32 and gw
        }
        want = {
            b: gw for b, gw in routes.items() if b not in local_blocks and gw != self.underlay_ip
        }
        reqs = []
        for b, gw in want.items():
            if have.get(b) != gw:
                net = ipaddress.IPv4Network(b)
                reqs.append(
                    nlreq.route(
                        str(net.network_address),
                        net.prefixlen,
                        gateway=gw,
                        oif=self.underlay_index,
                        replace=True,
                    )
                )
        for b in have:
            if b not in want:
                net = ipaddress.IPv4Network(b)
                reqs.append(nlreq.route(str(net.network_address), net.prefixlen, delete=True))
        for chunk in nl.chunks(reqs, 256):
            self.nl().batch(chunk)
