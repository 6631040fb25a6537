# SPDX-License-Identifier: Apache-2.0
"""Flannel for HPK-style containers (roles/flannel, docs/hpk.md), next to podnet.

* flanneld runs on compute and login nodes with one subnet lease each, in etcd under its
  own prefix; in a 2-node job (alice's, of conftest's `jobs`), Apptainer's
  `--net --network flannel` on each of the job's nodes gives a container an address of the
  node's lease and the two containers reach each other (VXLAN, port 8472); traffic to
  hosts is masqueraded (flanneld -ip-masq).
* Non-root: Debian's Apptainer has no setuid starter: `--net --network flannel` is refused
  and `--fakeroot --net` falls back to no network (what docs/hpk.md tells users). So the
  Flannel wiring is checked as root, on the job's nodes while the job holds them (a step
  would join the job's pod network namespace, where CNI's bridge does not belong), and
  without `--fakeroot`: root's fakeroot needs a subuid range of root's, and an unprivileged
  installation gives fakeroot runs no CNI network at all ("fallback to 'none' network").
* podnet stays intact: a Flannel container reaches no job pod and no pod reaches it; a
  user's host-side process cannot send to Flannel's VXLAN port (the forged frames never
  reach the container on the other node).
"""

from __future__ import annotations

import base64
import ipaddress
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import CLUSTER, etcdctl, in_pod, pod_of, ssh, wait_for
from test_apptainer import install_mkroot
from test_attack_host import FORGE

FLANNEL_NET = "203.0.113.0/25"  # inventories/lab/group_vars/all/lab.yml
FLANNEL_PORT = 8472
SIF = "/tmp/podnet-e2e-flannel.sif"
NODES = ("c1", "c2")

#: UDP listener (run in a container's netns): argv log port; logs "udp <src ip> <payload>"
LISTENER = r"""
import socket, sys, time
log = open(sys.argv[1], "a", buffering=1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[2])))
s.settimeout(1)
log.write("ready\n")
end = time.monotonic() + 90
while time.monotonic() < end:
    try:
        d, a = s.recvfrom(2048)
    except socket.timeout:
        continue
    log.write(f"udp {a[0]} {d.decode(errors='replace')}\n")
"""


def _flannel_on(node: str) -> bool:
    return ssh(node, "systemctl is-active flanneld", check=False).stdout.strip() == "active"


pytestmark = pytest.mark.skipif(
    not all(_flannel_on(n) for n in NODES), reason="no flanneld in this lab (roles/flannel)"
)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _put(node: str, path: str, text: str) -> None:
    ssh(node, f"echo {_b64(text)} | base64 -d >{path} && chmod 0644 {path}")


def _read(node: str, path: str) -> str:
    return str(ssh(node, f"cat {path} 2>/dev/null", check=False).stdout.strip())


class Container:
    """`apptainer exec --net --network flannel SIF sleep` as root in the background."""

    def __init__(self, node: str, tag: str) -> None:
        self.node, self.tag = node, tag
        pidfile = f"/tmp/podnet-e2e-{tag}.pid"
        ssh(
            node,
            f"rm -f {pidfile}; setsid apptainer -q exec --net --network flannel {SIF} "
            f"sh -c 'echo $$ >{pidfile}; exec sleep 280' "
            f"</dev/null >/tmp/podnet-e2e-{tag}.log 2>&1 &",
        )
        self.pid = int(wait_for(lambda: _read(node, pidfile), 60))
        out = self.run("ip -4 -o addr show eth0").stdout
        self.ip = out.split()[3].split("/")[0]

    def run(self, cmd: str, check: bool = True) -> Any:
        """A host command in the container's network namespace (root)."""
        return ssh(self.node, f"nsenter -t {self.pid} -n {cmd}", check=check)

    def stop(self) -> None:
        ssh(self.node, f"kill {self.pid}", check=False)


