# SPDX-License-Identifier: Apache-2.0
"""hpc.podnet.etcd_auth as real Ansible against a real 3-member TLS etcd (3.5 when available).

The tests run in order on one cluster (module-scoped fixture): roles and users in check
mode, applied with a diff, idempotent; permissions changed and revoked; authentication
turned on (refused without root); then what certificates can do over gRPC (etcdctl, the
common name is the etcd user), what the JSON gateway needs (a login), a deleted user
refused and restored; authentication off again.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest

ETCDCTL = os.environ.get("PODNET_TEST_ETCDCTL", "/usr/bin/etcdctl")

ROOT_PW = "it-root-secret"
CLUSTER = "it"

ROLES = [
    {"name": "podnet-dns-read", "permissions": [{"key": "/skydns/", "prefix": True}]},
    {
        "name": "podnet-node",
        "permissions": [
            {"key": f"/podnet/{CLUSTER}/", "prefix": True, "type": "readwrite"},
            {"key": "/skydns/", "prefix": True, "type": "readwrite"},
        ],
    },
]
USERS = [
    {"name": "root", "roles": ["root"], "password": ROOT_PW},
    {"name": "admin", "roles": ["root"]},
    {"name": "coredns", "roles": ["podnet-dns-read"]},
    {"name": "podnetd-n1", "roles": ["podnet-node"]},
    {"name": "podnetd-n2", "roles": ["podnet-node"]},
]


def kargs(cluster: Any, **kw: Any) -> dict[str, Any]:
    return {"endpoints": cluster.endpoints(), **cluster.tls_args(), **kw}


def login(cluster: Any, **kw: Any) -> dict[str, Any]:
    """root's login through the JSON gateway, with the certificate without a common name
    (etcd's gateway answers HTTP 400 to any other once authentication is on)."""
    return {
        **kargs(cluster),
        "client_cert": str(cluster.pki["gateway_cert"]),
        "client_key": str(cluster.pki["gateway_key"]),
        "login_user": "root",
        "login_password": ROOT_PW,
        **kw,
    }


def etcdctl(cluster: Any, cert: str, *args: str) -> subprocess.CompletedProcess[str]:
    """etcdctl (gRPC: etcd takes the user from the certificate's common name)."""
    if not os.access(ETCDCTL, os.X_OK):
        pytest.skip(f"{ETCDCTL} not installed")
    pki = cluster.pki
    cmd = [
        ETCDCTL,
        f"--endpoints={cluster.endpoints()[0]}",
        f"--cacert={pki['ca']}",
        f"--cert={pki[cert + '_cert']}",
        f"--key={pki[cert + '_key']}",
        "--command-timeout=5s",
        *args,
    ]
    env = {**os.environ, "ETCDCTL_API": "3"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=env, check=False)


def roles_in_etcd(cluster: Any) -> list[str]:
    return sorted(cluster.call("m1", "auth/role/list", {}).get("roles") or [])


def test_check_mode_then_apply_with_diff_then_idempotent(
    etcd_cluster: Any, run_module: Any
) -> None:
    args = kargs(etcd_cluster, roles=ROLES, users=USERS)
    res = run_module("etcd_auth", args, check=True, diff=True)
    assert res["changed"] is True, res
    assert "add role podnet-dns-read" in res["actions"]
    assert "grant podnet-dns-read read /skydns/ (prefix)" in res["actions"]
    assert "grant role podnet-node to podnetd-n1" in res["actions"]
    assert res["diff"]["before"] != res["diff"]["after"]
    assert roles_in_etcd(etcd_cluster) == [], "check mode must not create roles"

    res = run_module("etcd_auth", args, diff=True)
    assert res["changed"] is True, res
    assert '"podnetd-n1"' in res["diff"]["after"] and '"podnetd-n1"' not in res["diff"]["before"]
    assert res["users"]["coredns"] == {"roles": ["podnet-dns-read"]}
    assert res["roles"]["podnet-dns-read"] == [
        {"type": "read", "key": "/skydns/", "range_end": "/skydns0", "prefix": True}
    ]
    assert roles_in_etcd(etcd_cluster) == ["podnet-dns-read", "podnet-node"]

    again = run_module("etcd_auth", args, diff=True)
    assert again["changed"] is False, again
    assert again["actions"] == []
    assert again["diff"]["before"] == again["diff"]["after"]
    assert run_module("etcd_auth", args, check=True)["changed"] is False


def test_permissions_are_exact_and_changes_are_minimal(etcd_cluster: Any, run_module: Any) -> None:
    extra = [
        {
            "name": "podnet-dns-read",
            "permissions": [
                {"key": "/skydns/", "prefix": True, "type": "readwrite"},
                {"key": "/single"},
            ],
        }
    ]
    res = run_module("etcd_auth", kargs(etcd_cluster, roles=extra))
    assert res["changed"] is True
    assert res["actions"] == [
        "grant podnet-dns-read read /single",
        "grant podnet-dns-read readwrite /skydns/ (prefix)",
    ]
    # back to the declared set: the extra key is revoked, the type goes back to read
    res = run_module("etcd_auth", kargs(etcd_cluster, roles=ROLES[:1]))
    assert res["actions"] == [
        "revoke podnet-dns-read read /single",
        "grant podnet-dns-read read /skydns/ (prefix)",
    ]
    res = run_module("etcd_auth", kargs(etcd_cluster, roles=ROLES, users=USERS))
    assert res["changed"] is False


def test_user_roles_exact_and_unknown_role_refused(etcd_cluster: Any, run_module: Any) -> None:
    res = run_module(
        "etcd_auth", kargs(etcd_cluster, users=[{"name": "coredns", "roles": ["nope"]}])
    )
    assert res.get("failed") is True
    assert "nope" in res["msg"]
    res = run_module(
        "etcd_auth",
        kargs(etcd_cluster, users=[{"name": "coredns", "roles": ["podnet-node"]}]),
    )
    assert res["actions"] == [
        "revoke role podnet-dns-read from coredns",
        "grant role podnet-node to coredns",
    ]
    assert run_module("etcd_auth", kargs(etcd_cluster, roles=ROLES, users=USERS))["changed"] is True
    res = run_module("etcd_auth", kargs(etcd_cluster, roles=[{"name": "root"}]))
    assert res.get("failed") is True and "built in" in res["msg"]


def test_enable_needs_root_check_mode_and_idempotence(etcd_cluster: Any, run_module: Any) -> None:
    without_root = [u for u in USERS if u["name"] != "root"]
    res = run_module(
        "etcd_auth", kargs(etcd_cluster, users=[{"name": "root", "state": "absent"}]), check=True
    )
    assert res["changed"] is True  # root exists; check mode only
    # a fresh name set without root: enabling is refused before anything is sent
    res = run_module(
        "etcd_auth",
        kargs(
            etcd_cluster, users=[*without_root, {"name": "root", "state": "absent"}], enabled=True
        ),
        check=True,
    )
    assert res.get("failed") is True and "root" in res["msg"], res

    res = run_module("etcd_auth", kargs(etcd_cluster, enabled=True), check=True, diff=True)
    assert res["changed"] is True and res["actions"] == ["enable authentication"]
    assert res["enabled"] is True
    assert etcd_cluster.call("m1", "auth/status", {}).get("enabled") in (None, False)

    res = run_module("etcd_auth", kargs(etcd_cluster, enabled=True))
    assert res["changed"] is True, res
    assert res["enabled"] is True
    again = run_module("etcd_auth", login(etcd_cluster, roles=ROLES, users=USERS, enabled=True))
    assert again["changed"] is False, again
    assert again.get("enabled") is True, again


def test_certificates_by_common_name_over_grpc(etcd_cluster: Any) -> None:
    put = etcdctl(etcd_cluster, "root", "put", "/skydns/it/probe", '{"host":"198.18.0.9"}')
    assert put.returncode == 0, put.stderr
    # CoreDNS: reads its prefix, cannot write anywhere, cannot read podnet's state
    got = etcdctl(etcd_cluster, "coredns", "get", "/skydns/it/probe", "--print-value-only")
    assert got.returncode == 0 and "198.18.0.9" in got.stdout, got.stderr
    denied = etcdctl(etcd_cluster, "coredns", "put", "/skydns/it/evil", "x")
    assert denied.returncode != 0 and "permission denied" in denied.stderr, denied
    denied = etcdctl(etcd_cluster, "coredns", "get", f"/podnet/{CLUSTER}/config")
    assert denied.returncode != 0 and "permission denied" in denied.stderr
    # a node: its cluster's state and DNS records, nothing else
    ok = etcdctl(etcd_cluster, "podnetd-n1", "put", f"/podnet/{CLUSTER}/nodes/n1", "{}")
    assert ok.returncode == 0, ok.stderr
    ok = etcdctl(etcd_cluster, "podnetd-n1", "put", "/skydns/it/n1", "{}")
    assert ok.returncode == 0, ok.stderr
    denied = etcdctl(etcd_cluster, "podnetd-n1", "put", "/podnet/other/x", "1")
    assert denied.returncode != 0 and "permission denied" in denied.stderr
    denied = etcdctl(etcd_cluster, "podnetd-n1", "user", "list")
    assert denied.returncode != 0 and "permission denied" in denied.stderr


def test_gateway_needs_a_login_once_auth_is_on(etcd_cluster: Any, run_module: Any) -> None:
    key = f"/podnet/{CLUSTER}/config"
    res = run_module("etcd_key", kargs(etcd_cluster, key=key, json={"a": 1}))
    assert res.get("failed") is True, "the gateway must not take the certificate's name"
    assert "common name" in res["msg"], res["msg"]
    # a login does not help a certificate with a common name: etcd refuses it on the gateway
    with_cn = kargs(etcd_cluster, key=key, json={"a": 1}, login_user="root")
    res = run_module("etcd_key", {**with_cn, "login_password": ROOT_PW})
    assert res.get("failed") is True and "common name" in res["msg"], res["msg"]
    res = run_module("etcd_key", login(etcd_cluster, key=key, json={"a": 1}))
    assert res["changed"] is True, res
    got = run_module("etcd_key_info", login(etcd_cluster, key=key))
    assert got["json"] == {"a": 1}
    res = run_module(
        "etcd_key", {**login(etcd_cluster, key=key, json={"a": 1}), "login_password": "x"}
    )
    assert res.get("failed") is True and "login" in res["msg"]


def test_gateway_login_with_a_password_file(
    etcd_cluster: Any, run_module: Any, tmp_path: Any
) -> None:
    """What the roles pass (the etcd role keeps the password in a 0600 file)."""
    key = f"/podnet/{CLUSTER}/config"
    pw = tmp_path / "admin-gateway.password"
    pw.write_text(ROOT_PW + "\n")
    args = {k: v for k, v in login(etcd_cluster, key=key).items() if k != "login_password"}
    got = run_module("etcd_key_info", {**args, "login_password_file": str(pw)})
    assert got["json"] == {"a": 1}, got
    pw.write_text("wrong\n")
    res = run_module("etcd_key_info", {**args, "login_password_file": str(pw)})
    assert res.get("failed") is True and "login" in res["msg"], res


def test_deleted_user_is_refused_and_restored(etcd_cluster: Any, run_module: Any) -> None:
    key = f"/podnet/{CLUSTER}/nodes/n2"
    assert etcdctl(etcd_cluster, "podnetd-n2", "put", key, "{}").returncode == 0
    gone = [{"name": "podnetd-n2", "state": "absent"}]
    res = run_module("etcd_auth", login(etcd_cluster, users=gone), check=True)
    assert res["changed"] is True and res["actions"] == ["delete user podnetd-n2"]
    assert etcdctl(etcd_cluster, "podnetd-n2", "get", key).returncode == 0, "check mode deleted"
    res = run_module("etcd_auth", login(etcd_cluster, users=gone), diff=True)
    assert res["changed"] is True and '"podnetd-n2"' in res["diff"]["before"]
    assert '"podnetd-n2"' not in res["diff"]["after"]
    refused = etcdctl(etcd_cluster, "podnetd-n2", "get", key)
    assert refused.returncode != 0, refused.stdout
    # the other node is unaffected
    assert etcdctl(etcd_cluster, "podnetd-n1", "get", key).returncode == 0
    assert run_module("etcd_auth", login(etcd_cluster, users=gone))["changed"] is False
    # restored
    res = run_module("etcd_auth", login(etcd_cluster, roles=ROLES, users=USERS))
    assert res["actions"] == ["add user podnetd-n2", "grant role podnet-node to podnetd-n2"]
    assert etcdctl(etcd_cluster, "podnetd-n2", "get", key).returncode == 0


def test_disable_again(etcd_cluster: Any, run_module: Any) -> None:
    res = run_module("etcd_auth", login(etcd_cluster, enabled=False))
    assert res["changed"] is True and res["actions"] == ["disable authentication"]
    assert run_module("etcd_auth", kargs(etcd_cluster, enabled=False))["changed"] is False
    # without authentication a login is ignored (no token needed)
    got = run_module("etcd_key_info", login(etcd_cluster, key=f"/podnet/{CLUSTER}/config"))
    assert got["json"] == {"a": 1}
