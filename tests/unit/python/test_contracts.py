# SPDX-License-Identifier: Apache-2.0
"""The contracts between podnet's languages (agent/src/podnet/contracts.toml) against every
copy the other languages keep: the roles' etcd permissions, key paths and cluster
configuration, the CoreDNS plugin (Go), the gateway_policy module. podnet itself reads the
file at run time (names.Keys, config.ClusterConfig); a copy that drifts fails here."""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from podnet import contracts
from podnet.config import ClusterConfig
from podnet.names import Keys, ptr_key, zone_path

ROOT = Path(__file__).resolve().parents[3]
CLUSTER = "{{ podnet_cluster_name }}"
#: the root as the roles write it
ROLE_ROOT = contracts.ETCD_ROOT.format(cluster=CLUSTER)


def _yaml(path: str) -> Any:
    return yaml.safe_load((ROOT / path).read_text())


def _known(path: str) -> bool:
    """Whether `path` (under the root; a prefix of keys, ending in / or not) is one the
    layout has: the start of a key template, each {field} one segment."""
    segs = path.split("/")
    prefix = path.endswith("/")
    if prefix:
        segs = segs[:-1]
    for template in contracts.ETCD_KEYS.values():
        t = template.split("/")
        if (len(segs) >= len(t)) if prefix else (len(segs) != len(t)):
            continue
        if all(p == s or (s[:1] == "{" and p) for s, p in zip(t, segs, strict=False)):
            return True
    return False


def _paths(text: str, *before: str) -> list[str]:
    """The key paths under the root that follow one of `before` (regular expressions) in
    `text`, up to a quote, a space or a Jinja expression."""
    out = []
    for b in before:
        out += re.findall(b + r"([A-Za-z0-9_./-]+)", text)
    return out


# -- the layout itself and podnet's Python ------------------------------------------------


def test_every_key_has_one_method_and_the_layout_reads() -> None:
    k = Keys("lab")
    assert k.root == "/podnet/lab/" == contracts.ETCD_ROOT.format(cluster="lab")
    attrs = {"config", "gateway_config", "records_gc"}
    methods = {n for n in vars(Keys) if not n.startswith("_")} | attrs
    methods -= {"prefix"}
    names = set(contracts.ETCD_KEYS) - {"gateway_user_policy"}  # gateway_policy(user)
    assert methods == names
    assert k.ip("198.18.0.2") == "/podnet/lab/ips/198.18.0.2"
    assert k.block("198.18.0.0/26") == "/podnet/lab/blocks/198.18.0.0-26"
    assert k.quota("alice", "logins") == "/podnet/lab/quota/alice/logins/"
    assert k.gateway_policy("alice") == "/podnet/lab/gateway/policy/users/alice"
    assert zone_path("a.lab") == contracts.DNS_ROOT + "lab/a"
    assert ptr_key("10.1.2.3") == contracts.DNS_PTR + "10/1/2/3"
    assert _known("ips/") and _known("jobnodes/7/") and not _known("ipz/")
    assert _known("gateway/config") and not _known("gateway/config/")


def test_the_python_defaults_are_the_contracts() -> None:
    cc = ClusterConfig(ipaddress.IPv4Network("198.18.0.0/16"), 26, "lab")
    for setting, value in contracts.CLUSTER_DEFAULTS.items():
        assert getattr(cc, setting) == value, setting


# -- the roles ---------------------------------------------------------------------------


def _agent_etcd_tasks() -> tuple[str, list[dict[str, Any]]]:
    path = "roles/agent/tasks/etcd.yml"
    return (ROOT / path).read_text(), _yaml(path)


def test_the_node_etcd_role_grants_what_the_contract_says() -> None:
    text, tasks = _agent_etcd_tasks()
    role = next(t for t in tasks if "__agent_etcd_role" in t.get("ansible.builtin.set_fact", {}))
    assert role["vars"]["__p"] == ROLE_ROOT
    writes = contracts.NODE_WRITES
    assert role["vars"]["__shared"] == writes["shared"]
    perms = role["ansible.builtin.set_fact"]["__agent_etcd_role"]["permissions"]
    for own in writes["own"]:  # 'logins/' ~ inventory_hostname ~ '/' and __p ~ 'alive/' ~ ...
        want = "'" + own.replace("{node}", "' ~ inventory_hostname ~ '") + "'"
        want = want.replace(" ~ ''", "")
        assert want in perms, own
    for key in writes["gateway"]:
        assert f"__p ~ '{key}'" in perms, key
    dns = re.findall(r"'(/skydns/[^']*)'", perms)
    assert dns == [contracts.DNS_ROOT, contracts.DNS_PTR]
    for path in _paths(text, r"__p ~ '", re.escape(ROLE_ROOT)):
        assert _known(path), f"roles/agent/tasks/etcd.yml: {path}"


