#!/usr/bin/python
# Copyright (c) podnet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ansible module hpc.podnet.etcd_key: one etcd key (or a prefix) through the v3 JSON gateway."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: etcd_key
short_description: Read, write or delete etcd keys (v3 API, TLS client certificates)
version_added: 0.2.0
description:
  - Writes a key to etcd when its value differs, or deletes a key or a key prefix, through
    etcd's v3 JSON gateway. M(hpc.podnet.etcd_key_info) reads keys.
  - Values given with O(json) are compared semantically (key order and spacing do not matter)
    and written in a canonical compact form with sorted keys.
  - A write is a compare-and-swap transaction on the revision that was read, so a concurrent
    writer is never overwritten silently.
author:
  - podnet developers (@podnet)
extends_documentation_fragment:
  - hpc.podnet.etcd
  - hpc.podnet.etcd.attributes
attributes:
  check_mode:
    support: full
    description: Reads the key, reports what would change and writes nothing.
  diff_mode:
    support: full
    description: Shows the value before and after (JSON values pretty-printed).
options:
  key:
    description:
      - The key, for example C(/podnet/lab/config). With O(prefix=true), the prefix.
    type: str
    required: true
  value:
    description:
      - The value to store, as a string (compared byte for byte).
      - Mutually exclusive with O(json). One of them is required with O(state=present).
    type: str
  json:
    description:
      - A dict or list (or any JSON value) to store as JSON. Compared semantically with the stored
        value; a stored value that is not JSON counts as different.
      - A string is parsed as JSON text.
    type: raw
  state:
    description:
      - V(present) writes the value when it differs.
      - V(absent) deletes the key (or every key under the prefix).
    type: str
    choices: [present, absent]
    default: present
  prefix:
    description:
      - Treat O(key) as a prefix (O(state=absent) only; M(hpc.podnet.etcd_key_info) reads
        prefixes).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Store the cluster configuration as JSON
  hpc.podnet.etcd_key:
    key: /podnet/lab/config
    json:
      pod_cidr: 198.18.0.0/15
      block_prefix: 26
    endpoints: ["https://198.51.100.10:2379"]

- name: Plain string value, certificates in non-default places
  hpc.podnet.etcd_key:
    key: /podnet/lab/motd
    value: hello
    ca_cert: /etc/etcd/pki/ca.crt
    client_cert: /etc/etcd/pki/admin.crt
    client_key: /etc/etcd/pki/admin.key

- name: Delete every key of a node
  hpc.podnet.etcd_key:
    key: /podnet/lab/nodes/c1/
    prefix: true
    state: absent
"""

RETURN = r"""
key:
  description: The key (or prefix) the module worked on.
  returned: always
  type: str
  sample: /podnet/lab/config
exists:
  description: Whether the key exists after the run (with O(prefix), whether any key does).
  returned: always
  type: bool
value:
  description: The value after the run (what it would be, in check mode); null when absent.
  returned: when O(prefix=false)
  type: str
  sample: '{"block_prefix":26,"pod_cidr":"198.18.0.0/15"}'
json:
  description: RV(value) parsed as JSON; null when it is absent or not JSON.
  returned: when O(prefix=false)
  type: raw
  sample: {"block_prefix": 26, "pod_cidr": "198.18.0.0/15"}
previous_value:
  description: The value before the run; null when the key did not exist.
  returned: when O(prefix=false)
  type: str
mod_revision:
  description: etcd modification revision of the key after the run (0 when absent or in check mode
    before a write).
  returned: when O(prefix=false)
  type: int
version:
  description: etcd version counter of the key after the run (0 when absent).
  returned: when O(prefix=false)
  type: int
kvs:
  description:
    - With O(prefix=true), the keys deleted (O(state=absent)) with their values.
  returned: when O(prefix=true)
  type: list
  elements: dict
  sample: [{"key": "/podnet/lab/nodes/c1", "value": "{}"}]
deleted:
  description: Number of keys deleted (or that would be, in check mode).
  returned: when O(state=absent)
  type: int
"""

import json as jsonlib  # noqa: E402
import typing as t  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.hpc.podnet.plugins.module_utils._etcd_gateway import (  # noqa: E402
    ETCD_COMMON_ARGUMENT_SPEC,
    EtcdGateway,
    run_module,
)

CAS_ATTEMPTS = 5


class EtcdKeyError(Exception):
    """A usage or state problem with a message for fail_json."""


def canonical_json(data: t.Any) -> str:
    return jsonlib.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def json_equal(a: t.Any, b: t.Any) -> bool:
    """JSON equality that, unlike ==, tells true from 1 and 1.0 from 1 only where JSON does not."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=False))
    return type(a) is type(b) and a == b


