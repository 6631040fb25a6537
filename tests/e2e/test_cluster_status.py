# SPDX-License-Identifier: Apache-2.0
"""`podnet status --cluster` and the lab's Prometheus with one podnetd stopped (issue 37):
root on the login node sees every node's podnetd, etcd with its leader and the pool; c2's
podnetd stopped makes it exit 1 and name c2, started again 0. In a lab with a Prometheus
(the `prometheus` group: ctl), the same stop fires `PodnetdDown` for c2 within its `for:`
(2 min) plus a scrape and an evaluation; while that time runs, a container of alice's and a
request refused over her quota are counted through Prometheus's API. A user is told the
cluster view is root's."""

from __future__ import annotations

import json
import time

from conftest import (
    firing,
    prometheus_api,
    prometheus_url,
    prometheus_value,
    save_evidence,
    ssh,
    wait_for,
)
from test_quota import my_containers, quota

#: PodnetdDown's for: (files/prometheus/podnet.rules.yml) + a scrape (15 s) and an evaluation
#: (15 s) + slack for a loaded machine
ALERT_WITHIN = 120 + 15 + 15 + 60


def cluster(check: bool = True) -> tuple[int, str]:
    r = ssh("login", "podnet status --cluster", check=False)
    if check:
        assert r.returncode in (0, 1), r.stdout + r.stderr
    return r.returncode, r.stdout


def counted_through_prometheus() -> None:
    """alice's container on login shows in podnet_pods{kind="container"} and a container
    over her quota (1 a node, for the block) in podnet_quota_refusals_total, both as the lab's
    Prometheus scraped them from login's podnetd."""
    refusals = (
        'podnet_quota_refusals_total{job="podnetd", instance="login", op="container_add", '
        'limit="containers_per_node"}'
    )
    containers = 'podnet_pods{job="podnetd", instance="login", kind="container"}'
    before = prometheus_value(refusals) or 0.0
    tag = f"prom{int(time.time()) % 100000}"
    pid = f"/tmp/{tag}.pid"
    with quota(containers_per_node=1):
        try:
            ssh(
                "alice@login",
                f"setsid podnet-container --name {tag}-1 -- sleep 600 </dev/null >/dev/null 2>&1 "
                f"& echo $! >{pid}",
            )
            wait_for(lambda: len(my_containers("alice")) == 1, 60)
            wait_for(lambda: (prometheus_value(containers) or 0) >= 1, 60, 2)
            r = ssh("alice@login", f"podnet-container --name {tag}-2 -- true", check=False)
            assert r.returncode != 0 and "(EQUOTA)" in r.stderr, r.stdout + r.stderr
            wait_for(lambda: (prometheus_value(refusals) or 0) >= before + 1, 60, 2)
        finally:
            ssh("alice@login", f"[ -f {pid} ] && kill $(cat {pid}); rm -f {pid}", check=False)
    wait_for(lambda: not my_containers("alice"), 30)


def test_cluster_status_and_prometheus_see_a_stopped_podnetd_until_it_is_back() -> None:
    rep = json.loads(ssh("login", "podnet status --cluster --json").stdout)
    assert rep["ok"], rep["problems"]
    nodes = {n["node"]: n for n in rep["nodes"]}
    assert {"login", "c1", "c2"} <= set(nodes), sorted(nodes)
    assert all(n["alive"] and n["version"] == rep["cluster_version"] for n in nodes.values())
    assert rep["etcd"] and all(e.get("leader") not in (None, "0") for e in rep["etcd"])
    assert rep["pool"]["addresses"] > 0
    save_evidence("cluster-status-before.txt", cluster()[1])
    prom = prometheus_url() is not None
    if prom:  # c2's podnetd is scraped (PodnetdDown needs a target that was up)
        wait_for(lambda: prometheus_value('up{job="podnetd", instance="c2"}') == 1, 60, 2)
    ssh("c2", "systemctl stop podnetd")
    stopped = time.monotonic()
    try:
        rc, out = cluster()
        assert rc == 1, out
        assert "node c2: podnetd is not running" in out and "podnetd DOWN" in out, out
        save_evidence("cluster-status-c2-stopped.txt", out)
        if prom:
            counted_through_prometheus()  # within the alert's for:, costs nothing more
            alert = wait_for(lambda: firing("PodnetdDown", instance="c2"), ALERT_WITHIN, 5)
            took = time.monotonic() - stopped
            print(f"PodnetdDown fired for c2 {took:.0f} s after the stop")
            assert alert[0]["labels"]["severity"] == "critical", alert
            assert not firing("PodnetdDown", instance="c1")
            save_evidence("alerts-c2-stopped.json", json.dumps(prometheus_api("alerts"), indent=2))
    finally:
        ssh("c2", "systemctl start podnetd")
    wait_for(lambda: cluster()[0] == 0, 60)
    save_evidence("cluster-status-after.txt", cluster()[1])


def test_a_user_is_told_it_needs_root() -> None:
    r = ssh("alice@login", "podnet status --cluster", check=False)
    assert r.returncode == 2 and "run it as root" in r.stderr, r.stdout + r.stderr
