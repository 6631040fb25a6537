# SPDX-License-Identifier: Apache-2.0
"""Day-2 playbooks with a job and an SSH session running (docs/admin-guide.md "Day 2").

One module, tests in order on one lab (make test-day2): alice's 2-node job on c1,c2 runs a
TCP ping loop between its pods (tests/day2/pingloop.py, one attempt every 0.2 s on one
connection) and alice keeps an SSH session open in her login pod, from the first test to
the last. After each playbook the loop must still be answering, and the longest gap
between two answered pings across it must stay under LOSS_BOUND seconds (measured: see
the figures printed with -s and docs/admin-guide.md); the SSH session must still be alive.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from conftest import (
    CLUSTER,
    LAB,
    PORT,
    REPO,
    SPARE,
    Workload,
    etcdctl,
    job_state,
    playbook,
    pods,
    recap,
    ssh,
    wait_for,
)

BACKUP: dict[str, str] = {}


# a key of the snapshot that nothing in podnet writes back: restore alone can bring it back
# (podnetd's record guard puts back its pods' DNS and address records within VERIFY_INTERVAL)
CANARY = f"/podnet-day2-canary/{LAB}"


def test_backup(work: Workload) -> None:
    etcdctl(f"put {CANARY} in-the-backup")
    t0 = time.time()
    out, _ = playbook("backup.yml", "-e", f"podnet_backup_dir={REPO}/build/day2-backups-{LAB}")
    path = out.split("podnet backup: ")[1].split()[0]
    assert (Path(path) / "etcd.db").stat().st_size > 0
    assert (Path(path) / "pki" / "ca.key").exists()
    subprocess.run(["sha256sum", "--check", "--quiet", "SHA256SUMS"], cwd=path, check=True)
    BACKUP["path"] = path
    work.check("backup", t0)


def late_job_facts(job: int) -> dict[str, str]:
    """StartTime, Restarts and JobState of a job (scontrol show job)."""
    out = ssh("login", f"scontrol show job {job}").stdout
    return dict(re.findall(r"\b(StartTime|Restarts|JobState)=(\S+)", out))


def late_job_names(job: int, ips: list[str]) -> None:
    """Both pods' names answer with their addresses: CoreDNS (dig on ctl, by job id and by
    job name) and inside the job (getent hosts in a step on c1, as bob)."""
    for i, ip in enumerate(ips):
        for name in (f"pod{i}.{job}.bob.{CLUSTER}", f"pod{i}.late.bob.{CLUSTER}"):
            dns = ssh("ctl", f"dig +short @127.0.0.1 {name}").stdout.split()
            assert dns == [ip], (name, dns)
    step = ssh(
        "login",
        f"cd /tmp && runuser -u bob -- srun --jobid={job} --overlap -N1 -n1 -w c1 "
        f"getent hosts pod1.{job}.bob.{CLUSTER} pod1",
    ).stdout.split()
    assert step.count(ips[1]) == 2, step


def test_restore_brings_back_deleted_keys_and_keeps_later_jobs(work: Workload) -> None:
    assert BACKUP, "test_backup did not run"
    # bob's 2-node job started after the backup, with a ping loop of its own (c1 -> c2): the
    # snapshot does not know it; it must keep its pods and addresses, names and loop
    script = (
        f"srun --overlap -N1 -n1 -w c2 python3 /tmp/day2loop.py server {PORT} & sleep 3; "
        f"python3 /tmp/day2loop.py client pod1.$SLURM_JOB_ID.bob.{CLUSTER} {PORT} "
        "/tmp/day2loop-$SLURM_JOB_ID.log"
    )
    late = int(
        ssh(
            "login",
            f"cd /tmp && runuser -u bob -- sbatch --parsable -J late -w c1,c2 -N2 "
            f"-o /tmp/day2-%j.out --wrap '{script}'",
        ).stdout.strip()
    )
    loop = Workload(late, work.ssh, work.ssh_log)
    wait_for(lambda: job_state(late) == "RUNNING", 60)
    wait_for(lambda: loop.oks_since(0) >= 10, 90, 1)
    ips = [next(p["ip"] for p in pods(n) if p.get("job_id") == late) for n in ("c1", "c2")]
    wait_for(lambda: late_job_names(late, ips) is None, 60, 2)
    facts = late_job_facts(late)
    rec = f"/skydns/{CLUSTER}/alice/{work.job}/pod0"
    before = etcdctl(f"get {rec} --print-value-only").strip()
    assert before, rec
    ip = next(p["ip"] for p in pods("c1") if p.get("job_id") == work.job)
    # the pod's records deleted too (its podnetd may put them back first: both ways they
    # must be the snapshot's after the restore)
    etcdctl(f"del {rec}")
    etcdctl(f"del /podnet/{CLUSTER}/ips/{ip}")
    etcdctl(f"del {CANARY}")
    assert not etcdctl(f"get {CANARY} --print-value-only").strip()
    t0 = time.time()
    playbook(
        "restore.yml",
        "-e",
        f"podnet_restore_from={BACKUP['path']}",
        "-e",
        "podnet_confirm=yes",
    )
    # the snapshot's keys are back
    assert etcdctl(f"get {CANARY} --print-value-only").strip() == "in-the-backup"
    assert etcdctl(f"get {rec} --print-value-only").strip() == before
    assert etcdctl(f"get /podnet/{CLUSTER}/ips/{ip} --print-value-only").strip()
    dig = ssh("c1", f"dig +short @127.0.0.1 pod0.{work.job}.alice.{CLUSTER} || true").stdout
    dns = ssh("ctl", f"dig +short @127.0.0.1 pod0.{work.job}.alice.{CLUSTER}").stdout
    assert ip in dns, (dig, dns)
    assert any(p.get("job_id") == work.job for p in pods("c1"))
    assert any(p.get("job_id") == work.job for p in pods("c2"))
    # the later job: same pods, same addresses, its records and names written back by the
    # podnetds, its loop kept answering, not requeued
    after = [next(p["ip"] for p in pods(n) if p.get("job_id") == late) for n in ("c1", "c2")]
    print(f"day2: restore: job {late} (after the backup) addresses {ips} -> {after}")
    assert after == ips
    job_rec = json.loads(etcdctl(f"get /podnet/{CLUSTER}/jobs/{late} --print-value-only"))
    assert job_rec["user"] == "bob" and job_rec["size"] == 2, job_rec
    for i, (node, ip) in enumerate(zip(("c1", "c2"), ips, strict=True)):
        marker = etcdctl(f"get /podnet/{CLUSTER}/jobnodes/{late}/{node} --print-value-only")
        assert json.loads(marker) == {"index": i, "ip": ip}, marker
    wait_for(lambda: late_job_names(late, ips) is None, 60, 2)
    assert late_job_facts(late) == facts, (facts, late_job_facts(late))
    assert facts["Restarts"] == "0" and facts["JobState"] == "RUNNING", facts
    loop.check("restore: job after the backup", t0)
    work.check("restore", t0)
    # it ends as usual: its pods and records go
    ssh("login", f"scancel {late}", check=False)
    wait_for(lambda: job_state(late) == "", 120, 2)
    wait_for(lambda: not etcdctl(f"get /podnet/{CLUSTER}/jobs/{late} --print-value-only"), 60, 2)
    state = ssh("login", "sinfo -h -N -n c1 -o %T").stdout
    assert "drain" not in state, state


def slurmctld_process() -> tuple[str, str]:
    """slurmctld's main PID and the time systemd started it."""
    out = ssh(
        "ctl",
        "systemctl show -P MainPID slurmctld; systemctl show -P ExecMainStartTimestamp slurmctld",
    )
    pid, started = out.stdout.strip().splitlines()
    assert int(pid) > 0, out.stdout
    return pid, started


