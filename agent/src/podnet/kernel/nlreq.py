# SPDX-License-Identifier: Apache-2.0
"""rtnetlink requests podnet sends: links (veth, bridge, VXLAN, up, IPv6 address
generation off, delete), addresses, routes, neighbours and FDB entries, each one
`nl.Request` for a batch on an `nl.Netlink` socket (`podnet.kernel.nl`).
"""

from __future__ import annotations

import errno
import socket
import struct

from podnet.kernel.nl import (
    AF_BRIDGE,
    AF_INET,
    AF_INET6,
    IFF_UP,
    IN6_ADDR_GEN_MODE_NONE,
    NDA_DST,
    NDA_LLADDR,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NLM_F_REPLACE,
    NLM_F_REQUEST,
    NTF_SELF,
    NUD_PERMANENT,
    RT_SCOPE_NOWHERE,
    RT_SCOPE_UNIVERSE,
    RT_TABLE_MAIN,
    RTM_DELADDR,
    RTM_DELLINK,
    RTM_DELNEIGH,
    RTM_DELROUTE,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTM_NEWNEIGH,
    RTM_NEWROUTE,
    RTN_UNICAST,
    RTPROT_PODNET,
    Request,
)

# -- request builders --------------------------------------------------------------
# Encoded here with `struct`, byte for byte what pyroute2 encodes (unit test
# test_netlink_encoding.py): pyroute2's encoder costs 40-400 us of CPU per message, about
# 1.2 ms per pod in all, on the request path of every pod (docs/bench.md).
_NEW = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
_SET = NLM_F_REQUEST | NLM_F_ACK
_NDMSG = struct.Struct("=BBHiHBB")  # family, pad, pad, ifindex, state, flags, type
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_RTMSG = struct.Struct(
    "=BBBBBBBBI"
)  # family, dst_len, src_len, tos, table, proto, scope, type, flags
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_MASTER = 1, 3, 4, 10
IFLA_LINKINFO, IFLA_AF_SPEC, IFLA_NET_NS_FD = 18, 26, 28
IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER = 1, 2, 1
IFLA_INET6_ADDR_GEN_MODE = 8
IFLA_VXLAN_ID, IFLA_VXLAN_LINK, IFLA_VXLAN_LOCAL, IFLA_VXLAN_TTL = 1, 3, 4, 5
IFLA_VXLAN_LEARNING, IFLA_VXLAN_PORT = 7, 15
IFLA_VXLAN_PROXY, IFLA_VXLAN_L2MISS, IFLA_VXLAN_L3MISS = 11, 13, 14
RTM_SETNEIGHTBL = 67
NDTA_NAME, NDTA_PARMS = 1, 6
NDTPA_IFINDEX, NDTPA_RETRANS_TIME, NDTPA_UCAST_PROBES, NDTPA_MCAST_PROBES = 1, 5, 10, 11
IFA_ADDRESS, IFA_LOCAL = 1, 2
RTA_DST, RTA_OIF, RTA_GATEWAY = 1, 4, 5


def _rta(kind: int, payload: bytes) -> bytes:
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * (-n % 4)


def _str(kind: int, s: str) -> bytes:
    return _rta(kind, s.encode() + b"\0")


def _u32(kind: int, v: int) -> bytes:
    return _rta(kind, struct.pack("=I", v))


def _ip4(kind: int, ip: str) -> bytes:
    return _rta(kind, socket.inet_aton(ip))


def _mac(kind: int, mac: str) -> bytes:
    return _rta(kind, bytes.fromhex(mac.replace(":", "")))


def _ifinfo(index: int = 0, flags: int = 0, change: int = 0) -> bytes:
    return _IFINFOMSG.pack(0, 0, index, flags, change)


def link_up(index: int) -> Request:
    return Request.raw(RTM_NEWLINK, _SET, _ifinfo(index, IFF_UP, IFF_UP), f"link {index} up")


#: IFLA_AF_SPEC { AF_INET6 { IFLA_INET6_ADDR_GEN_MODE: none } }
_NO_IPV6_LL = _rta(
    IFLA_AF_SPEC,
    _rta(AF_INET6, _rta(IFLA_INET6_ADDR_GEN_MODE, bytes([IN6_ADDR_GEN_MODE_NONE]))),
)


def host_link_up(name: str) -> list[Request]:
    """Bring up a host-side podnet link with IPv6 address generation off, so that it never
    gets an fe80:: address that host applications enumerating interfaces (MPI, PMIx, UCX)
    would pick. By name, so that it can follow the link's creation in the same batch.
    Measured on 6.18: the kernel refuses IFLA_AF_SPEC in the creating request
    (EAFNOSUPPORT), and in one request it brings the link up before applying
    IFLA_AF_SPEC (a VXLAN has carrier at once and got its fe80::): links are created
    down, then address generation is turned off, then they go up."""
    ifname = _str(IFLA_IFNAME, name)
    return [
        host_link_off_ipv6(name),
        Request.raw(RTM_NEWLINK, _SET, _ifinfo(0, IFF_UP, IFF_UP) + ifname, f"link {name} up"),
    ]