def job_nodes(job: int) -> list[str]:
    """The nodes a running job holds (empty once it does not run)."""
    state = ssh("login", f"squeue -h -j {job} -o '%T %N'", check=False).stdout.split()
    if len(state) != 2 or state[0] != "RUNNING":
        return []
    return ssh("login", f"scontrol show hostnames {state[1]}").stdout.split()


@pytest.fixture(scope="module")
def containers(jobs: dict[str, int]) -> Iterator[dict[str, Container]]:
    """One container on each node of alice's 2-node job, started while the job runs."""
    assert sorted(job_nodes(jobs["alice"])) == sorted(NODES), job_nodes(jobs["alice"])
    for node in NODES:
        mkroot = install_mkroot(node)
        ssh(
            node,
            f"{mkroot} /tmp/podnet-e2e-flannel-root && "
            f"apptainer -q build -F {SIF} /tmp/podnet-e2e-flannel-root >/dev/null",
            timeout=180,
        )
    made: dict[str, Container] = {}
    try:
        for node in NODES:
            made[node] = Container(node, f"flannel-{node}")
        yield made
    finally:
        for c in made.values():
            c.stop()


def test_each_node_has_its_own_lease_under_flannels_prefix() -> None:
    keys = etcdctl(f"get --prefix --keys-only /flannel/{CLUSTER}/network/subnets/").split()
    leases = {}
    for node in ("login", *NODES):
        env = ssh(node, "cat /run/flannel/subnet.env").stdout
        sub = dict(ln.split("=", 1) for ln in env.split())["FLANNEL_SUBNET"]
        leases[node] = sub
    assert len(set(leases.values())) == len(leases), leases
    for node, sub in leases.items():
        net = sub.rsplit(".", 1)[0]
        assert sub.startswith("203.0.113."), (node, sub)
        assert any(net in k for k in keys), (node, sub, keys)
    # podnet's own state is elsewhere; Flannel's network config is under its prefix
    conf = json.loads(etcdctl(f"get --print-value-only /flannel/{CLUSTER}/network/config"))
    assert conf["Network"] == FLANNEL_NET
    assert conf["Backend"] == {"Type": "vxlan", "VNI": 1, "Port": FLANNEL_PORT}
    # each node's flanneld has its own etcd user, read-write on Flannel's prefix only
    assert "podnet-flannel" in etcdctl("user get flannel-c1")
    role = etcdctl("role get podnet-flannel")
    assert f"(prefix /flannel/{CLUSTER}/network/)" in role.split("KV Write:")[1], role
    assert "/podnet/" not in role and "/skydns" not in role, role
    link = ssh("c1", "ip -d link show flannel.1").stdout
    assert f"dstport {FLANNEL_PORT}" in link, link


def test_containers_on_two_nodes_reach_each_other(
    containers: dict[str, Container], jobs: dict[str, int]
) -> None:
    c1, c2 = containers["c1"], containers["c2"]
    assert c1.ip != c2.ip
    for c in (c1, c2):
        # an address of the node's own lease (flannel.1 is the .0 of the lease)
        lease = ssh(c.node, "cat /run/flannel/subnet.env").stdout
        sub = dict(ln.split("=", 1) for ln in lease.split())["FLANNEL_SUBNET"]
        assert ipaddress.ip_address(c.ip) in ipaddress.ip_network(sub, strict=False), (c, sub)
    for a, b in ((c1, c2), (c2, c1)):
        # retried: a busy machine may take a while to learn the peer's VTEP
        wait_for(
            lambda a=a, b=b: a.run(f"ping -c 1 -W 2 {b.ip}", check=False).returncode == 0, 30, 1
        )
    # the job still holds both nodes: the containers met inside its allocation
    assert sorted(job_nodes(jobs["alice"])) == sorted(NODES)


