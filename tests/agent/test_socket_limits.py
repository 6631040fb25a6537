# SPDX-License-Identifier: Apache-2.0
"""The agent socket cannot be held: per-uid bound, root's slots, whole-request deadline;
and a user's burst waits its turn instead of being refused (docs/api.md "Connections").

Door 4 of issue 8: a user opened 300 connections and wrote a newline every 4 s; 256 stayed
open and every other user's login and job on the node was refused. Issue 35, item 5: 60
`podnet-container` started at once by one user got 44 EUNAVAIL refusals ("too many
connections from uid 2001") although her quota was 32; now the burst gets exactly the quota
and EQUOTA for the rest, while another user is served within the stated bound.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Node, user_call
from podnet.api.client import ApiError

# real users of the test host (no user is created): daemon and bin
A_UID, B_UID = 1, 2
READ_TIMEOUT = 3.0
PER_USER = 4
WAITING = 4

# Runs as A_UID: opens 300 connections, writes a newline on every open one each 0.5 s
# for `hold` seconds, prints what happened to each (refused at once / closed after s).
HOLDER = r"""
import json, socket, sys, time
path, hold = sys.argv[1], float(sys.argv[2])
socks, refused, closed = [], 0, []
t0 = time.monotonic()
for _ in range(300):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError:
        refused += 1
        continue
    s.setblocking(False)
    socks.append(s)
print("OPENED", flush=True)
while time.monotonic() - t0 < hold and socks:
    for s in list(socks):
        try:
            data = s.recv(4096)
        except BlockingIOError:
            data = None
        except OSError:
            data = b""
        if data is not None:
            if data:
                refused += 1  # an EUNAVAIL reply at once
            else:
                closed.append(round(time.monotonic() - t0, 2))
            socks.remove(s)
            s.close()
            continue
        try:
            s.send(b"\n")
        except OSError:
            pass
    time.sleep(0.5)
