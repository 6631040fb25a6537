#!/usr/bin/env python3
"""Time to set up one job of 100, 400 and 1000 nodes, the way the pcocc paper measures it.

Every simulated node runs podnetd's own etcd code path for a job pod, concurrently with the
job's other nodes, against a real etcd on loopback: `Allocator.allocate_job` (the first
node allocates the whole job in one transaction; the others get the job back, jobs of more
than 16 nodes by reading it first), overlapped with the netns creation, then
`Allocator.publish_pod` (the node's records and marker), overlapped with the wiring. The
kernel part is replaced by its measured cost (`PODNET_SCALE_NETNS_MS`,
`PODNET_SCALE_WIRE_MS`: the split of `pod_setup_p50` in docs/bench.md), slept, not run:
the simulated nodes share this machine's 2 cores, where a real cluster gives each its own.
So the figure is pessimistic: every node's client CPU (JSON, HTTP) competes here.

Per job: the setup time of a node is from the common start (all node threads released by
one barrier, as Slurm starts the job's prologs) to its pod being published; the job's time
is the maximum over its nodes (the paper's Figure 2), averaged over `PODNET_SCALE_JOBS`
jobs (>= 10) per size. Prints `NAME VALUE UNIT` lines, writes build/bench/scale.json and
build/bench/job-start-scale.svg (setup time against job size, with the paper's point).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "agent/src"))

from podnet.alloc import Allocator, Job  # noqa: E402
from podnet.ipam import Ipam  # noqa: E402
from podnet.names import Keys  # noqa: E402
from podnet.store import Etcd  # noqa: E402

ETCD = os.environ.get("PODNET_BENCH_ETCD", "/usr/bin/etcd")
SIZES = [int(x) for x in os.environ.get("PODNET_SCALE_SIZES", "100,400,1000").split(",")]
JOBS = int(os.environ.get("PODNET_SCALE_JOBS", "10"))
NETNS_MS = float(os.environ.get("PODNET_SCALE_NETNS_MS", "1.8"))
WIRE_MS = float(os.environ.get("PODNET_SCALE_WIRE_MS", "4.0"))
OUT = ROOT / "build/bench"
CLUSTER, ZONE = "pbscale", "pbscale"
POD_CIDR, BLOCK_PREFIX = "198.18.0.0/15", 26
USER, UID, VNI_MIN, VNI_MAX = "pbsuser", 60001, 4096, 16777215
#: the paper's published point (Jolicoeur et al., WOCC 2024, Figure 2): a 400-node job
PAPER_POINT = (400, 800.0)


def log(msg: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SimNode:
    """One node's podnetd as far as etcd is concerned: its own allocator and IPAM view."""

    name: str
    alloc: Allocator
    took: list[float] = field(default_factory=list)


