# SPDX-License-Identifier: Apache-2.0
"""hpc.podnet.etcd_key and etcd_member run as real Ansible against a real 3-member etcd (TLS)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest


def kargs(cluster: Any, **kw: Any) -> dict[str, Any]:
    return {"endpoints": cluster.endpoints(), **cluster.tls_args(), **kw}


# -- etcd_key -------------------------------------------------------------------------
def test_key_json_put_idempotent_diff_check(etcd_cluster: Any, run_module: Any) -> None:
    key = "/podnet/it/config"
    doc = {"pod_cidr": "198.18.0.0/15", "block_prefix": 26, "search": ["a", "b"]}

    res = run_module("etcd_key", kargs(etcd_cluster, key=key, json=doc), diff=True)
    assert res["changed"] is True, res
    assert res["previous_value"] is None
    assert res["json"] == doc
    assert res["mod_revision"] > 0
    assert '"pod_cidr": "198.18.0.0/15"' in res["diff"]["after"]
    assert res["diff"]["before"] == ""

    # same document, other key order: semantically equal, no change
    reordered = {"search": ["a", "b"], "block_prefix": 26, "pod_cidr": "198.18.0.0/15"}
    res = run_module("etcd_key", kargs(etcd_cluster, key=key, json=reordered), diff=True)
    assert res["changed"] is False, res
    assert res["diff"]["before"] == res["diff"]["after"]

    # true is not 1 in JSON
    res = run_module(
        "etcd_key", kargs(etcd_cluster, key=key, json={**doc, "block_prefix": True}), check=True
    )
    assert res["changed"] is True

    # check mode with diff: reports, writes nothing
    changed = {**doc, "block_prefix": 24}
    res = run_module("etcd_key", kargs(etcd_cluster, key=key, json=changed), check=True, diff=True)
    assert res["changed"] is True
    assert '"block_prefix": 26' in res["diff"]["before"]
    assert '"block_prefix": 24' in res["diff"]["after"]
    got = run_module("etcd_key_info", kargs(etcd_cluster, key=key))
    assert got["changed"] is False
    assert got["json"] == doc, "check mode must not write"

    # real change, read back through every member
    res = run_module("etcd_key", kargs(etcd_cluster, key=key, json=changed))
    assert res["changed"] is True
    assert res["json"] == changed
    for name in ("m1", "m2", "m3"):
        got = run_module(
            "etcd_key_info",
            {"endpoints": etcd_cluster.endpoints([name]), **etcd_cluster.tls_args(), "key": key},
        )
        assert got["json"] == changed, name


def test_key_string_value_and_json_text(etcd_cluster: Any, run_module: Any) -> None:
    key = "/podnet/it/motd"
    res = run_module("etcd_key", kargs(etcd_cluster, key=key, value="hello"))
    assert res["changed"] is True and res["value"] == "hello"
    res = run_module("etcd_key", kargs(etcd_cluster, key=key, value="hello"))
    assert res["changed"] is False and res["previous_value"] == "hello"
    # a string that is not JSON, compared with json= -> different
    res = run_module("etcd_key", kargs(etcd_cluster, key=key, json='{"a": 1}'), check=True)
    assert res["changed"] is True
    # a string value identical in JSON meaning but not byte-for-byte: value= compares bytes
    run_module("etcd_key", kargs(etcd_cluster, key=key, value='{"a": 1}'))
    res = run_module("etcd_key", kargs(etcd_cluster, key=key, value='{"a":1}'), check=True)
    assert res["changed"] is True
    res = run_module("etcd_key", kargs(etcd_cluster, key=key, json={"a": 1}))
    assert res["changed"] is False


def test_key_absent_and_prefix(etcd_cluster: Any, run_module: Any) -> None:
    for i in range(3):
        run_module("etcd_key", kargs(etcd_cluster, key=f"/podnet/it/nodes/n{i}", value=str(i)))
    run_module("etcd_key", kargs(etcd_cluster, key="/podnet/it/nodesX", value="keep"))

    got = run_module("etcd_key_info", kargs(etcd_cluster, key="/podnet/it/nodes/", prefix=True))
    assert [kv["key"] for kv in got["kvs"]] == [f"/podnet/it/nodes/n{i}" for i in range(3)]

    res = run_module(
        "etcd_key",
        kargs(etcd_cluster, key="/podnet/it/nodes/n0", state="absent"),
        check=True,
        diff=True,
    )
    assert res["changed"] is True and res["deleted"] == 1
    assert "/podnet/it/nodes/n0 = 0" in res["diff"]["before"]
    res = run_module("etcd_key", kargs(etcd_cluster, key="/podnet/it/nodes/n0", state="absent"))
    assert res["changed"] is True and res["previous_value"] == "0"
    res = run_module("etcd_key", kargs(etcd_cluster, key="/podnet/it/nodes/n0", state="absent"))
    assert res["changed"] is False

    res = run_module(
        "etcd_key", kargs(etcd_cluster, key="/podnet/it/nodes/", prefix=True, state="absent")
    )
    assert res["changed"] is True and res["deleted"] == 2
    res = run_module(
        "etcd_key", kargs(etcd_cluster, key="/podnet/it/nodes/", prefix=True, state="absent")
    )
    assert res["changed"] is False
    got = run_module("etcd_key_info", kargs(etcd_cluster, key="/podnet/it/nodesX"))
    assert got["value"] == "keep", "prefix delete must not touch a sibling key"


def test_key_argument_errors(etcd_cluster: Any, run_module: Any) -> None:
    res = run_module("etcd_key", kargs(etcd_cluster, key="/x", value="a", json={"a": 1}))
    assert res.get("failed") and "mutually exclusive" in res["msg"]
    res = run_module("etcd_key", kargs(etcd_cluster, key="/x"))
    assert res.get("failed") and "value" in res["msg"] and "json" in res["msg"]
    res = run_module("etcd_key", kargs(etcd_cluster, key="/x", value="a", prefix=True))
    assert res.get("failed") and "prefix=true" in res["msg"]


@pytest.fixture
def html_server() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = b"<html>not etcd</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_key_clear_errors(
    etcd_cluster: Any, html_server: str, tmp_path, run_module, free_port, pki_factory
) -> None:
    tls = etcd_cluster.tls_args()
    dead = f"https://127.0.0.1:{free_port()}"
    res = run_module("etcd_key_info", {"endpoints": [dead], **tls, "key": "/x", "timeout": 2})
    assert res.get("failed") and "unreachable" in res["msg"] and dead in res["msg"], res

    # an unreachable endpoint first, a good one second: works
    res = run_module(
        "etcd_key_info", {"endpoints": [dead, *etcd_cluster.endpoints()], **tls, "key": "/x"}
    )
    assert not res.get("failed"), res

    # wrong CA: TLS error
    other = pki_factory(tmp_path / "otherpki")
    res = run_module(
        "etcd_key_info",
        {
            "endpoints": etcd_cluster.endpoints()[:1],
            **tls,
            "ca_cert": str(other["ca"]),
            "key": "/x",
        },
    )
    assert res.get("failed") and "TLS error" in res["msg"], res

    # no client certificate: etcd refuses the handshake
    res = run_module(
        "etcd_key_info",
        {
            "endpoints": etcd_cluster.endpoints()[:1],
            "ca_cert": tls["ca_cert"],
            "client_cert": str(tmp_path / "nope"),
            "client_key": str(tmp_path / "nope"),
            "key": "/x",
        },
    )
    assert res.get("failed"), res

    # something that answers but is not etcd
    res = run_module("etcd_key_info", {"endpoints": [html_server], **tls, "key": "/x"})
    assert res.get("failed") and "not JSON" in res["msg"], res

    res = run_module("etcd_key_info", {"endpoints": ["127.0.0.1:2379"], **tls, "key": "/x"})
    assert res.get("failed") and "not an http(s) URL" in res["msg"], res


# -- etcd_member ----------------------------------------------------------------------
def margs(cluster: Any, **kw: Any) -> dict[str, Any]:
    return kargs(cluster, **kw)


def test_member_present_existing_is_noop(etcd_cluster: Any, run_module: Any) -> None:
    m1 = etcd_cluster.members["m1"]
    res = run_module(
        "etcd_member", margs(etcd_cluster, name="m1", peer_urls=[m1.peer_url]), diff=True
    )
    assert res["changed"] is False, res
    assert sorted(m["name"] for m in res["members"]) == ["m1", "m2", "m3"]
    assert res["member"]["client_urls"] == [m1.client_url]
    assert res["diff"]["before"] == res["diff"]["after"]


def test_member_update_peer_urls(etcd_cluster: Any, run_module: Any) -> None:
    m1 = etcd_cluster.members["m1"]
    both = [m1.peer_url, f"https://localhost:{m1.peer_port}"]
    res = run_module(
        "etcd_member", margs(etcd_cluster, name="m1", peer_urls=both), check=True, diff=True
    )
    assert res["changed"] is True and res["actions"][0].startswith("update m1")
    assert res["diff"]["after"]["peer_urls"] == sorted(both)
    res = run_module("etcd_member", margs(etcd_cluster, name="m1", peer_urls=both))
    assert res["changed"] is True and sorted(res["member"]["peer_urls"]) == sorted(both)
    res = run_module("etcd_member", margs(etcd_cluster, name="m1", peer_urls=both))
    assert res["changed"] is False
    res = run_module("etcd_member", margs(etcd_cluster, name="m1", peer_urls=[m1.peer_url]))
    assert res["changed"] is True and res["member"]["peer_urls"] == [m1.peer_url]
    etcd_cluster.wait_healthy(["m1", "m2", "m3"])


def test_member_learner_add_find_remove(etcd_cluster: Any, run_module: Any, free_port: Any) -> None:
    ghost = f"https://127.0.0.1:{free_port()}"
    res = run_module(
        "etcd_member", margs(etcd_cluster, name="ghost", peer_urls=[ghost], learner=True)
    )
    assert res["changed"] is True and res["member"]["is_learner"] is True, res
    # not started -> no name in etcd, found again by its peer URL
    res = run_module(
        "etcd_member", margs(etcd_cluster, name="ghost", peer_urls=[ghost], learner=True)
    )
    assert res["changed"] is False, res
    # cannot demote a voter
    res = run_module(
        "etcd_member",
        margs(
            etcd_cluster, name="m2", peer_urls=[etcd_cluster.members["m2"].peer_url], learner=True
        ),
    )
    assert res.get("failed") and "cannot demote" in res["msg"]
    # promoting a learner that never started: etcd's own error, reported
    res = run_module(
        "etcd_member", margs(etcd_cluster, name="ghost", peer_urls=[ghost], learner=False)
    )
    assert res.get("failed") and "learner" in res["msg"], res
    # a learner does not count for quorum: removal is fine
    res = run_module(
        "etcd_member", margs(etcd_cluster, name="ghost", peer_urls=[ghost], state="absent")
    )
    assert res["changed"] is True, res
    assert sorted(m["name"] for m in res["members"]) == ["m1", "m2", "m3"]


def test_member_remove_refused_without_quorum_and_failed_add(
    etcd_cluster: Any, run_module: Any, free_port: Any
) -> None:
    before = etcd_cluster.member_names()
    etcd_cluster.stop("m2")
    try:
        res = run_module("etcd_member", margs(etcd_cluster, name="m3", state="absent", timeout=3))
        assert res.get("failed"), res
        assert "quorum is 2" in res["msg"] and "m2" in res["msg"] and "force" in res["msg"], res
        # check mode refuses too
        res = run_module(
            "etcd_member", margs(etcd_cluster, name="m3", state="absent", timeout=3), check=True
        )
        assert res.get("failed"), res
        # an add that etcd refuses (4 members, 2 started: no quorum) changes nothing
        res = run_module(
            "etcd_member",
            margs(etcd_cluster, name="m4", peer_urls=[f"https://127.0.0.1:{free_port()}"]),
        )
        assert res.get("failed") and "membership is unchanged" in res["msg"], res
        assert etcd_cluster.member_names() == before
    finally:
        etcd_cluster.start("m2", etcd_cluster.initial_cluster(["m1", "m2", "m3"]), "existing")
        etcd_cluster.wait_healthy(["m1", "m2", "m3"])


def test_member_remove_and_readd_keeps_data(etcd_cluster: Any, run_module: Any) -> None:
    run_module("etcd_key", kargs(etcd_cluster, key="/podnet/it/durable", json={"v": 1}))
    m3 = etcd_cluster.members["m3"]

    res = run_module(
        "etcd_member", margs(etcd_cluster, name="m3", state="absent"), check=True, diff=True
    )
    assert res["changed"] is True and len(res["members"]) == 2
    assert res["diff"]["before"]["name"] == "m3" and res["diff"]["after"] == {}
    assert etcd_cluster.member_names() == ["m1", "m2", "m3"], "check mode must not remove"

    res = run_module(
        "etcd_member",
        margs(
            etcd_cluster, name="m3", state="absent", endpoints=etcd_cluster.endpoints(["m1", "m2"])
        ),
    )
    assert res["changed"] is True, res.get("msg")
    assert sorted(m["name"] for m in res["members"]) == ["m1", "m2"]
    etcd_cluster.stop("m3")
    etcd_cluster.wipe("m3")
    res = run_module("etcd_member", margs(etcd_cluster, name="m3", state="absent"))
    assert res["changed"] is False

    # data readable with two members
    got = run_module("etcd_key_info", kargs(etcd_cluster, key="/podnet/it/durable"))
    assert got["json"] == {"v": 1}

    # re-add: member add, then a fresh etcd with initial-cluster-state=existing
    res = run_module(
        "etcd_member", margs(etcd_cluster, name="m3", peer_urls=[m3.peer_url]), diff=True
    )
    assert res["changed"] is True and res["actions"][0].startswith("add m3"), res
    assert res["member"]["name"] == "m3" and len(res["members"]) == 3
    # rerun before it started: found by peer URL, no second add
    res = run_module("etcd_member", margs(etcd_cluster, name="m3", peer_urls=[m3.peer_url]))
    assert res["changed"] is False, res

    etcd_cluster.start("m3", etcd_cluster.initial_cluster(["m1", "m2", "m3"]), state="existing")
    etcd_cluster.wait_healthy(["m1", "m2", "m3"])
    assert etcd_cluster.member_names() == ["m1", "m2", "m3"]
    got = run_module(
        "etcd_key_info",
        {"endpoints": [m3.client_url], **etcd_cluster.tls_args(), "key": "/podnet/it/durable"},
    )
    assert got["json"] == {"v": 1}, "the re-added member must serve the old data"


# -- check mode before etcd is deployed (issue 12: site.yml --check on empty nodes) -------
@pytest.mark.parametrize(
    ("module", "extra"),
    [
        ("etcd_key", {"key": "/podnet/it/x", "value": "1"}),
        ("etcd_auth", {"roles": [{"name": "r", "permissions": [{"key": "/x/", "prefix": True}]}]}),
        ("etcd_member", {"name": "m9", "peer_urls": ["https://127.0.0.1:1"]}),
        ("gateway_policy", {"cluster": "it", "global_policy": {}}),
    ],
)
def test_check_mode_without_client_certificates(
    tmp_path: Any, run_module: Any, module: str, extra: dict[str, Any]
) -> None:
    """No certificate files (etcd not deployed): check mode reports the change with a
    message, a real run fails loudly on the missing file."""
    args = {
        "endpoints": ["https://127.0.0.1:1"],
        "ca_cert": str(tmp_path / "ca.crt"),
        "client_cert": str(tmp_path / "admin.crt"),
        "client_key": str(tmp_path / "admin.key"),
        **extra,
    }
    res = run_module(module, args, check=True, diff=True)
    assert res.get("failed") is not True, res
    assert res["changed"] is True
    assert res["not_deployed"] is True
    assert "etcd not deployed yet" in res["msg"] and str(tmp_path / "ca.crt") in res["msg"]

    res = run_module(module, args)
    assert res["failed"] is True, res
    assert res["changed"] is False


def test_key_info_check_mode_without_client_certificates(tmp_path: Any, run_module: Any) -> None:
    args = {
        "endpoints": ["https://127.0.0.1:1"],
        "ca_cert": str(tmp_path / "ca.crt"),
        "key": "/podnet/it/",
        "prefix": True,
    }
    res = run_module("etcd_key_info", args, check=True)
    assert res.get("failed") is not True, res
    assert res["changed"] is False and res["exists"] is False and res["kvs"] == []
    assert res["not_deployed"] is True
    assert run_module("etcd_key_info", args)["failed"] is True
