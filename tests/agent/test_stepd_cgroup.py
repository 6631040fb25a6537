# SPDX-License-Identifier: Apache-2.0
"""The host-side filter's exception for slurmstepd (issue 22, point 4), with real nftables
and cgroups: a user's socket made in the cgroup `podnet-stepd` reaches a pod from the
host network (what slurmstepd of an opt-out step needs to connect to srun in a pod); the
same user's socket made anywhere else does not, and the user cannot join the cgroup.

podnetd makes the cgroup at the top of this machine's cgroup v2 hierarchy (the "nodes"
share the machine's cgroups); it stays (podnetd never removes it), empty."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import Node, sh, wait_for
from test_host_isolation import CONNECT, LISTEN
from test_pods import job_up

USER = 2001
PORT = 7731


def _cgroup() -> Path:
    for d in (Path("/sys/fs/cgroup/podnet-stepd"), Path("/sys/fs/cgroup/unified/podnet-stepd")):
        if d.is_dir():
            return d
    pytest.fail("podnetd made no cgroup podnet-stepd (no cgroup v2 on this machine?)")


def _as_user(node: Node, cgroup: Path | None, *argv: str) -> str:
    """argv as USER on the node's host network; in `cgroup` if given (root moves the
    process there, then drops to the user, as the SPANK plugin does with slurmstepd).
    The move happens before `ip netns exec`, whose fresh /sys has no cgroup mounts."""
    move = f"echo $$ >{cgroup}/cgroup.procs && " if cgroup else ""
    r = sh(
        "sh",
        "-c",
        f"{move}exec ip netns exec {node.netns} "
        f'setpriv --reuid={USER} --regid={USER} --clear-groups "$@"',
        "sh",
        *argv,
        check=False,
    )
    return (r.stdout + r.stderr).strip()


def test_a_user_socket_reaches_a_pod_only_from_the_stepd_cgroup(
    cluster: dict[str, Node], workdir: Path
) -> None:
    n1, n2 = cluster["n1"], cluster["n2"]
    pod: dict[str, Any] = job_up(n1, 7741, "bob", 2002, "stepd", ["n1"])
    cg = _cgroup()
    log = workdir / "stepd-listen.log"
    log.unlink(missing_ok=True)
    n1.pod_exec(
        pod["netns"],
        "sh",
        "-c",
        f'python3 -c "$0" {PORT} {PORT + 1} {log} >/dev/null 2>&1 &',
        LISTEN,
    )
    wait_for(lambda: log.exists() and "ready" in log.read_text(), 10)
    for node in (n1, n2):
        # anywhere else (an opt-out step's task, cron, systemd --user): dropped
        assert _as_user(node, None, "python3", "-c", CONNECT, pod["ip"], str(PORT)).startswith(
            "refused"
        ), node.name
        # slurmstepd's connection to srun: accepted
        got = _as_user(node, cg, "python3", "-c", CONNECT, pod["ip"], str(PORT))
        assert got == "connected", f"{node.name}: {got}"
    # the user cannot put a process of theirs there
    denied = sh(
        "setpriv",
        f"--reuid={USER}",
        f"--regid={USER}",
        "--clear-groups",
        "sh",
        "-c",
        f"echo $$ >{cg}/cgroup.procs && echo joined",
        check=False,
    )
    denied_text = denied.stdout + denied.stderr
    assert "joined" not in denied_text and "Permission denied" in denied_text, denied_text
    arrivals = log.read_text().split()
    assert arrivals.count("tcp") == 2, arrivals  # the two from the cgroup, nothing else
    # the cgroup removed (systemd's shutdown removes empty cgroups; the lab's nodes share
    # one hierarchy) and made again: podnetd notices the new cgroup and reloads its rule
    cg.rmdir()
    cg.mkdir()

    def through() -> bool:
        return _as_user(n1, cg, "python3", "-c", CONNECT, pod["ip"], str(PORT)) == "connected"

    assert wait_for(through, 30, 1)
