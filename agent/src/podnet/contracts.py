# SPDX-License-Identifier: Apache-2.0
"""The contracts between podnet's languages (contracts.toml, shipped in the package): the
etcd key layout and the cluster configuration's defaults, read here once; the roles, the
CoreDNS plugin and the Ansible modules keep copies that tests/unit/python/test_contracts.py
checks against the same file."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

_DATA: dict[str, Any] = tomllib.loads(Path(__file__).with_name("contracts.toml").read_text())

#: `/podnet/{cluster}/`: every record of a cluster lives under it
ETCD_ROOT: str = _DATA["etcd"]["root"]
#: name -> key under the root, with its fields in braces (`ips/{ip}`)
ETCD_KEYS: dict[str, str] = dict(_DATA["etcd"]["keys"])
#: what a node's etcd role may write: shared, own (`{node}`), a gateway's
NODE_WRITES: dict[str, list[str]] = {k: list(v) for k, v in _DATA["etcd"]["node_writes"].items()}
#: the SkyDNS prefix of the DNS records (`/skydns/`), and that of the PTR records
DNS_ROOT: str = _DATA["dns"]["skydns"]
DNS_PTR: str = _DATA["dns"]["ptr"]
#: the cluster configuration's defaults (setting -> value)
CLUSTER_DEFAULTS: dict[str, Any] = dict(_DATA["cluster"])
#: the settings written from cluster-wide inventory variables (setting -> {variable, default});
#: no default: the variable is required
CLUSTER_INVENTORY: dict[str, dict[str, Any]] = {
    k: dict(v) for k, v in _DATA["cluster_inventory"].items()
}
