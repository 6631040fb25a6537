# SPDX-License-Identifier: Apache-2.0
"""`make bench-collect`: what the container collector (agent/src/podnet/node/collect.py)
costs per cycle with N containers (issue 22, item 2).

N network namespaces, each with one process (`unshare -n sleep`, as root), stand for N
containers (the collector reads only their namespace identity, the path podnetd would hold
them at, and /proc). Timed, over PODNET_BENCH_CYCLES cycles (default 50) for each N of
PODNET_BENCH_CONTAINERS (default "50 200 500"):
`collect_steady_p50_us_<N>`: a cycle while nothing changed (a `stat` per container: each
container's last known process is still in its namespace); `collect_scan_p50_us_<N>`: a
cycle in which every container's known process left (one pass over /proc for all);
`collect_procs_<N>`: processes on the machine during that run. Figures of a busy machine
are relative: the lead runs the reported ones on a quiet one.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "agent" / "src"))

from podnet.kernel.nsscan import NsId
from podnet.node.collect import Collector
from podnet.node.pods import Pod


def _pods(n: int) -> tuple[list[Pod], list[subprocess.Popen[bytes]]]:
    procs = [subprocess.Popen(["unshare", "-n", "sleep", "3600"]) for _ in range(n)]
    me = os.readlink("/proc/self/ns/net")
    pods = []
    for i, p in enumerate(procs):
        path = f"/proc/{p.pid}/ns/net"
        while os.readlink(path) == me:
            time.sleep(0.001)
        st = os.stat(path)
        pod = Pod("container", f"pn-c{i:011x}", path, "198.18.0.1", 15, "u", 1, 4096)
        pod.ns_id = NsId(st.st_dev, st.st_ino)
        pods.append(pod)
    return pods, procs


def _p50_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def main() -> int:
    if os.geteuid() != 0:
        print("bench-collect: run as root", file=sys.stderr)
        return 1
    cycles = int(os.environ.get("PODNET_BENCH_CYCLES", "50"))
    sizes = [int(x) for x in os.environ.get("PODNET_BENCH_CONTAINERS", "50 200 500").split()]
    for n in sizes:
        pods, procs = _pods(n)
        try:
            c = Collector()
            assert c.dead(pods) == []  # the first cycle scans and learns the witnesses
            steady, scan = [], []
            for _ in range(cycles):
                t0 = time.perf_counter()
                dead = c.dead(pods)
                steady.append(time.perf_counter() - t0)
                assert not dead
                c.witness = {p.name: 1 for p in pods}  # pid 1 is in no container's namespace
                t0 = time.perf_counter()
                dead = c.dead(pods)
                scan.append(time.perf_counter() - t0)
                assert not dead
            nprocs = sum(1 for d in os.listdir("/proc") if d.isdigit())
            print(f"collect_steady_p50_us_{n} {_p50_us(steady):.0f} us")
            print(f"collect_scan_p50_us_{n} {_p50_us(scan):.0f} us")
            print(f"collect_procs_{n} {nprocs} processes")
        finally:
            for p in procs:
                p.kill()
                p.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
