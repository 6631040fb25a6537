# SPDX-License-Identifier: Apache-2.0
"""upgrade.yml from an older podnet (version A) to this checkout (B) with a job and an SSH
session running (tests/day2/run.sh deploys A from its own sources first and runs this module
in a pytest session of its own, before the other day-2 tests).

A is 2026-11-23's main by default: no gateways, no Flannel, no egress route, a cluster
configuration without B's settings, and the SPANK plugin and PAM module compiled on each
node. B brings all of these (native code from prebuilt artifacts), so every component is
replaced: the podnet wheel, the SPANK plugin, the PAM module and the session helper.
"""

from __future__ import annotations

import os
import time

import pytest
from conftest import CLUSTER, REPO, Workload, playbook, pods, recap, ssh

FROM = os.environ.get("PODNET_DAY2_VERSION_A", "")
if not FROM:
    pytest.skip("the lab runs no version A (PODNET_DAY2_FROM)", allow_module_level=True)

NODES = ("login", "c1", "c2")
#: version B's artifacts (this checkout's `make artifacts`)
ARTIFACTS = REPO / "build" / "artifacts"
NATIVE = {
    "podnet_spank.so": "/usr/local/lib/podnet/podnet_spank.so",
    "podnet-init": "/usr/local/lib/podnet/podnet-init",
    "pam_podnet.so": "/usr/local/lib/security/pam_podnet.so",
}
WHEEL_NOTE = "/opt/podnet/venv/.podnet-wheel"


def version_b() -> dict[str, str]:
    """What B installs: the podnet wheel's SHA256SUMS line and the native binaries' sums."""
    want = {}
    (native,) = ARTIFACTS.glob("podnet-native-*-trixie-amd64-slurm*")
    for line in (native / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        if name in NATIVE:
            want[NATIVE[name]] = digest
    (house,) = ARTIFACTS.glob("podnet-wheelhouse-*")
    sums = (house / "SHA256SUMS").read_text().splitlines()
    want[WHEEL_NOTE] = next(ln for ln in sums if "/podnet-" in ln).strip()
    return want


def installed(node: str) -> dict[str, str]:
    paths = [p for p in version_b() if p != WHEEL_NOTE]
    out = ssh(node, f"sha256sum {' '.join(paths)} 2>/dev/null; true").stdout
    got = {ln.split()[1]: ln.split()[0] for ln in out.splitlines() if ln.strip()}
    got[WHEEL_NOTE] = ssh(node, f"cat {WHEEL_NOTE}", check=False).stdout.strip()
    return got


def test_upgrade_from_version_a_keeps_jobs_and_sessions(work: Workload) -> None:
    want = version_b()
    before = {n: installed(n) for n in NODES}
    for node in NODES:
        assert before[node][WHEEL_NOTE] != want[WHEEL_NOTE], f"{node} runs B's agent already"
    job_pod = next(p for p in pods("c1") if p.get("job_id") == work.job)
    t0 = time.time()
    out, took = playbook(
        "upgrade.yml",
        "--limit",
        "all:!c3",
        "-e",
        "podnet_upgrade_serial=1",
        "-e",
        f"podnet_backup_dir={REPO}/build/day2-backups",
        timeout=2400,
    )
    assert all(r["failed"] == 0 for r in recap(out).values()), out[-3000:]
    work.check("upgrade A -> B", t0)
    for node in NODES:
        assert installed(node) == want, f"{node} does not run version B"
    # the job's pod is the same pod (same address), not a new one
    again = next(p for p in pods("c1") if p.get("job_id") == work.job)
    assert again["ip"] == job_pod["ip"], (job_pod, again)
    # B works for new jobs: a new pod, reaching the running job's pod by name
    name = f"pod1.{work.job}.alice.{CLUSTER}"
    got = ssh(
        "alice@login",
        f"cd /tmp && srun -N1 -w c2 -t 2 sh -c 'ip -br -4 addr show eth0; "
        f"getent hosts {name}; ping -c1 -W5 {name} >/dev/null && echo reached'",
    ).stdout
    assert "reached" in got and "198.1" in got, got
    print(f"day2: upgrade A ({FROM[:12]}) -> B: {took:.0f} s")
