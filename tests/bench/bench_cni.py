# SPDX-License-Identifier: Apache-2.0
"""`make bench-cni`: container network setup through CNI, the Flannel chain (issue 10).

What Apptainer runs for `--net --network flannel`: the Flannel CNI plugin (the artifact of
`make artifacts`) reading a node's lease file and delegating to Debian's `bridge` with
`host-local` IPAM. Each sample is one ADD (exec of the plugin chain, as Apptainer does) for
a fresh container netns; then one DEL each. Prints `NAME VALUE UNIT` lines:
`cni_flannel_add_p50/p99`, `cni_flannel_del_p50/p99` (ms) over PODNET_BENCH_CONTAINERS
(default 200) containers, and writes them as JSON to build/bench/cni.json.

Then, in the same run, the podnet CNI plugin (`podnet.api.cni`, what `apptainer exec --net
--network podnet` runs) against a real podnetd and etcd (tests/bench/bench_agent.py's
setup: netns `pbn-n1`, etcd on 198.19.224.1): one exec of the plugin per ADD for a fresh
container netns `pbhk-p<i>` (made by `ip netns add`, as root: the container is the user
`nobody`'s, named through CNI_ARGS, which podnetd hears from root for root's own
namespaces), then one DEL each: `cni_podnet_add_p50/p99`, `cni_podnet_del_p50/p99`; and
podnetd's own share, the same ADD request sent from the bench without the plugin's exec
(`podnetd_container_add_p50/p99`). The plugin is agent/native's `podnet-cni` (C: a relay
to podnetd, as the nodes install it); PODNET_BENCH_PLUGIN=python times the same plugin in
Python instead (on PODNET_BENCH_PYTHON, default /usr/bin/python3).

Run as root. Everything lives in netns `pbhk-node` (the "node": bridge `pbhkcni0`, a
/24 lease of 198.19.64.0/18, inside the RFC 2544 benchmarking range and apart from
bench_agent's 198.19.128.0/17) and container netns `pbhk-c<i>`, host-local state under
a temp dir; all is removed on exit. Nothing is routed off the host: the node netns has no
link to the host.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = os.environ.get("PODNET_CACHE_DIR", "/var/cache/podnet-dev")
CNI_PATH = os.environ.get("PODNET_BENCH_CNI_PATH", "/usr/lib/cni")
N = int(os.environ.get("PODNET_BENCH_CONTAINERS", "200"))
NODE = "pbhk-node"
OUT = REPO / "build" / "bench" / "cni.json"


def pct(samples: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(samples)
    return s[max(0, min(len(s) - 1, round(p / 100 * len(s) + 0.5) - 1))]


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def flannel_plugin() -> str:
    found = sorted(glob.glob(f"{CACHE}/artifacts/flannel-cni-*-linux-amd64"))
    if not found:
        sys.exit("bench_cni: no Flannel CNI plugin artifact (make artifacts)")
    return found[-1]


def inside_node(tmp: Path, plugin: str) -> dict[str, float]:
    """Runs in the node netns: N ADDs, then N DELs, each timed."""
    plugins = tmp / "plugins"
    plugins.mkdir()
    for name in ("bridge", "host-local", "loopback"):
        (plugins / name).symlink_to(Path(CNI_PATH) / name)
    (plugins / "flannel").symlink_to(plugin)
    subnet = tmp / "subnet.env"
    subnet.write_text(
        "FLANNEL_NETWORK=198.19.64.0/18\nFLANNEL_SUBNET=198.19.65.1/24\n"
        "FLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n"
    )
    conf = json.dumps(
        {
            "cniVersion": "0.4.0",
            "name": "pbhkflannel",
            "type": "flannel",
            "subnetFile": str(subnet),
            "dataDir": str(tmp / "flannel"),
            "delegate": {"bridge": "pbhkcni0", "hairpinMode": True, "isDefaultGateway": True},
        }
    ).encode()
    base = {**os.environ, "CNI_IFNAME": "eth0", "CNI_PATH": str(plugins)}
    adds: list[float] = []
    dels: list[float] = []
    for i in range(N):
        sh("ip", "netns", "add", f"pbhk-c{i}")
    for verb, out in (("ADD", adds), ("DEL", dels)):
        for i in range(N):
            env = {
                **base,
                "CNI_COMMAND": verb,
                "CNI_CONTAINERID": f"pbhk{i}",
                "CNI_NETNS": f"/run/netns/pbhk-c{i}",
            }
            t0 = time.perf_counter()
            r = subprocess.run(
                [str(plugins / "flannel")], input=conf, env=env, capture_output=True, check=False
            )
            out.append((time.perf_counter() - t0) * 1000)
            if r.returncode != 0:
                sys.exit(f"bench_cni: {verb} {i}: {r.stdout.decode()}{r.stderr.decode()}")
    return {
        "cni_flannel_add_p50": pct(adds, 50),
        "cni_flannel_add_p99": pct(adds, 99),
        "cni_flannel_del_p50": pct(dels, 50),
        "cni_flannel_del_p99": pct(dels, 99),
    }


def podnet_plugin() -> list[str]:
    """The plugin as the nodes run it: agent/native's podnet-cni (C, built here), or
    with PODNET_BENCH_PLUGIN=python the same plugin in Python."""
    if os.environ.get("PODNET_BENCH_PLUGIN", "c") == "python":
        return [os.environ.get("PODNET_BENCH_PYTHON", "/usr/bin/python3"), "-m", "podnet.cli.cni"]
    out = REPO / "build" / "native-bench"
    subprocess.run(
        ["make", "-s", "-C", str(REPO / "agent" / "native"), f"O={out}", "cni"],
        check=True,
    )
    return [str(out / "podnet-cni")]


def podnet_phase() -> dict[str, float]:
    """N ADDs then N DELs of the podnet CNI plugin against a real podnetd."""
    sys.path.insert(0, str(REPO / "tests" / "bench"))
    import bench_agent  # noqa: PLC0415 (its etcd + podnetd setup)

    user = pwd.getpwnam("nobody")
    # nobody holds N containers at once (the plugin's, then the direct ones): quotas that
    # fit them (the defaults allow 32 on a node; docs/security.md "Quotas")
    b = bench_agent.Bench(
        {
            "quota_containers_per_node": max(32, N),
            "quota_containers": max(128, N),
            "quota_addresses": max(136, N + 8),
        }
    )
    try:
        b.remove_leftovers()
        b.underlay()
        b.start_etcd()
        b.start_podnetd()
        # containers go beside a job of their user (podnetd's default policy)
        bench_agent.call(
            "job_up",
            b.socket,
            job_id=1,
            user="nobody",
            uid=user.pw_uid,
            job_name="cni",
            nodes=[bench_agent.NODE],
            node_index=0,
        )
        conf = json.dumps(
            {"cniVersion": "1.0.0", "name": "podnet", "type": "podnet", "socket": b.socket}
        ).encode()
        base = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(REPO / "agent" / "src"),
            "PODNET_SOCKET": b.socket,
            "CNI_IFNAME": "eth0",
            "CNI_PATH": CNI_PATH,
        }
        plugin = podnet_plugin()
        for i in range(N):
            sh("ip", "netns", "add", f"pbhk-p{i}")
        adds: list[float] = []
        dels: list[float] = []
        for verb, out in (("ADD", adds), ("DEL", dels)):
            for i in range(N):
                env = {
                    **base,
                    "CNI_COMMAND": verb,
                    "CNI_CONTAINERID": f"pbhkp{i}",
                    "CNI_NETNS": f"/run/netns/pbhk-p{i}",
                    "CNI_ARGS": f"PODNET_UID={user.pw_uid};PODNET_NAME=b{i}",
                }
                t0 = time.perf_counter()
                r = subprocess.run(
                    plugin,
                    input=conf,
                    env=env,
                    capture_output=True,
                    check=False,
                )
                out.append((time.perf_counter() - t0) * 1000)
                if r.returncode != 0:
                    sys.exit(
                        f"bench_cni: podnet {verb} {i}: {r.stdout.decode()}{r.stderr.decode()}"
                    )
                if verb == "ADD" and i == 0:
                    res = json.loads(r.stdout)
                    if not res["ips"][0]["address"].startswith("198.19."):
                        sys.exit(f"bench_cni: podnet ADD: unexpected result {res}")
        # podnetd's own share: the same requests from this process (no plugin exec)
        direct: list[float] = []
        for i in range(N):
            t0 = time.perf_counter()
            bench_agent.call(
                "container_add",
                b.socket,
                container_id=f"pbhkq{i}",
                ifname="eth0",
                netns=f"/run/netns/pbhk-p{i}",
                uid=user.pw_uid,
                name=f"q{i}",
            )
            direct.append((time.perf_counter() - t0) * 1000)
        for i in range(N):
            bench_agent.call(
                "container_del",
                b.socket,
                container_id=f"pbhkq{i}",
                ifname="eth0",
                uid=user.pw_uid,
            )
        return {
            "podnetd_container_add_p50": pct(direct, 50),
            "podnetd_container_add_p99": pct(direct, 99),
            "cni_podnet_add_p50": pct(adds, 50),
            "cni_podnet_add_p99": pct(adds, 99),
            "cni_podnet_del_p50": pct(dels, 50),
            "cni_podnet_del_p99": pct(dels, 99),
        }
    finally:
        b.cleanup()
        for i in range(N):
            subprocess.run(["ip", "netns", "del", f"pbhk-p{i}"], capture_output=True, check=False)


def cleanup() -> None:
    for i in range(N):
        subprocess.run(["ip", "netns", "del", f"pbhk-c{i}"], capture_output=True, check=False)
    subprocess.run(["ip", "netns", "del", NODE], capture_output=True, check=False)
    shutil.rmtree("/var/lib/cni/networks/pbhkflannel", ignore_errors=True)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--inside":
        tmp = Path(sys.argv[2])
        figures = inside_node(tmp, flannel_plugin())
        (tmp / "figures.json").write_text(json.dumps(figures))
        return 0
    if os.geteuid() != 0:
        sys.exit("bench_cni: needs root (netns, bridges)")
    for tool in ("bridge", "host-local"):
        if not (Path(CNI_PATH) / tool).exists():
            sys.exit(f"bench_cni: {CNI_PATH}/{tool} missing (containernetworking-plugins)")
    flannel_plugin()
    cleanup()
    try:
        with tempfile.TemporaryDirectory(prefix="pbhk-") as t:
            sh("ip", "netns", "add", NODE)
            sh("ip", "netns", "exec", NODE, "ip", "link", "set", "lo", "up")
            subprocess.run(
                ["ip", "netns", "exec", NODE, sys.executable, __file__, "--inside", t],
                check=True,
            )
            figures = json.loads((Path(t) / "figures.json").read_text())
    finally:
        cleanup()
    figures.update(podnet_phase())
    figures["cni_podnet_add_speedup_p50"] = (
        figures["cni_flannel_add_p50"] / figures["cni_podnet_add_p50"]
    )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"containers": N, **figures}, indent=1))
    for name, value in figures.items():
        unit = "x" if name.endswith("speedup_p50") else "ms"
        print(f"{name} {value:.1f} {unit}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
