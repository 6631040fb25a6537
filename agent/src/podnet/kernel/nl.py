# SPDX-License-Identifier: Apache-2.0
"""Minimal rtnetlink client: batches of requests in one send, no fork, no event loop.

pyroute2's message classes encode and decode; this module owns the socket so that a
whole pod (veth + addresses + routes + neighbours) or a whole FDB (hundreds of entries)
goes to the kernel in one `sendmsg` and the acknowledgements come back together. A
socket stays bound to the network namespace it was opened in, which is how the agent
configures a pod's namespace without entering it.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import itertools
import os
import socket
import struct
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from podnet.kernel.pyroute2_lite import ifaddrmsg, ifinfmsg, ndmsg, rtmsg

NETLINK_ROUTE = 0
NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_ROOT = 0x100
NLM_F_MATCH = 0x200
NLM_F_DUMP = NLM_F_ROOT | NLM_F_MATCH
NLM_F_REPLACE = 0x100
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NLM_F_APPEND = 0x800
NLMSG_ERROR = 2
NLMSG_DONE = 3

RTM_NEWLINK = 16
RTM_DELLINK = 17
RTM_GETLINK = 18
RTM_NEWADDR = 20
RTM_DELADDR = 21
RTM_GETADDR = 22
RTM_NEWROUTE = 24
RTM_DELROUTE = 25
RTM_GETROUTE = 26
RTM_NEWNEIGH = 28
RTM_DELNEIGH = 29
RTM_GETNEIGH = 30

AF_INET = socket.AF_INET
AF_INET6 = socket.AF_INET6
AF_BRIDGE = 7
#: IFLA_INET6_ADDR_GEN_MODE: the kernel generates no IPv6 link-local address
IN6_ADDR_GEN_MODE_NONE = 1
IFF_UP = 0x1
NUD_PERMANENT = 0x80
NTF_SELF = 0x02
NDA_DST = 1
NDA_LLADDR = 2
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_NDMSG = struct.Struct("=BBHiHBB")  # family, pad, pad, ifindex, state, flags, type
RT_TABLE_MAIN = 254
RT_SCOPE_UNIVERSE = 0
RT_SCOPE_LINK = 253
RT_SCOPE_NOWHERE = 255  # on delete: match any scope
RTN_UNICAST = 1
RTN_UNREACHABLE = 7
#: routes the agent installs carry this protocol number, so reconcile can find its own
RTPROT_PODNET = 117

#: the IPv4 default route's destination (not a bind address)
ANY = "0.0.0.0"  # noqa: S104

_HDR = struct.Struct("=LHHLL")
_SEQ_LOCK = threading.Lock()
_SEQ = itertools.count(1)


def _next_seq() -> int:
    with _SEQ_LOCK:
        return next(_SEQ) & 0x7FFFFFFF or 1


class NetlinkError(OSError):
    """A request in a batch was refused by the kernel."""

    def __init__(self, code: int, what: str) -> None:
        super().__init__(code, f"{what}: {os.strerror(code)}")
        self.code = code
        self.what = what


class Request:
    """One encoded rtnetlink request and a short description for error messages."""

    __slots__ = ("data", "ignore", "seq", "what")

    @classmethod
    def raw(
        cls, mtype: int, flags: int, body: bytes, what: str, ignore: tuple[int, ...] = ()
    ) -> Request:
        """A request whose body is already encoded (for messages sent by the hundred,
        where pyroute2's encoder costs ~0.3 ms each)."""
        r = cls.__new__(cls)
        r.seq = _next_seq()
        r.data = _NLMSGHDR.pack(_NLMSGHDR.size + len(body), mtype, flags, r.seq, 0) + body
        r.what = what
        r.ignore = ignore
        return r

    def __init__(
        self, msg: Any, mtype: int, flags: int, what: str, ignore: tuple[int, ...] = ()
    ) -> None:
        self.seq = _next_seq()
        msg["header"]["type"] = mtype
        msg["header"]["flags"] = flags
        msg["header"]["sequence_number"] = self.seq
        msg.encode()
        self.data = bytes(msg.data)
        self.what = what
        self.ignore = ignore


class Netlink:
    """An rtnetlink socket bound to the network namespace current at creation time."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        self.sock.bind((0, 0))

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Netlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- batches ----------------------------------------------------------------
    def batch(self, reqs: list[Request]) -> list[int]:
        """Send all requests at once; return the per-request errno (0 = ok).

        Raises NetlinkError for the first error that is not in the request's
        `ignore` list.
        """
        results: dict[int, int] = {}
        group: list[Request] = []
        size = 0
        for r in reqs:
            group.append(r)
            size += len(r.data)
            if size > 128 * 1024:
                self._send_group(group, results)
                group, size = [], 0
        if group:
            self._send_group(group, results)
        out = [results.get(r.seq, 0) for r in reqs]
        for r, code in zip(reqs, out, strict=True):
            if code and code not in r.ignore:
                raise NetlinkError(code, r.what)
        return out

    def _send_group(self, group: list[Request], results: dict[int, int]) -> None:
        self.sock.sendmsg([r.data for r in group])
        pending = {r.seq for r in group}
        while pending:
            data = self.sock.recv(1 << 20)
            for mtype, seq, payload in _split(data):
                if mtype == NLMSG_ERROR and seq in pending:
                    (err,) = struct.unpack_from("=i", payload, 0)
                    results[seq] = -err
                    pending.discard(seq)

    def dump(self, msg: Any, mtype: int, family: int = 0) -> Iterator[Any]:
        """RTM_GET* dump; yields decoded pyroute2 messages."""
        req = Request(msg, mtype, NLM_F_REQUEST | NLM_F_DUMP, "dump")
        self.sock.send(req.data)
        cls = {
            RTM_GETLINK: ifinfmsg,
            RTM_GETROUTE: rtmsg,
            RTM_GETNEIGH: ndmsg,
            RTM_GETADDR: ifaddrmsg,
        }[mtype]
        del family
        while True:
            data = self.sock.recv(1 << 20)
            for t, seq, _payload, raw in _split_raw(data):
                if seq != req.seq:
                    continue
                if t == NLMSG_DONE:
                    return
                if t == NLMSG_ERROR:
                    (err,) = struct.unpack_from("=i", raw, 16)
                    if err:
                        raise NetlinkError(-err, "dump")
                    return
                m = cls(raw)
                m.decode()
                yield m


def _split(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    off = 0
    while off + 16 <= len(data):
        length, mtype, _flags, seq, _pid = _HDR.unpack_from(data, off)
        if length < 16:
            break
        yield mtype, seq, data[off + 16 : off + length]
        off += (length + 3) & ~3


def _split_raw(data: bytes) -> Iterator[tuple[int, int, bytes, bytes]]:
    off = 0
    while off + 16 <= len(data):
        length, mtype, _flags, seq, _pid = _HDR.unpack_from(data, off)
        if length < 16:
            break
        yield mtype, seq, data[off + 16 : off + length], data[off : off + length]
        off += (length + 3) & ~3


# -- request builders --------------------------------------------------------------
# Encoded here with `struct`, byte for byte what pyroute2 encodes (unit test
# test_netlink_encoding.py): pyroute2's encoder costs 40-400 us of CPU per message, about
# 1.2 ms per pod in all, on the request path of every pod (docs/bench.md).
_NEW = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
_SET = NLM_F_REQUEST | NLM_F_ACK
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
    (a spare veth's host end, made before its pod: dataplane.py)."""
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
    """A VXLAN device, down (`host_link_up` follows)."""
    data = (
        _u32(IFLA_VXLAN_ID, vni)
        + _ip4(IFLA_VXLAN_LOCAL, local)
        + _u32(IFLA_VXLAN_LINK, link)
        + _rta(IFLA_VXLAN_PORT, struct.pack(">H", port))
        + _rta(IFLA_VXLAN_LEARNING, b"\0")
        + _rta(IFLA_VXLAN_TTL, bytes([64]))
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


def fdb_flood(index: int, vtep: str, delete: bool = False) -> Request:
    """All-zero FDB entry on a VXLAN device: flood BUM traffic to `vtep` (a user's first
    pod adds one per node of theirs: hundreds)."""
    body = (
        _NDMSG.pack(AF_BRIDGE, 0, 0, index, NUD_PERMANENT, NTF_SELF, 0)
        + _rta(NDA_LLADDR, bytes(6))
        + _rta(NDA_DST, socket.inet_aton(vtep))
    )
    if delete:
        return Request.raw(
            RTM_DELNEIGH, _SET, body, f"delete fdb {vtep}", ignore=(errno.ENOENT, errno.ENODEV)
        )
    return Request.raw(
        RTM_NEWNEIGH,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_APPEND,
        body,
        f"fdb {vtep}",
        ignore=(errno.EEXIST,),
    )


def fdb_unicast(index: int, mac: str, vtep: str, delete: bool = False) -> Request:
    """FDB entry on a VXLAN device: frames to `mac` (a remote pod) go to `vtep` alone,
    not to every VTEP of the all-zero entries."""
    body = (
        _NDMSG.pack(AF_BRIDGE, 0, 0, index, NUD_PERMANENT, NTF_SELF, 0)
        + _mac(NDA_LLADDR, mac)
        + _rta(NDA_DST, socket.inet_aton(vtep))
    )
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


SIOCGIFINDEX = 0x8933


def ifindex(nl: Netlink, name: str) -> int:
    """Index of link `name` in the socket's netns: one ioctl (a netlink socket serves
    SIOCGIFINDEX for its namespace), no dump and no decoding."""
    r = fcntl.ioctl(nl.sock.fileno(), SIOCGIFINDEX, struct.pack("16si12x", name.encode(), 0))
    return int(struct.unpack_from("16si", r)[1])


# -- queries -------------------------------------------------------------------------
def links(nl: Netlink) -> dict[str, dict[str, Any]]:
    """name -> {index, kind, master, vni} for every link of the socket's netns."""
    out: dict[str, dict[str, Any]] = {}
    m = ifinfmsg()
    m["family"] = 0
    for msg in nl.dump(m, RTM_GETLINK):
        name = msg.get_attr("IFLA_IFNAME")
        info = msg.get_attr("IFLA_LINKINFO")
        kind = info.get_attr("IFLA_INFO_KIND") if info else None
        vni = None
        if kind == "vxlan":
            data = info.get_attr("IFLA_INFO_DATA")
            vni = data.get_attr("IFLA_VXLAN_ID") if data else None
        out[name] = {
            "index": msg["index"],
            "kind": kind,
            "master": msg.get_attr("IFLA_MASTER") or 0,
            "vni": vni,
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


def fdb_dsts(nl: Netlink, index: int) -> set[str]:
    """Destinations of all-zero FDB entries on VXLAN device `index`."""
    return fdb_entries(nl, index)[0]


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


def mac_for_ip(ip: str) -> str:
    """Deterministic, locally administered MAC of a pod interface: 0a:58:<ip bytes>."""
    b = ipaddress.IPv4Address(ip).packed
    return "0a:58:" + ":".join(f"{x:02x}" for x in b)


def chunks(items: Iterable[Request], n: int) -> Iterator[list[Request]]:
    buf: list[Request] = []
    for it in items:
        buf.append(it)
        if len(buf) >= n:
            yield buf
            buf = []
    if buf:
        yield buf
