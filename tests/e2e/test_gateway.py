# SPDX-License-Identifier: Apache-2.0
"""Gateways (issue 11, docs/gateway.md): egress under the global and per-user policy,
published ports reached from `ext`, nothing else reached from outside, hairpin dropped,
a rule change applied to established flows, conntrackd's sync statistics in
podnet-gatewayd's metrics (issue 37), failover with established TCP kept.

Needs a lab with gateways (LAB_GATEWAYS=1: gw1, gw2 and ext); skipped otherwise. The lab
policy (inventories/lab/group_vars/all/lab.yml): 203.0.113.128/25 tcp 8000-8099 and icmp
allowed, tcp 8081 denied, alice alone may also reach tcp 9000, 2 published ports each.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import (
    CLUSTER,
    LAB,
    REPO,
    etcdctl,
    in_pod,
    lab_inventory,
    pod_of,
    running_jobs,
    sbatch,
    scancel,
    wait_for,
)
from conftest import ssh as _ssh
from test_metrics import scrape

STATE = Path(f"/var/lib/podnet-lab/{LAB}")


def _lab_env() -> dict[str, str]:
    env: dict[str, str] = {}
    f = STATE / "lab.env"
    if f.exists():
        for line in f.read_text().splitlines():
            k, _, v = line.partition("=")
            env[k] = v.strip("'\"")
    return env


if _lab_env().get("LAB_GATEWAYS") != "1":
    pytest.skip(f"lab {LAB} has no gateways (LAB_GATEWAYS=1 lab.sh up)", allow_module_level=True)


def ssh(target: str, cmd: str, check: bool = True, timeout: float = 120) -> Any:
    return _ssh(target, cmd, check=check, timeout=timeout)


def _inventory_vars() -> dict[str, Any]:
    inv = yaml.safe_load(lab_inventory().read_text())
    return dict(inv["all"]["children"]["lab"]["vars"])


VARS = _inventory_vars()
EXT_VIP = str(VARS["podnet_lab_gateway_external_vip"]).split("/")[0]
EXT_HOST = str(VARS["podnet_lab_gateway_external_host"])
POLICY_KEY = f"/podnet/{CLUSTER}/gateway/policy/global"

SERVER = r"""
import socket, sys, threading, time
def handle(c, a, port, mode):
    try:
        if mode == "stream":
            i = 0
            while True:
                c.sendall(f"{i}\n".encode()); i += 1; time.sleep(0.05)
        else:
            c.sendall(f"hello {port} from {a[0]}\n".encode())
    except OSError:
        pass
    finally:
        c.close()
def serve(port, mode):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(64)
    while True:
        c, a = s.accept()
        threading.Thread(target=handle, args=(c, a, port, mode), daemon=True).start()
for spec in sys.argv[1:]:
    p, m = spec.split(":")
    threading.Thread(target=serve, args=(int(p), m), daemon=True).start()
while True:
    time.sleep(3600)
"""

# one line from host:port, or "" (refused, dropped: 3 s)
CLIENT = r"""
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    s.settimeout(float(sys.argv[3]))
    print(s.makefile().readline().strip())
except OSError as e:
    print("ERR", type(e).__name__)
"""

# follow a stream: the last number received goes to a file, "EOF"/"ERR" when it ends
FOLLOW = r"""
import socket, sys
out = sys.argv[3]
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
    s.settimeout(30)
    for line in s.makefile():
        open(out + ".tmp", "w").write(line); __import__("os").replace(out + ".tmp", out)
    open(out, "w").write("EOF\n")
except OSError as e:
    open(out, "w").write(f"ERR {type(e).__name__}\n")
