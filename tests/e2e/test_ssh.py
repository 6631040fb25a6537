# SPDX-License-Identifier: Apache-2.0
"""SSH sessions: login pods, joining job pods, refusals, admins never captured."""

from __future__ import annotations

import subprocess
import time

import pytest
from conftest import CLUSTER, LAB, REPO, pod_of, pods, settle_to_job, ssh, wait_for
from test_attack_ssh import ssh_cmd

PING = "ping -c 1 -W 2"


def test_ssh_login_lands_in_login_pod_and_reaches_job_pods(jobs: dict[str, int]) -> None:
    out = ssh(
        "alice@login",
        "ip -br -4 addr show eth0; getent hosts pod0.e2ea; "
        f"{PING} pod1.e2ea.alice.{CLUSTER} >/dev/null && echo REACH",
    ).stdout
    login_ip = out.split()[2].split("/")[0]
    assert login_ip.startswith(("198.18.", "198.19.")), out
    assert pod_of("c1", jobs["alice"])["ip"] in out
    assert "REACH" in out


def test_sbatch_salloc_and_srun_from_the_login_pod() -> None:
    out = ssh("alice@login", "cd /tmp && srun -N2 -w c1,c2 -t 1 hostname | sort").stdout
    assert out.split() == ["c1", "c2"]
    out = ssh("alice@login", "cd /tmp && salloc -N2 -w c1,c2 -t 1 srun hostname | sort").stdout
    assert "c1" in out and "c2" in out
    job = ssh("alice@login", "cd /tmp && sbatch --parsable --wait -N1 -t 1 --wrap true").stdout
    assert job.strip().isdigit(), job


def test_ssh_to_compute_joins_the_job_pod(jobs: dict[str, int]) -> None:
    settle_to_job("alice", "c1", jobs["alice"])
    pod = pod_of("c1", jobs["alice"])
    out = ssh("alice@c1", "ip -br -4 addr show eth0").stdout
    assert pod["ip"] in out


def test_ssh_without_job_is_refused() -> None:
    # LogLevel INFO: the client shows the account stage's message (a banner)
    r = subprocess.run(
        [*ssh_cmd("carol", "c1", loglevel="INFO"), "echo should-not-run"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode != 0
    assert "should-not-run" not in r.stdout
    assert "no running job on this node" in r.stderr, r.stderr


def test_sftp_works(jobs: dict[str, int]) -> None:
    pod = pod_of("c1", jobs["alice"])
    cmd = ssh_cmd("alice", "c1")
    r = subprocess.run(
        ["sftp", *cmd[1:-1], "-b", "-", cmd[-1]],
        input="pwd\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0 and "/home/alice" in r.stdout, r.stdout + r.stderr
    assert pod["ip"] in ssh("alice@c1", "ip -br -4 addr show eth0").stdout


@pytest.mark.parametrize("node", ["login", "c1"])
def test_root_and_admins_never_captured_even_with_podnetd_stopped(node: str) -> None:
    ssh(node, "systemctl stop podnetd")
    try:
        assert "host0" in ssh(f"root@{node}", "ip -br link").stdout
        assert "host0" in ssh(f"labadmin@{node}", "ip -br link").stdout
        # everybody else: refused (sshd_hooks_on_error: refuse)
        r = ssh(f"alice@{node}", "echo should-not-run", check=False)
        assert r.returncode != 0 and "should-not-run" not in r.stdout
    finally:
        ssh(node, "systemctl start podnetd")
    wait_for(lambda: ssh(node, "podnet status", check=False).returncode == 0, 30)


def test_login_pod_released_after_last_session_and_grace() -> None:
    env = {"LAB_NAME": LAB, "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}
    s = subprocess.Popen(
        [str(REPO / "tests/lab/lab.sh"), "ssh", "bob@login", "sleep 30"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: any(p["kind"] == "login" and p["user"] == "bob" for p in pods("login")), 30
        )
        pod = next(p for p in pods("login") if p["kind"] == "login" and p["user"] == "bob")
        # a second, short session does not end the pod
        assert pod["ip"] in ssh("bob@login", "ip -br -4 addr show eth0").stdout
        time.sleep(1)
        assert any(p["user"] == "bob" for p in pods("login"))
    finally:
        s.kill()
        s.wait()
    wait_for(lambda: not any(p["user"] == "bob" for p in pods("login")), 90)
    assert "pn-l2002" not in ssh("login", "ls /run/netns").stdout
