# SPDX-License-Identifier: Apache-2.0
"""Job names private in Slurm too (issue 35, item 3; docs/security.md "Job names in
Slurm"): with name privacy on, bob got NXDOMAIN for alice's job names, yet his
`squeue -o '%i %u %j'` printed `4 alice secretproj` and `scontrol show job 4` printed
`JobName=secretproj`. The slurm role now writes PrivateData=jobs: bob sees his own jobs
only, alice hers, and `sinfo` is unchanged for both."""

from __future__ import annotations

from conftest import ssh


def test_bob_sees_neither_alices_job_nor_its_name(jobs: dict[str, int]) -> None:
    alice, bob = jobs["alice"], jobs["bob"]
    out = ssh("bob@login", "squeue -h -o '%i %u %j'").stdout
    rows = [line.split() for line in out.splitlines()]
    assert [str(bob), "bob", "e2eb"] in rows, out  # his own, with its name
    assert "e2ea" not in out and "alice" not in out, out
    assert str(alice) not in [r[0] for r in rows], out
    shown = ssh("bob@login", f"scontrol show job {alice}", check=False)
    assert "e2ea" not in shown.stdout + shown.stderr, shown
    assert "JobName=" not in shown.stdout, shown.stdout
    # alice still sees hers in full
    assert "JobName=e2ea" in ssh("alice@login", f"scontrol show job {alice}").stdout
    out = ssh("alice@login", "squeue -h -o '%i %u %j'").stdout
    assert [str(alice), "alice", "e2ea"] in [line.split() for line in out.splitlines()], out
    assert "e2eb" not in out, out


def test_sinfo_stays_usable_for_users() -> None:
    for user in ("alice", "bob"):
        nodes = ssh(f"{user}@login", "sinfo -h -N -o '%N %T'").stdout.split()
        assert "c1" in nodes and "c2" in nodes, nodes


def test_the_running_slurm_has_private_jobs() -> None:
    conf = ssh("login", "scontrol show config | grep -i '^PrivateData'").stdout
    assert "jobs" in [x.strip() for x in conf.split("=", 1)[1].split(",")], conf
