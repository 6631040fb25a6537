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

import base64
import itertools
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import (
    CLUSTER,
    LAB,
    REPO,
    SPARE,
    etcdctl,
    job_state,
    lab_env,
    playbook,
    pods,
    recap,
    ssh,
    wait_for,
)

#: longest gap (s) between two answered pings that a playbook may cause (stated bound)
LOSS_BOUND = 10.0
PORT = 5555


@dataclass
class Workload:
    job: int
    ssh: subprocess.Popen[str]
    ssh_log: Path
    gaps: dict[str, float] = field(default_factory=dict)

    @property
    def log(self) -> str:
        return f"/tmp/day2loop-{self.job}.log"

    def lines(self) -> list[tuple[float, str]]:
        out = ssh("c1", f"cat {self.log}").stdout
        res = []
        for line in out.splitlines():
            t, _, what = line.partition(" ")
            res.append((float(t), what))
        return res

    def oks_since(self, t0: float) -> int:
        return sum(1 for t, w in self.lines() if t >= t0 and w == "ok")

    def check(self, what: str, t0: float) -> None:
        """The loop answers again after `what` (started at t0), the longest gap between
        answered pings since t0 is below LOSS_BOUND; the SSH session is alive."""
        now = float(ssh("c1", "date +%s.%N").stdout)
        wait_for(lambda: self.oks_since(now) >= 5, 60, 1)
        oks = [t for t, w in self.lines() if t >= t0 - 1 and w == "ok"]
        fails = [w for t, w in self.lines() if t >= t0 and w.startswith("fail")]
        gap = max(b - a for a, b in itertools.pairwise(oks))
        self.gaps[what] = gap
        print(f"day2: {what}: longest gap {gap:.2f} s, {len(fails)} failed pings")
        assert gap < LOSS_BOUND, (what, gap, fails[:5])
        assert job_state(self.job) == "RUNNING"
        assert self.ssh.poll() is None, "alice's SSH session ended"
        before = self.ssh_log.stat().st_size
        wait_for(lambda: self.ssh_log.stat().st_size > before, 10, 0.5)


def copy_loop_script(node: str) -> None:
    b64 = base64.b64encode((Path(__file__).parent / "pingloop.py").read_bytes()).decode()
    ssh(node, f"echo {b64} | base64 -d > /tmp/day2loop.py && chmod 0644 /tmp/day2loop.py")


@pytest.fixture(scope="module")
def work() -> Iterator[Workload]:
    for n in ("c1", "c2"):
        copy_loop_script(n)
    script = (
        f"srun --overlap -N1 -n1 -w c2 python3 /tmp/day2loop.py server {PORT} & sleep 3; "
        f"python3 /tmp/day2loop.py client pod1.$SLURM_JOB_ID.alice.{CLUSTER} {PORT} "
        "/tmp/day2loop-$SLURM_JOB_ID.log"
    )
    out = ssh(
        "login",
        f"cd /tmp && runuser -u alice -- sbatch --parsable -J day2 -w c1,c2 -N2 "
        f"-o /tmp/day2-%j.out --wrap '{script}'",
    ).stdout
    job = int(out.strip().split(";")[0])
    wait_for(lambda: job_state(job) == "RUNNING", 60)
    log = REPO / "tests" / "output" / f"day2-{LAB}-ssh-session.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        sess = subprocess.Popen(
            [
                str(REPO / "tests/lab/lab.sh"),
                "ssh",
                "alice@login",
                "ip -br -4 addr show eth0; while sleep 1; do date +%s; done",
            ],
            env=lab_env(),
            stdout=f,
            stderr=subprocess.STDOUT,
            text=True,
        )
    w = Workload(job, sess, log)
    try:
        wait_for(lambda: w.oks_since(0) >= 10, 90, 1)
        assert "198.1" in log.read_text().split("\n")[0], log.read_text()[:300]
        yield w
    finally:
        sess.kill()
        sess.wait()
        ssh("login", f"scancel {job}", check=False)
        print(f"day2: longest gaps (s): {w.gaps}")


BACKUP: dict[str, str] = {}


def test_backup(work: Workload) -> None:
    t0 = time.time()
    out, _ = playbook("backup.yml", "-e", f"podnet_backup_dir={REPO}/build/day2-backups-{LAB}")
    path = out.split("podnet backup: ")[1].split()[0]
    assert (Path(path) / "etcd.db").stat().st_size > 0
    assert (Path(path) / "pki" / "ca.key").exists()
    subprocess.run(["sha256sum", "--check", "--quiet", "SHA256SUMS"], cwd=path, check=True)
    BACKUP["path"] = path
    work.check("backup", t0)


