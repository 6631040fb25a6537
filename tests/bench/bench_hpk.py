# SPDX-License-Identifier: Apache-2.0
"""HPK on podnet (docs/hpk.md): a user's Kubernetes in Slurm jobs, on a lab deployed by
site.yml with HPK on (`make lab`, or PODNET_E2E_LAB). As alice over SSH on the login node,
as a user works. Prints `NAME VALUE UNIT` lines and writes build/bench/hpk.json:

* hpk_control_plane_up_s: `podnet-hpk up` from submission to the API answering (what
  `podnet-hpk up` reports), BENCH_HPK_UPS runs (down between runs), median;
* hpk_pod_start_p50 / _p99 ms: `kubectl apply` of one busybox pod (`sleep`) until
  `kubectl` sees it Running, BENCH_HPK_PODS pods one after the other (each deleted after);
* sbatch_start_p50 / _p99 ms: in the same run, alternating with the pods, a plain
  `sbatch` of the same Apptainer command (`apptainer exec busybox.sif sleep`) until
  `squeue` says RUNNING: the same Slurm job without Kubernetes around it;
* hpk_pod_start_ratio_vs_sbatch: the p50s' ratio.

Both sides poll every 0.2 s on the login node (kubectl get / squeue) and are timed there,
so the figures carry the same polling granularity and no SSH.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAB = os.environ.get("PODNET_E2E_LAB", "pnlab")
PODS = int(os.environ.get("BENCH_HPK_PODS", "20"))
UPS = int(os.environ.get("BENCH_HPK_UPS", "3"))
SIF = "/shared/images/busybox.sif"

# one pod / one job as alice on the login node; prints microseconds
MANIFEST = (
    "apiVersion: v1\\nkind: Pod\\nmetadata: {name: bench-$1}\\nspec:\\n"
    "  terminationGracePeriodSeconds: 1\\n"
    '  containers: [{name: c, image: busybox, command: [sleep, \\"600\\"]}]\\n'
)
POD = f"""
set -e
t0=$(date +%s%N)
printf "{MANIFEST}" | kubectl apply -f - >/dev/null
until [ "$(kubectl get pod bench-$1 -o jsonpath='{{.status.phase}}')" = Running ]
do sleep 0.2; done
t1=$(date +%s%N)
echo $(( (t1 - t0) / 1000 ))
kubectl delete pod bench-$1 --wait=true >/dev/null
"""
JOB = f"""
set -e
t0=$(date +%s%N)
j=$(sbatch --parsable -J bench-sb -o /dev/null --wrap 'apptainer exec {SIF} sleep 600')
until [ "$(squeue -h -j $j -o %T)" = RUNNING ]; do sleep 0.2; done
t1=$(date +%s%N)
echo $(( (t1 - t0) / 1000 ))
scancel $j
while [ -n "$(squeue -h -j $j -o %T)" ]; do sleep 0.2; done
"""


def ssh(target: str, cmd: str, stdin: str | None = None, timeout: float = 300) -> str:
    r = subprocess.run(
        [str(REPO / "tests/lab/lab.sh"), "ssh", target, cmd],
        input=stdin,
        env={**os.environ, "LAB_NAME": LAB},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if r.returncode != 0:
        raise SystemExit(
            f"bench-hpk: {target}: {cmd!r} exited {r.returncode}\n{r.stdout}\n{r.stderr}"
        )
    return r.stdout


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def main() -> None:
    env = {**os.environ, "LAB_NAME": LAB}
    subprocess.run([str(REPO / "tests/lab/hpk-images.sh")], env=env, check=True)
    ssh("alice@login", "podnet-hpk down >/dev/null 2>&1 || true")
    ups = []
    for _ in range(UPS):
        out = ssh("alice@login", "podnet-hpk up")
        m = re.search(r" in ([0-9.]+) s", out)
        if not m:
            raise SystemExit(f"bench-hpk: podnet-hpk up said {out!r}")
        ups.append(float(m.group(1)))
        if len(ups) < UPS:
            ssh("alice@login", "podnet-hpk down", timeout=180)
    pod_ms: list[float] = []
    job_ms: list[float] = []
    try:
        for i in range(PODS):
            pod_ms.append(int(ssh("alice@login", f"bash -s {i}", stdin=POD).strip()) / 1000)
            job_ms.append(int(ssh("alice@login", "bash -s", stdin=JOB).strip()) / 1000)
    finally:
        ssh("alice@login", "podnet-hpk down", timeout=180)
    res = {
        "hpk_control_plane_up_s": round(statistics.median(ups), 2),
        "hpk_pod_start_p50": round(pct(pod_ms, 50), 1),
        "hpk_pod_start_p99": round(pct(pod_ms, 99), 1),
        "sbatch_start_p50": round(pct(job_ms, 50), 1),
        "sbatch_start_p99": round(pct(job_ms, 99), 1),
    }
    res["hpk_pod_start_ratio_vs_sbatch"] = round(
        res["hpk_pod_start_p50"] / res["sbatch_start_p50"], 2
    )
    units = {"hpk_control_plane_up_s": "s", "hpk_pod_start_ratio_vs_sbatch": "ratio"}
    for k, v in res.items():
        print(f"{k} {v} {units.get(k, 'ms')}")
    out = REPO / "build" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    data = {**res, "ups_s": ups, "pod_ms": pod_ms, "job_ms": job_ms}
    (out / "hpk.json").write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