def test_hpk_parent_container_pattern(containers: dict[str, Container]) -> None:
    """HPK's control plane: a parent container on the network, a child joining its network
    namespace (root: `--netns-path`), both on one address and one localhost."""
    parent = containers["c1"]
    want = ssh("c1", f"readlink /proc/{parent.pid}/ns/net").stdout.strip()
    child = ssh(
        "c1",
        f"apptainer -q exec --netns-path /proc/{parent.pid}/ns/net {SIF} "
        "sh -c 'readlink /proc/self/ns/net; cat /proc/net/fib_trie'",
    ).stdout
    assert child.splitlines()[0] == want, child
    assert parent.ip in child, child


def test_egress_to_a_host_is_masqueraded(containers: dict[str, Container]) -> None:
    ctl = ssh("ctl", "ip -4 -o addr show host0").stdout.split()[3].split("/")[0]
    c1_ip = ssh("c1", "ip -4 -o addr show host0").stdout.split()[3].split("/")[0]
    srv = (
        "import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, "
        "socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', 47211)); s.listen(1); s.settimeout(60); "
        "c, a = s.accept(); print(a[0], flush=True)"
    )
    ssh(
        "ctl",
        f'rm -f /tmp/podnet-e2e-masq; setsid timeout 70 python3 -c "{srv}" '
        "</dev/null >/tmp/podnet-e2e-masq 2>&1 &",
    )
    time.sleep(1)
    cli = f"import socket; socket.create_connection(('{ctl}', 47211), 5).close()"
    wait_for(
        lambda: containers["c1"].run(f'python3 -c "{cli}"', check=False).returncode == 0, 30, 1
    )
    peer = wait_for(lambda: _read("ctl", "/tmp/podnet-e2e-masq"), 30)
    assert peer == c1_ip, f"ctl saw {peer}, expected c1's address {c1_ip} (ip-masq)"


def test_flannel_and_podnet_pods_do_not_reach_each_other(
    containers: dict[str, Container], jobs: dict[str, int]
) -> None:
    a1, a2 = pod_of("c1", jobs["alice"]), pod_of("c2", jobs["alice"])
    bad = []
    for c in containers.values():
        for pod in (a1, a2):
            if c.run(f"ping -c 1 -W 2 {pod['ip']}", check=False).returncode == 0:
                bad.append(f"flannel container on {c.node} reached alice's pod {pod['ip']}")
    for node, pod in (("c1", a1), ("c2", a2)):
        for c in containers.values():
            p = in_pod(node, pod["netns"], f"ping -c 1 -W 2 {c.ip}", check=False)
            if p.returncode == 0:
                bad.append(f"alice's pod on {node} reached the flannel container {c.ip}")
    assert bad == []


