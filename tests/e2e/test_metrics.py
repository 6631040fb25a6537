# SPDX-License-Identifier: Apache-2.0
"""The metrics endpoints on the lab (issue 37), scraped from ctl over the cluster network
as the site's Prometheus would: podnetd on login counts alice's login pod and a refused
request, her container and a container refused over her quota; on a lab with gateways,
exactly one of gw1 and gw2 says it holds the external address and both export their
table's state. The lab's Prometheus (ctl:9090) scrapes every component: podnetd on each
node, etcd, CoreDNS, podnet-gatewayd on the gateways."""

from __future__ import annotations

import base64
import shlex
import time
from typing import Any

import yaml
from conftest import lab_inventory, prometheus_api, prometheus_url, save_evidence, ssh, wait_for
from prometheus_client.parser import text_string_to_metric_families
from test_quota import my_containers, quota

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def underlay_ip(node: str) -> str:
    def find(group: dict[str, Any]) -> str | None:
        hosts = group.get("hosts") or {}
        if node in hosts and (hosts[node] or {}).get("podnet_underlay_ip"):
            return str(hosts[node]["podnet_underlay_ip"])
        for child in (group.get("children") or {}).values():
            got = find(child or {})
            if got:
                return got
        return None

    ip = find(yaml.safe_load(lab_inventory().read_text())["all"])
    assert ip, f"{node}: no podnet_underlay_ip in the lab's inventory"
    return ip


def scrape(node: str, port: int) -> Samples:
    url = f"http://{underlay_ip(node)}:{port}/metrics"
    code = (
        f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=10).read().decode())"
    )
    text = ssh("ctl", f"python3 -c {shlex.quote(code)}").stdout
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_podnetd_on_login_counts_a_login_pod_and_a_refused_request() -> None:
    before = scrape("login", 9464)
    key = ("podnet_requests_failed_total", (("code", "EPERM"), ("op", "job_up")))
    # alice asks podnetd for a job's pod herself: refused (root only), counted by op and code
    req = base64.b64encode(b'{"v": 1, "op": "job_up", "job_id": 1}\n').decode()
    ask = (
        "import base64, socket; s = socket.socket(socket.AF_UNIX); "
        "s.connect('/run/podnet/podnetd.sock'); "
        f"s.sendall(base64.b64decode('{req}')); print(s.makefile().readline())"
    )
    out = ssh("alice@login", f"python3 -c {shlex.quote(ask)}").stdout
    assert '"EPERM"' in out, out
    got = scrape("login", 9464)
    assert got[key] == before.get(key, 0) + 1
    assert got[("podnet_pods", (("kind", "login"),))] >= 1  # alice's, in its grace
    assert got[("process_resident_memory_bytes", ())] > 10_000_000
    assert any(name == "podnet_build_info" for name, _labels in got)
    assert got[("podnet_etcd_request_seconds_count", ())] > 0


def test_podnetd_on_login_counts_a_container_and_a_refusal_over_the_quota() -> None:
    """alice's container on login shows in podnet_pods{kind="container"}, and a second one
    over her quota (1 a node, for the block) in podnet_quota_refusals_total, as login's
    podnetd exports them."""
    refusals = (
        "podnet_quota_refusals_total",
        (("limit", "containers_per_node"), ("op", "container_add")),
    )
    containers = ("podnet_pods", (("kind", "container"),))
    before = scrape("login", 9464)
    tag = f"mc{int(time.time()) % 100000}"
    pid = f"/tmp/{tag}.pid"
    with quota(containers_per_node=1):
        try:
            ssh(
                "alice@login",
                f"setsid podnet-container --name {tag}-1 -- sleep 600 </dev/null >/dev/null 2>&1 "
                f"& echo $! >{pid}",
            )
            wait_for(lambda: len(my_containers("alice")) == 1, 60)
            assert scrape("login", 9464)[containers] == before[containers] + 1
            r = ssh("alice@login", f"podnet-container --name {tag}-2 -- true", check=False)
            assert r.returncode != 0 and "(EQUOTA)" in r.stderr, r.stdout + r.stderr
            assert scrape("login", 9464)[refusals] == before.get(refusals, 0) + 1
        finally:
            ssh("alice@login", f"[ -f {pid} ] && kill $(cat {pid}); rm -f {pid}", check=False)
    wait_for(lambda: not my_containers("alice"), 30)


def test_exactly_one_gateway_holds_the_external_address() -> None:
    inv = lab_inventory().read_text()
    if "gw1" not in inv:
        return  # a lab without gateways (LAB_GATEWAYS=1 has them): nothing to scrape
    masters = [scrape(gw, 9465)[("podnet_gateway_vrrp_master", ())] for gw in ("gw1", "gw2")]
    assert sorted(masters) == [0, 1], masters
    for gw in ("gw1", "gw2"):
        got = scrape(gw, 9465)
        assert got[("podnet_gateway_syncs_total", (("kind", "full"),))] >= 1
        assert ("podnet_gateway_published_ports", ()) in got


def test_prometheus_scrapes_every_component() -> None:
    if prometheus_url() is None:
        return  # a lab without the prometheus group (LAB_OS=bookworm): no Prometheus
    nodes = {"ctl", "login", "c1", "c2"}
    want = {("podnetd", n) for n in nodes} | {("etcd", "ctl"), ("coredns", "ctl")}
    want.add(("prometheus", "ctl"))
    if "gw1" in lab_inventory().read_text():
        want |= {(job, gw) for gw in ("gw1", "gw2") for job in ("podnetd", "podnet-gatewayd")}

    def all_up() -> dict[tuple[str, str], str]:
        got = {
            (t["labels"]["job"], t["labels"]["instance"]): t["health"]
            for t in prometheus_api("targets", state="active")["activeTargets"]
        }
        assert want <= set(got), sorted(want - set(got))
        down = {k: v for k, v in got.items() if v != "up"}
        assert not down, down
        return got

    got = wait_for(all_up, 90, 3)
    rows = [f"{job:16} {inst:8} {health}" for (job, inst), health in sorted(got.items())]
    save_evidence("targets.txt", "\n".join(rows) + "\n")