def test_scale_adds_the_spare_node_without_touching_slurmctld(work: Workload) -> None:
    """The SPARE node (a Slurm dynamic node, left out of site.yml by run.sh) joins with
    scale.yml --limit SPARE while the workload runs: slurmctld keeps running (same process),
    alice's job on SPARE gets a pod and reaches her job's pod on c2 by name; a rerun with
    --check --diff changes nothing."""
    assert "pnbr" not in ssh(SPARE, "ip -br link").stdout, f"{SPARE} has podnet before scale.yml"
    ctld = slurmctld_process()
    t0 = time.time()
    out, took = playbook("scale.yml", "--limit", SPARE)
    assert slurmctld_process() == ctld, "slurmctld was restarted"
    assert recap(out)[SPARE]["changed"] > 0, out[-3000:]
    state = ssh("login", f"sinfo -h -N -n {SPARE} -o %T").stdout.strip()
    assert state in ("idle", "mixed", "allocated"), state
    job_out = ssh(
        "alice@login",
        f"cd /tmp && srun -N1 -w {SPARE} -t 2 sh -c \"ip -br -4 addr show eth0; python3 -c '"
        "import socket; s = socket.create_connection("
        f'(\\"pod1.{work.job}.alice.{CLUSTER}\\", {PORT}), timeout=10); '
        's.sendall(b\\"scale\\"); print(s.recv(16))\'"',
        timeout=180,
    ).stdout
    assert "198.18." in job_out or "198.19." in job_out, job_out
    assert "b'scale'" in job_out, job_out
    print(f"day2: scale.yml --limit {SPARE}: {took:.0f} s, slurmctld pid {ctld[0]} kept")
    work.check("scale", t0)
    # a rerun in check mode predicts no change (a plain rerun is the molecule lab's
    # idempotence step, on the same roles)
    out, _ = playbook("scale.yml", "--limit", SPARE, "--check", "--diff")
    assert recap(out)[SPARE]["changed"] == 0, out[-3000:]
    assert slurmctld_process() == ctld, "slurmctld was restarted"


