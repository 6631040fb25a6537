# SPDX-License-Identifier: Apache-2.0
"""Gateway policy: validation, compilation into nftables set elements, evaluation order,
the gateway table's text, and publications (podnet publish) against the fake etcd."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from fake_etcd import FakeEtcd
from podnet.errors import PodnetError
from podnet.gateway.nft import generation, ruleset, update
from podnet.gateway.state import Raw, build_state
from podnet.names import Keys
from podnet.policy_format import PolicyError
from podnet.state import publish
from podnet.state.etcdops import KV
from podnet.state.gwpolicy import (
    Policy,
    compile_policy,
    evaluate,
    parse_policy,
    parse_rule,
    publish_max,
)
from podnet.state.quota import QuotaExceeded

ROOT = Path(__file__).resolve().parents[3]
TCP, UDP, ICMP = 6, 17, 1


def _module_utils() -> Any:
    path = ROOT / "plugins" / "module_utils" / "_gateway_policy.py"
    spec = importlib.util.spec_from_file_location("_gateway_policy", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


GLOBAL = {
    "default": "deny",
    "egress": [
        {"action": "allow", "cidr": "203.0.113.0/24", "proto": "tcp", "ports": "8000-8099"},
        {"action": "allow", "cidr": "203.0.113.0/24", "proto": "icmp"},
        {"action": "deny", "cidr": "203.0.113.0/24", "proto": "tcp", "ports": "8081"},
    ],
    "publish": {"max": 2},
}
ALICE = {"egress": [{"action": "allow", "cidr": "203.0.113.0/24", "proto": "tcp", "ports": 9000}]}


def test_evaluation_order_user_then_global_then_default() -> None:
    c = compile_policy(parse_policy(GLOBAL, "g"), {4096: parse_policy(ALICE, "a", user=True)})
    alice, bob = 4096, 4097
    assert evaluate(c, alice, "203.0.113.212", TCP, 8080) == "allow"
    assert evaluate(c, bob, "203.0.113.212", TCP, 8080) == "allow"
    assert evaluate(c, bob, "203.0.113.212", TCP, 8081) == "deny"  # global deny before allow
    assert evaluate(c, alice, "203.0.113.212", TCP, 9000) == "allow"  # alice's own rule
    assert evaluate(c, bob, "203.0.113.212", TCP, 9000) == "deny"  # not bob's
    assert evaluate(c, bob, "203.0.113.212", UDP, 8080) == "deny"
    assert evaluate(c, bob, "203.0.113.212", ICMP, 0) == "allow"
    assert evaluate(c, bob, "198.51.100.7", TCP, 8080) == "deny"  # outside the cidr: default


def test_user_deny_beats_global_allow() -> None:
    user = parse_policy({"egress": [{"action": "deny", "proto": "any"}]}, "u", user=True)
    c = compile_policy(parse_policy(GLOBAL, "g"), {5000: user})
    assert evaluate(c, 5000, "203.0.113.212", TCP, 8080) == "deny"
    assert evaluate(c, 5001, "203.0.113.212", TCP, 8080) == "allow"


def test_default_allow() -> None:
    c = compile_policy(parse_policy({"default": "allow"}, "g"), {})
    assert c.default == "allow"
    assert evaluate(c, 1, "192.0.2.1", UDP, 53) == "allow"


def test_elements_constant_shape() -> None:
    c = compile_policy(parse_policy(GLOBAL, "g"), {4096: parse_policy(ALICE, "a", user=True)})
    assert c.global_allow == ["203.0.113.0/24 . 1 . 0-65535", "203.0.113.0/24 . 6 . 8000-8099"]
    assert c.global_deny == ["203.0.113.0/24 . 6 . 8081"]
    assert c.users == {4096: ([], ["203.0.113.0/24 . 6 . 9000"])}
    anyp = parse_rule({"action": "deny"}, "r")
    assert anyp.elements() == ["0.0.0.0/0 . 0-255 . 0-65535"]


def test_many_users_many_rules_compile() -> None:
    users = {
        4096 + u: parse_policy(
            {
                "egress": [
                    {"cidr": f"10.{u % 256}.{r}.0/24", "proto": "tcp", "ports": 80 + r}
                    for r in range(10)
                ]
            },
            "u",
            user=True,
        )
        for u in range(1000)
    }
    c = compile_policy(Policy(), users)
    assert sum(len(a) for _d, a in c.users.values()) == 10000


BAD = [
    {"egress": [{"action": "maybe"}]},
    {"egress": [{"cidr": "300.1.1.0/24"}]},
    {"egress": [{"proto": "sctp"}]},
    {"egress": [{"proto": "icmp", "ports": "80"}]},
    {"egress": [{"proto": "tcp", "ports": "70000"}]},
    {"egress": [{"proto": "tcp", "ports": "90-80"}]},
    {"egress": [{"proto": "tcp", "port": "80"}]},
    {"egress": {"action": "allow"}},
    {"default": "sometimes"},
    {"publish": {"max": -1}},
    {"publish": {"max": True}},
    {"publish": 3},
    {"ingress": []},
]


def test_module_and_agent_share_one_policy_format() -> None:
    """The collection's module_utils file is the agent's policy_format (a symlink that
    ansible-galaxy keeps in the tarball): one validator, never two that drift apart."""
    mu = ROOT / "plugins" / "module_utils" / "_gateway_policy.py"
    assert mu.is_symlink()
    assert mu.samefile(ROOT / "agent" / "src" / "podnet" / "policy_format.py")


@pytest.mark.parametrize("bad", BAD)
def test_invalid_policies_refused_by_agent_and_module(bad: dict[str, Any]) -> None:
    with pytest.raises(PolicyError, match=r"^g: "):
        parse_policy(bad, "g")
    mu = _module_utils()
    with pytest.raises(mu.PolicyError):
        mu.canonical_policy(bad, "g")


def test_module_canonical_form_is_what_the_agent_reads() -> None:
    mu = _module_utils()
    stored = mu.canonical_policy(GLOBAL, "g")
    assert stored["egress"][0]["ports"] == "8000-8099"
    a = compile_policy(parse_policy(stored, "g"), {})
    b = compile_policy(parse_policy(GLOBAL, "g"), {})
    assert a == b
    with pytest.raises(mu.PolicyError):
        mu.canonical_policy({"default": "deny"}, "u", user=True)  # no default per user


def test_publish_max() -> None:
    g = parse_policy(GLOBAL, "g")
    assert publish_max(g, None) == 2
    assert publish_max(g, parse_policy({"publish": {"max": 5}}, "u", user=True)) == 5
    assert publish_max(Policy(), None) == 0


# -- the gateway table -------------------------------------------------------------------
def _kv(key: str, value: str, rev: int = 1) -> KV:
    return KV(key, value, rev, rev)


def _raw() -> Raw:
    raw = Raw()
    raw.ips = {
        "198.18.0.5": {"job_id": 7, "node": "c1", "vni": 4096},
        "198.18.0.70": {"job_id": 8, "node": "c2", "vni": 4097},
    }
    raw.user_vni = {"alice": 4096, "bob": 4097}
    raw.jobs = {7, 8}
    raw.global_pol = GLOBAL
    raw.user_pol = {"alice": ALICE, "carol": ALICE}  # carol has no network: skipped
    raw.pubs = [
        _kv("/podnet/lab/gateway/published/20000", '{"job_id":7,"ip":"198.18.0.5","port":8080}'),
        # job 9 ended: released
        _kv("/podnet/lab/gateway/published/20001", '{"job_id":9,"ip":"198.18.0.9","port":80}'),
        # the address is job 8's now: released
        _kv("/podnet/lab/gateway/published/20002", '{"job_id":7,"ip":"198.18.0.70","port":80}'),
    ]
    return raw


def test_build_state_releases_publications_of_ended_jobs() -> None:
    st, stale = build_state(_raw())
    assert st.published == {20000: ("198.18.0.5", 8080)}
    assert sorted(kv.key.rsplit("/", 1)[-1] for kv in stale) == ["20001", "20002"]
    assert st.pod_vni == {"198.18.0.5": 4096, "198.18.0.70": 4097}
    assert st.compiled.users == {4096: ([], ["203.0.113.0/24 . 6 . 9000"])}


def test_ruleset_text() -> None:
    st, _ = build_state(_raw())
    text = ruleset("198.18.0.0/15", "ext0", "203.0.113.194", st)
    assert "20000 : 198.18.0.5 . 8080" in text
    assert "198.18.0.5 : 4096" in text
    assert 'ip saddr 198.18.0.0/15 ip daddr 198.18.0.0/15 counter drop comment "hairpin"' in text
    assert "snat ip to 203.0.113.194" in text
    assert 'counter drop comment "default"' in text
    assert "add element inet podnet_gw user_chain { 4096 : jump u4096 }" in text


def test_update_touches_only_what_changed() -> None:
    old, _ = build_state(_raw())
    raw = _raw()
    raw.user_pol = {"alice": {"egress": [{"proto": "tcp", "ports": "9001"}]}, "bob": ALICE}
    raw.ips["198.18.0.9"] = {"job_id": 9, "node": "c1", "vni": 4097}
    new, _ = build_state(raw)
    cmd = update(old, new)
    assert cmd is not None
    assert "flush set inet podnet_gw u4096_allow" in cmd
    assert "add element inet podnet_gw u4096_allow { 0.0.0.0/0 . 6 . 9001 }" in cmd
    assert "add set inet podnet_gw u4097_allow" in cmd  # bob's first rules
    assert "add element inet podnet_gw pod_user { 198.18.0.9 : 4097 }" in cmd
    assert "global" not in cmd and "published" not in cmd
    assert update(new, new) == ""
    raw.user_pol = {}
    gone, _ = build_state(raw)
    cmd = update(new, gone)
    assert cmd is not None and "delete chain inet podnet_gw u4096" in cmd
    raw.global_pol = {**GLOBAL, "default": "allow"}
    assert update(gone, build_state(raw)[0]) is None  # the default verdict: a full replace


def _forward(text: str, chain: str = "forward") -> list[str]:
    body = text[text.index(f"chain {chain} {{") :]
    body = body[body.index("\n") : body.index("}\n")]
    return [ln.strip() for ln in body.replace("\\\n", "").splitlines() if ln.strip()]


def test_flows_the_policy_accepted_skip_it_until_the_generation_changes() -> None:
    """Issue 24: an established flow whose first packet the policy of this generation
    accepted is accepted on its conntrack mark; any change of the policy or of the pods
    is a new generation, so the next packet of every flow meets the policy again (the
    e2e test_rule_change_applies_to_established_flows_within_a_second)."""
    st, _ = build_state(_raw())
    gen = generation(st)
    assert gen != 0 and gen == generation(build_state(_raw())[0])
    text = ruleset("198.18.0.0/15", "ext0", "203.0.113.194", st)
    fwd = _forward(text)
    assert "hairpin" in fwd[1]  # the hairpin drop stays first
    assert fwd[2].startswith("ct state established ct mark @generation accept")
    assert f"set generation {{ type mark; elements = {{ {gen:#x} }}; }}" in text
    # every accepting verdict of the policy goes through `allowed`, which marks TCP and
    # UDP flows (their key, daddr . proto . dport, is the same for every packet)
    assert _forward(text, "allowed") == [
        f"meta l4proto {{ tcp, udp }} ct mark set {gen:#x}",
        "accept",
    ]
    assert "@u4096_allow counter goto allowed" in text
    assert "@global_allow counter goto allowed" in text
    egress = _forward(text, "egress")
    assert " accept" not in " ".join(egress)
    # a changed policy: a new generation in the same transaction as the sets
    raw = _raw()
    raw.user_pol = {"alice": {"egress": [{"proto": "tcp", "ports": "9001"}]}}
    new, _ = build_state(raw)
    cmd = update(st, new)
    assert cmd is not None and generation(new) != gen
    assert f"add element inet podnet_gw generation {{ {generation(new):#x} }}" in cmd
    assert f"ct mark set {generation(new):#x}" in cmd
    # another pod (an address reused by another user's job): a new generation too
    raw2 = _raw()
    raw2.ips["198.18.0.9"] = {"job_id": 9, "node": "c1", "vni": 4097}
    assert generation(build_state(raw2)[0]) != gen
    # a publication alone changes no egress verdict: same generation, no generation command
    raw3 = _raw()
    raw3.pubs = []
    st3, _ = build_state(raw3)
    if st3.published != st.published:
        cmd3 = update(st, st3)
        assert cmd3 is not None and "generation" not in cmd3
    assert generation(st3) == gen


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("unshare") is None,
    reason="needs root and nft (checks the table in a throwaway network namespace)",
)
def test_ruleset_and_updates_load_in_nft() -> None:
    old, _ = build_state(_raw())
    raw = _raw()
    raw.user_pol = {"bob": ALICE}
    new, _ = build_state(raw)
    text = ruleset("198.18.0.0/15", "ext0", "203.0.113.194", old)
    cmd = update(old, new)
    assert cmd
    r = _nft_twice(text, cmd)
    assert r.returncode == 0, r.stderr
    assert "u4097" in r.stdout and "u4096" not in r.stdout
    gen = f"0x{generation(new):08x}"  # nft prints a mark with 8 hex digits
    assert f"elements = {{ {gen} }}" in r.stdout and f"ct mark set {gen}" in r.stdout


def _nft_twice(first: str, second: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as d:
        a, b = Path(d, "a.nft"), Path(d, "b.nft")
        a.write_text(first)
        b.write_text(second)
        return subprocess.run(
            ["unshare", "--net", "sh", "-c", f"nft -f {a} && nft -f {b} && nft list ruleset"],
            capture_output=True,
            text=True,
            check=False,
        )


# -- publications -------------------------------------------------------------------------
@pytest.fixture
def etcd() -> FakeEtcd:
    e = FakeEtcd()
    keys = Keys("lab")
    e.put(keys.root + "gateway/config", {"external_ip": "203.0.113.194", "ports": "20000-20009"})
    e.put(keys.root + "gateway/policy/global", GLOBAL)
    e.put(
        keys.job(7),
        {
            "job_id": 7,
            "user": "alice",
            "uid": 2001,
            "name": "web",
            "label": "web",
            "size": 2,
            "vni": 4096,
        },
    )
    # each pod's node writes its marker (state/alloc: node-owned allocation)
    e.put(keys.job_node(7, "c1"), {"index": 0, "ip": "198.18.0.5"})
    e.put(keys.job_node(7, "c2"), {"index": 1, "ip": "198.18.0.70"})
    e.put(
        keys.job(8),
        {
            "job_id": 8,
            "user": "bob",
            "uid": 2002,
            "name": "x",
            "label": "x",
            "size": 1,
            "vni": 4097,
        },
    )
    e.put(keys.job_node(8, "c1"), {"index": 0, "ip": "198.18.0.6"})
    return e


def test_publish_own_pod_idempotent(etcd: FakeEtcd) -> None:
    keys = Keys("lab")
    a = publish.publish(etcd, keys, 2001, False, "7", 1, 8080)  # type: ignore[arg-type]
    assert a["address"] == "203.0.113.194:20000" and a["ip"] == "198.18.0.70"
    again = publish.publish(etcd, keys, 2001, False, "7", 1, 8080)  # type: ignore[arg-type]
    assert again["address"] == a["address"]
    listed = publish.list_published(etcd, keys, 2001)  # type: ignore[arg-type]
    assert [d["external_port"] for d in listed] == [20000]
    assert publish.list_published(etcd, keys, 2002) == []  # type: ignore[arg-type]


def test_publish_requested_port_in_range_is_kept(etcd: FakeEtcd) -> None:
    keys = Keys("lab")
    a = publish.publish(etcd, keys, 2002, False, "8", 0, 20005)  # type: ignore[arg-type]
    assert a["external_port"] == 20005


def test_publishing_another_users_pod_is_refused(etcd: FakeEtcd) -> None:
    keys = Keys("lab")
    with pytest.raises(PodnetError) as e:
        publish.publish(etcd, keys, 2002, False, "7", 0, 8080)  # type: ignore[arg-type]
    assert e.value.code == "EPERM"
    with pytest.raises(PodnetError) as e:
        publish.unpublish(etcd, keys, 2002, False, "7", 0, 8080)  # type: ignore[arg-type]
    assert e.value.code == "EPERM"
    assert publish.list_published(etcd, keys, None) == []  # type: ignore[arg-type]


def test_publish_quota_and_unpublish(etcd: FakeEtcd) -> None:
    keys = Keys("lab")
    publish.publish(etcd, keys, 2001, False, "7", 0, 80)  # type: ignore[arg-type]
    publish.publish(etcd, keys, 2001, False, "7", 0, 81)  # type: ignore[arg-type]
    with pytest.raises(QuotaExceeded) as q:
        publish.publish(etcd, keys, 2001, False, "7", 0, 82)  # type: ignore[arg-type]
    assert q.value.code == "EQUOTA" and q.value.details() == {
        "limit": "published",
        "value": 2,
        "held": 2,
    }
    assert "published ports per user is 2, and alice holds 2" in q.value.message
    assert publish.unpublish(etcd, keys, 2001, False, "7", 0, 80) == 1  # type: ignore[arg-type]
    publish.publish(etcd, keys, 2001, False, "7", 0, 82)  # type: ignore[arg-type]


def test_publish_bad_pod_index_and_no_gateway(etcd: FakeEtcd) -> None:
    keys = Keys("lab")
    with pytest.raises(PodnetError) as e:
        publish.publish(etcd, keys, 2001, False, "7", 5, 80)  # type: ignore[arg-type]
    assert e.value.code == "EINVAL"
    etcd.delete(keys.root + "gateway/config")
    with pytest.raises(PodnetError) as e:
        publish.publish(etcd, keys, 2001, False, "7", 0, 80)  # type: ignore[arg-type]
    assert e.value.code == "EUNAVAIL"
