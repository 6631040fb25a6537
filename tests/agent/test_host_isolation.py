# SPDX-License-Identifier: Apache-2.0
"""Host-side processes (issue 8, points 3 and 6): a user's process on a node's own
network reaches no pod and emits no VXLAN; system identities (root) still reach pods;
podnet's host-side links carry no address (IPv4 or IPv6), also after an upgrade."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from conftest import Node, wait_for
from podnet.config import ConfigError, NodeConfig
from test_pods import job_up, ping

USER = 2001
PORT, INNER_PORT = 7711, 7712

LISTEN = (
    "import socket,sys,select,time\n"
    "t=socket.socket();t.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
    "t.bind(('0.0.0.0',int(sys.argv[1])));t.listen(8)\n"
    "u=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);u.bind(('0.0.0.0',int(sys.argv[2])))\n"
    "log=open(sys.argv[3],'a',buffering=1);log.write('ready\\n');end=time.monotonic()+20\n"
    "while time.monotonic()<end:\n"
    " r,_,_=select.select([t,u],[],[],0.5)\n"
    " for s in r:\n"
    "  if s is t:\n"
    "   c,a=t.accept();log.write('tcp '+a[0]+'\\n');c.close()\n"
    "  else:\n"
    "   d,a=u.recvfrom(2048);log.write('udp '+a[0]+'\\n')\n"
)

CONNECT = (
    "import socket,sys\n"
    "try:\n"
    " socket.create_connection((sys.argv[1],int(sys.argv[2])),2).close();print('connected')\n"
    "except OSError as e:\n"
    " print('refused', e.strerror)\n"
)

#: forged VXLAN (argv: base64 JSON): sends n frames, prints how many sendto() accepted
FORGE = (
    "import base64,json,socket,struct,sys\n"
    "a=json.loads(base64.b64decode(sys.argv[1]));s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
    "ok=0\n"
    "for i in range(a['n']):\n"
    " try:\n"
    "  s.sendto(bytes.fromhex(a['hex']),(a['dst'],a['port']));ok+=1\n"
    " except OSError:\n"
    "  pass\n"
    "print(ok)\n"
)


def _csum(b: bytes) -> int:
    s = sum(struct.unpack(f"!{len(b) // 2}H", b))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


def _mac(ip: str) -> bytes:
    return bytes([0x0A, 0x58, *(int(x) for x in ip.split("."))])


def vxlan_frame(vni: int, src_ip: str, dst_ip: str, dport: int) -> bytes:
    pay = b"forged"
    udp = struct.pack("!HHHH", 40000, dport, 8 + len(pay), 0) + pay
    iph = struct.pack(
        "!BBHHHBBH4s4s",
        0x45,
        0,
        20 + len(udp),
        1,
        0,
        64,
        17,
        0,
        bytes(int(x) for x in src_ip.split(".")),
        bytes(int(x) for x in dst_ip.split(".")),
    )
    iph = iph[:10] + struct.pack("!H", _csum(iph)) + iph[12:]
    eth = _mac(dst_ip) + _mac(src_ip) + b"\x08\x00"
    return struct.pack("!II", 0x08000000, vni << 8) + eth + iph + udp


@pytest.fixture(scope="module")
def bob(cluster: dict[str, Node], etcd: Any) -> dict[str, Any]:
    """bob's 2-node job (7702) and alice's (7701): user bridges on n1 and n2."""
    nodes = ["n1", "n2"]
    for n in (cluster["n1"], cluster["n2"]):
        job_up(n, 7701, "alice", 2001, "hosta", nodes)
    pods = [job_up(n, 7702, "bob", 2002, "hostb", nodes) for n in (cluster["n1"], cluster["n2"])]
    vni = etcd.client.get_json("/podnet/t/users/bob")["vni"]
    return {"pods": pods, "vni": vni}


def _listen(node: Node, pod: dict[str, Any], log: Path, port: int, inner_port: int) -> None:
    """A listener in the pod (TCP `port`, UDP `inner_port`), one line per arrival in log."""
    log.unlink(missing_ok=True)
    node.pod_exec(
        pod["netns"],
        "sh",
        "-c",
        f'python3 -c "$0" {port} {inner_port} {log} >/dev/null 2>&1 &',
        LISTEN,
    )
    wait_for(lambda: log.exists() and "ready" in log.read_text(), 10)


def _connect(node: Node, ip: str, uid: int | None) -> str:
    argv = ["python3", "-c", CONNECT, ip, str(PORT)]
    if uid is not None:
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
    return node.ns(*argv).stdout.strip()


def test_user_on_the_host_reaches_no_pod_root_does(
    cluster: dict[str, Node], bob: dict[str, Any], workdir: Path
) -> None:
    n1, n2 = cluster["n1"], cluster["n2"]
    b1 = bob["pods"][0]
    log = workdir / "host-listen.log"
    _listen(n1, b1, log, PORT, INNER_PORT)
    # a user's socket on the pod's node and on another node: nothing arrives
    for node in (n1, n2):
        assert _connect(node, b1["ip"], USER).startswith("refused"), node.name
        node.ns(
            "setpriv",
            f"--reuid={USER}",
            f"--regid={USER}",
            "--clear-groups",
            "python3",
            "-c",
            "import socket,sys\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
            "try:\n s.sendto(b'x',(sys.argv[1],int(sys.argv[2])))\nexcept OSError:\n pass",
            b1["ip"],
            str(INNER_PORT),
        )
    assert log.read_text().split() == ["ready"]
    # root (slurmd, slurmstepd) reaches the pod from both nodes, and pings it
    for node in (n1, n2):
        assert _connect(node, b1["ip"], None) == "connected", node.name
        assert node.ns("ping", "-c", "1", "-W", "2", b1["ip"], check=False).returncode == 0
    # the pod still reaches the hosts, and their replies come back (established)
    assert ping(n1, b1, n2.ip) and ping(n1, b1, n1.ip)


def test_no_socket_emits_vxlan_kernel_tunnel_works(
    cluster: dict[str, Node], bob: dict[str, Any], workdir: Path
) -> None:
    n1, n2 = cluster["n1"], cluster["n2"]
    b1, b2 = bob["pods"]
    log = workdir / "vxlan-listen.log"
    _listen(n1, b1, log, PORT + 10, INNER_PORT + 10)
    frame = vxlan_frame(bob["vni"], b2["ip"], b1["ip"], INNER_PORT + 10).hex()
    arg = base64.b64encode(
        json.dumps({"hex": frame, "dst": n1.ip, "port": 4789, "n": 5}).encode()
    ).decode()
    # from n2's own (VTEP) address, by a user socket and by a root socket: refused
    sent_user = n2.ns(
        "setpriv",
        f"--reuid={USER}",
        f"--regid={USER}",
        "--clear-groups",
        "python3",
        "-c",
        FORGE,
        arg,
    ).stdout.strip()
    sent_root = n2.ns("python3", "-c", FORGE, arg).stdout.strip()
    # from alice's pod on n2 (not a VTEP address)
    a2 = cluster["n2"].call("job_get", job_id=7701)["pod"]
    n2.pod_exec(a2["netns"], "python3", "-c", FORGE, arg)
    # the kernel's tunnel: bob's pods still reach each other across nodes
    assert wait_for(lambda: ping(n2, b2, b1["ip"]), 10)
    assert (sent_user, sent_root) == ("0", "0")
    assert log.read_text().split() == ["ready"]


def test_host_links_carry_no_address_even_after_upgrade(
    cluster: dict[str, Node], bob: dict[str, Any]
) -> None:
    n1 = cluster["n1"]

    def podnet_addrs() -> list[str]:
        out = n1.ns("ip", "-o", "addr", "show").stdout.splitlines()
        return [ln for ln in out if ln.split()[1].startswith(("pnbr", "pnvx", "pnv"))]

    assert podnet_addrs() == []
    br = f"pnbr{bob['vni']}"
    assert "addrgenmode none" in n1.ns("ip", "-d", "link", "show", br).stdout
    # a bridge of an older podnetd: gateway address and fe80::; a restart scrubs both
    n1.ns("ip", "addr", "add", "169.254.0.1/32", "dev", br)
    n1.ns("ip", "link", "set", br, "addrgenmode", "eui64")
    n1.ns("ip", "addr", "add", "fe80::50:6eff:fe00:1/64", "dev", br)
    assert podnet_addrs()
    n1.stop()
    n1.start()
    assert podnet_addrs() == []
    b1, b2 = bob["pods"]
    assert wait_for(lambda: ping(n1, b1, b2["ip"]), 10)
    assert ping(n1, b1, n1.ip)


def test_host_users_resolve_to_uids_unknown_name_is_an_error() -> None:
    base = {
        "node": "x",
        "underlay_interface": "ul0",
        "underlay_ip": "203.0.113.9",
        "cluster": "t",
        "etcd_endpoints": ["http://127.0.0.1:2379"],
    }
    assert NodeConfig.from_dict(base, "f").host_uids == [0]
    c = NodeConfig.from_dict({**base, "host_users": ["root", 64030, "2001"]}, "f")
    assert c.host_uids == [0, 64030, 2001]
    with pytest.raises(ConfigError, match="unknown user 'no-such-user-pn'"):
        NodeConfig.from_dict({**base, "host_users": ["root", "no-such-user-pn"]}, "f")
    with pytest.raises(ConfigError, match="host_users"):
        NodeConfig.from_dict({**base, "host_users": []}, "f")
    with pytest.raises(ConfigError, match="unknown setting"):
        NodeConfig.from_dict({**base, "host_uids": [5]}, "f")
