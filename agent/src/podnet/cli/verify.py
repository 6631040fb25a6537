# SPDX-License-Identifier: Apache-2.0
"""`podnet verify`: prove isolation on a live cluster (issue 22).

Run as root on a login node. For each test user it starts short-lived endpoints: a job
(Slurm, `sbatch` as the user) with a pod on each chosen node, the user's login pod on this
node, a container (`podnet-container`) in the job on the first node, and a process on this
node's host network whose sockets are the user's; optionally one host outside the cluster
(`--external-cmd`, through the gateways). In each it runs a probe (`verify_agent.py`),
then tries TCP, UDP and ICMP from every endpoint to every endpoint, and prints, per
protocol, the expected, observed and comparison truth tables in the format of
Kubernetes' network-policy e2e suite (`.` reachable, `X` blocked, `-` not probed, `?` no
result). Exit status 0 only when observed = expected everywhere.

Expected (docs/admin-guide.md "podnet verify"): a user's pods (job, login, container)
reach each other and nobody else's; every host-side process is refused by every pod
(`agent_host_users` are not test users); pods reach host-side processes on cluster hosts
(`host_cidrs`); the host network reaches itself; pods reach the outside as the gateway
policy says for that user, destination, protocol and port; the outside reaches no pod.

Everything it starts goes away at its end, also when interrupted (SIGINT, SIGTERM,
SIGHUP): probes, their Slurm steps and jobs (`podnet-verify-<pid>`, cancelled by name
too), containers; login pods lose verify's session reference (podnetd releases them after
the usual grace when the user has no other session). If verify is killed with SIGKILL,
the probes exit with their stdin and the jobs end at their time limit.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import pwd
import select
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from podnet.api.client import DEFAULT_SOCKET, ApiError, call
from podnet.cli import verify_agent
from podnet.config import ClusterConfig, ConfigError, NodeConfig
from podnet.names import Keys
from podnet.state.gwpolicy import PROTOS, Policy, compile_policy, evaluate, parse_policy
from podnet.state.store import Etcd, EtcdRequestError, EtcdUnavailable

PROTOCOLS = ("tcp", "udp", "icmp")
POD_KINDS = ("job", "login", "ctr")
AGENT_SOURCE = Path(verify_agent.__file__).read_text()


class VerifyError(RuntimeError):
    """Verify could not set up (exit 2)."""


class Interrupted(BaseException):
    """SIGINT/SIGTERM/SIGHUP: unwinds through every clean-up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# -- truth tables (Kubernetes' netpol e2e format) -------------------------------------------


class TruthTable:
    """An n x n table of ordered pairs: True (reachable), False (blocked), None (not
    probed); a pair without a value prints `?`."""

    def __init__(self, items: list[str]) -> None:
        self.items = items
        self.values: dict[tuple[str, str], bool | None] = {}

    def set(self, src: str, dst: str, value: bool | None) -> None:
        if src not in self.items or dst not in self.items:
            raise KeyError(f"{src} -> {dst}: not an endpoint")
        self.values[(src, dst)] = value

    def get(self, src: str, dst: str) -> bool | None:
        return self.values[(src, dst)]

    def has(self, src: str, dst: str) -> bool:
        return (src, dst) in self.values

    def compare(self, other: TruthTable) -> TruthTable:
        """`.` where both tables agree (a pair probed in neither agrees), `X` where not,
        `?` where one has no value."""
        out = TruthTable(self.items)
        for a in self.items:
            for b in self.items:
                if self.has(a, b) and other.has(a, b):
                    out.set(a, b, self.get(a, b) == other.get(a, b))
        return out

    def pretty(self, aligned: bool = False) -> str:
        """Kubernetes' layout: tab-separated; `aligned`: the same, padded with spaces (for
        an output that shows tabs as `\\t`, as Ansible's does)."""
        rows = [["-", *self.items]]
        for a in self.items:
            row = [a]
            for b in self.items:
                v = self.values.get((a, b), "?")
                row.append("?" if v == "?" else "-" if v is None else "." if v else "X")
            rows.append(row)
        if not aligned:
            return "\n".join("\t".join(r) for r in rows)
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
        )


def summary(expected: TruthTable, observed: TruthTable) -> tuple[int, int, TruthTable]:
    """(correct, incorrect, comparison); a missing observation counts as incorrect."""
    cmp = expected.compare(observed)
    right = sum(1 for a in cmp.items for b in cmp.items if cmp.values.get((a, b)) is True)
    return right, len(cmp.items) ** 2 - right, cmp


# -- endpoints and what they should reach ---------------------------------------------------


