# SPDX-License-Identifier: Apache-2.0
"""The agent socket cannot be held: per-uid bound, root's slots, whole-request deadline.

Door 4 of issue 8: a user opened 300 connections and wrote a newline every 4 s; 256 stayed
open and every other user's login and job on the node was refused.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
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
        },
    )
    try:
        yield n
    finally:
        n.teardown()


def test_a_user_cannot_hold_the_socket_against_others(strict: Node) -> None:
    hold = READ_TIMEOUT * 2 + 2
    holder = subprocess.Popen(
        python_as(A_UID, HOLDER, strict.socket, str(hold)),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "OPENED"
        # while A holds what it may: root and another user are served, A is not
        assert strict.call("status")["node"] == "n7"
        assert user_call(strict, B_UID, "pods")["pods"] == []
        over = user_call(strict, A_UID, "pods")
        assert over["ok"] is False and over["code"] == "EUNAVAIL", over
        assert "too many connections from uid" in over["message"]
        out, _ = holder.communicate(timeout=hold + 30)
    finally:
        holder.kill()
    res = json.loads(out.strip().splitlines()[-1])
    # at most PER_USER connections were let in, the rest refused with an answer
    assert res["refused"] >= 300 - PER_USER, res
    assert len(res["closed_after"]) + res["still_open"] <= PER_USER, res
    # newlines do not keep a connection: each is closed at the request deadline
    assert res["still_open"] == 0, res
    assert all(t <= READ_TIMEOUT + 2.5 for t in res["closed_after"]), res


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
