# SPDX-License-Identifier: Apache-2.0
"""`podnet verify`'s endpoints and what the cluster promises between them: `Endpoint`,
the `Model` read from etcd (host CIDRs, gateways, the users' gateway policy) and `expect`,
the expected reachability of each pair (docs/admin-guide.md "podnet verify")."""

from __future__ import annotations

import ipaddress
import subprocess
from dataclasses import dataclass, field
from typing import Any

from podnet.config import ClusterConfig, NodeConfig
from podnet.names import Keys
from podnet.state.gwpolicy import PROTOS, Policy, compile_policy, evaluate, parse_policy
from podnet.state.store import Etcd

PROTOCOLS = ("tcp", "udp", "icmp")
POD_KINDS = ("job", "login", "ctr")


# -- endpoints and what they should reach ---------------------------------------------------


@dataclass
class Endpoint:
    name: str  # "alice/job@c1"
    kind: str  # job | login | ctr | host | ext
    user: str = ""
    uid: int = -1
    node: str = ""
    ip: str = ""
    tcp: int = 0
    udp: int = 0
    proc: subprocess.Popen[str] | None = field(default=None, repr=False)
    err: list[str] = field(default_factory=list, repr=False)


@dataclass
class Model:
    """What the cluster promises, for `expect`."""

    host_cidrs: list[ipaddress.IPv4Network]
    egress: bool  # the cluster has gateways (pods have a way out)
    policy: Any = None  # gwpolicy.Compiled of the probed users
    vnis: dict[str, int] = field(default_factory=dict)


def _egress(m: Model, src: Endpoint, dst: Endpoint, proto: str) -> bool:
    """A pod to the outside: what the gateway policy says for that user, address,
    protocol and port (no gateways: no way out)."""
    if not m.egress or m.policy is None or src.user not in m.vnis:
        return False
    port = {"tcp": dst.tcp, "udp": dst.udp, "icmp": 0}[proto]
    return evaluate(m.policy, m.vnis[src.user], dst.ip, PROTOS[proto], port) == "allow"


def expect(m: Model, src: Endpoint, dst: Endpoint, proto: str) -> bool | None:
    """Reachable (True), blocked (False) or not podnet's to say (None: not probed)."""
    s = "pod" if src.kind in POD_KINDS else src.kind
    d = "pod" if dst.kind in POD_KINDS else dst.kind
    rules: dict[tuple[str, str], bool | None] = {
        # a user's pods reach each other and nobody else's
        ("pod", "pod"): src.user == dst.user,
        # a user's host-side socket reaches no pod; nothing unpublished from outside
        ("host", "pod"): False,
        ("ext", "pod"): False,
        # pods reach the cluster's hosts (host_cidrs); the host network reaches itself
        ("pod", "host"): any(ipaddress.IPv4Address(dst.ip) in n for n in m.host_cidrs),
        ("host", "host"): True,
        # host <-> outside: the site's network, not podnet's
        ("host", "ext"): None,
        ("ext", "host"): None,
    }
    if src is dst:
        return True
    if (s, d) == ("pod", "ext"):
        return _egress(m, src, dst, proto)
    return rules.get((s, d))


def load_model(cfg: NodeConfig, users: list[str]) -> Model:
    keys = Keys(cfg.cluster)
    etcd = Etcd.of_node(cfg)
    cc = ClusterConfig.from_dict(etcd.get_json(keys.config), strict=False)
    m = Model(list(cc.host_cidrs), bool(cc.egress_gateway))
    if not m.egress:
        return m
    gp = etcd.get_json(keys.gateway_policy())
    global_p = parse_policy(gp, "global policy") if gp is not None else Policy()
    per_user: dict[int, Policy] = {}
    for user in users:
        rec = etcd.get_json(keys.user(user))
        if rec is None:
            continue  # no VNI yet: it gets one with its first pod (reload after start)
        m.vnis[user] = int(rec["vni"])
        up = etcd.get_json(keys.gateway_policy(user))
        if up is not None:
            per_user[m.vnis[user]] = parse_policy(up, f"policy of {user}", user=True)
    m.policy = compile_policy(global_p, per_user)
    return m
