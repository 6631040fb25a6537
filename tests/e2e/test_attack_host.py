# SPDX-License-Identifier: Apache-2.0
"""Attacks from the nodes' host networks (issue 8, points 3, 5, 6).

* A user's process on a node's host network (an opt-out step `srun --podnet=no`, like
  cron or `systemd --user`) reaches no pod (TCP, UDP, ICMP) and cannot emit VXLAN (forged
  frames with another user's VNI, from the node's own VTEP address, never arrive); the
  same frames from a pod do not arrive either.
* A job step sees its own interfaces in /sys/class/net, not every user's bridge and VXLAN.
* The host network stays as it was: a native MPI job (default Open MPI settings) works on
  nodes that hold pods.
* Positive controls: root on a node reaches pods; an opt-out step reaches the host network.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
from conftest import CLUSTER, etcdctl, in_pod, pod_of, ssh, wait_for
from test_jobs import build_mpi_hello

TCP_PORT, UDP_PORT, VX_INNER_PORT = 7411, 7412, 7413
FORGED = 10
#: ping with CAP_NET_RAW for users, as many sites install it (the lab's ping has no file
#: capability and /proc/sys is read-only in nodes, so users could not ping at all)
USER_PING = "/usr/local/bin/e2e-host-ping"

#: in a pod, as its user: count TCP connections and UDP datagrams (one line each in LOG)
LISTENER = r"""
import select, socket, sys, time
log = open(sys.argv[1], "a", buffering=1)
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("0.0.0.0", int(sys.argv[2]))); t.listen(16)
us = []
for p in sys.argv[3:]:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", int(p))); us.append(u)
log.write("ready\n")
end = time.monotonic() + 90
while time.monotonic() < end:
    r, _, _ = select.select([t] + us, [], [], 1)
    for s in r:
        if s is t:
            c, a = t.accept(); log.write(f"tcp {a[0]}\n"); c.close()
        else:
            _d, a = s.recvfrom(2048); log.write(f"udp {s.getsockname()[1]} {a[0]} {a[1]}\n")
"""

#: forged VXLAN frames: argv[1] = base64 JSON {dst, port, vni, ip, mac, src_ip, src_mac,
#: sport, dport, n}; prints {"sent": n, "errors": [...]}
FORGE = r"""
import base64, json, socket, struct, sys
a = json.loads(base64.b64decode(sys.argv[1]))
def csum(b):
    s = sum(struct.unpack(f"!{len(b) // 2}H", b))
    s = (s >> 16) + (s & 0xFFFF); s += s >> 16
    return ~s & 0xFFFF
mac = lambda m: bytes.fromhex(m.replace(":", ""))
out = {"sent": 0, "errors": []}
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(a["n"]):
    pay = f"forged {i}".encode()
    udp = struct.pack("!HHHH", a["sport"] + i, a["dport"], 8 + len(pay), 0) + pay
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), i, 0, 64, 17, 0,
                     socket.inet_aton(a["src_ip"]), socket.inet_aton(a["ip"]))
    ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
    frame = mac(a["mac"]) + mac(a["src_mac"]) + b"\x08\x00" + ip + udp
    vx = struct.pack("!II", 0x08000000, a["vni"] << 8)
    try:
        s.sendto(vx + frame, (a["dst"], a["port"])); out["sent"] += 1
    except OSError as e:
        out["errors"].append(e.strerror)
print(json.dumps(out))
"""

#: an opt-out step's probes: argv[1] = base64 JSON {targets, tcp, udp, ping, host, host_port}
PROBE = r"""
import base64, json, socket, subprocess, sys
a = json.loads(base64.b64decode(sys.argv[1]))
res = {}
for ip in a["targets"]:
    r = res[ip] = {}
    try:
        socket.create_connection((ip, a["tcp"]), 3).close(); r["tcp"] = "connected"
    except OSError as e:
        r["tcp"] = e.strerror or str(e)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    errs = []
    for _ in range(3):
        try:
            u.sendto(b"probe", (ip, a["udp"]))
        except OSError as e:
            errs.append(e.strerror)
    r["udp_errors"] = errs
    p = subprocess.run([a["ping"], "-c", "2", "-W", "2", ip], capture_output=True, text=True)
    r["ping"] = p.returncode
    r["ping_out"] = (p.stdout + p.stderr)[-300:]
