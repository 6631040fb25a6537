# SPDX-License-Identifier: Apache-2.0
"""The destructive playbooks ask first (role hpc.podnet.confirm, docs/admin-guide.md "Day 2").

reset.yml, remove_node.yml and restore.yml, run for real with ansible-playbook against an
inventory whose hosts cannot be reached (SSH to 127.0.0.1 port 1, where nothing listens):
the confirmation play needs no connection, and the first play after it (validate.yml's
preflight) shows whether the run went on. So nothing here can touch a host, whatever the
playbooks do.

- without a terminal and without podnet_confirm=yes: refused, and no later play starts;
- with -e podnet_confirm=yes, or in check mode: no question, the run goes on;
- on a terminal: the question shows what the run does and on which hosts; "yes" goes on,
  anything else stops it.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DESTRUCTIVE = {
    "reset.yml": [],
    "remove_node.yml": ["-e", "podnet_remove_nodes=c1"],
    "restore.yml": ["-e", "podnet_restore_from=/nonexistent/backup"],
}
#: the play every playbook runs right after the confirmation (validate.yml -> preflight.yml)
NEXT_PLAY = "PLAY [Check the targets and the inventory]"
INVENTORY = """\
all:
  vars:
    podnet_cluster_name: t
    ansible_host: 127.0.0.1
    ansible_port: 1
    ansible_connection: ssh
  children:
    etcd: {hosts: {e1: {}}}
    dns: {hosts: {e1: {}}}
    slurmctld: {hosts: {e1: {}}}
    compute: {hosts: {c1: {}, c2: {}}}
    login: {hosts: {l1: {}}}
"""


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_SSH_RETRIES": "0",
    }


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("confirm") / "hosts.yml"
    path.write_text(INVENTORY)
    return path


def _run(inventory: Path, playbook: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BIN / "ansible-playbook", "-i", inventory, ROOT / "playbooks" / playbook, *args],
        env=_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("playbook", sorted(DESTRUCTIVE))
def test_the_confirmation_is_the_first_play_and_ends_the_run(playbook: str) -> None:
    first = yaml.safe_load((ROOT / "playbooks" / playbook).read_text())[0]
    assert [r["role"] for r in first["roles"]] == ["hpc.podnet.confirm"], first
    assert first["any_errors_fatal"] is True
    assert "always" in first["tags"]
    assert "confirm_action" in first["roles"][0]


@pytest.mark.parametrize("playbook", sorted(DESTRUCTIVE))
def test_a_run_without_a_terminal_is_refused(inventory: Path, playbook: str) -> None:
    for extra in ([], ["-e", "podnet_confirm=no"]) if playbook == "reset.yml" else ([],):
        r = _run(inventory, playbook, *DESTRUCTIVE[playbook], *extra)
        assert r.returncode != 0, r.stdout
        assert "Not confirmed: nothing was done." in r.stdout, r.stdout
        assert "-e podnet_confirm=yes" in r.stdout, r.stdout
        assert NEXT_PLAY not in r.stdout, r.stdout


@pytest.mark.parametrize("playbook", sorted(DESTRUCTIVE))
def test_podnet_confirm_yes_and_check_mode_are_not_asked(inventory: Path, playbook: str) -> None:
    more = (["-e", "podnet_confirm=true"], ["--check"]) if playbook == "reset.yml" else ()
    for extra in (["-e", "podnet_confirm=yes"], *more):
        r = _run(inventory, playbook, *DESTRUCTIVE[playbook], *extra)
        assert "Not confirmed" not in r.stdout, (extra, r.stdout)
        # the question was skipped, not asked of a missing terminal
        assert "stdin is not interactive" not in r.stdout + r.stderr, (extra, r.stdout)
        # the run went on to validate.yml, whose hosts are unreachable
        assert NEXT_PLAY in r.stdout, (extra, r.stdout)
        assert "UNREACHABLE" in r.stdout, (extra, r.stdout)


def _on_a_terminal(inventory: Path, playbook: str, answer: str) -> tuple[str, int]:
    """Run the playbook on a pseudo-terminal, type `answer` at the question."""
    argv = [
        str(BIN / "ansible-playbook"),
        "-i",
        str(inventory),
        str(ROOT / "playbooks" / playbook),
        *DESTRUCTIVE[playbook],
    ]
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.execve(argv[0], argv, _env())  # noqa: S606 (the child of pty.fork: fixed argv, no shell)
    out, answered, deadline = b"", False, time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 5)
        if not ready:
            continue
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        out += data
        if not answered and b"Type yes to go on" in out:
            time.sleep(0.3)
            os.write(fd, answer.encode() + b"\r")
            answered = True
    else:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return out.decode(errors="replace"), os.waitstatus_to_exitcode(status)


def test_on_a_terminal_the_question_says_what_and_where_and_yes_goes_on(inventory: Path) -> None:
    out, rc = _on_a_terminal(inventory, "reset.yml", "yes")
    question = out.split("Type yes to go on")[0]
    assert "reset.yml removes podnet from e1, c1, c2, l1" in question, out
    assert "Not confirmed" not in out, out
    assert NEXT_PLAY in out, out
    assert rc != 0  # the hosts are unreachable


def test_on_a_terminal_anything_but_yes_stops(inventory: Path) -> None:
    out, rc = _on_a_terminal(inventory, "remove_node.yml", "y")
    assert "remove_node.yml takes c1 out of cluster t" in out, out
    assert "Not confirmed: nothing was done." in out, out
    assert NEXT_PLAY not in out, out
    assert rc != 0
