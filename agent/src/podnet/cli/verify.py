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

This module is the command (arguments, signals, the run's steps); the endpoints and what
they should reach are in `verify_model`, the Slurm jobs and probes in `verify_run`, the
truth tables and the report in `verify_tables`.
"""

from __future__ import annotations

import argparse
import os
import pwd
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from podnet.api.client import DEFAULT_SOCKET, ApiError
from podnet.cli.verify_model import PROTOCOLS, expect, load_model
from podnet.cli.verify_run import Options, Run, VerifyError
from podnet.cli.verify_tables import TruthTable, report
from podnet.config import ConfigError, NodeConfig
from podnet.state.store import EtcdRequestError, EtcdUnavailable


class Interrupted(BaseException):
    """SIGINT/SIGTERM/SIGHUP: unwinds through every clean-up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


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
