# SPDX-License-Identifier: Apache-2.0
"""SSH side doors (issue 8): nothing a captured user does over SSH leaves from the host.

As alice (jobs on c1, c2) and carol (no job): TCP forwards (-L, -R, -D, -W), a
stream-local forward, and start-up files (~/.bashrc, ~/.profile, ~/.zshenv,
~/.ssh/rc) that try to get a shell on the host network, through `login` and a
compute node. bob serves HTTP in his job pods: his access log must never show
the attacker's marker. The SSH client side runs on the lab host (traffic only
to 127.0.0.1 and lab addresses) with the lab's key, which every lab user has.
"""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import CLUSTER, LAB, in_pod, lab_inventory, pod_of, settle_to_job, ssh, wait_for

STATE = Path(f"/var/lib/podnet-lab/{LAB}")
KEY = STATE / "ssh" / "id_ed25519"
HELPER = "/usr/local/libexec/podnet-session"
BOB_PORT = 8000
BOB_LOG = "/tmp/pnatt-bobweb.log"
WAIT = 6.0  # seconds an attack gets to show a byte of bob's server


def node_ip(node: str) -> str:
    inventory = lab_inventory()
    m = re.search(rf"^\s+{re.escape(node)}:\n\s+ansible_host: (\S+)$", inventory.read_text(), re.M)
    assert m, f"no {node} in {inventory}"
    return m.group(1)


