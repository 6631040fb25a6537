# SPDX-License-Identifier: Apache-2.0
"""hpc.podnet.gateway_policy as real Ansible against the real 3-member etcd (TLS):
validation, idempotence, check and diff mode, per-user keys removed when exclusive."""

from __future__ import annotations

import json
from typing import Any

GLOBAL = {
    "default": "deny",
    "egress": [
        {"action": "allow", "cidr": "203.0.113.0/24", "proto": "tcp", "ports": "8000-8099"},
        {"action": "deny", "cidr": "203.0.113.7", "proto": "tcp", "ports": [8081, 8080]},
    ],
    "publish": {"max": 2},
}
USERS = {"alice": {"egress": [{"cidr": "203.0.113.0/24", "proto": "tcp", "ports": 9000}]}}
BASE = "/podnet/itgw/gateway/policy/"


def kargs(cluster: Any, **kw: Any) -> dict[str, Any]:
    return {"endpoints": cluster.endpoints(), **cluster.tls_args(), "cluster": "itgw", **kw}


def stored(cluster: Any, run_module: Any, name: str) -> Any:
    got = run_module(
        "etcd_key_info",
        {"endpoints": cluster.endpoints(), **cluster.tls_args(), "key": BASE + name},
    )
    return got["json"]


def test_policy_check_diff_idempotent_exclusive(etcd_cluster: Any, run_module: Any) -> None:
    args = kargs(etcd_cluster, global_policy=GLOBAL, user_policies=USERS)
    # check mode with diff: reports both keys, writes nothing
    res = run_module("gateway_policy", args, check=True, diff=True)
    assert res["changed"] is True, res
    assert res["changed_keys"] == [BASE + "global", BASE + "users/alice"]
    assert '"ports": "9000"' in res["diff"]["after"]
    assert res["diff"]["before"] == ""
    assert stored(etcd_cluster, run_module, "global") is None

    res = run_module("gateway_policy", args, diff=True)
    assert res["changed"] is True
    g = stored(etcd_cluster, run_module, "global")
    # canonical form: addresses as networks, ports normalised and sorted
    assert g["egress"][1] == {
        "action": "deny",
        "cidr": "203.0.113.7/32",
        "proto": "tcp",
        "ports": "8080,8081",
    }
    assert stored(etcd_cluster, run_module, "users/alice")["egress"][0]["action"] == "allow"

    res = run_module("gateway_policy", args, diff=True)
    assert res["changed"] is False, res
    assert res["changed_keys"] == []

    # a user's rule changes: only that key, the diff shows before and after
    users = {
        "alice": {"egress": [{"proto": "tcp", "ports": "9001"}]},
        "bob": {"publish": {"max": 1}},
    }
    res = run_module(
        "gateway_policy", kargs(etcd_cluster, global_policy=GLOBAL, user_policies=users), diff=True
    )
    assert res["changed_keys"] == [BASE + "users/alice", BASE + "users/bob"]
    assert '"9000"' in res["diff"]["before"] and '"9001"' in res["diff"]["after"]

    # exclusive (default): bob's policy goes when he is no longer listed; check mode first
    res = run_module(
        "gateway_policy",
        kargs(etcd_cluster, global_policy=GLOBAL, user_policies={"alice": users["alice"]}),
        check=True,
    )
    assert res["changed_keys"] == [BASE + "users/bob"]
    assert stored(etcd_cluster, run_module, "users/bob") == {"egress": [], "publish": {"max": 1}}
    res = run_module(
        "gateway_policy",
        kargs(etcd_cluster, global_policy=GLOBAL, user_policies={"alice": users["alice"]}),
    )
    assert res["changed"] is True
    assert stored(etcd_cluster, run_module, "users/bob") is None
    # exclusive=false keeps unlisted users
    res = run_module("gateway_policy", kargs(etcd_cluster, global_policy=GLOBAL, exclusive=False))
    assert res["changed"] is False


def test_invalid_policy_fails_and_writes_nothing(etcd_cluster: Any, run_module: Any) -> None:
    bad = {"egress": [{"action": "allow", "proto": "icmp", "ports": "80"}]}
    res = run_module(
        "gateway_policy", kargs(etcd_cluster, global_policy=bad, user_policies={}, exclusive=False)
    )
    assert res.get("failed") is True, res
    assert "'ports' needs proto tcp or udp" in res["msg"]
    res = run_module(
        "gateway_policy",
        kargs(etcd_cluster, user_policies={"carol": {"default": "allow"}}, exclusive=False),
    )
    assert res.get("failed") is True and "unknown field" in res["msg"], res
    assert json.dumps(stored(etcd_cluster, run_module, "users/carol")) == "null"
