# SPDX-License-Identifier: Apache-2.0
"""Which containers are dead: their network namespace holds no process any more (issue 22,
item 2), whatever named it when it was wired (`/proc/<pid>/ns/net`, a symlink to it, a
bind mount, an fd of another process), and also when it was podnetd's own (`pn-c...`,
kept alive by podnetd's bind mount alone).

A container's record keeps its namespace's identity (`nsscan.NsId`: nsfs device and inode
of the namespace podnetd configured, read from podnetd's own bind mount of it, never from
the path the request gave). Each cycle:

1. a container whose recorded process (`pid` + start time) is gone is dead, as before;
2. a container whose bind mount no longer shows its namespace is dead (someone unmounted
   it: podnetd no longer holds the namespace, and its inode number could be reused);
3. each remaining container's last known process (its witness) is asked whether it is
   still in the namespace: one `stat` each;
4. only if a witness left (or a container has none yet) is /proc scanned, once for all
   containers: a namespace in which no process is found is dead, unless the container is
   younger than `grace` and was never seen with a process (a runtime that wires a namespace
   first and starts its process after; a pn-c namespace the helper has not entered yet).

A container wired with no process named (a bind mount, a symlink, an fd) is looked at
once when it is added (`look`): a namespace whose process was there at ADD and is killed
before the loop's next cycle is then collected within a cycle, not after `grace`.

So a cycle costs a stat per container while nothing changed, and a stat per process of
the node when something did; `nsscan` explains why an inode number cannot point at a new
namespace while the record lives.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from podnet.kernel import nsscan
from podnet.kernel.nsfs import alive
from podnet.kernel.nsscan import NsId
from podnet.node.pods import Pod

#: seconds a container that was never seen with a process in its namespace is kept
GRACE = 30.0


@dataclass
class Verdict:
    pod: Pod
    why: str


@dataclass
class Collector:
    """The container loop's decision (pure but for the kernel reads it is given)."""

    grace: float = GRACE
    scan: Callable[[], dict[NsId, int]] = nsscan.scan
    holds: Callable[[int, NsId], bool] = nsscan.holds
    ns_at: Callable[[str], NsId | None] = nsscan.ns_of
    pid_alive: Callable[[int, int], bool] = alive
    #: container -> a process last seen in its namespace
    witness: dict[str, int] = field(default_factory=dict)
    #: scans of /proc so far (a figure for the benchmark and the tests)
    scans: int = 0

    def look(self, pod: Pod) -> bool:
        """At ADD of a container whose record names no process: one scan for a process
        in its namespace (its witness); True if one is there."""
        if pod.ns_id is None:
            return False
        pid = self.scan().get(pod.ns_id)
        self.scans += 1
        if pid is None:
            return False
        self._seen(pod, pid)
        return True

    def _seen(self, pod: Pod, pid: int) -> None:
        """`pid` is in the pod's namespace: its witness; the namespace was seen with one."""
        self.witness[pod.name] = pid
        pod.ns_seen = True

    def dead(self, pods: list[Pod], now: float | None = None) -> list[Verdict]:
        """The containers of `pods` to collect, with why."""
        now = time.time() if now is None else now
        out: list[Verdict] = []
        pending: list[tuple[Pod, NsId]] = []
        names = set()
        for p in pods:
            if p.kind != "container":
                continue
            names.add(p.name)
            if p.pid and not self.pid_alive(p.pid, p.pid_start):
                out.append(Verdict(p, f"process {p.pid} is gone"))
                continue
            ns = p.ns_id
            if ns is None:
                continue  # not known (being wired): next cycle
            if self.ns_at(p.netns) != ns:
                out.append(Verdict(p, f"its namespace is no longer held at {p.netns}"))
                continue
            w = self.witness.get(p.name)
            if w is not None and self.holds(w, ns):
                continue
            self.witness.pop(p.name, None)
            pending.append((p, ns))
        for gone in set(self.witness) - names:
            del self.witness[gone]
        if not pending:
            return out
        live = self.scan()
        self.scans += 1
        for p, ns in pending:
            pid = live.get(ns)
            if pid is not None:
                self._seen(p, pid)
            elif p.ns_seen or now - p.created > self.grace:
                out.append(Verdict(p, "no process is left in its network namespace"))
        return out


def identity(path: str | Path) -> NsId | None:
    """The namespace podnetd holds at `path` (its bind mount)."""
    return nsscan.ns_of(path)
