# SPDX-License-Identifier: Apache-2.0
"""Pods are PID namespaces too: PID 1 is podnet-init, a step sees its job's processes only.

alice runs a 2-node batch job (`sleep 600` on c1, the batch host) and a second job on
c1 (`sleep 601`); bob's session job also sleeps on c1. Steps are launched into the
first job with `srun --jobid --overlap`.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator

import pytest
from conftest import pods, running_jobs, sbatch, scancel, ssh, wait_for

if re.search(
    r"^NamespaceType\s*=\s*namespace/linux",
    ssh("login", "scontrol show config", check=False).stdout,
    re.M,
):
    pytest.skip(
        "Slurm's namespace/linux makes the job's PID namespace (PID 1 is not podnet-init) and "
        "a private /tmp: tests/e2e/test_slurm_namespace.py checks that lab",
        allow_module_level=True,
    )


def step(job: int, cmd: str, user: str = "alice", check: bool = True, node: str = "c1") -> str:
    r = ssh(
        f"{user}@login",
        f"cd /tmp && srun --jobid={job} --overlap -N1 -n1 -w {node} {cmd}",
        check=check,
        timeout=120,
    )
    return r.stdout + (r.stderr if not check else "")


def ps(job: int) -> list[tuple[int, str, str]]:
    """(pid, user, args) of every process a step of `job` on c1 sees."""
    out = step(job, "ps -e -o pid=,user=,args=")
    rows = []
    for line in out.splitlines():
        pid, user, args = line.split(None, 2)
        rows.append((int(pid), user, args))
    return rows


@pytest.fixture(scope="module")
def two_jobs() -> Iterator[dict[str, int]]:
    with running_jobs(
        a1=("alice", "pida1", "c1,c2", "sleep 600"),
        a2=("alice", "pida2", "c1", "sleep 601"),
        b=("bob", "pidb", "c1", "sleep 602"),
    ) as j:
        yield j


def test_a_step_sees_only_its_job_and_pid_1_is_the_pod_init(two_jobs: dict[str, int]) -> None:
    rows = ps(two_jobs["a1"])
    assert rows[0][0] == 1 and "podnet-init" in rows[0][2], rows
    args = [a for _, _, a in rows]
    # the batch script's sleep (another step of the same job) is there
    assert any(a == "sleep 600" for a in args), rows
    # not alice's other job, not bob's job, not the node's daemons
    assert not any(a in ("sleep 601", "sleep 602") for a in args), rows
    names = {a.split()[0].rsplit("/", 1)[-1] for a in args}
    assert not names & {"slurmd", "slurmstepd", "sshd", "podnetd", "systemd"}, rows
    assert {u for _, u, _ in rows[1:]} == {"alice"}, rows
    # same on the second node (no batch script there)
    out = step(two_jobs["a1"], "ps -e -o pid=,args=", node="c2")
    assert re.match(r"\s*1 .*podnet-init", out), out


def test_two_steps_of_a_job_see_each_other(two_jobs: dict[str, int]) -> None:
    job = two_jobs["a1"]
    ssh(
        "alice@login",
        f"cd /tmp && setsid -f srun --jobid={job} --overlap -N1 -n1 -w c1 "
        "sleep 4242 >/dev/null 2>&1 </dev/null",
    )
    wait_for(lambda: any(a.endswith("sleep 4242") for _, _, a in ps(job)), 60)
    # and the other job of alice does not see it
    assert not any(a.endswith("sleep 4242") for _, _, a in ps(two_jobs["a2"]))


def test_kill_all_in_a_step_kills_only_that_jobs_processes(two_jobs: dict[str, int]) -> None:
    """kill -9 -1 as alice: without a PID namespace it kills every process of alice on
    the node, her other job's included."""
    job = sbatch("alice", "pidkill", nodes="c1", script="sleep 603")
    try:
        step(job, "sh -c 'kill -9 -1'", check=False)
        assert any(a == "sleep 601" for _, _, a in ps(two_jobs["a2"])), "her other job was hit"
        assert ssh("login", f"squeue -h -j {two_jobs['a2']} -o %T").stdout.strip() == "RUNNING"
    finally:
        scancel(job)


