# SPDX-License-Identifier: Apache-2.0
"""What the gateway table is made of, read from etcd in one pass: pod addresses and their
users' VNIs, live publications (those whose job is gone are returned to be deleted), and
the compiled policies (each policy text parsed once)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from podnet.names import Keys
from podnet.policy_format import PolicyError
from podnet.state.etcdops import KV
from podnet.state.gwpolicy import Compiled, Policy, compile_policy, parse_policy
from podnet.state.store import Etcd

log = logging.getLogger("podnet.gateway")


@dataclass
class State:
    """What the table is made of (read from etcd in one pass)."""

    pod_vni: dict[str, int] = field(default_factory=dict)
    published: dict[int, tuple[str, int]] = field(default_factory=dict)
    compiled: Compiled = field(default_factory=lambda: compile_policy(Policy(), {}))


@dataclass
class Raw:
    """The etcd records the gateway table is made of."""

    ips: dict[str, dict[str, Any]] = field(default_factory=dict)
    user_vni: dict[str, int] = field(default_factory=dict)
    jobs: set[int] = field(default_factory=set)
    user_pol: dict[str, Any] = field(default_factory=dict)
    global_pol: Any = None
    pubs: list[KV] = field(default_factory=list)

    def add(self, rel: str, kv: KV) -> None:
        if rel.startswith("ips/"):
            d = kv.json()
            if isinstance(d, dict):
                self.ips[rel[4:]] = d
        elif rel.startswith("users/"):
            self.user_vni[rel[6:]] = int(kv.json()["vni"])
        elif rel.startswith("jobs/"):
            self.jobs.add(int(rel[5:]))
        elif rel == "gateway/policy/global":
            self.global_pol = kv.json()
        elif rel.startswith("gateway/policy/users/"):  # parsed once per text (_parse_cached)
            self.user_pol[rel[len("gateway/policy/users/") :]] = kv.value
        elif rel.startswith("gateway/published/"):
            self.pubs.append(kv)


def read_state(etcd: Etcd, keys: Keys) -> tuple[State, list[KV]]:
    """The table's inputs; also the publications whose job is gone (to delete)."""
    kvs, _rev = etcd.get_prefix(keys.root)
    raw = Raw()
    for kv in kvs:
        try:
            raw.add(kv.key[len(keys.root) :], kv)
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring unreadable %s", kv.key)
    return build_state(raw)


def build_state(raw: Raw) -> tuple[State, list[KV]]:
    st = State()
    for ip, d in raw.ips.items():
        vni = d.get("vni")
        if isinstance(vni, int) and vni > 0:
            st.pod_vni[ip] = vni
    st.compiled = compile_policy(*_policies(raw))
    stale: list[KV] = []
    for kv in raw.pubs:
        try:
            d = kv.json()
            ext = int(kv.key.rsplit("/", 1)[-1])
            job_id, ip, port = int(d["job_id"]), str(d["ip"]), int(d["port"])
        except (ValueError, KeyError, TypeError):
            stale.append(kv)
            continue
        # the job ended, or the address is another job's now: the publication is released
        if job_id not in raw.jobs or raw.ips.get(ip, {}).get("job_id") != job_id:
            stale.append(kv)
            continue
        st.published[ext] = (ip, port)
    return st, stale


#: parsed policies by their JSON text: a change re-parses only the policies that changed
_PARSED: dict[str, Policy] = {}


def _parse_cached(pol: Any, where: str, user: bool) -> Policy:
    """`pol`: the JSON text of a policy record (or the parsed value)."""
    key = f"{user}:{pol if isinstance(pol, str) else json.dumps(pol, sort_keys=True)}"
    p = _PARSED.get(key)
    if p is None:
        try:
            data = json.loads(pol) if isinstance(pol, str) else pol
        except ValueError:
            raise PolicyError(f"{where}: not JSON") from None
        p = parse_policy(data, where, user=user)
        if len(_PARSED) > 100000:
            _PARSED.clear()
        _PARSED[key] = p
    return p


def _policies(raw: Raw) -> tuple[Policy, dict[int, Policy]]:
    try:
        gp = _parse_cached(raw.global_pol, "gateway/policy/global", False)
    except PolicyError as e:
        log.error("%s: keeping default deny", e)
        gp = Policy()
    users: dict[int, Policy] = {}
    for user, pol in raw.user_pol.items():
        if user not in raw.user_vni:
            continue  # no network yet: nothing of theirs to match
        try:
            users[raw.user_vni[user]] = _parse_cached(pol, f"policy of {user}", True)
        except PolicyError as e:
            log.error("%s: the user gets the global policy only", e)
    return gp, users
