# SPDX-License-Identifier: Apache-2.0
"""The users' overlay, resolved on demand (node/overlay.py): a node learns where another
node's pod is when one of its pods first sends to it, from the block map, and nothing
else. Real podnetd, real VXLANs, real misses."""

from __future__ import annotations

import json
import time
from typing import Any

from conftest import Node, sh, wait_for
from test_pods import job_up, ping


def _fdb(node: Node, vni: int) -> tuple[list[str], dict[str, str]]:
    """(flood destinations, MAC -> destination) of the user's VXLAN on `node`."""
    out = sh(
        "ip", "netns", "exec", node.netns, "bridge", "-j", "fdb", "show", "dev", f"pnvx{vni}"
    ).stdout
    flood: list[str] = []
    unicast: dict[str, str] = {}
    for e in json.loads(out or "[]"):
        if "dst" not in e:
            continue
        if e["mac"] == "00:00:00:00:00:00":
            flood.append(e["dst"])
        else:
            unicast[e["mac"]] = e["dst"]
    return flood, unicast


def _vni(etcd: Any, user: str) -> int:
    return int(etcd.client.get(f"/podnet/t/users/{user}").json()["vni"])


def _mac(ip: str) -> str:
    return "0a:58:" + ":".join(f"{int(x):02x}" for x in ip.split("."))


def _first_ping_ms(node: Node, pod: dict[str, Any], dst: str) -> float | None:
    t0 = time.monotonic()
    ok = node.pod_exec(pod["netns"], "ping", "-c", "1", "-W", "3", dst, check=False)
    return (time.monotonic() - t0) * 1000 if ok.returncode == 0 else None


def test_a_pod_of_another_node_is_resolved_when_first_met(
    cluster: dict[str, Node], etcd: Any
) -> None:
    n1, n2 = cluster["n1"], cluster["n2"]
    nodes = ["n1", "n2"]
    p1 = job_up(n1, 611, "olive", 2061, "overlay", nodes)
    p2 = job_up(n2, 611, "olive", 2061, "overlay", nodes)
    vni = _vni(etcd, "olive")
    # nothing is programmed ahead: no flooding, no entry of n2's pod
    assert _fdb(n1, vni) == ([], {}), "n1's VXLAN knew of n2's pod before meeting it"
    # the pod asks again every 20 ms (the kernel's default: every second)
    retrans = n1.pod_exec(p1["netns"], "cat", "/proc/sys/net/ipv4/neigh/eth0/retrans_time_ms")
    assert retrans.stdout.strip() == "20"
    # n1 resolves n2's pod, n2 resolves n1's for the reply (the first ping is answered
    # unless a busy node answers a miss later than the pod's last ARP request: 1 s)
    ms = _first_ping_ms(n1, p1, p2["ip"])
    print(f"first ping to a pod of another node: {ms if ms is None else round(ms)} ms")
    assert wait_for(lambda: ping(n1, p1, p2["ip"]), 10)
    flood, unicast = _fdb(n1, vni)
    assert flood == [] and unicast == {_mac(p2["ip"]): n2.ip}
    flood, unicast = _fdb(n2, vni)
    assert flood == [] and unicast == {_mac(p1["ip"]): n1.ip}
    # a third pod of olive's on n2: met, resolved, reachable at once
    p3 = job_up(n2, 612, "olive", 2061, "overlay2", ["n2"])
    assert ping(n1, p1, p3["ip"], count=1)
    assert set(_fdb(n1, vni)[1]) == {_mac(p2["ip"]), _mac(p3["ip"])}
    # a frame to a MAC the VXLAN has no entry of (a pod with a static ARP entry: an L2
    # miss) is resolved too
    n1.pod_exec(p1["netns"], "ip", "neigh", "flush", "all")
    sh("ip", "netns", "exec", n1.netns, "bridge", "fdb", "del", _mac(p2["ip"]), "dev", f"pnvx{vni}")
    n1.pod_exec(
        p1["netns"],
        *("ip", "neigh", "replace", p2["ip"], "lladdr", _mac(p2["ip"]), "dev", "eth0"),
        *("nud", "permanent"),
    )
    assert wait_for(lambda: ping(n1, p1, p2["ip"]), 10)
    assert _fdb(n1, vni)[1][_mac(p2["ip"])] == n2.ip
    for n, job in ((n1, 611), (n2, 611), (n2, 612)):
        n.call("job_down", job_id=job)


def test_an_address_no_block_holds_or_of_this_node_gets_no_entry(
    cluster: dict[str, Node], etcd: Any
) -> None:
    n1 = cluster["n1"]
    p1 = job_up(n1, 621, "erin", 2005, "overlay-none", ["n1"])
    vni = _vni(etcd, "erin")
    # an address of the pod network in no block, and one of n1's own block (no pod there)
    own = p1["ip"].rsplit(".", 1)[0] + "." + str(int(p1["ip"].rsplit(".", 1)[1]) + 1)
    for dst in ("198.19.250.250", own):
        assert not ping(n1, p1, dst, count=2)
    assert _fdb(n1, vni) == ([], {})
    n1.call("job_down", job_id=621)
