# SPDX-License-Identifier: Apache-2.0
"""The gateway table `inet podnet_gw` as nft commands: the whole table (`ruleset`) or the
change from one state to the next (`update`), each applied in one atomic transaction
(`apply`, libnftables)."""

from __future__ import annotations

from podnet.gateway.state import State

try:
    import nftables
except ImportError:  # pragma: no cover - python3-nftables is a dependency on gateways
    nftables = None

TABLE = "podnet_gw"


def _elems(items: list[str]) -> str:
    return f"elements = {{ {', '.join(items)} }}; " if items else ""


KEY = "ip daddr . meta l4proto . th dport"


def _user_objects(vni: int, deny: list[str], allow: list[str]) -> str:
    """A user's two sets, their chain and the verdict map element (nft commands)."""
    t = f"inet {TABLE}"
    return (
        f"add set {t} u{vni}_deny {{ typeof {KEY}; flags interval; {_elems(deny)}}}\n"
        f"add set {t} u{vni}_allow {{ typeof {KEY}; flags interval; {_elems(allow)}}}\n"
        f"add chain {t} u{vni}\n"
        f"add rule {t} u{vni} {KEY} @u{vni}_deny counter drop\n"
        f"add rule {t} u{vni} {KEY} @u{vni}_allow counter goto allowed\n"
        f"add element {t} user_chain {{ {vni} : jump u{vni} }}\n"
    )


def _user_delete(vni: int) -> str:
    t = f"inet {TABLE}"
    return (
        f"delete element {t} user_chain {{ {vni} }}\n"
        f"delete chain {t} u{vni}\n"
        f"delete set {t} u{vni}_deny\n"
        f"delete set {t} u{vni}_allow\n"
    )


def _set_elems(name: str, old: list[str], new: list[str]) -> str:
    """Commands that turn set `name` from `old` into `new` (flush + add: intervals)."""
    if old == new:
        return ""
    t = f"inet {TABLE}"
    cmd = f"flush set {t} {name}\n"
    if new:
        cmd += f"add element {t} {name} {{ {', '.join(new)} }}\n"
    return cmd


def _map_diff(name: str, old: dict[str, str], new: dict[str, str]) -> str:
    t = f"inet {TABLE}"
    gone = [k for k in old if k not in new or old[k] != new[k]]
    came = [f"{k} : {v}" for k, v in new.items() if k not in old or old[k] != v]
    cmd = ""
    if gone:
        cmd += f"delete element {t} {name} {{ {', '.join(gone)} }}\n"
    if came:
        cmd += f"add element {t} {name} {{ {', '.join(came)} }}\n"
    return cmd


def _pods(st: State) -> dict[str, str]:
    return {ip: str(vni) for ip, vni in st.pod_vni.items()}


def _pubs(st: State) -> dict[str, str]:
    return {str(p): f"{ip} . {port}" for p, (ip, port) in st.published.items()}


def generation(st: State) -> int:
    """The policy generation of `st`: a 32-bit digest of everything the egress verdict of
    a flow depends on (the policy sets, the default and which user each pod address is),
    never 0 (the conntrack mark of a flow no policy accepted yet). Python's hash (0.1 ms
    at 1000 users x 10 rules, against 3.5 ms for a digest of the text): keyed per
    process, so a restarted podnet-gatewayd or the other gateway has other generations
    and every flow meets the policy once more there, then is marked again."""
    c = st.compiled
    key = (
        c.default,
        tuple(c.global_deny),
        tuple(c.global_allow),
        tuple((vni, tuple(deny), tuple(allow)) for vni, (deny, allow) in c.users.items()),
        tuple(st.pod_vni.items()),
    )
    return hash(key) & 0xFFFFFFFF or 1


def _generation_cmds(gen: int) -> str:
    """The generation in its two places: the set the forward chain's first check looks
    in, and the mark the `allowed` chain gives the flows the policy accepts."""
    t = f"inet {TABLE}"
    return (
        f"flush set {t} generation\n"
        f"add element {t} generation {{ {gen:#x} }}\n"
        f"flush chain {t} allowed\n"
        f"add rule {t} allowed meta l4proto {{ tcp, udp }} ct mark set {gen:#x}\n"
        f"add rule {t} allowed accept\n"
    )


