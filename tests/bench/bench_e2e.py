# SPDX-License-Identifier: Apache-2.0
"""podnet's cost on a real Slurm job launch, on a lab deployed by site.yml.

`make bench-e2e` (lab from `make lab`, or PODNET_E2E_LAB). Prints `NAME VALUE UNIT` lines and
writes build/bench/e2e.json:

* srun_n2_true_with_podnet / _without_podnet ms: `srun -N2 true` timed on the login node
  from idle nodes (the previous job fully completed, its pods released),
  alternating with and without `--podnet=no` (the lab allows opting out), medians;
* srun_overhead ms: the difference of the medians;
* spank_pod_ready_p50 / _p99 ms: per node, from the SPANK plugin's own log line
  ("pod ... ready in N ms", extern step: request to podnetd until the pod is ready);
* overlay_throughput_pod_gbps / _host_gbps, overlay_throughput_ratio: TCP throughput
  (iperf3, one stream, BENCH_E2E_TPUT_SECONDS each) pod to pod across c1 and c2 (two
  steps of one `salloc -N2` job of alice: the SPANK plugin puts them in the job's pods)
  versus host to host (root on c1 and c2, their lab underlay addresses), in rounds of
  one run per mode, the order turned around every round, BENCH_E2E_TPUT_RUNS rounds,
  medians; the ratio is pod median / host median;
* overlay_throughput_bare_vxlan_gbps, overlay_throughput_ratio_vs_vxlan: the same rounds
  also time a bare kernel VXLAN between c1's and c2's own namespaces (no bridge, veth or
  rule of podnet's: `type vxlan id 4242 dstport 4790 nolearning ttl 64 dev host0`, the
  options podnetd gives a user's VXLAN, on a port nothing listens on; a static all-zero
  FDB entry to the other node; /30 addresses of 100.64.254.0/30; the pods' MTU), root to
  root; the ratio is pod median / bare median: what podnet adds to the kernel's own
  encapsulation. The device is removed at the end, also on failure or SIGTERM/SIGHUP/
  SIGINT (a device left by a killed run is replaced by the next one).

* srun_n2_true_pod_netns_only / _pod_with_pidns ms, pid_ns_overhead ms: `srun -N2 true`
  with a pod that is a network namespace only (podnetd's `pid_init: ""`) versus one that
  is also a PID namespace (the default), medians of BENCH_E2E_PIDNS_RUNS runs each, in
  alternating blocks of BENCH_E2E_PIDNS_BLOCK runs (podnetd on c1 and c2 restarted with
  the other setting between blocks; pods survive restarts).

* srun_n2_true_with_image / _apptainer_direct / _no_image ms, image_overhead_vs_apptainer
  ms: `srun -N2 --podnet-image=SIF true` (podnet's image path: podnet-image-exec, then
  Apptainer) versus `srun -N2 apptainer exec SIF true` (Apptainer run by the user
  outside podnet's mechanism, same image, same pod) versus `srun -N2 true`, rotating
  run by run, BENCH_E2E_IMAGE_RUNS each, medians; the SIF is a few binaries of the node.

BENCH_E2E_PARTS (default "launch,throughput,pidns,image") selects the parts.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAB = os.environ.get("PODNET_E2E_LAB", "pnlab")
RUNS = int(os.environ.get("BENCH_E2E_RUNS", "50"))
TPUT_RUNS = int(os.environ.get("BENCH_E2E_TPUT_RUNS", "9"))
TPUT_SECONDS = int(os.environ.get("BENCH_E2E_TPUT_SECONDS", "5"))
PARTS = set(os.environ.get("BENCH_E2E_PARTS", "launch,throughput,pidns,image").split(","))
IMAGE_RUNS = int(os.environ.get("BENCH_E2E_IMAGE_RUNS", "30"))
IMAGE_DIR = "/opt/podnet-bench-image"
PIDNS_RUNS = int(os.environ.get("BENCH_E2E_PIDNS_RUNS", "30"))
PIDNS_BLOCK = int(os.environ.get("BENCH_E2E_PIDNS_BLOCK", "10"))
PODNET_CONF = "/etc/podnet/podnet.yaml"
PID_INIT = "/usr/local/lib/podnet/podnet-init"
#: iperf3 ports: the pod server (inside alice's pod) and the host server (node netns)
POD_PORT, HOST_PORT, BARE_PORT = 5301, 5302, 5303
#: the bare VXLAN of the reference (c1, c2): a name, VNI, UDP port and addresses that no
#: podnet device, lab or overlay uses (podnet: 4789, Flannel: 8472; pods 198.18.0.0/15)
BARE_DEV = "pnbenchvx"
BARE_VNI, BARE_UDP = 4242, 4790
BARE_IPS = ("100.64.254.1", "100.64.254.2")
#: the VXLAN options compared between a user's VXLAN (podnetd's) and the bare one
VXLAN_KEYS = ("ttl", "learning", "udp_csum", "udp_zero_csum6_tx", "udp_zero_csum6_rx", "ageing")


def ssh(node: str, cmd: str, timeout: float = 900, check: bool = True) -> str:
    r = subprocess.run(
        [str(REPO / "tests/lab/lab.sh"), "ssh", node, cmd],
        env={**os.environ, "LAB_NAME": LAB},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if r.returncode != 0 and check:
        sys.exit(f"bench-e2e: {node}: {cmd[:60]}... failed:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def percentile(xs: list[float], p: float) -> float:
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[k]


def iperf_gbps(out: str) -> float:
    """Received throughput of an `iperf3 -J` client run (the last JSON document of `out`)."""
    doc = json.loads(out[out.index("{") : out.rindex("}") + 1])
    return float(doc["end"]["sum_received"]["bits_per_second"]) / 1e9


def iperf_client(server: str, port: int) -> str:
    """Shell: an iperf3 client, retried until the server listens; prints its JSON."""
    return (
        f"for i in $(seq 100); do "
        f"out=$(timeout {TPUT_SECONDS + 30} iperf3 -J -c {server} -p {port} -t {TPUT_SECONDS}) "
        f'&& {{ printf "%s\\n" "$out"; exit 0; }}; sleep 0.1; done; '
        f'printf "%s\\n" "$out"; exit 1'
    )


def underlay_ip(node: str) -> str:
    out = ssh(node, "ip -4 -o addr show dev host0")
    return out.split()[3].split("/")[0]


def pod_of(node: str, job: int) -> dict[str, object]:
    for p in json.loads(ssh(node, "podnet --json pods")):
        if str(p.get("job_id")) == str(job):
            return dict(p)
    return {}


class PodJob:
    """A 2-node allocation of alice over c1 and c2, for iperf3 steps in its pods."""

    def __init__(self) -> None:
        out = ssh(
            "login",
            "cd /tmp && runuser -u alice -- salloc --no-shell -N2 -w c1,c2 -t 30 "
            "-J pn-bench-tput 2>&1",
        )
        found = re.findall(r"Granted job allocation (\d+)", out)
        if not found:
            sys.exit(f"bench-e2e: salloc gave no allocation:\n{out}")
        self.job = int(found[0])
        deadline = time.monotonic() + 60
        while not (pod_of("c1", self.job) and pod_of("c2", self.job)):
            if time.monotonic() > deadline:
                self.close()
                sys.exit(f"bench-e2e: job {self.job} has no pods on c1 and c2")
            time.sleep(0.5)
        self.server_ip = str(pod_of("c1", self.job)["ip"])

    def run(self) -> float:
        """One iperf3 run from alice's pod on c2 to her pod on c1 (one srun step, one task
        per node: the server on node 0, c1; the client on node 1, c2)."""
        task = (
            f'if [ "$SLURM_NODEID" = 0 ]; then '
            f"exec timeout {TPUT_SECONDS + 60} iperf3 -s -1 -p {POD_PORT} >/dev/null 2>&1; "
            f"else {iperf_client(self.server_ip, POD_PORT)}; fi"
        )
        out = ssh(
            "login",
            f"cd /tmp && runuser -u alice -- srun --jobid={self.job} -N2 -n2 "
            f"--ntasks-per-node=1 -w c1,c2 bash -c {shlex.quote(task)}",
        )
        return iperf_gbps(out)

    def close(self) -> None:
        ssh("login", f"scancel {self.job}", check=False)


def host_run(server_ip: str, port: int = HOST_PORT) -> float:
    """One iperf3 run from c2 to c1 in the nodes' own network (root): to c1's underlay
    address, or to its end of the bare VXLAN."""
    ssh(
        "c1",
        f"setsid timeout {TPUT_SECONDS + 60} iperf3 -s -1 -p {port} -B {server_ip} "
        f"</dev/null >/dev/null 2>&1 &",
    )
    return iperf_gbps(ssh("c2", iperf_client(server_ip, port)))


def pod_mtu(job: int) -> int:
    netns = str(pod_of("c1", job)["netns"])
    # nsenter leaves /sys as it was (the node's links): ask rtnetlink in the pod's netns
    return int(json.loads(ssh("c1", f"nsenter --net={netns} ip -j link show dev eth0"))[0]["mtu"])


def vxlan_options(node: str, prefix: str) -> dict[str, object]:
    """VXLAN_KEYS of the first VXLAN device on `node` whose name starts with `prefix`."""
    for link in json.loads(ssh(node, "ip -d -j link show type vxlan") or "[]"):
        if str(link.get("ifname", "")).startswith(prefix):
            data = link.get("linkinfo", {}).get("info_data", {})
            opts = {k: data.get(k) for k in VXLAN_KEYS}
            return {**opts, "mtu": link.get("mtu"), "name": link.get("ifname")}
    return {}


def bare_vxlan_up(mtu: int) -> None:
    """The reference: a VXLAN between c1's and c2's host namespaces, nothing else."""
    ul = {n: underlay_ip(n) for n in ("c1", "c2")}
    for node, other, addr in (("c1", "c2", BARE_IPS[0]), ("c2", "c1", BARE_IPS[1])):
        ssh(
            node,
            f"set -e; ip link del {BARE_DEV} 2>/dev/null || true; "
            # the port must be free: a listener on it would take the bench's datagrams
            f'if [ -n "$(ss -Hlun sport = :{BARE_UDP})" ]; then '
            f"echo 'UDP port {BARE_UDP} in use' >&2; exit 1; fi; "
            f"ip link add {BARE_DEV} type vxlan id {BARE_VNI} dstport {BARE_UDP} nolearning "
            f"ttl 64 local {ul[node]} dev host0; ip link set {BARE_DEV} mtu {mtu}; "
            f"ip addr add {addr}/30 dev {BARE_DEV}; "
            f"bridge fdb append 00:00:00:00:00:00 dev {BARE_DEV} dst {ul[other]}; "
            f"ip link set {BARE_DEV} up",
        )
    ssh("c2", f"ping -c 1 -W 5 {BARE_IPS[0]} >/dev/null")
    pod, bare = vxlan_options("c1", "pnvx"), vxlan_options("c1", BARE_DEV)
    BARE_VXLAN.update({"pod_path": pod, "bare": bare})
    differ = {
        k: (pod.get(k), bare.get(k)) for k in (*VXLAN_KEYS, "mtu") if pod.get(k) != bare.get(k)
    }
    if not pod:
        print("# no pnvx* VXLAN on c1 to compare the bare VXLAN with", file=sys.stderr)
    elif differ:
        print(
            f"# bare VXLAN differs from {pod['name']} (pod path, bare): {differ}", file=sys.stderr
        )


def bare_vxlan_down() -> None:
    for node in ("c1", "c2"):
        ssh(node, f"ip link del {BARE_DEV} 2>/dev/null; true", check=False)


#: the pod path's VXLAN options and the bare VXLAN's (build/bench/e2e.json)
BARE_VXLAN: dict[str, object] = {}


def require_iperf3() -> None:
    for node in ("c1", "c2"):
        if not ssh(node, "command -v iperf3 || true").strip():
            sys.exit(
                f"bench-e2e: no iperf3 on {node}: the lab runs an image older than "
                "tests/lab/packages.txt (make lab-down && make lab), or BENCH_E2E_PARTS=launch"
            )


def throughput() -> dict[str, tuple[float, str]]:
    if TPUT_RUNS < 3:
        sys.exit(f"bench-e2e: BENCH_E2E_TPUT_RUNS={TPUT_RUNS}: at least 3 rounds")
    host_ip = underlay_ip("c1")
    job = PodJob()
    modes = ("pod", "bare", "host")
    samples: dict[str, list[float]] = {m: [] for m in modes}
    try:
        bare_vxlan_up(pod_mtu(job.job))
        for i in range(TPUT_RUNS):
            for mode in modes if i % 2 == 0 else modes[::-1]:
                if mode == "pod":
                    gbps = job.run()
                elif mode == "bare":
                    gbps = host_run(BARE_IPS[0], BARE_PORT)
                else:
                    gbps = host_run(host_ip)
                samples[mode].append(gbps)
                print(f"# throughput run {i + 1} {mode} {gbps:.2f} Gbit/s", file=sys.stderr)
    finally:
        job.close()
        bare_vxlan_down()
    pod_m = statistics.median(samples["pod"])
    host_m = statistics.median(samples["host"])
    bare_m = statistics.median(samples["bare"])
    THROUGHPUT_SAMPLES.update(samples)
    return {
        "overlay_throughput_pod_gbps": (pod_m, "Gbit/s"),
        "overlay_throughput_host_gbps": (host_m, "Gbit/s"),
        "overlay_throughput_ratio": (pod_m / host_m, "ratio"),
        "overlay_throughput_bare_vxlan_gbps": (bare_m, "Gbit/s"),
        "overlay_throughput_ratio_vs_vxlan": (pod_m / bare_m, "ratio"),
    }


THROUGHPUT_SAMPLES: dict[str, list[float]] = {}


def launch() -> tuple[dict[str, tuple[float, str]], int]:
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
    print(f"# {RUNS} runs per mode, {len(ready)} pod-ready samples, {wall:.0f} s", file=sys.stderr)
    return figures, len(ready)


def set_pid_init(value: str) -> None:
    """pid_init of podnetd on c1 and c2, podnetd restarted and answering again."""
    for node in ("c1", "c2"):
        ssh(
            node,
            f"sed -i 's|^pid_init:.*|pid_init: \"{value}\"|' {PODNET_CONF} && "
            f"grep -q '^pid_init: \"{value}\"' {PODNET_CONF} && systemctl restart podnetd && "
            "until podnet pods >/dev/null 2>&1; do sleep 0.1; done",
        )


def srun_true_ms(runs: int) -> list[float]:
    script = f"""