def test_exit_codes_and_signals_come_through(two_jobs: dict[str, int]) -> None:
    job = two_jobs["a1"]
    r = ssh(
        "alice@login",
        f"cd /tmp && srun --jobid={job} --overlap -N1 -n1 -w c1 sh -c 'exit 3'",
        check=False,
    )
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    # scancel --signal=USR1 reaches the task
    script = (
        "#!/bin/sh\n"
        'srun -N1 -n1 sh -c \'trap "echo got-usr1; exit 7" USR1; '
        "echo ready; while :; do sleep 1; done'\n"
        "echo srun-rc=$?\n"
    )
    b64 = base64.b64encode(script.encode()).decode()
    ssh("login", f"echo {b64} | base64 -d >/tmp/pid-usr1.sh && chmod 0755 /tmp/pid-usr1.sh")
    out = ssh(
        "alice@login",
        "cd /tmp && sbatch --parsable -J pidusr1 -w c1 -N1 "
        "-o /tmp/pid-usr1-%j.out /tmp/pid-usr1.sh",
    ).stdout
    sig = int(re.findall(r"\d+", out)[0])

    def output() -> str:  # written by the batch step on c1
        return str(ssh("c1", f"cat /tmp/pid-usr1-{sig}.out", check=False).stdout)

    try:
        wait_for(lambda: "ready" in output())
        ssh("login", f"scancel --signal=USR1 {sig}.0")
        text = wait_for(lambda: "srun-rc=" in (o := output()) and o, 60)
        assert "got-usr1" in text and "srun-rc=7" in text, text
    finally:
        scancel(sig)


def test_job_end_removes_the_pid_namespace_and_its_init() -> None:
    job = sbatch("carol", "pidend", nodes="c1", script="sleep 600")
    try:
        assert ssh("c1", f"test -e /run/podnet/pidns/pn-j{job}", check=False).returncode == 0
        init_pid = ssh("c1", f"cut -d' ' -f1 /run/podnet/pidns/pn-j{job}.init").stdout.strip()
        # an orphan left behind by a step (its parent exits at once)
        step(job, "sh -c 'sleep 4343 >/dev/null 2>&1 </dev/null &'", user="carol")
    finally:
        scancel(job)
    wait_for(
        lambda: ssh("c1", f"test -e /run/podnet/pidns/pn-j{job}", check=False).returncode != 0, 60
    )
    left = ssh("c1", f"ps -o pid= -p {init_pid}; pgrep -f 'sleep 4343'", check=False).stdout
    assert left.strip() == "", left


def test_ssh_into_a_compute_node_lands_in_a_jobs_pid_namespace(two_jobs: dict[str, int]) -> None:
    """pam_podnet puts the session into one of alice's job pods on c1: its PID
    namespace too, /proc included."""
    out = ssh("alice@c1", "ps -e -o pid=,args=").stdout
    rows = [line.split(None, 1) for line in out.splitlines()]
    assert rows[0][0] == "1" and "podnet-init" in rows[0][1], out
    args = [a for _, a in rows]
    assert ("sleep 600" in args) != ("sleep 601" in args), out
    assert "sleep 602" not in args, out
    assert not any(a.startswith(("/usr/sbin/sshd", "sshd:")) and "[priv]" in a for a in args), out


def test_a_login_pod_is_a_pid_namespace_too() -> None:
    """SSH sessions on the login node share their user's login pod: PID 1 is the pod's
    init, the user's other sessions are there, another user's are not, nor the host's."""
    bg = "nohup setsid sleep {} >/dev/null 2>&1 </dev/null &"
    try:
        ssh("bob@login", bg.format(1202))
        ssh("alice@login", bg.format(1201))
        out = ssh("alice@login", "ps -e -o pid=,args=").stdout
        rows = [line.split(None, 1) for line in out.splitlines()]
        assert rows[0][0] == "1" and "podnet-init" in rows[0][1], out
        args = [a for _, a in rows]
        assert "sleep 1201" in args, out  # left by an earlier session of hers
        assert "sleep 1202" not in args, out
        assert not any("slurmctld" in a or "systemd-journald" in a for a in args), out
    finally:
        ssh("login", "pkill -f '^sleep 120[12]$'", check=False)


def test_srun_pty_gets_a_terminal_in_the_pod(two_jobs: dict[str, int]) -> None:
    """`srun --pty` (script(1) gives srun the terminal a user would have)."""
    job = two_jobs["a1"]
    inner = (
        "srun --jobid={} --overlap -N1 -n1 -w c1 --pty sh -c 'tty; ps -e -o pid=,comm= | head -1'"
    )
    out = ssh(
        "alice@login",
        f'cd /tmp && script -qec "{inner.format(job)}" /dev/null',
        timeout=120,
    ).stdout
    # Slurm 26.05's srun --pty echoes a NUL first (^@), with or without podnet
    assert re.search(r"^(\^@)?/dev/pts/\d+\s*$", out, re.M), out
    assert re.search(r"\s1 podnet-init\s*$", out, re.M), out


