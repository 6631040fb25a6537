#!/usr/bin/python
# Copyright (c) podnet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ansible module hpc.podnet.etcd_auth: etcd users, roles, key-range permissions, auth on/off."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: etcd_auth
short_description: Manage etcd authentication (users, roles, key-range permissions)
version_added: 0.2.0
description:
  - Creates, changes and deletes etcd users and roles, grants roles key-range permissions, and
    turns etcd authentication on or off, through etcd's v3 JSON gateway (C(/v3/auth/...)).
  - With etcd's C(--client-cert-auth), a gRPC client (etcdctl, CoreDNS) authenticates as the
    user named by its certificate's common name, so users of certificate clients need no
    password. etcd's JSON gateway ignores that name once authentication is on; gateway
    clients (this collection's modules) then log in with O(login_user) and O(login_password).
  - Only the users and roles listed are managed; others are left alone.
  - etcd refuses to turn authentication on unless user C(root) exists and has role C(root);
    the module checks that first and says so.
author:
  - podnet developers (@podnet)
extends_documentation_fragment:
  - hpc.podnet.etcd
  - hpc.podnet.etcd.attributes
attributes:
  check_mode:
    support: full
    description:
      - Reads users, roles and the authentication status; reports the changes it would make.
  diff_mode:
    support: full
    description: Shows the managed users, roles and the authentication status before and after.
options:
  roles:
    description:
      - Roles to manage. The built-in role C(root) (all keys, all operations) cannot be listed.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: Role name.
        type: str
        required: true
      state:
        description: V(absent) deletes the role (etcd also takes it away from its users).
        type: str
        choices: [present, absent]
        default: present
      permissions:
        description:
          - The role's permissions, exactly (permissions of the role not listed are revoked).
        type: list
        elements: dict
        default: []
        suboptions:
          key:
            description: The key, or the prefix with O(roles[].permissions[].prefix=true).
            type: str
            required: true
          prefix:
            description:
              - The permission covers every key that starts with O(roles[].permissions[].key).
            type: bool
            default: false
          range_end:
            description:
              - End of the key range (exclusive), as etcd's C(range_end).
              - Only with O(roles[].permissions[].prefix=false).
            type: str
          type:
            description: What the role may do on the range.
            type: str
            choices: [read, write, readwrite]
            default: read
  users:
    description:
      - Users to manage.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: User name (for a certificate client, the certificate's common name).
        type: str
        required: true
      state:
        description: V(absent) deletes the user; its certificate is refused from then on.
        type: str
        choices: [present, absent]
        default: present
      roles:
        description: The user's roles, exactly (roles not listed are revoked). C(root) is allowed.
        type: list
        elements: str
        default: []
      password:
        description:
          - Password for a new user (and for an existing one with O(update_password=always)).
          - Without it the user is created without a password (certificate authentication only).
        type: str
  update_password:
    description:
      - V(on_create) sets O(users[].password) only when the user is created (etcd cannot say
        whether a password matches without logging in); V(always) sets it on every run (reports
        changed).
    type: str
    choices: [on_create, always]
    default: on_create
  enabled:
    description:
      - V(true) turns etcd authentication on (after the users and roles are in place), V(false)
        turns it off (before any other change). Not given, it is left as it is.
      - Reading the status needs etcd 3.5 or later (C(/v3/auth/status)).
    type: bool
notes:
  - Everything is read first and the changes are then applied one by one; each etcd auth call is
    atomic, a run is not. Running it again finishes an interrupted run.
"""

EXAMPLES = r"""
- name: CoreDNS may read its records, podnetd of node c1 may change podnet's state
  hpc.podnet.etcd_auth:
    endpoints: ["https://198.51.100.10:2379"]
    roles:
      - name: podnet-dns-read
        permissions:
          - {key: /skydns/, prefix: true, type: read}
      - name: podnet-node
        permissions:
          - {key: /podnet/lab/, prefix: true, type: readwrite}
          - {key: /skydns/, prefix: true, type: readwrite}
    users:
      - {name: root, roles: [root]}
      - {name: coredns, roles: [podnet-dns-read]}
      - {name: podnetd-c1, roles: [podnet-node]}

- name: Turn authentication on (root must exist with role root)
  hpc.podnet.etcd_auth:
    enabled: true

- name: Revoke node c2 (its certificate is refused once authentication is on)
  hpc.podnet.etcd_auth:
    users:
      - {name: podnetd-c2, state: absent}
    login_user: root
    login_password: "{{ etcd_root_password }}"
"""

RETURN = r"""
enabled:
  description: Whether etcd authentication is on after the run (what it would be, in check mode).
  returned: always
  type: bool
actions:
  description: The changes made (or that would be made, in check mode), in order.
  returned: always
  type: list
  elements: str
  sample:
    - add role podnet-dns-read
    - grant podnet-dns-read read /skydns/ (prefix)
    - add user coredns
users:
  description:
    - The managed users after the run, by name, with their roles; absent users are left out.
  returned: always
  type: dict
  sample: {"coredns": {"roles": ["podnet-dns-read"]}}
roles:
  description:
    - The managed roles after the run, by name, with their permissions; absent roles are left out.
  returned: always
  type: dict
  sample:
    podnet-dns-read:
      - {"type": "read", "key": "/skydns/", "range_end": "/skydns0", "prefix": true}
"""

import json as jsonlib  # noqa: E402
import typing as t  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.hpc.podnet.plugins.module_utils._etcd_gateway import (  # noqa: E402
    ETCD_COMMON_ARGUMENT_SPEC,
    EtcdGateway,
    EtcdGatewayError,
    prefix_end,
    run_module,
)

ROOT = "root"
_NOT_FOUND = ("user name not found", "role name not found")

Perm = tuple[str, str, str]  # (type, key, range_end)


class EtcdAuthError(Exception):
    """A usage or state problem with a message for fail_json."""


def _perm_key(perm: dict[str, t.Any]) -> Perm:
    return (perm["type"], perm["key"], perm["range_end"])


def desired_perms(role: dict[str, t.Any]) -> list[dict[str, str]]:
    out: dict[tuple[str, str], dict[str, str]] = {}
    for item in role.get("permissions") or []:
        key = item["key"]
        if item.get("prefix"):
            if item.get("range_end"):
                raise EtcdAuthError(
                    f"role {role['name']}: permission {key}: give prefix or range_end, not both"
                )
            end = prefix_end(key)
        else:
            end = item.get("range_end") or ""
        if not key and not end:
            raise EtcdAuthError(f"role {role['name']}: a permission needs a key")
        rng = (key, end)
        if rng in out and out[rng]["type"] != item["type"]:
            raise EtcdAuthError(
                f"role {role['name']}: the range {describe_range(key, end)} is listed twice "
                "with different types (etcd keeps one type per range)"
            )
        out[rng] = {"type": item["type"], "key": key, "range_end": end}
    return sorted(out.values(), key=lambda p: (p["key"], p["range_end"]))


def describe_range(key: str, end: str) -> str:
    if not end:
        return key
    if end == prefix_end(key):
        return f"{key} (prefix)"
    return f"[{key}, {end})"


def perm_view(perm: dict[str, str]) -> dict[str, t.Any]:
    return {
        "type": perm["type"],
        "key": perm["key"],
        "range_end": perm["range_end"],
        "prefix": bool(perm["range_end"]) and perm["range_end"] == prefix_end(perm["key"]),
    }


def _missing(exc: EtcdGatewayError) -> bool:
    return any(m in str(exc) for m in _NOT_FOUND)


class State:
    """What etcd holds for the managed names (None: the user or role does not exist)."""

    def __init__(self, enabled: bool | None) -> None:
        self.enabled = enabled
        self.users: dict[str, list[str] | None] = {}
        self.roles: dict[str, list[dict[str, str]] | None] = {}

    def view(self) -> dict[str, t.Any]:
        return {
            "enabled": self.enabled,
            "users": {n: {"roles": r} for n, r in sorted(self.users.items()) if r is not None},
            "roles": {
                n: [perm_view(p) for p in perms]
                for n, perms in sorted(self.roles.items())
                if perms is not None
            },
        }


def read_state(gw: EtcdGateway, params: dict[str, t.Any]) -> State:
    enabled = gw.auth_enabled() if params.get("enabled") is not None else None
    st = State(enabled)
    names = {u["name"] for u in params["users"]}
    if params.get("enabled"):
        names.add(ROOT)  # etcd's condition for turning authentication on
    existing_users = set(gw.user_list())
    for name in sorted(names):
        st.users[name] = gw.user_roles(name) if name in existing_users else None
    existing_roles = set(gw.role_list())
    for role in params["roles"]:
        name = role["name"]
        if name in existing_roles:
            perms = gw.role_permissions(name)
            st.roles[name] = sorted(perms, key=lambda p: (p["key"], p["range_end"]))
        else:
            st.roles[name] = None
    return st


def validate(params: dict[str, t.Any]) -> None:
    seen: set[str] = set()
    for role in params["roles"]:
        if role["name"] == ROOT:
            raise EtcdAuthError("role root is built in (all keys, all operations): do not list it")
        if role["name"] in seen:
            raise EtcdAuthError(f"role {role['name']} is listed twice")
        seen.add(role["name"])
    seen = set()
    for user in params["users"]:
        if user["name"] in seen:
            raise EtcdAuthError(f"user {user['name']} is listed twice")
        seen.add(user["name"])


# (description, EtcdGateway method name, its arguments)
Step = tuple[str, str, tuple[t.Any, ...]]


def _plan_roles(params: dict[str, t.Any], st: State, after: State, steps: list[Step]) -> None:
    for role in params["roles"]:
        name = role["name"]
        if role["state"] == "absent":
            continue
        want = desired_perms(role)
        have = st.roles.get(name)
        if have is None:
            steps.append((f"add role {name}", "role_add", (name,)))
            have = []
        want_keys = {_perm_key(p) for p in want}
        want_ranges = {(p["key"], p["range_end"]) for p in want}
        for p in have:
            # a range still wanted with another type is re-granted, not revoked
            if _perm_key(p) not in want_keys and (p["key"], p["range_end"]) not in want_ranges:
                desc = f"revoke {name} {p['type']} {describe_range(p['key'], p['range_end'])}"
                steps.append((desc, "role_revoke", (name, p)))
        have_keys = {_perm_key(p) for p in have}
        for p in want:
            if _perm_key(p) not in have_keys:
                desc = f"grant {name} {p['type']} {describe_range(p['key'], p['range_end'])}"
                steps.append((desc, "role_grant", (name, p)))
        after.roles[name] = want


def _plan_user(
    user: dict[str, t.Any], have_roles: list[str] | None, roles_present: set[str], always: bool
) -> tuple[list[Step], list[str] | None]:
    name = user["name"]
    steps: list[Step] = []
    if user["state"] == "absent":
        if have_roles is not None:
            steps.append((f"delete user {name}", "user_delete", (name,)))
        return steps, None
    want_roles = sorted(set(user.get("roles") or []))
    missing = [r for r in want_roles if r != ROOT and r not in roles_present]
    if missing:
        raise EtcdAuthError(
            f"user {name}: role(s) {', '.join(missing)} do not exist (list them in roles)"
        )
    password = user.get("password")
    if have_roles is None:
        steps.append((f"add user {name}", "user_add", (name, password)))
        have_roles = []
    elif password and always:
        steps.append(
            (
                f"set the password of {name}",
                "user_change_password",
                (name, password),
            )
        )
    for r in have_roles:
        if r not in want_roles:
            steps.append((f"revoke role {r} from {name}", "user_revoke_role", (name, r)))
    for r in want_roles:
        if r not in have_roles:
            steps.append((f"grant role {r} to {name}", "user_grant_role", (name, r)))
    return steps, want_roles


def plan(params: dict[str, t.Any], st: State, known_roles: set[str]) -> tuple[list[Step], State]:
    """The calls to make, each with a description, and the state after them."""
    after = State(st.enabled)
    after.users = dict(st.users)
    after.roles = dict(st.roles)
    steps: list[Step] = []

    if params.get("enabled") is False and st.enabled:
        steps.append(("disable authentication", "auth_disable", ()))
        after.enabled = False

    _plan_roles(params, st, after, steps)
    roles_present = known_roles | {r["name"] for r in params["roles"] if r["state"] == "present"}

    always = params["update_password"] == "always"  # noqa: S105 (an option value)
    for user in params["users"]:
        user_steps, roles = _plan_user(user, st.users.get(user["name"]), roles_present, always)
        steps.extend(user_steps)
        after.users[user["name"]] = roles

    for role in params["roles"]:
        name = role["name"]
        if role["state"] == "absent" and st.roles.get(name) is not None:
            steps.append((f"delete role {name}", "role_delete", (name,)))
            after.roles[name] = None
            for uname, uroles in after.users.items():
                if uroles is not None and name in uroles:
                    after.users[uname] = [r for r in uroles if r != name]

    if params.get("enabled") is True and not st.enabled:
        root_roles = after.users.get(ROOT)
        if root_roles is None or ROOT not in root_roles:
            raise EtcdAuthError(
                "etcd turns authentication on only when user root exists and has role root: "
                "list {name: root, roles: [root]} in users"
            )
        steps.append(("enable authentication", "auth_enable", ()))
        after.enabled = True
    return steps, after


def _text(view: dict[str, t.Any]) -> str:
    return jsonlib.dumps(view, indent=2, sort_keys=True) + "\n"


def run(params: dict[str, t.Any], check_mode: bool, gw: EtcdGateway) -> dict[str, t.Any]:
    validate(params)
    st = read_state(gw, params)
    known_roles = set(gw.role_list())
    steps, after = plan(params, st, known_roles)
    if not check_mode:
        for _desc, method, args in steps:
            getattr(gw, method)(*args)
    before_view = st.view()
    after_view = after.view()
    if params.get("enabled") is None:
        before_view.pop("enabled")
        after_view.pop("enabled")
        enabled = _safe_enabled(gw)
    else:
        enabled = bool(after.enabled)
    return {
        "changed": bool(steps),
        "actions": [step[0] for step in steps],
        "enabled": enabled,
        "users": after_view["users"],
        "roles": after_view["roles"],
        "diff": {
            "before": _text(before_view),
            "after": _text(after_view),
            "before_header": "etcd auth",
            "after_header": "etcd auth",
        },
    }


def _safe_enabled(gw: EtcdGateway) -> bool:
    try:
        return bool(gw.auth_enabled())
    except EtcdGatewayError:
        return False


def main() -> None:
    perm_spec: dict[str, t.Any] = {
        "key": {"type": "str", "required": True, "no_log": False},
        "prefix": {"type": "bool", "default": False},
        "range_end": {"type": "str"},
        "type": {"type": "str", "choices": ["read", "write", "readwrite"], "default": "read"},
    }
    argument_spec: dict[str, t.Any] = dict(ETCD_COMMON_ARGUMENT_SPEC)
    argument_spec.update(
        roles={
            "type": "list",
            "elements": "dict",
            "default": [],
            "options": {
                "name": {"type": "str", "required": True},
                "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
                "permissions": {
                    "type": "list",
                    "elements": "dict",
                    "default": [],
                    "options": perm_spec,
                },
            },
        },
        users={
            "type": "list",
            "elements": "dict",
            "default": [],
            "options": {
                "name": {"type": "str", "required": True},
                "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
                "roles": {"type": "list", "elements": "str", "default": []},
                "password": {"type": "str", "no_log": True},
            },
        },
        update_password={
            "type": "str",
            "choices": ["on_create", "always"],
            "default": "on_create",
            "no_log": False,
        },
        enabled={"type": "bool"},
    )
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    run_module(module, run, (EtcdAuthError,))


if __name__ == "__main__":
    main()
