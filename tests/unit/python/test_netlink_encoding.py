# SPDX-License-Identifier: Apache-2.0
"""Netlink messages podnet encodes by hand are byte for byte what pyroute2 encodes."""

from __future__ import annotations

import pytest
from podnet.kernel import nl
from pyroute2.netlink.rtnl.ndmsg import ndmsg


@pytest.mark.parametrize("delete", [False, True])
@pytest.mark.parametrize(("index", "vtep"), [(5, "198.19.208.9"), (70000, "10.255.0.1")])
def test_fdb_flood_matches_pyroute2(index: int, vtep: str, delete: bool) -> None:
    req = nl.fdb_flood(index, vtep, delete)
    m = ndmsg()
    m["family"] = nl.AF_BRIDGE
    m["ifindex"] = index
    m["state"] = nl.NUD_PERMANENT
    m["flags"] = nl.NTF_SELF
    m["attrs"] = [("NDA_LLADDR", "00:00:00:00:00:00"), ("NDA_DST", vtep)]
    m["header"]["type"] = nl.RTM_DELNEIGH if delete else nl.RTM_NEWNEIGH
    m["header"]["flags"] = (
        nl.NLM_F_REQUEST | nl.NLM_F_ACK
        if delete
        else nl.NLM_F_REQUEST | nl.NLM_F_ACK | nl.NLM_F_CREATE | nl.NLM_F_APPEND
    )
    m["header"]["sequence_number"] = req.seq
    m.encode()
    assert bytes(m.data) == req.data
    assert nl.fdb_flood(index, vtep).seq != req.seq  # each request its own sequence number


@pytest.mark.parametrize("delete", [False, True])
@pytest.mark.parametrize(
    ("index", "ip", "vtep"), [(5, "198.18.0.66", "198.19.208.9"), (70000, "10.1.2.3", "10.255.0.1")]
)
def test_fdb_unicast_matches_pyroute2(index: int, ip: str, vtep: str, delete: bool) -> None:
    mac = nl.mac_for_ip(ip)
    req = nl.fdb_unicast(index, mac, vtep, delete)
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