class Scale:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pbscale-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.etcd: Etcd | None = None
        self.figures: dict[str, tuple[float, str]] = {}
        self.extra: dict[str, object] = {}
        self.job_id = 900000

    def start_etcd(self) -> Etcd:
        port, peer = free_port(), free_port()
        logf = open(self.dir / "etcd.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                ETCD,
                "--name=pbs",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{port}",
                f"--advertise-client-urls=http://127.0.0.1:{port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=pbs=http://127.0.0.1:{peer}",
                "--max-txn-ops=16384",
                "--max-request-bytes=16777216",
                "--log-level=warn",
            ],
            stdout=logf,
            stderr=subprocess.STDOUT,
        )
        logf.close()
        etcd = Etcd([f"http://127.0.0.1:{port}"], None, None, None, 30.0)
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

    def allocator(self, etcd: Etcd) -> Allocator:
        return Allocator(
            etcd,
            Keys(CLUSTER),
            Ipam(ipaddress.IPv4Network(POD_CIDR), BLOCK_PREFIX),
            ZONE,
            VNI_MIN,
            VNI_MAX,
        )

    def node_path(self, node: SimNode, job_id: int, nodes: list[str], index: int) -> None:
        """podnetd's job_up, etcd side, with the kernel work replaced by its cost."""
        a = node.alloc
        t0 = time.perf_counter()
        job = a.allocate_job(job_id, USER, UID, f"scale{len(nodes)}", nodes, self.vni, index)
        left = NETNS_MS / 1000 - (time.perf_counter() - t0)
        if left > 0:  # the netns is made while the allocation travels
            time.sleep(left)
        t1 = time.perf_counter()
        a.publish_pod(job, index, node.name)
        left = WIRE_MS / 1000 - (time.perf_counter() - t1)
        if left > 0:  # the pod is wired while its records travel
            time.sleep(left)

    def run_size(self, etcd: Etcd, n: int) -> None:
        names = [f"pbs{n:04d}-{i:04d}" for i in range(n)]
        sims = [SimNode(name, self.allocator(etcd)) for name in names]
        # warm-up, not timed: each node claims its address block (a node that has run a
        # job before owns one), then every view is loaded (podnetd's watch keeps it)
        self.job_id += 1
        warm = sims[0].alloc.allocate_job(self.job_id, USER, UID, "warm", names, self.vni)
        sims[0].alloc.release_job(warm)
        for s in sims:
            s.alloc.load_view()
        start = threading.Barrier(n + 1)
        done = threading.Barrier(n + 1)
        current: dict[str, int] = {}
        errors: list[str] = []

        def node_main(i: int, s: SimNode) -> None:
            for _ in range(JOBS):
                start.wait()
                t = time.perf_counter()
                try:
                    self.node_path(s, current["job"], names, i)
                except Exception as e:  # reported by the main thread
                    errors.append(f"{s.name}: {type(e).__name__}: {e}")
                s.took.append(time.perf_counter() - t)
                done.wait()

        threads = [threading.Thread(target=node_main, args=(i, s)) for i, s in enumerate(sims)]
        for t in threads:
            t.start()
        job_max: list[float] = []
        for _ in range(JOBS):
            self.job_id += 1
            current["job"] = self.job_id
            start.wait()
            done.wait()
            if errors:
                raise RuntimeError(f"{len(errors)} node errors, first: {errors[0]}")
            job_max.append(max(s.took[-1] for s in sims))
            kv = etcd.get(Keys(CLUSTER).job(self.job_id))
            assert kv is not None, f"job {self.job_id} was not allocated"
            job = Job.from_json(kv.json(), kv.mod_revision)
            marks = etcd.get_prefix(Keys(CLUSTER).prefix(f"jobnodes/{self.job_id}"), True)[0]
            if len(set(job.ips)) != n or len(marks) != n:
                raise RuntimeError(f"job {self.job_id}: {len(set(job.ips))} IPs, {len(marks)} pods")
            sims[0].alloc.release_job(job)
            for s in sims:  # what podnetd's watch tells every node
                s.alloc.ipam.mark(job.ips, used=False)
                s.alloc.ipam.release_pending(job.ips)
        for t in threads:
            t.join()
        per_node = [x for s in sims for x in s.took]
        self.figures[f"job_start_max_node_ms_nodes{n}"] = (
            round(statistics.mean(job_max) * 1000, 1),
            "ms",
        )
        self.extra[f"nodes{n}"] = {
            "jobs": JOBS,
            "job_max_ms": [round(x * 1000, 1) for x in job_max],
            "node_p50_ms": round(statistics.median(per_node) * 1000, 1),
            "node_min_ms": round(min(per_node) * 1000, 1),
        }

    def run(self) -> None:
        t0 = time.monotonic()
        etcd = self.start_etcd()
        etcd.put(
            Keys(CLUSTER).config,
            {"pod_cidr": POD_CIDR, "block_prefix": BLOCK_PREFIX, "zone": ZONE},
        )
        self.vni = self.allocator(etcd).user_vni(USER, UID)
        for n in SIZES:
            log(f"{JOBS} jobs of {n} nodes")
            self.run_size(etcd, n)
        self.extra.update(
            run_seconds=round(time.monotonic() - t0, 1),
            netns_ms=NETNS_MS,
            wire_ms=WIRE_MS,
            load_avg=os.getloadavg(),
            cores=os.cpu_count(),
        )

    def close(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(15)
        shutil.rmtree(self.dir, ignore_errors=True)


def svg(points: list[tuple[int, float]], paper: tuple[int, float]) -> str:
    """Setup time against job size, podnet's points and the paper's, as a small SVG."""
    w, h, left, bottom, top, right = 560, 340, 70, 50, 30, 20
    xmax = max([p[0] for p in points] + [paper[0]]) * 1.1
    ymax = max([p[1] for p in points] + [paper[1]]) * 1.15

    def xy(x: float, y: float) -> tuple[float, float]:
        return (
            left + x / xmax * (w - left - right),
            h - bottom - y / ymax * (h - bottom - top),
        )

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="black"/>',
        f'<text x="{(w + left) / 2}" y="{h - 12}" text-anchor="middle">nodes in the job</text>',
        f'<text x="16" y="{(h - bottom + top) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {(h - bottom + top) / 2})">network setup time (ms)</text>',
    ]
    for i in range(6):
        xv, yv = xmax / 1.1 * i / 5, ymax / 1.15 * i / 5
        x, _ = xy(xv, 0)
        _, y = xy(0, yv)
        out.append(f'<text x="{x}" y="{h - bottom + 16}" text-anchor="middle">{xv:.0f}</text>')
        out.append(f'<text x="{left - 6}" y="{y + 4}" text-anchor="end">{yv:.0f}</text>')
    pts = " ".join(f"{xy(x, y)[0]:.1f},{xy(x, y)[1]:.1f}" for x, y in points)
    out.append(f'<polyline points="{pts}" fill="none" stroke="#1f77b4" stroke-width="2"/>')
    for x, y in points:
        px, py = xy(x, y)
        out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4" fill="#1f77b4"/>')
        out.append(f'<text x="{px + 6:.1f}" y="{py - 6:.1f}">{y:.0f} ms</text>')
    px, py = xy(*paper)
    out.append(f'<rect x="{px - 5:.1f}" y="{py - 5:.1f}" width="10" height="10" fill="#d62728"/>')
    out.append(f'<text x="{px + 8:.1f}" y="{py + 4:.1f}">pcocc paper (~{paper[1]:.0f} ms)</text>')
    out.append(
        f'<text x="{left + 10}" y="{top + 4}" fill="#1f77b4">podnet: max over the job\'s '
        "nodes, mean of 10 jobs</text>"
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> int:
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
    points = [(n, b.figures[f"job_start_max_node_ms_nodes{n}"][0]) for n in SIZES]
    (OUT / "job-start-scale.svg").write_text(svg(points, PAPER_POINT))
    (OUT / "scale.json").write_text(
        json.dumps({"figures": b.figures, "extra": b.extra}, indent=2, default=str) + "\n"
    )
    log(f"wrote {OUT / 'scale.json'} and {OUT / 'job-start-scale.svg'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
