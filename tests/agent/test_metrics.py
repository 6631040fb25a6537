# SPDX-License-Identifier: Apache-2.0
"""podnetd's metrics endpoint scraped as Prometheus does (issue 37), on a real podnetd and
etcd: pods by kind, refused requests by op and code, etcd round trips, the build and the
process's own metrics."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from conftest import EtcdServer, Node, user_call
from podnet import __version__
from prometheus_client.parser import text_string_to_metric_families

PORT = 9465


def scrape(node: Node) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample, sorted labels): value} from the node's endpoint, inside its namespace."""
    code = (
        "import sys, urllib.request\n"
        f"sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:{PORT}/metrics', "
        "timeout=10).read().decode())"
    )
    text = node.ns(sys.executable, "-c", code).stdout
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_the_endpoint_counts_pods_refusals_and_etcd_round_trips(
    workdir: Path, etcd: EtcdServer
) -> None:
    node = Node(26, workdir, etcd, settings={"metrics": f"127.0.0.1:{PORT}"})
    try:
        up: dict[str, Any] = {"user": "mona", "uid": 2931, "job_name": "m", "nodes": ["n26"]}
        node.call("job_up", job_id=2601, node_index=0, **up)
        # a user may not make a job's pod: refused, and counted by op and code
        refused = user_call(node, 2931, "job_up", job_id=2602, node_index=0, **up)
        assert refused["ok"] is False and refused["code"] == "EPERM", refused
        got = scrape(node)
        assert got[("podnet_pods", (("kind", "job"),))] == 1
        assert got[("podnet_pods", (("kind", "container"),))] == 0
        assert got[("podnet_requests_failed_total", (("code", "EPERM"), ("op", "job_up")))] == 1
        assert got[("podnet_etcd_request_seconds_count", ())] > 0
        assert got[("podnet_pod_setup_seconds_count", ())] == 1
        # the pod's address came from a block this node took (cluster-wide view of etcd)
        assert got[("podnet_pool_blocks", ())] >= 1
        assert got[("podnet_pool_blocks_capacity", ())] >= got[("podnet_pool_blocks", ())]
        assert ("podnet_build_info", (("version", __version__),)) in got
        assert got[("process_resident_memory_bytes", ())] > 10_000_000
        assert got[("process_open_fds", ())] > 0
        node.call("job_down", job_id=2601)
        assert scrape(node)[("podnet_pods", (("kind", "job"),))] == 0
    finally:
        node.teardown()


def test_a_stopped_podnetd_withdraws_its_alive_record_and_keeps_its_lease(
    workdir: Path, etcd: EtcdServer
) -> None:
    """`podnet status --cluster` says a node is down from its `alive/<node>` record: gone
    at once when podnetd stops, while the node's lease (its login pods' records) stays for
    the podnetd that starts again."""
    node = Node(27, workdir, etcd)
    key = "/podnet/t/alive/n27"
    try:
        assert etcd.client.get_json(key)["version"] == __version__
        lease = int((node.dir / "state" / "lease").read_text())
        node.stop()
        assert etcd.client.get(key) is None
        assert etcd.client.lease_ttl(lease) > 0
        node.start()
        assert etcd.client.get(key) is not None
        assert int((node.dir / "state" / "lease").read_text()) == lease
    finally:
        node.teardown()