def test_reset_spare_node_leaves_slurm_and_ssh_working(work: Workload) -> None:
    # a podnet job on the spare node first, so that there is something to remove
    ssh("alice@login", f"cd /tmp && srun -N1 -w {SPARE} -t 1 ip -br -4 addr show eth0")
    assert "pnbr" in ssh(SPARE, "ip -br link").stdout
    # scale.yml put Flannel there too (the lab runs it on compute nodes)
    assert "flannel.1" in ssh(SPARE, "ip -br link").stdout
    t0 = time.time()
    playbook("reset.yml", "--limit", SPARE, "-e", "podnet_confirm=yes")
    left = ssh(
        SPARE,
        "ls /etc/systemd/system/podnetd.service /etc/ssh/sshd_config.d/50-podnet.conf "
        "/etc/slurm/plugstack.conf.d/podnet.conf /etc/podnet /usr/local/lib/podnet "
        "/usr/local/lib/security/pam_podnet.so /etc/systemd/system/flanneld.service /etc/flannel "
        "/usr/local/bin/flanneld /etc/apptainer/network/50_flannel.conflist "
        "/etc/apptainer/network/60_podnet.conflist /usr/lib/cni/podnet 2>/dev/null; "
        "grep -c pam_podnet /etc/pam.d/sshd; ip -br link | grep -c '^pn\\|^flannel'; "
        "nft list tables | grep -c podnet; ls /run/netns | wc -l",
        check=False,
    ).stdout.split()
    assert left == ["0", "0", "0", "0"], left
    # Slurm runs plain jobs there (no pod: the job sees the node's own address)
    out = ssh("alice@login", f"cd /tmp && srun -N1 -w {SPARE} -t 1 hostname -I").stdout
    assert out.split() and "198.18." not in out and "198.19." not in out, out
    # root still gets in
    assert ssh(SPARE, "echo in").stdout.strip() == "in"
    out, _ = playbook("reset.yml", "--limit", SPARE, "-e", "podnet_confirm=yes")
    assert recap(out)[SPARE]["changed"] == 0, out[-3000:]
    work.check("reset", t0)


def test_remove_node_leaves_no_key_naming_it(work: Workload) -> None:
    t0 = time.time()
    playbook("remove_node.yml", "-e", f"podnet_remove_nodes={SPARE}", "-e", "podnet_confirm=yes")
    keys = etcdctl(f"get --prefix /podnet/{CLUSTER}/ --keys-only").split()
    assert not [k for k in keys if k.split("/")[-1] == SPARE or f"/{SPARE}/" in k], keys
    blocks = etcdctl(f"get --prefix /podnet/{CLUSTER}/blocks/")
    assert f'"{SPARE}"' not in blocks, blocks
    # its etcd users and role are gone: etcd refuses its certificates before they are revoked
    users, roles = etcdctl("user list").split(), etcdctl("role list").split()
    assert f"podnetd-{SPARE}" not in users and f"flannel-{SPARE}" not in users, users
    assert f"podnet-node-{SPARE}" not in roles, roles
    # SPARE is a Slurm dynamic node (run.sh): deleted from Slurm, its slurmd stopped
    nodes = ssh("login", "sinfo -h -N -o %N").stdout.split()
    assert SPARE not in nodes, nodes
    assert ssh(SPARE, "systemctl is-active slurmd", check=False).stdout.strip() != "active"
    out, _ = playbook(
        "remove_node.yml", "-e", f"podnet_remove_nodes={SPARE}", "-e", "podnet_confirm=yes"
    )
    assert all(c["changed"] == 0 for h, c in recap(out).items() if h != SPARE), out[-3000:]
    work.check("remove_node", t0)


def test_check_mode_is_clean_on_the_converged_cluster(work: Workload) -> None:
    """--check --diff of the destructive playbooks changes nothing and needs no confirmation
    (upgrade.yml --check, which runs every role, is left to `make lab` users: ~5 min here;
    upgrade.yml itself: tests/day2/test_upgrade.py, from version A)."""
    playbook("reset.yml", "--check", "--diff", "--limit", "c1")
    assert ssh("c1", "systemctl is-active podnetd").stdout.strip() == "active"
    assert ssh("c1", "test -e /etc/slurm/plugstack.conf.d/podnet.conf && echo ok").stdout
    playbook("backup.yml", "--check", "--diff")
    work.check("check mode", time.time())
