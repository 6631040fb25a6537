# SPDX-License-Identifier: Apache-2.0
"""`podnet` for users (issue 35, item 4): `--version`, usage with the commands when no
command is given, help on every option, a user's view of their pods (names, addresses, the
one they are in) and quotas, and one clear line with the next step when podnetd is not
running (never a traceback). Against a fake podnetd on a UNIX socket in a temp dir."""

from __future__ import annotations

import argparse
import errno
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from podnet import __version__
from podnet.cli import podnet as cli

REPO = Path(__file__).resolve().parents[3]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"podnet {__version__}"


def test_no_command_prints_the_usage_with_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    out, err = capsys.readouterr()
    assert "required" not in out + err
    assert out.startswith("usage: podnet")
    for cmd in ("pods", "status", "doctor", "publish", "unpublish", "published", "verify"):
        assert f"\n    {cmd} " in out, cmd
    assert "--socket PATH" in out and "--version" in out


def _parsers(ap: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield ap.prog, ap
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_option_and_argument_has_help() -> None:
    seen = 0
    for prog, p in _parsers(cli.parser()):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            seen += 1
            what = "/".join(action.option_strings) or action.dest
            assert action.help and action.help != argparse.SUPPRESS, f"{prog} {what}: no help"
    assert seen > 40  # every command's options, the common ones on each


class FakePodnetd:
    """Answers each connection's request from `replies` (by op), records the requests."""

    def __init__(self, path: Path, replies: dict[str, dict[str, Any]]) -> None:
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
                reply = {"v": 1, "ok": True, **self.replies[req["op"]]}
                conn.sendall(json.dumps(reply).encode() + b"\n")


ALICE_PODS = [
    {
        "kind": "job",
        "name": "pn-j42",
        "netns": "/proc/self/ns/net",  # the namespace the CLI runs in: "you are here"
        "ip": "198.18.0.5",
        "user": "alice",
        "uid": 2001,
        "job_id": 42,
        "index": 0,
        "names": ["pod0.train.alice.lab", "pod0.42.alice.lab"],
        "fqdn": "pod0.42.alice.lab",
        "domain": "42.alice.lab",
    },
    {
        "kind": "login",
        "name": "pn-l2001",
        "netns": "/nonexistent/pn-l2001",
        "ip": "198.18.0.9",
        "user": "alice",
        "uid": 2001,
        "names": ["login.login.alice.lab"],
        "fqdn": "login.login.alice.lab",
    },
]
QUOTA = {
    "user": "alice",
    "limited": True,
    "limits": [
        {
            "limit": "containers_per_node",
            "label": "containers per user on a node",
            "value": 32,
            "held": 3,
            "node": "c1",
        },
        {"limit": "logins", "label": "login pods per user", "value": 8, "held": 1},
    ],
}
STATUS = {
    "node": "c1",
    "cluster": "lab",
    "version": __version__,
    "etcd": {"ok": True, "version": "3.5.16"},
    "pods": 7,
    "users": 2,
}


@pytest.fixture
def podnetd(tmp_path: Path) -> FakePodnetd:
    return FakePodnetd(
        tmp_path / "podnetd.sock",
        {"pods": {"pods": ALICE_PODS}, "status": STATUS, "quota": {"quota": QUOTA}},
    )


def test_a_user_sees_their_pods_names_addresses_and_the_one_they_are_in(
    podnetd: FakePodnetd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--socket", str(tmp_path / "podnetd.sock"), "pods"]) == 0
    lines = capsys.readouterr().out.splitlines()
    job = next(x for x in lines if "pn-j42" in x)
    login = next(x for x in lines if "pn-l2001" in x)
    assert job.startswith("* job") and "198.18.0.5" in job and "pod0.42.alice.lab" in job
    assert login.startswith("  login") and "198.18.0.9" in login
    assert cli.main(["--socket", str(tmp_path / "podnetd.sock"), "pods", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [p["here"] for p in got] == [True, False]


def test_a_users_status_shows_their_pods_and_quotas(
    podnetd: FakePodnetd,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cli.os, "geteuid", lambda: 2001)
    assert cli.main(["status", "--socket", str(tmp_path / "podnetd.sock")]) == 0
    out = capsys.readouterr().out
    assert "node c1 (cluster lab), podnetd" in out
    assert "your pods on c1 (name, address; * the one you are in):" in out
    job = next(x for x in out.splitlines() if "pod0.42.alice.lab" in x)
    assert job.startswith("* job 42") and job.rstrip().endswith("198.18.0.5"), job
    assert "login.login.alice.lab" in out and "198.18.0.9" in out
    assert "containers per user on a node (c1)      3 / 32" in out
    assert [r["op"] for r in podnetd.requests] == ["status", "pods", "quota"]
    # root's status lists nobody's pods (root has `podnet pods` for all of them)
    monkeypatch.setattr(cli.os, "geteuid", lambda: 0)
    podnetd.requests.clear()
    assert cli.main(["--socket", str(tmp_path / "podnetd.sock"), "--json", "status"]) == 0
    assert [r["op"] for r in podnetd.requests] == ["status", "quota"]
    assert "my_pods" not in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("cmd", [["pods"], ["status"], ["published"], ["publish", "42", "80"]])
def test_podnetd_not_running_is_one_clear_line_with_the_next_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cmd: list[str]
) -> None:
    missing = tmp_path / "run" / "podnetd.sock"
    assert cli.main(["--socket", str(missing), *cmd]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"podnet: podnetd is not running on this node (no {missing}): ask your "
        "administrators, or `systemctl status podnetd` as root\n"
    )


def test_a_socket_nobody_listens_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "podnetd.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))  # a stale socket file: podnetd was killed
        assert cli.main(["--socket", str(path), "pods"]) == 1
    err = capsys.readouterr().err
    assert f"podnetd is not running on this node (nothing listens on {path})" in err


def test_the_other_ways_podnetd_cannot_be_asked() -> None:
    sock = "/run/podnet/podnetd.sock"
    assert "did not answer in time" in cli.not_reachable(sock, TimeoutError())
    denied = cli.not_reachable(sock, PermissionError(errno.EACCES, "Permission denied"))
    assert denied == f"cannot connect to podnetd at {sock}: permission denied"
    odd = cli.not_reachable(sock, OSError(errno.EIO, "Input/output error"))
    assert odd == f"cannot reach podnetd at {sock}: Input/output error"


def test_the_program_itself_exits_non_zero_without_a_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "agent" / "src")}
    r = subprocess.run(
        [sys.executable, "-m", "podnet.cli.podnet", "--socket", str(tmp_path / "x"), "status"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "podnetd is not running on this node" in r.stderr