print(json.dumps({"refused": refused, "closed_after": closed, "still_open": len(socks)}))
"""


def python_as(uid: int, code: str, *args: str) -> list[str]:
    """argv running Python `code` with `args` as an unprivileged uid."""
    setpriv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    return [*setpriv, sys.executable, "-c", code, *args]


@pytest.fixture(scope="module")
def strict(workdir: Path, etcd: Any) -> Iterator[Node]:
    """A compute-only node with short socket bounds."""
    n = Node(
        7,
        workdir,
        etcd,
        settings={
            "roles": ["compute"],
            "read_timeout": READ_TIMEOUT,
            "max_connections": 64,
            "root_connections": 8,
            "max_connections_per_user": PER_USER,
            "max_waiting_per_user": WAITING,
        },
    )
    try:
        yield n
    finally:
        n.teardown()


def test_a_user_cannot_hold_the_socket_against_others(strict: Node) -> None:
    # the first PER_USER connections are served at READ_TIMEOUT, the WAITING ones queued
    # behind them are served next and closed at their own deadline
    hold = READ_TIMEOUT * 2 + 3
    holder = subprocess.Popen(
        python_as(A_UID, HOLDER, strict.socket, str(hold)),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "OPENED"
        # while A holds what it may: root and another user are served, A is not (its
        # slots and its queue are full)
        assert strict.call("status")["node"] == "n7"
        assert user_call(strict, B_UID, "pods")["pods"] == []
        over = user_call(strict, A_UID, "pods")
        assert over["ok"] is False and over["code"] == "EUNAVAIL", over
        assert (
            f"too many connections from uid {A_UID} ({PER_USER} at once, {WAITING} waiting)"
            in over["message"]
        ), over
        out, _ = holder.communicate(timeout=hold + 30)
    finally:
        holder.kill()
    res = json.loads(out.strip().splitlines()[-1])
    # at most PER_USER + WAITING connections were let in, the rest refused with an answer
    assert res["refused"] >= 300 - PER_USER - WAITING, res
    assert len(res["closed_after"]) + res["still_open"] <= PER_USER + WAITING, res
    # newlines do not keep a connection: each is closed at the request deadline of its
    # service, which for a waiting one starts when a served one ends
    assert res["still_open"] == 0, res
    assert all(t <= 2 * READ_TIMEOUT + 2.5 for t in res["closed_after"]), res


def test_users_get_one_request_per_connection_root_more(strict: Node) -> None:
    two = b'{"v":1,"op":"status"}\n' * 2
    code = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_UNIX);s.settimeout(10);s.connect(sys.argv[1])\n"
        f"s.sendall({two!r})\n"
        "buf=b''\n"
        "while True:\n"
        "    c=s.recv(65536)\n"
        "    if not c: break\n"
        "    buf+=c\n"
        "print(len([x for x in buf.splitlines() if x.strip()]))"
    )
    as_user = subprocess.run(
        python_as(A_UID, code, strict.socket),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert as_user.stdout.strip() == "1"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(strict.socket)
        s.sendall(two)
        s.shutdown(socket.SHUT_WR)
        buf = b""
        while chunk := s.recv(65536):
            buf += chunk
    assert [json.loads(x)["ok"] for x in buf.splitlines()] == [True, True]


def test_login_pods_only_on_login_nodes(strict: Node) -> None:
    r = user_call(strict, A_UID, "login_acquire")
    assert r["ok"] is False and r["code"] == "EPERM", r
    assert "not a login node" in r["message"]
    assert strict.call("pods")["pods"] == []
    # root (the SSH hooks) is refused the same way
    with pytest.raises(ApiError, match="not a login node"):
        strict.call("login_acquire", uid=A_UID, pid=1)


# -- a burst waits its turn (issue 35, item 5) ---------------------------------------------

BURST = 60
QUOTA = 32  # quota_containers_per_node, the default
#: the stated bound (docs/api.md "Connections"): what the burst may add to another user's
#: container_add
DELAY_BOUND_S = 2.0

#: Runs as A_UID: BURST threads released together, each one connection with one
#: container_add (podnetd makes the namespace and ties it to this process, which stays
#: until stdin closes); prints FIRST at the first answer, then every answer with its times
BURSTER = r"""
import json, socket, sys, threading, time
path, n = sys.argv[1], int(sys.argv[2])
go, lock, out, first = threading.Barrier(n), threading.Lock(), [None] * n, []
def one(i):
    go.wait()
    t0 = time.monotonic()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(120)
    s.connect(path)
    req = {"v": 1, "op": "container_add", "container_id": f"burst-{i}", "ifname": "eth0"}
    s.sendall(json.dumps(req).encode() + b"\n")
    buf = b""
    while not buf.endswith(b"\n"):
        c = s.recv(65536)
        if not c:
            break
        buf += c
    s.close()
    r = json.loads(buf) if buf.strip() else {"ok": False, "error": {"code": "NOREPLY"}}
    err = r.get("error") or {}
    out[i] = {"ok": r["ok"], "code": err.get("code"), "message": err.get("message", ""),
              "t0": t0, "t1": time.monotonic()}
    with lock:
        if not first:
            first.append(i)
            print("FIRST", flush=True)
threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(out), flush=True)
sys.stdin.read()
"""

#: Runs as B_UID: one container_add once a line arrives on stdin, timed where it is made
OTHER = r"""
import json, sys, time
from podnet.api.client import ApiError, call
sys.stdin.readline()
t0 = time.monotonic()
try:
    r = call("container_add", sys.argv[1], container_id=sys.argv[2], ifname="eth0")
    ok, code = True, ""
except ApiError as e:
    ok, code = False, e.code + ": " + e.message
print(json.dumps({"ok": ok, "code": code, "t0": t0, "t1": time.monotonic()}))
"""


#: Runs as A_UID: one connection that sends no request (newlines only) for 8 s
HOLD_ONE = r"""
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
print("OPENED", flush=True)
for _ in range(16):
    s.send(b"\n")
    time.sleep(0.5)