"""


def _put_file(node: str, path: str, text: str) -> None:
    b = base64.b64encode(text.encode()).decode()
    ssh(node, f"printf %s {b} | base64 -d > {path} && chmod 0755 {path}")


@pytest.fixture(scope="module")
def ext_servers() -> Iterator[None]:
    _put_file("ext", "/root/gwsrv.py", SERVER)
    ssh(
        "ext",
        "pkill -f '^python3 /root/gwsrv.py'; setsid python3 /root/gwsrv.py 8080:hello "
        "8081:hello 9000:hello 8090:stream 8091:stream >/dev/null 2>&1 </dev/null & sleep 0.5",
        check=False,
    )
    for n in ("c1", "c2"):
        for name, text in (("gwsrv.py", SERVER), ("gwcli.py", CLIENT), ("gwfollow.py", FOLLOW)):
            _put_file(n, f"/tmp/{name}", text)
    _put_file("ext", "/root/gwcli.py", CLIENT)
    _put_file("gw1", "/tmp/gwcli.py", CLIENT)
    for port in (8080, 8081, 9000):  # a leftover listener (another test, a benchmark)?
        got = ssh("ext", f"python3 /root/gwcli.py 127.0.0.1 {port} 2").stdout
        assert got.startswith(f"hello {port}"), f"ext: port {port} is not the test server: {got}"
    yield
    ssh("ext", "pkill -f '^python3 /root/gwsrv.py'", check=False)


@pytest.fixture(scope="module")
def gjobs(ext_servers: None) -> Iterator[dict[str, int]]:
    del ext_servers
    with running_jobs(alice=("alice", "gwa"), bob=("bob", "gwb")) as j:
        yield j


def connect(node: str, job: int, user: str, host: str, port: int, timeout: float = 3) -> str:
    """The user's client in their job's pod on `node`: a step, from their login session."""
    r = ssh(
        f"{user}@login",
        f"cd /tmp && srun --jobid={job} --overlap -N1 -n1 -w {node} "
        f"python3 /tmp/gwcli.py {host} {port} {timeout}",
    )
    return str(r.stdout.strip())


def from_ext(host: str, port: int, timeout: float = 3) -> str:
    return str(ssh("ext", f"python3 /root/gwcli.py {host} {port} {timeout}").stdout.strip())


def poll(fn: Any, timeout: float = 30, step: float = 0.2) -> Any:
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = fn()
        if last:
            return last
        time.sleep(step)
    raise AssertionError(f"timed out; last: {last!r}")


def publish(user: str, target: str, port: int, check: bool = True) -> Any:
    return ssh(f"{user}@login", f"podnet publish {target} {port}", check=check)


# -- egress ------------------------------------------------------------------------------
def test_egress_allowed_by_global_rule_leaves_from_the_gateway_address(
    gjobs: dict[str, int],
) -> None:
    out = connect("c1", gjobs["alice"], "alice", EXT_HOST, 8080)
    assert out == f"hello 8080 from {EXT_VIP}", out  # SNAT to the gateways' address


def test_denied_port(gjobs: dict[str, int]) -> None:
    assert connect("c1", gjobs["alice"], "alice", EXT_HOST, 8081).startswith("ERR")
    # the server is there: the gateway itself reaches it
    assert ssh("gw1", f"python3 /tmp/gwcli.py {EXT_HOST} 8081 3").stdout.startswith("hello")


def test_per_user_rule_allows_alice_not_bob(gjobs: dict[str, int]) -> None:
    assert connect("c2", gjobs["alice"], "alice", EXT_HOST, 9000).startswith("hello 9000")
    assert connect("c2", gjobs["bob"], "bob", EXT_HOST, 9000).startswith("ERR")
    assert connect("c2", gjobs["bob"], "bob", EXT_HOST, 8080).startswith("hello 8080")


def test_cluster_nodes_have_no_way_to_ext() -> None:
    r = ssh("c1", f"ping -c1 -W1 {EXT_HOST}", check=False)
    assert r.returncode != 0


# -- ingress -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def published(gjobs: dict[str, int]) -> Iterator[str]:
    """alice serves on pod1 (c2) port 8080, published; bob serves on his pod1 unpublished."""
    for user in ("alice", "bob"):
        p = pod_of("c2", gjobs[user])
        # as users start a server: SSH to c2 puts them in their most recent job's pod there
        ssh(
            f"{user}@c2",
            "setsid -f python3 /tmp/gwsrv.py 8080:hello >/dev/null 2>&1 </dev/null",
        )
        ns = p["netns"]
        wait_for(lambda ns=ns: ":8080 " in in_pod("c2", ns, "ss -ltn").stdout, 30)
    out = publish("alice", f"{gjobs['alice']}/pod1", 8080).stdout.strip()
    assert re.fullmatch(rf"{re.escape(EXT_VIP)}:\d+", out), out
    yield out
    ssh("c2", "pkill -f '^python3 /tmp/gwsrv.py'", check=False)


def test_ingress_to_a_published_port_from_ext(published: str, gjobs: dict[str, int]) -> None:
    host, port = published.split(":")
    out = poll(
        lambda: from_ext(host, int(port)).startswith("hello 8080") and from_ext(host, int(port))
    )
    assert out == f"hello 8080 from {EXT_HOST}", out  # the pod sees the real client
    listed = json.loads(ssh("alice@login", "podnet --json published").stdout)
    assert [(d["job_id"], d["pod"], d["port"]) for d in listed] == [(gjobs["alice"], 1, 8080)]
    assert json.loads(ssh("bob@login", "podnet --json published").stdout) == []


def test_unpublished_ports_and_other_pods_unreachable_from_ext(
    published: str, gjobs: dict[str, int]
) -> None:
    host, port = published.split(":")
    free = 20999 if int(port) != 20999 else 20998
    assert from_ext(host, free).startswith("ERR")
    # attack: ext routes the pod network through a gateway itself and dials pods directly
    a1 = pod_of("c2", gjobs["alice"])["ip"]
    b1 = pod_of("c2", gjobs["bob"])["ip"]
    gw_ext = "$(getent hosts gateway | cut -d' ' -f1)"
    ssh("ext", f"ip route replace 198.18.0.0/15 via {gw_ext}")
    try:
        assert from_ext(a1, 8080).startswith("ERR")  # published, but only via the gateway port
        assert from_ext(b1, 8080).startswith("ERR")
        assert ssh("ext", f"ping -c1 -W1 {b1}", check=False).returncode != 0
    finally:
        ssh("ext", "ip route del 198.18.0.0/15", check=False)


def test_publishing_another_users_pod_is_refused(gjobs: dict[str, int]) -> None:
    r = publish("bob", f"{gjobs['alice']}/pod0", 8080, check=False)
    assert r.returncode != 0 and "not yours" in r.stderr, r.stderr
    r = ssh("bob@login", f"podnet unpublish {gjobs['alice']}/pod1 8080", check=False)
    assert r.returncode != 0 and "not yours" in r.stderr, r.stderr


def test_hairpin_between_users_dropped(published: str, gjobs: dict[str, int]) -> None:
    host, port = published.split(":")
    # bob's pod dials alice's published address: through the gateway back into the pod
    # network, which the gateway drops; alice's own pod neither gets a hairpin path
    assert connect("c1", gjobs["bob"], "bob", host, int(port)).startswith("ERR")
    assert connect("c1", gjobs["alice"], "alice", host, int(port)).startswith("ERR")


def test_unpublish_and_release_at_job_end(published: str, gjobs: dict[str, int]) -> None:
    host, port = published.split(":")
    ssh("alice@login", f"podnet unpublish {gjobs['alice']}/pod1 8080")
    poll(lambda: from_ext(host, int(port)).startswith("ERR"))
    # a short job's publication goes with the job
    job = sbatch("alice", "gwshort")
    try:
        out = publish("alice", f"{job}/pod0", 8080).stdout.strip()
        assert out.startswith(EXT_VIP)
        assert f"/{out.split(':')[1]}" in etcdctl(
            f"get --prefix --keys-only /podnet/{CLUSTER}/gateway/published/"
        )
    finally:
        scancel(job)
    poll(
        lambda: (
            etcdctl(f"get --prefix --keys-only /podnet/{CLUSTER}/gateway/published/").strip() == ""
        ),
        timeout=60,
    )


# -- rules -------------------------------------------------------------------------------
def _follow(node: str, job: int, user: str, port: int, out: str) -> None:
    """A long connection out of the user's pod on `node` (their most recent job's there:
    SSH to the node puts them in it), writing its progress to `out`."""
    del job
    ssh(node, f"rm -f {out}")
    ssh(
        f"{user}@{node}",
        f"setsid -f python3 /tmp/gwfollow.py {EXT_HOST} {port} {out} >/dev/null 2>&1 </dev/null",
    )


def _progress(node: str, out: str) -> str:
    return str(ssh(node, f"cat {out} 2>/dev/null", check=False).stdout.strip())


def _advancing(node: str, out: str, seconds: float = 1.5) -> bool:
    a = _progress(node, out)
    time.sleep(seconds)
    b = _progress(node, out)
    return a.isdigit() and b.isdigit() and int(b) > int(a)


def test_rule_change_applies_to_established_flows_within_a_second(gjobs: dict[str, int]) -> None:
    job = gjobs["alice"]
    _follow("c1", job, "alice", 8090, "/tmp/gw-8090")
    _follow("c1", job, "alice", 8091, "/tmp/gw-8091")
    poll(lambda: _advancing("c1", "/tmp/gw-8090") and _advancing("c1", "/tmp/gw-8091"))
    before = etcdctl(f"get --print-value-only {POLICY_KEY}").strip()
    pol = json.loads(before)
    pol["egress"].insert(
        0, {"action": "deny", "cidr": "203.0.113.128/25", "proto": "tcp", "ports": "8090"}
    )
    t0 = time.monotonic()
    etcdctl(f"put {POLICY_KEY} '{json.dumps(pol)}'")
    try:
        # the denied flow stops, the flow still allowed goes on
        poll(lambda: not _advancing("c1", "/tmp/gw-8090", 1.0), timeout=30)
        took = time.monotonic() - t0
        assert _advancing("c1", "/tmp/gw-8091")
        print(f"rule change to a stopped flow: {took:.1f} s (including the 1 s probes)")
        assert connect("c1", job, "alice", EXT_HOST, 8090).startswith("ERR")
    finally:
        etcdctl(f"put {POLICY_KEY} '{before}'")
    poll(lambda: connect("c1", job, "alice", EXT_HOST, 8090, 1).startswith("0"), timeout=30)
    ssh("c1", "pkill -f '^python3 /tmp/gwfollow.py'", check=False)


# -- conntrackd's flow-state sync in podnet-gatewayd's metrics (docs/monitoring.md) -----
CTD = "podnet_gateway_conntrackd_"
GATEWAYD_PORT = 9465  # inventories/lab: gateway_metrics_listen


def _ctd(gw: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {k: v for k, v in scrape(gw, GATEWAYD_PORT).items() if k[0].startswith(CTD)}


def _sum(
    got: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """The sum of `name`'s series with `labels` (0 when there is none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in got.items() if n == CTD + name and want <= set(ls))


