# SPDX-License-Identifier: Apache-2.0
"""`make bench-agent`: podnetd against the CNI bridge plugin, on a real etcd and real netns.

Prints one `NAME VALUE UNIT` line per figure (names from issue 3, docs/bench.md) and
writes them as JSON to build/bench/agent.json. Run as root. Everything it creates is
named with the prefix `pbn` (or lives under its own temp dir) and is removed on exit,
also when a phase fails or the run is interrupted.

Setup (one "node", as in tests/agent/conftest.py):
* host veth `pbnv0` 198.19.224.1/28 <-> `ul0` 198.19.224.2/28 in netns `pbn-n1`;
* etcd on http://198.19.224.1:<free port> (and 127.0.0.1), data in the temp dir,
  cluster `bench`, pod CIDR 198.19.128.0/18 (/26 blocks);
* one real podnetd in `pbn-n1` (node `pbnode1`), pod netns files on a tmpfs under the temp
  dir (a node's /run/netns is on its /run tmpfs);
* the CNI side: netns `pbn-cnih` plays the node (bridge `pbncni0`, 198.19.192.0/20,
  host-local IPAM data in the temp dir); each CNI pod is a netns `pbnc<i>` made by
  `ip netns add`;
* fake remote nodes (never sent to) at 198.19.208.0/20, their pods in 198.19.240.0/20
  (a job record per user; before issue 36 its nodes became the user's flood and unicast
  entries when the user's first pod came here, now nothing is programmed ahead); the
  allocation phase runs in-process in its own keyspace (cluster `pbnalloc`).
All addresses are inside the bench's 198.19.128.0/17 (RFC 2544 benchmarking space); none is
in 203.0.113.0/24, where this machine's package mirrors answer (203.0.113.80), and nothing
routes off the host.

Sizes can be lowered for a smoke run (PODNET_BENCH_PODS, PODNET_BENCH_RSS_PODS,
PODNET_BENCH_FIRST_POD_SAMPLES); a figure whose sample size is below the issue's
(>= 200 pods, 1000 live pods) is then not printed, only noted in the JSON.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import ipaddress
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "agent" / "src"))

from podnet.api.client import call  # noqa: E402
from podnet.names import Keys, vxlan_name  # noqa: E402
from podnet.state.alloc import Allocator  # noqa: E402
from podnet.state.etcdops import op_put  # noqa: E402
from podnet.state.ipam import Ipam  # noqa: E402
from podnet.state.store import Etcd  # noqa: E402

ETCD = os.environ.get("PODNET_BENCH_ETCD", "/usr/bin/etcd")
CNI_PATH = os.environ.get("PODNET_BENCH_CNI_PATH", "/usr/lib/cni")
OUT = REPO / "build" / "bench" / "agent.json"

HOST_VETH = "pbnv0"
UNDERLAY = ipaddress.IPv4Network("198.19.224.0/28")
HOST_IP = str(UNDERLAY[1])
NODE_IP = str(UNDERLAY[2])
UNDERLAY_PREFIX = UNDERLAY.prefixlen
NODE_NETNS = "pbn-n1"
NODE = "pbnode1"
CLUSTER = "bench"
ZONE = "bench"
POD_CIDR = "198.19.128.0/18"
BLOCK_PREFIX = 26
VNI_MIN, VNI_MAX = 5000, 9999
CNI_HOST_NETNS = "pbn-cnih"
NS = ("ip", "netns", "exec", NODE_NETNS)
CNI_BRIDGE = "pbncni0"
CNI_SUBNET = "198.19.192.0/20"
FAKE_VTEPS = ipaddress.IPv4Network("198.19.208.0/20")
#: addresses of the fake nodes' pods (records only: no block, never routed)
FAKE_PODS = ipaddress.IPv4Network("198.19.240.0/20")
ALLOC_CLUSTER = "pbnalloc"
ALLOC_CIDR = "198.19.128.0/18"  # its own keyspace: 1024 blocks of /28 for 1000 fake nodes
ALLOC_BLOCK_PREFIX = 28

SETUP_PODS = int(os.environ.get("PODNET_BENCH_PODS", "200"))
MIN_SETUP_PODS = 200  # issue 3: >= 200 pods
WARMUP_PODS = 20
USERS = 4  # pods are spread over a few users (a Linux bridge holds at most 1024 ports)
FIRST_POD_SAMPLES = int(os.environ.get("PODNET_BENCH_FIRST_POD_SAMPLES", "25"))
VTEP_COUNTS = (0, 100, 400)
RSS_PODS = int(os.environ.get("PODNET_BENCH_RSS_PODS", "1000"))
# podnetd's setup time grows with the live pods; past this budget the phase stops and
# rss_1000_pods is not printed (the RSS at the count reached is in the JSON)
RSS_BUDGET = float(os.environ.get("PODNET_BENCH_RSS_BUDGET", "1500"))
# loaded mode: one CPU-bound process per core at normal priority (a neighbour job), the
# same phases again, figures with the suffix _loaded (PODNET_BENCH_LOADED=0: off)
LOADED = os.environ.get("PODNET_BENCH_LOADED", "1") != "0"
# podnetd's scheduling priority, as the production unit sets it (agent_nice); etcd and the
# CNI plugin get the same (etcd stands for a control node that jobs do not load)
NICE = int(os.environ.get("PODNET_BENCH_NICE", "-5"))
ALLOC_NODES = (100, 400, 1000)
ALLOC_RUNS = 7
BASE_UID = 30000

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def with_priority(nice: int) -> list[str]:
    """A command prefix: the child dies with the bench and runs at `nice`.

    Not a preexec_fn: the bench's etcd client is gRPC, whose fork handler can abort a Python
    child between fork and exec ("epoll_wait error: Bad file descriptor", rc -6; grpc/grpc#43055,
    seen 2026-11-27 for the CNI plugin and 2026-11-28 for podnetd's restart at nice 0).
    Without preexec_fn Python starts the child with vfork, and no fork handler runs; setpriv and
    nice exec in place, so the pid stays the program's own (podnetd's VmRSS).
    """
    delta = nice - os.getpriority(os.PRIO_PROCESS, 0)
    return ["setpriv", "--pdeathsig", "TERM", "nice", "-n", str(delta)]


class CpuLoad:
    """One CPU-bound process per core at normal priority, as a neighbour job would be."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> CpuLoad:
        for _ in range(self.n):
            self.procs.append(
                subprocess.Popen([*with_priority(0), sys.executable, "-c", "while True: pass"])
            )
        time.sleep(0.5)  # let them settle on the cores
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait(10)
        self.procs.clear()


