# SPDX-License-Identifier: Apache-2.0
"""`podnet status --cluster`: the whole cluster as etcd says it, from any node whose
configuration reaches etcd (root, podnetd's or the admin's credentials): every node's
podnetd (alive, version, address), each etcd endpoint (version, leader, database size), the
address pool's use, the users holding the most addresses, and the addresses held on nodes
whose podnetd is down (their overlay has no live endpoint there). What is wrong is listed
under `problems`; the command exits 1 when there is any."""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from podnet.config import ClusterConfig
from podnet.names import Keys, block_from_key
from podnet.state.etcdops import KV
from podnet.state.store import EtcdRequestError, EtcdUnavailable

__all__ = ["TOP_USERS", "Snapshot", "read", "report", "text"]

#: how many users `report` lists by addresses held
TOP_USERS = 5
#: pool use from which the pool counts as a problem
POOL_FULL = 0.9


class Reader(Protocol):
    def get_json(self, key: str) -> Any: ...

    def get_prefix(self, prefix: str, keys_only: bool = False) -> tuple[list[KV], int]: ...


@dataclass
class Snapshot:
    """What `report` reads: the records as etcd held them at one time, and each endpoint's
    status (or its error)."""

    config: dict[str, Any]
    nodes: dict[str, dict[str, Any]]
    alive: dict[str, dict[str, Any]]
    blocks: dict[str, str]  # block CIDR -> node
    ips: dict[str, dict[str, Any]]
    vni_users: dict[int, str]
    endpoints: dict[str, dict[str, Any]] = field(default_factory=dict)


def _records(etcd: Reader, prefix: str) -> dict[str, Any]:
    out = {}
    for kv in etcd.get_prefix(prefix)[0]:
        try:
            out[kv.key[len(prefix) :]] = kv.json()
        except ValueError:
            out[kv.key[len(prefix) :]] = {}
    return out


def read(
    etcd: Reader, keys: Keys, endpoints: list[str], status_of: Callable[[str], dict[str, Any]]
) -> Snapshot:
    """The records of the cluster `keys` names, and `status_of(endpoint)` for each etcd
    endpoint (an unreachable one gives {"error": ...})."""
    vnis = _records(etcd, keys.prefix("vnis"))
    eps: dict[str, dict[str, Any]] = {}
    for ep in endpoints:
        try:
            eps[ep] = status_of(ep)
        except (EtcdUnavailable, EtcdRequestError) as e:
            eps[ep] = {"error": str(e)}
    return Snapshot(
        config=etcd.get_json(keys.config) or {},
        nodes=_records(etcd, keys.prefix("nodes")),
        alive=_records(etcd, keys.prefix("alive")),
        blocks={
            block_from_key(k): str(v.get("node", "")) if isinstance(v, dict) else ""
            for k, v in _records(etcd, keys.prefix("blocks")).items()
        },
        ips=_records(etcd, keys.prefix("ips")),
        vni_users={
            int(k): str(v.get("user", "?"))
            for k, v in vnis.items()
            if k.isdigit() and isinstance(v, dict)
        },
        endpoints=eps,
    )


def report(s: Snapshot) -> dict[str, Any]:
    """The cluster's state and its problems (a list of sentences, empty when all is well)."""
    cc = ClusterConfig.from_dict(s.config, strict=False)
    nodes, newest, problems = _nodes(s)
    problems += _etcd_problems(s)
    pool_size = cc.pod_cidr.num_addresses
    used = len(s.ips)
    pool = {
        "cidr": str(cc.pod_cidr),
        "addresses": pool_size,
        "used": used,
        "blocks": len(s.blocks),
        "blocks_free": pool_size // 2 ** (32 - cc.block_prefix) - len(s.blocks),
    }
    if pool_size and used / pool_size >= POOL_FULL:
        problems.append(f"address pool {cc.pod_cidr}: {used} of {pool_size} addresses used")
    holders, orphaned = _holders(s, cc)
    for node, n in sorted(orphaned.items()):
        problems.append(
            f"node {node}: {n} pod addresses held while its podnetd is down (unreachable "
            "through the overlay; freed when the node comes back or is removed)"
        )
    return {
        "cluster_version": newest,
        "nodes": nodes,
        "etcd": [{"endpoint": ep, **st} for ep, st in sorted(s.endpoints.items())],
        "pool": pool,
        "top_users": [{"user": u, "addresses": n} for u, n in holders.most_common(TOP_USERS)],
        "problems": problems,
        "ok": not problems,
    }


