# SPDX-License-Identifier: Apache-2.0
"""What a task sees of its pod (issue 35, item 4; docs/user-guide.md "What a task sees",
"Options from the environment").

Every task and the batch script get PODNET_POD_NAME (the pod's name under the job id),
PODNET_POD_IP and PODNET_JOB_DOMAIN, set by the SPANK plugin from podnetd's reply: they
match what podnetd lists for the job and resolve to the pod's address. A value of the
user's own never passes for the pod's, and a step on the host network gets none. The
option --podnet has an environment form, PODNET=yes|no, that the command line overrides.
"""

from __future__ import annotations

import base64
import ipaddress
import re

from conftest import CLUSTER, POD_CIDR, pod_of, scancel, ssh, wait_for

#: a task's view: node index, the three variables, what the name resolves to, eth0's address
#: (no single quote: it runs in `sh -c '...'` and as a batch script)
LOOK = (
    "echo IDX=$SLURM_NODEID NAME=${PODNET_POD_NAME-unset} IP=${PODNET_POD_IP-unset} "
    "DOMAIN=${PODNET_JOB_DOMAIN-unset} "
    'RESOLVED=$(getent hosts "$PODNET_POD_NAME" | cut -d" " -f1) '
    'ETH0=$(ip -4 -o addr show dev eth0 2>/dev/null | awk "{print \\$4}" | cut -d/ -f1)'
)
PROBE = f"sh -c '{LOOK}'"


def parse(out: str) -> dict[int, dict[str, str]]:
    """PROBE's lines by node index."""
    seen: dict[int, dict[str, str]] = {}
    for line in out.splitlines():
        if not line.startswith("IDX="):
            continue
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        seen[int(fields["IDX"])] = fields
    return seen


def test_each_task_knows_its_pod_name_address_and_job_domain(jobs: dict[str, int]) -> None:
    job = jobs["alice"]
    out = ssh(
        "alice@login",
        f"cd /tmp && srun --jobid={job} --overlap -N2 -n2 -w c1,c2 {PROBE}",
    ).stdout
    seen = parse(out)
    assert sorted(seen) == [0, 1], out
    for i, node in enumerate(("c1", "c2")):
        pod = pod_of(node, job)
        got = seen[i]
        assert got["NAME"] == f"pod{i}.{job}.alice.{CLUSTER}", got
        assert got["NAME"] in pod["names"], (got, pod)
        assert got["DOMAIN"] == f"{job}.alice.{CLUSTER}", got
        assert got["IP"] == pod["ip"] == got["ETH0"], (got, pod)
        assert got["RESOLVED"] == pod["ip"], got
        assert ipaddress.ip_address(got["IP"]) in ipaddress.ip_network(POD_CIDR)


def test_the_batch_script_knows_its_pod() -> None:
    script = base64.b64encode(f"#!/bin/sh\n{LOOK}\nsleep 600\n".encode()).decode()
    out = ssh(
        "alice@login",
        f"cd /tmp && echo {script} | base64 -d >/tmp/e2eenv.sh && "
        "sbatch --parsable -J e2eenv -N1 -w c1 -t 10 -o /tmp/e2eenv-%j.out /tmp/e2eenv.sh",
    ).stdout
    job = int(re.findall(r"\d+", out)[0])
    try:
        wait_for(lambda: ssh("login", f"squeue -h -j {job} -o %T").stdout.strip() == "RUNNING")
        pod = pod_of("c1", job)

        def output() -> str:
            return ssh("c1", f"cat /tmp/e2eenv-{job}.out", check=False).stdout.strip()

        got = parse(wait_for(output, 60))[0]
        assert got["NAME"] == f"pod0.{job}.alice.{CLUSTER}", got
        assert got["IP"] == pod["ip"] == got["RESOLVED"] == got["ETH0"], (got, pod)
        assert got["DOMAIN"] == f"{job}.alice.{CLUSTER}", got
    finally:
        scancel(job)
        ssh("c1", f"rm -f /tmp/e2eenv-{job}.out", check=False)


def test_a_users_own_value_never_passes_for_the_pods(jobs: dict[str, int]) -> None:
    """alice's environment says otherwise: the step's pod wins; a step on the host network
    (`--podnet=no`) is told no pod at all."""
    job = jobs["alice"]
    fake = "PODNET_POD_NAME=pod9.1.bob.x PODNET_POD_IP=203.0.113.250 PODNET_JOB_DOMAIN=1.bob.x"
    out = ssh(
        "alice@login",
        f"cd /tmp && {fake} srun --jobid={job} --overlap -N1 -n1 -w c1 {PROBE}",
    ).stdout
    got = parse(out)[0]
    pod = pod_of("c1", job)
    assert got["NAME"] == f"pod0.{job}.alice.{CLUSTER}" and got["IP"] == pod["ip"], got
    out = ssh(
        "alice@login", f"cd /tmp && {fake} srun --podnet=no -N1 -n1 -w c1 -t 2 {PROBE}"
    ).stdout
    got = parse(out)[0]
    assert (got["NAME"], got["IP"], got["DOMAIN"]) == ("unset",) * 3, got


def test_the_environment_form_of_podnet_opts_out_and_the_command_line_wins() -> None:
    """PODNET=no is --podnet=no (the lab allows opt-out); --podnet=yes overrides it."""
    addr = "ip -4 -o addr show scope global | awk '{print \\$4}' | cut -d/ -f1"
    host = ssh("alice@login", f'cd /tmp && PODNET=no srun -N1 -n1 -w c1 -t 2 sh -c "{addr}"')
    ips = [ipaddress.ip_address(x) for x in host.stdout.split()]
    assert ips and not any(ip in ipaddress.ip_network(POD_CIDR) for ip in ips), host.stdout
    pod = ssh(
        "alice@login",
        f'cd /tmp && PODNET=no srun --podnet=yes -N1 -n1 -w c1 -t 2 sh -c "{addr}"',
    )
    ips = [ipaddress.ip_address(x) for x in pod.stdout.split()]
    assert len(ips) == 1 and ips[0] in ipaddress.ip_network(POD_CIDR), pod.stdout
    bad = ssh("alice@login", "cd /tmp && PODNET=maybe srun -N1 -w c1 -t 2 true", check=False)
    assert bad.returncode != 0 and "PODNET=maybe" in bad.stderr, bad.stderr
