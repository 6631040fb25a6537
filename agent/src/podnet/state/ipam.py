# SPDX-License-Identifier: Apache-2.0
"""Address management: per-node blocks of the pod CIDR, and an in-memory view of used IPs.

The view is fed by etcd (initial list + watch) and by the agent's own writes. It only
proposes candidates; etcd's `create_revision == 0` guard on `ips/<ip>` decides, so a
stale view costs a retry, never a double allocation.
"""

from __future__ import annotations

import hashlib
import ipaddress
import socket
import threading
from collections.abc import Iterable


class PoolExhausted(Exception):
    pass


def ip_to_int(ip: str) -> int:
    """Dotted quad -> int (much faster than `ipaddress` on the allocation hot path)."""
    return int.from_bytes(socket.inet_aton(ip), "big")


def int_to_ip(n: int) -> str:
    return socket.inet_ntoa(n.to_bytes(4, "big"))


class Ipam:
    def __init__(self, pod_cidr: ipaddress.IPv4Network, block_prefix: int) -> None:
        self.cidr = pod_cidr
        self.block_prefix = block_prefix
        self.lock = threading.Lock()
        self.used: set[int] = set()
        self.pending: set[int] = set()
        self.blocks: dict[ipaddress.IPv4Network, str] = {}
        self.node_blocks: dict[str, list[ipaddress.IPv4Network]] = {}
        #: blocks this agent put in the view for a transaction etcd has not answered
        #: (`claim_block`): only these may be taken back by `unclaim_blocks`
        self.claims: set[ipaddress.IPv4Network] = set()
        self._cursor: dict[ipaddress.IPv4Network, int] = {}
        self._reserved = {int(pod_cidr.network_address), int(pod_cidr.broadcast_address)}
        self.n_blocks = 1 << (block_prefix - pod_cidr.prefixlen)

    # -- blocks ------------------------------------------------------------------------
    def set_block(self, block: ipaddress.IPv4Network, node: str | None) -> None:
        """What etcd says of `block` (its owner, None: free): overrides any claim of ours."""
        with self.lock:
            self.claims.discard(block)
            self._set(block, node)

    def _set(self, block: ipaddress.IPv4Network, node: str | None) -> None:
        old = self.blocks.pop(block, None)
        if old is not None and block in self.node_blocks.get(old, []):
            self.node_blocks[old].remove(block)
        if node is not None:
            self.blocks[block] = node
            self.node_blocks.setdefault(node, []).append(block)
            self.node_blocks[node].sort()

    def reset(self, blocks: dict[ipaddress.IPv4Network, str | None], used: Iterable[str]) -> None:
        """The view from a whole read: the blocks' owners, the addresses in use (claims
        of ours forgotten)."""
        with self.lock:
            self.used.clear()
            self.blocks.clear()
            self.node_blocks.clear()
            self.claims.clear()
        for blk, node in blocks.items():
            self.set_block(blk, node)
        self.mark(used)

    def claim_block(self, node: str) -> ipaddress.IPv4Network:
        """A free block put in the view as `node`'s until etcd answers the transaction
        that claims it (`confirm_blocks` or `unclaim_blocks`)."""
        while True:
            blk = self.free_blocks(node, 1)[0]
            with self.lock:
                if blk in self.blocks:  # taken meanwhile (a watch event): the next one
                    continue
                self._set(blk, node)
                self.claims.add(blk)
                return blk

    def confirm_blocks(self, blocks: Iterable[ipaddress.IPv4Network]) -> None:
        """Our transaction claiming `blocks` succeeded."""
        with self.lock:
            self.claims.difference_update(blocks)

    def unclaim_blocks(self, blocks: Iterable[ipaddress.IPv4Network]) -> None:
        """Our transaction claiming `blocks` failed: free those still only claimed. A block
        etcd reported meanwhile (`set_block`: typically the same block claimed for the
        same node by the node that won the race) keeps what etcd said; freeing it would
        drop the route to that node's pods until the block changes again."""
        with self.lock:
            for blk in blocks:
                if blk in self.claims:
                    self.claims.discard(blk)
                    self._set(blk, None)

    def free_blocks(self, node: str, count: int) -> list[ipaddress.IPv4Network]:
        """`count` unowned blocks, searched from a per-node starting point (less contention)."""
        start = int.from_bytes(hashlib.sha256(node.encode()).digest()[:4], "big") % self.n_blocks
        out: list[ipaddress.IPv4Network] = []
        base = int(self.cidr.network_address)
        size = 1 << (32 - self.block_prefix)
        with self.lock:
            for i in range(self.n_blocks):
                k = (start + i) % self.n_blocks
                b = ipaddress.IPv4Network((base + k * size, self.block_prefix))
                if b not in self.blocks:
                    out.append(b)
                    if len(out) == count:
                        break
        if not out:
            raise PoolExhausted(f"no free address block of /{self.block_prefix} in {self.cidr}")
        return out

    # -- addresses ---------------------------------------------------------------------
    def mark(self, ips: Iterable[str], used: bool = True) -> None:
        with self.lock:
            for ip in ips:
                n = ip_to_int(ip)
                if used:
                    self.used.add(n)
                else:
                    self.used.discard(n)

    def candidate(self, node: str) -> str | None:
        """A free address from one of `node`'s blocks, reserved locally until released."""
        with self.lock:
            for b in self.node_blocks.get(node, []):
                first = int(b.network_address)
                size = b.num_addresses
                cur = self._cursor.get(b, 0)
                for i in range(size):
                    n = first + (cur + i) % size
                    if n in self.used or n in self.pending or n in self._reserved:
                        continue
                    self._cursor[b] = (cur + i + 1) % size
                    self.pending.add(n)
                    return int_to_ip(n)
        return None

    def release_pending(self, ips: Iterable[str]) -> None:
        with self.lock:
            for ip in ips:
                self.pending.discard(ip_to_int(ip))
