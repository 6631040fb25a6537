# SPDX-License-Identifier: Apache-2.0
"""Netlink messages podnet encodes by hand are byte for byte what pyroute2 encodes."""

from __future__ import annotations

from typing import Any

import pytest
from podnet.kernel import nl, nlreq
from podnet.kernel.userlinks import arp_reply
from podnet.names import mac_for_ip
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.ndmsg import ndmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg


@pytest.mark.parametrize("delete", [False, True])
@pytest.mark.parametrize(
    ("index", "ip", "vtep"), [(5, "198.18.0.66", "198.19.208.9"), (70000, "10.1.2.3", "10.255.0.1")]
)
def test_fdb_unicast_matches_pyroute2(index: int, ip: str, vtep: str, delete: bool) -> None:
    mac = mac_for_ip(ip)
    req = nlreq.fdb_unicast(index, mac, vtep, delete)
    m = ndmsg()
    m["family"] = nl.AF_BRIDGE
    m["ifindex"] = index
    m["state"] = nl.NUD_PERMANENT
    m["flags"] = nl.NTF_SELF
    m["attrs"] = [("NDA_LLADDR", mac), ("NDA_DST", vtep)]
    m["header"]["type"] = nl.RTM_DELNEIGH if delete else nl.RTM_NEWNEIGH
    m["header"]["flags"] = (
        nl.NLM_F_REQUEST | nl.NLM_F_ACK
        if delete
        else nl.NLM_F_REQUEST | nl.NLM_F_ACK | nl.NLM_F_CREATE | nl.NLM_F_REPLACE
    )
    m["header"]["sequence_number"] = req.seq
    m.encode()
    assert bytes(m.data) == req.data
    assert nlreq.fdb_unicast(index, mac, vtep).seq != req.seq  # each its own sequence number


def test_fdb_unicast_delete_without_destination_matches_pyroute2() -> None:
    """A remote pod forgotten: its entry deleted whatever node it sent to."""
    mac = mac_for_ip("198.18.0.66")
    req = nlreq.fdb_unicast(7, mac, None, delete=True)
    m = ndmsg()
    m["family"] = nl.AF_BRIDGE
    m["ifindex"] = 7
    m["state"] = nl.NUD_PERMANENT
    m["flags"] = nl.NTF_SELF
    m["attrs"] = [("NDA_LLADDR", mac)]
    m["header"]["type"] = nl.RTM_DELNEIGH
    m["header"]["flags"] = nl.NLM_F_REQUEST | nl.NLM_F_ACK
    m["header"]["sequence_number"] = req.seq
    m.encode()
    assert bytes(m.data) == req.data


# -- the per-pod requests, against the same messages built with pyroute2 (how nl.py built
# them before they were encoded by hand) -------------------------------------------------
_NEW = nl.NLM_F_REQUEST | nl.NLM_F_ACK | nl.NLM_F_CREATE | nl.NLM_F_EXCL
_SET = nl.NLM_F_REQUEST | nl.NLM_F_ACK
_REPLACE = nl.NLM_F_REQUEST | nl.NLM_F_ACK | nl.NLM_F_CREATE | nl.NLM_F_REPLACE
_NO_LL = (
    "IFLA_AF_SPEC",
    {"attrs": [("AF_INET6", {"attrs": [("IFLA_INET6_ADDR_GEN_MODE", 1)]})]},
)


def _encoded(m: Any, mtype: int, flags: int, seq: int) -> bytes:
    m["header"]["type"] = mtype
    m["header"]["flags"] = flags
    m["header"]["sequence_number"] = seq
    m.encode()
    return bytes(m.data)


def _ifi(index: int = 0, flags: int = 0, attrs: list[Any] | None = None) -> ifinfmsg:
    m = ifinfmsg()
    m["index"] = index
    if flags:
        m["flags"] = flags
        m["change"] = flags
    m["attrs"] = attrs or []
    return m