def parse_json(text: str | None) -> t.Any:
    if text is None:
        return None
    try:
        return jsonlib.loads(text)
    except ValueError:
        return None


def _pretty(text: str | None, as_json: bool) -> str:
    if text is None:
        return ""
    if as_json:
        parsed = parse_json(text)
        if parsed is not None or text.strip() == "null":
            return jsonlib.dumps(parsed, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return text if text.endswith("\n") else text + "\n"


def _single_result(key: str, kv: dict[str, t.Any] | None, previous: str | None) -> dict[str, t.Any]:
    value = kv["value"] if kv else None
    return {
        "key": key,
        "exists": kv is not None,
        "value": value,
        "json": parse_json(value),
        "previous_value": previous,
        "mod_revision": kv["mod_revision"] if kv else 0,
        "version": kv["version"] if kv else 0,
    }


def desired_value(params: dict[str, t.Any]) -> tuple[str, t.Any, bool]:
    """Return (text to store, parsed JSON or None, is_json)."""
    if params.get("json") is not None:
        data = params["json"]
        if isinstance(data, str):
            try:
                data = jsonlib.loads(data)
            except ValueError as exc:
                raise EtcdKeyError(f"option json: not valid JSON text: {exc}") from exc
        try:
            return canonical_json(data), data, True
        except (TypeError, ValueError) as exc:
            raise EtcdKeyError(f"option json: value cannot be encoded as JSON: {exc}") from exc
    return params["value"], None, False


def run(params: dict[str, t.Any], check_mode: bool, gw: EtcdGateway) -> dict[str, t.Any]:
    key: str = params["key"]
    state: str = params["state"]
    prefix: bool = params["prefix"]
    if not key:
        raise EtcdKeyError("option key must not be empty")
    if prefix and state == "present":
        raise EtcdKeyError("prefix=true is only valid with state=absent")

    if state == "absent":
        return _absent(key, prefix, check_mode, gw)
    return _present(params, key, check_mode, gw)


def _absent(key: str, prefix: bool, check_mode: bool, gw: EtcdGateway) -> dict[str, t.Any]:
    kvs, _rev = gw.get(key, prefix=prefix)
    if kvs and not check_mode:
        kvs = gw.delete(key, prefix=prefix)
    before = "".join("{} = {}\n".format(kv["key"], kv["value"]) for kv in kvs)
    result: dict[str, t.Any] = {
        "changed": bool(kvs),
        "key": key,
        "deleted": len(kvs),
        "diff": {"before": before, "after": "", "before_header": key, "after_header": key},
    }
    if prefix:
        result["exists"] = False
        result["kvs"] = [{"key": kv["key"], "value": kv["value"]} for kv in kvs]
    else:
        result.update(_single_result(key, None, kvs[0]["value"] if kvs else None))
    return result


def _present(
    params: dict[str, t.Any], key: str, check_mode: bool, gw: EtcdGateway
) -> dict[str, t.Any]:
    text, data, is_json = desired_value(params)
    for _attempt in range(CAS_ATTEMPTS):
        kvs, _rev = gw.get(key)
        current = kvs[0] if kvs else None
        previous = current["value"] if current else None
        if current is not None:
            if is_json:
                stored = parse_json(previous)
                same = (stored is not None or previous == "null") and json_equal(stored, data)
            else:
                same = previous == text
        else:
            same = False
        diff = {
            "before": _pretty(previous, is_json),
            "after": _pretty(previous if same else text, is_json),
            "before_header": key,
            "after_header": key,
        }
        if same:
            return dict(changed=False, diff=diff, **_single_result(key, current, previous))
        if check_mode:
            would = {"value": text, "mod_revision": 0, "version": 0}
            return dict(changed=True, diff=diff, **_single_result(key, would, previous))
        if gw.put_if_unchanged(key, text, current["mod_revision"] if current else 0):
            after, _rev = gw.get(key)
            return dict(
                changed=True,
                diff=diff,
                **_single_result(key, after[0] if after else None, previous),
            )
    raise EtcdKeyError(
        f"key {key} changed concurrently {CAS_ATTEMPTS} times while writing it; giving up"
    )


def main() -> None:
    argument_spec: dict[str, t.Any] = dict(ETCD_COMMON_ARGUMENT_SPEC)
    argument_spec.update(
        key={"type": "str", "required": True, "no_log": False},
        value={"type": "str"},
        json={"type": "raw"},
        state={"type": "str", "choices": ["present", "absent"], "default": "present"},
        prefix={"type": "bool", "default": False},
    )
    module = AnsibleModule(
        argument_spec=argument_spec,
        mutually_exclusive=[("value", "json")],
        required_if=[("state", "present", ("value", "json"), True)],
        supports_check_mode=True,
    )
    run_module(module, run, (EtcdKeyError,))


if __name__ == "__main__":
    main()
