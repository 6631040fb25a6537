# SPDX-License-Identifier: Apache-2.0
"""Published ports (`podnet publish`): records in etcd that the gateways turn into DNAT.

`gateway/published/<external port>` = `{"user", "uid", "job_id", "pod", "ip", "port"}`
(TCP). The external port is taken with a create-if-absent transaction, so two users never
get the same one. A user publishes only pods of their own jobs (podnetd checks the job's
owner against the caller's uid from SO_PEERCRED) and at most `publish.max` ports (the
gateway policy): the same transaction takes one of the user's `published` quota slots
(state/quota.py), so two requests at once never pass the limit together. The gateways
drop a record when its job is gone (its slot is then stale, and reclaimed).

`gateway/config` = `{"external_ip", "ports": "lo-hi"}` (written by hpc.podnet.gateway).
"""

from __future__ import annotations

import pwd
from dataclasses import dataclass
from typing import Any

from podnet.errors import PodnetError
from podnet.names import Keys, job_label
from podnet.policy_format import PolicyError
from podnet.state.alloc.common import Job, JobPod
from podnet.state.etcdops import cmp_absent, cmp_value, op_delete, op_get, op_put
from podnet.state.gwpolicy import Policy, parse_policy, publish_max
from podnet.state.quota import Slots, slots_of
from podnet.state.store import Etcd

#: transactions per port before giving up on it (each loses only to another request)
MAX_ATTEMPTS = 20


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
    # the job's record and its pods (each node's marker: its pod's index and address)
    r = etcd.txn([], [op_get(keys.job(job_id)), op_get(keys.prefix(f"jobnodes/{job_id}"), True)])
    records = r.range_kvs(0)
    try:
        rec = Job.from_json(records[0].json(), records[0].mod_revision) if records else None
    except (ValueError, KeyError, TypeError):
        rec = None
    if rec is None:
        raise PodnetError("ENOENT", f"job {job_id} has no pods")
    if not root and rec.uid != uid:
        raise PodnetError("EPERM", f"job {job_id} is not yours: you may publish only your own pods")
    pods = {}
    for kv in r.range_kvs(1):
        p = JobPod.of_marker(rec, kv.key.rsplit("/", 1)[-1], kv.value)
        if p is not None:
            pods[p.index] = p.ip
    if not 0 <= pod < rec.size:
        raise PodnetError("EINVAL", f"job {job_id} has pods 0..{rec.size - 1}, not pod{pod}")
    if pod not in pods:
        raise PodnetError("ENOENT", f"pod{pod} of job {job_id} is not up")
    return Target(job_id, pod, pods[pod], rec.user, rec.uid)


def list_published(etcd: Etcd, keys: Keys, uid: int | None) -> list[dict[str, Any]]:
    kvs, _rev = etcd.get_prefix(keys.published())
    out = []
    for kv in kvs:
        try:
            d = kv.json()
            d["external_port"] = int(kv.key.rsplit("/", 1)[-1])
            d.pop("slots", None)  # the quota's bookkeeping (state/quota.py)
        except (ValueError, TypeError):
            continue
        if uid is None or d.get("uid") == uid:
            out.append(d)
    return sorted(out, key=lambda d: d["external_port"])


def limit_of(etcd: Etcd, keys: Keys, user: str) -> int:
    """How many ports `user` may publish (the gateway policy's `publish.max`)."""
    g, u = policies(etcd, keys, user)
    return publish_max(g, u)


def publish(
    etcd: Etcd, keys: Keys, uid: int, root: bool, job: str, pod: int, port: int
) -> dict[str, Any]:
    t = resolve(etcd, keys, uid, root, job, pod)
    ext_ip, lo, hi = gateway_config(etcd, keys)
    for d in list_published(etcd, keys, t.uid):  # idempotent: the same pod and port again
        if d.get("job_id") == t.job_id and d.get("pod") == t.pod and d.get("port") == port:
            return {**d, "address": f"{ext_ip}:{d['external_port']}"}
    limit = limit_of(etcd, keys, t.user)
    slots = Slots(etcd, keys)
    taken = {d["external_port"] for d in list_published(etcd, keys, None)}
    candidates = ([port] if lo <= port <= hi else []) + list(range(lo, hi + 1))
    rec = {"user": t.user, "uid": t.uid, "job_id": t.job_id, "pod": t.pod, "ip": t.ip, "port": port}
    for ext in candidates:
        if ext in taken:
            continue
        key = keys.published(ext)
        # the port and one of the user's quota slots in one transaction (state/quota.py):
        # it fails when another request took the port (next port) or the slot (again)
        for _attempt in range(MAX_ATTEMPTS):
            claim = slots.claim(t.user, {"published": limit}, key)
            r = etcd.txn(
                [cmp_absent(key), *claim.compare],
                [op_put(key, {**rec, "slots": claim.slots}), *claim.ops],
                [op_get(key)],
            )
            if r.succeeded:
                return {**rec, "external_port": ext, "address": f"{ext_ip}:{ext}"}
            if r.range_kvs(0):
                break
        taken.add(ext)
    raise PodnetError("EUNAVAIL", f"no free gateway port in {lo}-{hi}")


def unpublish(etcd: Etcd, keys: Keys, uid: int, root: bool, job: str, pod: int, port: int) -> int:
    t = resolve(etcd, keys, uid, root, job, pod)
    slots = Slots(etcd, keys)
    n = 0
    for d in list_published(etcd, keys, t.uid):
        if d.get("job_id") == t.job_id and d.get("pod") == t.pod and d.get("port") == port:
            key = keys.published(d["external_port"])
            kv = etcd.get(key)
            if kv is None:
                continue
            # the record and its quota slot go together (only while the record is this one)
            r = etcd.txn(
                [cmp_value(key, kv.value)],
                [op_delete(key), *slots.release_ops(t.user, slots_of(kv.json()))],
            )
            n += int(r.succeeded)
    return n
