#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Time to set up one job of 100, 400 and 1000 nodes, the way the pcocc paper measures it.

Every simulated node is a process of its own (`PODNET_SCALE_NODES_PER_PROC` = 1), like the
podnetd of a real node: its own `Allocator`, IPAM view and etcd client, running podnetd's
own etcd code path for a job pod against a real etcd on loopback, with podnetd's watches
open (none of them follows jobs: a job start reaches its own nodes only):
`Allocator.allocate_job` (each node allocates its own pod in one transaction; the
first node also writes the job's record and name), overlapped with the netns creation,
then the pod's record under the job name (the first node: those of the pods before it),
overlapped with the wiring. The kernel part is replaced by its measured cost
(`PODNET_SCALE_NETNS_MS`, `PODNET_SCALE_WIRE_MS`: the split of `pod_setup_p50` in
docs/bench.md), slept, not run.

Per job, the coordinator sends every node the job and a start time (a common deadline a
little ahead, as Slurm starts the job's prologs together); each node sleeps until then and
measures from that instant to its pod published. The job's time is the maximum over its
nodes (the paper's Figure 2), averaged over `PODNET_SCALE_JOBS` jobs (>= 10) per size;
then as many jobs whose node path does nothing (`harness_max_node_ms_nodes<n>`: the
harness's own cost on this host).
A node counts itself done in shared memory; the samples are sent after the job (a node's
process waking to report would take a core from nodes still starting, which no cluster
makes them share).

What the figure means on this machine: every node's client CPU (Python, HTTP, JSON) and
etcd share this host's cores, where a cluster gives each node its own and etcd its own
servers. So the bench also measures, per job: the CPU the nodes spent (sum and per node),
each node's run-queue wait (time ready to run but without a core, from schedstat), etcd's
CPU and run-queue wait, and how many cores the whole machine was busy. etcd and the first
node run at `PODNET_SCALE_PRIORITY_NICE` (-10), the other nodes at `PODNET_SCALE_NODE_NICE`
(19): on a cluster etcd does not share a CPU with the nodes' podnetd (the first node kept
its priority of the runs before node-owned allocation, when its allocation was on every
node's path, so that runs compare); the other nodes still share this host's cores among
themselves, which a cluster does not make them do.

Prints `NAME VALUE UNIT` lines, writes build/bench/scale.json and
build/bench/job-start-scale.svg. `bench_scale.py --plot OUT.svg RUN.json...` redraws the
figure from one or more runs (docs/img/job-start-scale.svg).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import multiprocessing as mp
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "agent/src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from podnet.names import Keys  # noqa: E402
from podnet.state.alloc import Allocator, Job, JobPod  # noqa: E402
from podnet.state.etcdops import KV, op_put  # noqa: E402
from podnet.state.ipam import Ipam  # noqa: E402
from podnet.state.store import Etcd  # noqa: E402
from podnet.state.watchrecords import WATCHED, record_of  # noqa: E402
from svgplot import Reference, Series, xy_chart  # noqa: E402

ETCD = os.environ.get("PODNET_BENCH_ETCD", "/usr/bin/etcd")
SIZES = [int(x) for x in os.environ.get("PODNET_SCALE_SIZES", "100,400,1000").split(",")]
JOBS = int(os.environ.get("PODNET_SCALE_JOBS", "10"))
NETNS_MS = float(os.environ.get("PODNET_SCALE_NETNS_MS", "1.8"))
WIRE_MS = float(os.environ.get("PODNET_SCALE_WIRE_MS", "4.0"))
NODES_PER_PROC = max(1, int(os.environ.get("PODNET_SCALE_NODES_PER_PROC", "1")))
PRIORITY_NICE = int(os.environ.get("PODNET_SCALE_PRIORITY_NICE", "-10"))
NODE_NICE = int(os.environ.get("PODNET_SCALE_NODE_NICE", "19"))
#: podnetd's watches open on every node (they carry nothing at a job start; gRPC's client
#: polls each open stream a few times a second, which 1000 nodes on this host's two cores
#: pay and a cluster's nodes do not: 0 shows the job start without that)
WATCHES = os.environ.get("PODNET_SCALE_WATCHES", "1") == "1"
OUT = ROOT / "build/bench"
CLUSTER, ZONE = "pbscale", "pbscale"
POD_CIDR, BLOCK_PREFIX = "198.18.0.0/15", 26
USER, UID, VNI_MIN, VNI_MAX = "pbsuser", 60001, 4096, 16777215
#: the paper's published point (Jolicoeur et al., WOCC 2024, Figure 2): a 400-node job
PAPER_POINT = (400, 800.0)
CORES = os.cpu_count() or 1


def log(msg: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- CPU accounting ----------------------------------------------------------------------
def schedstat(path: str) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of a task."""
    try:
        with open(path) as f:
            on, wait, _ = f.read().split()
        return int(on) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return 0.0, 0.0


def process_cpu() -> float:
    """Seconds on a CPU of all threads of this process (getrusage: one system call, where
    reading every thread's schedstat at a job's start would be on every node's path)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def process_schedstat(pid: int) -> tuple[float, float]:
    """The same, summed over all threads of a process."""
    on = wait = 0.0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            a, b = schedstat(f"/proc/{pid}/task/{tid}/schedstat")
            on, wait = on + a, wait + b
    return on, wait


def etcd_sent_bytes(url: str) -> float:
    """Bytes etcd has sent to its gRPC clients (`etcd_network_client_grpc_sent_bytes_total`
    on its /metrics): replies and watch events, what its clients read."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:  # noqa: S310 (loopback)
        for line in r.read().decode().splitlines():
            if line.startswith("etcd_network_client_grpc_sent_bytes_total"):
                return float(line.rsplit(" ", 1)[1])
    raise RuntimeError("etcd's /metrics has no etcd_network_client_grpc_sent_bytes_total")


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]  # idle + iowait
    return sum(v[:8]) - idle, sum(v[:8])


def allocator(etcd: Etcd, ipam: Ipam | None = None) -> Allocator:
    return Allocator(
        etcd,
        Keys(CLUSTER),
        ipam or Ipam(ipaddress.IPv4Network(POD_CIDR), BLOCK_PREFIX),
        ZONE,
        VNI_MIN,
        VNI_MAX,
    )


def ipam_state(t: Ipam) -> dict[str, Any]:
    """A loaded IPAM view as plain data (sent to the node processes)."""
    return {
        "used": sorted(t.used),
        "blocks": {str(b): n for b, n in t.blocks.items()},
    }


def ipam_of(state: dict[str, Any]) -> Ipam:
    t = Ipam(ipaddress.IPv4Network(POD_CIDR), BLOCK_PREFIX)
    for blk, node in state["blocks"].items():
        t.set_block(ipaddress.IPv4Network(blk), node)
    t.mark(state["used"])
    return t


def follow_cluster(a: Allocator) -> None:
    """podnetd's watches (node/etcd_sync.py: `watchrecords.WATCHED`, each event read as a
    record): what a node follows of the cluster. A job start sends them nothing (no node
    follows another's jobs) but a block claimed."""
    keys = Keys(CLUSTER)

    def on_event(kind: str, key: str, kv: KV | None) -> None:
        record_of(keys, kind, key, kv)

    rev = a.etcd.get_prefix(keys.prefix("nodes"), keys_only=True)[1]
    for prefix in WATCHED:
        w = a.etcd.watch_prefix(keys.prefix(prefix), rev, on_event, lambda: rev)
        if not w.created.wait(60):
            raise RuntimeError(f"etcd did not confirm the watch of {prefix}/")


# -- one simulated node ------------------------------------------------------------------
def node_path(
    a: Allocator, job_id: int, nodes: list[str], index: int, vni: int
) -> tuple[JobPod, float]:
    """podnetd's job_up, etcd side, with the kernel work replaced by its cost; returns the
    pod and when (time.monotonic) this node had its address. The allocation writes the
    pod's records; its record under the job name (the first node: the names of the pods
    before it) goes while the pod is wired (podnetd: a worker)."""
    t0 = time.perf_counter()
    later: list[Any] = []
    pod = a.allocate_job(job_id, USER, UID, f"scale{len(nodes)}", nodes, vni, index, later)
    allocated = time.monotonic()
    left = NETNS_MS / 1000 - (time.perf_counter() - t0)
    if left > 0:  # the netns is made while the allocation travels
        time.sleep(left)
    t1 = time.perf_counter()
    for run in later:
        run()
    left = WIRE_MS / 1000 - (time.perf_counter() - t1)
    if left > 0:  # the pod is wired meanwhile
        time.sleep(left)
    return pod, allocated


class Finished:
    """How many nodes of the job have their pod: each node counts itself (a shared counter,
    no wake-up of anyone), the last one wakes the coordinator. The samples are collected
    after the job, so that no node's reporting (its process waking to pickle and send) takes
    a core from a node still starting its pod."""

    def __init__(self, ctx: Any, n: int) -> None:
        self.n = n
        self.count = ctx.Value("i", 0)
        self.all = ctx.Event()

    def reset(self) -> None:
        with self.count.get_lock():
            self.count.value = 0
        self.all.clear()

    def one(self) -> None:
        with self.count.get_lock():
            self.count.value += 1
            last = self.count.value == self.n
        if last:
            self.all.set()

    def wait(self, timeout: float) -> None:
        if not self.all.wait(timeout):
            raise RuntimeError(f"{self.count.value} of {self.n} nodes finished in {timeout} s")


@dataclass
class Sample:
    """One node in one job (seconds)."""

    index: int
    from_start: float  # common start -> pod published (the figure)
    allocated: float  # common start -> this node has its address (the first node: committed)
    late: float  # common start -> this node running (its wake-up, on this busy host)
    cpu: float  # CPU the node used (all its threads)
    run_wait: float  # time the node's path thread was ready but had no core
    error: str = ""
    requests: int = 0  # requests the node sent to etcd


def node_thread(
    index: int,
    names: list[str],
    url: str,
    ipam: Ipam,
    go: threading.Barrier,
    finished: Finished,
    job: dict[str, Any],
    out: dict[int, Sample],
) -> None:
    etcd = Etcd([url], None, None, None, 30.0)
    a = allocator(etcd, ipam)
    a.etcd.get(Keys(CLUSTER).config)  # a running podnetd's connection to etcd is open
    if WATCHES:
        follow_cluster(a)  # and its watches
    # CPU: every thread of the node (its path, its watch, the gRPC client's own); run-queue
    # wait: the thread running its path
    stat = f"/proc/{os.getpid()}/task/{threading.get_native_id()}/schedstat"
    while True:
        go.wait()
        if job.get("stop"):
            etcd.close()
            return
        deadline = float(job["deadline"])
        time.sleep(max(0.0, deadline - time.monotonic()))
        woke = time.monotonic()
        cpu0, wait0 = process_cpu(), schedstat(stat)[1]
        err = ""
        allocated = woke
        req0 = etcd.requests
        try:
            if not job.get("idle"):
                _job, allocated = node_path(a, int(job["id"]), names, index, int(job["vni"]))
        except Exception as e:  # reported by the coordinator
            err = f"{names[index]}: {type(e).__name__}: {e}"
        end = time.monotonic()
        cpu1, wait1 = process_cpu(), schedstat(stat)[1]
        out[index] = Sample(
            index,
            end - deadline,
            allocated - deadline,
            woke - deadline,
            cpu1 - cpu0,
            wait1 - wait0,
            err,
            etcd.requests - req0,
        )
        finished.one()


def node_process(
    conn: Connection,
    indices: list[int],
    names: list[str],
    url: str,
    ipam: dict[str, Any],
    finished: Finished,
) -> None:
    """Hosts `indices` (one node each by default): runs each job the coordinator sends,
    and sends the samples when asked (after the job)."""
    # the first node at etcd's priority, as in the runs before node-owned allocation
    critical = 0 in indices
    os.setpriority(os.PRIO_PROCESS, 0, PRIORITY_NICE if critical else NODE_NICE)
    go = threading.Barrier(len(indices) + 1)
    job: dict[str, Any] = {}
    out: dict[int, Sample] = {}
    threads = [
        threading.Thread(
            target=node_thread,
            args=(i, names, url, ipam_of(ipam), go, finished, job, out),
            daemon=True,
        )
        for i in indices
    ]
    for t in threads:
        t.start()
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            job["stop"] = True
            go.wait()
            return
        if msg == "report":
            conn.send([out[i] for i in indices])
            continue
        job.update(msg)
        out.clear()
        go.wait()


# -- the coordinator ---------------------------------------------------------------------
def pct(v: list[float], p: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(len(s) * p / 100))]


def ms(x: float) -> float:
    return round(x * 1000, 1)


class Scale:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pbscale-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.figures: dict[str, tuple[float, str]] = {}
        self.sizes: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}
        self.job_id = 900000
        self.vni = 0
        # node processes are forked from a server started before any gRPC channel (a
        # process must not fork with gRPC's threads running), with podnetd's code loaded
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload(["__main__", "grpc", "podnet.state.alloc"])
        self.ctx.Process(target=int).start()  # start the server now

    def start_etcd(self) -> Etcd:
        port, peer = free_port(), free_port()
        self.url = f"http://127.0.0.1:{port}"
        logf = open(self.dir / "etcd.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                ETCD,
                "--name=pbs",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={self.url}",
                f"--advertise-client-urls={self.url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=pbs=http://127.0.0.1:{peer}",
                "--max-txn-ops=16384",
                "--max-request-bytes=16777216",
                "--log-level=warn",
            ],
            stdout=logf,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: os.setpriority(os.PRIO_PROCESS, 0, PRIORITY_NICE),  # noqa: PLW1509
        )
        logf.close()
        etcd = Etcd([self.url], None, None, None, 30.0)
        end = time.monotonic() + 30
        while True:
            try:
                self.extra["etcd_version"] = str(etcd.status().get("version", "?"))
                break
            except Exception:
                if time.monotonic() > end:
                    raise
                time.sleep(0.1)
        return etcd

    def run_size(self, etcd: Etcd, n: int) -> None:
        names = [f"pbs{n:04d}-{i:04d}" for i in range(n)]
        coord = allocator(etcd)
        # the view every node starts from (podnetd's watches keep it), each node with an
        # address block of its own (a node that has run a job owns one; claimed here, not by
        # every node in one job: each claim reaches every node's watch of blocks/)
        coord.load_view()
        owned = set(coord.ipam.blocks.values())
        claims = [(coord.ipam.claim_block(x), x) for x in names if x not in owned]
        keys = Keys(CLUSTER)
        etcd.put_many(op_put(keys.block(str(b)), {"node": x}) for b, x in claims)
        coord.ipam.confirm_blocks(b for b, _x in claims)
        groups = [[0]] + [
            list(range(i, min(n, i + NODES_PER_PROC))) for i in range(1, n, NODES_PER_PROC)
        ]
        ctx = self.ctx
        conns: list[Connection] = []
        procs = []
        t0 = time.monotonic()
        state = ipam_state(coord.ipam)
        finished = Finished(ctx, n)
        for g in groups:
            mine, theirs = ctx.Pipe()
            p = ctx.Process(
                target=node_process,
                args=(theirs, g, names, self.url, state, finished),
                daemon=True,
            )
            p.start()
            theirs.close()
            conns.append(mine)
            procs.append(p)
        for c in conns:
            if c.recv() != "ready":
                raise RuntimeError("a node process did not start")
        log(f"{n} nodes in {len(procs)} processes, started in {time.monotonic() - t0:.1f} s")
        etcd_pid = self.proc.pid if self.proc else 0
        jobs: list[dict[str, Any]] = []
        samples: list[Sample] = []
        idle: list[tuple[float, float]] = []  # (slowest node, CPU floor) of the idle jobs
        try:
            # one untimed job first: every node's connection and watch carry one job
            # before the timed ones (a running podnetd's are warm)
            # then as many jobs whose node path does nothing: what this host takes to wake
            # the node processes and count them (the harness's own cost, which the CPU
            # floor does not count)
            for k, kind in enumerate(["warm-up"] + ["timed"] * JOBS + ["idle"] * JOBS):
                self.job_id += 1
                # far enough ahead that every process has its message before the start
                deadline = time.monotonic() + 0.3 + 0.002 * n
                finished.reset()
                msg = {"id": self.job_id, "deadline": deadline, "vni": self.vni}
                for c in conns:
                    c.send({**msg, "idle": kind == "idle"})
                # all the CPU of the node processes, their wake-up and watches included
                p0 = sum(process_schedstat(p.pid)[0] for p in procs)
                time.sleep(max(0.0, deadline - time.monotonic()))
                e0, m0 = process_schedstat(etcd_pid), machine_ticks()
                b0 = etcd_sent_bytes(self.url)
                finished.wait(300)
                e1, m1 = process_schedstat(etcd_pid), machine_ticks()
                p1 = sum(process_schedstat(p.pid)[0] for p in procs)
                # every node has its pod: what etcd sent for the job (the watch events of
                # its records included) has been sent
                b1 = etcd_sent_bytes(self.url)
                for c in conns:
                    c.send("report")
                got: list[Sample] = [s for c in conns for s in c.recv()]
                errors = [s.error for s in got if s.error]
                if errors:
                    raise RuntimeError(f"{len(errors)} node errors, first: {errors[0]}")
                if kind == "idle":
                    idle.append(
                        (
                            max(s.from_start for s in got),
                            (sum(s.cpu for s in got) + e1[0] - e0[0]) / CORES,
                        )
                    )
                    continue
                self.check_and_release(coord, n)
                if k == 0:
                    log(f"  job {self.job_id}: warm-up, not timed")
                    continue
                by = sorted(got, key=lambda s: s.from_start)
                jobs.append(
                    {
                        "job_id": self.job_id,
                        "max_ms": ms(by[-1].from_start),
                        "slowest_node": by[-1].index,
                        "p50_ms": ms(statistics.median(s.from_start for s in got)),
                        "own_max_ms": ms(max(s.from_start - s.late for s in got)),
                        "first_node_ms": ms(next(s.from_start for s in got if s.index == 0)),
                        "first_node_committed_ms": ms(
                            next(s.allocated for s in got if s.index == 0)
                        ),
                        "last_address_ms": ms(max(s.allocated for s in got)),
                        "max_wake_late_ms": ms(max(s.late for s in got)),
                        "nodes_cpu_ms": ms(sum(s.cpu for s in got)),
                        "nodes_run_wait_ms": ms(sum(s.run_wait for s in got)),
                        "etcd_cpu_ms": ms(e1[0] - e0[0]),
                        "node_processes_cpu_ms": ms(p1 - p0),
                        "etcd_sent_bytes": round(b1 - b0),
                        "etcd_run_wait_ms": ms(e1[1] - e0[1]),
                        "machine_busy_cores": round(
                            CORES * (m1[0] - m0[0]) / max(1, m1[1] - m0[1]), 2
                        ),
                    }
                )
                samples += got
                j = jobs[-1]
                log(
                    f"  job {self.job_id}: max {j['max_ms']} ms p50 {j['p50_ms']} ms, "
                    f"first node {j['first_node_ms']} ms, nodes' CPU {j['nodes_cpu_ms']} ms, "
                    f"etcd CPU {j['etcd_cpu_ms']} ms, machine {j['machine_busy_cores']} cores, "
                    f"node processes' CPU {j['node_processes_cpu_ms']} ms"
                )
        finally:
            for c in conns:
                with contextlib.suppress(OSError):
                    c.send(None)
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
        self.summarize(n, jobs, samples)
        harness = round(statistics.mean(ms(m) for m, _f in idle), 1)
        log(f"  {len(idle)} jobs whose node path does nothing: slowest node {harness} ms")
        self.figures[f"harness_max_node_ms_nodes{n}"] = (harness, "ms")
        self.sizes[f"nodes{n}"]["harness"] = {
            "max_ms": harness,
            "cpu_floor_ms": round(statistics.mean(ms(f) for _m, f in idle), 1),
            "per_job_max_ms": [ms(m) for m, _f in idle],
        }

    def check_and_release(self, coord: Allocator, n: int) -> None:
        """Every node has its own IP and its marker; then the job goes, as at its end."""
        keys = Keys(CLUSTER)
        kv = coord.etcd.get(keys.job(self.job_id))
        if kv is None:
            raise RuntimeError(f"job {self.job_id} was not allocated")
        job = Job.from_json(kv.json(), kv.mod_revision)
        pods = coord.pods_of(job)
        ips = {p.ip for p in pods}
        if len(ips) != n or len(pods) != n or {p.index for p in pods} != set(range(n)):
            raise RuntimeError(f"job {self.job_id}: {len(ips)} IPs, {len(pods)} pods")
        coord.release_job(job)

    def summarize(self, n: int, jobs: list[dict[str, Any]], samples: list[Sample]) -> None:
        maxes = [j["max_ms"] for j in jobs]
        from_start = [s.from_start for s in samples]
        self.figures[f"job_start_max_node_ms_nodes{n}"] = (round(statistics.mean(maxes), 1), "ms")
        self.figures[f"job_start_p50_node_ms_nodes{n}"] = (ms(statistics.median(from_start)), "ms")
        # as the paper times it: each node from its own call to podnetd (here: from the
        # moment its process ran, which on this busy host can be long after the start)
        own = [j["own_max_ms"] for j in jobs]
        self.figures[f"job_start_max_node_own_ms_nodes{n}"] = (round(statistics.mean(own), 1), "ms")
        # etcd's CPU for a job divided by its nodes: what no cluster spreads out
        per_node = statistics.mean(j["etcd_cpu_ms"] for j in jobs) / n
        self.figures[f"etcd_cpu_ms_per_node_nodes{n}"] = (round(per_node, 3), "ms")
        # what etcd sent for a job divided by its nodes: flat when no node reads what grows
        # with the job (a 1000-node job's record reaching every node: 1000 x 34 KB)
        sent = statistics.mean(j["etcd_sent_bytes"] for j in jobs) / n
        self.figures[f"etcd_bytes_sent_per_node_nodes{n}"] = (round(sent), "bytes")
        # the CPU one node spent on its pod's etcd path (its allocation or wait, its watch)
        node_cpu = statistics.mean(s.cpu for s in samples)
        self.figures[f"node_cpu_ms_per_job_nodes{n}"] = (ms(node_cpu), "ms")
        mean = statistics.mean
        self.sizes[f"nodes{n}"] = {
            "jobs": len(jobs),
            "max_ms": {"mean": round(mean(maxes), 1), "min": min(maxes), "max": max(maxes)},
            "own_max_ms": {
                "mean": round(mean(j["own_max_ms"] for j in jobs), 1),
                "min": min(j["own_max_ms"] for j in jobs),
                "max": max(j["own_max_ms"] for j in jobs),
            },
            "node_ms": {
                "p50": ms(pct(from_start, 50)),
                "p90": ms(pct(from_start, 90)),
                "p99": ms(pct(from_start, 99)),
                "min": ms(min(from_start)),
            },
            "first_node_ms_mean": round(mean(j["first_node_ms"] for j in jobs), 1),
            "etcd_cpu_ms_per_node": round(per_node, 3),
            "requests_per_node": round(mean(s.requests for s in samples), 3),
            "requests_first_node_mean": round(mean(s.requests for s in samples if s.index == 0), 2),
            "first_node_committed_ms_mean": round(
                mean(j["first_node_committed_ms"] for j in jobs), 1
            ),
            "last_address_ms_mean": round(mean(j["last_address_ms"] for j in jobs), 1),
            "node_cpu_ms": {
                "p50": ms(pct([s.cpu for s in samples], 50)),
                "max": ms(max(s.cpu for s in samples)),
                "first_node_mean": ms(mean(s.cpu for s in samples if s.index == 0)),
            },
            "node_run_wait_ms": {
                "p50": ms(pct([s.run_wait for s in samples], 50)),
                "max": ms(max(s.run_wait for s in samples)),
            },
            "per_job_mean": {
                k: round(mean(j[k] for j in jobs), 2)
                for k in (
                    "nodes_cpu_ms",
                    "node_processes_cpu_ms",
                    "nodes_run_wait_ms",
                    "etcd_cpu_ms",
                    "etcd_sent_bytes",
                    "etcd_run_wait_ms",
                    "machine_busy_cores",
                    "max_wake_late_ms",
                )
            },
            "per_job": jobs,
        }
        # the least time this machine needs for one job: all the CPU it took, on all cores
        cpu = self.sizes[f"nodes{n}"]["per_job_mean"]
        self.sizes[f"nodes{n}"]["cpu_floor_ms"] = round(
            (cpu["nodes_cpu_ms"] + cpu["etcd_cpu_ms"]) / CORES, 1
        )
        self.sizes[f"nodes{n}"]["etcd_bytes_sent_per_node"] = round(sent)
        self.figures[f"cpu_floor_ms_nodes{n}"] = (self.sizes[f"nodes{n}"]["cpu_floor_ms"], "ms")

    def run(self) -> None:
        t0 = time.monotonic()
        etcd = self.start_etcd()
        etcd.put(
            Keys(CLUSTER).config,
            {"pod_cidr": POD_CIDR, "block_prefix": BLOCK_PREFIX, "zone": ZONE},
        )
        self.vni = allocator(etcd).user_vni(USER, UID)
        load_start = os.getloadavg()
        os.setpriority(os.PRIO_PROCESS, 0, PRIORITY_NICE)
        for n in SIZES:
            log(f"{JOBS} jobs of {n} nodes")
            self.run_size(etcd, n)
        self.extra.update(
            run_seconds=round(time.monotonic() - t0, 1),
            netns_ms=NETNS_MS,
            wire_ms=WIRE_MS,
            nodes_per_process=NODES_PER_PROC,
            watches=WATCHES,
            priority_nice=PRIORITY_NICE,
            node_nice=NODE_NICE,
            cores=CORES,
            loadavg_1_5_15_start=[round(x, 2) for x in load_start],
            loadavg_1_5_15_end=[round(x, 2) for x in os.getloadavg()],
            time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )

    def close(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(15)
        shutil.rmtree(self.dir, ignore_errors=True)


# -- the figure --------------------------------------------------------------------------
def figure(runs: list[dict[str, Any]], labels: list[str]) -> str:
    """Setup time against job size as the paper draws it: per run, the slowest node (mean
    over the jobs, band = the fastest and slowest job); then, averaged over the runs, the
    first node alone and etcd's own CPU time per job spread on this host's cores (the
    least any client could take here); and the paper's published point."""
    colors = ["#1f77b4", "#9467bd", "#8c564b", "#17becf"]
    series = []
    per_run = []
    for i, (run, label) in enumerate(zip(runs, labels, strict=True)):
        sizes = sorted(int(k[5:]) for k in run["sizes"] if k.startswith("nodes"))
        per = {n: run["sizes"][f"nodes{n}"] for n in sizes}
        per_run.append(per)
        series.append(
            Series(
                f"podnet, run {label}: slowest node, mean of {per[sizes[0]]['jobs']} jobs "
                "(band: fastest-slowest job)",
                [(n, p["max_ms"]["mean"]) for n, p in per.items()],
                [(n, p["max_ms"]["min"], p["max_ms"]["max"]) for n, p in per.items()],
                color=colors[i % len(colors)],
            )
        )
    common = sorted(set.intersection(*(set(p) for p in per_run)))

    def mean_of(key: str, scale: float = 1.0) -> list[tuple[float, float]]:
        return [(n, statistics.mean(scale * key_of(p[n], key) for p in per_run)) for n in common]

    series.append(
        Series(
            "first node alone (the job's record and name, its pod, the names before it)",
            mean_of("first_node_ms_mean"),
            color="#2ca02c",
        )
    )
    series.append(
        Series(
            f"etcd's CPU per job / {CORES} cores: no client could do better on this host",
            mean_of("per_job_mean.etcd_cpu_ms", 1 / CORES),
            color="#7f7f7f",
            dashed=True,
        )
    )
    if all("etcd_cpu_ms_per_node" in p[n] for p in per_run for n in common):
        series.append(
            Series(
                "etcd's CPU per node of the job (ms; etcd_cpu_ms_per_node: what a cluster "
                "does not spread out)",
                mean_of("etcd_cpu_ms_per_node"),
                color="#d62728",
                dashed=True,
            )
        )
    return xy_chart(
        "Job network setup time against job size (as the pcocc paper's Figure 2, top)",
        "nodes in the job",
        "network setup time; etcd CPU per node (ms, log scale)",
        series,
        [
            Reference(
                f"pcocc paper: ~{PAPER_POINT[1]:.0f} ms at {PAPER_POINT[0]} nodes "
                "(400 VMs of 6 cores; here: 2 cores for everything)",
                *PAPER_POINT,
            )
        ],
        xmax=1000,
        ylog=True,
    )


def key_of(d: dict[str, Any], dotted: str) -> float:
    for k in dotted.split("."):
        d = d[k]
    return float(d)  # type: ignore[arg-type]


def plot(out: str, paths: list[str]) -> int:
    runs = [json.loads(Path(p).read_text()) for p in paths]
    labels = [
        str(r.get("extra", {}).get("time", Path(p).stem))[:16]
        for r, p in zip(runs, paths, strict=True)
    ]
    Path(out).write_text(figure(runs, labels))
    return 0


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--plot":
        return plot(sys.argv[2], sys.argv[3:])
    if JOBS < 1 or not SIZES:
        print("bench_scale: PODNET_SCALE_JOBS >= 1 and PODNET_SCALE_SIZES needed", file=sys.stderr)
        return 2
    b = Scale()
    try:
        b.run()
    finally:
        b.close()
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (value, unit) in b.figures.items():
        print(f"{name} {value} {unit}")
    result = {
        "figures": {k: {"value": v, "unit": u} for k, (v, u) in b.figures.items()},
        "sizes": b.sizes,
        "extra": b.extra,
    }
    (OUT / "scale.json").write_text(json.dumps(result, indent=2) + "\n")
    (OUT / "job-start-scale.svg").write_text(figure([result], [b.extra["time"][:16]]))
    log(f"wrote {OUT / 'scale.json'} and {OUT / 'job-start-scale.svg'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
