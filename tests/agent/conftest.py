# SPDX-License-Identifier: Apache-2.0
"""A podnet cluster on one machine: real etcd, "nodes" as network namespaces, one podnetd each.

Host side (all names start with `pat`, nothing else is touched):
* bridge `patbr0` 203.0.113.1/26 (the nodes' underlay), nft table `inet pat_host`
  that keeps the bridge's traffic on the bridge (never forwarded off the machine);
* etcd on http://203.0.113.1:<free port> (data in a temp dir);
* node `i`: netns `pat-n<i>`, veth `patv<i>` (host end in patbr0) / `ul0` with
  203.0.113.<10+i>, a podnetd started with `nsenter --net` (same mount namespace as the
  tests, so pod netns files are visible here), netns/resolv/state dirs and socket under
  the test's temp dir. Pod CIDR 198.19.0.0/16, zone `t`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from podnet.api.client import call
from podnet.state.store import Etcd

REPO = Path(__file__).resolve().parents[2]
ETCD = os.environ.get("PODNET_TEST_ETCD", "/usr/bin/etcd")
BRIDGE = "patbr0"
BRIDGE_MAC = "02:70:61:74:62:30"
HOST_IP = "203.0.113.1"
PREFIX = 26
POD_CIDR = "198.19.0.0/16"
ZONE = "t"
CLUSTER = "t"
NFT_TABLE = "pat_host"


def sh(*argv: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, text=True, capture_output=True, **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(fn: Any, timeout: float = 10.0, step: float = 0.05) -> Any:
    end = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < end:
        try:
            last = fn()
            if last:
                return last
        except Exception as e:
            last = e
        time.sleep(step)
    raise AssertionError(f"timed out waiting: last result {last!r}")


if os.geteuid() != 0:
    pytest.skip("agent tests need root (netns, veth, nftables)", allow_module_level=True)


@pytest.fixture(scope="session")
def workdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="pat-"))
    d.chmod(0o755)  # unprivileged callers must reach the sockets
    yield d
    for n in d.glob("*/netns"):  # a node a test did not tear down
        for f in n.glob("pn-*"):
            subprocess.run(["umount", "-l", str(f)], check=False, capture_output=True)
        subprocess.run(["umount", "-l", str(n)], check=False, capture_output=True)
    shutil.rmtree(d, ignore_errors=True)
    if d.exists():
        print(f"warning: {d} could not be removed", file=sys.stderr)


@pytest.fixture(scope="session")
def underlay() -> Iterator[str]:
    if sh("ip", "link", "show", BRIDGE, check=False).returncode == 0:
        sh("ip", "link", "del", BRIDGE)
    # a fixed MAC: a bridge takes the lowest MAC of its ports, so without one it changed
    # whenever a node's veth came or went, and the other nodes' ARP entries for the
    # host (etcd) pointed nowhere until they expired (requests timed out under load)
    sh("ip", "link", "add", BRIDGE, "address", BRIDGE_MAC, "type", "bridge")
    sh("ip", "addr", "add", f"{HOST_IP}/{PREFIX}", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    rules = f"""