def ssh_cmd(user: str, node: str, *args: str, loglevel: str = "ERROR") -> list[str]:
    return [
        "ssh",
        "-i",
        str(KEY),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        f"LogLevel={loglevel}",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        "-o",
        "ServerAliveInterval=5",
        *args,
        f"{user}@{node_ip(node)}",
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def tunnel(user: str, node: str, *args: str, port: int | None = None) -> Iterator[Any]:
    """`ssh -N ARGS user@node` in the background; waits for the local port, if any."""
    p = subprocess.Popen(
        ssh_cmd(user, node, "-N", *args),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        end = time.monotonic() + 30
        up = False
        while port and not up and time.monotonic() < end and p.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                up = True
            except OSError:
                time.sleep(0.2)
        # a client that is still running must be listening: else this test proves nothing
        assert not port or up or p.poll() is not None, f"ssh {args} did not come up in time"
        if not port:
            time.sleep(2)  # authentication and the session's set-up
        yield p
    finally:
        if p.poll() is None:
            p.terminate()
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def recv_all(s: socket.socket, deadline: float) -> bytes:
    data = b""
    while time.monotonic() < deadline:
        s.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            break
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    return data


def http_get(port: int, marker: str) -> str:
    """GET /?marker through a local forward; '' if nothing came back in time."""
    deadline = time.monotonic() + WAIT
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as s:
            s.sendall(f"GET /?{marker} HTTP/1.0\r\n\r\n".encode())
            return recv_all(s, deadline).decode(errors="replace")
    except OSError:
        return ""


def socks5_get(port: int, ip: str, dport: int, marker: str) -> str:
    """CONNECT ip:dport through a SOCKS5 proxy (ssh -D), then GET /?marker."""
    deadline = time.monotonic() + WAIT
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as s:
            s.sendall(b"\x05\x01\x00")
            if recv_exact(s, 2, deadline) != b"\x05\x00":
                return ""
            s.sendall(b"\x05\x01\x00\x01" + socket.inet_aton(ip) + dport.to_bytes(2, "big"))
            reply = recv_exact(s, 10, deadline)
            if len(reply) < 2 or reply[1] != 0:
                return ""
            s.sendall(f"GET /?{marker} HTTP/1.0\r\n\r\n".encode())
            return recv_all(s, deadline).decode(errors="replace")
    except OSError:
        return ""


def recv_exact(s: socket.socket, n: int, deadline: float) -> bytes:
    data = b""
    while len(data) < n and time.monotonic() < deadline:
        s.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            chunk = s.recv(n - len(data))
        except (TimeoutError, OSError):
            break
        if not chunk:
            break
        data += chunk
    return data


def stdio_forward(user: str, node: str, target: str, marker: str) -> str:
    """`ssh -W target` with a GET on stdin; what came back within the time limit."""
    p = subprocess.Popen(
        ssh_cmd(user, node, "-W", target),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        out, _ = p.communicate(f"GET /?{marker} HTTP/1.0\r\n\r\n".encode(), timeout=WAIT + 10)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
    return out.decode(errors="replace")


def bob_saw(marker: str) -> bool:
    return any(
        marker in ssh(node, f"cat {BOB_LOG} 2>/dev/null", check=False).stdout
        for node in ("c1", "c2")
    )


@pytest.fixture(scope="module")
def bob(jobs: dict[str, int]) -> Iterator[dict[str, str]]:
    """bob's HTTP server in each of his job pods; yields node -> pod IP."""
    ips = {}
    for node in ("c1", "c2"):
        pod = pod_of(node, jobs["bob"])
        ips[node] = pod["ip"]
        ssh(node, f"rm -f {BOB_LOG}")
        # bob starts it as bob does: SSH to the node puts him in his job's pod there
        ssh(
            f"bob@{node}",
            f"setsid -f timeout 900 python3 -m http.server {BOB_PORT} --bind {pod['ip']} "
            f"--directory /tmp >{BOB_LOG} 2>&1 </dev/null",
        )
    for node, ip in ips.items():
        probe = (
            "python3 -c 'import urllib.request as u;"
            f'u.urlopen("http://{ip}:{BOB_PORT}/?bob-ready", timeout=2)\''
        )
        pod = pod_of(node, jobs["bob"])
        wait_for(
            lambda p=pod, c=probe, n=node: in_pod(n, p["netns"], c, check=False).returncode == 0, 30
        )
    try:
        yield ips
    finally:
        for node in ("c1", "c2"):
            # by its command line: a pid bob wrote down is his pod's, not the node's
            ssh(node, f"pkill -f 'http.server {BOB_PORT} --bind'; rm -f {BOB_LOG}", check=False)


NODES = ["login", "c2"]


@pytest.mark.parametrize("node", NODES)
def test_local_forward_to_bobs_pod(bob: dict[str, str], node: str) -> None:
    port, marker = free_port(), f"pnatt-L-{node}"
    with tunnel("alice", node, "-L", f"127.0.0.1:{port}:{bob['c1']}:{BOB_PORT}", port=port):
        got = http_get(port, marker)
    assert "HTTP/" not in got, got[:200]
    assert not bob_saw(marker)


@pytest.mark.parametrize("node", NODES)
def test_stdio_forward_to_bobs_pod(bob: dict[str, str], node: str) -> None:
    marker = f"pnatt-W-{node}"
    got = stdio_forward("alice", node, f"{bob['c1']}:{BOB_PORT}", marker)
    assert "HTTP/" not in got, got[:200]
    assert not bob_saw(marker)


@pytest.mark.parametrize("node", NODES)
def test_dynamic_socks_forward_to_bobs_pod(bob: dict[str, str], node: str) -> None:
    port, marker = free_port(), f"pnatt-D-{node}"
    with tunnel("alice", node, "-D", f"127.0.0.1:{port}", port=port):
        got = socks5_get(port, bob["c1"], BOB_PORT, marker)
    assert "HTTP/" not in got, got[:200]
    assert not bob_saw(marker)


def _alice_netns(node: str, jobs: dict[str, int]) -> str:
    if node == "login":
        return "pn-l2001"
    return Path(pod_of(node, jobs["alice"])["netns"]).name


@pytest.mark.parametrize("node", NODES)
def test_remote_forward_listens_in_the_pod_not_on_the_host(jobs: dict[str, int], node: str) -> None:
    port = free_port()
    with tunnel("alice", node, "-R", f"127.0.0.1:{port}:127.0.0.1:9"):
        listen = f"ss -Hltn 'sport = :{port}'"
        host = ssh(node, listen).stdout
        pod = ssh(node, f"ip netns exec {_alice_netns(node, jobs)} {listen}", check=False)
    assert f":{port}" not in host, f"alice's -R listener is on the host network of {node}"
    assert f":{port}" in pod.stdout, pod.stdout + pod.stderr


SOCK = "/run/pnatt-host.sock"


@pytest.mark.parametrize("node", NODES)
def test_stream_local_forward_is_refused(jobs: dict[str, int], node: str) -> None:
    """A UNIX socket of a host service (here: one that names itself) is out of reach."""
    ssh(
        node,
        f"rm -f {SOCK}; timeout 120 socat UNIX-LISTEN:{SOCK},fork,mode=666 "
        f"EXEC:'echo pnatt-host-socket' >/dev/null 2>&1 </dev/null & echo $! >{SOCK}.pid",
    )
    try:
        wait_for(lambda: ssh(node, f"test -S {SOCK}", check=False).returncode == 0, 10)
        port = free_port()
        with tunnel("alice", node, "-L", f"127.0.0.1:{port}:{SOCK}", port=port):
            got = http_get(port, "pnatt-stream")
        assert "pnatt-host-socket" not in got
    finally:
        ssh(node, f"kill $(cat {SOCK}.pid) 2>/dev/null; rm -f {SOCK} {SOCK}.pid", check=False)


def test_user_without_job_gets_no_forward(bob: dict[str, str]) -> None:
    port = free_port()
    with tunnel("carol", "c2", "-L", f"127.0.0.1:{port}:{bob['c1']}:{BOB_PORT}", port=port):
        got = http_get(port, "pnatt-carol-L")
    got_w = stdio_forward("carol", "c2", f"{bob['c1']}:{BOB_PORT}", "pnatt-carol-W")
    assert "HTTP/" not in got, got[:200]
    assert "HTTP/" not in got_w, got_w[:200]
    assert not bob_saw("pnatt-carol-L") and not bob_saw("pnatt-carol-W")


# --- start-up files ----------------------------------------------------------------------

ESCAPES = {
    # sshd runs a ForceCommand as `$SHELL -c <cmd>`: these run before it
    ".bashrc": f'[ "$BASH_EXECUTION_STRING" = {HELPER} ] && '
    'exec bash -c "${SSH_ORIGINAL_COMMAND:-exec bash -l}"\n',
    ".zshenv": f"[[ $ZSH_EXECUTION_STRING == {HELPER} ]] && "
    'exec zsh -c "${SSH_ORIGINAL_COMMAND:-exec zsh -l}"\n',
}


def probe(ip: str, marker: str) -> str:
    """Where am I (addresses), and can I reach bob?"""
    fetch = (
        "import urllib.request as u;"
        f'print("pnatt-reached", u.urlopen("http://{ip}:{BOB_PORT}/?{marker}", timeout=3).status)'
    )
    return f"ip -o -4 addr show; python3 -c {shlex.quote(fetch)} 2>/dev/null || echo pnatt-blocked"


@contextmanager
def trap(node: str, user: str, rel: str, text: str, shell: str | None = None) -> Iterator[None]:
    """Installs ~user/rel on node (the original is kept aside and restored)."""
    home = f"/home/{user}"
    path = f"{home}/{rel}"
    ssh(
        node,
        f"install -d -o {user} -g {user} -m 700 {home}/.ssh; "
        f"if [ -e {path} ]; then cp -a {path} {path}.pnatt-orig; fi; "
        f"printf %s {shlex.quote(text)} >{path}; chown {user}: {path}"
        + (f"; usermod -s {shell} {user}" if shell else ""),
    )
    try:
        yield
    finally:
        ssh(
            node,
            f"rm -f {path}; if [ -e {path}.pnatt-orig ]; then mv {path}.pnatt-orig {path}; fi"
            + (f"; usermod -s /bin/bash {user}" if shell else ""),
            check=False,
        )


def assert_in_pod(node: str, out: str, marker: str) -> None:
    assert re.search(r"inet 198\.1[89]\.", out), f"no pod address in the session:\n{out}"
    assert f"inet {node_ip(node)}/" not in out, f"session on {node}'s host network:\n{out}"
    assert "pnatt-reached" not in out and "pnatt-blocked" in out, out
    assert not bob_saw(marker)


TRAPS = [".bashrc", ".profile", ".zshenv", ".ssh/rc"]


@pytest.mark.parametrize("node", NODES)
@pytest.mark.parametrize("rel", TRAPS)
def test_start_up_file_cannot_escape_the_pod(bob: dict[str, str], node: str, rel: str) -> None:
    marker = f"pnatt-{rel.replace('/', '-').lstrip('.')}-{node}"
    p = probe(bob["c1"], marker)
    shell = "/usr/bin/zsh" if rel == ".zshenv" else None
    if rel in ESCAPES:
        text, cmd, stdin = ESCAPES[rel], p, ""
    elif rel == ".ssh/rc":
        # runs before the session's command (and before a ForceCommand), as the user
        text, cmd, stdin = p + "\n", "true", ""
    else:  # .profile: what a login shell reads
        text, cmd, stdin = p + "\n", "", "exit\n"
    with trap(node, "alice", rel, text, shell):
        r = subprocess.run(
            [*ssh_cmd("alice", node), *([cmd] if cmd else [])],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert_in_pod(node, r.stdout + r.stderr, marker)


# --- what still works ----------------------------------------------------------------------


def test_forward_to_own_job_pod_works(jobs: dict[str, int]) -> None:
    """The Jupyter case: `ssh -L 8888:pod0.<job>.alice.<cluster>:8888 login`."""
    pod = pod_of("c1", jobs["alice"])
    settle_to_job("alice", "c1", jobs["alice"])
    # alice starts it as she does: SSH to c1 puts her in her job's pod there (the bind to
    # that pod's address fails in any other)
    ssh(
        "alice@c1",
        f"setsid -f timeout 120 python3 -m http.server 8888 --bind {pod['ip']} "
        "--directory /tmp >/dev/null 2>&1 </dev/null",
    )
    try:
        conn = f"python3 -c 'import socket;socket.create_connection((\"{pod['ip']}\",8888),2)'"
        wait_for(lambda: in_pod("c1", pod["netns"], conn, check=False).returncode == 0, 30)
        port = free_port()
        target = f"pod0.{jobs['alice']}.alice.{CLUSTER}"
        with tunnel("alice", "login", "-L", f"127.0.0.1:{port}:{target}:8888", port=port):
            got = http_get(port, "jupyter")
        assert got.startswith("HTTP/1.0 200"), got[:200]
    finally:
        ssh("c1", "pkill -f 'http.server 8888 --bind'", check=False)


def test_sshd_processes_of_a_session_are_in_the_pod(jobs: dict[str, int]) -> None:
    """The measurement behind the design: monitor and child both enter the pod. The
    session's processes are `sshd-session: alice ...` (OpenSSH >= 9.8, Debian 13) or
    `sshd: alice ...` (Debian 12's 9.2)."""
    netns = _alice_netns("c2", jobs)
    with tunnel("alice", "c2"):
        out = ssh(
            "c2",
            "for p in $(pgrep -u root -f '^sshd(-session)?: alice \\[priv\\]') "
            "$(pgrep -u alice -f '^sshd(-session)?: alice'); do "
            'echo "$(cat /proc/$p/cmdline | tr "\\0" " ") $(readlink /proc/$p/ns/net)"; done; '
            f"echo pod $(stat -L -c %i /run/netns/{netns})",
        ).stdout
    ino = re.search(r"^pod (\d+)$", out, re.M)
    assert ino, out
    lines = [line for line in out.splitlines() if re.match(r"sshd(-session)?: alice", line)]
    assert any("[priv]" in line for line in lines), out
    assert any("[priv]" not in line for line in lines), out
    for line in lines:
        assert line.endswith(f"net:[{ino.group(1)}]"), out