@dataclass
class Endpoint:
    name: str  # "alice/job@c1"
    kind: str  # job | login | ctr | host | ext
    user: str = ""
    uid: int = -1
    node: str = ""
    ip: str = ""
    tcp: int = 0
    udp: int = 0
    proc: subprocess.Popen[str] | None = field(default=None, repr=False)
    err: list[str] = field(default_factory=list, repr=False)


@dataclass
class Model:
    """What the cluster promises, for `expect`."""

    host_cidrs: list[ipaddress.IPv4Network]
    egress: bool  # the cluster has gateways (pods have a way out)
    policy: Any = None  # gwpolicy.Compiled of the probed users
    vnis: dict[str, int] = field(default_factory=dict)


def _egress(m: Model, src: Endpoint, dst: Endpoint, proto: str) -> bool:
    """A pod to the outside: what the gateway policy says for that user, address,
    protocol and port (no gateways: no way out)."""
    if not m.egress or m.policy is None or src.user not in m.vnis:
        return False
    port = {"tcp": dst.tcp, "udp": dst.udp, "icmp": 0}[proto]
    return evaluate(m.policy, m.vnis[src.user], dst.ip, PROTOS[proto], port) == "allow"


def expect(m: Model, src: Endpoint, dst: Endpoint, proto: str) -> bool | None:
    """Reachable (True), blocked (False) or not podnet's to say (None: not probed)."""
    s = "pod" if src.kind in POD_KINDS else src.kind
    d = "pod" if dst.kind in POD_KINDS else dst.kind
    rules: dict[tuple[str, str], bool | None] = {
        # a user's pods reach each other and nobody else's
        ("pod", "pod"): src.user == dst.user,
        # a user's host-side socket reaches no pod; nothing unpublished from outside
        ("host", "pod"): False,
        ("ext", "pod"): False,
        # pods reach the cluster's hosts (host_cidrs); the host network reaches itself
        ("pod", "host"): any(ipaddress.IPv4Address(dst.ip) in n for n in m.host_cidrs),
        ("host", "host"): True,
        # host <-> outside: the site's network, not podnet's
        ("host", "ext"): None,
        ("ext", "host"): None,
    }
    if src is dst:
        return True
    if (s, d) == ("pod", "ext"):
        return _egress(m, src, dst, proto)
    return rules.get((s, d))


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


def load_model(cfg: NodeConfig, users: list[str]) -> Model:
    keys = Keys(cfg.cluster)
    etcd = Etcd.of_node(cfg)
    cc = ClusterConfig.from_dict(etcd.get_json(keys.config), strict=False)
    m = Model(list(cc.host_cidrs), bool(cc.egress_gateway))
    if not m.egress:
        return m
    gp = etcd.get_json(keys.gateway_policy())
    global_p = parse_policy(gp, "global policy") if gp is not None else Policy()
    per_user: dict[int, Policy] = {}
    for user in users:
        rec = etcd.get_json(keys.user(user))
        if rec is None:
            continue  # no VNI yet: it gets one with its first pod (reload after start)
        m.vnis[user] = int(rec["vni"])
        up = etcd.get_json(keys.gateway_policy(user))
        if up is not None:
            per_user[m.vnis[user]] = parse_policy(up, f"policy of {user}", user=True)
    m.policy = compile_policy(global_p, per_user)
    return m


def report(
    observed: dict[str, TruthTable], expected: dict[str, TruthTable], aligned: bool = False
) -> int:
    wrong_total = 0
    for proto in PROTOCOLS:
        right, wrong, cmp = summary(expected[proto], observed[proto])
        wrong_total += wrong
        print(f"=== {proto.upper()}")
        print(f"reachability: correct:{right}, incorrect:{wrong}, result={str(wrong == 0).lower()}")
        print()
        for title, table in (
            ("expected", expected[proto]),
            ("observed", observed[proto]),
            ("comparison", cmp),
        ):
            print(f"{title}:\n\n{table.pretty(aligned)}\n\n")
    for proto in PROTOCOLS:
        exp, obs = expected[proto], observed[proto]
        for a in exp.items:
            for b in exp.items:
                e = exp.values.get((a, b), "?")
                o = obs.values.get((a, b), "?")
                if e != o:
                    show = {True: ".", False: "X", None: "-", "?": "?"}
                    print(f"MISMATCH {proto} {a} -> {b}: expected {show[e]}, observed {show[o]}")
    n = len(next(iter(expected.values())).items)
    if wrong_total:
        print(f"podnet verify: FAILED: {wrong_total} of {3 * n * n} cells differ")
        return 1
    print(f"podnet verify: ok: observed = expected ({3 * n * n} cells, {n} endpoints)")
    return 0


