# SPDX-License-Identifier: Apache-2.0
"""`podnet` as a user meets it (issue 35, item 4; docs/user-guide.md "`podnet`: your pods
from the command line"): alice over SSH on login, in her login pod."""

from __future__ import annotations

from conftest import ssh


def test_alice_sees_her_login_pod_marked_with_its_name_and_address() -> None:
    mine = ssh("alice@login", "ip -4 -o addr show dev eth0 | awk '{print $4}' | cut -d/ -f1")
    ip = mine.stdout.strip()
    pods = ssh("alice@login", "podnet pods").stdout.splitlines()
    here = [x for x in pods if x.startswith("*")]
    assert len(here) == 1 and here[0].split()[1] == "login", pods
    assert ip in here[0].split() and "login.login.alice." in here[0], here
    assert all(" alice " in x for x in pods[1:]), pods  # hers only
    status = ssh("alice@login", "podnet status").stdout
    assert "your pods on login (name, address; * the one you are in):" in status, status
    row = next(x for x in status.splitlines() if x.startswith("* login"))
    assert row.rstrip().endswith(ip), row
    assert "quotas of alice (held / limit):" in status


def test_podnet_alone_lists_the_commands_and_knows_its_version() -> None:
    r = ssh("alice@login", "podnet", check=False)
    assert r.returncode == 2 and "required" not in r.stdout + r.stderr, r
    assert "commands:" in r.stdout and "status" in r.stdout, r.stdout
    v = ssh("alice@login", "podnet --version").stdout.strip()
    assert v.startswith("podnet ") and v.split()[1][0].isdigit(), v


def test_a_socket_without_podnetd_is_one_line_with_the_next_step() -> None:
    r = ssh("alice@login", "podnet --socket /run/podnet/nothing.sock status", check=False)
    assert r.returncode == 1, r
    line = (
        "podnet: podnetd is not running on this node (no /run/podnet/nothing.sock): ask your "
        "administrators, or `systemctl status podnetd` as root"
    )
    assert line in r.stderr.splitlines() and "Traceback" not in r.stderr, r.stderr
