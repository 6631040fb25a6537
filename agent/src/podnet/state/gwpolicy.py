# SPDX-License-Identifier: Apache-2.0
"""Gateway policy: the format kept in etcd (validated by podnet.policy_format, the same file
the collection's gateway_policy module uses) and its compilation into nftables set elements
(docs/gateway.md).

etcd keys (under `/podnet/<cluster>/gateway/`, written by `hpc.podnet.gateway_policy`):

* `policy/global`: `{"default": "deny"|"allow", "egress": [RULE...], "publish": {"max": N}}`
* `policy/users/<user>`: `{"egress": [RULE...], "publish": {"max": N}}`

RULE: `{"action": "allow"|"deny", "cidr": "a.b.c.d/n", "proto": "tcp"|"udp"|"icmp"|"any",
"ports": "80,443,8000-8100"}` (`ports` only for tcp and udp; none: every port).

Evaluation of a packet a pod sends out (first match wins, every packet of the flow, so a
rule change applies to established flows too, and flows still allowed go on): the user's
deny rules, the user's allow rules, the global deny rules, the global allow rules, then
the global default. Each step is one lookup: the `pod ip -> VNI` map, the `VNI -> jump
u<vni>` verdict map, then interval sets keyed by `daddr . protocol . port` (the user's
own, the global ones): the cost per packet does not grow with users or rules, and a
change of one user's rules touches that user's two sets only.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from podnet.policy_format import canonical_policy, canonical_rule, port_ranges, range_text

PROTOS = {"tcp": 6, "udp": 17, "icmp": 1}
#: the most ports a user may publish when no policy says (global `publish.max` overrides)
DEFAULT_PUBLISH_MAX = 0


@dataclass(frozen=True)
class Rule:
    action: str
    cidr: str
    proto: str  # tcp | udp | icmp | any
    ports: tuple[tuple[int, int], ...]  # () = every port

    def elements(self) -> list[str]:
        """`daddr . proto . port` interval elements of this rule (nft syntax)."""
        proto = "0-255" if self.proto == "any" else str(PROTOS[self.proto])
        ports = self.ports or ((0, 65535),)
        return [f"{self.cidr} . {proto} . {range_text(lo, hi)}" for lo, hi in ports]


@dataclass
class Policy:
    default: str = "deny"
    egress: list[Rule] = field(default_factory=list)
    publish_max: int | None = None
    #: (deny, allow) elements, computed once (policies are parsed once per text: gateway)
    _sets: tuple[list[str], list[str]] | None = field(default=None, repr=False, compare=False)

    def sets(self) -> tuple[list[str], list[str]]:
        if self._sets is None:
            self._sets = compile_rules(self.egress)
        return self._sets


def _rule(c: dict[str, Any], where: str) -> Rule:
    return Rule(c["action"], c["cidr"], c["proto"], tuple(port_ranges(c.get("ports"), where)))


def parse_rule(d: Any, where: str) -> Rule:
    """One egress rule, validated by the policy format (podnet.policy_format)."""
    return _rule(canonical_rule(d, where), where)


def parse_policy(d: Any, where: str, user: bool = False) -> Policy:
    """A global (or, with `user`, a per-user) policy, validated by the policy format."""
    c = canonical_policy(d, where, user=user)
    return Policy(
        default=c.get("default", "deny"),
        egress=[_rule(r, f"{where}: egress[{i}]") for i, r in enumerate(c["egress"])],
        publish_max=c["publish"]["max"] if "publish" in c else None,
    )


def publish_max(global_p: Policy, user_p: Policy | None) -> int:
    """How many ports a user may publish: the user's policy, else the global one."""
    if user_p is not None and user_p.publish_max is not None:
        return user_p.publish_max
    if global_p.publish_max is not None:
        return global_p.publish_max
    return DEFAULT_PUBLISH_MAX


@dataclass
class Compiled:
    """Set elements of the gateway table (gateway.ruleset): global sets, and per user
    (VNI) that user's own deny and allow sets (`daddr . proto . port` intervals)."""

    default: str
    global_deny: list[str]
    global_allow: list[str]
    users: dict[int, tuple[list[str], list[str]]]  # vni -> (deny, allow)


def compile_rules(rules: list[Rule]) -> tuple[list[str], list[str]]:
    deny = sorted({e for r in rules if r.action == "deny" for e in r.elements()})
    allow = sorted({e for r in rules if r.action == "allow" for e in r.elements()})
    return deny, allow


def compile_policy(global_p: Policy, users: dict[int, Policy]) -> Compiled:
    """Elements for the global sets and each user's sets (keyed by VNI)."""
    gd, ga = global_p.sets()
    per_user = {vni: users[vni].sets() for vni in sorted(users)}
    return Compiled(global_p.default, gd, ga, {v: d for v, d in per_user.items() if d != ([], [])})


def evaluate(c: Compiled, vni: int, daddr: str, proto: int, port: int) -> str:
    """What the gateway does with one packet (a reference model of the nft chain, for
    tests): "allow" or "deny"."""

    def hit(elems: list[str]) -> bool:
        for e in elems:
            net, pr, pt = e.split(" . ")
            if ipaddress.IPv4Address(daddr) not in ipaddress.IPv4Network(net):
                continue
            lo, _sep, hi = pr.partition("-")
            if not int(lo) <= proto <= int(hi or lo):
                continue
            lo, _sep, hi = pt.partition("-")
            if int(lo) <= port <= int(hi or lo):
                return True
        return False

    udeny, uallow = c.users.get(vni, ([], []))
    if hit(udeny):
        return "deny"
    if hit(uallow):
        return "allow"
    if hit(c.global_deny):
        return "deny"
    if hit(c.global_allow):
        return "allow"
    return c.default
