# SPDX-License-Identifier: Apache-2.0
"""Day-2 playbooks on a lab with jobs running (make test-day2: lab pnd2ci, c3 the node the
tests reset and remove). PODNET_DAY2_LAB names the lab (deployed with site.yml).

The `work` fixture (session scope, shared by every test module here) is alice's 2-node job
with a TCP ping loop between its pods and her open SSH session; `work.check(what, t0)`
asserts both survived what a test did since t0."""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
LAB = os.environ.get("PODNET_DAY2_LAB", "pnd2ci")
CLUSTER = os.environ.get("PODNET_DAY2_CLUSTER", "lab")
#: the node the tests reset and then remove (the 2-node job runs on c1,c2)
SPARE = os.environ.get("PODNET_DAY2_SPARE", "c3")

if os.geteuid() != 0:
    pytest.skip("day-2 tests need root (lab.sh ssh)", allow_module_level=True)
if not Path(f"/var/lib/podnet-lab/{LAB}/lab.env").exists():
    pytest.skip(f"lab {LAB} is not up (make test-day2)", allow_module_level=True)


def lab_env() -> dict[str, str]:
    return {**os.environ, "LAB_NAME": LAB}


def ssh(
    target: str, cmd: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `cmd` (a shell command line) on a lab node as root or as user@node."""
    r = subprocess.run(
        [str(REPO / "tests/lab/lab.sh"), "ssh", target, cmd],
        env=lab_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and r.returncode != 0:
        raise AssertionError(f"{target}: {cmd!r} exited {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def inventory() -> str:
    return subprocess.run(
        [str(REPO / "tests/lab/lab.sh"), "inventory"],
        env=lab_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()


def playbook(name: str, *args: str, timeout: float = 1200) -> tuple[str, float]:
    """ansible-playbook playbooks/NAME on the lab; returns its output and duration (s)."""
    t0 = time.monotonic()
    r = subprocess.run(
        ["ansible-playbook", "-i", inventory(), str(REPO / "playbooks" / name), *args],
        env={**lab_env(), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    took = time.monotonic() - t0
    log = REPO / "tests" / "output" / f"day2-{LAB}-{name}{'-'.join(['', *args])[:60]}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        raise AssertionError(
            f"{name} {args} exited {r.returncode}:\n{r.stdout[-6000:]}\n{r.stderr}"
        )
    print(f"day2: {name} {' '.join(args)}: {took:.0f} s")
    return r.stdout, took


def recap(out: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP counters per host."""
    res: dict[str, dict[str, int]] = {}
    for m in re.finditer(r"^(\S+)\s+:\s+(.*)$", out.rsplit("PLAY RECAP", maxsplit=1)[-1], re.M):
        res[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return res


def wait_for(fn: Any, timeout: float = 60.0, step: float = 0.5) -> Any:
    end = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < end:
        try:
            last = fn()
            if last:
                return last
        except AssertionError as e:
            last = e
        time.sleep(step)
    raise AssertionError(f"timed out; last: {last!r}")


def etcdctl(args: str, check: bool = True) -> str:
    pki = "/etc/podnet/pki"
    return ssh(
        "ctl",
        f"etcdctl --endpoints=https://127.0.0.1:2379 --cacert={pki}/ca.crt "
        f"--cert={pki}/admin.crt --key={pki}/admin.key {args}",
        check=check,
    ).stdout


def job_state(job: int) -> str:
    return ssh("login", f"squeue -h -j {job} -o %T", check=False).stdout.strip()


def pods(node: str) -> list[dict[str, Any]]:
    return list(json.loads(ssh(node, "podnet --json pods").stdout))


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


@pytest.fixture(scope="session")
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
