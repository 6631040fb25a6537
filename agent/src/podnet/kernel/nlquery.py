# SPDX-License-Identifier: Apache-2.0
"""What the kernel has, read through an `nl.Netlink` socket (`podnet.kernel.nl`): a link's
index, the links, podnet's routes, a VXLAN device's FDB and the addresses of the socket's
network namespace (dumps decoded with `pyroute2_lite`'s message classes)."""

from __future__ import annotations

import fcntl
import struct
from typing import Any

from podnet.kernel.nl import (
    AF_BRIDGE,
    AF_INET,
    AF_INET6,
    ANY,
    RT_TABLE_MAIN,
    RTM_GETADDR,
    RTM_GETLINK,
    RTM_GETNEIGH,
    RTM_GETROUTE,
    RTPROT_PODNET,
    Netlink,
)
from podnet.kernel.pyroute2_lite import ifaddrmsg, ifinfmsg, ndmsg, rtmsg

SIOCGIFINDEX = 0x8933


def ifindex(nl: Netlink, name: str) -> int:
    """Index of link `name` in the socket's netns: one ioctl (a netlink socket serves
    SIOCGIFINDEX for its namespace), no dump and no decoding."""
    r = fcntl.ioctl(nl.sock.fileno(), SIOCGIFINDEX, struct.pack("16si12x", name.encode(), 0))
    return int(struct.unpack_from("16si", r)[1])


# -- queries -------------------------------------------------------------------------
def links(nl: Netlink) -> dict[str, dict[str, Any]]:
    """name -> {index, kind, master, vni, l3miss, link} for every link of the socket's netns."""
    out: dict[str, dict[str, Any]] = {}
    m = ifinfmsg()
    m["family"] = 0
    for msg in nl.dump(m, RTM_GETLINK):
        name = msg.get_attr("IFLA_IFNAME")
        info = msg.get_attr("IFLA_LINKINFO")
        kind = info.get_attr("IFLA_INFO_KIND") if info else None
        vni = None
        l3miss = False
        if kind == "vxlan":
            data = info.get_attr("IFLA_INFO_DATA")
            vni = data.get_attr("IFLA_VXLAN_ID") if data else None
            l3miss = bool(data.get_attr("IFLA_VXLAN_L3MISS")) if data else False
        out[name] = {
            "index": msg["index"],
            "kind": kind,
            "master": msg.get_attr("IFLA_MASTER") or 0,
            "vni": vni,
            "l3miss": l3miss,
            "link": msg.get_attr("IFLA_LINK") or 0,
        }
    return out


def podnet_routes(nl: Netlink) -> list[tuple[str, int, int, str | None, int]]:
    """(dst, dst_len, oif, gateway, type) of main-table IPv4 routes with our protocol."""
    m = rtmsg()
    m["family"] = AF_INET
    out = []
    for msg in nl.dump(m, RTM_GETROUTE):
        if msg["proto"] != RTPROT_PODNET or msg.get_attr("RTA_TABLE") not in (None, RT_TABLE_MAIN):
            continue
        out.append(
            (
                msg.get_attr("RTA_DST") or ANY,
                msg["dst_len"],
                msg.get_attr("RTA_OIF") or 0,
                msg.get_attr("RTA_GATEWAY"),
                msg["type"],
            )
        )
    return out


def fdb_entries(nl: Netlink, index: int) -> tuple[set[str], dict[str, str]]:
    """The FDB of VXLAN device `index`: destinations of its all-zero (flood) entries, and
    MAC -> destination of its unicast entries (the device's own entries only: the
    bridge's entries for the port carry no destination)."""
    m = ndmsg()
    m["family"] = AF_BRIDGE
    flood: set[str] = set()
    unicast: dict[str, str] = {}
    for msg in nl.dump(m, RTM_GETNEIGH):
        dst = msg.get_attr("NDA_DST")
        if msg["ifindex"] != index or not dst:
            continue
        mac = msg.get_attr("NDA_LLADDR")
        if mac == "00:00:00:00:00:00":
            flood.add(dst)
        elif mac:
            unicast[mac] = dst
    return flood, unicast


def first_ipv4(nl: Netlink, ifname: str) -> str | None:
    """The first IPv4 address of interface `ifname` in the socket's netns."""
    index = links(nl).get(ifname, {}).get("index")
    if index is None:
        return None
    m = ifaddrmsg()
    m["family"] = AF_INET
    for msg in nl.dump(m, RTM_GETADDR):
        if msg["index"] == index:
            return str(msg.get_attr("IFA_LOCAL") or msg.get_attr("IFA_ADDRESS"))
    return None


def addresses(nl: Netlink) -> list[tuple[int, int, str, int]]:
    """(ifindex, family, address, prefix length) of every IPv4 and IPv6 address."""
    out: list[tuple[int, int, str, int]] = []
    for family in (int(AF_INET), int(AF_INET6)):
        m = ifaddrmsg()
        m["family"] = family
        for msg in nl.dump(m, RTM_GETADDR):
            ip = msg.get_attr("IFA_LOCAL") if family == AF_INET else None
            ip = ip or msg.get_attr("IFA_ADDRESS")
            if ip:
                out.append((int(msg["index"]), family, str(ip), int(msg["prefixlen"])))
    return out
