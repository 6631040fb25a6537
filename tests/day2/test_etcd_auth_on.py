# SPDX-License-Identifier: Apache-2.0
"""etcd authentication turned on in a running cluster (issue 23): `playbooks/etcd_auth.yml`,
the last step of upgrade.yml (tests/day2/test_upgrade.py upgrades from a podnet that had
it off), run here off and on again while alice's ping loop and SSH session run. The job's
pods keep their traffic (no gap above LOSS_BOUND), podnetd keeps working with its node's
own etcd user (a new job gets its pods, the node's own records are written), and a node's
certificate is refused outside its node's prefixes once it is on."""

from __future__ import annotations

import json
import time

from conftest import CLUSTER, Workload, etcdctl, playbook, recap, ssh, wait_for


def auth_on() -> bool:
    return "Authentication Status: true" in etcdctl("auth status")


def c1_writes(key: str) -> tuple[int, str]:
    conf = ssh("c1", "cat /etc/podnet/podnet.yaml").stdout
    ep = json.loads(next(ln for ln in conf.splitlines() if ln.startswith("etcd_endpoints:"))[16:])[
        0
    ]
    r = ssh(
        "c1",
        f"ETCDCTL_API=3 etcdctl --endpoints={ep} --cacert=/etc/podnet/pki/ca.crt "
        f"--cert=/etc/podnet/pki/podnetd-c1.crt --key=/etc/podnet/pki/podnetd-c1.key "
        f"--command-timeout=5s put {key} x",
        check=False,
    )
    return r.returncode, r.stdout + r.stderr


def test_auth_off_and_on_with_jobs_running(work: Workload) -> None:
    assert auth_on(), "site.yml / upgrade.yml end with etcd authentication on"
    t0 = float(ssh("c1", "date +%s.%N").stdout)
    out, _ = playbook("etcd_auth.yml", "-e", "etcd_auth_enabled=false")
    assert recap(out)["ctl"]["failed"] == 0 and not auth_on()
    # the hole authentication closes: with it off, c1's certificate writes under c2's prefix
    rc, msg = c1_writes(f"/podnet/{CLUSTER}/logins/c2/day2-probe")
    assert rc == 0, msg
    etcdctl(f"del /podnet/{CLUSTER}/logins/c2/day2-probe")
    work.check("etcd authentication off", t0)
    t1 = float(ssh("c1", "date +%s.%N").stdout)
    out, took = playbook("etcd_auth.yml")
    rec = recap(out)
    assert rec["ctl"]["failed"] == 0 and rec["ctl"]["changed"] >= 1, rec
    assert auth_on()
    work.check("etcd authentication on", t1)
    print(f"day2: etcd_auth.yml (on) took {took:.1f} s")
    # a node's certificate is its node's user now
    rc, msg = c1_writes(f"/podnet/{CLUSTER}/logins/c2/day2-probe")
    assert rc != 0 and "permission denied" in msg, msg
    rc, msg = c1_writes(f"/podnet/{CLUSTER}/logins/c1/day2-probe")
    assert rc == 0, msg
    etcdctl(f"del /podnet/{CLUSTER}/logins/c1/day2-probe")
    # and podnetd works with it: a new job of bob on both nodes gets its pods (submitted as
    # bob does: from his SSH session on the login node, his login pod)
    out = ssh(
        "bob@login",
        "cd /tmp && sbatch --parsable -J day2auth -w c1,c2 -N2 "
        "-o /tmp/day2auth-%j.out --wrap 'srun hostname -I; sleep 5'",
    ).stdout
    job = int(out.strip().split(";")[0])
    try:
        wait_for(
            lambda: ssh("login", f"squeue -h -j {job} -o %T", check=False).stdout.strip() == "",
            120,
            1,
        )
        time.sleep(1)
        got = ssh("c1", f"cat /tmp/day2auth-{job}.out").stdout  # the batch host writes it
        assert got.count("198.1") == 2, got  # both tasks in their pods
    finally:
        ssh("login", f"scancel {job}", check=False)