cd /tmp
for i in $(seq {runs}); do
  until [ "$(sinfo -h -n c1,c2 -o %T | sort -u)" = idle ]; do sleep 0.02; done
  t0=$(date +%s%N)
  runuser -u alice -- srun -N2 -w c1,c2 -t 1 true || exit 1
  t1=$(date +%s%N)
  echo $(( (t1 - t0) / 1000 ))
done
"""
    return [int(x) / 1000.0 for x in ssh("login", script).split()]


def pidns() -> dict[str, tuple[float, str]]:
    samples: dict[str, list[float]] = {"netns": [], "pidns": []}
    try:
        while min(len(v) for v in samples.values()) < PIDNS_RUNS:
            for mode, value in (("netns", ""), ("pidns", PID_INIT)):
                set_pid_init(value)
                samples[mode] += srun_true_ms(PIDNS_BLOCK)
    finally:
        set_pid_init(PID_INIT)
    net_m = statistics.median(samples["netns"])
    pid_m = statistics.median(samples["pidns"])
    print(f"# pidns: {len(samples['pidns'])} runs per mode", file=sys.stderr)
    return {
        "srun_n2_true_pod_netns_only": (net_m, "ms"),
        "srun_n2_true_pod_with_pidns": (pid_m, "ms"),
        "pid_ns_overhead": (pid_m - net_m, "ms"),
    }


def make_sif() -> str:
    """A SIF of a few of the node's binaries on c1 and c2 (no registry in the lab)."""
    sif = f"{IMAGE_DIR}/bench.sif"
    script = f"""set -e
d={IMAGE_DIR}/root
rm -rf {IMAGE_DIR} && mkdir -p "$d/bin" "$d/etc" "$d/proc" "$d/sys" "$d/dev" "$d/tmp"
for b in /bin/sh /bin/true; do
    cp "$b" "$d/bin/"
    for l in $(ldd "$b" | grep -o '/[^ ]*'); do
        mkdir -p "$d$(dirname "$l")"; cp -n "$l" "$d$l"
    done
done
apptainer -q build -F {sif} "$d" >/dev/null
chmod 0755 {IMAGE_DIR} && chmod 0644 {sif}
"""
    for node in ("c1", "c2"):
        ssh(node, script)
    return sif