def test_the_cluster_configuration_the_role_writes_has_podnets_settings_and_defaults() -> None:
    _text, tasks = _agent_etcd_tasks()
    expr = tasks[0]["ansible.builtin.set_fact"]["__agent_cluster_config"]
    written = dict(re.findall(r"'(\w+)': *\(?(\w+)", expr))
    fields = {f.name for f in dataclasses.fields(ClusterConfig)}
    assert set(written) == fields, "the role writes what podnetd reads"
    defaults = _yaml("roles/agent/defaults/main.yml")
    specs = _yaml("roles/agent/meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    for setting, value in contracts.CLUSTER_DEFAULTS.items():
        var = f"agent_{setting}"
        assert written[setting] == var, setting
        assert defaults[var] == value, f"roles/agent/defaults/main.yml: {var}"
        assert specs[var]["default"] == value, f"roles/agent/meta/argument_specs.yml: {var}"


def test_the_settings_from_inventory_variables_have_the_cluster_wide_defaults() -> None:
    """pod_cidr, block_prefix, zone, search_domains, egress_gateway: the agent role writes them
    from cluster-wide inventory variables, whose defaults are hpc.podnet.podnet's (its
    defaults/main.yml and argument spec); a required one (zone) has none there."""
    _text, tasks = _agent_etcd_tasks()
    expr = tasks[0]["ansible.builtin.set_fact"]["__agent_cluster_config"]
    written = dict(re.findall(r"'(\w+)': *\(?(\w+)", expr))
    defaults = _yaml("roles/podnet/defaults/main.yml")
    specs = _yaml("roles/podnet/meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    fields = {f.name: f for f in dataclasses.fields(ClusterConfig)}
    assert set(contracts.CLUSTER_INVENTORY) <= set(fields)
    from_inventory = {s for s, v in written.items() if v.startswith("podnet_")}
    assert from_inventory == set(contracts.CLUSTER_INVENTORY), "every podnet_* setting is listed"
    for setting, contract in contracts.CLUSTER_INVENTORY.items():
        var = contract["variable"]
        assert written[setting] == var, setting
        if "default" not in contract:
            assert var not in defaults and var not in specs, f"{var} is required: no default"
            continue
        want = contract["default"]
        assert defaults[var] == want, f"roles/podnet/defaults/main.yml: {var}"
        assert specs[var]["default"] == want, f"roles/podnet/meta/argument_specs.yml: {var}"
        field = fields[setting]
        if field.default_factory is not dataclasses.MISSING:
            assert field.default_factory() == want, f"ClusterConfig.{setting}"
        elif field.default is not dataclasses.MISSING:
            assert field.default == want, f"ClusterConfig.{setting}"


def test_remove_node_and_backup_name_keys_of_the_layout() -> None:
    assert _yaml("roles/remove_node/vars/main.yml")["__remove_node_root"] == ROLE_ROOT
    text = (ROOT / "roles/remove_node/tasks/etcd.yml").read_text()
    paths = _paths(text, r"__remove_node_root ~ '")
    read = next(
        t
        for t in _yaml("roles/remove_node/tasks/etcd.yml")[0]["block"]
        if "loop" in t and "etcd_key_info" in str(t)
    )
    paths += [f"{d}/" for d in read["loop"]]
    assert paths and all(_known(p) for p in paths), paths
    assert f"dict({[str(d) for d in read['loop']]}" in text  # the same list, twice
    backup = (ROOT / "roles/backup/tasks/main.yml").read_text()
    paths = _paths(backup, re.escape(ROLE_ROOT))
    assert paths and all(_known(p) for p in paths), paths


def test_coredns_role_and_plugin_follow_the_layout() -> None:
    defaults = _yaml("roles/coredns/defaults/main.yml")
    assert defaults["coredns_name_privacy_state_prefix"] == ROLE_ROOT
    assert defaults["coredns_etcd_path"].rstrip("/") + "/" == contracts.DNS_ROOT
    go = (ROOT / "agent/artifacts/coredns/plugin/privacy/owners.go").read_text()
    paths = set(_paths(go, r'state\+"'))
    assert paths == {"ips/", "users/"}, "owners.go follows the addresses and the users"
    assert all(_known(p) for p in paths)


def test_the_gateway_policy_module_writes_the_policy_keys() -> None:
    text = (ROOT / "plugins/modules/gateway_policy.py").read_text()
    (base,) = re.findall(r'f"/podnet/\{cluster\}/([^"]+)"', text)
    assert contracts.ETCD_KEYS["gateway_policy"].startswith(base)
    assert contracts.ETCD_KEYS["gateway_user_policy"].startswith(base + "users/")


@pytest.mark.parametrize(
    "path,ok",
    [("ips/", True), ("addresses/", False), ("jobs/7", True), ("jobs/7/x", False)],
)
def test_a_path_outside_the_layout_is_refused(path: str, ok: bool) -> None:
    assert _known(path) is ok
