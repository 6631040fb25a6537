# SPDX-License-Identifier: Apache-2.0
"""Gateway benchmark (issue 11; `make bench-gateway`). Prints `NAME VALUE UNIT` lines.

* policy_apply_ms_users1000 ms: 1000 users x 10 egress rules and 1000 pods, one user's
  rules changed: from the etcd records to the kernel table updated (policies parsed,
  only the changed one again; compiled; the difference to the table as one atomic nft
  transaction through libnftables), in a throwaway network namespace of this host,
  median of BENCH_GW_POLICY_RUNS (needs root, no lab);
* with a lab with gateways (PODNET_E2E_LAB, LAB_GATEWAYS=1) also:
  - gateway_egress_throughput_pod_gbps / _host_gbps, gateway_egress_throughput_ratio:
    iperf3 (one stream, BENCH_GW_TPUT_SECONDS) from alice's pod on c1 to ext through
    the active gateway versus from the active gateway itself to ext, alternating,
    BENCH_GW_TPUT_RUNS runs each, medians;
  - gateway_egress_cpu_pod_s_per_gb / _host_s_per_gb, gateway_egress_cpu_ratio: the
    CPU time iperf3 reports for its client and server (their system time holds the
    softirq work of every hop run in their context) per GB, same runs; host over pod:
    the cost ratio, steadier than the throughput ratio on a shared machine;
  - gateway_egress_throughput_router_gbps, gateway_egress_ratio_vs_router,
    gateway_egress_cpu_router_s_per_gb: the same hops as a plain Linux router, same
    rounds (pod, router, host, the order turned around every round): a host-side process
    on c1 (root, no pod) to ext through the active gateway, which forwards and
    masquerades it in a network namespace of its own (macvlans on its host0 and ext0: no
    podnet rule on the way), /30 addresses of 100.64.252.0/23 on both legs, c1's route
    to ext with the pod's MTU; the ratio is pod median / router median. Everything the
    router needs is removed at the end, also on failure or SIGTERM/SIGHUP/SIGINT;
  - gateway_failover_ms: the active gateway loses both links, the cluster side first
    (no VRRP goodbye: a dead gateway, as the network sees it); from the last TCP
    connection from alice's pod to ext that worked before to the first that works
    after (a connection attempt every 20 ms), median of BENCH_GW_FAILOVER_RUNS (the
    links come back between runs).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "agent" / "src"))

from podnet.gateway.nft import ruleset, update  # noqa: E402
from podnet.gateway.state import Raw, build_state  # noqa: E402

LAB = os.environ.get("PODNET_E2E_LAB", "pnlab")
POLICY_RUNS = int(os.environ.get("BENCH_GW_POLICY_RUNS", "11"))
TPUT_RUNS = int(os.environ.get("BENCH_GW_TPUT_RUNS", "5"))
TPUT_SECONDS = int(os.environ.get("BENCH_GW_TPUT_SECONDS", "3"))
FAILOVER_RUNS = int(os.environ.get("BENCH_GW_FAILOVER_RUNS", "10"))
#: the plain router of the reference, on the active gateway, and its two /30 legs
RT_NS, RT_IN, RT_OUT = "pnbrt", "pnbrtc", "pnbrte"
RT_CLUSTER = ("100.64.253.1", "100.64.253.2")  # router, c1
RT_EXT = ("100.64.252.1", "100.64.252.2")  # router, ext


def out(name: str, value: float, unit: str) -> None:
    print(f"{name} {value:.3f} {unit}", flush=True)


# -- policy apply (no lab) ----------------------------------------------------------------
def _raw(users: int, rules: int, changed: int) -> Raw:
    raw = Raw()
    for u in range(users):
        name = f"u{u}"
        raw.user_vni[name] = 4096 + u
        raw.ips[f"198.{18 + u // 65536}.{(u // 256) % 256}.{u % 256}"] = {
            "job_id": u + 1,
            "node": "c1",
            "vni": 4096 + u,
        }
        raw.user_pol[name] = json.dumps(
            {
                "egress": [
                    {
                        "action": "allow",
                        "cidr": f"10.{r}.{u % 256}.0/24",
                        "proto": "tcp",
                        "ports": str(1000 + r + (changed if u == 0 else 0)),
                    }
                    for r in range(rules)
                ]
            }
        )
    raw.global_pol = {"default": "deny", "egress": [{"action": "allow", "proto": "icmp"}]}
    return raw


def policy_apply_child() -> None:
    """Runs inside `unshare --net`: apply the table once, then time rule changes."""
    import nftables  # noqa: PLC0415

    nft = nftables.Nftables()

    def nft_cmd(text: str) -> None:
        rc, _o, err = nft.cmd(text)
        if rc != 0:
            raise SystemExit(f"nft: {err}")

    cur, _stale = build_state(_raw(1000, 10, 0))
    nft_cmd(ruleset("198.18.0.0/15", "ext0", "203.0.113.194", cur))
    times = []
    for i in range(POLICY_RUNS):
        raw = _raw(1000, 10, i + 1)  # the etcd records after a change of one user's rules
        t0 = time.perf_counter()
        st, _stale = build_state(raw)
        cmd = update(cur, st)
        assert cmd is not None
        nft_cmd(cmd)
        times.append((time.perf_counter() - t0) * 1000)
        cur = st
    rc, o, _e = nft.cmd("list set inet podnet_gw u4096_allow")
    assert rc == 0 and "1011" in o, o
    rc, o, _e = nft.cmd("list map inet podnet_gw user_chain")
    assert rc == 0 and o.count("jump") == 1000, "not 1000 users"
    print(json.dumps({"median": statistics.median(times), "max": max(times)}))


def bench_policy_apply() -> None:
    if os.geteuid() != 0:
        print("# policy_apply_ms_users1000: needs root (a network namespace)", file=sys.stderr)
        return
    r = subprocess.run(
        ["unshare", "--net", sys.executable, __file__, "--policy-child"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "agent" / "src")},
    )
    d = json.loads(r.stdout.strip().splitlines()[-1])
    out("policy_apply_ms_users1000", d["median"], "ms")


# -- lab parts ------------------------------------------------------------------------------
def ssh(target: str, cmd: str, check: bool = True, timeout: float = 120) -> str:
    r = subprocess.run(
        [str(REPO / "tests/lab/lab.sh"), "ssh", target, cmd],
        env={**os.environ, "LAB_NAME": LAB},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and r.returncode != 0:
        raise SystemExit(f"{target}: {cmd!r}: {r.stderr}")
    return r.stdout


def _lab_env() -> dict[str, str]:
    f = Path(f"/var/lib/podnet-lab/{LAB}/lab.env")
    env: dict[str, str] = {}
    if f.exists():
        for line in f.read_text().splitlines():
            k, _, v = line.partition("=")
            env[k] = v.strip("'\"")
    return env


def _addresses() -> tuple[str, str]:
    import yaml  # noqa: PLC0415

    inv = ssh_inventory()
    v = yaml.safe_load(Path(inv).read_text())["all"]["children"]["lab"]["vars"]
    return str(v["podnet_lab_gateway_external_vip"]).split("/")[0], str(
        v["podnet_lab_gateway_external_host"]
    )


def ssh_inventory() -> str:
    return subprocess.run(
        [str(REPO / "tests/lab/lab.sh"), "inventory"],
        env={**os.environ, "LAB_NAME": LAB},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def active_gateway(vip: str) -> str:
    for gw in ("gw1", "gw2"):
        if vip in ssh(gw, "ip -4 -o addr show", check=False):
            return gw
    return ""


def _job() -> tuple[int, str]:
    o = ssh(
        "login",
        "cd /tmp && runuser -u alice -- sbatch --parsable -J gwbench -w c1 -N1 --wrap 'sleep 900'",
    )
    job = int(o.strip().split(";")[0])
    try:
        for _ in range(120):
            if ssh("login", f"squeue -h -j {job} -o %T").strip() == "RUNNING":
                break
            time.sleep(0.5)
        for _ in range(60):
            pods = json.loads(ssh("c1", "podnet --json pods"))
            p = [x for x in pods if x.get("job_id") == job]
            if p:
                return job, Path(p[0]["netns"]).name
            time.sleep(0.5)
        raise SystemExit("no pod for the benchmark job")
    except BaseException:
        ssh("login", f"scancel {job}", check=False)
        raise


def _iperf(node: str, prefix: str, ext: str) -> tuple[float, float]:
    """Gbit/s received, and CPU seconds (client + server) per GB."""
    o = ssh(node, f"{prefix}iperf3 -J -t {TPUT_SECONDS} -c {ext}", timeout=TPUT_SECONDS + 60)
    end = json.loads(o)["end"]
    rx, cpu = end["sum_received"], end["cpu_utilization_percent"]
    cpu_s = (float(cpu["host_total"]) + float(cpu["remote_total"])) / 100 * float(rx["seconds"])
    return float(rx["bits_per_second"]) / 1e9, cpu_s / (float(rx["bytes"]) / 1e9)


def router_up(gw: str, mtu: int) -> None:
    """A plain Linux router on the gateway: a namespace with a macvlan on host0 and one
    on ext0, forwarding and masquerade, no other rule; c1 and ext get the other end of
    each leg (c1's route to ext with `mtu`, the pod's)."""
    nat = (
        f"table ip {RT_NS} {{\n chain post {{\n"
        "  type nat hook postrouting priority srcnat; policy accept;\n"
        f'  oifname "{RT_OUT}" masquerade\n }}\n}}\n'
    )
    router_down(gw)
    ssh(
        gw,
        f"set -e; ip netns add {RT_NS}; "
        f"ip link add link host0 name {RT_IN} netns {RT_NS} type macvlan mode bridge; "
        f"ip link add link ext0 name {RT_OUT} netns {RT_NS} type macvlan mode bridge; "
        f"ip -n {RT_NS} addr add {RT_CLUSTER[0]}/30 dev {RT_IN}; "
        f"ip -n {RT_NS} addr add {RT_EXT[0]}/30 dev {RT_OUT}; "
        f"for l in lo {RT_IN} {RT_OUT}; do ip -n {RT_NS} link set $l up; done; "
        f"ip netns exec {RT_NS} sysctl -qw net.ipv4.ip_forward=1; "
        f"printf %s {shlex.quote(nat)} | ip netns exec {RT_NS} nft -f -",
    )
    ssh(
        "c1",
        f"ip addr add {RT_CLUSTER[1]}/30 dev host0 && "
        f"ip route replace {RT_EXT[1]}/32 via {RT_CLUSTER[0]} dev host0 mtu {mtu}",
    )
    ssh("ext", f"ip addr add {RT_EXT[1]}/30 dev host0")
    # the router's macvlans are new links with new MACs: a neighbour entry a previous
    # run left on c1 or ext would send the first packets to the old ones
    ssh("c1", f"ip neigh flush to {RT_CLUSTER[0]} dev host0")
    ssh("ext", f"ip neigh flush to {RT_EXT[0]} dev host0")
    ssh("c1", f"ping -c 3 -W 5 -I {RT_CLUSTER[1]} {RT_EXT[1]} >/dev/null")


def router_down(gw: str) -> None:
    ssh(gw, f"ip netns del {RT_NS} 2>/dev/null; true", check=False)
    ssh(
        "c1",
        f"ip route del {RT_EXT[1]}/32 2>/dev/null; "
        f"ip addr del {RT_CLUSTER[1]}/30 dev host0 2>/dev/null; true",
        check=False,
    )
    ssh("ext", f"ip addr del {RT_EXT[1]}/30 dev host0 2>/dev/null; true", check=False)


def bench_throughput(ns: str, vip: str, ext: str) -> None:
    ssh("ext", "pkill iperf3; setsid iperf3 -s -D >/dev/null 2>&1 </dev/null", check=False)
    # the lab policy allows tcp 8000-8099 only: iperf3's 5201 is allowed for the run
    ssh("ext", "true")
    runs: dict[str, list[tuple[float, float]]] = {"pod": [], "router": [], "host": []}
    router_gw = active_gateway(vip)
    if not router_gw:
        raise SystemExit("bench-gateway: no gateway holds the virtual address")
    mtu = int(json.loads(ssh("c1", f"ip -n {ns} -j link show dev eth0"))[0]["mtu"])
    try:
        router_up(router_gw, mtu)
        for i in range(TPUT_RUNS):
            gw = active_gateway(vip)
            order = ("pod", "router", "host")
            for what in order if i % 2 == 0 else order[::-1]:
                if what == "pod":
                    r = _iperf("c1", f"ip netns exec {ns} runuser -u alice -- ", ext)
                elif what == "router":
                    r = _iperf("c1", "", f"{RT_EXT[1]} -B {RT_CLUSTER[1]}")
                else:
                    r = _iperf(gw, "", ext)
                runs[what].append(r)
                print(f"# round {i + 1} {what} {r[0]:.2f} Gbit/s {r[1]:.3f} s/GB", file=sys.stderr)
    finally:
        router_down(router_gw)
        ssh("ext", "pkill iperf3", check=False)

    def med(what: str, k: int) -> float:
        return statistics.median(x[k] for x in runs[what])

    p, h, rt = med("pod", 0), med("host", 0), med("router", 0)
    out("gateway_egress_throughput_pod_gbps", p, "Gbit/s")
    out("gateway_egress_throughput_host_gbps", h, "Gbit/s")
    out("gateway_egress_throughput_ratio", p / h, "ratio")
    pc, hc, rc = med("pod", 1), med("host", 1), med("router", 1)
    out("gateway_egress_cpu_pod_s_per_gb", pc, "s/GB")
    out("gateway_egress_cpu_host_s_per_gb", hc, "s/GB")
    out("gateway_egress_cpu_ratio", hc / pc, "ratio")
    out("gateway_egress_throughput_router_gbps", rt, "Gbit/s")
    out("gateway_egress_ratio_vs_router", p / rt, "ratio")
    out("gateway_egress_cpu_router_s_per_gb", rc, "s/GB")


def bench_failover(ns: str, vip: str, ext: str) -> None:
    ssh("ext", "pkill -f '^python3 -m http.server 8080'", check=False)
    ssh("ext", "cd /tmp; setsid python3 -m http.server 8080 >/dev/null 2>&1 </dev/null & sleep 0.5")
    # from c1's pod: connect every 20 ms (200 ms timeout); the failover time is from the
    # last connection that worked before the outage to the first that works after it
    probe = (
        "import socket,time\n"
        "last_ok=None; down=False; end=time.monotonic()+60\n"
        "while time.monotonic()<end:\n"
        "  try:\n"
        f"    socket.create_connection(('{ext}',8080),0.2).close(); ok=True\n"
        "  except OSError: ok=False\n"
        "  if ok and down: print((time.monotonic()-last_ok)*1000); break\n"
        "  if ok: last_ok=time.monotonic()\n"
        "  elif last_ok is not None: down=True\n"
        "  time.sleep(0.02)\n"
    )
    ssh("c1", f"printf '%s' {shlex.quote(probe)} > /tmp/gwprobe.py")
    times = []
    for _ in range(FAILOVER_RUNS):
        gw = active_gateway(vip)
        if not gw:
            time.sleep(2)
            continue
        ssh(
            "c1",
            f"rm -f /tmp/gwprobe.out; ip netns exec {ns} setsid python3 /tmp/gwprobe.py "
            ">/tmp/gwprobe.out 2>&1 </dev/null & sleep 1",
        )
        # both links down, host0 (where VRRP adverts go) first: keepalived cannot say
        # goodbye, as with a dead gateway; the ssh session dies with host0; back after 8 s
        ssh(
            gw,
            "setsid sh -c 'ip link set host0 down; ip link set ext0 down; sleep 8; "
            "ip link set host0 up; ip link set ext0 up' >/dev/null 2>&1 </dev/null &",
            check=False,
            timeout=10,
        )
        for _ in range(120):
            o = ssh("c1", "cat /tmp/gwprobe.out", check=False).strip()
            if o:
                break
            time.sleep(0.5)
        if o:
            times.append(float(o))
        else:
            print(f"# failover run through {gw}: no new connection in 60 s", file=sys.stderr)
        time.sleep(14)  # links back, VRRP settled, routes restored (podnetd's quiet pass)
    if times:
        out("gateway_failover_ms", statistics.median(times), "ms")
        out("gateway_failover_max_ms", max(times), "ms")


def _on_signal(signum: int, _frame: object) -> None:
    # SystemExit runs the `finally` blocks: router, policy, job and servers cleaned up
    raise SystemExit(f"bench-gateway: signal {signum}")


def main() -> None:
    if "--policy-child" in sys.argv:
        policy_apply_child()
        return
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _on_signal)
    bench_policy_apply()
    if _lab_env().get("LAB_GATEWAYS") != "1":
        print(f"# lab {LAB} has no gateways: throughput and failover skipped", file=sys.stderr)
        return
    vip, ext = _addresses()
    job, ns = _job()
    key = "/podnet/lab/gateway/policy/users/alice"
    pki = "/etc/podnet/pki"
    etcdctl = (
        f"etcdctl --endpoints=https://127.0.0.1:2379 --cacert={pki}/ca.crt "
        f"--cert={pki}/admin.crt --key={pki}/admin.key"
    )
    saved = ssh("ctl", f"{etcdctl} get --print-value-only {key}", check=False).strip()
    pol = {"egress": [{"action": "allow", "cidr": f"{ext}/32", "proto": "tcp", "ports": "5201"}]}
    try:
        ssh("ctl", f"{etcdctl} put {key} '{json.dumps(pol)}'")
        time.sleep(1)
        bench_throughput(ns, vip, ext)
        bench_failover(ns, vip, ext)
    finally:
        if saved:
            ssh("ctl", f"{etcdctl} put {key} '{saved}'", check=False)
        else:
            ssh("ctl", f"{etcdctl} del {key}", check=False)
        ssh("login", f"scancel {job}", check=False)
        ssh("ext", "pkill -f '^python3 -m http.server 8080'", check=False)
        ssh("c1", "pkill -f '^python3 /tmp/gwprobe.py'", check=False)


if __name__ == "__main__":
    main()
