# SPDX-License-Identifier: Apache-2.0
"""The quotas as this node applies and shows them (the limits themselves and their slots
in etcd are `podnet.state.quota`'s): whom they limit (not root nor the node's host_users),
the limits a login pod counts against, and what a user holds against each
(`podnet status`, `Agent.quota_usage`)."""

from __future__ import annotations

import pwd
from collections.abc import Callable
from typing import Any

from podnet.config import NodeConfig
from podnet.errors import PodnetError
from podnet.names import Keys
from podnet.node.pods import PodTable
from podnet.state import publish, quota
from podnet.state.store import Etcd


class QuotaView:
    """`limits`: the cluster's quotas, followed while running (the agent's)."""

    def __init__(self, cfg: NodeConfig, limits: quota.LiveLimits, etcd: Etcd, keys: Keys) -> None:
        self.cfg = cfg
        self.limits = limits
        self.etcd = etcd
        self.keys = keys

    def limited(self, uid: int) -> bool:
        """Whether quotas apply to `uid`: not to root nor to the node's host_users."""
        return uid != 0 and uid not in self.cfg.host_uids

    def login_limits(self, uid: int) -> dict[str, int] | None:
        """The cluster-wide limits a login pod of `uid` counts against (None: none)."""
        if not self.limited(uid):
            return None
        q = self.limits.get()
        return {"logins": q.logins, "addresses": q.addresses}

    def usage(self, uid: int, slots: Callable[[], quota.Slots], pods: PodTable) -> dict[str, Any]:
        """What `uid` holds against each quota (`podnet status`); `slots`: the allocator's
        (asked only for a user the quotas limit)."""
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            raise PodnetError("EINVAL", f"uid {uid} has no user name") from None
        if not self.limited(uid):
            return {"user": user, "limited": False, "limits": []}
        q = self.limits.get()
        used = slots().usage(user, ("containers", "addresses", "logins"))
        here = sum(1 for p in pods.all(uid) if p.kind == "container")
        rows = [
            ("containers_per_node", q.containers_per_node, here, self.cfg.node),
            ("containers", q.containers, used["containers"], ""),
            ("logins", q.logins, used["logins"], ""),
            ("addresses", q.addresses, used["addresses"], ""),
        ]
        published = self._published(user, slots)
        if published is not None:
            rows.append(("published", *published, ""))
        return {
            "user": user,
            "limited": True,
            "limits": [
                {"limit": k, "label": quota.LABELS[k], "value": v, "held": h, "node": n}
                for k, v, h, n in rows
            ],
        }

    def _published(self, user: str, slots: Callable[[], quota.Slots]) -> tuple[int, int] | None:
        """(limit, held) of published ports; None without a gateway."""
        try:
            publish.gateway_config(self.etcd, self.keys)
            limit = publish.limit_of(self.etcd, self.keys, user)
        except PodnetError:
            return None
        return limit, len(slots().live(user, "published"))
