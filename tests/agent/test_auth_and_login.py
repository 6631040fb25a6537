# SPDX-License-Identifier: Apache-2.0
"""Authorization from SO_PEERCRED, login pods and their session lifetime."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

from conftest import Node, user_call, wait_for
from test_pods import job_up, ping

# real users of the test host (no user is created): daemon and bin
A_UID, B_UID = 1, 2


def test_non_root_cannot_create_or_release_job_pods(cluster: dict[str, Node]) -> None:
    n1 = cluster["n1"]
    r = user_call(
        n1,
        A_UID,
        "job_up",
        job_id=301,
        user="daemon",
        uid=A_UID,
        job_name="x",
        nodes=["n1"],
        node_index=0,
    )
    assert r == {"ok": False, "code": "EPERM", "message": r["message"]}
    job_up(n1, 302, "daemon", A_UID, "mine", ["n1"])
    assert user_call(n1, A_UID, "job_down", job_id=302)["code"] == "EPERM"
    assert user_call(n1, B_UID, "job_down", job_id=302)["code"] == "EPERM"
    assert n1.call("job_get", job_id=302)["pod"]["uid"] == A_UID


def test_user_can_join_own_job_only(cluster: dict[str, Node]) -> None:
    n1 = cluster["n1"]
    own = user_call(n1, A_UID, "join", target="job", job_id=302)
    assert own["ok"] and own["pod"]["job_id"] == 302
    assert user_call(n1, A_UID, "join", target="job")["pod"]["job_id"] == 302  # most recent
    assert user_call(n1, B_UID, "join", target="job", job_id=302)["code"] == "EPERM"
    assert user_call(n1, B_UID, "join", target="job")["code"] == "ENOENT"
    assert user_call(n1, B_UID, "job_get", job_id=302)["code"] == "EPERM"
    assert user_call(n1, A_UID, "job_get", job_id=302)["ok"]
    # pods: own only; root sees all
    mine = user_call(n1, B_UID, "pods")["pods"]
    assert all(p["uid"] == B_UID for p in mine)
    assert any(p["job_id"] == 302 for p in n1.call("pods")["pods"])


def _session(node: Node, uid: int) -> subprocess.Popen[str]:
    """A login session: acquires the login pod and stays alive (its pid holds the pod)."""
    code = (
        "import json,sys,time;from podnet.api.client import call\n"
        "print(json.dumps(call('login_acquire', sys.argv[1])), flush=True)\n"
        "time.sleep(600)"
    )
    p = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            sys.executable,
            "-c",
            code,
            node.socket,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    return p


def test_login_pod_lifecycle_and_reach_own_job_pods(cluster: dict[str, Node]) -> None:
    n1, n2 = cluster["n1"], cluster["n2"]
    job = [job_up(n, 303, "daemon", A_UID, "svc", ["n1", "n2"]) for n in (n1, n2)]
    s1 = _session(n2, A_UID)
    s2 = _session(n2, A_UID)
    try:
        p1 = json.loads(s1.stdout.readline())["pod"]  # type: ignore[union-attr]
        p2 = json.loads(s2.stdout.readline())["pod"]  # type: ignore[union-attr]
        assert p1 == p2 and p1["kind"] == "login" and p1["names"] == ["n2.login.daemon.t"]
        # login pod reaches the user's job pods on both nodes, not bob's
        assert wait_for(lambda: ping(n2, p1, job[0]["ip"]), 10)
        assert ping(n2, p1, job[1]["ip"])
        # another user cannot release it
        assert user_call(n2, B_UID, "login_release", uid=A_UID)["code"] == "EPERM"
        b = user_call(n2, B_UID, "login_acquire")["pod"]
        assert b["ip"] != p1["ip"]
        assert not ping(n2, p1, b["ip"], count=2)
        s1.kill()
        s1.wait()
        time.sleep(2.5)  # grace is 1 s: the second session keeps the pod
        assert Path(p1["netns"]).exists()
        s2.kill()
        s2.wait()
        wait_for(lambda: not Path(p1["netns"]).exists(), 10)
    finally:
        for s in (s1, s2):
            s.kill()
    assert user_call(n2, A_UID, "join", target="login")["code"] == "ENOENT"


def test_malformed_oversized_partial_and_slow_input(cluster: dict[str, Node]) -> None:
    n3 = cluster["n3"]

    def raw(data: bytes, delay: float = 0.0, shut: bool = True) -> list[dict[str, object]]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(20)
            s.connect(n3.socket)
            try:
                for i in range(0, len(data), 65536):
                    s.sendall(data[i : i + 65536])
                    if delay:
                        time.sleep(delay)
                if shut:
                    s.shutdown(socket.SHUT_WR)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the daemon hung up early (oversized input): read its answer
            buf = b""
            while True:
                try:
                    chunk = s.recv(65536)
                except OSError:
                    break
                if not chunk:
                    break
                buf += chunk
        return [json.loads(x) for x in buf.splitlines() if x.strip()]

    cases = [
        b"not json\n",
        b"[]\n",
        b"{}\n",
        b'{"v": 2, "op": "status"}\n',
        b'{"v":1}\n',
        b'{"v":1,"op":"nope"}\n',
        b'{"v":1,"op":"job_get","job_id":"x"}\n',
        b'{"v":1,"op":"job_get","job_id":-1}\n',
        b'{"v":1,"op":"job_get","job_id":1e99}\n',
        b'{"v":1,"op":"join","target":"other"}\n',
        b"\xff\xfe\n",
        b'{"v":1,"op":"status"',
        b'{"v":1,"op":"job_up","job_id":5,"user":"../../x","uid":1,"nodes":["n3"],"node_index":0}\n',
        b'{"v":1,"op":"job_up","job_id":5,"user":"a","uid":1,"nodes":["n3"],"node_index":3}\n',
        b'{"v":1,"op":"job_up","job_id":5,"user":"a","uid":true,"nodes":["n3"],"node_index":0}\n',
    ]
    for c in cases:
        replies = raw(c)
        assert len(replies) == 1, c
        assert replies[0]["ok"] is False, c
        assert replies[0]["error"]["code"] in ("EINVAL", "EVERSION", "EPERM"), c  # type: ignore[index]
    big = raw(b'{"v":1,"op":"status","pad":"' + b"x" * 200_000 + b'"}\n')
    assert big[0]["error"]["code"] == "ETOOBIG"  # type: ignore[index]
    # several requests on one connection, one slow writer
    multi = raw(b'{"v":1,"op":"status"}\n' * 3, delay=0.01)
    assert [r["ok"] for r in multi] == [True, True, True]
    slow = raw(b'{"v":1,"op":"status"}\n', delay=0.5)
    assert slow[0]["ok"] is True
    # random bytes
    rnd = random.Random(7)
    for _ in range(30):
        blob = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 300))) + b"\n"
        for r in raw(blob):
            assert r["ok"] is False
    # still alive and nothing was created
    assert n3.call("status")["pods"] == len(n3.call("pods")["pods"])
    assert not any(p["job_id"] == 5 for p in n3.call("pods")["pods"])