def log(msg: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def sh(*argv: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, text=True, capture_output=True, **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < end:
        try:
            last = fn()
            if last:
                return last
        except Exception as e:
            last = e
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}: {last!r}")


def pct(samples: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(samples)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def unmount_netns(netns_dir: Path) -> None:
    """Lazily unmount podnetd's pod netns files and their directory (podnetd's shared bind
    mount, then the bench's tmpfs under it)."""
    if netns_dir.is_dir():
        for f in netns_dir.iterdir():
            sh("umount", "-l", str(f), check=False)
        for _ in range(4):
            if not os.path.ismount(netns_dir):
                break
            sh("umount", "-l", str(netns_dir), check=False)


class Interrupted(Exception):
    pass


def _on_signal(signum: int, frame: FrameType | None) -> None:
    del frame
    raise Interrupted(f"signal {signum}")


class Bench:
    def __init__(self, config: dict[str, Any] | None = None) -> None:
        #: cluster configuration settings over the bench's own (bench_cni: its quotas)
        self.config = config or {}
        self.dir = Path(tempfile.mkdtemp(prefix="pbn-bench-"))
        self.dir.chmod(0o755)
        (self.dir / "bench.pid").write_text(f"{os.getpid()}\n")
        self.node_dir = self.dir / NODE
        self.socket = str(self.node_dir / "podnetd.sock")
        self.etcd_proc: subprocess.Popen[bytes] | None = None
        self.podnetd: subprocess.Popen[bytes] | None = None
        self.etcd_url = ""
        self.etcd: Etcd | None = None
        self.cni_netns: list[str] = []
        self.figures: dict[str, tuple[float, str]] = {}
        self.extra: dict[str, Any] = {}
        self.keys = Keys(CLUSTER)
        self.next_job = 1
        self.next_user = 100  # first-pod users: a new one per sample

    # -- plumbing ----------------------------------------------------------------------
    def remove_leftovers(self) -> None:
        """A previous run killed with SIGKILL may have left our (exactly named) objects."""
        for ns in (NODE_NETNS, CNI_HOST_NETNS):
            if Path(f"/run/netns/{ns}").exists():
                sh("ip", "netns", "del", ns, check=False)
        for p in Path("/run/netns").glob("pbnc[0-9]*"):
            sh("ip", "netns", "del", p.name, check=False)
        sh("ip", "link", "del", HOST_VETH, check=False)
        for d in Path(tempfile.gettempdir()).glob("pbn-bench-*"):
            if d == self.dir or not d.is_dir():
                continue
            try:
                pid = int((d / "bench.pid").read_text())
                os.kill(pid, 0)
                continue  # another live run
            except (OSError, ValueError):
                pass
            unmount_netns(d / NODE / "netns")
            shutil.rmtree(d, ignore_errors=True)

    def underlay(self) -> None:
        sh("ip", "netns", "add", NODE_NETNS)
        sh(
            "ip",
            "link",
            "add",
            HOST_VETH,
            "type",
            "veth",
            "peer",
            "name",
            "ul0",
            "netns",
            NODE_NETNS,
        )
        sh("ip", "addr", "add", f"{HOST_IP}/{UNDERLAY_PREFIX}", "dev", HOST_VETH)
        sh("ip", "link", "set", HOST_VETH, "up")
        ns = NS
        sh(*ns, "ip", "addr", "add", f"{NODE_IP}/{UNDERLAY_PREFIX}", "dev", "ul0")
        sh(*ns, "ip", "link", "set", "ul0", "up")
        sh(*ns, "ip", "link", "set", "lo", "up")

    def start_etcd(self) -> None:
        port, peer = free_port(), free_port()
        self.etcd_url = f"http://{HOST_IP}:{port}"
        logf = open(self.dir / "etcd.log", "w")  # noqa: SIM115
        self.etcd_proc = subprocess.Popen(
            [
                *with_priority(NICE),
                ETCD,
                "--name",
                "pbn",
                "--data-dir",
                str(self.dir / "etcd"),
                "--listen-client-urls",
                f"{self.etcd_url},http://127.0.0.1:{port}",
                "--advertise-client-urls",
                self.etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"pbn=http://127.0.0.1:{peer}",
                "--max-txn-ops",
                "16384",
                "--max-request-bytes",
                "16777216",
                "--log-level",
                "warn",
            ],
            stdout=logf,
            stderr=subprocess.STDOUT,
        )
        logf.close()
        self.etcd = Etcd([f"http://127.0.0.1:{port}"], None, None, None, 30.0)
        wait_for(self.etcd.status, 30, "etcd")
        self.extra["etcd_version"] = str(self.etcd.status().get("version", "?"))
        self.etcd.put(
            self.keys.config,
            {
                "pod_cidr": POD_CIDR,
                "block_prefix": BLOCK_PREFIX,
                "zone": ZONE,
                "vxlan_port": 4789,
                "underlay_mtu": 1500,
                "vni_min": VNI_MIN,
                "vni_max": VNI_MAX,
                "host_cidrs": [str(UNDERLAY)],
                "dns_servers": [HOST_IP],
                "search_domains": [],
                "login_lease_ttl": 30,
                "login_grace": 5.0,
                **self.config,
            },
        )

    def start_podnetd(self, nice: int = NICE) -> None:
        self.node_dir.mkdir(parents=True, exist_ok=True)
        self.node_dir.chmod(0o755)
        # podnetd's netns files on a tmpfs, as under a node's /run/netns (agent_netns_dir):
        # a Debian node's /run is a tmpfs; this host's temp dir (and /run) is ext4, where
        # each pod's file cost an inode allocation in the journal
        netns_dir = self.node_dir / "netns"
        netns_dir.mkdir(exist_ok=True)
        if not os.path.ismount(netns_dir):
            sh(
                "mount",
                "-t",
                "tmpfs",
                "-o",
                "mode=0755,size=16m",
                "pbn-bench-netns",
                str(netns_dir),
            )
        config = self.node_dir / "podnet.yaml"
        config.write_text(
            json.dumps(
                {
                    "node": NODE,
                    "underlay_interface": "ul0",
                    "underlay_ip": NODE_IP,
                    "cluster": CLUSTER,
                    "etcd_endpoints": [self.etcd_url],
                    "socket": self.socket,
                    "netns_dir": str(self.node_dir / "netns"),
                    "resolv_dir": str(self.node_dir / "resolv"),
                    "state_dir": str(self.node_dir / "state"),
                    # every job id the bench uses is live; no GC pass during the run
                    "job_source": ["seq", "1", "200000"],
                    "gc_interval": 3600,
                    # user_first_pod_* measure a user's first pod, bridge and VXLAN
                    # included: each sample's user network goes with its pod
                    "user_net_linger": 0,
                    "log_level": "warning",
                }
            )
        )
        logf = open(self.node_dir / "podnetd.log", "a")  # noqa: SIM115
        # nsenter execs podnetd in place: the pid is podnetd's own (for VmRSS)
        self.podnetd = subprocess.Popen(
            [
                *with_priority(nice),
                "nsenter",
                f"--net=/run/netns/{NODE_NETNS}",
                sys.executable,
                "-m",
                "podnet.api.daemon",
                "-c",
                str(config),
            ],
            stdout=logf,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO / "agent" / "src")},
        )
        logf.close()

        def alive() -> bool:
            assert self.podnetd is not None
            if self.podnetd.poll() is not None:
                raise SystemExit(
                    f"podnetd exited {self.podnetd.returncode}: "
                    + (self.node_dir / "podnetd.log").read_text()[-3000:]
                )
            try:
                call("status", self.socket)
                return True
            except OSError:
                return False

        wait_for(alive, 30, "podnetd")

    def stop_podnetd(self) -> None:
        p = self.podnetd
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)

    def cleanup(self) -> None:
        self.stop_podnetd()
        unmount_netns(self.node_dir / "netns")
        for ns in self.cni_netns:
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "netns", "del", CNI_HOST_NETNS, check=False)
        sh("ip", "netns", "del", NODE_NETNS, check=False)  # its veths, bridges, VXLANs go too
        sh("ip", "link", "del", HOST_VETH, check=False)
        if self.etcd_proc is not None and self.etcd_proc.poll() is None:
            self.etcd_proc.terminate()
            try:
                self.etcd_proc.wait(15)
            except subprocess.TimeoutExpired:
                self.etcd_proc.kill()
                self.etcd_proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- podnet requests ---------------------------------------------------------------
    def user(self, i: int) -> tuple[str, int]:
        return f"pbu{i}", BASE_UID + i

    def job_up(self, user: tuple[str, int], job_id: int | None = None) -> tuple[int, float]:
        if job_id is None:
            job_id = self.next_job
            self.next_job += 1
        t0 = time.perf_counter()
        r = call(
            "job_up",
            self.socket,
            job_id=job_id,
            user=user[0],
            uid=user[1],
            job_name=f"bench{job_id % 7}",
            nodes=[NODE],
            node_index=0,
        )
        dt = time.perf_counter() - t0
        pod = r["pod"]
        if pod["job_id"] != job_id or not Path(pod["netns"]).exists():
            raise RuntimeError(f"job_up {job_id}: unexpected reply {r}")
        ipaddress.IPv4Address(pod["ip"])
        return job_id, dt

    def check_pod(self, job_id: int) -> None:
        """Not timed: the pod podnetd called ready has its address and default route."""
        pod = call("job_get", self.socket, job_id=job_id)["pod"]
        nsenter = ("nsenter", f"--net={pod['netns']}", "ip", "-4", "-o")
        addrs = sh(*nsenter, "addr", "show", "dev", "eth0").stdout
        routes = sh(*nsenter, "route", "show", "default").stdout
        if f" {pod['ip']}/" not in addrs or "default via" not in routes:
            raise RuntimeError(f"pod of job {job_id} not ready: {addrs!r} {routes!r}")

    def job_down(self, job_id: int) -> float:
        t0 = time.perf_counter()
        r = call("job_down", self.socket, job_id=job_id)
        dt = time.perf_counter() - t0
        if not r.get("released"):
            raise RuntimeError(f"job_down {job_id}: {r}")
        return dt

    def podnetd_cpu_ticks(self) -> int:
        assert self.podnetd is not None
        fields = Path(f"/proc/{self.podnetd.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    def quiesce(self, timeout: float = 10.0) -> None:
        """Wait until podnetd used no CPU for 0.1 s (its watch-triggered sync is done)."""
        time.sleep(0.1)
        end = time.monotonic() + timeout
        last = self.podnetd_cpu_ticks()
        while time.monotonic() < end:
            time.sleep(0.1)
            now = self.podnetd_cpu_ticks()
            if now == last:
                return
            last = now
        log(f"podnetd still busy {timeout} s after the last request; going on")
        self.extra["quiesce_timeouts"] = int(self.extra.get("quiesce_timeouts", 0)) + 1

    def pod_count(self) -> int:
        return len(call("pods", self.socket)["pods"])

    # -- phases ------------------------------------------------------------------------
    def phase_setup_teardown(self, suffix: str = "") -> list[int]:
        """Warm daemon: every user already has a pod (its bridge and VXLAN) on the node.
        With a suffix (a loaded run), the anchors go at the end and the one-live detail is
        not measured again."""
        users = [self.user(i) for i in range(USERS)]
        anchors = [self.job_up(u)[0] for u in users]
        for i in range(WARMUP_PODS):
            jid, _ = self.job_up(users[i % USERS])
            self.job_down(jid)
        setup: list[float] = []
        jobs: list[int] = []
        for i in range(SETUP_PODS):
            jid, dt = self.job_up(users[i % USERS])
            setup.append(dt)
            jobs.append(jid)
            if i == 0:
                self.check_pod(jid)
        if self.pod_count() != USERS + SETUP_PODS:
            raise RuntimeError(
                f"expected {USERS + SETUP_PODS} pods, podnetd lists {self.pod_count()}"
            )
        teardown = [self.job_down(j) for j in jobs]
        self.figure(f"pod_setup_p50{suffix}", ms(pct(setup, 50)), "ms")
        self.figure(f"pod_setup_p99{suffix}", ms(pct(setup, 99)), "ms")
        self.figure(f"pod_teardown_p50{suffix}", ms(pct(teardown, 50)), "ms")
        self.samples(f"pod_setup{suffix}", setup)
        self.extra[f"pod_setup_samples{suffix}"] = len(setup)
        self.extra[f"pod_teardown_p99{suffix}_ms"] = ms(pct(teardown, 99))
        if suffix:
            for j in anchors:
                self.job_down(j)
            return []
        # detail only: the same number of pods made and removed one at a time (so only the
        # anchors + 1 pod are live), to separate per-pod cost from the live-pod count
        cycled: list[float] = []
        for i in range(SETUP_PODS):
            jid, dt = self.job_up(users[i % USERS])
            cycled.append(dt)
            self.job_down(jid)
        self.extra["pod_setup_p50_one_live_ms"] = ms(pct(cycled, 50))
        self.extra["pod_setup_p99_one_live_ms"] = ms(pct(cycled, 99))
        return anchors

    def figure(self, name: str, value: float, unit: str) -> None:
        """A printed figure (names ending in _nice0 etc. are details: JSON only)."""
        if name.endswith(tuple(DETAIL_SUFFIXES)):
            self.extra[f"{name}_{unit}"] = value
        else:
            self.figures[name] = (value, unit)

    def samples(self, name: str, xs: list[float]) -> None:
        """Raw samples (ms) in the JSON, for plots (tests/bench/plot_cdf.py)."""
        self.extra.setdefault("samples_ms", {})[name] = [ms(x) for x in xs]

    def phase_first_pod(self, suffix: str = "", vtep_counts: tuple[int, ...] = VTEP_COUNTS) -> None:
        assert self.etcd is not None
        alloc = Allocator(
            self.etcd,
            self.keys,
            Ipam(ipaddress.IPv4Network(POD_CIDR), BLOCK_PREFIX),
            ZONE,
            VNI_MIN,
            VNI_MAX,
        )
        # the user's other pods: a job record naming n fake nodes, registered at fake
        # underlay addresses. Before issue 36 podnetd gave the user's first pod here n flood
        # and n unicast entries from it; now it programs none (the VXLAN asks for a remote
        # pod when a pod first sends to it: node/overlay.py), whatever n
        fakes = [f"pbnfake{j}" for j in range(max(vtep_counts, default=0))]
        self.etcd.put_many(
            op_put(self.keys.node(f), {"ip": str(FAKE_VTEPS[j + 1]), "roles": ["compute"]})
            for j, f in enumerate(fakes)
        )
        self.quiesce()
        for n in vtep_counts:
            samples: list[float] = []
            for s in range(FIRST_POD_SAMPLES + 1):  # the first round is a warm-up
                self.next_user += 1
                user = self.user(self.next_user)
                vni = alloc.user_vni(*user)
                other = 990000 + self.next_user
                if n:
                    ips = [str(FAKE_PODS[j + 1]) for j in range(n)]
                    rec = {
                        "job_id": other,
                        "user": user[0],
                        "uid": user[1],
                        "name": "other",
                        "label": "other",
                        "nodes": fakes[:n],
                        "ips": ips,
                        "vni": vni,
                        "created": time.time(),
                    }
                    self.etcd.put(self.keys.job(other), rec)
                self.quiesce()  # podnetd's watch has seen the records: they predate the job
                jid, dt = self.job_up(user)
                if s == 0:  # nothing of the other pods is programmed ahead
                    fdb = sh(*NS, "bridge", "fdb", "show", "dev", vxlan_name(vni)).stdout
                    remote = [w for w in map(str.split, fdb.splitlines()) if "dst" in w]
                    if remote:
                        raise RuntimeError(f"VNI {vni}: entries programmed ahead: {remote}")
                if s > 0:
                    samples.append(dt)
                self.job_down(jid)
                self.etcd.delete(self.keys.job(other))
            self.figure(f"user_first_pod_p99_vteps{n}{suffix}", ms(pct(samples, 99)), "ms")
            self.extra[f"user_first_pod_p50_vteps{n}{suffix}_ms"] = ms(pct(samples, 50))
            self.extra[f"user_first_pod_samples_vteps{n}{suffix}"] = len(samples)

    def phase_rss(self, anchors: list[int]) -> None:
        assert self.podnetd is not None
        if RSS_PODS <= 0:  # PODNET_BENCH_RSS_PODS=0: the phase is off
            log("RSS phase skipped (PODNET_BENCH_RSS_PODS=0)")
            for j in anchors:
                self.job_down(j)
            return
        users = [self.user(i) for i in range(USERS)]
        jobs = []
        setup = []
        end = time.monotonic() + RSS_BUDGET
        for i in range(RSS_PODS - len(anchors)):
            if time.monotonic() > end:
                log(f"RSS phase over its {RSS_BUDGET:.0f} s budget at {len(anchors) + i} pods")
                break
            jid, dt = self.job_up(users[i % USERS])
            jobs.append(jid)
            setup.append(dt)
            if (len(anchors) + i + 1) % 100 == 0:
                log(f"{len(anchors) + i + 1} pods, last setup {ms(dt)} ms")
        live = self.pod_count()
        if live != len(anchors) + len(jobs):
            raise RuntimeError(f"expected {len(anchors) + len(jobs)} pods, podnetd lists {live}")
        status = Path(f"/proc/{self.podnetd.pid}/status").read_text()
        if "python" not in Path(f"/proc/{self.podnetd.pid}/cmdline").read_text():
            raise RuntimeError("the podnetd pid is not the python process")
        kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        if live == 1000:
            self.figures["rss_1000_pods"] = (round(kb / 1024, 1), "MB")
        self.extra["rss_live_pods"] = live
        self.extra["rss_at_live_pods_mb"] = round(kb / 1024, 1)
        if setup:  # none when the anchors alone reach RSS_PODS
            self.extra["pod_setup_p50_last200_of_rss_phase_ms"] = ms(pct(setup[-200:], 50))
            self.extra["pod_setup_p99_last200_of_rss_phase_ms"] = ms(pct(setup[-200:], 99))
        down = [self.job_down(j) for j in jobs + anchors]
        self.extra["pod_teardown_p50_from_1000_ms"] = ms(pct(down, 50))
        if self.pod_count() != 0:
            raise RuntimeError("pods left after teardown")

    def phase_cni(self, suffix: str = "") -> None:
        sh("ip", "netns", "add", CNI_HOST_NETNS)
        sh("ip", "netns", "exec", CNI_HOST_NETNS, "ip", "link", "set", "lo", "up")
        conf = json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "pbncni",
                "type": "bridge",
                "bridge": CNI_BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "subnet": CNI_SUBNET,
                    "dataDir": str(self.dir / "cni-ipam"),
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }
        )
        # The plugin runs in pbn-cnih at podnetd's nice: this thread enters both and the
        # plugin, its child, inherits them. Not a preexec_fn: the bench's etcd client is
        # gRPC, whose fork handler can abort a Python child between fork and exec
        # ("epoll_wait error: Bad file descriptor", rc -6, seen 2026-11-27; grpc/grpc#43055).
        fd = os.open(f"/run/netns/{CNI_HOST_NETNS}", os.O_RDONLY | os.O_CLOEXEC)
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        nice = os.getpriority(os.PRIO_PROCESS, 0)  # this thread's (Linux: per thread)
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {CNI_HOST_NETNS}")
        os.setpriority(os.PRIO_PROCESS, 0, NICE)  # as podnetd's
        try:
            self._cni_runs(conf, suffix)
        finally:
            if _libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the host")
            os.setpriority(os.PRIO_PROCESS, 0, nice)
            os.close(home)
            os.close(fd)
        sh("ip", "netns", "del", CNI_HOST_NETNS)

    def _cni_runs(self, conf: str, suffix: str) -> None:
        """ADD and DEL of the CNI bridge plugin, run from pbn-cnih (phase_cni)."""

        def plugin(cmd: str, i: int) -> subprocess.CompletedProcess[str]:
            env = {
                "CNI_COMMAND": cmd,
                "CNI_CONTAINERID": f"pbnc{i}",
                "CNI_NETNS": f"/run/netns/pbnc{i}",
                "CNI_IFNAME": "eth0",
                "CNI_PATH": CNI_PATH,
                "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            }
            r = subprocess.run(
                [f"{CNI_PATH}/bridge"],
                input=conf,
                env=env,
                text=True,
                capture_output=True,
                check=False,
            )
            if r.returncode != 0:
                raise RuntimeError(f"CNI {cmd} pbnc{i}: rc {r.returncode}: {r.stdout} {r.stderr}")
            return r

        cni_net = ipaddress.IPv4Network(CNI_SUBNET)
        add: list[float] = []
        with_netns: list[float] = []
        total = WARMUP_PODS + SETUP_PODS
        for i in range(total):
            t0 = time.perf_counter()
            self.cni_netns.append(f"pbnc{i}")
            sh("ip", "netns", "add", f"pbnc{i}")
            t1 = time.perf_counter()
            r = plugin("ADD", i)
            t2 = time.perf_counter()
            ips = json.loads(r.stdout).get("ips") or []
            if not ips or ipaddress.IPv4Interface(ips[0]["address"]).ip not in cni_net:
                raise RuntimeError(f"CNI ADD pbnc{i}: no address in {r.stdout}")
            if i >= WARMUP_PODS:
                add.append(t2 - t1)
                with_netns.append(t2 - t0)
        delete: list[float] = []
        for i in range(total):
            t0 = time.perf_counter()
            plugin("DEL", i)
            delete.append(time.perf_counter() - t0)
            sh("ip", "netns", "del", f"pbnc{i}")
        self.cni_netns.clear()
        self.figure(f"cni_bridge_p50{suffix}", ms(pct(add, 50)), "ms")
        self.figure(f"cni_bridge_p99{suffix}", ms(pct(add, 99)), "ms")
        self.samples(f"cni_bridge{suffix}", add)
        self.extra[f"cni_bridge_with_netns_add_p50{suffix}_ms"] = ms(pct(with_netns, 50))
        self.extra[f"cni_bridge_with_netns_add_p99{suffix}_ms"] = ms(pct(with_netns, 99))
        self.extra[f"cni_del_p50{suffix}_ms"] = ms(pct(delete, 50))
        self.extra[f"cni_samples{suffix}"] = len(add)

    def phase_alloc(self) -> None:
        """Allocator.allocate_job in-process against the real etcd (podnetd is stopped): a
        job's first node (the job's record and name, its pod, the records under the name)
        and its last node (its pod, its record under the name), in jobs of n nodes whose
        other nodes have not come yet: what each node sends does not grow with the job."""
        assert self.etcd is not None
        alloc = Allocator(
            self.etcd,
            Keys(ALLOC_CLUSTER),
            Ipam(ipaddress.IPv4Network(ALLOC_CIDR), ALLOC_BLOCK_PREFIX),
            ZONE,
            VNI_MIN,
            VNI_MAX,
        )
        user, uid = "pbualloc", BASE_UID + 9999
        vni = alloc.user_vni(user, uid)
        job_id = 150000

        def node_up(job_id: int, nodes: list[str], index: int) -> float:
            t0 = time.perf_counter()
            later: list[Any] = []
            alloc.allocate_job(job_id, user, uid, f"a{len(nodes)}", nodes, vni, index, later)
            for run in later:
                run()
            return time.perf_counter() - t0

        for n in ALLOC_NODES:
            nodes = [f"pbnfake{i:04d}" for i in range(n)]
            alloc.load_view()
            # warm-up (not timed): the first job on a fake node claims its address block
            job_id += 1
            node_up(job_id, nodes, 0)
            node_up(job_id, nodes, n - 1)
            job = alloc.get_job(job_id)
            assert job is not None
            alloc.release_job(job)
            first: list[float] = []
            last: list[float] = []
            for _ in range(ALLOC_RUNS):
                job_id += 1
                first.append(node_up(job_id, nodes, 0))
                last.append(node_up(job_id, nodes, n - 1))
                job = alloc.get_job(job_id)
                if job is None or len({p.ip for p in alloc.pods_of(job)}) != min(n, 2):
                    raise RuntimeError(f"job {job_id}: not two pods of their own")
                alloc.release_job(job)
            self.figures[f"alloc_job_nodes{n}"] = (ms(statistics.median(first)), "ms")
            self.figures[f"alloc_pod_nodes{n}"] = (ms(statistics.median(last)), "ms")
            self.extra[f"alloc_job_nodes{n}_runs_ms"] = [ms(r) for r in first]
            self.extra[f"alloc_pod_nodes{n}_runs_ms"] = [ms(r) for r in last]

    # -- run ---------------------------------------------------------------------------
    def run(self) -> None:
        t0 = time.monotonic()
        self.remove_leftovers()
        self.underlay()
        self.start_etcd()
        self.start_podnetd()
        log("podnetd up; pod setup/teardown")
        anchors = self.phase_setup_teardown()
        log("first pod of a new user vs VTEP count")
        self.phase_first_pod()
        log(f"{RSS_PODS} live pods")
        self.phase_rss(anchors)
        if LOADED:
            self.phase_loaded_podnetd()
        self.stop_podnetd()
        log("CNI bridge + host-local")
        self.phase_cni()
        if LOADED:
            log(f"loaded: CNI bridge, {os.cpu_count()} CPU-bound processes")
            with CpuLoad(os.cpu_count() or 1):
                self.phase_cni("_loaded")
        log("allocation")
        self.phase_alloc()
        for suffix in ("", "_loaded"):
            if (
                f"pod_setup_p50{suffix}" in self.figures
                and f"cni_bridge_p50{suffix}" in self.figures
            ):
                self.figures[f"cni_over_podnet_p50{suffix}"] = (
                    round(
                        self.figures[f"cni_bridge_p50{suffix}"][0]
                        / self.figures[f"pod_setup_p50{suffix}"][0],
                        2,
                    ),
                    "ratio",
                )
        self.extra["run_seconds"] = round(time.monotonic() - t0, 1)
        self.hold_back_undersized()

    def phase_loaded_podnetd(self) -> None:
        """The same phases with every core busy; then, as a detail, podnetd at the
        neighbours' priority (nice 0) to show what its own priority buys."""
        log(f"loaded: pod setup/teardown, first pods ({os.cpu_count()} CPU-bound processes)")
        with CpuLoad(os.cpu_count() or 1):
            self.phase_setup_teardown("_loaded")
            self.phase_first_pod("_loaded")
            if NICE != 0:
                log("loaded, podnetd at nice 0 (detail)")
                self.stop_podnetd()
                self.start_podnetd(nice=0)
                self.phase_setup_teardown("_loaded_nice0")
                self.phase_first_pod("_loaded_nice0", (400,))
        self.extra["nice"] = NICE

    def hold_back_undersized(self) -> None:
        """A smoke run (lowered sizes) measures, but does not print, figures below spec."""
        short: list[str] = []
        if SETUP_PODS < MIN_SETUP_PODS:
            short += [
                f"{name}{suffix}"
                for name in (
                    "pod_setup_p50",
                    "pod_setup_p99",
                    "pod_teardown_p50",
                    "cni_bridge_p50",
                    "cni_bridge_p99",
                    "cni_over_podnet_p50",
                )
                for suffix in ("", "_loaded")
            ]
        for name in short:
            if name in self.figures:
                value, unit = self.figures.pop(name)
                self.extra[f"undersized_{name}"] = f"{value} {unit}"


DETAIL_SUFFIXES = ("_nice0",)

ORDER = [
    "pod_setup_p50",
    "pod_setup_p99",
    "pod_teardown_p50",
    "cni_bridge_p50",
    "cni_bridge_p99",
    "cni_over_podnet_p50",
    "user_first_pod_p99_vteps0",
    "user_first_pod_p99_vteps100",
    "user_first_pod_p99_vteps400",
    "alloc_job_nodes100",
    "alloc_job_nodes400",
    "alloc_job_nodes1000",
    "alloc_pod_nodes100",
    "alloc_pod_nodes400",
    "alloc_pod_nodes1000",
    "rss_1000_pods",
    "pod_setup_p50_loaded",
    "pod_setup_p99_loaded",
    "pod_teardown_p50_loaded",
    "cni_bridge_p50_loaded",
    "cni_bridge_p99_loaded",
    "cni_over_podnet_p50_loaded",
    "user_first_pod_p99_vteps0_loaded",
    "user_first_pod_p99_vteps100_loaded",
    "user_first_pod_p99_vteps400_loaded",
]


def main() -> int:
    if os.geteuid() != 0:
        print("bench_agent: needs root (netns, veth, nftables)", file=sys.stderr)
        return 2
    for tool in (ETCD, f"{CNI_PATH}/bridge", f"{CNI_PATH}/host-local"):
        if not Path(tool).exists():
            print(f"bench_agent: {tool} missing (make deps)", file=sys.stderr)
            return 2
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    b = Bench()
    load_start = os.getloadavg()
    try:
        b.run()
    except BaseException:
        plog = b.node_dir / "podnetd.log"
        if plog.exists():
            log("failed; podnetd log tail:\n" + plog.read_text()[-2000:])
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        b.cleanup()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    for name in ORDER:
        if name in b.figures:
            value, unit = b.figures[name]
            print(f"{name} {value} {unit}", flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "figures": {
                    n: {"value": b.figures[n][0], "unit": b.figures[n][1]}
                    for n in ORDER
                    if n in b.figures
                },
                "sizes": {
                    "setup_pods": SETUP_PODS,
                    "warmup_pods": WARMUP_PODS,
                    "users": USERS,
                    "first_pod_samples": FIRST_POD_SAMPLES,
                    "rss_pods": RSS_PODS,
                    "alloc_runs": ALLOC_RUNS,
                    "loaded": LOADED,
                    "nice": NICE,
                },
                "extra": b.extra,
                "host": {
                    "cpus": os.cpu_count(),
                    "kernel": os.uname().release,
                    # the machine is shared: figures move with what else runs
                    "loadavg_1_5_15_start": [round(x, 2) for x in load_start],
                    "loadavg_1_5_15_end": [round(x, 2) for x in os.getloadavg()],
                },
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            indent=2,
        )
        + "\n"
    )
    log(f"wrote {OUT} in {b.extra.get('run_seconds')} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
