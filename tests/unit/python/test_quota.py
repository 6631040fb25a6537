# SPDX-License-Identifier: Apache-2.0
"""Quota slots (agent/src/podnet/state/quota.py) on the in-memory etcd: a limit holds under
racing requests, a refusal says which limit, its value and what the user holds, released
and stale slots come back, a live pod's slots survive its records being written again.
The same mechanics against a real etcd and podnetd: tests/agent/test_quota.py."""

from __future__ import annotations

import ipaddress
import threading
from typing import Any

import pytest
from fake_etcd import FakeEtcd
from podnet.config import ClusterConfig, ConfigError
from podnet.names import Keys
from podnet.state.alloc import Allocator
from podnet.state.etcdops import cmp_absent, op_delete, op_put
from podnet.state.ipam import Ipam
from podnet.state.quota import Limits, QuotaExceeded, Slots, slots_of

KEYS = Keys("u")


def _take(etcd: Any, slots: Slots, user: str, limit: int, name: str) -> dict[str, int]:
    """A thing of `user` that counts against `limit`: its record and its slot, one txn."""
    owner = KEYS.root + f"things/{name}"
    while True:
        claim = slots.claim(user, {"containers": limit}, owner)
        r = etcd.txn(
            [cmp_absent(owner), *claim.compare],
            [op_put(owner, {"slots": claim.slots}), *claim.ops],
        )
        if r.succeeded:
            return claim.slots


def _drop(etcd: Any, slots: Slots, user: str, name: str) -> None:
    owner = KEYS.root + f"things/{name}"
    kv = etcd.get(owner)
    etcd.txn([], [op_delete(owner), *slots.release_ops(user, slots_of(kv.json()))])


def test_refused_at_the_limit_with_the_limit_and_what_the_user_holds() -> None:
    etcd = FakeEtcd()
    slots = Slots(etcd, KEYS)  # type: ignore[arg-type]
    got = [_take(etcd, slots, "alice", 3, f"a{i}")["containers"] for i in range(3)]
    assert got == [0, 1, 2]
    with pytest.raises(QuotaExceeded) as e:
        _take(etcd, slots, "alice", 3, "a3")
    assert e.value.code == "EQUOTA"
    assert e.value.details() == {"limit": "containers", "value": 3, "held": 3}
    assert "containers per user is 3, and alice holds 3" in e.value.message
    # another user is not affected
    assert _take(etcd, slots, "bob", 3, "b0") == {"containers": 0}
    # a released slot is taken again (the lowest free one)
    _drop(etcd, slots, "alice", "a1")
    assert _take(etcd, slots, "alice", 3, "a3") == {"containers": 1}
    assert slots.usage("alice", ["containers"]) == {"containers": 3}


def test_racing_requests_never_pass_the_limit_together() -> None:
    etcd = FakeEtcd()
    slots = Slots(etcd, KEYS)  # type: ignore[arg-type]
    limit, won, refused = 5, [], []
    start = threading.Barrier(16)

    def one(i: int) -> None:
        start.wait()
        try:
            won.append(_take(etcd, slots, "alice", limit, f"t{i}"))
        except QuotaExceeded as e:
            refused.append(e.held)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == limit and len(refused) == 16 - limit
    assert sorted(s["containers"] for s in won) == list(range(limit))
    assert set(refused) == {limit}
    assert len(etcd.get_prefix(KEYS.quota("alice", "containers"))[0]) == limit


def test_a_slot_whose_owner_went_another_way_is_reclaimed_at_the_limit() -> None:
    etcd = FakeEtcd()
    slots = Slots(etcd, KEYS)  # type: ignore[arg-type]
    for i in range(2):
        _take(etcd, slots, "alice", 2, f"a{i}")
    etcd.delete(KEYS.root + "things/a0")  # a gateway, a lease, an admin: the slot stays
    assert len(slots.held("alice", "containers")) == 2
    assert _take(etcd, slots, "alice", 2, "a2") == {"containers": 0}
    # an owner that lists another slot does not keep this one either
    etcd.put(KEYS.root + "things/a1", {"slots": {"containers": 7}})
    assert slots.usage("alice", ["containers"]) == {"containers": 1}
    assert [kv.key for kv in slots.held("alice", "containers")] == [
        KEYS.quota("alice", "containers", 0)
    ]


