# SPDX-License-Identifier: Apache-2.0
"""Published ports (`podnet publish`): records in etcd that the gateways turn into DNAT.

`gateway/published/<external port>` = `{"user", "uid", "job_id", "pod", "ip", "port"}`
(TCP). The external port is taken with a create-if-absent transaction, so two users never
get the same one. A user publishes only pods of their own jobs (podnetd checks the job's
owner against the caller's uid from SO_PEERCRED) and at most `publish.max` ports (the
gateway policy). The gateways drop a record when its job is gone.

`gateway/config` = `{"external_ip", "ports": "lo-hi"}` (written by hpc.podnet.gateway).
"""

from __future__ import annotations

import pwd
from dataclasses import dataclass
from typing import Any

from podnet.errors import PodnetError
from podnet.names import Keys, job_label
from podnet.policy_format import PolicyError
from podnet.state.gwpolicy import Policy, parse_policy, publish_max
from podnet.state.store import Etcd, cmp_absent, op_put


def _get_json(etcd: Etcd, key: str) -> Any:
    kv = etcd.get(key)
    return kv.json() if kv is not None else None


def gateway_config(etcd: Etcd, keys: Keys) -> tuple[str, int, int]:
    d = _get_json(etcd, keys.gateway_config)
    if not isinstance(d, dict) or "external_ip" not in d:
        raise PodnetError("EUNAVAIL", "this cluster has no gateway (hpc.podnet.gateway)")
    lo_s, _sep, hi_s = str(d.get("ports", "20000-20999")).partition("-")
    return str(d["external_ip"]), int(lo_s), int(hi_s or lo_s)


def policies(etcd: Etcd, keys: Keys, user: str) -> tuple[Policy, Policy | None]:
    try:
        g = parse_policy(_get_json(etcd, keys.gateway_policy()), "global policy")
        raw = _get_json(etcd, keys.gateway_policy(user))
        u = parse_policy(raw, f"policy of {user}", user=True) if raw is not None else None
    except (PolicyError, ValueError) as e:
        raise PodnetError("EUNAVAIL", f"gateway policy unreadable: {e}") from None
    return g, u


@dataclass
class Target:
    job_id: int
    pod: int
    ip: str
    user: str
    uid: int


def resolve(etcd: Etcd, keys: Keys, uid: int, root: bool, job: str, pod: int) -> Target:
    """The pod `job` (an id, or a job name of the caller's) / pod<n> names."""
    if job.isdigit():
        job_id = int(job)
    else:
        if root:
            raise PodnetError("EINVAL", "root must name the job by its id")
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            raise PodnetError("EINVAL", f"uid {uid} has no user name") from None
        owner = _get_json(etcd, keys.name(user, job_label(job)))
        if not isinstance(owner, dict) or "job_id" not in owner:
            raise PodnetError("ENOENT", f"you have no live job named {job!r}")
        job_id = int(owner["job_id"])
    d = _get_json(etcd, keys.job(job_id))
    if not isinstance(d, dict):
        raise PodnetError("ENOENT", f"job {job_id} has no pods")
    if not root and int(d["uid"]) != uid:
        raise PodnetError("EPERM", f"job {job_id} is not yours: you may publish only your own pods")
    ips = [str(x) for x in d.get("ips", [])]
    if not 0 <= pod < len(ips):
        raise PodnetError("EINVAL", f"job {job_id} has pods 0..{len(ips) - 1}, not pod{pod}")
    return Target(job_id, pod, ips[pod], str(d["user"]), int(d["uid"]))


def list_published(etcd: Etcd, keys: Keys, uid: int | None) -> list[dict[str, Any]]:
    kvs, _rev = etcd.get_prefix(keys.published())
    out = []
    for kv in kvs:
        try:
            d = kv.json()
            d["external_port"] = int(kv.key.rsplit("/", 1)[-1])
        except (ValueError, TypeError):
            continue
        if uid is None or d.get("uid") == uid:
            out.append(d)
    return sorted(out, key=lambda d: d["external_port"])


def publish(
    etcd: Etcd, keys: Keys, uid: int, root: bool, job: str, pod: int, port: int
) -> dict[str, Any]:
    t = resolve(etcd, keys, uid, root, job, pod)
    ext_ip, lo, hi = gateway_config(etcd, keys)
    mine = list_published(etcd, keys, t.uid)
    for d in mine:  # idempotent: the same pod and port again returns the same address
        if d.get("job_id") == t.job_id and d.get("pod") == t.pod and d.get("port") == port:
            return {**d, "address": f"{ext_ip}:{d['external_port']}"}
    g, u = policies(etcd, keys, t.user)
    limit = publish_max(g, u)
    if len(mine) >= limit:
        raise PodnetError(
            "EPERM",
            f"{t.user} may publish {limit} port(s) (gateway policy) and has {len(mine)}",
        )
    taken = {d["external_port"] for d in list_published(etcd, keys, None)}
    candidates = ([port] if lo <= port <= hi else []) + list(range(lo, hi + 1))
    rec = {"user": t.user, "uid": t.uid, "job_id": t.job_id, "pod": t.pod, "ip": t.ip, "port": port}
    for ext in candidates:
        if ext in taken:
            continue
        key = keys.published(ext)
        if etcd.txn([cmp_absent(key)], [op_put(key, rec)]).succeeded:
            return {**rec, "external_port": ext, "address": f"{ext_ip}:{ext}"}
        taken.add(ext)
    raise PodnetError("EUNAVAIL", f"no free gateway port in {lo}-{hi}")


def unpublish(etcd: Etcd, keys: Keys, uid: int, root: bool, job: str, pod: int, port: int) -> int:
    t = resolve(etcd, keys, uid, root, job, pod)
    n = 0
    for d in list_published(etcd, keys, t.uid):
        if d.get("job_id") == t.job_id and d.get("pod") == t.pod and d.get("port") == port:
            n += etcd.delete(keys.published(d["external_port"]))
    return n
