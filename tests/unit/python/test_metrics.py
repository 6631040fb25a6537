# SPDX-License-Identifier: Apache-2.0
"""podnetd's metrics as Prometheus reads them (issue 37): what the collector exposes of an
agent and of the request handler, in the text format (fakes for both; the real endpoint is
scraped in tests/agent/test_metrics.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace

from podnet import __version__
from podnet.api.handlers import Handler, Peer
from podnet.api.metrics import AgentCollector
from podnet.state.quota import QuotaExceeded
from podnet.stats import ETCD_BUCKETS, Histogram
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

ROOT, ALICE = Peer(10, 0, 0), Peer(11, 2001, 2001)


@dataclass
class Pod:
    kind: str
    uid: int


@dataclass
class Errors:
    errors: int = 0


@dataclass
class Agent:
    pods: list[Pod] = field(default_factory=list)
    etcd: Errors = field(default_factory=Errors)
    setup_seconds: Histogram = field(default_factory=Histogram)
    etcd_seconds: Histogram = field(default_factory=lambda: Histogram(ETCD_BUCKETS))
    watch_seconds: Histogram = field(default_factory=lambda: Histogram(ETCD_BUCKETS))
    records_restored: int = 0
    overlay_misses: tuple[int, int, int] = (0, 0, 0)
    pool_blocks: tuple[int, int] = (0, 0)
    cfg: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(roles=["login"]))

    def list_pods(self, uid: int | None) -> list[Pod]:
        return self.pods

    def login_acquire(self, uid: int, pid: int) -> Pod:
        raise QuotaExceeded("alice", "logins", 1, 1)


def samples(agent: Agent, handler: Handler | None = None) -> dict[tuple[str, str], float]:
    """{(sample name, its labels as JSON): value} of one scrape."""
    reg = CollectorRegistry()
    reg.register(AgentCollector(agent, handler))  # type: ignore[arg-type]
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, json.dumps(s.labels, sort_keys=True))] = s.value
    return out


def lab(**labels: str) -> str:
    return json.dumps(labels, sort_keys=True)


def test_pods_by_kind_containers_included_and_users() -> None:
    agent = Agent([Pod("job", 2001), Pod("container", 2001), Pod("container", 2002)])
    got = samples(agent)
    assert got[("podnet_pods", lab(kind="job"))] == 1
    assert got[("podnet_pods", lab(kind="login"))] == 0
    assert got[("podnet_pods", lab(kind="container"))] == 2
    assert got[("podnet_users", lab())] == 2
    assert got[("podnet_build_info", lab(version=__version__))] == 1


def test_etcd_round_trips_errors_and_restored_records() -> None:
    agent = Agent(etcd=Errors(3), records_restored=2, overlay_misses=(9, 4, 1))
    for s in (0.0004, 0.002, 0.3):
        agent.etcd_seconds.observe(s)
    got = samples(agent)
    assert got[("podnet_etcd_errors_total", lab())] == 3
    assert got[("podnet_records_restored_total", lab())] == 2
    assert got[("podnet_overlay_misses_total", lab())] == 9
    assert got[("podnet_overlay_resolved_total", lab())] == 4
    assert got[("podnet_overlay_dropped_total", lab())] == 1
    assert got[("podnet_etcd_request_seconds_count", lab())] == 3
    assert got[("podnet_etcd_request_seconds_bucket", lab(le="0.0005"))] == 1
    assert got[("podnet_etcd_request_seconds_bucket", lab(le="0.0025"))] == 2
    assert got[("podnet_etcd_request_seconds_bucket", lab(le="+Inf"))] == 3
    assert got[("podnet_etcd_watch_delay_seconds_count", lab())] == 0


def test_failed_requests_by_op_and_code_and_quota_refusals_by_limit() -> None:
    agent = Agent()
    h = Handler(agent)  # type: ignore[arg-type]
    for peer, line in (
        (ALICE, {"v": 1, "op": "job_up", "job_id": 1}),  # not root
        (ALICE, {"v": 1, "op": "job_up", "job_id": 2}),
        (ALICE, {"v": 1, "op": "login_acquire"}),  # over quota
        (ALICE, {"v": 1, "op": "../etc/passwd"}),  # not an op: one label value for all
        (ROOT, {"v": 1, "op": "nope"}),
    ):
        assert h.handle_line(peer, json.dumps(line).encode())["ok"] is False
    assert h.handle_line(ALICE, b"\xff not json")["ok"] is False
    got = samples(agent, h)
    assert got[("podnet_requests_failed_total", lab(op="job_up", code="EPERM"))] == 2
    assert got[("podnet_requests_failed_total", lab(op="login_acquire", code="EQUOTA"))] == 1
    assert got[("podnet_requests_failed_total", lab(op="invalid", code="EINVAL"))] == 3
    assert got[("podnet_quota_refusals_total", lab(op="login_acquire", limit="logins"))] == 1
    ops = {json.loads(labels).get("op") for name, labels in got if "failed" in name}
    assert ops == {"job_up", "login_acquire", "invalid"}


def test_pool_blocks_taken_and_capacity() -> None:
    got = samples(Agent(pool_blocks=(3, 2048)))
    assert got[("podnet_pool_blocks", lab())] == 3
    assert got[("podnet_pool_blocks_capacity", lab())] == 2048
