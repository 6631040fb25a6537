#!/usr/bin/python
# Copyright (c) podnet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ansible module hpc.podnet.etcd_key_info: read an etcd key (or a prefix)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: etcd_key_info
short_description: Read etcd keys (v3 API, TLS client certificates)
version_added: 0.2.0
description:
  - Reads one key, or every key under a prefix, through etcd's v3 JSON gateway.
  - Never changes anything; a missing key is not an error (RV(exists=false)).
author:
  - podnet developers (@podnet)
extends_documentation_fragment:
  - hpc.podnet.etcd
  - hpc.podnet.etcd.attributes
attributes:
  check_mode:
    support: full
    description:
      - Reads only; runs the same in check mode, except before etcd is deployed (its client
        certificate files missing), where it reports the key as not existing.
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to diff.
options:
  key:
    description: The key, or the prefix with O(prefix=true).
    type: str
    required: true
  prefix:
    description: Read every key that starts with O(key).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Read podnet's cluster configuration
  hpc.podnet.etcd_key_info:
    endpoints: ["https://198.51.100.10:2379"]
    ca_cert: /etc/podnet/pki/ca.crt
    client_cert: /etc/podnet/pki/admin.crt
    client_key: /etc/podnet/pki/admin.key
    key: /podnet/lab/config
  register: cfg

- name: Use it
  ansible.builtin.debug:
    msg: "{{ cfg.json.pod_cidr }}"

- name: List the registered nodes
  hpc.podnet.etcd_key_info:
    endpoints: ["https://198.51.100.10:2379"]
    ca_cert: /etc/podnet/pki/ca.crt
    client_cert: /etc/podnet/pki/admin.crt
    client_key: /etc/podnet/pki/admin.key
    key: /podnet/lab/nodes/
    prefix: true
  register: nodes
"""

RETURN = r"""
key:
  description: The key or prefix read.
  returned: always
  type: str
exists:
  description: Whether the key (any key under the prefix) exists.
  returned: always
  type: bool
value:
  description: The value as text.
  returned: when O(prefix=false) and the key exists
  type: str
json:
  description: The value parsed as JSON (null when it is not JSON).
  returned: when O(prefix=false)
  type: raw
mod_revision:
  description: etcd modification revision of the key (0 when absent).
  returned: when O(prefix=false)
  type: int
version:
  description: etcd version counter of the key (0 when absent).
  returned: when O(prefix=false)
  type: int
kvs:
  description: With O(prefix=true), the keys found with their values.
  returned: when O(prefix=true)
  type: list
  elements: dict
  sample: [{"key": "/podnet/lab/nodes/c1", "value": "{}"}]
"""

import json as jsonlib  # noqa: E402
import typing as t  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.hpc.podnet.plugins.module_utils._etcd_gateway import (  # noqa: E402
    ETCD_COMMON_ARGUMENT_SPEC,
    EtcdGateway,
    EtcdGatewayError,
    check_mode_not_deployed,
    gateway_from_module_params,
)


def _parse_json(text: str | None) -> t.Any:
    if text is None:
        return None
    try:
        return jsonlib.loads(text)
    except ValueError:
        return None


def read(key: str, prefix: bool, gw: EtcdGateway) -> dict[str, t.Any]:
    if not key:
        raise EtcdGatewayError("option key must not be empty")
    kvs, _rev = gw.get(key, prefix=prefix)
    if prefix:
        return {
            "changed": False,
            "key": key,
            "exists": bool(kvs),
            "kvs": [{"key": kv["key"], "value": kv["value"]} for kv in kvs],
        }
    kv = kvs[0] if kvs else None
    value = kv["value"] if kv else None
    return {
        "changed": False,
        "key": key,
        "exists": kv is not None,
        "value": value,
        "json": _parse_json(value),
        "mod_revision": kv["mod_revision"] if kv else 0,
        "version": kv["version"] if kv else 0,
    }


def main() -> None:
    argument_spec: dict[str, t.Any] = dict(ETCD_COMMON_ARGUMENT_SPEC)
    argument_spec.update(
        key={"type": "str", "required": True, "no_log": False},
        prefix={"type": "bool", "default": False},
    )
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    # check mode before etcd is deployed: the key does not exist (yet)
    empty: dict[str, t.Any] = (
        {"kvs": []}
        if module.params["prefix"]
        else {"value": None, "json": None, "mod_revision": 0, "version": 0}
    )
    check_mode_not_deployed(module, changed=False, key=module.params["key"], exists=False, **empty)
    try:
        result = read(
            module.params["key"], module.params["prefix"], gateway_from_module_params(module.params)
        )
    except EtcdGatewayError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
