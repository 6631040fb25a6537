# SPDX-License-Identifier: Apache-2.0
"""`podnet verify`'s run on the cluster: the test users' Slurm jobs (`sbatch`, `srun`,
`squeue`, `scancel`), the endpoints' probes (`verify_agent.py`) and the line protocol
with them, the probing itself and the clean-up of everything the run started."""

from __future__ import annotations

import json
import os
import pwd
import select
import shlex
import signal
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podnet.api.client import call
from podnet.cli import verify_agent
from podnet.cli.verify_model import POD_KINDS, PROTOCOLS, Endpoint, Model, expect
from podnet.cli.verify_tables import TruthTable
from podnet.config import NodeConfig

AGENT_SOURCE = Path(verify_agent.__file__).read_text()


class VerifyError(RuntimeError):
    """Verify could not set up (exit 2)."""


# -- talking to the probes ----------------------------------------------------------------


def _send(ep: Endpoint, obj: dict[str, Any]) -> None:
    if ep.proc is None or ep.proc.stdin is None:
        raise VerifyError(f"{ep.name}: no probe")
    ep.proc.stdin.write(json.dumps(obj) + "\n")
    ep.proc.stdin.flush()


def _read(ep: Endpoint, op: str, timeout: float) -> dict[str, Any]:
    """The probe's next reply `op`; its other lines (srun's, the image's) are kept as the
    endpoint's messages."""
    if ep.proc is None or ep.proc.stdout is None:
        raise VerifyError(f"{ep.name}: no probe")
    out = ep.proc.stdout
    end = time.monotonic() + timeout
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise VerifyError(f"{ep.name}: no '{op}' from its probe within {timeout:.0f} s")
        ready = select.select([out], [], [], left)[0]
        if not ready:
            continue
        line = out.readline()
        if not line:
            raise VerifyError(f"{ep.name}: its probe ended: {_stderr(ep)}")
        try:
            msg = json.loads(line)
        except ValueError:
            ep.err.append(line.strip())
            continue
        if isinstance(msg, dict) and msg.get("op") == op:
            return msg
        ep.err.append(line.strip())


def _stderr(ep: Endpoint) -> str:
    text = ""
    if ep.proc is not None and ep.proc.stderr is not None:
        with suppress(OSError, ValueError):
            os.set_blocking(ep.proc.stderr.fileno(), False)
            text = ep.proc.stderr.read() or ""
    return " | ".join([*ep.err, *text.strip().splitlines()][-6:]) or "(no output)"


# -- the run -------------------------------------------------------------------------------


@dataclass
class Options:
    users: list[str]
    nodes: list[str]
    login: bool = True
    container: bool = True
    host: bool = True
    external_cmd: str = ""
    external_ip: str = ""
    external_port: int = 0
    container_helper: str = "/usr/local/bin/podnet-container"
    python: str = "python3"
    timeout: float = 3.0
    aligned: bool = False
    start_timeout: float = 120.0
    time_limit: int = 10
    config: str = ""
    socket: str = ""