def test_conntrackd_sync_statistics_grow_with_a_flow(gjobs: dict[str, int]) -> None:
    active = poll(_active_gateway)
    other = "gw2" if active == "gw1" else "gw1"
    before = {gw: _ctd(gw) for gw in (active, other)}
    for gw, got in before.items():
        assert got[(CTD + "up", ())] == 1, (gw, got)
        for what in ("bytes", "packets", "errors"):
            for direction in ("sent", "received"):
                assert (f"{CTD}sync_{what}_total", (("direction", direction),)) in got, gw
        for what in ("lost", "malformed", "before"):
            assert got[(f"{CTD}sync_messages_{what}_total", ())] >= 0, gw
        assert (CTD + "cache_entries", (("cache", "internal"),)) in got, gw
        for cache in ("internal", "external"):
            for change in ("created", "updated", "destroyed"):
                labels = (("cache", cache), ("change", change))
                assert (CTD + "cache_changes_total", labels) in got, gw
                assert got[(CTD + "cache_failures_total", labels)] == 0, (gw, labels)
        assert (CTD + "queue_elements", (("queue", "rsqueue"),)) in got, gw
        # the gateways talk: at least FT-FW's hellos and acknowledgements, every second
        assert _sum(got, "sync_packets_total", direction="sent") > 0, gw
        assert _sum(got, "sync_packets_total", direction="received") > 0, gw
    # a flow out of alice's pod through the active gateway: conntrackd there takes it into its
    # internal cache and sends it; the other one writes it into its kernel's table
    assert connect("c1", gjobs["alice"], "alice", EXT_HOST, 8080).startswith("hello 8080")

    def grown() -> bool:
        a, o = _ctd(active), _ctd(other)
        return (
            _sum(a, "cache_changes_total", cache="internal", change="created")
            > _sum(before[active], "cache_changes_total", cache="internal", change="created")
            and _sum(a, "sync_bytes_total", direction="sent")
            > _sum(before[active], "sync_bytes_total", direction="sent")
            and _sum(o, "cache_changes_total", cache="external")
            > _sum(before[other], "cache_changes_total", cache="external")
            and _sum(o, "sync_bytes_total", direction="received")
            > _sum(before[other], "sync_bytes_total", direction="received")
        )

    poll(grown, timeout=30, step=1)  # read every 5 s (gateway/conntrackd.py)
    after = {gw: _ctd(gw) for gw in (active, other)}
    for gw in (active, other):
        assert _sum(after[gw], "sync_errors_total") == _sum(before[gw], "sync_errors_total"), gw
        assert _sum(after[gw], "sync_messages_malformed_total") == 0, gw


