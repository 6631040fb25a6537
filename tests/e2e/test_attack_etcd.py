# SPDX-License-Identifier: Apache-2.0
"""Attacks on etcd with a node's own certificate (issue 23; docs/security.md "etcd
authentication"): as root on c1, with c1's certificate (`podnetd-c1`, etcdctl over gRPC: etcd
takes the certificate's common name as the user), against what other nodes and users own.

etcd refuses what its permissions express (each node's role: its own prefixes); what they
cannot express (records every allocation shares: users' VNIs, job records, DNS records) is
detected and written back by its owner within seconds: every running podnetd for a user's
VNI, the job's nodes for its record, the pod's node for its DNS and address records.
CoreDNS's certificate cannot write at all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import CLUSTER, etcdctl, pod_of, running_jobs, ssh, wait_for  # type: ignore[import-not-found]

PKI = "/etc/podnet/pki"
ROOT = f"/podnet/{CLUSTER}/"
#: the owners check their records every 5 s (node/repair.py: RecordGuard); a write back
#: may wait for it
RESTORED_WITHIN = 30.0


def _endpoint(node: str) -> str:
    conf = ssh(node, "cat /etc/podnet/podnet.yaml").stdout
    return str(json.loads(re.search(r"^etcd_endpoints: (.*)$", conf, re.M).group(1))[0])  # type: ignore[union-attr]


def as_cert(node: str, cert: str, args: str, key: str = "") -> tuple[int, str]:
    """etcdctl on `node` with a certificate of that node (`PKI/<cert>.crt`, or `key` dir)."""
    d = key or PKI
    r = ssh(
        node,
        f"ETCDCTL_API=3 etcdctl --endpoints={_endpoint(node)} --cacert={PKI}/ca.crt "
        f"--cert={d}/{cert}.crt --key={d}/{cert}.key --dial-timeout=3s --command-timeout=5s "
        f"{args}",
        check=False,
        timeout=60,
    )
    return r.returncode, r.stdout + r.stderr


def as_c1(args: str) -> tuple[int, str]:
    return as_cert("c1", "podnetd-c1", args)


def get(key: str) -> str:
    """The value etcd holds (read with the admin certificate), "" if none."""
    return etcdctl(f"get {key} --print-value-only").strip()


def refused(rc: int, out: str) -> bool:
    return rc != 0 and "permission denied" in out


@pytest.fixture(scope="module")
def work() -> Iterator[dict[str, int]]:
    """alice on c1 and c2, bob on c2 only (a job and pod c1 has nothing to do with)."""
    with running_jobs(
        alice=("alice", "e2eatka", "c1,c2", "sleep 3600"),
        bob=("bob", "e2eatkb", "c2", "sleep 3600"),
    ) as j:
        wait_for(lambda: pod_of("c2", j["bob"]) and pod_of("c1", j["alice"]), 60)
        yield j


def _record(key: str) -> dict[str, Any]:
    v = get(key)
    assert v, f"{key} is missing"
    return dict(json.loads(v))


def test_etcd_authentication_is_on() -> None:
    assert "Authentication Status: true" in etcdctl("auth status")
    roles = etcdctl("user get podnetd-c1")
    assert "podnet-node-c1" in roles and "root" not in roles.split("Roles:")[1], roles


def test_c1_cannot_write_under_another_nodes_prefixes(work: dict[str, int]) -> None:
    del work
    for key in (
        f"{ROOT}logins/c2/alice",
        f"{ROOT}containers/c2/pn-c0123456789a",
        f"{ROOT}alive/c2",
        f"{ROOT}nodes/c2",  # a node's address is the collection's: not even its own
        f"{ROOT}nodes/c1",
        f"{ROOT}config",
        f"{ROOT}gateway/policy/global",
    ):
        before = get(key)
        rc, out = as_c1(f'put {key} \'{{"ip": "198.51.100.250"}}\'')
        assert refused(rc, out), f"c1 wrote {key}: {out}"
        assert get(key) == before
        rc, out = as_c1(f"del {key}")
        assert refused(rc, out) or get(key) == before == "", f"c1 deleted {key}: {out}"
    rc, out = as_c1(f"put {ROOT}alive/c1x 1")
    assert refused(rc, out), "alive/c1x is not c1's (an exact key)"
    # its own prefixes it may write (the role is not read-only)
    rc, out = as_c1(f"put {ROOT}logins/c1/e2e-probe 1")
    assert rc == 0, out
    assert as_c1(f"del {ROOT}logins/c1/e2e-probe")[0] == 0


def test_c1_cannot_add_another_node_as_a_vtep_of_alices_network(work: dict[str, int]) -> None:
    alice = _record(f"{ROOT}users/alice")
    vni = alice["vni"]
    for node in ("c2", "ctl", "intruder"):
        rc, out = as_c1(f'put {ROOT}vteps/{vni}/{node} \'{{"ip": "198.51.100.250"}}\'')
        assert refused(rc, out), f"c1 registered {node} for VNI {vni}: {out}"
    # the VTEPs c2 floods alice's frames to are the nodes of her pods, at their registered
    # addresses: nothing c1 wrote
    fdb = ssh("c2", f"bridge fdb show dev pnvx{vni}").stdout
    assert "198.51.100.250" not in fdb, fdb
    del work


def test_c2s_address_block_given_to_c1_is_written_back(work: dict[str, int]) -> None:
    """Where a pod's traffic goes is its block owner's (routes, and every node's overlay:
    node/overlay.py). c1 may write `blocks/` (a job's allocation claims blocks for its
    nodes), so it gives itself, then deletes, a block of c2 (bob's pod is in one): c2
    writes it back each time, and c1's route to the block is c2's again."""
    del work
    blocks = etcdctl(f"get {ROOT}blocks/ --prefix").splitlines()
    owned = {blocks[i]: json.loads(blocks[i + 1]) for i in range(0, len(blocks) - 1, 2)}
    key = next((k for k, v in owned.items() if v.get("node") == "c2"), None)
    assert key is not None, f"c2 owns no block: {owned}"
    before = get(key)
    rc, out = as_c1(f'put {key} \'{{"node": "c1"}}\'')
    assert rc == 0, f"etcd's permissions cannot refuse this write (blocks/ is shared): {out}"
    wait_for(lambda: get(key) == before, RESTORED_WITHIN, 0.5)
    rc, out = as_c1(f"del {key}")
    assert rc == 0, out
    wait_for(lambda: get(key) == before, RESTORED_WITHIN, 0.5)
    # and every node sends to c2 again: c1's route to the block is c2's address
    c2 = json.loads(get(f"{ROOT}nodes/c2"))["ip"]
    net = key.rsplit("/", 1)[-1].replace("-", "/")
    wait_for(lambda: f"via {c2}" in ssh("c1", f"ip -4 route show {net}").stdout, 30, 0.5)


def test_bobs_vni_changed_by_c1_is_written_back(work: dict[str, int]) -> None:
    del work
    key = f"{ROOT}users/bob"
    bob, alice = _record(key), _record(f"{ROOT}users/alice")
    forged = json.dumps({**bob, "vni": alice["vni"]})
    rc, out = as_c1(f"put {key} '{forged}'")
    assert rc == 0, f"etcd's permissions cannot refuse this write (users/ is shared): {out}"
    wait_for(lambda: _record(key) == bob, RESTORED_WITHIN, 0.5)
    rc, out = as_c1(f"del {key}")
    assert rc == 0, out
    wait_for(lambda: get(key) and _record(key) == bob, RESTORED_WITHIN, 0.5)
    vkey = f"{ROOT}vnis/{bob['vni']}"
    owner = _record(vkey)
    rc, out = as_c1(f"del {vkey}")
    assert rc == 0, out
    wait_for(lambda: get(vkey) and _record(vkey) == owner, RESTORED_WITHIN, 0.5)


def test_bobs_job_record_overwritten_by_c1_is_written_back(work: dict[str, int]) -> None:
    key = f"{ROOT}jobs/{work['bob']}"
    job = _record(key)
    assert job["size"] == 1 and job["user"] == "bob"
    forged = json.dumps(
        {**job, "user": "alice", "uid": 2001, "vni": _record(f"{ROOT}users/alice")["vni"]}
    )
    rc, out = as_c1(f"put {key} '{forged}'")
    assert rc == 0, out
    wait_for(lambda: _record(key) == job, RESTORED_WITHIN, 0.5)
    rc, out = as_c1(f"del {key}")
    assert rc == 0, out
    wait_for(lambda: get(key) and _record(key) == job, RESTORED_WITHIN, 0.5)


def test_dns_records_of_a_pod_on_c2_deleted_by_c1_are_written_back(work: dict[str, int]) -> None:
    job = _record(f"{ROOT}jobs/{work['bob']}")
    marker = f"{ROOT}jobnodes/{work['bob']}/c2"
    ip = _record(marker)["ip"]
    zone = "/".join(reversed(CLUSTER.split(".")))
    by_id, named = (
        f"/skydns/{zone}/bob/{work['bob']}/pod0",
        f"/skydns/{zone}/bob/{job['label']}/pod0",
    )
    a, b, c, d = ip.split(".")
    ptr = f"/skydns/arpa/in-addr/{a}/{b}/{c}/{d}"
    before = {k: get(k) for k in (by_id, named, ptr, marker)}
    assert all(before.values()), before
    for k in before:
        rc, out = as_c1(f"del {k}")
        assert rc == 0, out
    rc, out = as_c1(f'put {ROOT}ips/{ip} \'{{"job_id": 1, "node": "c1", "vni": 1}}\'')
    assert rc == 0, out
    wait_for(lambda: all(get(k) == v for k, v in before.items()), RESTORED_WITHIN, 0.5)
    wait_for(lambda: json.loads(get(f"{ROOT}ips/{ip}"))["node"] == "c2", RESTORED_WITHIN)
    # and CoreDNS answers with the pod's address again (asked by root on the DNS host: name
    # privacy shows bob's names to bob's pods and to root there, to no host-side process
    # elsewhere; docs/security.md "Name privacy")
    name = f"pod0.{work['bob']}.bob.{CLUSTER}"
    wait_for(
        lambda: ssh("ctl", f"dig +short +time=2 +tries=1 @127.0.0.1 {name} A").stdout.strip() == ip,
        60,
    )


def test_corednss_certificate_cannot_write_at_all() -> None:
    for key in ("/skydns/x/probe", f"{ROOT}probe", "/probe"):
        rc, out = as_cert("ctl", "coredns", f"put {key} 1", key="/etc/coredns/pki")
        assert refused(rc, out), f"CoreDNS's certificate wrote {key}: {out}"
    rc, out = as_cert(
        "ctl", "coredns", "get /skydns/ --prefix --keys-only --limit 1", key="/etc/coredns/pki"
    )
    assert rc == 0, f"CoreDNS must still read its records: {out}"
