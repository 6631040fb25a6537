# SPDX-License-Identifier: Apache-2.0
"""Every container is collected once its network namespace holds no process (issue 22,
item 2; agent/src/podnet/node/collect.py), on a real podnetd and etcd.

Attack tests: a user wires a namespace of their own through a path that names no process
(a symlink to /proc/<pid>/ns/net, a bind mount, a symlink to another process's fd of the
namespace), then the namespace's last process exits: before issue 22 the container, its
address and its names stayed until DEL (the record had pid 0); now they go within seconds,
also when the process died while podnetd was down. A namespace podnetd made and keeps
alive itself is collected when no process entered it (after the grace) or the last one
left. An inode number the kernel reuses for a new namespace never keeps a dead container.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import CLUSTER, ZONE, EtcdServer, Node, sh, user_call, wait_for

# a real user of the test host (no user is created): daemon
UID, USER = 1, "daemon"
RUN_USER = Path(f"/run/user/{UID}")
GRACE = 3.0
#: a container is gone within this long after its namespace's last process (the loop runs
#: every 2 s; the bound only keeps a broken collector from hanging the test)
WITHIN = 20.0


@pytest.fixture(scope="module")
def node(workdir: Path, etcd: EtcdServer) -> Iterator[Node]:
    n = Node(
        23,
        workdir,
        etcd,
        settings={"containers_outside_jobs": True, "container_grace": GRACE, "gc_interval": 3600},
    )
    made = not RUN_USER.exists()
    if made:
        RUN_USER.mkdir(mode=0o700)
        os.chown(RUN_USER, UID, UID)
    try:
        yield n
    finally:
        n.teardown()
        if made:
            shutil.rmtree(RUN_USER, ignore_errors=True)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    out: list[subprocess.Popen[bytes]] = []
    yield out
    for p in out:
        if p.poll() is None:
            p.kill()
        p.wait()


def as_user(*argv: str) -> list[str]:
    return ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", *argv]


def user_netns(procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """`unshare -rn sleep` as the user: a network namespace of a user namespace they made."""
    p = subprocess.Popen(as_user("unshare", "-rn", "sleep", "600"))
    procs.append(p)
    wait_for(lambda: os.readlink(f"/proc/{p.pid}/ns/net") != os.readlink("/proc/self/ns/net"))
    return p


def symlink(target: str, name: str) -> str:
    link = str(RUN_USER / name)
    sh(*as_user("ln", "-sfn", target, link))
    return link


def records(etcd: EtcdServer, pod: dict[str, Any], label: str) -> list[str]:
    """The container's keys still in etcd (its address, record, names, quota slots)."""
    keys = [
        f"/podnet/{CLUSTER}/ips/{pod['ip']}",
        f"/podnet/{CLUSTER}/containers/n23/{pod['name']}",
        f"/skydns/{ZONE}/{USER}/{label}/ctr",
        "/skydns/arpa/in-addr/" + pod["ip"].replace(".", "/"),
    ]
    held = [k for k in keys if etcd.client.get(k) is not None]
    slots = etcd.client.get_prefix(f"/podnet/{CLUSTER}/quota/{USER}/")[0]
    return held + [kv.key for kv in slots if kv.json().get("owner") == keys[1]]


def mine(node: Node, name: str) -> list[dict[str, Any]]:
    return [p for p in node.call("pods")["pods"] if p["name"] == name]


def add(node: Node, cid: str, netns: str, label: str, **root: Any) -> dict[str, Any]:
    if root:
        r = node.call(
            "container_add", container_id=cid, ifname="eth0", netns=netns, name=label, **root
        )
    else:
        r = user_call(
            node, UID, "container_add", container_id=cid, ifname="eth0", netns=netns, name=label
        )
    assert r.get("ok"), r
    pod = dict(r["pod"])
    assert pod["pid"] == 0, pod  # named by no process: what a pid-based GC never collects
    return pod


def gone(node: Node, etcd: EtcdServer, pod: dict[str, Any], label: str) -> bool:
    return not mine(node, pod["name"]) and not records(etcd, pod, label)


