# SPDX-License-Identifier: Apache-2.0
"""A pod's PID namespace: PID 1 is podnet-init, kept for as long as the pod.

`podnet-init NAME` (agent/native/podnet_init.c) unshares a PID namespace and forks its
init, which reaps orphans; it prints the init's PID. podnetd bind-mounts the init's
/proc/PID/ns/pid on `<dir>/<pod>` (the SPANK plugin opens it and forks the step's tasks
into it with setns), the init mounts the namespace's proc on `<dir>/<pod>.proc`
(pam_podnet binds it on /proc for SSH sessions), and podnetd records PID and start
time in `<dir>/<pod>.init`, so a
restarted podnetd still finds the init and never signals a recycled PID. Removing the
pod kills the init: the kernel then kills every process left in the namespace. The
init outlives podnetd restarts (the unit has KillMode=process).

Where Slurm's namespace/linux plugin (Slurm >= 25.11, `clone_ns_flags: [CLONE_NEWPID]`)
gives the job its own PID namespace, the SPANK plugin tells podnetd its PID 1 (`job_pidns`)
and `adopt` makes that namespace the pod's: the same pin and proc, no podnet-init (Slurm's
`slurmstepd: [<job>.namespace]` is PID 1 and lives as long as the job).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from pathlib import Path

from podnet.kernel import netns

log = logging.getLogger("podnet.pidns")


class PidnsError(OSError):
    pass


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks), None if PID is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    return stat.rsplit(")", 1)[1].split()[19]


class PidNamespaces:
    def __init__(self, pidns_dir: str, init: str) -> None:
        """`init`: the podnet-init binary, "" for pods without a PID namespace."""
        self.dir = Path(pidns_dir)
        self.init = init
        self._warned = False

    def enabled(self) -> bool:
        if not self.init:
            return False
        if os.access(self.init, os.X_OK):
            return True
        if not self._warned:
            log.warning("%s missing: pods get no PID namespace", self.init)
            self._warned = True
        return False

    def path(self, name: str) -> Path:
        return self.dir / name

    def create(self, name: str) -> int | None:
        """Start the pod's init and pin its namespace; the init's PID (None: disabled)."""
        if not self.enabled():
            return None
        self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        procdir = self.dir / f"{name}.proc"
        procdir.mkdir(mode=0o555, exist_ok=True)
        try:
            out = subprocess.run(
                [self.init, name, str(procdir)],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
                start_new_session=True,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            self.remove(name)
            raise PidnsError(0, f"{self.init}: {e}") from None
        if out.returncode != 0 or not out.stdout.strip().isdigit():
            self.remove(name)
            raise PidnsError(0, f"{self.init}: {out.stderr.strip() or out.stdout.strip()}")
        pid = int(out.stdout)
        started = _start_time(pid)
        path = self.path(name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o444)
            os.close(fd)
            netns.mount_bind(f"/proc/{pid}/ns/pid", str(path))
            tmp = self.dir / f"{name}.init.tmp"
            tmp.write_text(f"{pid} {started}\n")
            tmp.replace(self.dir / f"{name}.init")
        except BaseException:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            self.remove(name)
            raise
        return pid

    def adopt(self, name: str, pid: int) -> bool:
        """Make the PID namespace whose PID 1 is `pid` (Slurm's namespace/linux) the pod's.

        Replaces the pod's own namespace (its podnet-init is killed: nothing runs there
        yet, the steps come after the extern step) and mounts a proc of the adopted one
        (podnet-init --join). False: nothing to do (already adopted, or PID namespaces are
        off). Raises PidnsError when `pid` is not the init of a PID namespace of its own.
        """
        if not self.enabled():
            return False
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            target = Path(f"/proc/{pid}/ns/pid").stat()
        except OSError as e:
            raise PidnsError(0, f"process {pid}: {e.strerror}") from None
        nspid = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), [])
        own = Path("/proc/self/ns/pid").stat()
        same = (target.st_dev, target.st_ino) == (own.st_dev, own.st_ino)
        if len(nspid) < 2 or nspid[-1] != "1" or same:
            raise PidnsError(0, f"process {pid} is not PID 1 of a PID namespace of its own")
        path = self.path(name)
        with contextlib.suppress(OSError):
            cur = path.stat()
            if (cur.st_dev, cur.st_ino) == (target.st_dev, target.st_ino):
                return False
        self.remove(name)
        self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        procdir = self.dir / f"{name}.proc"
        procdir.mkdir(mode=0o555, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o444)
            os.close(fd)
            netns.mount_bind(f"/proc/{pid}/ns/pid", str(path))
            out = subprocess.run(
                [self.init, "--join", str(pid), str(procdir)],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
            if out.returncode != 0:
                raise PidnsError(0, f"{self.init} --join: {out.stderr.strip()}")
        except BaseException:
            self.remove(name)
            raise
        log.info("pod %s: PID namespace of process %d adopted (Slurm's namespace/linux)", name, pid)
        return True

    def init_pid(self, name: str) -> int | None:
        """The pod's init if it still runs (PID and start time as recorded)."""
        try:
            pid_s, started = (self.dir / f"{name}.init").read_text().split()
        except (OSError, ValueError):
            return None
        pid = int(pid_s)
        return pid if _start_time(pid) == started else None

    def remove(self, name: str) -> bool:
        """Kill the pod's init (and with it every process of the namespace), unpin it."""
        pid = self.init_pid(name)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        path = self.path(name)
        existed = path.exists()
        netns.umount(str(path))
        procdir = self.dir / f"{name}.proc"
        netns.umount(str(procdir))
        with contextlib.suppress(FileNotFoundError):
            procdir.rmdir()
        for f in (path, self.dir / f"{name}.init", self.dir / f"{name}.init.tmp"):
            f.unlink(missing_ok=True)
        return existed or pid is not None