def test_conntrackd_up_is_0_while_it_is_stopped() -> None:
    """On the backup (stopping it there drops nothing): up 0 and no other conntrackd series
    within a few reads, 1 again when it is back."""
    active = poll(_active_gateway)
    other = "gw2" if active == "gw1" else "gw1"
    ssh(other, "systemctl stop conntrackd")
    try:
        poll(lambda: _ctd(other) == {(CTD + "up", ()): 0}, timeout=30, step=1)
        log = ssh(other, "journalctl -u podnet-gatewayd -p warning --since -1min -o cat").stdout
        assert "conntrackd's statistics: conntrackd -s" in log, log
    finally:
        ssh(other, "systemctl start conntrackd")
    poll(lambda: _ctd(other).get((CTD + "up", ())) == 1, timeout=30, step=1)


# -- failover (last: it powers off a gateway, then boots it again) -----------------------
def _active_gateway() -> str:
    for gw in ("gw1", "gw2"):
        if EXT_VIP in ssh(gw, "ip -4 -o addr show", check=False).stdout:
            return gw
    return ""


def _power_off(node: str) -> None:
    """SIGKILL the node's container init: every process of the node dies at once."""
    pid = (STATE / "nodes" / node / "init").read_text().split()[0]
    subprocess.run(["kill", "-KILL", pid], check=True)


