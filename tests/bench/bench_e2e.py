"""podnet's cost on a real Slurm job launch, on a lab deployed by site.yml.

`make bench-e2e` (lab from `make lab`, or PODNET_E2E_LAB). Prints `NAME VALUE UNIT` lines and
writes build/bench/e2e.json:

* srun_n2_true_with_podnet / _without_podnet ms: `srun -N2 true` timed on the login node
  from idle nodes (the previous job fully completed, its pods released),
  alternating with and without `--podnet=no` (the lab allows opting out), medians;
* srun_overhead ms: the difference of the medians;
* spank_pod_ready_p50 / _p99 ms: per node, from the SPANK plugin's own log line
  ("pod ... ready in N ms", extern step: request to podnetd until the pod is ready).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAB = os.environ.get("PODNET_E2E_LAB", "pnlab")
RUNS = int(os.environ.get("BENCH_E2E_RUNS", "50"))


def ssh(node: str, cmd: str, timeout: float = 900) -> str:
    r = subprocess.run(
        [str(REPO / "tests/lab/lab.sh"), "ssh", node, cmd],
        env={**os.environ, "LAB_NAME": LAB},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if r.returncode != 0:
        sys.exit(f"bench-e2e: {node}: {cmd[:60]}... failed:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def percentile(xs: list[float], p: float) -> float:
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[k]


def main() -> int:
    if not Path(f"/var/lib/podnet-lab/{LAB}/lab.env").exists():
        sys.exit(f"bench-e2e: lab {LAB} is not up (make lab)")
    log_file = "/var/log/slurm/slurmd.log"
    start = {
        n: int(ssh(n, f"wc -l < {log_file} 2>/dev/null || echo 0").strip() or 0)
        for n in ("c1", "c2")
    }
    script = f"""
cd /tmp
for i in $(seq {RUNS}); do
  for mode in with without; do
    opt=; [ $mode = without ] && opt=--podnet=no
    # start from idle nodes: a job still completing (its pod being released) would
    # otherwise delay the next run, whichever its mode
    until [ "$(sinfo -h -n c1,c2 -o %T | sort -u)" = idle ]; do sleep 0.02; done
    t0=$(date +%s%N)
    runuser -u alice -- srun $opt -N2 -w c1,c2 -t 1 true || exit 1
    t1=$(date +%s%N)
    echo "$mode $(( (t1 - t0) / 1000 ))"
  done
done
"""
    t0 = time.monotonic()
    out = ssh("login", script)
    wall = time.monotonic() - t0
    samples: dict[str, list[float]] = {"with": [], "without": []}
    for line in out.splitlines():
        mode, us = line.split()
        samples[mode].append(int(us) / 1000.0)
    ready: list[float] = []
    for node in ("c1", "c2"):
        log = ssh(node, f"tail -n +{start[node] + 1} {log_file}")
        ready += [
            float(m) for m in re.findall(r"podnet: job \d+: pod \S+ \(\S+\) ready in (\d+) ms", log)
        ]
    with_m = statistics.median(samples["with"])
    without_m = statistics.median(samples["without"])
    figures = {
        "srun_n2_true_with_podnet": (with_m, "ms"),
        "srun_n2_true_without_podnet": (without_m, "ms"),
        "srun_overhead": (with_m - without_m, "ms"),
    }
    if ready:
        figures["spank_pod_ready_p50"] = (percentile(ready, 50), "ms")
        figures["spank_pod_ready_p99"] = (percentile(ready, 99), "ms")
    for name, (value, unit) in figures.items():
        print(f"{name} {value:.1f} {unit}")
    print(f"# {RUNS} runs per mode, {len(ready)} pod-ready samples, {wall:.0f} s", file=sys.stderr)
    outdir = REPO / "build" / "bench"
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "e2e.json").write_text(
        json.dumps(
            {
                "lab": LAB,
                "runs": RUNS,
                "ready_samples": len(ready),
                "figures": {k: {"value": round(v, 2), "unit": u} for k, (v, u) in figures.items()},
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
