# SPDX-License-Identifier: Apache-2.0
"""podnet-init (agent/native/podnet_init.c) with podnetd's side (podnet.kernel.pidns), for real:
a PID namespace whose PID 1 is the init, pinned on a file, orphans reaped, everything in
it killed when the pod goes, and a recycled PID never signalled."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nativelib import cc, make
from podnet.kernel.pidns import PidNamespaces

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (unshare, mount)")


@pytest.fixture(scope="module")
def init(tmp_path_factory: pytest.TempPathFactory) -> str:
    cc()
    out = tmp_path_factory.mktemp("init")
    r = make(f"O={out}/", "init")
    assert r.returncode == 0, r.stdout + r.stderr
    return str(out / "podnet-init")


@pytest.fixture
def pidns(init: str, tmp_path: Path) -> Iterator[PidNamespaces]:
    p = PidNamespaces(str(tmp_path / "pidns"), init)
    yield p
    for f in (tmp_path / "pidns").glob("pn-*"):
        if "." not in f.name:
            p.remove(f.name)


def nspid(pid: int) -> list[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return [int(x) for x in line.split()[1:]]
    raise AssertionError("no NSpid")


def wait_gone(pid: int, timeout: float = 10) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":  # a zombie of ours (subprocess child): dead
            return True
        time.sleep(0.05)
    return False


def test_usage_errors_are_clear(init: str) -> None:
    r = subprocess.run([init], capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "usage: podnet-init NAME" in r.stderr
    r = subprocess.run([init, "x", "/nonexistent"], capture_output=True, text=True, check=False)
    assert r.returncode == 1 and "mount proc on /nonexistent" in r.stderr


def test_pod_init_is_pid_1_of_a_pinned_namespace(pidns: PidNamespaces) -> None:
    pid = pidns.create("pn-t1")
    assert pid is not None
    assert nspid(pid) == [pid, 1]
    assert os.stat(pidns.path("pn-t1")).st_ino == os.stat(f"/proc/{pid}/ns/pid").st_ino
    assert pidns.init_pid("pn-t1") == pid
    # the namespace's proc, for SSH sessions: PID 1 there is the init
    assert Path(pidns.dir / "pn-t1.proc" / "1" / "comm").read_text().strip() == "podnet-init"
    # a process joining the namespace is a child of nobody it can see, PID > 1
    r = subprocess.run(
        ["nsenter", f"--pid={pidns.path('pn-t1')}", "--", "sh", "-c", "echo $$"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(r.stdout) > 1


def test_orphans_are_reaped_and_removal_kills_everything_inside(pidns: PidNamespaces) -> None:
    pid = pidns.create("pn-t2")
    assert pid is not None
    path = str(pidns.path("pn-t2"))
    # an orphan that exits at once (must be reaped, not left a zombie) and one that stays
    subprocess.run(
        ["nsenter", f"--pid={path}", "--", "sh", "-c", "(sleep 0.2 &) ; (sleep 4747 &)"],
        check=True,
    )
    time.sleep(1)
    kids = [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    states = {k: Path(f"/proc/{k}/stat").read_text().rsplit(")", 1)[1].split()[0] for k in kids}
    assert len(kids) == 1 and "Z" not in states.values(), states
    stayer = kids[0]
    assert pidns.remove("pn-t2")
    assert wait_gone(pid) and wait_gone(stayer)
    assert not Path(path).exists() and pidns.init_pid("pn-t2") is None
    assert not (pidns.dir / "pn-t2.proc").exists()


def test_a_recycled_pid_is_not_signalled(pidns: PidNamespaces, tmp_path: Path) -> None:
    victim = subprocess.Popen(["sleep", "60"])
    try:
        pidns.dir.mkdir(parents=True, exist_ok=True)
        (pidns.dir / "pn-t3.init").write_text(f"{victim.pid} 1\n")  # wrong start time
        assert pidns.init_pid("pn-t3") is None
        pidns.remove("pn-t3")
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_disabled_without_an_init(tmp_path: Path) -> None:
    assert PidNamespaces(str(tmp_path), "").create("pn-t4") is None
    assert PidNamespaces(str(tmp_path), str(tmp_path / "missing")).create("pn-t4") is None


def test_adopt_makes_a_foreign_pid_namespace_the_pods(pidns: PidNamespaces) -> None:
    """Slurm's namespace/linux: the job's PID namespace (its PID 1 not ours) becomes the
    pod's: pinned, its proc mounted (podnet-init --join), the pod's own init gone, and
    removing the pod does not kill the foreign PID 1 (Slurm ends it with the job)."""
    own = pidns.create("pn-t5")
    assert own is not None
    foreign = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "sleep", "4747"])
    try:
        end = time.monotonic() + 10
        kids: list[int] = []
        children = Path(f"/proc/{foreign.pid}/task/{foreign.pid}/children")
        while not kids and time.monotonic() < end:
            kids = [int(k) for k in children.read_text().split()]
            time.sleep(0.05)
        assert kids, "unshare did not fork"
        ns1 = kids[0]
        assert nspid(ns1)[-1] == 1
        # not PID 1 of a namespace: refused
        with pytest.raises(OSError, match="not PID 1"):
            pidns.adopt("pn-t5", foreign.pid)
        assert pidns.adopt("pn-t5", ns1)
        assert wait_gone(own)  # the pod's own init is not needed any more
        assert os.stat(pidns.path("pn-t5")).st_ino == os.stat(f"/proc/{ns1}/ns/pid").st_ino
        assert Path(pidns.dir / "pn-t5.proc" / "1" / "comm").read_text().strip() == "sleep"
        assert not pidns.adopt("pn-t5", ns1)  # idempotent
        assert pidns.init_pid("pn-t5") is None
        pidns.remove("pn-t5")
        assert not pidns.path("pn-t5").exists() and not (pidns.dir / "pn-t5.proc").exists()
        assert foreign.poll() is None and Path(f"/proc/{ns1}").exists()
    finally:
        foreign.kill()
        foreign.wait()