table inet {NFT_TABLE} {{
  chain forward {{
    type filter hook forward priority -5; policy accept;
    iifname "{BRIDGE}" oifname "{BRIDGE}" accept
    iifname "{BRIDGE}" drop
    oifname "{BRIDGE}" drop
  }}
}}
"""
    sh(
        "nft",
        "-f",
        "-",
        input=f"add table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\n{rules}",
    )
    yield BRIDGE
    sh("ip", "link", "del", BRIDGE, check=False)
    sh("nft", "delete", "table", "inet", NFT_TABLE, check=False)


class EtcdServer:
    """A real etcd on the underlay bridge; `stop()` and `start()` again keep its data."""

    def __init__(self, workdir: Path, name: str = "etcd") -> None:
        self.port = free_port()
        self.peer = free_port()
        self.url = f"http://{HOST_IP}:{self.port}"
        self.dir = workdir / name
        self.logfile = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = Etcd([self.url], None, None, None, 5.0)
        self.start()

    def start(self) -> None:
        with open(self.logfile, "a") as log:
            self.proc = subprocess.Popen(
                [
                    ETCD,
                    "--name",
                    "pat",
                    "--data-dir",
                    str(self.dir),
                    "--listen-client-urls",
                    f"{self.url},http://127.0.0.1:{self.port}",
                    "--advertise-client-urls",
                    self.url,
                    "--listen-peer-urls",
                    f"http://127.0.0.1:{self.peer}",
                    "--initial-advertise-peer-urls",
                    f"http://127.0.0.1:{self.peer}",
                    "--initial-cluster",
                    f"pat=http://127.0.0.1:{self.peer}",
                    "--max-txn-ops",
                    "8192",
                    "--max-request-bytes",
                    "10485760",
                    "--log-level",
                    "warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(self.client.status, 20)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture(scope="session")
def etcd(workdir: Path, underlay: str) -> Iterator[EtcdServer]:
    if not Path(ETCD).exists():
        pytest.fail(f"{ETCD} missing: install etcd-server (make deps)")
    e = EtcdServer(workdir)
    cluster_config = {
        "pod_cidr": POD_CIDR,
        "block_prefix": 26,
        "zone": ZONE,
        "vxlan_port": 4789,
        "underlay_mtu": 1500,
        "vni_min": 5000,
        "vni_max": 5999,
        "host_cidrs": [f"203.0.113.0/{PREFIX}"],
        "dns_servers": [HOST_IP],
        "search_domains": ["admin.example"],
        "login_lease_ttl": 10,
        "login_grace": 1.0,
    }
    e.client.put(f"/podnet/{CLUSTER}/config", cluster_config)
    yield e
    e.stop()


class Node:
    """One "node": a netns with an underlay address, running a real podnetd."""

    def __init__(
        self,
        i: int,
        workdir: Path,
        etcd: EtcdServer,
        *,
        start: bool = True,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.i = i
        self.name = f"n{i}"
        self.netns = f"pat-n{i}"
        self.ip = f"203.0.113.{10 + i}"
        self.dir = workdir / self.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o755)
        self.socket = str(self.dir / "podnetd.sock")
        # the job source: every job id is live except those listed in `dead-jobs`
        self.jobs_file = workdir / "dead-jobs"
        self.jobs_file.touch()
        self.config = self.dir / "podnet.yaml"
        self.config.write_text(
            json.dumps(
                {
                    "node": self.name,
                    "underlay_interface": "ul0",
                    "underlay_ip": self.ip,
                    "cluster": CLUSTER,
                    "etcd_endpoints": [etcd.url],
                    "socket": self.socket,
                    "netns_dir": str(self.dir / "netns"),
                    "resolv_dir": str(self.dir / "resolv"),
                    "state_dir": str(self.dir / "state"),
                    "gc_interval": 0.5,
                    "job_source": ["sh", "-c", f"seq 1 99999 | grep -vxF -f {self.jobs_file}"],
                    "running_job_source": [
                        "sh",
                        "-c",
                        f"seq 1 99999 | grep -vxF -f {self.jobs_file}",
                    ],
                    "log_level": "debug",
                    "roles": ["compute", "login"],
                    **(settings or {}),
                }
            )
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self._plumb()
        if start:
            self.start()

    def _plumb(self) -> None:
        if Path(f"/run/netns/{self.netns}").exists():
            sh("ip", "netns", "del", self.netns, check=False)
        sh("ip", "link", "del", f"patv{self.i}", check=False)
        if True:
            sh("ip", "netns", "add", self.netns)
            sh(
                "ip",
                "link",
                "add",
                f"patv{self.i}",
                "type",
                "veth",
                "peer",
                "name",
                "ul0",
                "netns",
                self.netns,
            )
            sh("ip", "link", "set", f"patv{self.i}", "master", BRIDGE, "up")
            self.ns("ip", "addr", "add", f"{self.ip}/{PREFIX}", "dev", "ul0")
            self.ns("ip", "link", "set", "ul0", "up")
            self.ns("ip", "link", "set", "lo", "up")

    def ns(
        self, *argv: str, check: bool = True, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        return sh("ip", "netns", "exec", self.netns, *argv, check=check, timeout=timeout)

    def start(self) -> None:
        log = open(self.dir / "podnetd.log", "a")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                "nsenter",
                f"--net=/run/netns/{self.netns}",
                sys.executable,
                "-m",
                "podnet.api.daemon",
                "-c",
                str(self.config),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        wait_for(self.alive_socket, 20)

    def alive_socket(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(
                f"podnetd {self.name} exited {self.proc.returncode}: "
                + (self.dir / "podnetd.log").read_text()[-3000:]
            )
        try:
            self.call("status")
            return True
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                # killed, so that it serves no later test from this node's socket
                self.proc.kill()
                self.proc.wait(10)
                raise AssertionError(
                    f"podnetd {self.name} still running 30 s after signal {sig}: "
                    + (self.dir / "podnetd.log").read_text()[-2000:]
                ) from None

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        return call(op, self.socket, **args)

    def pod_exec(
        self,
        netns_path: str,
        *argv: str,
        check: bool = True,
        timeout: float = 30,
        user: int | None = None,
    ) -> subprocess.CompletedProcess[str]:
        cmd = ["nsenter", f"--net={netns_path}"]
        if user is not None:
            cmd += ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"]
        return sh(*cmd, *argv, check=check, timeout=timeout)

    def teardown(self) -> None:
        try:
            self.stop()
        finally:
            self._unplumb()

    def _unplumb(self) -> None:
        netns_dir = self.dir / "netns"
        for f in netns_dir.glob("pn-*"):
            with contextlib.suppress(OSError):
                subprocess.run(["umount", "-l", str(f)], check=False, capture_output=True)
                f.unlink()
        # podnetd made the directory a shared mount (as iproute2 does for /run/netns):
        # without this the session's temp dir stays mounted after the run
        if netns_dir.is_dir():
            subprocess.run(["umount", "-l", str(netns_dir)], check=False, capture_output=True)
        sh("ip", "netns", "del", self.netns, check=False)


@pytest.fixture(scope="session")
def cluster(workdir: Path, etcd: EtcdServer) -> Iterator[dict[str, Node]]:
    nodes: dict[str, Node] = {}
    try:
        for i in (1, 2, 3):
            nodes[f"n{i}"] = Node(i, workdir, etcd)
        yield nodes
    finally:
        for n in nodes.values():
            n.teardown()


def user_call(node: Node, as_uid: int, op: str, /, **args: Any) -> dict[str, Any]:
    """A request from an unprivileged process (real uid/gid `as_uid`)."""
    code = (
        "import json,sys;from podnet.api.client import call,ApiError\n"
        "try:\n print(json.dumps(call(sys.argv[1], sys.argv[2], **json.loads(sys.argv[3]))))\n"
        "except ApiError as e:\n"
        " print(json.dumps({'ok': False, 'code': e.code, 'message': e.message}))"
    )
    r = sh(
        "setpriv",
        f"--reuid={as_uid}",
        f"--regid={as_uid}",
        "--clear-groups",
        sys.executable,
        "-c",
        code,
        op,
        node.socket,
        json.dumps(args),
        timeout=60,
    )
    return dict(json.loads(r.stdout))


def set_dead_jobs(workdir: Path, ids: list[int]) -> None:
    """Make Slurm (the nodes' job source) forget these jobs."""
    (workdir / "dead-jobs").write_text("".join(f"{i}\n" for i in ids) or "\n")