try:
    socket.create_connection((a["host"], a["host_port"]), 3).close(); res["host"] = "connected"
except OSError as e:
    res["host"] = e.strerror or str(e)
p = subprocess.run([a["ping"], "-c", "1", "-W", "2", a["host"]], capture_output=True, text=True)
res["host_ping"] = p.returncode
res["host_ping_out"] = (p.stdout + p.stderr)[-300:]
print("PROBE " + json.dumps(res))
"""


def _b64(d: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(d).encode()).decode()


def _put(node: str, path: str, text: str) -> None:
    ssh(node, f"cat > {path} <<'PNEOF'\n{text}\nPNEOF\nchmod 644 {path}")


def _mac(ip: str) -> str:
    return "0a:58:" + ":".join(f"{int(x):02x}" for x in ip.split("."))


def _underlay(node: str) -> str:
    return ssh(node, "ip -4 -o addr show host0").stdout.split()[3].split("/")[0]


def _vni(user: str) -> int:
    val = etcdctl(f"get --print-value-only /podnet/{CLUSTER}/users/{user}")
    return int(json.loads(val)["vni"])


def _log(node: str, path: str) -> list[str]:
    return ssh(node, f"cat {path} 2>/dev/null || true").stdout.splitlines()


def _listen(node: str, pod: dict[str, Any], log: str) -> None:
    """A listener in bob's pod (TCP_PORT; UDP_PORT and VX_INNER_PORT), started by bob as
    bob does: SSH to the node, which puts him in his job's pod there."""
    ssh(node, f"rm -f {log}")
    _put(node, "/tmp/e2e-host-listen.py", LISTENER)
    ssh(
        f"bob@{node}",
        f"setsid -f timeout 100 python3 /tmp/e2e-host-listen.py {log} {TCP_PORT} {UDP_PORT} "
        f"{VX_INNER_PORT} >/dev/null 2>&1 </dev/null",
    )
    wait_for(lambda: "ready" in _log(node, log), 30)
    # in the pod the attacks aim at (his job's), else nothing arriving would prove nothing
    listening = in_pod(node, pod["netns"], "ss -ltn").stdout
    assert f":{TCP_PORT} " in listening, f"bob's listener is not in {pod['netns']}: {listening}"


def _stop_listeners() -> None:
    for node in ("c1", "c2"):
        ssh(node, f"pkill -f e2e-host-listen.py; rm -f /tmp/e2e-host-* {USER_PING}", check=False)


