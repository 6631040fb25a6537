# SPDX-License-Identifier: Apache-2.0
"""pn_enter_pod_resolver (agent/native/podnet_pod.c), used by the SPANK plugin and
pam_podnet.so: a task entering a pod gets the pod's resolv.conf and its own /sys (only
the pod's interfaces in /sys/class/net; the cgroup tree kept). The driver is
agent/native/tests/pod_resolver_driver.c, built by the native fixture (conftest.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest


def test_pod_resolver_binds_resolv_conf_and_mounts_the_pods_sysfs(native: Path) -> None:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare (mount and network namespaces)")
    exe = native / "pod_resolver_driver"
    sys_mount = _mounts_on("/sys")
    r = subprocess.run(
        ["unshare", "--mount", "--net", "--propagation", "private", str(exe), "pn-j4242"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "resolv nameserver 203.0.113.53" in lines, r.stdout
    assert sorted(ln.split()[1] for ln in lines if ln.startswith("net ")) == ["lo"], r.stdout
    had, has = next(ln for ln in lines if ln.startswith("cgroup ")).split()[1:]
    assert has == had, f"/sys/fs/cgroup lost: {r.stdout}"
    # nothing leaked into this mount namespace: the same /sys, listing this network
    # namespace's own links (labs may add or remove links meanwhile: compared a few times)
    assert _mounts_on("/sys") == sys_mount
    assert any(_sysfs_lists_own_links() for _ in range(5)), os.listdir("/sys/class/net")
    # a bad name is refused before any mount
    r = subprocess.run(
        ["unshare", "--mount", "--net", "--propagation", "private", str(exe), "../x"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 1 and "bad" in r.stdout, r.stdout + r.stderr


def _mounts_on(target: str) -> list[str]:
    """The mountinfo lines of what is mounted on target (mount point is field 5)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return [ln for ln in f if ln.split()[4] == target]


def _sysfs_lists_own_links() -> bool:
    return set(os.listdir("/sys/class/net")) == {name for _, name in socket.if_nameindex()}
