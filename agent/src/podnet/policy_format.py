# Copyright (c) podnet developers
# SPDX-License-Identifier: Apache-2.0
"""The gateway policy format: validation and canonical form, one source for both readers.

`hpc.podnet.gateway_policy` stores the canonical form in etcd, and podnet-gatewayd and
`podnet publish` read it back (podnet.state.gwpolicy builds its nftables elements from it). The
collection reaches this file as plugins/module_utils/_gateway_policy.py, a symlink: the
module and the agent accept and refuse exactly the same inputs. Standard library only, and
Python 3.9 (the managed nodes' minimum).
"""

from __future__ import annotations

import ipaddress
import typing as t

PROTOS = ("tcp", "udp", "icmp", "any")
RULE_FIELDS = ("action", "cidr", "proto", "ports", "comment")


class PolicyError(ValueError):
    pass


def port_ranges(v: t.Any, where: str) -> list[tuple[int, int]]:
    """`ports` as sorted, distinct (low, high) ranges; [] for none (every port)."""
    if v is None or v == "":
        return []
    if isinstance(v, bool):
        raise PolicyError(f"{where}: 'ports' must be a string like '80,443,8000-8100'")
    if isinstance(v, int):
        v = str(v)
    if isinstance(v, list):
        v = ",".join(str(x) for x in v)
    if not isinstance(v, str):
        raise PolicyError(f"{where}: 'ports' must be a string like '80,443,8000-8100'")
    out = []
    for raw in v.split(","):
        part = raw.strip()
        lo_s, _sep, hi_s = part.partition("-")
        try:
            lo, hi = int(lo_s), int(hi_s or lo_s)
        except ValueError:
            raise PolicyError(f"{where}: bad port or range {part!r}") from None
        if not 0 <= lo <= hi <= 65535:
            raise PolicyError(f"{where}: port range {part!r} out of 0-65535")
        out.append((lo, hi))
    return sorted(set(out))


def range_text(lo: int, hi: int) -> str:
    """One port range as written in a policy and in nftables: `80` or `8000-8100`."""
    return str(lo) if lo == hi else f"{lo}-{hi}"


def port_text(ranges: t.Iterable[tuple[int, int]]) -> str:
    return ",".join(range_text(lo, hi) for lo, hi in ranges)


def canonical_rule(d: t.Any, where: str) -> dict[str, t.Any]:
    if not isinstance(d, dict):
        raise PolicyError(f"{where}: a rule must be a mapping")
    extra = sorted(set(d) - set(RULE_FIELDS))
    if extra:
        raise PolicyError(f"{where}: unknown rule field(s): {', '.join(extra)}")
    action = d.get("action", "allow")
    if action not in ("allow", "deny"):
        raise PolicyError(f"{where}: 'action' must be allow or deny, got {action!r}")
    try:
        cidr = str(ipaddress.IPv4Network(str(d.get("cidr", "0.0.0.0/0")), strict=False))
    except ValueError as e:
        raise PolicyError(f"{where}: 'cidr': {e}") from None
    proto = d.get("proto", "any")
    if proto not in PROTOS:
        raise PolicyError(f"{where}: 'proto' must be tcp, udp, icmp or any, got {proto!r}")
    ports = port_text(port_ranges(d.get("ports"), where))
    if ports and proto not in ("tcp", "udp"):
        raise PolicyError(f"{where}: 'ports' needs proto tcp or udp")
    out: dict[str, t.Any] = {"action": action, "cidr": cidr, "proto": proto}
    if ports:
        out["ports"] = ports
    if d.get("comment"):
        out["comment"] = str(d["comment"])
    return out


def canonical_policy(d: t.Any, where: str, user: bool = False) -> dict[str, t.Any]:
    """The policy as stored in etcd (defaults filled in, ports normalised)."""
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise PolicyError(f"{where}: a policy must be a mapping")
    allowed = {"egress", "publish"} | (set() if user else {"default"})
    extra = sorted(set(d) - allowed)
    if extra:
        raise PolicyError(f"{where}: unknown field(s): {', '.join(extra)}")
    out: dict[str, t.Any] = {}
    if not user:
        default = d.get("default", "deny")
        if default not in ("allow", "deny"):
            raise PolicyError(f"{where}: 'default' must be allow or deny")
        out["default"] = default
    rules = d.get("egress", [])
    if rules is None:
        rules = []
    if not isinstance(rules, list):
        raise PolicyError(f"{where}: 'egress' must be a list of rules")
    out["egress"] = [canonical_rule(r, f"{where}: egress[{i}]") for i, r in enumerate(rules)]
    pub = d.get("publish")
    if pub is not None:
        if not isinstance(pub, dict) or set(pub) - {"max"}:
            raise PolicyError(f"{where}: 'publish' must be {{max: N}}")
        m = pub.get("max")
        if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m <= 65535:
            raise PolicyError(f"{where}: 'publish.max' must be an integer 0-65535")
        out["publish"] = {"max": m}
    return out
