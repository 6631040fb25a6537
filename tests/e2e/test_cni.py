# SPDX-License-Identifier: Apache-2.0
"""The podnet CNI plugin and podnet-container (issue 10, parts 3-4; docs/hpk.md).

Containers here are network namespaces of a user namespace the user made (`unshare -rn`,
what `apptainer exec --fakeroot --net` makes), wired by the plugin `podnet` the apptainer
role installs, driven through the CNI protocol itself (environment + stdin, spec 1.0)
and, last, by the CNI project's `cnitool` (libcni) as alice in a job step. alice's
containers on c1 and c2 reach each other and her job pods by name (ICMP, TCP, UDP);
bob's container and pods reach none of them; DEL and the container's exit (kill -9
included) release the address and the name; CHECK reports a deleted interface; identity
is the kernel's (bob cannot wire alice's namespace, nor the host's). Then
`podnet-container` (setuid) in a job step runs an unprivileged fakeroot Apptainer
container with its own address, HPK's parent/child pattern on it.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import CLUSTER, LAB, POD_CIDR, REPO, etcdctl, pod_of, pods, ssh, wait_for
from test_apptainer import install_mkroot

PLUGIN = "/usr/lib/cni/podnet"
CONF = json.dumps({"cniVersion": "1.0.0", "name": "podnet", "type": "podnet"})


def userns(node: str, user: str) -> int:
    """A process of `user` in a network namespace of a user namespace the user made.

    On the node's host network on purpose (runuser from root, not an SSH session): the
    identity tests need host PIDs (`/proc/<pid>/ns/net` as podnetd and root see it), and a
    host-side process of the user (an opt-out step, cron) is the strongest position to
    name another user's namespaces from (a pod's PID namespace hides them)."""
    tag = f"/tmp/pncni-{user}-{time.monotonic_ns()}.pid"
    ssh(
        node,
        f"runuser -u {user} -- setsid unshare -rn sh -c 'echo $$ >{tag}; exec sleep 900' "
        "</dev/null >/dev/null 2>&1 &",
    )

    def written() -> str:
        return ssh(node, f"cat {tag}", check=False).stdout.strip()

    pid = wait_for(written, 30)
    ssh(node, f"rm -f {tag}")
    return int(pid)


def cni(
    node: str,
    command: str,
    cid: str,
    netns: str = "",
    user: str | None = None,
    args: str = "",
    conf: dict[str, Any] | None = None,
) -> tuple[int, Any]:
    """One plugin run as `user` (None: root): (exit status, the JSON it printed). As a
    host-side process of the user on purpose (`runuser`, see `userns`)."""
    data = json.dumps({**json.loads(CONF), **(conf or {})})
    env = (
        f"CNI_COMMAND={command} CNI_CONTAINERID={cid} CNI_NETNS={netns} CNI_IFNAME=eth0 "
        f"CNI_PATH=/usr/lib/cni CNI_ARGS='{args}'"
    )
    run = f"runuser -u {user} -- " if user else ""
    b64 = base64.b64encode(data.encode()).decode()
    r = ssh(node, f"echo {b64} | base64 -d | {run}env {env} {PLUGIN}; echo rc=$?", check=False)
    out, _, rc = r.stdout.rpartition("rc=")
    text = out.strip()
    return int(rc.strip() or 1), json.loads(text) if text else None


def in_ns(node: str, pid: int, cmd: str, check: bool = False) -> str:
    """`cmd` as root in the network namespace of process `pid`; stdout + status."""
    r = ssh(node, f"nsenter -t {pid} -n {cmd}; echo rc=$?", check=check)
    return r.stdout


def reaches(node: str, pid: int, ip: str) -> bool:
    return "rc=0" in in_ns(node, pid, f"ping -c1 -W2 {ip} >/dev/null 2>&1")


def tcp_open(node: str, pid: int, ip: str, port: int) -> bool:
    probe = f"timeout 4 bash -c 'echo x >/dev/tcp/{ip}/{port}' 2>/dev/null"
    return "rc=0" in in_ns(node, pid, probe)


def udp_echo(node: str, pid: int, ip: str, port: int) -> bool:
    probe = (
        "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2); "
        f"s.sendto(b'ping', ('{ip}', {port})); print(s.recvfrom(64)[0].decode())"
    )
    return "ping" in in_ns(node, pid, f'python3 -c "{probe}" 2>/dev/null')


def resolve(node: str, pid: int, name: str, dns: str) -> str:
    out = in_ns(node, pid, f"dig +short +time=2 +tries=2 @{dns} {name}")
    return out.replace("rc=0", "").strip()


@pytest.fixture(scope="module")
def world(jobs: dict[str, int]) -> Iterator[dict[str, Any]]:
    """alice: containers a1 (c1, she runs the plugin) and a2 (c2, root runs it for her
    namespace); bob: b1 (c1). Their processes are killed at the end."""
    w: dict[str, Any] = {"jobs": jobs, "procs": []}
    try:
        for key, node, user, runner in (
            ("a1", "c1", "alice", "alice"),
            ("a2", "c2", "alice", None),
            ("b1", "c1", "bob", "bob"),
        ):
            pid = userns(node, user)
            w["procs"].append((node, pid))
            rc, res = cni(
                node, "ADD", f"e2e-{key}", f"/proc/{pid}/ns/net", runner, f"PODNET_NAME={key}"
            )
            assert rc == 0, (key, res)
            w[key] = {"node": node, "pid": pid, "res": res, "ip": res["ips"][0]["address"]}
            w[key]["ip"] = w[key]["ip"].split("/")[0]
        yield w
    finally:
        for node, pid in w["procs"]:
            ssh(node, f"kill -9 {pid}", check=False)


def test_version_and_the_installed_network() -> None:
    rc, res = cni("c1", "VERSION", "x")
    assert rc == 0 and "1.0.0" in res["supportedVersions"], res
    conf = json.loads(ssh("c1", "cat /etc/apptainer/network/60_podnet.conflist").stdout)
    assert conf["name"] == "podnet" and conf["plugins"][0]["type"] == "podnet"
    assert ssh("c1", f"readlink {PLUGIN}").stdout.strip().endswith("/podnet-cni")


def test_alices_containers_reach_each_other_and_her_pods_by_name_bobs_nothing(
    world: dict[str, Any],
) -> None:
    a1, a2, b1 = world["a1"], world["a2"], world["b1"]
    res = a1["res"]
    assert res["cniVersion"] == "1.0.0" and res["interfaces"][0]["name"] == "eth0"
    assert res["dns"]["domain"] == f"alice.{CLUSTER}"
    dns = res["dns"]["nameservers"][0]
    # names: <container>.<user>.<cluster>, and the job pods' names
    assert resolve("c1", a1["pid"], f"a2.alice.{CLUSTER}", dns) == a2["ip"]
    assert resolve("c2", a2["pid"], f"a1.alice.{CLUSTER}", dns) == a1["ip"]
    job = world["jobs"]["alice"]
    pod1 = resolve("c1", a1["pid"], f"pod1.{job}.alice.{CLUSTER}", dns)
    assert pod1 == pod_of("c2", job)["ip"]
    # alice: container <-> container across nodes, container -> her pods on both nodes
    assert reaches("c1", a1["pid"], a2["ip"])
    assert reaches("c2", a2["pid"], a1["ip"])
    assert reaches("c1", a1["pid"], pod1)
    assert reaches("c1", a1["pid"], pod_of("c1", job)["ip"])
    # TCP: a listener in a2; alice's container connects, bob's does not
    ssh(
        "c2",
        f"nsenter -t {a2['pid']} -n setsid timeout 120 python3 -m http.server 8088 "
        f"--bind {a2['ip']} </dev/null >/dev/null 2>&1 &",
    )
    assert wait_for(lambda: tcp_open("c1", a1["pid"], a2["ip"], 8088), 30)
    assert not tcp_open("c1", b1["pid"], a2["ip"], 8088)
    # UDP: an echo in a2; alice's container gets the answer, bob's does not
    echo = (
        "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
        f"s.bind(('{a2['ip']}', 8089)); "
        "[s.sendto(d, a) for d, a in iter(lambda: s.recvfrom(512), None)]"
    )
    ssh(
        "c2",
        f'nsenter -t {a2["pid"]} -n setsid timeout 120 python3 -c "{echo}" '
        "</dev/null >/dev/null 2>&1 &",
    )
    assert wait_for(lambda: udp_echo("c1", a1["pid"], a2["ip"], 8089), 30)
    assert not udp_echo("c1", b1["pid"], a2["ip"], 8089)
    # bob's container: none of alice's, same node or across, ICMP or TCP
    bob_job = world["jobs"]["bob"]
    for ip in (a1["ip"], a2["ip"], pod1, pod_of("c1", job)["ip"]):
        assert not reaches("c1", b1["pid"], ip), ip
    # bob's job pods reach none of alice's containers
    for node, ip in (("c1", a1["ip"]), ("c2", a1["ip"]), ("c2", a2["ip"])):
        bp = pod_of(node, bob_job)["netns"].rsplit("/", 1)[-1]
        r = ssh(node, f"ip netns exec {bp} ping -c1 -W2 {ip}", check=False)
        assert r.returncode != 0, (node, ip)
    # and bob's container reaches bob's own pod (it is on his network)
    assert reaches("c1", b1["pid"], pod_of("c2", bob_job)["ip"])


def test_identity_comes_from_the_kernel(world: dict[str, Any]) -> None:
    a1 = world["a1"]
    # bob cannot wire alice's container namespace ...
    rc, err = cni("c1", "ADD", "e2e-steal", f"/proc/{a1['pid']}/ns/net", "bob")
    assert rc == 1 and "EPERM" in err["msg"], err
    # ... nor the host's (his own shell's namespace), nor a job pod's
    rc, err = cni("c1", "ADD", "e2e-host", "/proc/1/ns/net", "bob")
    assert rc == 1 and "host's network namespace" in err["msg"], err
    bob_pod = pod_of("c1", world["jobs"]["bob"])["netns"]
    rc, err = cni("c1", "ADD", "e2e-pod", bob_pod, "bob")
    assert rc == 1 and "EPERM" in err["msg"], err
    # CNI_ARGS cannot make bob's namespace alice's
    pid = userns("c1", "bob")
    try:
        rc, res = cni("c1", "ADD", "e2e-claim", f"/proc/{pid}/ns/net", "bob", "PODNET_UID=2001")
        assert rc == 0, res
        mine = json.loads(ssh("c1", "podnet --json pods").stdout)
        claim = next(p for p in mine if p.get("container_id") == "e2e-claim")
        assert claim["user"] == "bob", claim
        assert cni("c1", "DEL", "e2e-claim", "", "bob")[0] == 0
    finally:
        ssh("c1", f"kill -9 {pid}", check=False)
    # carol has no job on c1: compute nodes want one; the login node allows it (lab)
    for node, ok in (("c1", False), ("login", True)):
        pid = userns(node, "carol")
        try:
            rc, res = cni(node, "ADD", "e2e-carol", f"/proc/{pid}/ns/net", "carol")
            assert (rc == 0) == ok, (node, res)
            if ok:
                cni(node, "DEL", "e2e-carol", "", "carol")
        finally:
            ssh(node, f"kill -9 {pid}", check=False)


def _records(ip: str, name: str) -> str:
    return etcdctl(f"get /podnet/{CLUSTER}/ips/{ip}") + etcdctl(
        f"get --prefix /skydns/{CLUSTER}/{name}/"
    )


def test_check_reports_drift_and_del_releases(world: dict[str, Any]) -> None:
    b1 = world["b1"]
    prev = {"prevResult": b1["res"]}
    rc, err = cni("c1", "CHECK", "e2e-b1", f"/proc/{b1['pid']}/ns/net", "bob", conf=prev)
    assert rc == 0, err
    # a manual `ip link del` of the container's interface
    in_ns("c1", b1["pid"], "ip link del eth0", check=True)
    rc, err = cni("c1", "CHECK", "e2e-b1", f"/proc/{b1['pid']}/ns/net", "bob", conf=prev)
    assert rc == 1 and err["code"] == 101 and "missing" in err["details"], err
    assert _records(b1["ip"], "bob/b1")
    rc, _ = cni("c1", "DEL", "e2e-b1", f"/proc/{b1['pid']}/ns/net", "bob")
    assert rc == 0
    assert not _records(b1["ip"], "bob/b1")
    assert not any(
        p.get("container_id") == "e2e-b1"
        for p in json.loads(ssh("c1", "podnet --json pods").stdout)
    )
    # DEL again: nothing left, still success
    assert cni("c1", "DEL", "e2e-b1", "", "bob")[0] == 0


def test_a_podnetd_restart_adopts_containers(world: dict[str, Any]) -> None:
    a1, a2 = world["a1"], world["a2"]
    ssh("c1", "systemctl restart podnetd")

    def listed() -> bool:
        r = ssh("c1", "podnet --json pods", check=False)
        return r.returncode == 0 and any(
            p.get("container_id") == "e2e-a1" for p in json.loads(r.stdout)
        )

    wait_for(listed, 60)
    assert reaches("c1", a1["pid"], a2["ip"])
    rc, err = cni(
        "c1",
        "CHECK",
        "e2e-a1",
        f"/proc/{a1['pid']}/ns/net",
        "alice",
        conf={"prevResult": a1["res"]},
    )
    assert rc == 0, err


def test_exit_and_kill9_release_address_and_name(world: dict[str, Any]) -> None:
    a2 = world["a2"]
    assert _records(a2["ip"], "alice/a2")
    ssh("c2", f"kill -9 {a2['pid']}")
    wait_for(lambda: not _records(a2["ip"], "alice/a2"), 60)
    assert not any(
        p.get("container_id") == "e2e-a2"
        for p in json.loads(ssh("c2", "podnet --json pods").stdout)
    )
    assert not ssh("c2", "ls /run/netns | grep '^pn-c' || true").stdout.strip()


def test_podnet_container_in_a_job_runs_fakeroot_apptainer_with_its_own_address(
    world: dict[str, Any],
) -> None:
    job = world["jobs"]["alice"]
    a1 = world["a1"]
    mkroot = install_mkroot("c1")
    step = f"srun --jobid={job} -w c1 -N1 -n1 --overlap -t 3"
    built = ssh(
        "alice@login",
        f"cd /tmp && {step} sh -c '{mkroot} /tmp/pncni-root /bin/ping /usr/bin/timeout && "
        "apptainer -q build -F /tmp/pncni.sif /tmp/pncni-root >/dev/null && echo built'",
        timeout=180,
    ).stdout
    assert "built" in built, built
    # HPK's pattern: the parent container gets its own address and name; a child
    # container started beside it shares its network namespace (localhost between them)
    run = (
        "#!/bin/sh\n"
        "apptainer -q exec --fakeroot /tmp/pncni.sif sh -c 'cat /proc/net/fib_trie; "
        f"ping -c1 -W3 {a1['ip']} >/dev/null && echo reached-a1; "
        f"ping -c1 -W3 pod1.{job}.alice.{CLUSTER} >/dev/null && echo reached-pod1; "
        "echo parent-ns=$(readlink /proc/self/ns/net)'\n"
        "apptainer -q exec --fakeroot /tmp/pncni.sif sh -c "
        "'echo child-ns=$(readlink /proc/self/ns/net)'\n"
    )
    b64 = base64.b64encode(run.encode()).decode()
    ssh("c1", f"echo {b64} | base64 -d >/tmp/pncni-run.sh && chmod 0755 /tmp/pncni-run.sh")
    out = ssh(
        "alice@login",
        f"cd /tmp && {step} podnet-container --name parent -- /tmp/pncni-run.sh",
        timeout=180,
    ).stdout
    assert "reached-a1" in out and "reached-pod1" in out, out
    parent_ns = re.findall(r"parent-ns=(\S+)", out)
    assert parent_ns and parent_ns == re.findall(r"child-ns=(\S+)", out), out
    ips = re.findall(r"\|-- (198\.1[89]\.\d+\.\d+)\n\s+/32 host LOCAL", out)
    assert ips, out
    # the step's own pod network namespace differs from the container's
    pod_ns = ssh("alice@login", f"cd /tmp && {step} readlink /proc/self/ns/net").stdout.strip()
    assert pod_ns and pod_ns != parent_ns[0], (pod_ns, out)
    # released when the container exits: no pn-c namespace of alice is left on c1
    wait_for(
        lambda: (
            not [
                p
                for p in json.loads(ssh("c1", "podnet --json pods").stdout)
                if p.get("kind") == "container"
                and p.get("container_id", "").startswith("podnet-container-")
            ]
        ),
        30,
    )
    ssh("c1", "rm -rf /tmp/pncni.sif /tmp/pncni-root /tmp/pncni-run.sh")


# -- conformance: the plugin under cnitool (the CNI project's runtime, libcni) -----------
CNITOOL_DIR = "/tmp/pncnit"
CNITOOL_NET = "podnet-cnitool"
#: run by alice in a job step on c1: a fakeroot-style container (user + mount + network
#: namespace of her own), wired by cnitool with podnet's plugin. libcni keeps its results
#: in /var/lib/cni (root's): a tmpfs of her own mount namespace stands in for it.
CNITOOL_INNER = r"""
pod=$1 bobpod=$2 name=$3 d=$4
if [ -d /var/lib/cni ]; then mount -t tmpfs cnicache /var/lib/cni
else mount -t tmpfs cnilib /var/lib && mkdir /var/lib/cni; fi || { echo no-cache; exit 9; }
ns=/proc/$$/ns/net
ip link set lo up
echo "version=$(echo '{"cniVersion":"1.1.0"}' | CNI_COMMAND=VERSION /usr/lib/cni/podnet)"
cnitool add NET $ns >$d/add.json; echo "add-rc=$?"
cat $d/add.json; echo
echo "addr=$(ip -4 -o addr show eth0 | awk '{print $4}')"
dns=$(tr -d ' \n' <$d/add.json | sed -n 's/.*"nameservers":\["\([0-9.]*\)".*/\1/p')
echo "resolved=$(dig +short +time=2 +tries=3 @$dns $name)"
ping -c1 -W3 $pod >/dev/null 2>&1 && echo reached-pod
ping -c1 -W3 $bobpod >/dev/null 2>&1 && echo reached-bobpod
cnitool check NET $ns; echo "check-rc=$?"
ip link del eth0
cnitool check NET $ns 2>&1; echo "check-after-link-del-rc=$?"
cnitool del NET $ns; echo "del-rc=$?"
cnitool add NET $ns >$d/add2.json; echo "add2-rc=$?"
echo "addr2=$(ip -4 -o addr show eth0 | awk '{print $4}')"
cnitool gc NET $ns; echo "gc-rc=$?"
echo "links-after-gc=$(ip -o link show | grep -c eth0)"
cnitool status NET $ns; echo "status-rc=$?"
""".replace("NET", CNITOOL_NET)


def _copy_to(node: str, path: str, data: bytes, mode: str = "0755") -> None:
    """A file onto a lab node (through ssh's stdin: a binary is too big for a command line)."""
    r = subprocess.run(
        [str(REPO / "tests/lab/lab.sh"), "ssh", node, f"cat >{path} && chmod {mode} {path}"],
        env={**os.environ, "LAB_NAME": LAB},
        input=data,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr


def _cnitool() -> bytes:
    """The pinned cnitool of `make artifacts`, checked against its recorded sha256."""
    link = Path(os.environ.get("PODNET_CACHE_DIR", "/var/cache/podnet-dev")) / "artifacts/cnitool"
    exe = link.resolve()
    assert exe.is_file(), f"{link}: no cnitool (make artifacts)"
    data = exe.read_bytes()
    want = (exe.parent / f"{exe.name}.sha256").read_text().split()[0]
    assert hashlib.sha256(data).hexdigest() == want, f"{exe}: sha256 differs from {want}"
    return data


def test_cnitool_add_check_del_gc_status_as_a_user_in_a_job(jobs: dict[str, int]) -> None:
    """CNI conformance, as HPK runs it: alice, in a step of her job on c1, runs cnitool
    (libcni: the reference runtime) with the podnet network on a namespace of her own.
    ADD gives an address on her network that reaches her job pod on c2 (and not bob's),
    named `cnit.alice.<cluster>`; CHECK passes, and fails with a CNI error once the
    interface is deleted inside; DEL releases the address and the name; VERSION lists
    the spec versions; CNI 1.1: GC (libcni DELs the attachment it cached, then the
    plugin's GC) leaves nothing, STATUS passes. cnitool is a test tool here: it is copied
    to the node for this test only."""
    job, bob_job = jobs["alice"], jobs["bob"]
    pod, bob_pod = pod_of("c2", job)["ip"], pod_of("c2", bob_job)["ip"]
    name = f"cnit.alice.{CLUSTER}"
    ssh(
        "c1", f"rm -rf {CNITOOL_DIR} && install -d -o alice -m 0755 {CNITOOL_DIR} {CNITOOL_DIR}/net"
    )
    _copy_to("c1", f"{CNITOOL_DIR}/cnitool", _cnitool())
    conflist = {"cniVersion": "1.1.0", "name": CNITOOL_NET, "plugins": [{"type": "podnet"}]}
    _copy_to("c1", f"{CNITOOL_DIR}/net/10-podnet.conflist", json.dumps(conflist).encode(), "0644")
    _copy_to("c1", f"{CNITOOL_DIR}/inner.sh", CNITOOL_INNER.encode())
    run = (
        f"cd /tmp && srun --jobid={job} -w c1 -N1 -n1 --overlap -t 3 "
        f"env NETCONFPATH={CNITOOL_DIR}/net CNI_PATH=/usr/lib/cni CNI_ARGS=PODNET_NAME=cnit "
        f"PATH={CNITOOL_DIR}:/usr/sbin:/usr/bin:/sbin:/bin "
        f"unshare -r -m -n sh {CNITOOL_DIR}/inner.sh {pod} {bob_pod} {name} {CNITOOL_DIR}"
    )
    try:
        r = ssh("alice@login", run, check=False, timeout=300)
        out = r.stdout + r.stderr
        val = dict(re.findall(r"^([a-z0-9-]+)=(.*)$", out, re.M))
        # VERSION (libcni asks it too): the spec versions, 1.1 included
        assert json.loads(val["version"])["supportedVersions"] == ["0.4.0", "1.0.0", "1.1.0"], out
        # ADD: an address of the pod network, on alice's network, under her name
        assert val["add-rc"] == "0", out
        ip = val["addr"].split("/")[0]
        assert ipaddress.ip_address(ip) in ipaddress.ip_network(POD_CIDR), out
        assert val["resolved"] == ip, out
        assert "reached-pod" in out and "reached-bobpod" not in out, out
        # CHECK, and CHECK after `ip link del` inside: a CNI error (libcni prints it)
        assert val["check-rc"] == "0", out
        assert val["check-after-link-del-rc"] == "1", out
        assert "container network drifted" in out and "eth0 is missing" in out, out
        # DEL: the address and the name are gone
        assert val["del-rc"] == "0", out
        assert not _records(ip, "alice/cnit"), out
        # GC after a second ADD: libcni DELs its cached attachment, podnet's GC runs
        assert val["add2-rc"] == "0" and val["addr2"], out
        ip2 = val["addr2"].split("/")[0]
        assert val["gc-rc"] == "0" and val["links-after-gc"] == "0", out
        assert not _records(ip2, "alice/cnit"), out
        assert val["status-rc"] == "0", out
        assert not [p for p in pods("c1") if str(p.get("container_id", "")).startswith("cnitool-")]
    finally:
        ssh("c1", f"rm -rf {CNITOOL_DIR}", check=False)
