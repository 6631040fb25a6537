# SPDX-License-Identifier: Apache-2.0
"""`podnet status --cluster` on the lab (issue 37): root on the login node sees every
node's podnetd, etcd with its leader and the pool; c2's podnetd stopped makes it exit 1 and
name c2, started again 0; a user is told it is root's."""

from __future__ import annotations

import json

from conftest import ssh, wait_for


def cluster(check: bool = True) -> tuple[int, str]:
    r = ssh("login", "podnet status --cluster", check=False)
    if check:
        assert r.returncode in (0, 1), r.stdout + r.stderr
    return r.returncode, r.stdout


def test_cluster_status_names_a_stopped_podnetd_until_it_is_back() -> None:
    rep = json.loads(ssh("login", "podnet status --cluster --json").stdout)
    assert rep["ok"], rep["problems"]
    nodes = {n["node"]: n for n in rep["nodes"]}
    assert {"login", "c1", "c2"} <= set(nodes), sorted(nodes)
    assert all(n["alive"] and n["version"] == rep["cluster_version"] for n in nodes.values())
    assert rep["etcd"] and all(e.get("leader") not in (None, "0") for e in rep["etcd"])
    assert rep["pool"]["addresses"] > 0
    ssh("c2", "systemctl stop podnetd")
    try:
        rc, out = cluster()
        assert rc == 1, out
        assert "node c2: podnetd is not running" in out and "podnetd DOWN" in out, out
    finally:
        ssh("c2", "systemctl start podnetd")
    wait_for(lambda: cluster()[0] == 0, 60)


def test_a_user_is_told_it_needs_root() -> None:
    r = ssh("alice@login", "podnet status --cluster", check=False)
    assert r.returncode == 2 and "run it as root" in r.stderr, r.stdout + r.stderr
