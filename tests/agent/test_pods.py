# SPDX-License-Identifier: Apache-2.0
"""Job pods on several nodes: addresses, reachability, names, isolation, teardown."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any

from conftest import POD_CIDR, Node, sh, wait_for
from podnet.kernel.spares import SPARE_NETNS
from podnet.names import mac_for_ip


def job_up(
    node: Node, job_id: int, user: str, uid: int, name: str, nodes: list[str]
) -> dict[str, Any]:
    r = node.call(
        "job_up",
        job_id=job_id,
        user=user,
        uid=uid,
        job_name=name,
        nodes=nodes,
        node_index=nodes.index(node.name),
    )
    return dict(r["pod"])


def ping(node: Node, pod: dict[str, Any], dst: str, count: int = 1) -> bool:
    r = node.pod_exec(
        pod["netns"], "ping", "-c", str(count), "-W", "1", "-i", "0.2", dst, check=False
    )
    return r.returncode == 0


def test_two_node_job_same_user_reach_each_other(cluster: dict[str, Node]) -> None:
    n1, n2 = cluster["n1"], cluster["n2"]
    nodes = ["n1", "n2"]
    p1 = job_up(n1, 101, "alice", 2001, "Train Run", nodes)
    p2 = job_up(n2, 101, "alice", 2001, "Train Run", nodes)
    assert p1["ip"] != p2["ip"]
    for p in (p1, p2):
        assert ipaddress.ip_address(p["ip"]) in ipaddress.ip_network(POD_CIDR)
    assert p1["names"] == ["pod0.train-run.alice.t", "pod0.101.alice.t"]
    assert p2["names"] == ["pod1.train-run.alice.t", "pod1.101.alice.t"]
    # idempotent: the same pod again
    assert job_up(n1, 101, "alice", 2001, "Train Run", nodes) == p1
    assert wait_for(lambda: ping(n1, p1, p2["ip"]), 10)
    assert ping(n2, p2, p1["ip"])
    # TCP across nodes
    srv = n2.pod_exec(
        p2["netns"],
        "sh",
        "-c",
        'timeout 10 python3 -c "import socket;s=socket.socket();'
        "s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
        "s.bind(('0.0.0.0',7001));s.listen();c,a=s.accept();"
        'c.sendall(a[0].encode())" >/dev/null 2>&1 & sleep 0.5; echo started',
    )
    assert "started" in srv.stdout
    out = n1.pod_exec(
        p1["netns"],
        "python3",
        "-c",
        f"import socket;s=socket.create_connection(('{p2['ip']}',7001),5);"
        "print(s.recv(100).decode())",
    )
    assert out.stdout.strip() == p1["ip"]


def test_resolv_conf_searches_job_user_admin(cluster: dict[str, Node]) -> None:
    n1 = cluster["n1"]
    pod = n1.call("job_get", job_id=101)["pod"]
    conf = (n1.dir / "resolv" / pod["name"] / "resolv.conf").read_text()
    assert "search train-run.alice.t 101.alice.t alice.t admin.example" in conf
    assert "nameserver 203.0.113.1" in conf


def test_resolv_conf_follows_the_job_record(cluster: dict[str, Node]) -> None:
    """A node whose request names the job otherwise than the record (written from the
    first node's request) gets the record's names and search list: podnetd writes the
    resolv.conf from the request while the record is on its way, and again if they differ."""
    n1, n2 = cluster["n1"], cluster["n2"]
    nodes = ["n1", "n2"]
    job_up(n1, 160, "alice", 2001, "First Name", nodes)
    p2 = job_up(n2, 160, "alice", 2001, "other name", nodes)
    assert p2["names"] == ["pod1.first-name.alice.t", "pod1.160.alice.t"]
    conf = (n2.dir / "resolv" / p2["name"] / "resolv.conf").read_text()
    assert "search first-name.alice.t 160.alice.t alice.t admin.example" in conf
    assert "other-name" not in conf
    for n in (n1, n2):
        assert n.call("job_down", job_id=160)["released"] is True


def test_pod_interface_settings(cluster: dict[str, Node]) -> None:
    n1 = cluster["n1"]
    pod = n1.call("job_get", job_id=101)["pod"]
    link = n1.pod_exec(pod["netns"], "ip", "-o", "link", "show", "eth0").stdout
    assert "mtu 1450" in link
    route = n1.pod_exec(pod["netns"], "ip", "route", "show", "default").stdout
    assert "via 169.254.0.1 dev eth0" in route


def test_job_down_removes_pod_and_records(cluster: dict[str, Node], etcd: Any) -> None:
    n1, n2 = cluster["n1"], cluster["n2"]
    nodes = ["n1", "n2"]
    p1 = job_up(n1, 150, "alice", 2001, "short", nodes)
    job_up(n2, 150, "alice", 2001, "short", nodes)
    assert etcd.client.get("/podnet/t/jobs/150") is not None
    assert n1.call("job_down", job_id=150)["released"] is True
    assert not Path(p1["netns"]).exists()
    assert etcd.client.get("/podnet/t/jobs/150") is not None  # n2 still has its pod
    assert n2.call("job_down", job_id=150)["released"] is True
    assert etcd.client.get("/podnet/t/jobs/150") is None
    assert etcd.client.get(f"/podnet/t/ips/{p1['ip']}") is None
    kvs, _ = etcd.client.get_prefix("/skydns/t/alice/150/")
    assert kvs == []
    # idempotent
    assert n1.call("job_down", job_id=150)["released"] is False
    links = n1.ns("ip", "-o", "link").stdout
    assert p1["ip"] not in sh("ip", "netns", "exec", n1.netns, "ip", "route").stdout
    del links


def test_user_network_lingers_after_last_pod_then_goes(workdir: Path, etcd: Any) -> None:
    """A user's bridge, VXLAN and VTEP outlive their last pod by `user_net_linger`: the
    next job reuses them; then they go (and the VTEP key with them)."""
    node = Node(9, workdir, etcd, settings={"user_net_linger": 3})
    try:
        job_up(node, 9101, "dave", 2004, "l1", ["n9"])
        vni = etcd.client.get_json("/podnet/t/users/dave")["vni"]
        vtep = f"/podnet/t/vteps/{vni}/n9"

        def bridge() -> str:
            r = node.ns("ip", "-o", "link", "show", f"pnbr{vni}", check=False)
            return r.stdout.split(":")[0] if r.returncode == 0 else ""

        first = bridge()
        assert first and etcd.client.get(vtep) is not None
        node.call("job_down", job_id=9101)
        assert bridge() == first  # lingers
        job_up(node, 9102, "dave", 2004, "l2", ["n9"])
        assert bridge() == first  # reused, not rebuilt
        node.call("job_down", job_id=9102)
        wait_for(lambda: bridge() == "", 20)
        assert node.ns("ip", "link", "show", f"pnvx{vni}", check=False).returncode != 0
        assert etcd.client.get(vtep) is None
    finally:
        node.teardown()


def _rx_packets(node: Node, dev: str) -> int:
    return int(node.ns("cat", f"/sys/class/net/{dev}/statistics/rx_packets").stdout)


def test_unicast_to_a_pod_goes_to_its_node_alone(cluster: dict[str, Node], etcd: Any) -> None:
    """A user with pods on n1, n2, n3: n1's VXLAN gets an entry for a remote pod when one
    of its pods first sends to it (its MAC -> its node: node/overlay.py), so pod-to-pod
    traffic n1 -> n2 is not flooded to n3 too, and n3's pod, never met, has no entry."""
    nodes = ["n1", "n2", "n3"]
    p = {n: job_up(cluster[n], 170, "dave", 2004, "three", nodes) for n in nodes}
    vni = etcd.client.get("/podnet/t/users/dave").json()["vni"]
    vx = f"pnvx{vni}"
    n1, n3 = cluster["n1"], cluster["n3"]

    def entries() -> dict[str, str]:
        out = n1.ns("bridge", "fdb", "show", "dev", vx).stdout
        found = {}
        for line in out.splitlines():
            f = line.split()
            if "dst" in f:
                found[f[0]] = f[f.index("dst") + 1]
        return found

    assert entries() == {}
    assert wait_for(lambda: ping(n1, p["n1"], p["n2"]["ip"]), 10)
    assert entries() == {mac_for_ip(p["n2"]["ip"]): cluster["n2"].ip}
    before = _rx_packets(n3, vx)
    r = n1.pod_exec(p["n1"]["netns"], "ping", "-q", "-c", "100", "-i", "0.005", p["n2"]["ip"])
    assert " 0% packet loss" in r.stdout, r.stdout
    assert _rx_packets(n3, vx) - before < 10, "n1 -> n2 traffic reached n3"
    for n in nodes:
        cluster[n].call("job_down", job_id=170)


def test_spare_namespaces_are_empty_and_bounded(cluster: dict[str, Node]) -> None:
    """podnetd keeps a few network namespaces ready for the next pods (kernel/spares.py,
    SPARE_NETNS): only its fds hold them, they have nothing but `lo` and `eth0` (both down),
    the host end of each `eth0` is down, in no bridge, without any address, and there are
    never more than SPARE_NETNS of them, however many pods were made."""
    n1 = cluster["n1"]
    nodes = ["n1"]
    for j in range(170, 170 + SPARE_NETNS + 2):
        job_up(n1, j, "alice", 2001, "spares", nodes)
    pid = n1.proc.pid  # nsenter execs podnetd in place
    own = os.stat(f"/run/netns/{n1.netns}").st_ino
    pods = {os.stat(p["netns"]).st_ino for p in n1.call("pods")["pods"]}

    def spares() -> list[str]:
        out = []
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if not os.readlink(fd).startswith("net:["):
                    continue
                ino = os.stat(fd).st_ino
            except FileNotFoundError:
                continue  # closed meanwhile
            if ino != own and ino not in pods:
                out.append(str(fd))
        return out

    assert wait_for(lambda: len(spares()) == SPARE_NETNS, 10)
    host = {
        int(ln.split(":")[0]): ln
        for ln in n1.ns("ip", "-o", "-d", "link", "show").stdout.splitlines()
    }
    addrs = n1.ns("ip", "-o", "addr", "show").stdout
    for fd in spares():
        links = sh("nsenter", f"--net={fd}", "ip", "-o", "link", "show", check=False).stdout
        names = [ln.split(":")[1].strip().split("@")[0] for ln in links.splitlines()]
        assert names == ["lo", "eth0"], links
        assert all("state DOWN" in ln and ",UP" not in ln for ln in links.splitlines()), links
        peer = int(re.search(r"eth0@if(\d+)", links).group(1))  # type: ignore[union-attr]
        end = host[peer]
        name = end.split(":")[1].strip().split("@")[0]
        assert re.fullmatch(r"pnv[0-9a-f]{12}", name), end
        assert " master " not in end and ",UP" not in end and "state DOWN" in end, end
        assert "addrgenmode none" in end, end
        assert f" {name} " not in addrs, addrs
    for j in range(170, 170 + SPARE_NETNS + 2):
        assert n1.call("job_down", job_id=j)["released"] is True
    assert len(spares()) <= SPARE_NETNS
