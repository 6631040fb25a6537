#!/usr/bin/python
# Copyright (c) podnet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ansible module hpc.podnet.etcd_member: etcd cluster membership through the v3 JSON gateway."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: etcd_member
short_description: Add, update, promote or remove etcd cluster members
version_added: 0.2.0
description:
  - Makes sure a member with the given name and peer URLs is (or is not) part of an etcd
    cluster, through etcd's v3 JSON gateway (C(/v3/cluster/member/...)).
  - A member that was added but has not started yet has no name; it is recognised by its peer
    URLs, so re-running an interrupted join is idempotent.
  - O(state=present) on an existing member whose peer URLs differ updates them.
  - Removal is refused when the member is the last one, or when the voting members left
    afterwards that answer on their client URLs would be fewer than the new quorum, unless
    O(force=true).
  - The module only changes membership. Starting the new member's etcd (with
    C(initial-cluster-state=existing)) or stopping the removed one is up to the caller (the
    C(hpc.podnet.etcd) role does both).
author:
  - podnet developers (@podnet)
extends_documentation_fragment:
  - hpc.podnet.etcd
  - hpc.podnet.etcd.attributes
attributes:
  check_mode:
    support: full
    description: Lists the members, reports what would change (and refuses what would be refused),
      changes nothing.
  diff_mode:
    support: full
    description: Shows the member (name, peer URLs, learner) before and after.