class Run:
    def __init__(self, opts: Options, cfg: NodeConfig) -> None:
        self.o = opts
        self.cfg = cfg
        self.tag = f"podnet-verify-{os.getpid()}"
        self.jobs: dict[str, int] = {}
        self.endpoints: list[Endpoint] = []

    def log(self, text: str) -> None:
        print(f"podnet verify: {text}", file=sys.stderr, flush=True)

    # ---- set-up
    def _agent_argv(self, extra: dict[str, Any] | None = None) -> list[str]:
        args = {"tag": self.tag, **(extra or {})}
        return [self.o.python, "-u", "-c", AGENT_SOURCE, json.dumps(args)]

    def _spawn(self, ep: Endpoint, argv: list[str]) -> None:
        ep.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            start_new_session=True,
            cwd="/",
        )
        self.endpoints.append(ep)

    def submit(self, user: str) -> int:
        nodes = ",".join(self.o.nodes)
        r = subprocess.run(
            [
                "runuser",
                "-u",
                user,
                "--",
                "sbatch",
                "--parsable",
                f"--job-name={self.tag}",
                f"--nodes={len(self.o.nodes)}",
                f"--nodelist={nodes}",
                f"--time={self.o.time_limit}",
                "--chdir=/tmp",
                "--output=/dev/null",
                f"--wrap=sleep {self.o.time_limit * 60}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if r.returncode != 0:
            raise VerifyError(f"sbatch as {user}: {r.stderr.strip() or r.stdout.strip()}")
        job = int(r.stdout.strip().split(";")[0])
        self.jobs[user] = job
        return job

    def wait_running(self) -> None:
        end = time.monotonic() + self.o.start_timeout
        waiting = dict(self.jobs)
        while waiting:
            ids = ",".join(str(j) for j in waiting.values())
            out = _squeue(ids, "%i %T %r")
            state = {int(ln.split()[0]): ln.split()[1:] for ln in out.splitlines() if ln.strip()}
            for user, job in list(waiting.items()):
                if state.get(job, [""])[0] == "RUNNING":
                    del waiting[user]
                elif job not in state:
                    raise VerifyError(f"{user}'s job {job} ended before it ran")
            if waiting and time.monotonic() > end:
                why = {u: " ".join(state.get(j, ["?"])) for u, j in waiting.items()}
                raise VerifyError(f"jobs not running after {self.o.start_timeout:.0f} s: {why}")
            if waiting:
                time.sleep(1)

    def _srun(self, user: str, node: str, *argv: str) -> list[str]:
        return [
            "runuser",
            "-u",
            user,
            "--",
            "srun",
            f"--jobid={self.jobs[user]}",
            "--overlap",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={node}",
            "--unbuffered",
            "--quiet",
            "--chdir=/tmp",
            *argv,
        ]

    def start(self) -> None:
        o = self.o
        me = self.cfg.node
        for user in o.users:
            uid = pwd.getpwnam(user).pw_uid
            for node in o.nodes:
                ep = Endpoint(f"{user}/job@{node}", "job", user, uid, node)
                self._spawn(ep, self._srun(user, node, *self._agent_argv()))
            if o.login:
                pod = call("login_acquire", o.socket, timeout=60, uid=uid, pid=os.getpid())["pod"]
                ep = Endpoint(f"{user}/login@{me}", "login", user, uid, me)
                self._spawn(
                    ep,
                    [
                        "nsenter",
                        f"--net={pod['netns']}",
                        "--",
                        "runuser",
                        "-u",
                        user,
                        "--",
                        *self._agent_argv(),
                    ],
                )
            if o.container:
                node = o.nodes[0]
                name = f"pnvfy{os.getpid() % 100000}{uid % 1000}"
                ep = Endpoint(f"{user}/ctr@{node}", "ctr", user, uid, node)
                self._spawn(
                    ep,
                    self._srun(
                        user, node, o.container_helper, "--name", name, "--", *self._agent_argv()
                    ),
                )
            if o.host:
                ep = Endpoint(f"{user}/host@{me}", "host", user, uid, me, ip=self.cfg.underlay_ip)
                gid = pwd.getpwnam(user).pw_gid
                self._spawn(ep, self._agent_argv({"fsuid": uid, "fsgid": gid}))
        if o.external_cmd:
            ep = Endpoint("ext", "ext", ip=o.external_ip)
            remote = shlex.join(self._agent_argv({"port": o.external_port}))
            self._spawn(ep, [*shlex.split(o.external_cmd), remote])
        for ep in self.endpoints:
            ready = _read(ep, "ready", o.start_timeout)
            ep.tcp, ep.udp = int(ready["tcp"]), int(ready["udp"])
            if not ep.ip:
                addrs = [str(a) for a in ready.get("addrs", [])]
                if not addrs:
                    raise VerifyError(f"{ep.name}: its probe has no IPv4 address")
                ep.ip = addrs[0]
            if ep.kind in POD_KINDS and ep.uid >= 0 and int(ready["uid"]) != ep.uid:
                raise VerifyError(f"{ep.name}: its probe runs as uid {ready['uid']}")

    # ---- probing
    def probe(self) -> dict[str, TruthTable]:
        names = [e.name for e in self.endpoints]
        observed = {p: TruthTable(names) for p in PROTOCOLS}
        where = self._plan(observed)
        self._collect(observed, where)
        return observed

    def _plan(self, observed: dict[str, TruthTable]) -> dict[str, tuple[str, str, str]]:
        """Sends each probe its targets; returns token -> (source, target, protocol)."""
        plan: dict[str, list[dict[str, Any]]] = {e.name: [] for e in self.endpoints}
        where: dict[str, tuple[str, str, str]] = {}
        for src in self.endpoints:
            for dst in self.endpoints:
                for proto in PROTOCOLS:
                    if expect(self.model, src, dst, proto) is None:
                        observed[proto].set(src.name, dst.name, None)
                        continue
                    token = f"{self.tag}:{len(where)}"
                    where[token] = (src.name, dst.name, proto)
                    port = dst.tcp if proto == "tcp" else dst.udp
                    plan[src.name].append(
                        {"id": token, "ip": dst.ip, "proto": proto, "port": port, "token": token}
                    )
        for ep in self.endpoints:
            _send(ep, {"op": "probe", "targets": plan[ep.name], "timeout": self.o.timeout})
        return where

    def _collect(
        self, observed: dict[str, TruthTable], where: dict[str, tuple[str, str, str]]
    ) -> None:
        """TCP and ICMP as the sources saw them; UDP (and any TCP that arrived though its
        answer did not) as the targets saw them. An ICMP probe that could not be made
        leaves its cell without a value (`?`)."""
        for ep in self.endpoints:
            res = _read(ep, "probe", self.o.timeout * 4 + 60)["results"]
            for token, r in res.items():
                a, b, proto = where[token]
                if r.get("untested"):
                    ep.err.append(f"{proto} -> {b}: {r.get('err')}")
                elif proto != "udp":
                    observed[proto].set(a, b, bool(r.get("ok")))
        time.sleep(1.0)  # the last datagrams
        for ep in self.endpoints:
            _send(ep, {"op": "arrivals"})
        arrived: set[str] = set()
        for ep in self.endpoints:
            for got in _read(ep, "arrivals", 60)["arrivals"]:
                token = str(got.get("token", ""))
                if token in where and where[token][1] == ep.name:
                    arrived.add(token)
        for token, (a, b, proto) in where.items():
            if proto == "udp":
                observed[proto].set(a, b, token in arrived)
            elif token in arrived and observed[proto].has(a, b) and not observed[proto].get(a, b):
                observed[proto].set(a, b, True)

    # ---- clean-up
    def cleanup(self) -> None:
        self._stop_probes()
        for user in self.o.users:
            subprocess.run(
                ["scancel", f"--name={self.tag}", f"--user={user}"],
                capture_output=True,
                timeout=60,
                check=False,
            )
        if self.jobs:
            self._wait_jobs_gone()

    def _stop_probes(self) -> None:
        """quit, then SIGTERM, then SIGKILL to each probe's process group."""
        live = [e.proc for e in self.endpoints if e.proc is not None and e.proc.poll() is None]
        for ep in self.endpoints:
            if ep.proc in live:
                with suppress(OSError, ValueError, VerifyError):
                    _send(ep, {"op": "quit"})
        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            end = time.monotonic() + grace
            for p in live:
                with suppress(subprocess.TimeoutExpired):
                    p.wait(max(0.1, end - time.monotonic()))
            live = [p for p in live if p.poll() is None]
            for p in live:
                with suppress(ProcessLookupError):
                    os.killpg(p.pid, sig)
        for p in live:
            p.wait()

    def _wait_jobs_gone(self) -> None:
        ids = ",".join(str(j) for j in self.jobs.values())
        end = time.monotonic() + 60
        while time.monotonic() < end:
            out = _squeue(ids, "%i")
            if not out.strip():
                return
            time.sleep(1)
        self.log(f"jobs {ids} still listed after scancel")

    model: Model


def _squeue(ids: str, fmt: str) -> str:
    """squeue's lines for the jobs `ids` (comma-separated) in format `fmt`; none once they
    are gone (squeue's errors count as no lines: the callers poll until a deadline)."""
    return subprocess.run(
        ["squeue", "-h", "-j", ids, "-o", fmt],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout
