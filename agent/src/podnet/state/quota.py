# SPDX-License-Identifier: Apache-2.0
"""Per-user quotas, counted by etcd itself (docs/security.md, "Quotas").

What a user holds of a kind (`containers`, `addresses`, `logins`, `published`) is the set
of slot keys `quota/<user>/<kind>/<k>`. A thing that counts (a container, a login pod, a
published port) takes a free slot `k < limit` in the very transaction that creates it, with
a `create_revision == 0` compare on the slot's key, and gives it back in the transaction
that deletes it. Two requests racing for a user's last slot compare on the same key: one
transaction fails, its retry reads the slots again and is refused. There is no counter to
drift: the count is the number of keys, and a limit lowered below what a user holds refuses
them until they are under it again.

Each slot names its owner record (`{"owner": <key>}`) and the owner lists its slots
(`"slots": {<kind>: <k>}`): a slot is live while its owner exists and lists it. A slot
whose owner went another way (a gateway dropping a publication whose job ended, a node's
lease expiring, an admin's `etcdctl del`) is stale. Stale slots are found and deleted
(guarded on both keys' revisions) when a user reaches a limit and when usage is shown, so a
lost release never costs a user their quota for good.

Per-node limits (containers of a user on one node) are podnetd's: it counts its own pods
under the user's lock (node layer).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from podnet.config import ClusterConfig, ConfigError
from podnet.errors import PodnetError
from podnet.names import Keys
from podnet.state.etcdops import KV, cmp_absent, cmp_mod, json_dumps, op_delete, op_get, op_put
from podnet.state.store import Etcd, EtcdRequestError, EtcdUnavailable

log = logging.getLogger("podnet.quota")

#: the cluster-wide kinds (slot keys); `containers_per_node` is counted by podnetd
KINDS = ("containers", "addresses", "logins", "published")

#: what each limit is called in refusals and in `podnet status`
LABELS = {
    "containers_per_node": "containers per user on a node",
    "containers": "containers per user",
    "addresses": "addresses per user (containers and login pods)",
    "logins": "login pods per user",
    "published": "published ports per user",
}

#: the largest limit a site may set (slot indices stay small numbers)
MAX_LIMIT = 1_000_000


@dataclass(frozen=True)
class Limits:
    """The cluster's quotas (ClusterConfig `quota_*`); the published-port limit is the
    gateway policy's `publish.max` (state/publish.py)."""

    containers_per_node: int
    containers: int
    addresses: int
    logins: int

    @classmethod
    def of(cls, cc: ClusterConfig) -> Limits:
        return cls(
            cc.quota_containers_per_node,
            cc.quota_containers,
            cc.quota_addresses,
            cc.quota_login_pods,
        )


class LiveLimits:
    """The cluster's limits as etcd's `config` says now: read again at most every `ttl`
    seconds, so a changed inventory applies within that on every node without a restart
    (an unreadable configuration keeps the limits read last)."""

    def __init__(self, etcd: Etcd, keys: Keys, ttl: float = 10.0) -> None:
        self.etcd, self.keys, self.ttl = etcd, keys, ttl
        self._limits: Limits | None = None
        self._read = 0.0
        self._lock = threading.Lock()

    def set(self, limits: Limits) -> None:
        """The limits of the configuration podnetd started with (read again after `ttl`)."""
        with self._lock:
            self._limits, self._read = limits, time.monotonic()

    def get(self) -> Limits:
        with self._lock:
            if self._limits is not None and time.monotonic() - self._read < self.ttl:
                return self._limits
            self._read = time.monotonic()
            try:
                d = self.etcd.get_json(self.keys.config)
                self._limits = Limits.of(ClusterConfig.from_dict(d, "etcd config", strict=False))
            except (EtcdUnavailable, EtcdRequestError, ConfigError, ValueError) as e:
                if self._limits is None:
                    raise PodnetError("EUNAVAIL", f"quota limits unreadable: {e}") from None
                log.warning("quota limits: %s; keeping the last ones", e)
            return self._limits


class QuotaExceeded(PodnetError):
    """A request over a user's quota: which limit, its value, what the user holds.
    API code `EQUOTA` (docs/api.md); the reply's error also carries `details()`."""

    def __init__(self, user: str, limit: str, value: int, held: int, where: str = "") -> None:
        self.user, self.limit, self.value, self.held = user, limit, value, held
        at = f" on {where}" if where else ""
        super().__init__(
            "EQUOTA",
            f"over quota: {LABELS.get(limit, limit)}{at} is {value}, and {user} holds "
            f"{held} (podnet status shows your usage)",
        )

    def details(self) -> dict[str, Any]:
        return {"limit": self.limit, "value": self.value, "held": self.held}


@dataclass
class Claim:
    """Slots to take (or keep) in the transaction that writes their owner."""

    compare: list[Any] = field(default_factory=list)
    ops: list[Any] = field(default_factory=list)
    slots: dict[str, int] = field(default_factory=dict)


def slots_of(record: Any) -> dict[str, int]:
    """The `slots` an owner record lists (none for a record of an older podnet)."""
    raw = record.get("slots") if isinstance(record, dict) else None
    if not isinstance(raw, dict):
        return {}
    return {
        str(k): int(v)
        for k, v in raw.items()
        if k in KINDS and isinstance(v, int) and not isinstance(v, bool) and v >= 0
    }


def _index(kv: KV) -> int | None:
    tail = kv.key.rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _json(kv: KV | None) -> Any:
    if kv is None:
        return None
    try:
        return kv.json()
    except ValueError:
        return None


class Slots:
    """The slot keys of users' holdings (see the module's docstring)."""

    def __init__(self, etcd: Etcd, keys: Keys) -> None:
        self.etcd = etcd
        self.keys = keys

    def _value(self, owner: str) -> str:
        return json_dumps({"owner": owner})

    # -- reading --------------------------------------------------------------------
    def held(self, user: str, kind: str) -> list[KV]:
        return self.etcd.get_prefix(self.keys.quota(user, kind))[0]

    def _owners(self, slots: list[KV]) -> list[KV | None]:
        """The owner record of each slot (None: absent or not named), a few reads."""
        names = []
        for kv in slots:
            d = _json(kv)
            names.append(str(d["owner"]) if isinstance(d, dict) and "owner" in d else "")
        found: dict[str, KV] = {}
        wanted = sorted({n for n in names if n})
        step = max(1, min(self.etcd.max_txn_ops, 128))
        for i in range(0, len(wanted), step):
            r = self.etcd.txn([], [op_get(k) for k in wanted[i : i + step]])
            for j in range(len(r.responses)):
                for kv in r.range_kvs(j):
                    found[kv.key] = kv
        return [found.get(n) if n else None for n in names]

    def live(self, user: str, kind: str, collect: bool = True) -> list[KV]:
        """The user's live slots of `kind`; stale ones are deleted (collect) on the way."""
        slots = self.held(user, kind)
        if not slots:
            return []
        out = []
        for slot, owner in zip(slots, self._owners(slots), strict=True):
            k = _index(slot)
            if k is not None and owner is not None and slots_of(_json(owner)).get(kind) == k:
                out.append(slot)
            elif collect:
                self._drop_stale(slot, owner)
        return out

    def _drop_stale(self, slot: KV, owner: KV | None) -> None:
        """Delete a stale slot unless it or its owner changed since they were read."""
        d = _json(slot)
        guard = [cmp_mod(slot.key, slot.mod_revision)]
        if isinstance(d, dict) and "owner" in d:
            name = str(d["owner"])
            guard.append(cmp_mod(name, owner.mod_revision) if owner else cmp_absent(name))
        self.etcd.txn(guard, [op_delete(slot.key)])

    def usage(self, user: str, kinds: Iterable[str] = KINDS) -> dict[str, int]:
        return {kind: len(self.live(user, kind)) for kind in kinds}

    # -- taking ---------------------------------------------------------------------
    def claim(self, user: str, limits: dict[str, int], owner: str, lease: int = 0) -> Claim:
        """One free slot `k < limit` of each kind of `limits`, as compares and puts for the
        owner's transaction (`slots` goes into the owner's record). QuotaExceeded names the
        first kind with no free slot once stale ones are gone. The transaction failing
        means another request took a slot first: read again (call again)."""
        claim = Claim()
        for kind, limit in limits.items():
            k = self._free(user, kind, limit)
            key = self.keys.quota(user, kind, k)
            claim.compare.append(cmp_absent(key))
            claim.ops.append(op_put(key, self._value(owner), lease))
            claim.slots[kind] = k
        return claim

    def _free(self, user: str, kind: str, limit: int) -> int:
        slots = self.held(user, kind)
        k = _lowest_free({_index(kv) for kv in slots}, limit)
        if k is not None:
            return k
        live = self.live(user, kind)  # stale slots go: a second look
        k = _lowest_free({_index(kv) for kv in live}, limit)
        if k is None:
            raise QuotaExceeded(user, kind, limit, len(live))
        return k

    def keep(self, user: str, slots: dict[str, int], owner: str, lease: int = 0) -> Claim:
        """The slots of a thing that exists (its records written again: adoption after a
        restart, the node's new lease): each is written again if free or already the
        owner's; one another owner took meanwhile is replaced by a free index, beyond the
        limit if need be (a live pod is never refused). The transaction failing means a
        slot changed meanwhile: call again."""
        claim = Claim()
        value = self._value(owner)
        for kind, had in slots.items():
            k, key = had, self.keys.quota(user, kind, had)
            kv = self.etcd.get(key)
            if kv is not None and kv.value != value:
                owners = self._owners([kv])
                if owners[0] is not None and slots_of(_json(owners[0])).get(kind) == k:
                    used = {_index(x) for x in self.held(user, kind)}
                    k = _lowest_free(used, len(used) + 1) or 0
                    key, kv = self.keys.quota(user, kind, k), None
            if kv is None:
                claim.compare.append(cmp_absent(key))
            else:
                claim.compare.append(cmp_mod(key, kv.mod_revision))
            claim.ops.append(op_put(key, value, lease))
            claim.slots[kind] = k
        return claim

    def release_ops(self, user: str, slots: dict[str, int]) -> list[dict[str, Any]]:
        """Deletes of a thing's slots, for the transaction that deletes the thing."""
        return [op_delete(self.keys.quota(user, kind, k)) for kind, k in slots.items()]


def _lowest_free(used: set[int | None], limit: int) -> int | None:
    for k in range(limit):
        if k not in used:
            return k
    return None