def test_a_lowered_limit_refuses_until_the_user_is_under_it() -> None:
    etcd = FakeEtcd()
    slots = Slots(etcd, KEYS)  # type: ignore[arg-type]
    for i in range(4):
        _take(etcd, slots, "alice", 4, f"a{i}")
    with pytest.raises(QuotaExceeded) as e:
        _take(etcd, slots, "alice", 2, "x")
    assert (e.value.value, e.value.held) == (2, 4)
    for name in ("a0", "a1", "a2"):
        _drop(etcd, slots, "alice", name)
    assert _take(etcd, slots, "alice", 2, "x") == {"containers": 0}
    with pytest.raises(QuotaExceeded):
        _take(etcd, slots, "alice", 0, "y")  # 0: none at all


def test_keep_writes_a_live_things_slots_again_never_refusing() -> None:
    etcd = FakeEtcd()
    slots = Slots(etcd, KEYS)  # type: ignore[arg-type]
    mine = _take(etcd, slots, "alice", 2, "a0")
    owner = KEYS.root + "things/a0"
    # its records were lost (a lease expired) and another thing took its slot meanwhile
    etcd.delete(owner)
    etcd.delete(KEYS.quota("alice", "containers", 0))
    _take(etcd, slots, "alice", 2, "a1")
    _take(etcd, slots, "alice", 2, "a2")
    claim = slots.keep("alice", mine, owner)
    r = etcd.txn(claim.compare, [op_put(owner, {"slots": claim.slots}), *claim.ops])
    assert r.succeeded and claim.slots == {"containers": 2}  # beyond the limit: it lives
    assert slots.usage("alice", ["containers"]) == {"containers": 3}
    # written again with its own slot: the same slot
    again = slots.keep("alice", claim.slots, owner)
    assert etcd.txn(again.compare, again.ops).succeeded and again.slots == claim.slots


def _allocator(etcd: Any) -> Allocator:
    return Allocator(etcd, KEYS, Ipam(ipaddress.IPv4Network("198.18.0.0/20"), 26), "u", 4096, 8191)


def test_login_pods_count_against_logins_and_addresses() -> None:
    etcd = FakeEtcd()
    a = _allocator(etcd)
    limits = {"logins": 2, "addresses": 5}
    ips = [a.allocate_login(n, "alice", 2001, 4096, 0, limits) for n in ("l1", "l2")]
    assert [s for _ip, s in ips] == [{"logins": 0, "addresses": 0}, {"logins": 1, "addresses": 1}]
    assert a.allocate_login("l1", "alice", 2001, 4096, 0, limits) == ips[0]  # idempotent
    with pytest.raises(QuotaExceeded) as e:
        a.allocate_login("l3", "alice", 2001, 4096, 0, limits)
    assert e.value.details() == {"limit": "logins", "value": 2, "held": 2}
    assert etcd.get(KEYS.login("l3", "alice")) is None
    # not limited (root, host_users): no slots
    assert a.allocate_login("l3", "slurm", 64030, 4097, 0, None)[1] == {}
    a.release_login("l1", "alice")
    assert a.slots.usage("alice", ["logins", "addresses"]) == {"logins": 1, "addresses": 1}
    ip, s = a.allocate_login("l3", "alice", 2001, 4096, 0, limits)
    assert s == {"logins": 0, "addresses": 0}
    # the node's lease expired: records and slots gone; written again, with the same slots
    for k in [
        kv.key for kv in etcd.get_prefix(KEYS.root)[0] if "/l3/" in kv.key or "quota" in kv.key
    ]:
        etcd.delete(k)
    assert a.republish_login("l3", "alice", 2001, 4096, ip, 0, s) == s
    assert a.slots.usage("alice", ["logins"]) == {"logins": 1}


def test_quota_settings_are_checked() -> None:
    base = {"pod_cidr": "198.18.0.0/15", "block_prefix": 26, "zone": "lab"}
    cc = ClusterConfig.from_dict(base)
    assert Limits.of(cc) == Limits(32, 128, 136, 8)
    cc = ClusterConfig.from_dict({**base, "quota_containers": 0, "quota_login_pods": 2})
    assert (cc.quota_containers, cc.quota_login_pods) == (0, 2)
    for bad in (
        {"quota_containers": -1},
        {"quota_addresses": "9"},
        {"quota_containers_per_node": 5000},
    ):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            ClusterConfig.from_dict({**base, **bad})
