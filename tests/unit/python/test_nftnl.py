# SPDX-License-Identifier: Apache-2.0
# ruff: noqa: E501 - the nft rules of the reference are one line each
"""The nf_tables batches podnet encodes by hand (nftnl.py, fastpath.py) are the objects
`nft` makes from the same rules in nft syntax: both are loaded in a throwaway network
namespace and `nft -j list` must show the same thing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[3] / "agent" / "src"

CHILD = textwrap.dedent(
    """
    import json, subprocess, sys
    from podnet.kernel import fastpath, nftnl
    from podnet.kernel.firewall import _port_key

    def sh(*a, input=None):
        r = subprocess.run(a, capture_output=True, text=True, input=input)
        if r.returncode:
            sys.exit(f"{a}: {r.stderr}")
        return r.stdout

    sh("ip", "link", "add", "pnvx5001", "type", "vxlan", "id", "5001", "dstport", "4789",
       "local", "127.0.0.1", "nolearning")
    sh("ip", "link", "add", "pnv0123456789ab", "type", "veth", "peer", "name", "peer0")
    base = fastpath.SKELETON + "table bridge podnet {\\n set ports { type ifname . ether_addr . ipv4_addr; }\\n}\\n"
    port = fastpath.Port("pnv0123456789ab", "0a:58:c6:13:fc:0a", "198.19.252.10", 5001)

    def listing():
        out = json.loads(sh("nft", "-j", "list", "ruleset"))["nftables"]
        for o in out:
            for v in o.values():
                if isinstance(v, dict):
                    v.pop("handle", None)
        return [o for o in out if "metainfo" not in o]

    # by hand
    sh("nft", "-f", "-", input=base)
    sock = nftnl.Socket()
    fp = fastpath.FastPath(sock, True)
    sock.commit([nftnl.add_elements(nftnl.NFPROTO_BRIDGE, "podnet", "ports",
                                    [_port_key(port.veth, port.mac, port.ip)]), *fp.add(port)])
    fp.added(port)
    by_hand = listing()
    # the same in nft syntax
    sh("nft", "flush", "ruleset")
    sh("nft", "-f", "-", input=base + '''
    add element bridge podnet ports { "pnv0123456789ab" . 0a:58:c6:13:fc:0a . 198.19.252.10 }
    add element netdev podnet local_macs { 0a:58:c6:13:fc:0a }
    add element netdev podnet local_pods { "pnvx5001" . 0a:58:c6:13:fc:0a : "pnv0123456789ab" }
    add chain netdev podnet pnv0123456789ab { type filter hook ingress device "pnv0123456789ab" priority -300; policy accept; }
    add rule netdev podnet pnv0123456789ab meta protocol ip ether saddr 0a:58:c6:13:fc:0a ip saddr 198.19.252.10 ether daddr & 01:00:00:00:00:00 == 00:00:00:00:00:00 ether daddr != 02:50:6e:00:00:01 ether daddr != @local_macs fwd to "pnvx5001"
    add chain netdev podnet pnvx5001 { type filter hook ingress device "pnvx5001" priority -300; policy accept; }
    add rule netdev podnet pnvx5001 ether saddr != 02:50:6e:00:00:01 meta protocol ip fwd to iifname . ether daddr map @local_pods
    ''')
    in_nft = listing()
    # removal by hand leaves the empty skeleton; removing twice is no error
    msgs = fp.remove(port.veth)
    sock.commit([*msgs, nftnl.del_elements(nftnl.NFPROTO_BRIDGE, "podnet", "ports",
                                           [_port_key(port.veth, port.mac, port.ip)])])
    sock.commit(msgs)
    after = listing()
    sh("nft", "flush", "ruleset")
    sh("nft", "-f", "-", input=base)
    empty = listing()
    try:
        sock.commit([nftnl.new_rule(nftnl.NFPROTO_NETDEV, "podnet", "nochain", [nftnl.fwd()])])
        refused = None
    except nftnl.NftnlError as e:
        refused = e.code
    print(json.dumps({"by_hand": by_hand, "in_nft": in_nft, "after": after, "empty": empty,
                      "refused": refused}))
    """
)


@pytest.fixture(scope="module")
def result() -> dict[str, object]:
    r = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes a network namespace: root only")


def test_pod_objects_are_what_nft_makes(result: dict[str, object]) -> None:
    assert result["by_hand"] == result["in_nft"]
    chains = [o["chain"]["name"] for o in result["by_hand"] if "chain" in o]  # type: ignore[attr-defined]
    assert sorted(chains) == ["pnv0123456789ab", "pnvx5001"]


def test_removal_leaves_nothing_and_is_idempotent(result: dict[str, object]) -> None:
    assert result["after"] == result["empty"]


def test_a_refused_message_raises(result: dict[str, object]) -> None:
    assert result["refused"] == 2  # ENOENT: no such chain
