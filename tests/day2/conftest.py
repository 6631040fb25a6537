# SPDX-License-Identifier: Apache-2.0
"""Day-2 playbooks on a lab with jobs running (make test-day2: lab pnd2ci, c3 the node the
tests reset and remove). PODNET_DAY2_LAB names the lab (deployed with site.yml)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
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