def test_host_processes_reach_no_pod_and_forge_no_vxlan(jobs: dict[str, int]) -> None:
    b1, b2 = pod_of("c1", jobs["bob"]), pod_of("c2", jobs["bob"])
    a2 = pod_of("c2", jobs["alice"])
    logs = {"c1": "/tmp/e2e-host-c1.log", "c2": "/tmp/e2e-host-c2.log"}
    c1_ip = _underlay("c1")
    forge = {
        "dst": c1_ip,
        "port": 4789,
        "vni": _vni("bob"),
        "ip": b1["ip"],
        "mac": _mac(b1["ip"]),
        "src_ip": b2["ip"],  # as if from bob's pod on c2
        "src_mac": _mac(b2["ip"]),
        "sport": 40000,  # from the host; 41000 from alice's pod
        "dport": VX_INNER_PORT,
        "n": FORGED,
    }
    try:
        _listen("c1", b1, logs["c1"])
        _listen("c2", b2, logs["c2"])
        for node in ("c1", "c2"):
            _put(node, "/tmp/e2e-host-probe.py", PROBE)
            _put(node, "/tmp/e2e-host-forge.py", FORGE)
        ssh("c2", f"cp /usr/bin/ping {USER_PING} && setcap cap_net_raw+ep {USER_PING}")
        probe = {
            "targets": [b1["ip"], b2["ip"]],
            "tcp": TCP_PORT,
            "udp": UDP_PORT,
            "ping": USER_PING,
            "host": c1_ip,
            "host_port": 6818,  # slurmd on c1: the host network itself stays reachable
        }
        out = ssh(
            "alice@login",
            "cd /tmp && srun --podnet=no -N1 -w c2 -t 2 sh -c "
            f"'python3 /tmp/e2e-host-probe.py {_b64(probe)}; "
            f"python3 /tmp/e2e-host-forge.py {_b64(forge)}'",
            timeout=120,
        ).stdout
        res = json.loads(out.split("PROBE ", 1)[1].splitlines()[0])
        forged_host = out.strip().splitlines()[-1]
        # the same frames from alice's pod on c2 (her SSH session there is in it)
        del a2
        forged_pod = ssh(
            "alice@c2", f"python3 /tmp/e2e-host-forge.py {_b64({**forge, 'sport': 41000})}"
        ).stdout
        time.sleep(2)
        got = {n: _log(n, p) for n, p in logs.items()}
        # the opt-out step has a working network (TCP and ICMP to the host network)
        assert res["host"] == "connected", out
        assert res["host_ping"] == 0, out
        bad = [
            f"TCP to {ip} connected" for ip in (b1["ip"], b2["ip"]) if res[ip]["tcp"] == "connected"
        ]
        bad += [f"ping to {ip} answered" for ip in (b1["ip"], b2["ip"]) if res[ip]["ping"] == 0]
        vx = [ln.split()[-1] for ln in got["c1"] if ln.startswith(f"udp {VX_INNER_PORT}")]
        for who, lo in (("an opt-out step on c2", 40000), ("alice's pod on c2", 41000)):
            n = sum(lo <= int(p) < lo + FORGED for p in vx)
            if n:
                bad.append(f"{n} of {FORGED} forged VXLAN frames from {who} reached bob's pod")
        received = [ln for lines in got.values() for ln in lines if ln != "ready"]
        if received:
            bad.append(f"arrived in bob's pods: {received}")
        assert bad == [], f"{bad}\nprobe: {res}\nforged: host {forged_host}, pod {forged_pod}"
    finally:
        _stop_listeners()
    # positive control: root on the node still reaches pods (local and remote)
    for ip in (b1["ip"], b2["ip"]):
        p = ssh("c1", f"ping -c 1 -W 2 {ip}", check=False)
        if p.returncode != 0:
            routes = ssh("c1", "ip -4 route; podnet pods 2>&1 | head -20", check=False).stdout
            pytest.fail(f"root on c1 cannot reach {ip}: {p.stderr.strip()}\n{routes}")


def test_job_step_sees_only_its_own_interfaces(jobs: dict[str, int]) -> None:
    out = ssh(
        "alice@login",
        f"cd /tmp && srun --jobid={jobs['alice']} --overlap -N1 -w c1 ls /sys/class/net",
    ).stdout
    assert sorted(out.split()) == ["eth0", "lo"], out


def test_no_podnet_address_on_the_host_network(jobs: dict[str, int]) -> None:
    del jobs  # alice's and bob's pods (and bridges) exist on c1, c2
    for node in ("c1", "c2"):
        out = ssh(node, "ip -o addr show | grep -E ' (pnbr|pnvx|pnv)[0-9a-f]+ ' || true").stdout
        assert out.strip() == "", f"{node}: podnet links carry addresses:\n{out}"


def test_native_mpi_job_with_default_settings_beside_pods(jobs: dict[str, int]) -> None:
    for user in ("alice", "bob"):
        pod_of("c1", jobs[user])
        pod_of("c2", jobs[user])
    prog = build_mpi_hello()
    out = ssh(
        "alice@login",
        "cd /tmp && srun --podnet=no --mpi=pmix -N2 -n4 -w c1,c2 -t 1 "
        f"--bcast=/tmp/hello_mpi_native {prog}",
        timeout=180,
    ).stdout
    for rank in range(4):
        assert f"hello rank {rank} of 4" in out, out
