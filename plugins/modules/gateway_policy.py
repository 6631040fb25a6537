#!/usr/bin/python
# Copyright (c) podnet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ansible module hpc.podnet.gateway_policy: the gateways' global and per-user policy in etcd."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gateway_policy
short_description: Write the podnet gateways' global and per-user egress and publish policy to etcd
version_added: 0.2.0
description:
  - Validates a global policy and per-user policies and stores them under
    C(/podnet/<cluster>/gateway/policy/) in etcd (C(global), C(users/<user>)), where
    podnet-gatewayd on every gateway applies them within a second (nftables sets).
  - Egress rules are evaluated per packet, first match wins - the user's deny rules, the
    user's allow rules, the global deny rules, the global allow rules, then the global
    C(default).
  - Users not in O(user_policies) lose their stored policy when O(exclusive=true).
  - Each key is written with a compare-and-swap on the revision read, as M(hpc.podnet.etcd_key).
author:
  - podnet developers (@podnet)
extends_documentation_fragment:
  - hpc.podnet.etcd
attributes:
  check_mode:
    support: full
    description: Reads the stored policies, reports what would change and writes nothing.
  diff_mode:
    support: full
    description: Shows every changed policy before and after, as YAML-like JSON.
options:
  cluster:
    description:
      - The podnet cluster name (C(podnet_cluster_name)); keys live under C(/podnet/<cluster>/).
    type: str
    required: true
  global_policy:
    description:
      - The global policy. C(default) is V(allow) or V(deny) (default V(deny)) - what happens to
        a packet no rule matches.
      - C(egress) is a list of rules, each with C(action) (V(allow)/V(deny), default V(allow)),
        C(cidr) (default C(0.0.0.0/0)), C(proto) (V(tcp), V(udp), V(icmp), V(any);
        default V(any)), C(ports) (for tcp/udp - C("80,443,8000-8100"); default every port)
        and an optional C(comment).
      - C(publish.max) is how many ports a user may publish (default 0 - none).
    type: dict
    default: {}
  user_policies:
    description:
      - Per-user policies keyed by user name, each with C(egress) rules and C(publish.max),
        which override the global C(publish.max) for that user.
    type: dict
    default: {}
  exclusive:
    description: Delete the stored policies of users not in O(user_policies).
    type: bool
    default: true
"""
EXAMPLES = r"""
- name: Egress to the site's web proxy and package mirror; alice may reach the license server
  hpc.podnet.gateway_policy:
    cluster: lab
    endpoints: ["https://198.51.100.10:2379"]
    global_policy:
      default: deny
      egress:
        - {action: allow, cidr: 203.0.113.0/24, proto: tcp, ports: "80,443"}
        - {action: deny, cidr: 203.0.113.7/32, proto: tcp, ports: "443", comment: old mirror}
      publish: {max: 2}
    user_policies:
      alice:
        egress:
          - {action: allow, cidr: 203.0.113.50/32, proto: tcp, ports: "27000-27009"}
        publish: {max: 5}
"""
RETURN = r"""
policies:
  description: The stored policies after the run (what they would be, in check mode), by key name
    (C(global), C(users/<user>)).
  returned: always
  type: dict
  sample:
    global:
      default: deny
      egress: [{"action": "allow", "cidr": "0.0.0.0/0", "proto": "icmp"}]
changed_keys:
  description: The keys written or deleted (or that would be, in check mode).
  returned: always
  type: list
  elements: str
  sample: [/podnet/lab/gateway/policy/users/alice]
"""

import json as jsonlib  # noqa: E402
import typing as t  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.hpc.podnet.plugins.module_utils._etcd_gateway import (  # noqa: E402
    ETCD_COMMON_ARGUMENT_SPEC,
    EtcdGateway,
    run_module,
)
from ansible_collections.hpc.podnet.plugins.module_utils._gateway_policy import (  # noqa: E402
    PolicyError,
    canonical_policy,
)

CAS_ATTEMPTS = 5


class GatewayPolicyError(Exception):
    """A usage or state problem with a message for fail_json."""


def _text(data: t.Any) -> str:
    return jsonlib.dumps(data, sort_keys=True, separators=(",", ":"))


def _pretty(data: t.Any) -> str:
    return "" if data is None else jsonlib.dumps(data, indent=2, sort_keys=True) + "\n"


def desired(params: dict[str, t.Any]) -> dict[str, t.Any]:
    """The policies to store, by key name below `gateway/policy/`."""
    want: dict[str, t.Any] = {}
    try:
        want["global"] = canonical_policy(params["global_policy"] or {}, "global_policy")
        for user, pol in sorted((params["user_policies"] or {}).items()):
            if not user or "/" in user:
                raise PolicyError(f"user_policies: bad user name {user!r}")
            want[f"users/{user}"] = canonical_policy(pol, f"user_policies.{user}", user=True)
    except PolicyError as e:
        raise GatewayPolicyError(str(e)) from None
    return want


def _write(gw: EtcdGateway, key: str, data: t.Any, cur: dict[str, t.Any] | None) -> None:
    for _attempt in range(CAS_ATTEMPTS):
        if gw.put_if_unchanged(key, _text(data), cur["mod_revision"] if cur else 0):
            return
        again, _rev = gw.get(key)
        cur = again[0] if again else None
    raise GatewayPolicyError(f"{key} changed concurrently; giving up")


def _stored(cur: dict[str, t.Any] | None) -> t.Any:
    if cur is None:
        return None
    try:
        return jsonlib.loads(cur["value"])
    except ValueError:
        return cur["value"]


def run(params: dict[str, t.Any], check_mode: bool, gw: EtcdGateway) -> dict[str, t.Any]:
    cluster: str = params["cluster"]
    if not cluster or "/" in cluster:
        raise GatewayPolicyError("option cluster must be a cluster name")
    base = f"/podnet/{cluster}/gateway/policy/"
    want = desired(params)
    kvs, _rev = gw.get(base, prefix=True)
    have: dict[str, dict[str, t.Any]] = {kv["key"][len(base) :]: kv for kv in kvs}
    before: dict[str, t.Any] = {}
    after: dict[str, t.Any] = {}
    for name in sorted(set(want) | set(have)):
        cur = have.get(name)
        if name not in want and (not name.startswith("users/") or not params["exclusive"]):
            continue
        if name in want and _stored(cur) == want[name]:
            continue
        before[name], after[name] = _stored(cur), want.get(name)
        if check_mode:
            continue
        if name in want:
            _write(gw, base + name, want[name], cur)
        else:
            gw.delete(base + name)
    return {
        "changed": bool(after),
        "changed_keys": [base + n for n in sorted(after)],
        "policies": want,
        "diff": {
            "before": "".join(f"{k}: {_pretty(v)}" for k, v in sorted(before.items()) if v),
            "after": "".join(f"{k}: {_pretty(v)}" for k, v in sorted(after.items()) if v),
            "before_header": base,
            "after_header": base,
        },
    }


def main() -> None:
    argument_spec: dict[str, t.Any] = dict(ETCD_COMMON_ARGUMENT_SPEC)
    argument_spec.update(
        cluster={"type": "str", "required": True},
        global_policy={"type": "dict", "default": {}},
        user_policies={"type": "dict", "default": {}},
        exclusive={"type": "bool", "default": True},
    )
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    run_module(module, run, (GatewayPolicyError,))


if __name__ == "__main__":
    main()
