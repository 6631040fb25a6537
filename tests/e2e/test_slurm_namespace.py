# SPDX-License-Identifier: Apache-2.0
"""podnet composed with Slurm's namespace/linux (Slurm >= 25.11, CLONE_NEWPID): the job's
PID namespace, made by Slurm, is the pod's (docs/agent.md "PID namespace").

Runs only on a lab whose Slurm runs namespace/linux with a PID namespace per job: the
LAB_SLURM=sid lab (Slurm 26.05) configured as docs/lab.md "Slurm from sid" says, e.g.

    PODNET_E2E_LAB=pns26 .venv/bin/python -m pytest -q tests/e2e/test_slurm_namespace.py

Checks: every step's tasks on a node (batch script and srun steps) and an SSH session
adopted into the job (pam_podnet) share one PID namespace, whose PID 1 is Slurm's
`slurmstepd: [<job>:namespace]`, pinned by podnetd as the pod's; the tasks are in the
pod's network namespace; `ps -e` shows the job only; no step fails.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator

import pytest
from conftest import pod_of, running_jobs, sbatch, scancel, ssh, wait_for

_conf = ssh("login", "scontrol show config", check=False).stdout
if not re.search(r"^NamespaceType\s*=\s*namespace/linux", _conf, re.M):
    pytest.skip(
        "the lab's Slurm does not run namespace/linux (Slurm >= 25.11 with "
        "NamespaceType=namespace/linux: LAB_SLURM=sid lab, docs/lab.md)",
        allow_module_level=True,
    )
if "CLONE_NEWPID" not in ssh("c1", "cat /etc/slurm/namespace.yaml", check=False).stdout:
    pytest.skip(
        "namespace.yaml on c1 makes no PID namespace (clone_ns_flags)", allow_module_level=True
    )


def step(job: int, cmd: str, node: str = "c1", user: str = "alice") -> str:
    r = ssh(
        f"{user}@login",
        f"cd /tmp && srun --jobid={job} --overlap -N1 -n1 -w {node} {cmd}",
        timeout=120,
    )
    return r.stdout


def rows(out: str) -> list[tuple[int, str]]:
    return [(int(p), a) for p, a in (ln.split(None, 1) for ln in out.splitlines() if ln.strip())]


@pytest.fixture(scope="module")
def jobs() -> Iterator[dict[str, int]]:
    with running_jobs(
        a1=("alice", "nsa1", "c1,c2", "sleep 700"),
        a2=("alice", "nsa2", "c1", "sleep 701"),
        b=("bob", "nsb", "c1", "sleep 702"),
    ) as j:
        yield j


def test_the_pods_pid_namespace_is_the_jobs(jobs: dict[str, int]) -> None:
    job = jobs["a1"]
    for node in ("c1", "c2"):
        out = step(job, "sh -c 'readlink /proc/self/ns/pid; ps -e -o pid=,args='", node=node)
        ns, ps = out.split("\n", 1)
        # PID 1 is Slurm's namespace init, not podnet-init
        first = rows(ps)[0]
        assert first[0] == 1 and f"[{job}:namespace]" in first[1], out
        # podnetd pinned that namespace as the pod's
        pinned = ssh(node, f"stat -L -c %i /run/podnet/pidns/pn-j{job}").stdout.strip()
        assert ns.strip() == f"pid:[{pinned}]", (ns, pinned)
        assert ssh(node, f"test -e /run/podnet/pidns/pn-j{job}.init", check=False).returncode != 0


def test_a_step_sees_only_its_job(jobs: dict[str, int]) -> None:
    args = [a for _, a in rows(step(jobs["a1"], "ps -e -o pid=,args="))]
    assert "sleep 700" in args, args  # the batch script's, another step of the job
    assert not {"sleep 701", "sleep 702"} & set(args), args
    names = {a.split()[0].rsplit("/", 1)[-1] for a in args[1:]}
    assert not names & {"slurmd", "sshd", "podnetd", "systemd", "podnet-init"}, args


def test_steps_are_in_the_pods_network_namespace(jobs: dict[str, int]) -> None:
    job = jobs["a1"]
    for node in ("c1", "c2"):
        ip = pod_of(node, job)["ip"]
        out = step(job, "ip -4 -o addr show dev eth0", node=node)
        assert f" {ip}/" in out, (node, ip, out)


def test_two_steps_and_an_ssh_session_share_one_pid_namespace(jobs: dict[str, int]) -> None:
    job = jobs["a1"]
    ssh(
        "alice@login",
        f"cd /tmp && setsid -f srun --jobid={job} --overlap -N1 -n1 -w c1 "
        "sleep 4747 >/dev/null 2>&1 </dev/null",
    )
    wait_for(lambda: "sleep 4747" in step(job, "ps -e -o args="), 60)
    ns = step(job, "readlink /proc/self/ns/pid").strip()
    # alice's SSH session on c1 lands in one of her job pods (pam_podnet): with a2 also
    # running there, it may be either; whichever it is, it is that job's Slurm namespace
    out = ssh("alice@c1", "readlink /proc/self/ns/pid; ps -e -o pid=,args=").stdout
    sess_ns, ps = out.split("\n", 1)
    args = [a for _, a in rows(ps)]
    if "sleep 700" in args:
        assert sess_ns.strip() == ns and "sleep 4747" in args, out
    else:
        assert "sleep 701" in args and f"[{jobs['a2']}:namespace]" in args[0], out
    assert "sleep 702" not in args, out


def test_scancel_signal_reaches_the_task() -> None:
    """scancel --signal=USR1 reaches a task in the job's namespace; srun gets its exit code.
    Output goes to /var/tmp: namespace/linux gives the job a private /tmp."""
    script = (
        "#!/bin/sh\n"
        'srun -N1 -n1 sh -c \'trap "echo got-usr1; exit 7" USR1; '
        "echo ready; while :; do sleep 1; done'\n"
        "echo srun-rc=$?\n"
    )
    b64 = base64.b64encode(script.encode()).decode()
    ssh("login", f"echo {b64} | base64 -d >/var/tmp/ns-usr1.sh && chmod 0755 /var/tmp/ns-usr1.sh")
    out = ssh(
        "alice@login",
        "cd /var/tmp && sbatch --parsable -J nsusr1 -w c1 -N1 "
        "-o /var/tmp/ns-usr1-%j.out /var/tmp/ns-usr1.sh",
    ).stdout
    job = int(re.findall(r"\d+", out)[0])

    def output() -> str:
        return str(ssh("c1", f"cat /var/tmp/ns-usr1-{job}.out", check=False).stdout)

    try:
        wait_for(lambda: "ready" in output(), 90)
        ssh("login", f"scancel --signal=USR1 {job}.0")
        text = wait_for(lambda: "srun-rc=" in (o := output()) and o, 60)
        assert "got-usr1" in text and "srun-rc=7" in text, text
    finally:
        scancel(job)


def test_exit_codes_come_through() -> None:
    job = sbatch("carol", "nsexit", nodes="c1", script="sleep 600")
    try:
        r = ssh(
            "carol@login",
            f"cd /tmp && srun --jobid={job} --overlap -N1 -n1 -w c1 sh -c 'exit 5'",
            check=False,
        )
        assert r.returncode == 5, (r.returncode, r.stdout, r.stderr)
    finally:
        scancel(job)
    wait_for(
        lambda: ssh("c1", f"test -e /run/podnet/pidns/pn-j{job}", check=False).returncode != 0, 60
    )