def host_link_off_ipv6(name: str) -> Request:
    """The first half of `host_link_up`: IPv6 address generation off, the link stays down
    (a spare veth's host end, made before its pod: spares.py)."""
    ifname = _str(IFLA_IFNAME, name)
    return Request.raw(
        RTM_NEWLINK, _SET, _ifinfo() + ifname + _NO_IPV6_LL, f"link {name} addrgenmode none"
    )


def no_ipv6_ll(index: int) -> Request:
    """IPv6 address generation off on an existing link (upgrade: links made before)."""
    return Request.raw(
        RTM_NEWLINK,
        _SET,
        _ifinfo(index) + _NO_IPV6_LL,
        f"link {index} addrgenmode none",
        ignore=(errno.ENODEV,),
    )


def link_up_with_mac(index: int, mac: str) -> Request:
    """Set a link's MAC address and bring it up (one request)."""
    return Request.raw(
        RTM_NEWLINK,
        _SET,
        _ifinfo(index, IFF_UP, IFF_UP) + _mac(IFLA_ADDRESS, mac),
        f"link {index} mac {mac} up",
    )


def veth(
    host_name: str, peer_name: str, netns_fd: int, mtu: int, master: int, peer_mac: str
) -> Request:
    """Veth pair: host end (down: `host_link_up` follows) in `master` (0: in none), peer (fixed name
    and MAC, down) made directly in another netns (IFLA_NET_NS_FD of the peer: no device
    is ever moved between namespaces, which would cost an rcu_barrier under RTNL)."""
    # the peer cannot be set up here (veth_open of a half-created pair: ENOTCONN);
    # the pod side brings it up in its own batch
    peer = (
        _ifinfo()
        + _str(IFLA_IFNAME, peer_name)
        + _u32(IFLA_MTU, mtu)
        + _mac(IFLA_ADDRESS, peer_mac)
        + _u32(IFLA_NET_NS_FD, netns_fd)
    )
    info = _str(IFLA_INFO_KIND, "veth") + _rta(IFLA_INFO_DATA, _rta(VETH_INFO_PEER, peer))
    body = (
        _ifinfo()
        + _str(IFLA_IFNAME, host_name)
        + _u32(IFLA_MTU, mtu)
        + (_u32(IFLA_MASTER, master) if master else b"")
        + _rta(IFLA_LINKINFO, info)
    )
    return Request.raw(RTM_NEWLINK, _NEW, body, f"create veth {host_name}")


def enslave_up(index: int, master: int) -> Request:
    """Put an existing link (down, address generation off) into `master` and bring it up,
    in one request."""
    return Request.raw(
        RTM_NEWLINK,
        _SET,
        _ifinfo(index, IFF_UP, IFF_UP) + _u32(IFLA_MASTER, master),
        f"link {index} master {master} up",
    )


def bridge(name: str, mac: str, mtu: int) -> Request:
    """A bridge, down (`host_link_up` follows)."""
    body = (
        _ifinfo()
        + _str(IFLA_IFNAME, name)
        + _u32(IFLA_MTU, mtu)
        + _mac(IFLA_ADDRESS, mac)
        + _rta(IFLA_LINKINFO, _str(IFLA_INFO_KIND, "bridge"))
    )
    return Request.raw(RTM_NEWLINK, _NEW, body, f"create bridge {name}", ignore=(errno.EEXIST,))


def vxlan(name: str, vni: int, local: str, link: int, port: int, mtu: int, master: int) -> Request:
    """A VXLAN device, down (`host_link_up` follows): no learning; ARP answered by the
    device from its own neighbour entries (`proxy`), and a miss of a neighbour or of a
    forwarding entry reported to podnetd (`l3miss`, `l2miss`: `podnet.kernel.vxmiss`),
    which adds them (docs/agent.md "The overlay, resolved on demand")."""
    data = (
        _u32(IFLA_VXLAN_ID, vni)
        + _ip4(IFLA_VXLAN_LOCAL, local)
        + _u32(IFLA_VXLAN_LINK, link)
        + _rta(IFLA_VXLAN_PORT, struct.pack(">H", port))
        + _rta(IFLA_VXLAN_LEARNING, b"\0")
        + _rta(IFLA_VXLAN_TTL, bytes([64]))
        + _rta(IFLA_VXLAN_PROXY, b"\1")
        + _rta(IFLA_VXLAN_L2MISS, b"\1")
        + _rta(IFLA_VXLAN_L3MISS, b"\1")
    )
    info = _str(IFLA_INFO_KIND, "vxlan") + _rta(IFLA_INFO_DATA, data)
    body = (
        _ifinfo()
        + _str(IFLA_IFNAME, name)
        + _u32(IFLA_MTU, mtu)
        + _u32(IFLA_MASTER, master)
        + _rta(IFLA_LINKINFO, info)
    )
    return Request.raw(RTM_NEWLINK, _NEW, body, f"create vxlan {name}", ignore=(errno.EEXIST,))