def _nodes(s: Snapshot) -> tuple[list[dict[str, Any]], str | None, list[str]]:
    """Every node registered or alive, the newest podnetd version, and their problems."""
    problems: list[str] = []
    versions = {str(a.get("version", "?")) for a in s.alive.values()}
    newest = max(versions, key=_version_key) if versions else None
    rows = []
    for name in sorted(set(s.nodes) | set(s.alive)):
        reg, live = s.nodes.get(name), s.alive.get(name)
        row: dict[str, Any] = {
            "node": name,
            "alive": live is not None,
            "version": live.get("version") if live else None,
            "ip": (live or reg or {}).get("ip"),
            "roles": (reg or {}).get("roles", []),
        }
        rows.append(row)
        if live is None:
            problems.append(f"node {name}: podnetd is not running (no live record)")
            continue
        if reg is None:
            problems.append(f"node {name}: podnetd runs but the node is not registered")
        elif reg.get("ip") != live.get("ip"):
            problems.append(
                f"node {name}: podnetd runs on {live.get('ip')}, registered with {reg.get('ip')}"
            )
        if row["version"] != newest:
            problems.append(f"node {name}: podnetd {row['version']}, others run {newest}")
    return rows, newest, problems


def _etcd_problems(s: Snapshot) -> list[str]:
    problems = []
    leaders: set[str] = set()
    for ep, st in sorted(s.endpoints.items()):
        if "error" in st:
            problems.append(f"etcd {ep}: {st['error']}")
        elif str(st.get("leader") or "0") == "0":
            problems.append(f"etcd {ep}: no leader")
        else:
            leaders.add(str(st["leader"]))
    if len(leaders) > 1:
        problems.append(f"etcd: the endpoints name different leaders ({sorted(leaders)})")
    return problems


def _holders(s: Snapshot, cc: ClusterConfig) -> tuple[Counter[str], Counter[str]]:
    """Addresses held by user, and by node for the nodes whose podnetd is down."""
    holders: Counter[str] = Counter()
    orphaned: Counter[str] = Counter()
    for ip, rec in s.ips.items():
        if not isinstance(rec, dict):
            continue
        vni = rec.get("vni")
        user = rec.get("user") or (s.vni_users.get(vni, "?") if isinstance(vni, int) else "?")
        holders[str(user)] += 1
        node = str(rec.get("node", ""))
        if node and node not in s.alive and _in(ip, cc):
            orphaned[node] += 1
    return holders, orphaned


def _in(ip: str, cc: ClusterConfig) -> bool:
    try:
        return ipaddress.ip_address(ip) in cc.pod_cidr
    except ValueError:
        return False


def _version_key(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.split("."):
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits) if digits else -1)
    return tuple(parts)


def text(r: dict[str, Any]) -> str:
    alive = sum(1 for n in r["nodes"] if n["alive"])
    lines = [f"nodes: {alive} of {len(r['nodes'])} with podnetd running"]
    for n in r["nodes"]:
        state = f"podnetd {n['version']}" if n["alive"] else "podnetd DOWN"
        lines.append(f"  {n['node']:16} {n['ip'] or '?':16} {state:18} {','.join(n['roles'])}")
    lines.append("etcd:")
    for e in r["etcd"]:
        if "error" in e:
            lines.append(f"  {e['endpoint']:32} UNREACHABLE")
        else:
            lines.append(f"  {e['endpoint']:32} {e.get('version')} leader {e.get('leader')}")
    p = r["pool"]
    lines.append(
        f"address pool {p['cidr']}: {p['used']} of {p['addresses']} addresses used, "
        f"{p['blocks']} blocks taken, {p['blocks_free']} free"
    )
    if r["top_users"]:
        lines.append(
            "most addresses: " + ", ".join(f"{u['user']} {u['addresses']}" for u in r["top_users"])
        )
    if r["problems"]:
        lines.append(f"problems ({len(r['problems'])}):")
        lines += [f"  {x}" for x in r["problems"]]
    else:
        lines.append("problems: none")
    return "\n".join(lines)
