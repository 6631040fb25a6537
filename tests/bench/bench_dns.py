# SPDX-License-Identifier: Apache-2.0
"""`make bench-dns`: the cost of name privacy per DNS query (issue 22).

The CoreDNS podnet ships (the slim artifact of `make artifacts`) against a real etcd, one
process with two server blocks for the cluster zone, the same but for the `privacy`
plugin: port 53 with it (as the role writes it, on by default), port 54 without it
(today's Corefile before name privacy). A client in a network namespace that holds a pod
address of alice's asks for her own name (`pod0.myjob.alice.lab A`, what a pod resolves
most), alternately from each block, one query in flight (a UDP round trip from Python,
timed with perf_counter_ns); both blocks answer from their cache after the first query, as
the shipped `cache 5` does for a name in use. Prints `NAME VALUE UNIT` lines:

* `dns_query_p50_us`, `dns_query_p99_us`: without the privacy filter;
* `dns_query_p50_us_private`, `dns_query_p99_us_private`: with it;
* `dns_query_private_overhead_pct`: (p50 private - p50) / p50, the target is <= 20 %;

over PODNET_BENCH_DNS_QUERIES (default 20000) queries each after 1000 untimed ones, and
writes them as JSON to build/bench/dns.json. The etcd holds 1000 users and 10000 pod
addresses (the owners the plugin follows), so its maps are not trivially small.

Run as root. Everything lives in netns `pbdns-s` (etcd on its loopback, CoreDNS, bridge
`br0` with 198.19.200.53) and `pbdns-a` (alice's pod, 198.19.128.9); the pod network is
198.19.128.0/18 (RFC 2544 benchmarking space); both are removed at exit, and nothing is
routed off the host (the namespaces have no link to it).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = os.environ.get("PODNET_CACHE_DIR", "/var/cache/podnet-dev")
ETCD = os.environ.get("PODNET_BENCH_ETCD") or shutil.which("etcd") or "etcd"
N = int(os.environ.get("PODNET_BENCH_DNS_QUERIES", "20000"))
WARMUP = 1000
SRV, CLI = "pbdns-s", "pbdns-a"
DNS_IP, ALICE_IP = "198.19.200.53", "198.19.128.9"
PODS = "198.19.128.0/18"
OUT = REPO / "build" / "bench" / "dns.json"


def log(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


def out(name: str, value: float, unit: str) -> None:
    print(f"{name} {value:.1f} {unit}", flush=True)


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def pct(samples: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(samples)
    return s[max(0, min(len(s) - 1, round(p / 100 * len(s) + 0.5) - 1))]


def coredns_bin() -> str:
    gomod = (REPO / "agent/artifacts/coredns/go.mod").read_text().split()
    version = gomod[gomod.index("github.com/coredns/coredns") + 1].lstrip("v")
    return f"{CACHE}/artifacts/coredns-{version}-linux-amd64"


def cleanup() -> None:
    for ns in (CLI, SRV):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def network() -> None:
    cleanup()
    sh("ip", "netns", "add", SRV)
    sh("ip", "netns", "add", CLI)
    for ns in (SRV, CLI):
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "-n", SRV, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", SRV, "link", "set", "br0", "up")
    sh("ip", "-n", SRV, "addr", "add", f"{DNS_IP}/32", "dev", "br0")
    sh("ip", "-n", SRV, "link", "add", "va", "type", "veth", "peer", "name", "eth0", "netns", CLI)
    sh("ip", "-n", SRV, "link", "set", "va", "master", "br0", "up")
    sh("ip", "-n", CLI, "addr", "add", f"{ALICE_IP}/32", "dev", "eth0")
    sh("ip", "-n", CLI, "link", "set", "eth0", "up")
    sh("ip", "-n", CLI, "route", "add", f"{DNS_IP}/32", "dev", "eth0")
    sh("ip", "-n", SRV, "route", "add", f"{ALICE_IP}/32", "dev", "br0")


def fill_etcd(host: str, port: int) -> None:
    """alice, 999 other users, 10 pod addresses each (alice's first is the client's), one
    job name of alice's; through etcd's JSON gateway in a few large transactions."""

    def b64(s: str) -> str:
        return base64.b64encode(s.encode()).decode()

    ops = []
    for u in range(1000):
        user = "alice" if u == 0 else f"u{u}"
        vni = 4096 + u
        ops.append((f"/podnet/lab/users/{user}", json.dumps({"vni": vni, "uid": 2000 + u})))
        for i in range(10):
            n = u * 10 + i
            ip = f"198.19.{128 + n // 256}.{n % 256}"  # alice's pods: n 0-9 (ALICE_IP is n 9)
            ops.append((f"/podnet/lab/ips/{ip}", json.dumps({"job_id": n + 1, "vni": vni})))
    ops.append(("/skydns/lab/alice/myjob/pod0", json.dumps({"host": ALICE_IP, "ttl": 30})))
    ops.append(("/skydns/lab/u1/job/pod0", json.dumps({"host": "198.19.128.10", "ttl": 30})))
    for i in range(0, len(ops), 100):
        body = json.dumps(
            {
                "success": [
                    {"requestPut": {"key": b64(k), "value": b64(v)}} for k, v in ops[i : i + 100]
                ]
            }
        ).encode()
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("POST", "/v3/kv/txn", body)
        resp = conn.getresponse()
        resp.read()
        conn.close()
        if resp.status != 200:
            raise OSError(f"etcd: HTTP {resp.status}")


def query(name: str, qid: int) -> bytes:
    q = struct.pack("!6H", qid, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(x)]) + x.encode() for x in name.split(".")) + b"\0"
    return q + struct.pack("!2H", 1, 1)


#: in alice's pod: first that the filter is there (another user's name: NXDOMAIN from
#: port 53, an answer from 54), then the timed queries; prints [[port 53 us], [port 54 us]]
CLIENT = r"""
import json, socket, sys, time
q, n, warm, ip = bytes.fromhex(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
other = bytes.fromhex(sys.argv[5])
socks = []
for port in (53, 54):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((ip, port))
    s.settimeout(2)
    socks.append(s)
for s, want in zip(socks, (3, 0)):
    s.send(other)
    rcode = s.recv(512)[3] & 15
    if rcode != want:
        raise SystemExit(f"another user's name: rcode {rcode}, want {want}")
times = [[], []]
for i in range(warm + n):
    for k, s in enumerate(socks):
        t0 = time.perf_counter_ns()
        s.send(q)
        r = s.recv(512)
        t1 = time.perf_counter_ns()
        if r[3] & 15 != 0 or r[6:8] == b"\0\0":
            raise SystemExit(f"port {53 + k}: rcode {r[3] & 15}, answers {r[6:8].hex()}")
        if i >= warm:
            times[k].append((t1 - t0) / 1000)
print(json.dumps(times))
"""


def main() -> int:
    if os.geteuid() != 0:
        print("bench_dns: run as root (network namespaces)", file=sys.stderr)
        return 1
    binary = coredns_bin()
    if not os.access(binary, os.X_OK):
        print(f"bench_dns: {binary} missing (make artifacts)", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="pbdns-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        network()
        port = 2379
        procs.append(
            subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    SRV,
                    ETCD,
                    "--name",
                    "b",
                    "--data-dir",
                    str(tmp / "etcd"),
                    "--listen-client-urls",
                    f"http://127.0.0.1:{port}",
                    "--advertise-client-urls",
                    f"http://127.0.0.1:{port}",
                    "--listen-peer-urls",
                    "http://127.0.0.1:2380",
                    "--initial-advertise-peer-urls",
                    "http://127.0.0.1:2380",
                    "--initial-cluster",
                    "b=http://127.0.0.1:2380",
                ],
                stdout=subprocess.DEVNULL,
                stderr=(tmp / "etcd.log").open("w"),
            )
        )
        endpoint = f"http://127.0.0.1:{port}"
        filler = (
            f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            "import bench_dns, time\n"
            "for _ in range(100):\n"
            "    try:\n"
            f"        bench_dns.fill_etcd('127.0.0.1', {port}); break\n"
            "    except OSError:\n"
            "        time.sleep(0.1)\n"
            "else:\n"
            "    raise SystemExit('etcd did not start')\n"
        )
        sh("ip", "netns", "exec", SRV, sys.executable, "-c", filler)
        block = """lab:{port} {{
    bind {ip}
    etcd lab {{
        endpoint {endpoint}
    }}
    {privacy}
    loadbalance
    cache 5
}}
"""
        privacy = f"privacy {{\n        pods {PODS}\n        state /podnet/lab/\n    }}"
        corefile = tmp / "Corefile"
        corefile.write_text(
            block.format(port=53, ip=DNS_IP, endpoint=endpoint, privacy=privacy)
            + block.format(port=54, ip=DNS_IP, endpoint=endpoint, privacy="")
        )
        procs.append(
            subprocess.Popen(
                ["ip", "netns", "exec", SRV, binary, "-conf", str(corefile)],
                stdout=(tmp / "coredns.log").open("w"),
                stderr=subprocess.STDOUT,
            )
        )
        time.sleep(1.5)
        log(f"{N} queries each (after {WARMUP}), one in flight, alternating with/without privacy")
        q = query("pod0.myjob.alice.lab", 0x5044)
        r = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                CLI,
                sys.executable,
                "-c",
                CLIENT,
                q.hex(),
                str(N),
                str(WARMUP),
                DNS_IP,
                query("pod0.job.u1.lab", 0x5045).hex(),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode != 0:
            print(f"bench_dns: client failed: {r.stderr}", file=sys.stderr)
            print((tmp / "coredns.log").read_text()[-2000:], file=sys.stderr)
            return 1
        private, plain = json.loads(r.stdout)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)
        cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    figures = {
        "dns_query_p50_us": statistics.median(plain),
        "dns_query_p99_us": pct(plain, 99),
        "dns_query_p50_us_private": statistics.median(private),
        "dns_query_p99_us_private": pct(private, 99),
    }
    figures["dns_query_private_overhead_pct"] = 100 * (
        figures["dns_query_p50_us_private"] / figures["dns_query_p50_us"] - 1
    )
    for name, value in figures.items():
        out(name, value, "%" if name.endswith("_pct") else "us")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps({"queries": N, "warmup": WARMUP, "cpus": os.cpu_count(), **figures}, indent=1)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