def test_link_requests_match_pyroute2() -> None:
    r = nlreq.link_up(7)
    assert r.data == _encoded(_ifi(7, nl.IFF_UP), nl.RTM_NEWLINK, _SET, r.seq)
    off, up = nlreq.host_link_up("pnv0123456789ab")
    name = ("IFLA_IFNAME", "pnv0123456789ab")
    assert off.data == _encoded(_ifi(0, 0, [name, _NO_LL]), nl.RTM_NEWLINK, _SET, off.seq)
    assert up.data == _encoded(_ifi(0, nl.IFF_UP, [name]), nl.RTM_NEWLINK, _SET, up.seq)
    r = nlreq.host_link_off_ipv6("pnv0123456789ab")
    assert r.data == _encoded(_ifi(0, 0, [name, _NO_LL]), nl.RTM_NEWLINK, _SET, r.seq)
    r = nlreq.enslave_up(12, 70000)
    want = _ifi(12, nl.IFF_UP, [("IFLA_MASTER", 70000)])
    assert r.data == _encoded(want, nl.RTM_NEWLINK, _SET, r.seq)
    r = nlreq.no_ipv6_ll(9)
    assert r.data == _encoded(_ifi(9, 0, [_NO_LL]), nl.RTM_NEWLINK, _SET, r.seq)
    r = nlreq.link_up_with_mac(2, "0a:58:c6:13:80:0a")
    want = _ifi(2, nl.IFF_UP, [("IFLA_ADDRESS", "0a:58:c6:13:80:0a")])
    assert r.data == _encoded(want, nl.RTM_NEWLINK, _SET, r.seq)
    r = nlreq.del_link(9, "x")
    assert r.data == _encoded(_ifi(9), nl.RTM_DELLINK, _SET, r.seq)
    r = nlreq.del_link_named("pnvx5001")
    assert r.data == _encoded(
        _ifi(0, 0, [("IFLA_IFNAME", "pnvx5001")]), nl.RTM_DELLINK, _SET, r.seq
    )


@pytest.mark.parametrize(
    ("host", "peer", "master"),
    [("pnv0123456789ab", "eth0", 70000), ("pnvabc", "net1x", 70000), ("pnv0123", "eth0", 0)],
)
def test_veth_matches_pyroute2(host: str, peer: str, master: int) -> None:
    r = nlreq.veth(host, peer, 5, 1450, master, "02:50:6e:ff:ff:fe")
    peer_attrs = {
        "attrs": [
            ("IFLA_IFNAME", peer),
            ("IFLA_MTU", 1450),
            ("IFLA_ADDRESS", "02:50:6e:ff:ff:fe"),
            ("IFLA_NET_NS_FD", 5),
        ]
    }
    info = {
        "attrs": [
            ("IFLA_INFO_KIND", "veth"),
            ("IFLA_INFO_DATA", {"attrs": [("VETH_INFO_PEER", peer_attrs)]}),
        ]
    }
    want = _ifi(
        0,
        0,
        [
            ("IFLA_IFNAME", host),
            ("IFLA_MTU", 1450),
            *([("IFLA_MASTER", master)] if master else []),  # 0: in no bridge (a spare's)
            ("IFLA_LINKINFO", info),
        ],
    )
    assert r.data == _encoded(want, nl.RTM_NEWLINK, _NEW, r.seq)


def test_bridge_and_vxlan_match_pyroute2() -> None:
    r = nlreq.bridge("pnbr5001", "02:50:6e:00:00:01", 1450)
    info = {"attrs": [("IFLA_INFO_KIND", "bridge")]}
    want = _ifi(
        0,
        0,
        [
            ("IFLA_IFNAME", "pnbr5001"),
            ("IFLA_MTU", 1450),
            ("IFLA_ADDRESS", "02:50:6e:00:00:01"),
            ("IFLA_LINKINFO", info),
        ],
    )
    assert r.data == _encoded(want, nl.RTM_NEWLINK, _NEW, r.seq)
    r = nlreq.vxlan("pnvx5001", 5001, "198.19.250.11", 3, 4789, 1450, 9)
    data = {
        "attrs": [
            ("IFLA_VXLAN_ID", 5001),
            ("IFLA_VXLAN_LOCAL", "198.19.250.11"),
            ("IFLA_VXLAN_LINK", 3),
            ("IFLA_VXLAN_PORT", 4789),
            ("IFLA_VXLAN_LEARNING", 0),
            ("IFLA_VXLAN_TTL", 64),
            ("IFLA_VXLAN_PROXY", 1),
            ("IFLA_VXLAN_L2MISS", 1),
            ("IFLA_VXLAN_L3MISS", 1),
        ]
    }
    info = {"attrs": [("IFLA_INFO_KIND", "vxlan"), ("IFLA_INFO_DATA", data)]}
    want = _ifi(
        0,
        0,
        [
            ("IFLA_IFNAME", "pnvx5001"),
            ("IFLA_MTU", 1450),
            ("IFLA_MASTER", 9),
            ("IFLA_LINKINFO", info),
        ],
    )
    assert r.data == _encoded(want, nl.RTM_NEWLINK, _NEW, r.seq)