def test_restore_brings_back_deleted_keys_and_reconciles(work: Workload) -> None:
    assert BACKUP, "test_backup did not run"
    # a job started after the backup: its pod must go (the snapshot does not know it)
    late = int(
        ssh(
            "login",
            "cd /tmp && runuser -u bob -- sbatch --parsable -J late -w c1 -N1 --wrap 'sleep 600'",
        ).stdout.strip()
    )
    wait_for(lambda: any(p.get("job_id") == late for p in pods("c1")), 60)
    rec = f"/skydns/{CLUSTER}/alice/{work.job}/pod0"
    before = etcdctl(f"get {rec} --print-value-only").strip()
    assert before, rec
    ip = next(p["ip"] for p in pods("c1") if p.get("job_id") == work.job)
    etcdctl(f"del {rec}")
    etcdctl(f"del /podnet/{CLUSTER}/ips/{ip}")
    assert not etcdctl(f"get {rec} --print-value-only").strip()
    t0 = time.time()
    playbook(
        "restore.yml",
        "-e",
        f"podnet_restore_from={BACKUP['path']}",
        "-e",
        "podnet_restore_confirm=yes",
    )
    assert etcdctl(f"get {rec} --print-value-only").strip() == before
    assert etcdctl(f"get /podnet/{CLUSTER}/ips/{ip} --print-value-only").strip()
    dig = ssh("c1", f"dig +short @127.0.0.1 pod0.{work.job}.alice.{CLUSTER} || true").stdout
    dns = ssh("ctl", f"dig +short @127.0.0.1 pod0.{work.job}.alice.{CLUSTER}").stdout
    assert ip in dns, (dig, dns)
    # the live job of the snapshot keeps its pods on both nodes; the late job, unknown to
    # the snapshot, was requeued (its pod could not survive) and c1 stays usable
    assert any(p.get("job_id") == work.job for p in pods("c1"))
    assert any(p.get("job_id") == work.job for p in pods("c2"))
    assert "Restarts=1" in ssh("login", f"scontrol show job {late}").stdout
    ssh("login", f"scancel {late}", check=False)
    wait_for(lambda: job_state(late) == "", 120, 2)
    state = ssh("login", "sinfo -h -N -n c1 -o %T").stdout
    assert "drain" not in state, state
    work.check("restore", t0)


def test_reset_spare_node_leaves_slurm_and_ssh_working(work: Workload) -> None:
    # a podnet job on the spare node first, so that there is something to remove
    ssh("alice@login", f"cd /tmp && srun -N1 -w {SPARE} -t 1 ip -br -4 addr show eth0")
    assert "pnbr" in ssh(SPARE, "ip -br link").stdout
    t0 = time.time()
    playbook("reset.yml", "--limit", SPARE, "-e", "podnet_reset_confirm=yes")
    left = ssh(
        SPARE,
        "ls /etc/systemd/system/podnetd.service /etc/ssh/sshd_config.d/50-podnet.conf "
        "/etc/slurm/plugstack.conf.d/podnet.conf /etc/podnet /usr/local/lib/podnet "
        "/usr/local/lib/security/pam_podnet.so 2>/dev/null; grep -c pam_podnet /etc/pam.d/sshd; "
        "ip -br link | grep -c '^pn'; nft list tables | grep -c podnet; ls /run/netns | wc -l",
        check=False,
    ).stdout.split()
    assert left == ["0", "0", "0", "0"], left
    # Slurm runs plain jobs there (no pod: the job sees the node's own address)
    out = ssh("alice@login", f"cd /tmp && srun -N1 -w {SPARE} -t 1 hostname -I").stdout
    assert out.split() and "198.18." not in out and "198.19." not in out, out
    # root still gets in
    assert ssh(SPARE, "echo in").stdout.strip() == "in"
    out, _ = playbook("reset.yml", "--limit", SPARE, "-e", "podnet_reset_confirm=yes")
    assert recap(out)[SPARE]["changed"] == 0, out[-3000:]
    work.check("reset", t0)


def test_remove_node_leaves_no_key_naming_it(work: Workload) -> None:
    t0 = time.time()
    playbook("remove_node.yml", "-e", f"podnet_remove_nodes={SPARE}")
    keys = etcdctl(f"get --prefix /podnet/{CLUSTER}/ --keys-only").split()
    assert not [k for k in keys if k.split("/")[-1] == SPARE or f"/{SPARE}/" in k], keys
    blocks = etcdctl(f"get --prefix /podnet/{CLUSTER}/blocks/")
    assert f'"{SPARE}"' not in blocks, blocks
    state = ssh("login", f"sinfo -h -N -n {SPARE} -o %T").stdout
    assert "drain" in state, state
    out, _ = playbook("remove_node.yml", "-e", f"podnet_remove_nodes={SPARE}")
    assert all(c["changed"] == 0 for h, c in recap(out).items() if h != SPARE), out[-3000:]
    work.check("remove_node", t0)


def test_upgrade_rolling_rerun_keeps_jobs_and_sessions(work: Workload) -> None:
    t0 = time.time()
    playbook(
        "upgrade.yml",
        "--limit",
        f"all:!{SPARE}",
        "-e",
        "podnet_upgrade_serial=1",
        "-e",
        f"podnet_backup_dir={REPO}/build/day2-backups-{LAB}",
    )
    work.check("upgrade", t0)


def test_check_mode_is_clean_on_the_converged_cluster(work: Workload) -> None:
    """--check --diff of the destructive playbooks changes nothing and needs no confirmation
    (upgrade.yml --check, which runs every role, is left to `make lab` users: ~5 min here)."""
    playbook("reset.yml", "--check", "--diff", "--limit", "c1")
    assert ssh("c1", "systemctl is-active podnetd").stdout.strip() == "active"
    assert ssh("c1", "test -e /etc/slurm/plugstack.conf.d/podnet.conf && echo ok").stdout
    playbook("backup.yml", "--check", "--diff")
    work.check("check mode", time.time())
