# SPDX-License-Identifier: Apache-2.0
"""The allocator's state (`AllocatorBase`: etcd, the keys, the IPAM view) and what every
part uses: the user's VNI, the view's (re)load, and one address of a node's blocks, a new
block claimed when they are full (`_place`: a login's or a container's, in one
transaction with its records)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from podnet.names import Keys, block_from_key
from podnet.state import etcdops, quota
from podnet.state.alloc.common import MAX_ATTEMPTS, AllocError, NoAddress, log
from podnet.state.etcdops import KV, cmp_absent, op_put
from podnet.state.ipam import Ipam, PoolExhausted
from podnet.state.store import Etcd


@dataclass
class AllocatorBase:
    """What the parts of `Allocator` share (podnet.state.alloc)."""

    etcd: Etcd
    keys: Keys
    ipam: Ipam
    zone: str
    vni_min: int
    vni_max: int
    node_ips: dict[str, str] = field(default_factory=dict)

    @property
    def slots(self) -> quota.Slots:
        """Users' quota slots (state/quota.py)."""
        return quota.Slots(self.etcd, self.keys)

    # -- users -------------------------------------------------------------------------
    def user_vni(self, user: str, uid: int) -> int:
        """The user's VNI, allocated once for ever (create-if-absent)."""
        for _attempt in range(MAX_ATTEMPTS):
            kv = self.etcd.get(self.keys.user(user))
            if kv:
                return int(kv.json()["vni"])
            span = self.vni_max - self.vni_min + 1
            # start from a hash of the name so that users rarely race for the same VNI
            start = self.vni_min + (sum(user.encode()) * 2654435761 + uid) % span
            taken = {
                int(k.key.rsplit("/", 1)[-1])
                for k in self.etcd.get_prefix(self.keys.prefix("vnis"), keys_only=True)[0]
            }
            if len(taken) >= span:
                raise AllocError("no free VNI left in the configured range")
            vni = start
            while vni in taken:
                vni = self.vni_min + (vni - self.vni_min + 1) % span
            r = self.etcd.txn(
                [cmp_absent(self.keys.user(user)), cmp_absent(self.keys.vni(vni))],
                [
                    op_put(self.keys.user(user), {"vni": vni, "uid": uid}),
                    op_put(self.keys.vni(vni), {"user": user}),
                ],
            )
            if r.succeeded:
                log.info("user %s: VNI %d", user, vni)
                return vni
        raise AllocError(f"could not allocate a VNI for {user} (contention)")

    # -- views -------------------------------------------------------------------------
    def load_view(self, ips_seen: Callable[[list[KV]], None] | None = None) -> int:
        """(Re)load blocks and used IPs into the IPAM view; returns the etcd revision.
        `ips_seen` gets the `ips/` records (read with their values only then)."""
        blocks, rev = self.etcd.get_prefix(self.keys.prefix("blocks"))
        ips, rev2 = self.etcd.get_prefix(self.keys.prefix("ips"), keys_only=ips_seen is None)
        if ips_seen is not None:
            ips_seen(ips)
        with self.ipam.lock:
            self.ipam.used.clear()
            self.ipam.blocks.clear()
            self.ipam.node_blocks.clear()
            self.ipam.claims.clear()
        for kv in blocks:
            self.ipam.set_block(
                ipaddress.IPv4Network(block_from_key(kv.key)), str(kv.json().get("node"))
            )
        self.ipam.mark(k.key.rsplit("/", 1)[-1] for k in ips)
        return max(rev, rev2)

    # -- one address of a node (jobs, logins, containers) ------------------------------
    def next_address(
        self, node: str, new_blocks: list[tuple[ipaddress.IPv4Network, str]]
    ) -> str | None:
        """A candidate address of the node's blocks; when they are full, a new block is
        claimed (appended to new_blocks; PoolExhausted when none is left) and asked again:
        None only if even the new block has no free address."""
        ip = self.ipam.candidate(node)
        if ip is None:
            self._claim_block(node, new_blocks)
            ip = self.ipam.candidate(node)
        return ip

    def _claim_block(
        self, node: str, new_blocks: list[tuple[ipaddress.IPv4Network, str]]
    ) -> ipaddress.IPv4Network:
        blk = self.ipam.claim_block(node)
        new_blocks.append((blk, node))
        return blk

    def _release(self, ips: list[str], new_blocks: list[tuple[ipaddress.IPv4Network, str]]) -> None:
        self.ipam.release_pending(ips)
        self.ipam.unclaim_blocks(blk for blk, _node in new_blocks)

    def _place(
        self,
        node: str,
        records: Callable[[str], tuple[list[Any], list[Any]]],
        reads: list[Any],
    ) -> tuple[str | None, etcdops.TxnResult]:
        """One attempt at an address of `node`'s blocks (claiming a block if they are full)
        and its records (`records(ip)`: what else to compare, what to put), in one
        transaction that creates the address if absent; (the address, or None when the
        transaction lost, and its result: `reads` are read when it lost)."""
        new_blocks: list[tuple[ipaddress.IPv4Network, str]] = []
        try:
            ip = self.next_address(node, new_blocks)
        except PoolExhausted:
            self._release([], new_blocks)
            raise NoAddress("the pod network has no free address block") from None
        if ip is None:
            raise NoAddress("no free address")
        compare, puts = records(ip)
        compare = [*compare, cmp_absent(self.keys.ip(ip))]
        ops = []
        for blk, n in new_blocks:
            compare.append(cmp_absent(self.keys.block(str(blk))))
            ops.append(op_put(self.keys.block(str(blk)), {"node": n}))
        r = self.etcd.txn(compare, ops + puts, reads)
        if r.succeeded:
            self.ipam.mark([ip])
            self.ipam.release_pending([ip])
            self.ipam.confirm_blocks(blk for blk, _n in new_blocks)
            return ip, r
        self._release([ip], new_blocks)
        return None, r