options:
  name:
    description:
      - Member name (etcd C(--name)).
    type: str
    required: true
  peer_urls:
    description:
      - Peer URLs of the member, for example C(https://198.51.100.11:2380). Order does not matter.
      - Required with O(state=present). With O(state=absent), used to find a member that was added
        but never started (it has no name yet).
    type: list
    elements: str
  state:
    description:
      - V(present) adds the member, or updates its peer URLs, or promotes it (see O(learner)).
      - V(absent) removes it.
    type: str
    choices: [present, absent]
    default: present
  learner:
    description:
      - V(true) adds a new member as a non-voting learner.
      - V(false) adds a voting member and promotes an existing learner (etcd only promotes a learner
        that has caught up with the leader; the error is reported as is otherwise).
      - Unset adds a voting member and leaves an existing member as it is.
      - etcd cannot turn a voting member into a learner; asking for it fails.
    type: bool
  force:
    description:
      - Remove even when it is the last member or when the cluster would lose quorum.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Announce a new member (then start its etcd with initial-cluster-state=existing)
  hpc.podnet.etcd_member:
    name: ctl3
    peer_urls: ["https://198.51.100.12:2380"]
    endpoints: ["https://198.51.100.10:2379"]
  delegate_to: ctl

- name: Remove a member that is gone for good
  hpc.podnet.etcd_member:
    name: ctl2
    state: absent

- name: List the members without changing anything
  hpc.podnet.etcd_member:
    name: ctl
    peer_urls: ["https://198.51.100.10:2380"]
  check_mode: true
  register: etcd_members
"""

RETURN = r"""
member:
  description:
    - The member after the run (the removed member with O(state=absent)); null when there was
      none. In check mode, a member that would be added has O(name), the peer URLs and id 0.
  returned: always
  type: dict
  contains:
    id:
      description: Member id (decimal).
      type: int
    id_hex:
      description: Member id in hexadecimal, as etcdctl prints it.
      type: str
    name:
      description: Member name; empty for a member added but not started yet.
      type: str
    peer_urls:
      description: Peer URLs.
      type: list
      elements: str
    client_urls:
      description: Client URLs it advertises (empty until it started).
      type: list
      elements: str
    is_learner:
      description: Whether it is a non-voting learner.
      type: bool
members:
  description: All members after the run (what they would be, in check mode), same fields as
    RV(member).
  returned: always
  type: list
  elements: dict
  sample:
    - {"id": 1234, "id_hex": "4d2", "name": "ctl", "peer_urls": ["https://198.51.100.10:2380"],
       "client_urls": ["https://198.51.100.10:2379"], "is_learner": false}
actions:
  description: What was done (or would be, in check mode), in order.
  returned: always
  type: list
  elements: str
  sample: ["add ctl3 (https://198.51.100.12:2380)"]
"""

import typing as t  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.hpc.podnet.plugins.module_utils._etcd_gateway import (  # noqa: E402
    ETCD_COMMON_ARGUMENT_SPEC,
    EtcdGateway,
    EtcdGatewayError,
    run_module,
)

Member = dict[str, t.Any]


class EtcdMemberError(Exception):
    """A refused or failed membership change, with a message for fail_json."""


def find_member(members: list[Member], name: str, peer_urls: list[str] | None) -> Member | None:
    """The member called ``name``, else an unstarted (nameless) one with one of ``peer_urls``."""
    for member in members:
        if member["name"] == name:
            return member
    wanted = set(peer_urls or [])
    for member in members:
        if not member["name"] and wanted & set(member["peer_urls"]):
            return member
    return None


def _view(member: Member | None) -> dict[str, t.Any]:
    if member is None:
        return {}
    return {
        "name": member["name"],
        "peer_urls": sorted(member["peer_urls"]),
        "is_learner": member["is_learner"],
    }


def quorum_problem(members: list[Member], target: Member, gw: EtcdGateway) -> str | None:
    """Why removing ``target`` is unsafe, or None when it is safe."""
    if len(members) == 1:
        return "member %s is the last member of the cluster" % (target["name"] or target["id_hex"])
    if target["is_learner"]:
        return None  # learners do not vote
    remaining = [m for m in members if m["id"] != target["id"] and not m["is_learner"]]
    if not remaining:
        return "member {} is the last voting member of the cluster".format(target["name"])
    quorum = len(remaining) // 2 + 1
    healthy: list[str] = []
    unhealthy: list[str] = []
    for member in remaining:
        label = member["name"] or member["id_hex"]
        urls = member["client_urls"]
        if urls and any(gw.endpoint_healthy(url) for url in urls):
            healthy.append(label)
        else:
            unhealthy.append(label)
    if len(healthy) < quorum:
        label = target["name"] or target["id_hex"]
        return (
            f"removing member {label} would leave {len(remaining)} voting members, whose quorum "
            f"is {quorum}, but only {len(healthy)} answer ({', '.join(healthy) or 'none'}); "
            f"not answering: {', '.join(unhealthy)}"
        )
    return None


def run(params: dict[str, t.Any], check_mode: bool, gw: EtcdGateway) -> dict[str, t.Any]:
    name: str = params["name"]
    peer_urls: list[str] | None = params.get("peer_urls")
    if not name:
        raise EtcdMemberError("option name must not be empty")
    if peer_urls is not None:
        for url in peer_urls:
            if not url.startswith(("https://", "http://")):
                raise EtcdMemberError(f"peer URL {url!r} is not an http(s) URL")
    members = gw.member_list()
    member = find_member(members, name, peer_urls)
    if params["state"] == "absent":
        return _absent(params, check_mode, gw, members, member)
    return _present(params, check_mode, gw, members, member)


def _result(
    changed: bool,
    actions: list[str],
    before: Member | None,
    after: Member | None,
    *,
    members: list[Member],
    header: str,
) -> dict[str, t.Any]:
    return {
        "changed": changed,
        "actions": actions,
        "member": after if after is not None else before,
        "members": members,
        "diff": {
            "before": _view(before),
            "after": _view(after),
            "before_header": header,
            "after_header": header,
        },
    }


def _absent(
    params: dict[str, t.Any],
    check_mode: bool,
    gw: EtcdGateway,
    members: list[Member],
    member: Member | None,
) -> dict[str, t.Any]:
    name = params["name"]
    if member is None:
        return _result(False, [], None, None, members=members, header=name)
    if not params["force"]:
        problem = quorum_problem(members, member, gw)
        if problem:
            raise EtcdMemberError(problem + "; refusing to remove it (force=true overrides)")
    actions = ["remove {} ({})".format(member["name"] or name, member["id_hex"])]
    if check_mode:
        left = [m for m in members if m["id"] != member["id"]]
    else:
        gw.member_remove(member["id"])
        left = gw.member_list()
    result = _result(True, actions, member, None, members=left, header=name)
    result["member"] = member
    return result


def _present(
    params: dict[str, t.Any],
    check_mode: bool,
    gw: EtcdGateway,
    members: list[Member],
    member: Member | None,
) -> dict[str, t.Any]:
    name: str = params["name"]
    peer_urls: list[str] | None = params.get("peer_urls")
    learner: bool | None = params.get("learner")
    if not peer_urls:
        raise EtcdMemberError("state=present needs peer_urls")
    wanted = set(peer_urls)
    for other in members:
        if other is not member and wanted & set(other["peer_urls"]):
            raise EtcdMemberError(
                "peer URL(s) {} already belong to member {} ({}); remove it first".format(
                    ", ".join(sorted(wanted & set(other["peer_urls"]))),
                    other["name"] or "(not started)",
                    other["id_hex"],
                )
            )

    if member is None:
        return _add(name, peer_urls, bool(learner), check_mode, gw, members=members)

    actions: list[str] = []
    after = dict(member)
    if learner is True and not member["is_learner"]:
        raise EtcdMemberError(
            f"member {name} is a voting member and etcd cannot demote it to a learner; "
            "remove it and add it again with learner=true"
        )
    if set(member["peer_urls"]) != wanted:
        actions.append(
            "update {} peer URLs {} -> {}".format(
                name, ",".join(sorted(member["peer_urls"])), ",".join(sorted(wanted))
            )
        )
        after["peer_urls"] = list(peer_urls)
        if not check_mode:
            gw.member_update(member["id"], list(peer_urls))
    if learner is False and member["is_learner"]:
        actions.append("promote {} ({})".format(name, member["id_hex"]))
        after["is_learner"] = False
        if not check_mode:
            gw.member_promote(member["id"])
    if not actions:
        return _result(False, [], member, member, members=members, header=name)
    if check_mode:
        new_members = [after if m["id"] == member["id"] else m for m in members]
    else:
        new_members = gw.member_list()
        after = find_member(new_members, name, peer_urls) or after
    return _result(True, actions, member, after, members=new_members, header=name)


def _add(
    name: str,
    peer_urls: list[str],
    learner: bool,
    check_mode: bool,
    gw: EtcdGateway,
    *,
    members: list[Member],
) -> dict[str, t.Any]:
    actions = [
        "add {}{} ({})".format(name, " as learner" if learner else "", ",".join(sorted(peer_urls)))
    ]
    if check_mode:
        added: Member = {
            "id": 0,
            "id_hex": "0",
            "name": name,
            "peer_urls": list(peer_urls),
            "client_urls": [],
            "is_learner": learner,
        }
        return _result(True, actions, None, added, members=[*members, added], header=name)
    known = {m["id"] for m in members}
    try:
        added = gw.member_add(list(peer_urls), learner=learner)
    except EtcdGatewayError as exc:
        raise EtcdMemberError(_rollback_failed_add(exc, gw, known, set(peer_urls))) from exc
    new_members = gw.member_list()
    for m in new_members:
        if m["id"] == added["id"]:
            added = m
    # etcd names the member only when it starts; report the name it will get
    added = dict(added, name=added["name"] or name)
    return _result(True, actions, None, added, members=new_members, header=name)


def _rollback_failed_add(
    exc: EtcdGatewayError, gw: EtcdGateway, known: set[int], peer_urls: set[str]
) -> str:
    """After a failed add, remove a member the add may have created anyway (lost answer)."""
    msg = f"adding the member failed: {exc}"
    try:
        members = gw.member_list()
    except EtcdGatewayError as list_exc:
        return msg + f"; could not check whether it was added ({list_exc})"
    stray = [m for m in members if m["id"] not in known and peer_urls & set(m["peer_urls"])]
    for member in stray:
        try:
            gw.member_remove(member["id"])
        except EtcdGatewayError as rm_exc:
            return msg + "; it was added as {} and removing it again failed: {}".format(
                member["id_hex"],
                rm_exc,
            )
        msg += "; it had been added as {} and was removed again".format(member["id_hex"])
    return msg + "; the cluster membership is unchanged"


def main() -> None:
    argument_spec: dict[str, t.Any] = dict(ETCD_COMMON_ARGUMENT_SPEC)
    argument_spec.update(
        name={"type": "str", "required": True},
        peer_urls={"type": "list", "elements": "str"},
        state={"type": "str", "choices": ["present", "absent"], "default": "present"},
        learner={"type": "bool"},
        force={"type": "bool", "default": False},
    )
    module = AnsibleModule(
        argument_spec=argument_spec,
        required_if=[("state", "present", ("peer_urls",))],
        supports_check_mode=True,
    )
    run_module(module, run, (EtcdMemberError,))


if __name__ == "__main__":
    main()