def test_user_host_process_cannot_send_to_flannels_vxlan_port(
    containers: dict[str, Container],
) -> None:
    """alice, in an opt-out step on c2 (host network), forges VXLAN (VNI 1) to c1:8472 for
    the Flannel container on c1: podnetd's output rule refuses her socket (EPERM) and
    nothing arrives, nor when sent into Flannel's tunnel (VXLAN in VXLAN); her ordinary
    datagram to the container arrives (hosts reach Flannel containers, as HPK needs), and
    so does the container on c2's (control)."""
    c1, c2 = containers["c1"], containers["c2"]
    log = "/tmp/podnet-e2e-flannel-listen.log"
    ssh("c1", f"rm -f {log}")
    _put("c1", "/tmp/podnet-e2e-flannel-listen.py", LISTENER)
    c1.run(
        f"setsid timeout 100 python3 /tmp/podnet-e2e-flannel-listen.py {log} 47212 "
        "</dev/null >/dev/null 2>&1 &"
    )
    wait_for(lambda: "ready" in ssh("c1", f"cat {log}").stdout, 30)
    c1_ip = ssh("c1", "ip -4 -o addr show host0").stdout.split()[3].split("/")[0]
    vtep_mac = ssh("c1", "cat /sys/class/net/flannel.1/address").stdout.strip()
    c2_mac = ssh("c2", "cat /sys/class/net/flannel.1/address").stdout.strip()
    forge = {
        "dst": c1_ip,
        "port": FLANNEL_PORT,
        "vni": 1,
        "ip": c1.ip,
        "mac": vtep_mac,
        "src_ip": c2.ip,  # as if from the container on c2
        "src_mac": c2_mac,
        "sport": 40000,
        "dport": 47212,
        "n": 10,
    }
    _put("c2", "/tmp/podnet-e2e-forge.py", FORGE)
    c1_tunnel = ssh("c1", "ip -4 -o addr show flannel.1").stdout.split()[3].split("/")[0]
    # the same frames sent into Flannel's tunnel, to c1's flannel.1 address (VXLAN in VXLAN)
    nested = {**forge, "dst": c1_tunnel, "sport": 42000}
    hello = f"import socket\nsocket.socket(2, 2).sendto(b'host-alice', ('{c1.ip}', 47212))\n"
    _put("c2", "/tmp/podnet-e2e-hello.py", hello)
    out = ssh(
        "alice@login",
        "cd /tmp && srun --podnet=no -N1 -w c2 -t 2 sh -c "
        f"'python3 /tmp/podnet-e2e-forge.py {_b64(json.dumps(forge))}; "
        f"python3 /tmp/podnet-e2e-forge.py {_b64(json.dumps(nested))}; "
        "python3 /tmp/podnet-e2e-hello.py'",
        timeout=120,
    ).stdout
    sent = [json.loads(ln) for ln in out.strip().splitlines() if ln.startswith("{")]
    # control: the real path (c2's container -> kernel VXLAN -> c1's container) delivers
    c2.run(
        f'python3 -c "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)'
        f".sendto(b'control', ('{c1.ip}', 47212))\""
    )
    got = wait_for(
        lambda: [ln for ln in ssh("c1", f"cat {log}").stdout.splitlines() if "control" in ln],
        20,
    )
    time.sleep(1)
    lines = ssh("c1", f"cat {log}").stdout.splitlines()
    forged = [ln for ln in lines if "forged" in ln]
    assert got, lines
    assert forged == [], f"forged VXLAN from alice's host process arrived: {forged} ({sent})"
    assert [(x["sent"], len(x["errors"])) for x in sent] == [(0, 10), (0, 10)], sent
    # HPK's host side (hpk-kubelet) reaches containers: alice's host process did
    assert any("host-alice" in ln for ln in lines), lines
    ssh("c1", "pkill -f podnet-e2e-flannel-listen.py", check=False)


def test_users_get_no_flannel_network_without_a_setuid_starter(
    containers: dict[str, Container],
) -> None:
    """What docs/hpk.md says users meet with Debian's Apptainer (no starter-suid)."""
    del containers  # the image
    # HPK's apptainer.conf (inventories/lab): the users and networks are allowed, in vain
    conf = ssh("c1", "grep '^allow net' /etc/apptainer/apptainer.conf").stdout
    assert "allow net users = alice, bob, carol" in conf, conf
    assert "allow net networks = flannel, fakeroot" in conf, conf
    starters = ssh("c1", "dpkg -L apptainer | grep '/bin/starter'").stdout.split()
    assert starters == ["/usr/lib/x86_64-linux-gnu/apptainer/bin/starter"], starters
    # as alice runs it: a step on c1, from her login session
    net = ssh(
        "alice@login",
        f"cd /tmp && srun -N1 -w c1 -t 2 apptainer exec --net --network flannel {SIF} true",
        check=False,
    )
    assert net.returncode != 0
    assert "network requires root or a suid installation" in net.stderr, net.stderr
    fr = ssh(
        "alice@login",
        f"cd /tmp && srun -N1 -w c1 -t 2 apptainer exec --fakeroot --net {SIF} cat /proc/net/dev",
        check=False,
    )
    assert fr.returncode == 0, fr.stderr
    assert "fallback to 'none' network" in fr.stderr, fr.stderr
    assert "eth0" not in fr.stdout, fr.stdout