def image() -> dict[str, tuple[float, str]]:
    sif = make_sif()
    modes = {
        "image": f"srun -N2 -w c1,c2 -t 1 --podnet-image={sif} true",
        "direct": f"srun -N2 -w c1,c2 -t 1 apptainer -q exec {sif} true",
        "none": "srun -N2 -w c1,c2 -t 1 true",
    }
    body = [
        '  until [ "$(sinfo -h -n c1,c2 -o %T | sort -u)" = idle ]; do sleep 0.02; done\n'
        f"  t0=$(date +%s%N); runuser -u alice -- {cmd} || exit 1; t1=$(date +%s%N)\n"
        f'  echo "{mode} $(( (t1 - t0) / 1000 ))"'
        for mode, cmd in modes.items()
    ]
    lines = "\n".join(body)
    script = f"cd /tmp\nfor i in $(seq {IMAGE_RUNS}); do\n{lines}\ndone\n"
    samples: dict[str, list[float]] = {m: [] for m in modes}
    try:
        for line in ssh("login", script).splitlines():
            mode, us = line.split()
            samples[mode].append(int(us) / 1000.0)
    finally:
        for node in ("c1", "c2"):
            ssh(node, f"rm -rf {IMAGE_DIR}", check=False)
    med = {m: statistics.median(v) for m, v in samples.items()}
    print(f"# image: {IMAGE_RUNS} runs per mode", file=sys.stderr)
    return {
        "srun_n2_true_with_image": (med["image"], "ms"),
        "srun_n2_true_apptainer_direct": (med["direct"], "ms"),
        "srun_n2_true_no_image": (med["none"], "ms"),
        "image_overhead_vs_apptainer": (med["image"] - med["direct"], "ms"),
    }