@contextmanager
def _signals() -> Iterator[None]:
    def raise_(signum: int, _frame: FrameType | None) -> None:
        raise Interrupted(signum)

    old = {s: signal.signal(s, raise_) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _ignore_signals() -> None:
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)


def run(opts: Options, cfg: NodeConfig) -> int:
    if os.geteuid() != 0:
        print("podnet verify: run it as root (it starts jobs and probes as the test users)")
        return 2
    r = Run(opts, cfg)
    try:
        with _signals():
            try:
                r.log(f"{r.tag}: users {', '.join(opts.users)}, nodes {', '.join(opts.nodes)}")
                for user in opts.users:
                    r.submit(user)
                r.wait_running()
                r.log(f"jobs running: starting endpoints ({', '.join(map(str, r.jobs.values()))})")
                r.start()
                r.log(f"{len(r.endpoints)} endpoints up: probing")
                r.model = load_model(cfg, opts.users)
                observed = r.probe()
            finally:
                _ignore_signals()
                r.log("cleaning up")
                r.cleanup()
    except Interrupted as e:
        r.log(f"interrupted ({signal.Signals(e.signum).name}); cleaned up")
        return 128 + e.signum
    except (EtcdUnavailable, EtcdRequestError, ConfigError) as e:
        r.log(f"FAILED to read the cluster's configuration: {e}")
        return 2
    except (VerifyError, ApiError, OSError, KeyError, ValueError) as e:
        r.log(f"FAILED to set up: {e}")
        return 2
    names = [e.name for e in r.endpoints]
    expected = {p: TruthTable(names) for p in PROTOCOLS}
    for p in PROTOCOLS:
        for a in r.endpoints:
            for b in r.endpoints:
                expected[p].set(a.name, b.name, expect(r.model, a, b, p))
    for ep in r.endpoints:
        if ep.err:
            r.log(f"{ep.name}: {' | '.join(ep.err[-4:])}")
    return report(observed, expected, opts.aligned)


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "verify",
        parents=parents,
        help="prove isolation: probes between test users' pods, hosts and the outside (root)",
    )
    p.add_argument("--users", required=True, help="test users, comma-separated (two or more)")
    p.add_argument("--nodes", required=True, help="compute nodes for the job pods (one or more)")
    p.add_argument("--no-login", action="store_true", help="no login pods (not a login node)")
    p.add_argument("--no-container", action="store_true", help="no container endpoints")
    p.add_argument("--no-host", action="store_true", help="no host-side endpoints")
    p.add_argument(
        "--external-cmd",
        default="",
        help="command that runs a program on a host outside the cluster; the probe's "
        "command line is appended as one argument (e.g. 'ssh root@outside')",
    )
    p.add_argument("--external-ip", default="", help="that host's address as pods reach it")
    p.add_argument("--external-port", type=int, default=0, help="its TCP/UDP port (0: any)")
    p.add_argument(
        "--container-helper",
        default="/usr/local/bin/podnet-container",
        metavar="PATH",
        help="podnet-container on the nodes, for the container endpoints "
        "(default /usr/local/bin/podnet-container)",
    )
    p.add_argument("--timeout", type=float, default=3.0, help="seconds per probe")
    p.add_argument(
        "--aligned", action="store_true", help="tables padded with spaces instead of tabs"
    )
    p.add_argument("--time-limit", type=int, default=10, help="the jobs' time limit (minutes)")


def cmd_verify(args: argparse.Namespace) -> int:
    users = [u for u in args.users.split(",") if u]
    nodes = [n for n in args.nodes.split(",") if n]
    if len(set(users)) < 2:
        print("podnet verify: --users needs two or more users", file=sys.stderr)
        return 2
    for u in users:
        try:
            pwd.getpwnam(u)
        except KeyError:
            print(f"podnet verify: no user {u!r}", file=sys.stderr)
            return 2
    try:
        cfg = NodeConfig.load(args.config)
    except ConfigError as e:
        print(f"podnet verify: {e}", file=sys.stderr)
        return 2
    opts = Options(
        users=users,
        nodes=nodes,
        login=not args.no_login,
        container=not args.no_container,
        host=not args.no_host,
        external_cmd=args.external_cmd,
        external_ip=args.external_ip,
        external_port=args.external_port,
        container_helper=args.container_helper,
        timeout=args.timeout,
        aligned=args.aligned,
        time_limit=args.time_limit,
        config=args.config,
        socket=cfg.socket if args.socket == DEFAULT_SOCKET else args.socket,
    )
    return run(opts, cfg)


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
