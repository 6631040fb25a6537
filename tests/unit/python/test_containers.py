# SPDX-License-Identifier: Apache-2.0
"""Containers on their owner's network (agent/src/podnet/node/containers.py, api/cni.py `run`):
who owns a network namespace (the kernel's word, never the request's), the namespace
checks on real namespaces, the socket handler's identity rules, and the CNI plugin's
ADD/DEL/CHECK against a fake podnetd socket. The kernel side runs for real in
tests/e2e/test_cni.py."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from podnet.api import cni
from podnet.api.handlers import Handler, Peer
from podnet.cli import cni as cni_command
from podnet.errors import PodnetError
from podnet.node.containers import (
    NsFacts,
    check_label,
    decide_owner,
    default_label,
    is_container_ns,
    ns_name,
    open_netns,
)


def _facts(host: bool, owner: int, puid: int | None = None) -> NsFacts:
    return NsFacts(host, owner, puid, 4242 if puid is not None else 0, 1, (4, 1))


def _eperm(caller: int, facts: NsFacts, asked: int | None = None) -> str:
    with pytest.raises(PodnetError) as e:
        decide_owner(caller, facts, asked)
    return e.value.code


def test_owner_of_a_users_own_namespace_is_the_user_namespace_creator() -> None:
    fakeroot = _facts(False, 1001, puid=1001)
    assert decide_owner(1001, fakeroot, None) == 1001
    assert decide_owner(0, fakeroot, None) == 1001  # a runtime acting for alice
    assert decide_owner(0, fakeroot, 1001) == 1001
    # bob cannot wire alice's namespace; root cannot relabel it as bob's
    assert _eperm(1002, fakeroot) == "EPERM"
    assert _eperm(0, fakeroot, 1002) == "EPERM"


def test_users_never_wire_a_namespace_of_the_host_user_namespace() -> None:
    # the host's network, a job pod's namespace, another user's process: all host userns
    for facts in (_facts(True, 0, puid=1001), _facts(True, 0, puid=0), _facts(True, 0)):
        assert _eperm(1001, facts) == "EPERM"
    # a user namespace root made (owner 0) counts as root's
    assert _eperm(1001, _facts(False, 0, puid=1001)) == "EPERM"


def test_root_names_the_user_only_for_roots_own_namespaces() -> None:
    assert decide_owner(0, _facts(True, 0, puid=1001), None) == 1001
    assert _eperm(0, _facts(True, 0, puid=1001), 1002) == "EPERM"  # CNI_ARGS cannot lie
    assert decide_owner(0, _facts(True, 0, puid=0), 1002) == 1002
    assert decide_owner(0, _facts(True, 0), 1002) == 1002
    assert _eperm(0, _facts(True, 0, puid=0), None) == "EINVAL"


def test_names() -> None:
    a = ns_name(1001, "apptainer-1", "eth0")
    assert is_container_ns(a) and len(a) == 15
    assert a == ns_name(1001, "apptainer-1", "eth0")
    assert len({a, ns_name(1002, "apptainer-1", "eth0"), ns_name(1001, "apptainer-1", "eth1")}) == 3
    assert not is_container_ns("pn-j42") and not is_container_ns("pn-l1001")
    assert default_label("podnet-container-41") != default_label("podnet-container-42")
    assert check_label(default_label("x")) == default_label("x")
    assert check_label("Web") == "web"
    for bad in ("login", "42", "-x", "a_b", "x" * 64):
        with pytest.raises(PodnetError):
            check_label(bad)


@pytest.fixture
def user_netns() -> Iterator[int]:
    """A process of nobody in a network namespace of a user namespace nobody made
    (what `apptainer exec --fakeroot --net` and `unshare -rn` make)."""
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("unshare"):
        pytest.skip("needs root, setpriv and unshare")
    p = subprocess.Popen(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "unshare",
            "-rn",
            "sleep",
            "60",
        ]
    )
    try:
        for _ in range(200):
            if Path(f"/proc/{p.pid}/ns/user").resolve() != Path("/proc/self/ns/user").resolve():
                break
            time.sleep(0.02)
        else:
            pytest.skip("unprivileged user namespaces are not allowed here")
        # the pid is setpriv's, then unshare's, then sleep's (exec keeps it)
        time.sleep(0.1)
        yield p.pid
    finally:
        p.kill()
        p.wait()


def test_open_netns_reads_the_owner_from_the_kernel(user_netns: int) -> None:
    fd, facts = open_netns(f"/proc/{user_netns}/ns/net")
    os.close(fd)
    assert not facts.host_userns
    assert facts.userns_owner == 65534 and facts.proc_uid == 65534
    assert facts.pid == user_netns and facts.start > 0
    assert decide_owner(65534, facts, None) == 65534
    with pytest.raises(PodnetError):
        decide_owner(1001, facts, None)


def test_open_netns_refuses_what_is_not_a_container_namespace(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases = {
        "/proc/self/ns/net": "EINVAL",  # the host's (podnetd's own)
        "/proc/self/ns/user": "EINVAL",  # a path outside the allowed forms
        "/run/netns/../../etc/passwd": "EINVAL",
        "/etc/passwd": "EINVAL",
        str(fifo): "EINVAL",  # outside the allowed directories (never opened)
        "/proc/999999999/ns/net": "ENOENT",
        "relative/ns": "EINVAL",
    }
    for path, code in cases.items():
        with pytest.raises(PodnetError) as e:
            open_netns(path)
        assert e.value.code == code, path


class _FakeContainers:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def add(self, *args: Any) -> Any:
        self.calls.append(args)
        raise PodnetError("EPERM", "stop here")


class _FakeAgent:
    def __init__(self) -> None:
        self.containers = _FakeContainers()


def test_handler_hears_uid_and_pid_only_from_root() -> None:
    agent = _FakeAgent()
    h = Handler(agent)  # type: ignore[arg-type]
    req = {
        "v": 1,
        "op": "container_add",
        "container_id": "x1",
        "ifname": "eth0",
        "netns": "/proc/77/ns/net",
        "uid": 1002,
        "pid": 1,
    }
    line = json.dumps(req).encode()
    assert h.handle_line(Peer(500, 1001, 1001), line)["error"]["code"] == "EPERM"
    assert h.handle_line(Peer(501, 0, 0), line)["error"]["code"] == "EPERM"
    alice, root = agent.containers.calls
    assert alice == (1001, 500, "x1", "eth0", "/proc/77/ns/net", "", None, None)
    assert root == (0, 501, "x1", "eth0", "/proc/77/ns/net", "", 1002, 1)
    bad = dict(req, container_id="../x")
    assert h.handle_line(Peer(500, 1001, 1001), json.dumps(bad).encode())["error"]["code"] == (
        "EINVAL"
    )


# -- the CNI plugin against a fake podnetd --------------------------------------------------
class FakePodnetd:
    def __init__(self, path: Path, replies: dict[str, dict[str, Any]]) -> None:
        self.path = path
        self.replies = replies
        self.requests: list[dict[str, Any]] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn = self.sock.accept()[0]
            except OSError:
                return
            with conn:
                buf = b""
                while not buf.endswith(b"\n"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
                req = json.loads(buf)
                self.requests.append(req)
                conn.sendall(json.dumps(self.replies[req["op"]]).encode() + b"\n")


POD = {
    "kind": "container",
    "ip": "198.18.0.9",
    "prefix": 15,
    "mac": "0a:58:c6:12:00:09",
    "gateway": "169.254.0.1",
    "names": ["web.alice.lab"],
    "dns": {"nameservers": ["198.51.100.2"], "domain": "alice.lab", "search": ["alice.lab"]},
}


def _plugin(
    sock: Path, command: str, conf: dict[str, Any] | None = None, args: str = ""
) -> tuple[int, Any]:
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "apptainer-1",
        "CNI_NETNS": "/proc/4242/ns/net",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/usr/lib/cni",
        "CNI_ARGS": args,
    }
    c = {"cniVersion": "1.0.0", "name": "podnet", "type": "podnet", "socket": str(sock)}
    out = io.StringIO()
    rc = cni_command.main(env, io.BytesIO(json.dumps({**c, **(conf or {})}).encode()), out)
    text = out.getvalue().strip()
    return rc, json.loads(text) if text else None


def test_cni_add_del_check_through_podnetd(tmp_path: Path) -> None:
    sock = tmp_path / "s"
    d = FakePodnetd(
        sock,
        {
            "container_add": {"v": 1, "ok": True, "pod": POD},
            "container_del": {"v": 1, "ok": True, "released": True},
            "container_check": {"v": 1, "ok": True, "pod": POD, "problems": []},
        },
    )
    rc, res = _plugin(sock, "ADD", args="IgnoreUnknown=1;PODNET_NAME=Web;PODNET_UID=7")
    assert rc == 0
    assert res["ips"] == [{"address": "198.18.0.9/15", "gateway": "169.254.0.1", "interface": 0}]
    assert res["interfaces"][0] == {
        "name": "eth0",
        "mac": "0a:58:c6:12:00:09",
        "sandbox": "/proc/4242/ns/net",
    }
    assert res["dns"]["domain"] == "alice.lab"
    add = d.requests[-1]
    assert add["op"] == "container_add" and add["name"] == "web" and add["uid"] == 7
    assert add["netns"] == "/proc/4242/ns/net" and add["container_id"] == "apptainer-1"
    prev = {"prevResult": res}
    assert _plugin(sock, "CHECK", prev) == (0, None)
    assert _plugin(sock, "DEL") == (0, None)
    # CHECK: podnetd's problems, or an address other than prevResult's, are drift
    d.replies["container_check"] = {"v": 1, "ok": True, "pod": POD, "problems": ["gone"]}
    rc, err = _plugin(sock, "CHECK", prev)
    assert rc == 1 and err["code"] == cni.E_DRIFT and "gone" in err["details"]
    d.replies["container_check"] = {"v": 1, "ok": True, "pod": POD, "problems": []}
    other = json.loads(json.dumps(res))
    other["ips"][0]["address"] = "198.18.0.10/15"
    rc, err = _plugin(sock, "CHECK", {"prevResult": other})
    assert rc == 1 and err["code"] == cni.E_DRIFT
    # DEL of what podnetd does not know succeeds (spec: DEL is idempotent)
    d.replies["container_del"] = {
        "v": 1,
        "ok": False,
        "error": {"code": "ENOENT", "message": "no such"},
    }
    assert _plugin(sock, "DEL") == (0, None)
    # refusals become CNI errors; podnetd away: try again later
    d.replies["container_add"] = {
        "v": 1,
        "ok": False,
        "error": {"code": "EPERM", "message": "not yours"},
    }
    rc, err = _plugin(sock, "ADD")
    assert rc == 1 and err["code"] == cni.E_PODNETD and "not yours" in err["msg"]
    rc, err = _plugin(tmp_path / "nothing", "ADD")
    assert rc == 1 and err["code"] == cni.E_TRY_AGAIN


def test_cni_version_needs_no_podnetd(tmp_path: Path) -> None:
    rc, res = _plugin(tmp_path / "nothing", "VERSION")
    assert rc == 0 and res["supportedVersions"] == ["0.4.0", "1.0.0", "1.1.0"]


def test_handler_serves_the_c_plugins_relay_as_the_caller() -> None:
    """op "cni" (agent/native/podnet_cni.c): the whole CNI request served in podnetd with
    the caller's own identity; the plugin prints cni_out and exits with cni_rc."""
    agent = _FakeAgent()
    h = Handler(agent)  # type: ignore[arg-type]
    conf = json.dumps({"cniVersion": "1.0.0", "name": "podnet", "type": "podnet"})
    req = {
        "v": 1,
        "op": "cni",
        "command": "ADD",
        "container_id": "c9",
        "netns": "/proc/77/ns/net",
        "ifname": "eth0",
        "args": "PODNET_NAME=web;PODNET_UID=0",
        "path": "/usr/lib/cni",
        "config": conf,
    }
    reply = h.handle_line(Peer(500, 1001, 1001), json.dumps(req).encode())
    assert reply["ok"] and reply["cni_rc"] == 1, reply
    err = json.loads(reply["cni_out"])
    assert err["code"] == cni.E_PODNETD and "EPERM" in err["msg"]
    # alice's uid from SO_PEERCRED; PODNET_UID ignored for her
    assert agent.containers.calls == [
        (1001, 500, "c9", "eth0", "/proc/77/ns/net", "web", None, None)
    ]
    bad = dict(req, config="{not json")
    reply = h.handle_line(Peer(500, 1001, 1001), json.dumps(bad).encode())
    assert reply["cni_rc"] == 1 and json.loads(reply["cni_out"])["code"] == cni.E_DECODE


def test_proc_paths_of_a_runtime_in_a_pid_namespace_are_its_own() -> None:
    """A runtime in a job step (a pid namespace of the job's) names its container as
    /proc/<its pid>/ns/net: podnetd reads that pid in the caller's pid namespace."""
    from podnet.node.containers import host_proc_path  # noqa: PLC0415

    me = os.getpid()
    assert host_proc_path("/proc/1/ns/net", me) == "/proc/1/ns/net"  # podnetd's own pidns
    assert host_proc_path("/run/netns/x", me) == "/run/netns/x"
    if os.geteuid() != 0:
        pytest.skip("a pid namespace needs root")
    p = subprocess.Popen(["unshare", "-p", "-f", "sleep", "60"])
    try:
        for _ in range(100):  # the forked sleep: pid 1 of the new pid namespace
            kids = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
            if kids:
                break
            time.sleep(0.05)
        inner = int(kids[0])
        assert host_proc_path("/proc/1/ns/net", inner) == f"/proc/{inner}/ns/net"
        assert not Path(host_proc_path("/proc/2/ns/net", inner)).exists()  # none there
    finally:
        p.kill()
        p.wait()
