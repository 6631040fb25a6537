# SPDX-License-Identifier: Apache-2.0
"""nf_tables netlink batches for the firewall's per-pod objects, encoded here.

libnftables (the `nft` library the rest of firewall.py uses) reads the tables it touches
into a cache before every command; with a chain per pod that costs O(pods) per command
(measured: 4 ms per pod at 200 pods, 75 ms at 1000), and a map of interface indexes is
as slow at any size. A pod's objects (its anti-spoofing element, its fast path chain,
its entries in the fast path's set and map) go to the kernel here instead: one batch of
a few messages on a NETLINK_NETFILTER socket, no cache, about 0.05 ms.

Only what firewall.py needs is here: set elements, base chains on a device, rules of
payload / meta / cmp / bitwise / lookup / immediate / fwd expressions. Every rule built
here is listed by `nft` exactly as the same rule written in nft syntax (unit test
test_nftnl.py compares both in a network namespace).
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import socket
import struct
import threading
from dataclasses import dataclass

NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END = 16, 17
NFT_MSG_NEWCHAIN, NFT_MSG_DELCHAIN, NFT_MSG_NEWRULE = 3, 5, 6
NFT_MSG_NEWSETELEM, NFT_MSG_DELSETELEM = 12, 14
NFPROTO_NETDEV, NFPROTO_BRIDGE = 5, 7
NF_NETDEV_INGRESS = 0
NF_ACCEPT = 1

NLM_F_REQUEST, NLM_F_ACK, NLM_F_CREATE, NLM_F_APPEND = 0x1, 0x4, 0x400, 0x800
NLMSG_ERROR = 2
NLA_F_NESTED = 0x8000

NFTA_LIST_ELEM = 1
NFTA_EXPR_NAME, NFTA_EXPR_DATA = 1, 2
NFTA_DATA_VALUE = 1
NFTA_CHAIN_TABLE, NFTA_CHAIN_NAME, NFTA_CHAIN_HOOK, NFTA_CHAIN_POLICY, NFTA_CHAIN_TYPE = (
    1,
    3,
    4,
    5,
    7,
)
NFTA_HOOK_HOOKNUM, NFTA_HOOK_PRIORITY, NFTA_HOOK_DEV = 1, 2, 3
NFTA_RULE_TABLE, NFTA_RULE_CHAIN, NFTA_RULE_EXPRESSIONS = 1, 2, 4
NFTA_SET_ELEM_LIST_TABLE, NFTA_SET_ELEM_LIST_SET, NFTA_SET_ELEM_LIST_ELEMENTS = 1, 2, 3
NFTA_SET_ELEM_KEY, NFTA_SET_ELEM_DATA = 1, 2
NFTA_META_DREG, NFTA_META_KEY = 1, 2
NFTA_PAYLOAD_DREG, NFTA_PAYLOAD_BASE, NFTA_PAYLOAD_OFFSET, NFTA_PAYLOAD_LEN = 1, 2, 3, 4
NFTA_CMP_SREG, NFTA_CMP_OP, NFTA_CMP_DATA = 1, 2, 3
NFTA_BITWISE_SREG, NFTA_BITWISE_DREG, NFTA_BITWISE_LEN = 1, 2, 3
NFTA_BITWISE_MASK, NFTA_BITWISE_XOR = 4, 5
NFTA_LOOKUP_SET, NFTA_LOOKUP_SREG, NFTA_LOOKUP_DREG, NFTA_LOOKUP_FLAGS = 1, 2, 3, 5
NFTA_IMMEDIATE_DREG, NFTA_IMMEDIATE_DATA = 1, 2
NFTA_FWD_SREG_DEV = 1

NFT_REG_1, NFT_REG_2 = 1, 2
NFT_CMP_EQ, NFT_CMP_NEQ = 0, 1
NFT_LOOKUP_F_INV = 1
NFT_META_PROTOCOL, NFT_META_IIFNAME, NFT_META_IIFTYPE = 1, 6, 8
NFT_PAYLOAD_LL_HEADER, NFT_PAYLOAD_NETWORK_HEADER = 0, 1
ARPHRD_ETHER = 1
ETH_P_IP = 0x0800
IFNAMSIZ = 16
SIOCGIFINDEX = 0x8933

_NLMSGHDR = struct.Struct("=IHHII")
_SEQ = itertools.count(1)
_SEQ_LOCK = threading.Lock()


class NftnlError(OSError):
    """A message of a batch was refused (the whole batch is then undone)."""

    def __init__(self, code: int, what: str) -> None:
        super().__init__(code, f"{what}: {os.strerror(code)}")
        self.code = code
        self.what = what


# -- attributes ---------------------------------------------------------------------
def _attr(kind: int, payload: bytes) -> bytes:
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * (-n % 4)


def _nest(kind: int, *parts: bytes) -> bytes:
    return _attr(kind | NLA_F_NESTED, b"".join(parts))


def _str(kind: int, s: str) -> bytes:
    return _attr(kind, s.encode() + b"\0")


def _be32(kind: int, v: int) -> bytes:
    return _attr(kind, struct.pack(">i" if v < 0 else ">I", v))


def _value(kind: int, data: bytes) -> bytes:
    return _nest(kind, _attr(NFTA_DATA_VALUE, data))


# -- values, as nft lays them out in registers and set keys ----------------------------
def ifname(name: str) -> bytes:
    """An interface name as a key field: IFNAMSIZ bytes, NUL padded."""
    b = name.encode()
    if len(b) >= IFNAMSIZ:
        raise ValueError(f"interface name too long: {name!r}")
    return b.ljust(IFNAMSIZ, b"\0")


def mac(addr: str) -> bytes:
    return bytes.fromhex(addr.replace(":", ""))


def ipv4(addr: str) -> bytes:
    return socket.inet_aton(addr)


def concat(*fields: bytes) -> bytes:
    """A concatenated key: each field padded to a multiple of 4 bytes (its registers)."""
    return b"".join(f + b"\0" * (-len(f) % 4) for f in fields)


# -- expressions --------------------------------------------------------------------
def _expr(name: str, *attrs: bytes) -> bytes:
    return _nest(NFTA_LIST_ELEM, _str(NFTA_EXPR_NAME, name), _nest(NFTA_EXPR_DATA, *attrs))


def meta(key: int, dreg: int = NFT_REG_1) -> bytes:
    return _expr("meta", _be32(NFTA_META_KEY, key), _be32(NFTA_META_DREG, dreg))


def payload(base: int, offset: int, length: int, dreg: int = NFT_REG_1) -> bytes:
    return _expr(
        "payload",
        _be32(NFTA_PAYLOAD_DREG, dreg),
        _be32(NFTA_PAYLOAD_BASE, base),
        _be32(NFTA_PAYLOAD_OFFSET, offset),
        _be32(NFTA_PAYLOAD_LEN, length),
    )


def cmp(data: bytes, op: int = NFT_CMP_EQ, sreg: int = NFT_REG_1) -> bytes:
    return _expr(
        "cmp", _be32(NFTA_CMP_SREG, sreg), _be32(NFTA_CMP_OP, op), _value(NFTA_CMP_DATA, data)
    )


def bitwise(mask: bytes, xor: bytes, reg: int = NFT_REG_1) -> bytes:
    return _expr(
        "bitwise",
        _be32(NFTA_BITWISE_SREG, reg),
        _be32(NFTA_BITWISE_DREG, reg),
        _be32(NFTA_BITWISE_LEN, len(mask)),
        _value(NFTA_BITWISE_MASK, mask),
        _value(NFTA_BITWISE_XOR, xor),
    )


def lookup(
    set_name: str, sreg: int = NFT_REG_1, dreg: int | None = None, invert: bool = False
) -> bytes:
    attrs = [_str(NFTA_LOOKUP_SET, set_name), _be32(NFTA_LOOKUP_SREG, sreg)]
    if dreg is not None:
        attrs.append(_be32(NFTA_LOOKUP_DREG, dreg))
    if invert:
        attrs.append(_be32(NFTA_LOOKUP_FLAGS, NFT_LOOKUP_F_INV))
    return _expr("lookup", *attrs)


def immediate(data: bytes, dreg: int = NFT_REG_1) -> bytes:
    return _expr("immediate", _be32(NFTA_IMMEDIATE_DREG, dreg), _value(NFTA_IMMEDIATE_DATA, data))


def fwd(sreg: int = NFT_REG_1) -> bytes:
    return _expr("fwd", _be32(NFTA_FWD_SREG_DEV, sreg))


def ether_field(offset: int, dreg: int = NFT_REG_1) -> list[bytes]:
    """An Ethernet address of the frame (offset 0: destination, 6: source), with the
    link-type dependency nft adds to it in the netdev family."""
    return [
        meta(NFT_META_IIFTYPE),
        cmp(struct.pack("=H", ARPHRD_ETHER)),
        payload(NFT_PAYLOAD_LL_HEADER, offset, 6, dreg),
    ]


def is_ipv4() -> list[bytes]:
    return [meta(NFT_META_PROTOCOL), cmp(struct.pack(">H", ETH_P_IP))]


# -- messages -----------------------------------------------------------------------
@dataclass
class Message:
    mtype: int  # NFT_MSG_*
    family: int  # NFPROTO_*
    flags: int
    body: bytes
    what: str
    #: errnos that are no error for this message (a delete of what is gone)
    ignore: tuple[int, ...] = ()


def new_chain(family: int, table: str, name: str, device: str, priority: int) -> Message:
    """A filter base chain on the ingress hook of `device`, policy accept. Without
    NLM_F_EXCL: a chain that exists already is no error (and is left as it is)."""
    hook = _nest(
        NFTA_CHAIN_HOOK,
        _be32(NFTA_HOOK_HOOKNUM, NF_NETDEV_INGRESS),
        _be32(NFTA_HOOK_PRIORITY, priority),
        _str(NFTA_HOOK_DEV, device),
    )
    body = (
        _str(NFTA_CHAIN_TABLE, table)
        + _str(NFTA_CHAIN_NAME, name)
        + hook
        + _be32(NFTA_CHAIN_POLICY, NF_ACCEPT)
        + _str(NFTA_CHAIN_TYPE, "filter")
    )
    return Message(NFT_MSG_NEWCHAIN, family, NLM_F_CREATE, body, f"chain {table} {name}")


def del_chain(family: int, table: str, name: str) -> Message:
    """Delete a chain and its rules; a chain that is gone is no error (older kernels drop
    a device's only base chain with the device)."""
    body = _str(NFTA_CHAIN_TABLE, table) + _str(NFTA_CHAIN_NAME, name)
    return Message(
        NFT_MSG_DELCHAIN, family, 0, body, f"delete chain {table} {name}", (errno.ENOENT,)
    )


def new_rule(family: int, table: str, chain: str, exprs: list[bytes]) -> Message:
    body = (
        _str(NFTA_RULE_TABLE, table)
        + _str(NFTA_RULE_CHAIN, chain)
        + _nest(NFTA_RULE_EXPRESSIONS, *exprs)
    )
    return Message(NFT_MSG_NEWRULE, family, NLM_F_CREATE | NLM_F_APPEND, body, f"rule in {chain}")


def _elements(family: int, table: str, set_name: str, elems: list[tuple[bytes, bytes]]) -> bytes:
    items = []
    for key, data in elems:
        attrs = [_value(NFTA_SET_ELEM_KEY, key)]
        if data:
            attrs.append(_value(NFTA_SET_ELEM_DATA, data))
        items.append(_nest(NFTA_LIST_ELEM, *attrs))
    return (
        _str(NFTA_SET_ELEM_LIST_TABLE, table)
        + _str(NFTA_SET_ELEM_LIST_SET, set_name)
        + _nest(NFTA_SET_ELEM_LIST_ELEMENTS, *items)
    )


def add_elements(
    family: int, table: str, set_name: str, elems: list[tuple[bytes, bytes]]
) -> Message:
    """Elements (key, data; data b"" in a set) of a set or map; one that exists is no
    error."""
    body = _elements(family, table, set_name, elems)
    return Message(NFT_MSG_NEWSETELEM, family, NLM_F_CREATE, body, f"elements of {set_name}")


def del_elements(
    family: int, table: str, set_name: str, elems: list[tuple[bytes, bytes]]
) -> Message:
    """Delete elements of a set or map (by key); one that is gone is no error."""
    body = _elements(family, table, set_name, [(k, b"") for k, _d in elems])
    return Message(
        NFT_MSG_DELSETELEM,
        family,
        0,
        body,
        f"delete elements of {set_name}",
        (errno.ENOENT,),
    )


def _next_seq() -> int:
    with _SEQ_LOCK:
        return next(_SEQ) & 0x7FFFFFFF or 1


class Socket:
    """A NETLINK_NETFILTER socket in the network namespace it was opened in."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        self.sock.bind((0, 0))

    def close(self) -> None:
        self.sock.close()

    def ifindex(self, name: str) -> int:
        """Index of link `name` in the socket's namespace (SIOCGIFINDEX; OSError ENODEV
        when there is none)."""
        r = fcntl.ioctl(self.sock.fileno(), SIOCGIFINDEX, struct.pack("16si12x", name.encode(), 0))
        return int(struct.unpack_from("16si", r)[1])

    def commit(self, msgs: list[Message]) -> None:
        """One transaction: all of `msgs` or none. A message refused with one of its
        `ignore` errnos is dropped and the rest sent again; any other refusal raises
        NftnlError (nothing of the batch stays)."""
        while msgs:
            failed = self._send(msgs)
            if not failed:
                return
            code, m = failed
            if code not in m.ignore:
                raise NftnlError(code, m.what)
            msgs = [x for x in msgs if x is not m]

    def _send(self, msgs: list[Message]) -> tuple[int, Message] | None:
        def header(mtype: int, flags: int, seq: int, length: int) -> bytes:
            return _NLMSGHDR.pack(16 + 4 + length, mtype, flags, seq, 0)

        res_id = struct.pack(">H", NFNL_SUBSYS_NFTABLES)
        parts = [header(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, _next_seq(), 0) + b"\0\0" + res_id]
        by_seq: dict[int, Message] = {}
        for m in msgs:
            seq = _next_seq()
            by_seq[seq] = m
            mtype = (NFNL_SUBSYS_NFTABLES << 8) | m.mtype
            flags = NLM_F_REQUEST | NLM_F_ACK | m.flags
            parts.append(
                header(mtype, flags, seq, len(m.body)) + bytes([m.family, 0, 0, 0]) + m.body
            )
        parts.append(header(NFNL_MSG_BATCH_END, NLM_F_REQUEST, _next_seq(), 0) + b"\0\0" + res_id)
        self.sock.sendmsg([b"".join(parts)])
        # the kernel runs the batch inside sendmsg: every answer is queued by now
        first: tuple[int, Message] | None = None
        answered = 0
        while answered < len(by_seq):
            try:
                data = self.sock.recv(1 << 20, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            off = 0
            while off + 16 <= len(data):
                length, mtype, _f, seq, _pid = _NLMSGHDR.unpack_from(data, off)
                if length < 16:
                    break
                if mtype == NLMSG_ERROR and seq in by_seq:
                    answered += 1
                    (err,) = struct.unpack_from("=i", data, off + 16)
                    if err and first is None:
                        first = (-err, by_seq[seq])
                off += (length + 3) & ~3
        return first