def _on_signal(signum: int, _frame: object) -> None:
    # SystemExit runs the `finally` blocks: the job cancelled, the bare VXLAN removed
    sys.exit(f"bench-e2e: signal {signum}")


def main() -> int:
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _on_signal)
    if not Path(f"/var/lib/podnet-lab/{LAB}/lab.env").exists():
        sys.exit(f"bench-e2e: lab {LAB} is not up (make lab)")
    figures: dict[str, tuple[float, str]] = {}
    ready = 0
    if "throughput" in PARTS:
        require_iperf3()
    if "launch" in PARTS:
        launch_figures, ready = launch()
        figures.update(launch_figures)
    if "throughput" in PARTS:
        figures.update(throughput())
    if "pidns" in PARTS:
        figures.update(pidns())
    if "image" in PARTS:
        figures.update(image())
    for name, (value, unit) in figures.items():
        print(f"{name} {value:.2f} {unit}" if unit != "ms" else f"{name} {value:.1f} {unit}")
    outdir = REPO / "build" / "bench"
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "e2e.json").write_text(
        json.dumps(
            {
                "lab": LAB,
                "runs": RUNS if "launch" in PARTS else 0,
                "ready_samples": ready,
                "throughput_runs": TPUT_RUNS if "throughput" in PARTS else 0,
                "throughput_seconds": TPUT_SECONDS,
                "throughput_samples_gbps": THROUGHPUT_SAMPLES,
                "bare_vxlan": BARE_VXLAN,
                "figures": {k: {"value": round(v, 2), "unit": u} for k, (v, u) in figures.items()},
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