"""


@pytest.fixture(scope="module")
def roomy(workdir: Path, etcd: Any) -> Iterator[Node]:
    """A node with the default connection bounds and quotas where users may have
    containers outside jobs (a login node with `agent_containers_outside_jobs`)."""
    n = Node(
        24,
        workdir,
        etcd,
        settings={"containers_outside_jobs": True, "container_grace": 600, "gc_interval": 3600},
    )
    try:
        yield n
    finally:
        n.teardown()


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no Threads: in /proc/{pid}/status")


def test_a_burst_gets_its_quota_and_another_user_is_served_within_the_bound(
    roomy: Node,
) -> None:
    assert roomy.proc is not None
    pid = roomy.proc.pid  # nsenter execs podnetd
    alone = json.loads(
        subprocess.run(
            python_as(B_UID, OTHER, roomy.socket, "other-0"),
            input="\n",
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    )
    assert alone["ok"], alone
    idle_threads = threads_of(pid)
    most = [idle_threads]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            most.append(threads_of(pid))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    # bob's process is ready before the burst starts: his request goes in at its first answer
    other = subprocess.Popen(
        python_as(B_UID, OTHER, roomy.socket, "other-1"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    burst = subprocess.Popen(
        python_as(A_UID, BURSTER, roomy.socket, str(BURST)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    sampler.start()
    try:
        assert burst.stdout is not None
        assert burst.stdout.readline().strip() == "FIRST"
        # while the burst is served: bob's container_add
        bob_out, _ = other.communicate("\n", timeout=60)
        line = burst.stdout.readline()
        sampling.set()
        answers = json.loads(line)
    finally:
        sampling.set()
        if burst.stdin is not None:
            burst.stdin.close()
        burst.wait(30)
        other.kill()
        other.wait()
    codes = [a["code"] for a in answers if not a["ok"]]
    ok = [a for a in answers if a["ok"]]
    assert "EUNAVAIL" not in codes, [a for a in answers if a["code"] == "EUNAVAIL"][:3]
    assert len(ok) == QUOTA and codes == ["EQUOTA"] * (BURST - QUOTA), (len(ok), codes)
    refusal = next(a["message"] for a in answers if a["code"] == "EQUOTA")
    assert f"containers per user on a node on n24 is {QUOTA}" in refusal, refusal
    # bob: served, delayed by no more than the bound, while alice's burst was still being
    # answered
    bob = json.loads(bob_out)
    assert bob["ok"], bob
    took, took_alone = bob["t1"] - bob["t0"], alone["t1"] - alone["t0"]
    assert took - took_alone <= DELAY_BOUND_S, f"bob: {took:.2f} s, alone {took_alone:.2f} s"
    assert bob["t0"] < max(a["t1"] for a in answers), "the burst was over before bob asked"
    # the burst held at most max_connections_per_user (8) threads of podnetd, not 60
    assert max(most) - idle_threads <= 8 + 1 + 10, (idle_threads, max(most))
    pods = [p for p in roomy.call("pods")["pods"] if p["kind"] == "container"]
    assert len([p for p in pods if p["uid"] == A_UID]) == QUOTA


def test_a_connection_waiting_longer_than_wait_timeout_is_refused_clearly(
    workdir: Path, etcd: Any
) -> None:
    """One slot per user, a short wait_timeout: a connection that holds the slot without
    sending its request makes the next one wait, until it is turned away with EUNAVAIL."""
    n = Node(
        25,
        workdir,
        etcd,
        settings={
            "roles": ["compute"],
            "read_timeout": 6.0,
            "max_connections_per_user": 1,
            "wait_timeout": 1.5,
        },
    )
    hold = subprocess.Popen(python_as(A_UID, HOLD_ONE, n.socket), stdout=subprocess.PIPE, text=True)
    try:
        assert hold.stdout is not None
        assert hold.stdout.readline().strip() == "OPENED"
        t0 = time.monotonic()
        r = user_call(n, A_UID, "pods")
        waited = time.monotonic() - t0
        assert r["ok"] is False and r["code"] == "EUNAVAIL", r
        assert f"uid {A_UID}: waited 1.5 s for one of its 1 at once" in r["message"], r
        assert 1.0 <= waited <= 5.0, waited
        # another user meanwhile: at once
        assert user_call(n, B_UID, "pods")["pods"] == []
    finally:
        hold.kill()
        hold.wait()
        n.teardown()