def test_symlinked_namespace_collected_when_its_process_dies(
    node: Node, etcd: EtcdServer, procs: list[subprocess.Popen[bytes]]
) -> None:
    p = user_netns(procs)
    pod = add(node, "col-sym", symlink(f"/proc/{p.pid}/ns/net", "col-sym"), "colsym")
    assert records(etcd, pod, "colsym")
    time.sleep(GRACE + 2.5)  # older than the grace, alive: kept
    assert mine(node, pod["name"])
    p.kill()
    p.wait()
    wait_for(lambda: gone(node, etcd, pod, "colsym"), WITHIN)


def test_bind_mounted_namespace_collected_when_its_process_dies(
    node: Node, etcd: EtcdServer, procs: list[subprocess.Popen[bytes]]
) -> None:
    """root wires a namespace bound at /run/netns (as a runtime does) for the user; the
    bind mount keeps the namespace after its process exits: no process, collected."""
    ns = f"patcol{os.getpid()}"
    sh("ip", "netns", "add", ns)
    try:
        p = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "600"])
        procs.append(p)
        wait_for(lambda: os.readlink(f"/proc/{p.pid}/ns/net") != os.readlink("/proc/self/ns/net"))
        pod = add(node, "col-bind", f"/run/netns/{ns}", "colbind", uid=UID)
        time.sleep(GRACE + 2.5)
        assert mine(node, pod["name"])
        p.kill()
        p.wait()
        wait_for(lambda: gone(node, etcd, pod, "colbind"), WITHIN)
        assert Path(f"/run/netns/{ns}").exists()  # the runtime's namespace is its own
    finally:
        sh("ip", "netns", "del", ns, check=False)


def test_namespace_named_by_another_processes_fd_collected(
    node: Node, etcd: EtcdServer, procs: list[subprocess.Popen[bytes]]
) -> None:
    """A process outside the namespace holds an fd of it (the namespace lives on without a
    process in it); the container is named by a symlink to that fd."""
    p = user_netns(procs)
    holder = subprocess.Popen(
        as_user("sh", "-c", f"exec 3</proc/{p.pid}/ns/net; exec sleep 600"), pass_fds=()
    )
    procs.append(holder)
    wait_for(lambda: Path(f"/proc/{holder.pid}/fd/3").exists())
    pod = add(node, "col-fd", symlink(f"/proc/{holder.pid}/fd/3", "col-fd"), "colfd")
    p.kill()
    p.wait()
    wait_for(lambda: gone(node, etcd, pod, "colfd"), WITHIN)
    assert holder.poll() is None  # the namespace still exists, held by the fd


def test_podnetds_own_namespace_collected_without_a_process(
    node: Node, etcd: EtcdServer, procs: list[subprocess.Popen[bytes]]
) -> None:
    """pn-c namespaces podnetd makes (no path) live on its bind mount alone: one no
    process ever entered goes after the grace; one whose process left goes then."""
    never = node.call(
        "container_add", container_id="col-own0", ifname="eth0", name="colown0", uid=UID
    )
    entered = node.call(
        "container_add", container_id="col-own1", ifname="eth0", name="colown1", uid=UID
    )
    p = subprocess.Popen(["nsenter", f"--net={entered['pod']['netns']}", "sleep", "600"])
    procs.append(p)
    wait_for(lambda: gone(node, etcd, never["pod"], "colown0"), GRACE + WITHIN)
    assert mine(node, entered["pod"]["name"])
    p.kill()
    p.wait()
    wait_for(lambda: gone(node, etcd, entered["pod"], "colown1"), WITHIN)