def del_link(index: int, what: str) -> Request:
    return Request.raw(
        RTM_DELLINK, _SET, _ifinfo(index), f"delete link {what}", ignore=(errno.ENODEV,)
    )


def del_link_named(name: str) -> Request:
    """Delete a link by name (the kernel looks IFLA_IFNAME up when the index is 0): no
    dump of every link first. A link that is not there (ENODEV) is no error."""
    return Request.raw(
        RTM_DELLINK,
        _SET,
        _ifinfo() + _str(IFLA_IFNAME, name),
        f"delete link {name}",
        ignore=(errno.ENODEV,),
    )


def addr(index: int, ip: str, prefix: int) -> Request:
    body = (
        _IFADDRMSG.pack(AF_INET, prefix, 0, 0, index) + _ip4(IFA_LOCAL, ip) + _ip4(IFA_ADDRESS, ip)
    )
    return Request.raw(RTM_NEWADDR, _NEW, body, f"address {ip}/{prefix}", ignore=(errno.EEXIST,))


def del_addr(index: int, family: int, ip: str, prefix: int) -> Request:
    packed = socket.inet_pton(family, ip)
    body = _IFADDRMSG.pack(family, prefix, 0, 0, index)
    if family == AF_INET:
        body += _rta(IFA_LOCAL, packed)
    body += _rta(IFA_ADDRESS, packed)
    return Request.raw(
        RTM_DELADDR,
        _SET,
        body,
        f"delete address {ip}/{prefix}",
        ignore=(errno.EADDRNOTAVAIL, errno.ENODEV, errno.ENOENT),
    )


def route(
    dst: str,
    dst_len: int,
    *,
    oif: int = 0,
    gateway: str | None = None,
    scope: int = RT_SCOPE_UNIVERSE,
    rtype: int = RTN_UNICAST,
    proto: int = RTPROT_PODNET,
    delete: bool = False,
    replace: bool = False,
) -> Request:
    body = _RTMSG.pack(
        AF_INET,
        dst_len,
        0,
        0,
        RT_TABLE_MAIN,
        proto,
        RT_SCOPE_NOWHERE if delete else scope,
        rtype,
        0,
    )
    if dst_len:
        body += _ip4(RTA_DST, dst)
    if oif:
        body += _u32(RTA_OIF, oif)
    if gateway:
        body += _ip4(RTA_GATEWAY, gateway)
    what = f"route {dst}/{dst_len}"
    if delete:
        return Request.raw(
            RTM_DELROUTE,
            _SET,
            body,
            "delete " + what,
            ignore=(errno.ESRCH, errno.ENOENT, errno.ENODEV),
        )
    flags = (NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE) if replace else _NEW
    return Request.raw(RTM_NEWROUTE, flags, body, what, ignore=(errno.EEXIST,))


def neigh(index: int, ip: str, mac: str, delete: bool = False) -> Request:
    body = (
        _NDMSG.pack(AF_INET, 0, 0, index, NUD_PERMANENT, 0, 0)
        + _ip4(NDA_DST, ip)
        + _mac(NDA_LLADDR, mac)
    )
    if delete:
        return Request.raw(
            RTM_DELNEIGH, _SET, body, f"delete neighbour {ip}", ignore=(errno.ENOENT, errno.ENODEV)
        )
    return Request.raw(
        RTM_NEWNEIGH,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
        body,
        f"neighbour {ip}",
    )


def arp_probes(index: int, retrans_ms: int, probes: int) -> Request:
    """ARP of interface `index` (a pod's eth0): a request repeated every `retrans_ms`, up to
    `probes` times, before the neighbour fails (the kernel's defaults: 1000 ms, 3). The
    first request for a pod on another node is answered once podnetd has resolved it
    (`podnet.kernel.vxmiss`): the repeat, not the default second, answers it."""
    parms = (
        _u32(NDTPA_IFINDEX, index)
        + _rta(NDTPA_RETRANS_TIME, struct.pack("=Q", retrans_ms))
        + _u32(NDTPA_MCAST_PROBES, probes)
    )
    body = struct.pack("=BxH", AF_INET, 0) + _str(NDTA_NAME, "arp_cache") + _rta(NDTA_PARMS, parms)
    return Request.raw(RTM_SETNEIGHTBL, _SET, body, f"ARP timing of link {index}")


def fdb_unicast(index: int, mac: str, vtep: str | None, delete: bool = False) -> Request:
    """FDB entry on a VXLAN device: frames to `mac` (a remote pod) go to `vtep` alone
    (None, to delete: whatever it went to)."""
    body = _NDMSG.pack(AF_BRIDGE, 0, 0, index, NUD_PERMANENT, NTF_SELF, 0) + _mac(NDA_LLADDR, mac)
    if vtep is not None:
        body += _rta(NDA_DST, socket.inet_aton(vtep))
    if delete:
        return Request.raw(
            RTM_DELNEIGH, _SET, body, f"delete fdb {mac}", ignore=(errno.ENOENT, errno.ENODEV)
        )
    return Request.raw(
        RTM_NEWNEIGH,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
        body,
        f"fdb {mac} {vtep}",
    )
