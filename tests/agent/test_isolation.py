# SPDX-License-Identifier: Apache-2.0
"""Different users' pods cannot exchange a single packet; pods and hosts reach each other."""

from __future__ import annotations

import itertools
from typing import Any

from conftest import Node, wait_for
from test_pods import job_up, ping


def test_cross_user_matrix(cluster: dict[str, Node]) -> None:
    n1, n2 = cluster["n1"], cluster["n2"]
    nodes = ["n1", "n2"]
    pods: dict[str, list[tuple[Node, dict[str, Any]]]] = {}
    for job_id, (user, uid) in ((201, ("alice", 2001)), (202, ("bob", 2002))):
        pods[user] = [(n, job_up(n, job_id, user, uid, f"iso-{user}", nodes)) for n in (n1, n2)]
    a, b = pods["alice"], pods["bob"]
    # same user, same node and cross node: reachable (sanity of the matrix)
    assert wait_for(lambda: ping(a[0][0], a[0][1], a[1][1]["ip"]), 10)
    assert wait_for(lambda: ping(b[0][0], b[0][1], b[1][1]["ip"]), 10)
    # every alice pod x every bob pod, both directions: not a single reply
    for (na, pa), (nb, pb) in itertools.product(a, b):
        assert not ping(na, pa, pb["ip"], count=2), f"alice {pa['ip']} reached bob {pb['ip']}"
        assert not ping(nb, pb, pa["ip"], count=2), f"bob {pb['ip']} reached alice {pa['ip']}"
    # also with a static ARP entry (no ARP needed): frames cannot cross users' bridges
    na, pa = a[0]
    nb, pb = b[0]
    mac = (
        na.pod_exec(pb["netns"], "ip", "-o", "link", "show", "eth0")
        .stdout.split("link/ether ")[1]
        .split()[0]
    )
    na.pod_exec(
        pa["netns"],
        "ip",
        "neigh",
        "replace",
        pb["ip"],
        "lladdr",
        mac,
        "dev",
        "eth0",
        "nud",
        "permanent",
    )
    assert not ping(na, pa, pb["ip"], count=2)
    # via the gateway (routed): dropped
    na.pod_exec(
        pa["netns"],
        "ip",
        "neigh",
        "replace",
        pb["ip"],
        "lladdr",
        "02:50:6e:00:00:01",
        "dev",
        "eth0",
        "nud",
        "permanent",
    )
    assert not ping(na, pa, pb["ip"], count=2)


def test_spoofed_source_is_dropped(cluster: dict[str, Node]) -> None:
    n1, n2 = cluster["n1"], cluster["n2"]
    pa = n1.call("job_get", job_id=201)["pod"]
    pa2 = n2.call("job_get", job_id=201)["pod"]
    # alice adds a second address and sends from it: dropped at her pod's port
    n1.pod_exec(pa["netns"], "ip", "addr", "add", "198.19.250.250/16", "dev", "eth0")
    r = n1.pod_exec(
        pa["netns"], "ping", "-c", "2", "-W", "1", "-I", "198.19.250.250", pa2["ip"], check=False
    )
    assert r.returncode != 0
    n1.pod_exec(pa["netns"], "ip", "addr", "del", "198.19.250.250/16", "dev", "eth0")
    assert wait_for(lambda: ping(n1, pa, pa2["ip"]), 5)


def test_pod_and_host_on_other_node_both_ways_real_source(cluster: dict[str, Node]) -> None:
    n1, n2 = cluster["n1"], cluster["n2"]
    pod = n1.call("job_get", job_id=201)["pod"]
    script = (
        "import socket,sys;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,"
        "socket.SO_REUSEADDR,1);s.bind(('0.0.0.0',int(sys.argv[1])));s.listen();"
        "c,a=s.accept();c.sendall(a[0].encode())"
    )
    client = (
        "import socket,sys;s=socket.create_connection((sys.argv[1],int(sys.argv[2])),5);"
        "print(s.recv(100).decode())"
    )
    # pod -> host (the node n2 itself, not a pod)
    n2.ns("sh", "-c", f'timeout 10 python3 -c "{script}" 7101 >/dev/null 2>&1 & sleep 0.4')
    out = n1.pod_exec(pod["netns"], "python3", "-c", client, n2.ip, "7101").stdout.strip()
    assert out == pod["ip"]
    # host -> pod
    n1.pod_exec(
        pod["netns"],
        "sh",
        "-c",
        f'timeout 10 python3 -c "{script}" 7102 >/dev/null 2>&1 & sleep 0.4',
    )
    out = n2.ns("python3", "-c", client, pod["ip"], "7102").stdout.strip()
    assert out == n2.ip