def test_ctrl_c_twice_ends_the_step_and_its_processes(two_jobs: dict[str, int]) -> None:
    """Two SIGINTs within a second to srun (Ctrl-C twice) end the step: no task
    process is left in the pod."""
    job = two_jobs["a1"]
    script = (
        f"srun --jobid={job} --overlap -N1 -n1 -w c1 sh -c "
        "'echo ready; exec sleep 4545' >/tmp/pid-int.out 2>&1 & p=$!\n"
        "until grep -q ready /tmp/pid-int.out 2>/dev/null; do sleep 0.2; done\n"
        "kill -INT $p; sleep 0.3; kill -INT $p; wait $p; echo srun-rc=$?\n"
    )
    b64 = base64.b64encode(script.encode()).decode()
    ssh("login", "rm -f /tmp/pid-int.out")  # an earlier run's, maybe not alice's
    out = ssh(
        "alice@login",
        f"cd /tmp && f=$(mktemp) && echo {b64} | base64 -d >$f && timeout 120 sh $f; rm -f $f",
        timeout=150,
    ).stdout
    rc = int(out.split("srun-rc=")[1].split()[0])
    assert rc != 0, out
    wait_for(lambda: ssh("c1", "pgrep -f 'sleep 4545'", check=False).returncode == 1, 60)


def test_sstat_shows_the_memory_of_a_step_in_the_pod(two_jobs: dict[str, int]) -> None:
    """Accounting (jobacct_gather/linux) sees the tasks forked into the pod."""
    job = two_jobs["a1"]
    prog = "import time; b = bytearray(96 << 20); print('ready', flush=True); time.sleep(90)"
    script = (
        f'srun --jobid={job} --overlap -N1 -n1 -w c1 -J pidmem python3 -c "{prog}" '
        ">/tmp/pid-mem.out 2>&1 &\n"
        "until grep -q ready /tmp/pid-mem.out 2>/dev/null; do sleep 0.2; done\n"
        f"s=$(squeue -h -s -j {job} -o '%i %j' | awk '$2 == \"pidmem\" {{print $1}}')\n"
        "echo step=$s\n"
        "sstat -n -P -j $s -o MaxRSS\n"
        "scancel $s\n"
    )
    b64 = base64.b64encode(script.encode()).decode()
    ssh("login", "rm -f /tmp/pid-mem.out")  # an earlier run's, maybe not alice's
    out = ssh(
        "alice@login",
        f"cd /tmp && f=$(mktemp) && echo {b64} | base64 -d >$f && timeout 120 sh $f; rm -f $f",
        timeout=150,
    ).stdout
    m = re.search(r"^(\d+)([KMG])\s*$", out, re.M)
    assert m, out
    kib = int(m.group(1)) * {"K": 1, "M": 1024, "G": 1024 * 1024}[m.group(2)]
    assert kib >= 96 * 1024, out


def test_time_limit_ends_the_step_its_processes_and_the_pod() -> None:
    """A job over its time limit (1 minute, the smallest Slurm has) ends: slurmd signals the
    step's tasks in the pod's PID namespace, and the pod goes with the job."""
    out = ssh(
        "carol@login",
        "cd /tmp && sbatch --parsable -J pidtime -w c1 -N 1 -t 1 "
        "-o /tmp/pidtime-%j.out --wrap 'srun sleep 4545'",
    ).stdout
    job = int(re.findall(r"\d+", out)[0])
    try:
        wait_for(lambda: ssh("c1", "pgrep -f 'sleep 4545'", check=False).returncode == 0, 60)
        # Slurm checks time limits every 30 s and waits KillWait (30 s) after SIGTERM
        state = wait_for(
            lambda: (
                (s := ssh("login", f"squeue -h -t all -j {job} -o %T").stdout.strip())
                not in ("", "RUNNING", "PENDING", "COMPLETING", "CONFIGURING")
                and s
            ),
            240,
            2,
        )
        assert state == "TIMEOUT", state
        wait_for(lambda: ssh("c1", "pgrep -f 'sleep 4545'", check=False).returncode != 0, 60)
        wait_for(
            lambda: ssh("c1", f"test -e /run/podnet/pidns/pn-j{job}", check=False).returncode != 0,
            60,
        )
        assert not any(p.get("job_id") == job for p in pods("c1"))
        text = ssh("c1", f"cat /tmp/pidtime-{job}.out", check=False).stdout
        assert "TIME LIMIT" in text, text
    finally:
        scancel(job)