def test_failover_new_connections_and_established_tcp(gjobs: dict[str, int]) -> None:
    job = gjobs["alice"]
    active = poll(_active_gateway)
    other = "gw2" if active == "gw1" else "gw1"
    _follow("c1", job, "alice", 8091, "/tmp/gw-fo")
    poll(lambda: _advancing("c1", "/tmp/gw-fo"))
    # the standby already holds the flow (conntrackd)
    poll(lambda: "dport=8091" in ssh(other, "conntrack -L -p tcp 2>/dev/null", check=False).stdout)
    _power_off(active)
    t0 = time.monotonic()
    try:
        poll(
            lambda: connect("c1", job, "alice", EXT_HOST, 8080, 1).startswith("hello"),
            timeout=30,
            step=0.05,
        )
        took = time.monotonic() - t0
        print(f"gateway failover: new connection after {took:.2f} s")
        assert _active_gateway() == other
        # the transfer that ran through the dead gateway goes on
        assert poll(lambda: _advancing("c1", "/tmp/gw-fo"), timeout=20)
        assert took < 10, f"new connections only after {took:.1f} s (target 3 s)"
    finally:
        ssh("c1", "pkill -f '^python3 /tmp/gwfollow.py'", check=False)
        env = {"LAB_NAME": LAB, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        if _lab_env().get("LAB_INVENTORY"):  # molecule's lab writes its inventory elsewhere
            env["LAB_INVENTORY"] = _lab_env()["LAB_INVENTORY"]
        subprocess.run(
            [str(REPO / "tests/lab/lab.sh"), "up"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