def update(old: State, new: State) -> str | None:
    """nft commands (one transaction) from the table of `old` to that of `new`, or None
    when only a full replace will do (the default verdict changed)."""
    oc, nc = old.compiled, new.compiled
    if oc.default != nc.default:
        return None
    cmd = _map_diff("pod_user", _pods(old), _pods(new))
    cmd += _map_diff("published", _pubs(old), _pubs(new))
    cmd += _set_elems("global_deny", oc.global_deny, nc.global_deny)
    cmd += _set_elems("global_allow", oc.global_allow, nc.global_allow)
    for vni in sorted(set(oc.users) | set(nc.users)):
        if vni not in nc.users:
            cmd += _user_delete(vni)
        elif vni not in oc.users:
            cmd += _user_objects(vni, *nc.users[vni])
        else:
            (od, oa), (nd, na) = oc.users[vni], nc.users[vni]
            cmd += _set_elems(f"u{vni}_deny", od, nd) + _set_elems(f"u{vni}_allow", oa, na)
    if cmd and (gen := generation(new)) != generation(old):  # nothing changed: no hashing
        cmd += _generation_cmds(gen)
    return cmd


def ruleset(pod_cidr: str, ext_if: str, ext_ip: str, st: State) -> str:
    """The whole gateway table (nft syntax), for an atomic replace (start, resync)."""
    c = st.compiled
    pods = [f"{ip} : {vni}" for ip, vni in sorted(st.pod_vni.items())]
    pub = [f"{p} : {ip} . {port}" for p, (ip, port) in sorted(st.published.items())]
    default = "goto allowed" if c.default == "allow" else "drop"
    gen = generation(st)
    users = "".join(_user_objects(vni, *sets) for vni, sets in sorted(c.users.items()))
    return f"""
add table inet {TABLE}
delete table inet {TABLE}
table inet {TABLE} {{
    map pod_user {{ type ipv4_addr : mark; {_elems(pods)}}}
    map user_chain {{ type mark : verdict; }}
    set global_deny {{ typeof {KEY}; flags interval; {_elems(c.global_deny)}}}
    set global_allow {{ typeof {KEY}; flags interval; {_elems(c.global_allow)}}}
    map published {{ typeof tcp dport : ip daddr . tcp dport; {_elems(pub)}}}
    set generation {{ type mark; elements = {{ {gen:#x} }}; }}
    chain prerouting {{
        type nat hook prerouting priority dstnat; policy accept;
        iifname "{ext_if}" ip daddr {ext_ip} dnat ip to tcp dport map @published
    }}
    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        oifname "{ext_if}" ip saddr {pod_cidr} snat ip to {ext_ip}
    }}
    chain forward {{
        type filter hook forward priority filter; policy accept;
        ip saddr {pod_cidr} ip daddr {pod_cidr} counter drop comment "hairpin"
        ct state established ct mark @generation accept \
comment "a flow the policy of this generation accepted (chain allowed)"
        iifname "{ext_if}" ip daddr {pod_cidr} ct status dnat ct direction original accept
        iifname "{ext_if}" ip daddr {pod_cidr} ct state established,related \
ct direction reply accept
        iifname "{ext_if}" counter drop comment "nothing unpublished from outside"
        oifname "{ext_if}" ip saddr {pod_cidr} ct status dnat ct direction reply accept
        oifname "{ext_if}" ip saddr {pod_cidr} goto egress
        oifname "{ext_if}" counter drop comment "only pods leave through the gateway"
    }}
    chain egress {{
        meta mark set ip saddr map @pod_user
        meta mark 0 counter drop comment "not a known pod"
        meta mark vmap @user_chain
        {KEY} @global_deny counter drop
        {KEY} @global_allow counter goto allowed
        counter {default} comment "default"
    }}
    chain allowed {{
        meta l4proto {{ tcp, udp }} ct mark set {gen:#x}
        accept
    }}
}}
{users}"""


def apply(text: str) -> None:
    """Run nft commands in one transaction; RuntimeError with nft's message if refused."""
    if nftables is None:
        raise RuntimeError("python3-nftables (libnftables) is not installed")
    nft = nftables.Nftables()
    rc, _out, err = nft.cmd(text)
    if rc != 0:
        raise RuntimeError(f"nft: {str(err).strip()}")
