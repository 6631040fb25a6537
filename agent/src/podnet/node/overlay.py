# SPDX-License-Identifier: Apache-2.0
"""The users' overlay, resolved on demand: what a user's VXLAN meets, this node finds
in the cluster-wide block map, so no node reads another node's pod records.

A pod's ARP request for a pod of another node, or a frame to a MAC its user's VXLAN has
no entry of, is a miss (`podnet.kernel.vxmiss`). A pod's address is in a block its node
owns (`blocks/`), its MAC is derived from the address (`names.mac_for_ip`), and its
node's underlay address is registered (`nodes/`): `ClusterView.vtep_of`. So the device
gets a neighbour entry (its proxy answers the pod's next ARP request) and a forwarding
entry to that node alone (`UserLinks.resolve`), and the pod that asked is answered at
once (`UserLinks.announce`: an ARP reply into the user's bridge; without it, at its next
request, 20 ms later). A miss for an address no block holds, or a block of this node, is
left unanswered.

What one user's pods make this node do is bounded: at most `PER_USER` remote pods per
user (the oldest resolved goes first), at most `RATE` resolutions a second per user
(`BURST` at once); misses beyond are dropped (the pod repeats its ARP request). A frame
of another user never gets an entry: entries live in the user's own VXLAN (its VNI), and
the node a frame goes to delivers it into that VNI's bridge only.

The entries stay right when the map changes: after a block moved or a node's address
changed (`repoint`, from the sync loop), each resolved pod is looked up again, moved or
forgotten.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict

from podnet.kernel.dataplane import Dataplane
from podnet.kernel.vxmiss import Miss, MissSocket
from podnet.names import ip_of_mac
from podnet.state.clusterview import ClusterView

log = logging.getLogger("podnet.overlay")

#: remote pods one user's VXLAN keeps entries of on this node
PER_USER = 16384
#: resolutions per second per user, and at once (a whole user's worth: an all-to-all
#: wire-up of a 10,000-node job meets 9,999 remote pods per node at once)
RATE = 4000.0
BURST = float(PER_USER)


class _Bucket:
    def __init__(self) -> None:
        self.tokens = BURST
        self.at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(BURST, self.tokens + (now - self.at) * RATE)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class Overlay:
    """Resolves the users' VXLAN misses (`run`, its own thread) and keeps what it
    resolved right (`repoint`)."""

    def __init__(self, dp: Dataplane, view: ClusterView, per_user: int = PER_USER) -> None:
        self.dp = dp
        self.view = view
        self.per_user = per_user
        #: vni -> remote pod address -> the underlay address its entries send to
        self.resolved: dict[int, OrderedDict[str, str]] = {}
        self._buckets: dict[int, _Bucket] = {}
        self._mutex = threading.Lock()
        #: counters (metrics, tests): misses seen, pods resolved, misses dropped
        self.misses = 0
        self.resolutions = 0
        self.dropped = 0

    # -- misses --------------------------------------------------------------------------
    def handle(self, misses: list[Miss]) -> int:
        """Resolve what these misses ask for; returns how many pods got entries."""
        todo: dict[int, dict[str, str | None]] = {}
        asked: dict[int, list[str]] = {}  # L3 misses: pods waiting for an ARP reply
        with self._mutex:
            for m in misses:
                self.misses += 1
                vni = self.dp.vni_of_vxlan(m.ifindex)
                ip = m.ip if m.ip is not None else ip_of_mac(m.mac or "")
                if vni is None or ip is None:
                    continue
                vtep = self.view.vtep_of(ip)
                if vtep is None:
                    continue
                bucket = self._buckets.setdefault(vni, _Bucket())
                if not bucket.take():
                    self.dropped += 1
                    continue
                mine = self.resolved.setdefault(vni, OrderedDict())
                mine.pop(ip, None)
                mine[ip] = vtep
                todo.setdefault(vni, {})[ip] = vtep
                if m.ip is not None:
                    asked.setdefault(vni, []).append(ip)
                while len(mine) > self.per_user:
                    old, _vtep = mine.popitem(last=False)
                    todo[vni][old] = None
        done = 0
        for vni, remote in todo.items():
            self.dp.resolve(vni, list(remote.items()))
            done += sum(v is not None for v in remote.values())
            waiting = [ip for ip in dict.fromkeys(asked.get(vni, [])) if remote.get(ip)]
            if waiting:
                self.dp.announce(vni, waiting)
        self.resolutions += done
        return done

    def run(self, stop: threading.Event) -> None:
        """Read the misses of this node's VXLANs until `stop` (a thread of its own)."""
        sock = MissSocket()
        try:
            while not stop.is_set():
                misses = sock.read(1.0)
                if misses:
                    try:
                        self.handle(misses)
                    except Exception:  # the next miss of the same pod comes again
                        log.exception("resolving %d misses failed", len(misses))
                self.dropped += sock.overflows
                sock.overflows = 0
        finally:
            sock.close()

    # -- the map changed -------------------------------------------------------------------
    def repoint(self) -> int:
        """After a block moved or a node's address changed: every resolved pod looked up
        again (moved to its new node, forgotten if no block holds it any more); a user
        whose VXLAN went is forgotten. Returns how many entries changed."""
        present = set(self.dp.vxlans.values())
        todo: dict[int, dict[str, str | None]] = {}
        with self._mutex:
            for vni in [v for v in self.resolved if v not in present]:
                del self.resolved[vni]
                self._buckets.pop(vni, None)
            for vni, mine in self.resolved.items():
                for ip, vtep in list(mine.items()):
                    now = self.view.vtep_of(ip)
                    if now == vtep:
                        continue
                    todo.setdefault(vni, {})[ip] = now
                    if now is None:
                        del mine[ip]
                    else:
                        mine[ip] = now
        for vni, remote in todo.items():
            self.dp.resolve(vni, list(remote.items()))
        return sum(len(r) for r in todo.values())
