# SPDX-License-Identifier: Apache-2.0
"""Minimal rtnetlink client: batches of requests in one send, no fork, no event loop.

pyroute2's message classes encode and decode; this module owns the socket so that a
whole pod (veth + addresses + routes + neighbours) or a whole FDB (hundreds of entries)
goes to the kernel in one `sendmsg` and the acknowledgements come back together. A
socket stays bound to the network namespace it was opened in, which is how the agent
configures a pod's namespace without entering it.

This module is the socket and the message framing (constants, `Request`, `Netlink`,
batches and dumps); the requests themselves are built in `podnet.kernel.nlreq`, the dumps
read in `podnet.kernel.nlquery`.
"""

from __future__ import annotations

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
            for mtype, seq, payload in split(data):
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


def split(data: bytes) -> Iterator[tuple[int, int, bytes]]:
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


def chunks(items: Iterable[Request], n: int) -> Iterator[list[Request]]:
    buf: list[Request] = []
    for it in items:
        buf.append(it)
        if len(buf) >= n:
            yield buf
            buf = []
    if buf:
        yield buf
