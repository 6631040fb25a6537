# SPDX-License-Identifier: Apache-2.0
"""podnetd logs with journald priorities (issue 35, item 6; podnet/logs.py): an error
podnetd logs is in `journalctl -p err -u podnetd`, its info lines are not.

Before, every line reached the journal at priority info (journald's default for a stream),
so `journalctl -p err -u podnetd` showed none of podnetd's errors. The error here is one an
admin meets: podnetd started with a configuration it cannot read. On ctl (no pod of any
user lives there), for a few seconds, through a runtime drop-in that is removed again;
pods and routes stay while podnetd is down (docs/agent.md "Lifecycle").
"""

from __future__ import annotations

import json

from conftest import ssh, wait_for

NODE = "ctl"
DROPIN = "/run/systemd/system/podnetd.service.d/e2e-journal.conf"
MISSING = "/nonexistent/e2e-journal-podnet.yaml"


def journal(since: str, prio: str) -> str:
    return ssh(
        NODE, f"journalctl -u podnetd -p {prio} --since '{since}' --no-pager -o cat", check=False
    ).stdout


def podnetd_ok() -> bool:
    r = ssh(NODE, "podnet --json status", check=False)
    return r.returncode == 0 and json.loads(r.stdout)["etcd"]["ok"]


def test_podnetds_errors_are_errors_in_the_journal_and_its_info_is_not() -> None:
    assert podnetd_ok()
    since = ssh(NODE, "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    exe = ssh(
        NODE, "systemctl cat podnetd | sed -n 's/^ExecStart=\\([^ ]*\\) .*/\\1/p' | head -n1"
    ).stdout.strip()
    assert exe.endswith("/podnetd"), exe
    try:
        ssh(
            NODE,
            f"mkdir -p $(dirname {DROPIN}) && "
            f"printf '[Service]\\nExecStart=\\nExecStart={exe} -c {MISSING}\\n' >{DROPIN} && "
            "systemctl daemon-reload && { systemctl restart podnetd; true; }",
        )
        wanted = f"podnetd: configuration error: {MISSING}: cannot read"
        wait_for(lambda: wanted in journal(since, "err"), 30, 1.0)
    finally:
        ssh(
            NODE,
            f"rm -f {DROPIN}; systemctl daemon-reload; systemctl reset-failed podnetd; "
            "systemctl restart podnetd",
            check=False,
        )
        wait_for(podnetd_ok, 60, 1.0)
    # podnetd's info lines (its start) are in the journal, at info, not at err
    wait_for(lambda: "listening on" in journal(since, "info"), 30, 1.0)
    errors = journal(since, "err")
    assert "listening on" not in errors and "configuration error" in errors, errors


def test_podnetds_unit_points_at_man_pages_that_are_installed() -> None:
    """`Documentation=` names podnetd(8) and podnet(1) (issue 37 item 5), and the roles
    installed them, with podnet-container(1), where man(1) finds them."""
    doc = (
        ssh(NODE, "systemctl show -p Documentation --value podnetd").stdout.replace('"', "").split()
    )
    assert doc == ["man:podnetd(8)", "man:podnet(1)"], doc
    for node, pages in (
        (NODE, ("man8/podnetd.8", "man1/podnet.1")),
        ("login", ("man8/podnetd.8", "man1/podnet.1", "man1/podnet-container.1")),
    ):
        for page in pages:
            head = ssh(node, f"head -c 4096 /usr/local/share/man/{page}").stdout
            name = page.split("/")[1].rsplit(".", 1)
            assert f".TH {name[0].upper()} {name[1]} " in head, (node, page, head[:200])