def test_collected_after_a_restart_when_the_process_died_meanwhile(
    node: Node, etcd: EtcdServer, procs: list[subprocess.Popen[bytes]]
) -> None:
    p = user_netns(procs)
    pod = add(node, "col-rs", symlink(f"/proc/{p.pid}/ns/net", "col-rs"), "colrs")
    q = user_netns(procs)
    kept = add(node, "col-rs2", symlink(f"/proc/{q.pid}/ns/net", "col-rs2"), "colrs2")
    node.stop()
    p.kill()
    p.wait()
    node.start()
    wait_for(lambda: gone(node, etcd, pod, "colrs"), WITHIN)
    # the other one lives on through the restart, and is collected when its process goes
    time.sleep(GRACE + 2.5)
    assert mine(node, kept["name"]) and records(etcd, kept, "colrs2")
    q.kill()
    q.wait()
    wait_for(lambda: gone(node, etcd, kept, "colrs2"), WITHIN)


def test_records_of_namespaces_gone_while_podnetd_was_down_are_released(
    node: Node, etcd: EtcdServer, procs: list[subprocess.Popen[bytes]]
) -> None:
    """A reboot empties /run/netns: records of this node whose namespace is not here are
    released at start (they held an address, names and quota slots for ever)."""
    p = user_netns(procs)
    pod = add(node, "col-boot", symlink(f"/proc/{p.pid}/ns/net", "col-boot"), "colboot")
    node.stop()
    sh("umount", pod["netns"])
    Path(pod["netns"]).unlink()
    node.start()
    assert gone(node, etcd, pod, "colboot")


def _same_inode_namespace(
    ino: int, procs: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes] | None:
    """A new namespace (with a process) that got the inode number `ino` the kernel freed
    (it hands the lowest free number out again); None if another one took it first."""
    for _ in range(50):
        q = user_netns(procs)
        if os.stat(f"/proc/{q.pid}/ns/net").st_ino == ino:
            return q
        q.kill()
        q.wait()
        time.sleep(0.2)
    return None


def test_a_reused_inode_number_never_keeps_a_dead_container(
    node: Node, etcd: EtcdServer, procs: list[subprocess.Popen[bytes]]
) -> None:
    """Someone unmounts podnetd's bind mount of a container's namespace, its process exits
    (the namespace is freed) and a new namespace gets the same inode number, with a
    process in it: the collector sees its bind mount no longer shows the namespace and
    collects the container. Then, with podnetd down, the new namespace is even bound where
    the old one was: the namespace's cookie (never reused) tells adoption it is not the
    recorded one."""
    p = user_netns(procs)
    pod = add(node, "col-ino", symlink(f"/proc/{p.pid}/ns/net", "col-ino"), "colino")
    ino = os.stat(pod["netns"]).st_ino
    sh("umount", pod["netns"])
    p.kill()
    p.wait()
    time.sleep(0.5)
    q = _same_inode_namespace(ino, procs)
    wait_for(lambda: gone(node, etcd, pod, "colino"), WITHIN)

    r = user_netns(procs)
    pod = add(node, "col-ino2", symlink(f"/proc/{r.pid}/ns/net", "col-ino2"), "colino2")
    ino = os.stat(pod["netns"]).st_ino
    node.stop(signal.SIGKILL)
    sh("umount", pod["netns"])
    r.kill()
    r.wait()
    time.sleep(0.5)
    q = _same_inode_namespace(ino, procs)
    if q is None:
        pytest.skip("the kernel gave the inode number to another namespace first")
    sh("mount", "--bind", f"/proc/{q.pid}/ns/net", pod["netns"])
    assert os.stat(pod["netns"]).st_ino == ino  # same device and inode as recorded
    # and interfaces that pass for the container's: an eth0 in it whose peer's index is
    # that of a podnet-named veth of the node
    fake = "pnv0000decafbad"
    sh(
        "nsenter",
        f"--net={pod['netns']}",
        "ip",
        "link",
        "add",
        "x",
        "index",
        "4000",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
    )
    sh(
        "ip",
        "-n",
        node.netns,
        "link",
        "add",
        fake,
        "index",
        "4000",
        "type",
        "veth",
        "peer",
        "name",
        "pattmp4000",
    )
    try:
        node.start()
        wait_for(lambda: gone(node, etcd, pod, "colino2"), WITHIN)
    finally:
        sh("ip", "-n", node.netns, "link", "del", fake, check=False)
