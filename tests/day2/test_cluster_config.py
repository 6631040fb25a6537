# SPDX-License-Identifier: Apache-2.0
"""A change of the cluster configuration reaches the nodes (docs/admin-guide.md "Components a
site chooses"): an admin changes a cluster-wide setting in the inventory (here a search
domain; CoreDNS or gateways switched on or off change `dns_servers` / `egress_gateway` the
same way) and runs `podnet.yml` with its configure phase tag. podnetd reads the cluster
configuration at start, so the role restarts it where the stored configuration changed
(throttled; alice's job and SSH session keep running); a pod created afterwards has the new
setting. Before the fix: the phase-tagged run stopped at the agent's input check (a tagged
play gathered no facts), and without the restart new pods kept the old setting.

The run leaves out the spare node (as a run with a node down, or --limit, does): the stored
configuration's host networks and MTU, which come from all nodes, are merged, not replaced.
A host network only the left-out nodes have (here one the test adds to the stored
configuration) must stay. Before the fix it was dropped, for every node of the cluster.

The setting stays for the rest of the day-2 module (a search domain nobody resolves); the lab
goes at the end."""

from __future__ import annotations

import json

from conftest import CLUSTER, SPARE, Workload, etcdctl, playbook, recap, ssh, wait_for

DOMAIN = "day2-config.example"
#: a host network of nodes the run leaves out (TEST-NET-3: no lab address is in it)
LEFT_OUT_NET = "203.0.113.0/24"
CONFIG = f"/podnet/{CLUSTER}/config"


def stored_config() -> dict[str, object]:
    return dict(json.loads(etcdctl(f"get {CONFIG} --print-value-only")))


def put_config(config: dict[str, object]) -> None:
    value = json.dumps(config, separators=(",", ":")).replace("'", "'\\''")
    etcdctl(f"put {CONFIG} '{value}'")


def resolv_of_new_pod() -> str:
    """/etc/resolv.conf as a new one-node job of bob sees it (bob's SSH session on the login
    node, his login pod, as a user submits)."""
    return ssh("bob@login", "srun -N1 -w c1 cat /etc/resolv.conf").stdout


def test_cluster_configuration_change_reaches_new_pods(work: Workload) -> None:
    assert DOMAIN not in resolv_of_new_pod()
    t0 = float(ssh("c1", "date +%s.%N").stdout)
    before = stored_config()
    cidrs = list(before["host_cidrs"])  # type: ignore[call-overload]
    assert LEFT_OUT_NET not in cidrs, before
    put_config({**before, "host_cidrs": [*cidrs, LEFT_OUT_NET]})
    setting = f'{{"podnet_search_domains": ["{DOMAIN}"]}}'
    # the deployed nodes: the spare node joins later (scale.yml, test_day2.py)
    out, took = playbook(
        "podnet.yml", "--limit", f"all:!{SPARE}", "--tags", "agent_configure", "-e", setting
    )
    rec = recap(out)
    assert all(r["failed"] == 0 for r in rec.values()), rec
    assert "RUNNING HANDLER [hpc.podnet.agent : Restart podnetd]" in out, out[-3000:]
    print(f"day2: podnet.yml --tags agent_configure (a search domain): {took:.0f} s")
    after = stored_config()
    assert after["host_cidrs"] == [*cidrs, LEFT_OUT_NET], after
    assert DOMAIN in after["search_domains"], after  # type: ignore[operator]
    assert f"This run leaves out {SPARE}." in out, out[-3000:]
    # back to what the deployment computed (the domain stays)
    put_config({**after, "host_cidrs": cidrs})
    # podnetd is back on every node (the handler waits for it) and reads the new setting
    wait_for(lambda: DOMAIN in resolv_of_new_pod(), 60, 2)
    work.check("cluster configuration change", t0)
