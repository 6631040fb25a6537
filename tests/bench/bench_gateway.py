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


def _iperf(node: str, prefix: str, ext: str) -> tuple[float, float]:
    """Gbit/s received, and CPU seconds (client + server) per GB."""
    o = ssh(node, f"{prefix}iperf3 -J -t {TPUT_SECONDS} -c {ext}", timeout=TPUT_SECONDS + 60)
    end = json.loads(o)["end"]
    rx, cpu = end["sum_received"], end["cpu_utilization_percent"]
    cpu_s = (float(cpu["host_total"]) + float(cpu["remote_total"])) / 100 * float(rx["seconds"])
    return float(rx["bits_per_second"]) / 1e9, cpu_s / (float(rx["bytes"]) / 1e9)


def bench_throughput(ns: str, vip: str, ext: str) -> None:
    ssh("ext", "pkill iperf3; setsid iperf3 -s -D >/dev/null 2>&1 </dev/null", check=False)
    # the lab policy allows tcp 8000-8099 only: iperf3's 5201 is allowed for the run
    ssh("ext", "true")
    pod: list[tuple[float, float]] = []
    host: list[tuple[float, float]] = []
    for i in range(TPUT_RUNS):
        gw = active_gateway(vip)
        order = ("pod", "host") if i % 2 == 0 else ("host", "pod")
        for what in order:
            if what == "pod":
                pod.append(_iperf("c1", f"ip netns exec {ns} runuser -u alice -- ", ext))
            else:
                host.append(_iperf(gw, "", ext))
    ssh("ext", "pkill iperf3", check=False)
    p, h = statistics.median(x[0] for x in pod), statistics.median(x[0] for x in host)
    out("gateway_egress_throughput_pod_gbps", p, "Gbit/s")
    out("gateway_egress_throughput_host_gbps", h, "Gbit/s")
    out("gateway_egress_throughput_ratio", p / h, "ratio")
    pc, hc = statistics.median(x[1] for x in pod), statistics.median(x[1] for x in host)
    out("gateway_egress_cpu_pod_s_per_gb", pc, "s/GB")
    out("gateway_egress_cpu_host_s_per_gb", hc, "s/GB")
    out("gateway_egress_cpu_ratio", hc / pc, "ratio")


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


def main() -> None:
    if "--policy-child" in sys.argv:
        policy_apply_child()
        return
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
    ssh("ctl", f"{etcdctl} put {key} '{json.dumps(pol)}'")
    try:
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