@pytest.mark.parametrize(("family", "ip", "plen"), [(2, "198.19.128.10", 18), (10, "fe80::1", 64)])
def test_addresses_match_pyroute2(family: int, ip: str, plen: int) -> None:
    def msg(local: bool) -> ifaddrmsg:
        m = ifaddrmsg()
        m["family"] = family
        m["prefixlen"] = plen
        m["index"] = 2
        m["attrs"] = ([("IFA_LOCAL", ip)] if local else []) + [("IFA_ADDRESS", ip)]
        return m

    r = nlreq.del_addr(2, family, ip, plen)
    assert r.data == _encoded(msg(family == nl.AF_INET), nl.RTM_DELADDR, _SET, r.seq)
    if family == nl.AF_INET:
        r = nlreq.addr(2, ip, plen)
        assert r.data == _encoded(msg(True), nl.RTM_NEWADDR, _NEW, r.seq)


@pytest.mark.parametrize(
    "kw",
    [
        {"dst": "169.254.0.1", "dst_len": 32, "oif": 2, "scope": nl.RT_SCOPE_LINK},
        {"dst": nl.ANY, "dst_len": 0, "gateway": "169.254.0.1", "oif": 2},
        {"dst": "198.19.128.10", "dst_len": 32, "delete": True},
        {
            "dst": "198.19.128.10",
            "dst_len": 32,
            "oif": 7,
            "scope": nl.RT_SCOPE_LINK,
            "replace": True,
        },
        {"dst": "198.19.0.0", "dst_len": 26, "gateway": "10.0.0.2", "oif": 3, "replace": True},
    ],
)
def test_routes_match_pyroute2(kw: dict[str, Any]) -> None:
    dst, dst_len = kw["dst"], kw["dst_len"]
    opts = {k: v for k, v in kw.items() if k not in ("dst", "dst_len")}
    r = nlreq.route(dst, dst_len, **opts)
    m = rtmsg()
    m["family"] = nl.AF_INET
    m["dst_len"] = dst_len
    m["table"] = nl.RT_TABLE_MAIN
    m["proto"] = nl.RTPROT_PODNET
    m["scope"] = nl.RT_SCOPE_NOWHERE if opts.get("delete") else opts.get("scope", 0)
    m["type"] = nl.RTN_UNICAST
    attrs: list[Any] = []
    if dst_len:
        attrs.append(("RTA_DST", dst))
    if opts.get("oif"):
        attrs.append(("RTA_OIF", opts["oif"]))
    if opts.get("gateway"):
        attrs.append(("RTA_GATEWAY", opts["gateway"]))
    m["attrs"] = attrs
    if opts.get("delete"):
        assert r.data == _encoded(m, nl.RTM_DELROUTE, _SET, r.seq)
    else:
        assert r.data == _encoded(
            m, nl.RTM_NEWROUTE, _REPLACE if opts.get("replace") else _NEW, r.seq
        )


@pytest.mark.parametrize("delete", [False, True])
def test_neigh_matches_pyroute2(delete: bool) -> None:
    r = nlreq.neigh(2, "169.254.0.1", "02:50:6e:00:00:01", delete)
    m = ndmsg()
    m["family"] = nl.AF_INET
    m["ifindex"] = 2
    m["state"] = nl.NUD_PERMANENT
    m["attrs"] = [("NDA_DST", "169.254.0.1"), ("NDA_LLADDR", "02:50:6e:00:00:01")]
    want = _encoded(
        m, nl.RTM_DELNEIGH if delete else nl.RTM_NEWNEIGH, _SET if delete else _REPLACE, r.seq
    )
    assert r.data == want


def test_the_arp_reply_announcing_a_remote_pod() -> None:
    """What podnetd broadcasts into a user's bridge once a remote pod is resolved
    (UserLinks.announce): an ARP reply, sender and target the pod's address, from its MAC."""
    f = arp_reply("198.18.0.66", "0a:58:c6:12:00:42")
    assert len(f) == 42
    assert f[:6] == b"\xff" * 6 and f[6:12] == bytes.fromhex("0a58c6120042")
    assert f[12:14] == b"\x08\x06"  # ARP
    # hardware Ethernet, protocol IPv4, sizes 6 and 4, op 2 (reply)
    assert f[14:22] == bytes.fromhex("0001080006040002")
    assert f[22:28] == bytes.fromhex("0a58c6120042") and f[28:32] == bytes([198, 18, 0, 66])
    assert f[32:38] == b"\xff" * 6 and f[38:42] == bytes([198, 18, 0, 66])
