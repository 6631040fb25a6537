# SPDX-License-Identifier: Apache-2.0
"""In the pod's Slurm job (its batch step, inside the job's podnet pod): run the pod's
init containers one after the other, then its containers side by side, restart them per
the pod's restartPolicy, and keep `status.json` up to date for the kubelet. The job ends
when the pod is done (every container ended for good), or on SIGTERM (`scancel`, the
time limit): the containers get SIGTERM, then SIGKILL after the grace period."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from podnet.hpk.podplan import RUNTIME_NODE, RUNTIME_POD_IP

SIOCGIFADDR = 0x8915
BACKOFF_FIRST = 10.0
BACKOFF_MAX = 300.0
BACKOFF_RESET = 600.0  # a container that ran this long restarts without waiting


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def pod_ip(interface: str = "eth0") -> str:
    """The pod's address: PODNET_POD_IP when podnet gives it, else the address of the pod's
    interface (eth0: docs/user-guide.md "Inside a pod")."""
    ip = os.environ.get("PODNET_POD_IP", "")
    if ip:
        return ip
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            req = struct.pack("256s", interface.encode()[:15])
            return socket.inet_ntoa(fcntl.ioctl(s.fileno(), SIOCGIFADDR, req)[20:24])
        except OSError as e:
            raise RuntimeError(
                f"no IPv4 address on {interface}: is this job in a podnet pod?"
            ) from e


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


class Container:
    def __init__(self, plan: dict[str, Any], poddir: Path, runtime: dict[str, str]) -> None:
        self.name: str = plan["name"]
        self.argv: list[str] = plan["argv"]
        self.env: list[tuple[str, str]] = [(str(e[0]), str(e[1])) for e in plan["env"]]
        self.poddir = poddir
        self.runtime = runtime
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.state: dict[str, Any] = {"waiting": {"reason": "PodInitializing"}}
        self.last: dict[str, Any] | None = None
        self.started_mono = 0.0
        self.backoff = BACKOFF_FIRST

    def status(self) -> dict[str, Any]:
        st: dict[str, Any] = {"name": self.name, "state": self.state, "restartCount": self.restarts}
        if self.last:
            st["lastState"] = self.last
        return st

    def start(self) -> subprocess.Popen[bytes]:
        env_dir = self.poddir / "env"
        env_dir.mkdir(exist_ok=True)
        lines = []
        for k, v in self.env:
            value = v.replace(RUNTIME_POD_IP, self.runtime["ip"])
            value = value.replace(RUNTIME_NODE, self.runtime["node"])
            lines.append(f"{k}={shlex.quote(value)}\n")
        env_file = env_dir / f"{self.name}.env"
        env_file.write_text("".join(lines))
        env_file.chmod(0o600)
        log = self.poddir / "logs" / f"{self.name}.log"
        if log.exists() and self.restarts:
            log.replace(log.with_name(f"{self.name}.previous.log"))
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started_mono = time.monotonic()
        self.state = {"running": {"startedAt": now()}}
        return self.proc

    def ended(self, code: int) -> None:
        started = self.state.get("running", {}).get("startedAt", now())
        reason = "Completed" if code == 0 else ("Error" if code > 0 else "Killed")
        self.state = {
            "terminated": {
                "exitCode": code if code >= 0 else 128 - code,
                "reason": reason,
                "startedAt": started,
                "finishedAt": now(),
            }
        }
        self.proc = None

    def signal(self, sig: int) -> None:
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)


class Runner:
    def __init__(self, poddir: Path, log: TextIO = sys.stderr) -> None:
        self.poddir = poddir
        self.plan = json.loads((poddir / "plan.json").read_text())
        self.log = log
        self.runtime = {"ip": pod_ip(), "node": socket.gethostname()}
        self.init = [Container(c, poddir, self.runtime) for c in self.plan["init"]]
        self.containers = [Container(c, poddir, self.runtime) for c in self.plan["containers"]]
        self.policy: str = self.plan["restart_policy"]
        self.stopping = threading.Event()
        self.phase = "Pending"
        self.message = ""
        self.started = now()

    def write(self) -> None:
        write_json(
            self.poddir / "status.json",
            {
                "uid": self.plan["uid"],
                "phase": self.phase,
                "message": self.message,
                "ip": self.runtime["ip"],
                "node": self.runtime["node"],
                "job": os.environ.get("SLURM_JOB_ID", ""),
                "startedAt": self.started,
                "init": [c.status() for c in self.init],
                "containers": [c.status() for c in self.containers],
                "updated": time.time(),
            },
        )

    def _hosts(self) -> None:
        hosts = self.poddir / "hosts"
        with contextlib.suppress(OSError):
            text = hosts.read_text()
            name = self.plan["key"].split("/", 1)[1]
            if f"\t{name}\n" not in text:
                hosts.write_text(text + f"{self.runtime['ip']}\t{name}\n")

    def _sleep(self, seconds: float) -> bool:
        """Wait; False when the pod is being stopped."""
        return not self.stopping.wait(seconds)

    def _restart_wanted(self, code: int) -> bool:
        return self.policy == "Always" or (self.policy == "OnFailure" and code != 0)

    def run(self) -> int:
        self._hosts()
        self.write()
        for c in self.init:
            if not self._run_init(c):
                return self._finish()
        return self._run_containers()

    def _run_init(self, c: Container) -> bool:
        """Run one init container until it succeeds (False: the pod stops here)."""
        while True:
            proc = c.start()
            self.write()
            code = self._wait(proc)
            c.ended(code)
            self.write()
            if self.stopping.is_set():
                return False
            if code == 0:
                return True
            if self.policy == "Never":
                self.phase = "Failed"
                self.message = f"init container {c.name} exited with {code}"
                return False
            c.last, c.restarts = c.state, c.restarts + 1
            c.state = {"waiting": {"reason": "CrashLoopBackOff"}}
            self.write()
            if not self._sleep(c.backoff):
                return False
            c.backoff = min(c.backoff * 2, BACKOFF_MAX)

    def _reap(self, c: Container, pending: dict[str, float]) -> bool:
        """One pass over a container: reaped or restarted (True: its status changed)."""
        if c.proc is not None and (code := c.proc.poll()) is not None:
            ran = time.monotonic() - c.started_mono
            c.ended(code)
            if self._restart_wanted(code):
                if ran >= BACKOFF_RESET:
                    c.backoff = BACKOFF_FIRST
                pending[c.name] = time.monotonic() + (0 if ran >= BACKOFF_RESET else c.backoff)
                c.last, c.state = c.state, {"waiting": {"reason": "CrashLoopBackOff"}}
                c.backoff = min(c.backoff * 2, BACKOFF_MAX)
            return True
        if c.proc is None and time.monotonic() >= pending.get(c.name, float("inf")):
            del pending[c.name]
            c.restarts += 1
            c.start()
            return True
        return False

    def _run_containers(self) -> int:
        self.phase = "Running"
        for c in self.containers:
            c.start()
        self.write()
        pending: dict[str, float] = {}
        while not self.stopping.is_set():
            changed = [self._reap(c, pending) for c in self.containers]
            if all(c.proc is None for c in self.containers) and not pending:
                failed = [c.name for c in self.containers if c.state["terminated"]["exitCode"] != 0]
                self.phase = "Failed" if failed else "Succeeded"
                self.message = f"containers failed: {', '.join(failed)}" if failed else ""
                self.write()
                return 1 if failed else 0
            if any(changed):
                self.write()
            self.stopping.wait(0.2)
        return self._finish()

    def _wait(self, proc: subprocess.Popen[bytes]) -> int:
        while not self.stopping.is_set():
            code = proc.poll()
            if code is not None:
                return code
            self.stopping.wait(0.2)
        return self._stop_one(proc)

    def _stop_one(self, proc: subprocess.Popen[bytes]) -> int:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(self.plan["grace_seconds"])
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()

    def stop(self) -> None:
        self.stopping.set()

    def _finish(self) -> int:
        """Stopped from outside: every running container gets SIGTERM, then SIGKILL."""
        running = [c for c in self.init + self.containers if c.proc is not None]
        for c in running:
            c.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.plan["grace_seconds"]
        for c in running:
            proc = c.proc
            if proc is None:
                continue
            try:
                code = proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.signal(signal.SIGKILL)
                code = proc.wait()
            c.ended(code)
        if self.phase not in ("Failed", "Succeeded"):
            self.phase = "Failed"
            self.message = self.message or "the pod's job was stopped (scancel or its time limit)"
        self.write()
        return 1 if self.phase == "Failed" else 0


def main(poddir: str) -> int:
    runner = Runner(Path(poddir))

    def on_term(_sig: int, _frame: object) -> None:
        runner.stop()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    return runner.run()


if __name__ == "__main__":  # the pod's job script: `python -m podnet.hpk.runner DIR`
    sys.exit(main(sys.argv[1]))
