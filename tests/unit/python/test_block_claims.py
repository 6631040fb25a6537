# SPDX-License-Identifier: Apache-2.0
"""Address blocks claimed in a transaction that loses a race (`make unit`).

Both nodes of a 2-node job allocate it at once and both pick the same new block for the
second node (the search starts at a per-node point). The loser's view must keep the
block as etcd reports it (the winner's put arrives by watch, possibly before the loser
hears that its own transaction failed): freeing it dropped the loser's route to every pod
of that node (found in CI: root on c1 got "Network is unreachable" for bob's pod on c2).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from fake_etcd import FakeEtcd
from podnet.names import Keys, block_from_key
from podnet.state.alloc import Allocator
from podnet.state.ipam import Ipam

CIDR = ipaddress.IPv4Network("198.18.0.0/20")


def _allocator(etcd: Any) -> Allocator:
    return Allocator(etcd, Keys("u"), Ipam(CIDR, 26), "u", 4096, 8191)


def _watch_blocks(etcd: FakeEtcd, view: Allocator) -> None:
    """What the agent's watch does with `blocks/` records (etcd_sync.on_event)."""
    kvs, _ = etcd.get_prefix(view.keys.prefix("blocks"))
    for kv in kvs:
        view.ipam.set_block(ipaddress.IPv4Network(block_from_key(kv.key)), kv.json()["node"])


class RaceEtcd(FakeEtcd):
    """The first transaction of `loser` runs after `winner` allocated the same job and
    after the winner's records reached the loser's view (the watch was faster)."""

    def __init__(self) -> None:
        super().__init__()
        self.race: tuple[Allocator, Allocator, tuple[Any, ...]] | None = None

    def txn(self, compare: Any, success: Any, failure: Any = None) -> Any:
        if self.race is not None:
            winner, loser, job = self.race
            self.race = None
            winner.allocate_job(*job)
            _watch_blocks(self, loser)
        return super().txn(compare, success, failure)


def test_losing_a_race_keeps_the_winners_block_in_the_view() -> None:
    etcd = RaceEtcd()
    c1, c2 = _allocator(etcd), _allocator(etcd)
    vni = c1.user_vni("bob", 2002)
    for a in (c1, c2):
        a.load_view()
    job = (42, "bob", 2002, "e2eb", ["c1", "c2"], vni)
    etcd.race = (c2, c1, (*job, 1))
    got = c1.allocate_job(*job, 0)
    # c1 lost the block both claimed to c2: c2's block is c2's in c1's view
    kvs, _ = etcd.get_prefix(c1.keys.prefix("blocks"))
    owners = {ipaddress.IPv4Network(block_from_key(kv.key)): kv.json()["node"] for kv in kvs}
    assert sorted(owners.values()) == ["c1", "c2"]
    assert c1.ipam.blocks == owners
    # and c1's pod has an address of its own block, claimed after it lost the first one
    ip1 = ipaddress.IPv4Address(got.ip)
    assert any(ip1 in b and n == "c1" for b, n in c1.ipam.blocks.items())
    assert c1.ipam.claims == set()


def test_a_claim_is_taken_back_when_etcd_never_confirmed_it() -> None:
    ipam = Ipam(CIDR, 26)
    blk = ipam.claim_block("c2")
    assert ipam.blocks == {blk: "c2"}
    ipam.unclaim_blocks([blk])
    assert ipam.blocks == {} and ipam.node_blocks["c2"] == []


def test_a_confirmed_claim_is_never_taken_back() -> None:
    ipam = Ipam(CIDR, 26)
    blk = ipam.claim_block("c2")
    ipam.confirm_blocks([blk])
    ipam.unclaim_blocks([blk])
    assert ipam.blocks == {blk: "c2"}


def test_a_claim_skips_blocks_etcd_reported_taken() -> None:
    ipam = Ipam(CIDR, 26)
    first = ipam.free_blocks("c2", 1)[0]
    ipam.set_block(first, "c9")
    assert ipam.claim_block("c2") != first
