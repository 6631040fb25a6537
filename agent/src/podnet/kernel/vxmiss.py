# SPDX-License-Identifier: Apache-2.0
"""What the users' VXLAN devices do not know: their misses, as the kernel reports them.

A user's VXLAN (`nlreq.vxlan`: `proxy`, `l2miss`, `l3miss`) answers a pod's ARP request
from the device's own neighbour entries; for an address it has none of, it reports an
*L3 miss* (the address), and for a frame to a MAC it has no forwarding entry of, an *L2
miss* (the MAC). The kernel sends both as RTM_GETNEIGH messages (the device's ifindex,
NDA_DST or NDA_LLADDR; family AF_INET for an L3 miss, measured on 6.18, AF_BRIDGE for an
L2 miss) to the rtnetlink group RTNLGRP_NEIGH of the
device's network namespace. `MissSocket` is a socket of that group; `read` returns the
misses it got, and how many the kernel dropped because the socket was full (ENOBUFS: the
pod repeats its ARP request, so a dropped miss only delays).
"""

from __future__ import annotations

import errno
import socket
import struct
from dataclasses import dataclass

from podnet.kernel import nl

#: rtnetlink multicast group of neighbour (and FDB) notifications
RTNLGRP_NEIGH = 3
_NDMSG = struct.Struct("=BxxxiHBB")  # family, pad, ifindex, state, flags, type
_RTA = struct.Struct("=HH")
#: the socket's receive buffer: a burst of misses from many pods at once
RCVBUF = 4 << 20


@dataclass(frozen=True)
class Miss:
    """A device's miss: `ip` (an L3 miss: an ARP request it could not answer) or `mac` (an
    L2 miss: a frame it had no destination for)."""

    ifindex: int
    ip: str | None = None
    mac: str | None = None


def parse(data: bytes) -> list[Miss]:
    """The misses among the rtnetlink messages in `data` (one datagram)."""
    out: list[Miss] = []
    for mtype, _seq, payload in nl.split(data):
        if mtype != nl.RTM_GETNEIGH or len(payload) < _NDMSG.size:
            continue
        family, ifindex, _state, _flags, _type = _NDMSG.unpack_from(payload, 0)
        if family not in (nl.AF_INET, nl.AF_BRIDGE):
            continue
        ip = mac = None
        off = _NDMSG.size
        while off + _RTA.size <= len(payload):
            length, kind = _RTA.unpack_from(payload, off)
            if length < _RTA.size:
                break
            value = payload[off + _RTA.size : off + length]
            if kind == nl.NDA_DST and len(value) == 4:
                ip = socket.inet_ntoa(value)
            elif kind == nl.NDA_LLADDR and len(value) == 6:
                mac = ":".join(f"{b:02x}" for b in value)
            off += (length + 3) & ~3
        if ip is not None or mac is not None:
            out.append(Miss(ifindex, ip, mac))
    return out


class MissSocket:
    """A socket of the neighbour notifications of the network namespace it is opened in."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, nl.NETLINK_ROUTE)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        self.sock.bind((0, 1 << (RTNLGRP_NEIGH - 1)))
        #: notifications the kernel dropped (the socket was full), counted per read
        self.overflows = 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self, timeout: float | None) -> list[Miss]:
        """The misses of the next datagram (waits up to `timeout` seconds; [] if none came
        or the kernel dropped some: counted in `overflows`)."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 16)
        except TimeoutError:
            return []
        except OSError as e:
            if e.errno != errno.ENOBUFS:
                raise
            self.overflows += 1
            return []
        return parse(data)

    def close(self) -> None:
        self.sock.close()
