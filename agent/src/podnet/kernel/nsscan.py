# SPDX-License-Identifier: Apache-2.0
"""Which network namespaces hold a process (the container collector's eyes, node/collect.py).

A network namespace is named here by `NsId`: the device and inode of its nsfs file (what
`stat` of `/proc/<pid>/ns/net`, of a bind mount of it, or of an open namespace fd gives),
plus, when podnetd records one, the namespace's cookie (`SO_NETNS_COOKIE`: a 64-bit number
the kernel gives each namespace once, never reused until reboot) and the boot it belongs to.

`scan` is one pass over /proc (a `stat` per process, no file read): every namespace some
process is in, with one such process. `holds` checks one process cheaply (is it still in
that namespace?), so a collector that remembers a process per namespace scans only when
one of them left.

Why device + inode cannot take a new namespace for an old one: a namespace's inode number
is its `ns.inum`, allocated when it is made and freed only when it is destroyed; podnetd
keeps a bind mount of every container's namespace (`<netns_dir>/pn-c...`), which holds a
reference, so the namespace lives, and no other namespace can get its number, as long as
the record does. The collector checks that the bind mount still shows that inode before it
trusts it, and at adoption (after a restart) the cookie and boot id of the namespace at
the bind mount against the record: after a reboot, or if something else was mounted there,
they differ.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

#: getsockopt(SOL_SOCKET, SO_NETNS_COOKIE) (Linux >= 5.14)
SO_NETNS_COOKIE = 71


@dataclass(frozen=True)
class NsId:
    """A network namespace: nsfs device and inode (see the module's docstring)."""

    dev: int
    ino: int

    @classmethod
    def of_stat(cls, st: os.stat_result) -> NsId:
        return cls(st.st_dev, st.st_ino)


def ns_of(path: str | Path) -> NsId | None:
    """The namespace a path (or `/proc/<pid>/ns/net`) shows now; None if none."""
    try:
        return NsId.of_stat(os.stat(path))  # noqa: PTH116 (no Path object per call)
    except OSError:
        return None


def holds(pid: int, ns: NsId, proc: str = "/proc") -> bool:
    """Whether process `pid` is in namespace `ns` (a zombie is in none)."""
    return pid > 0 and ns_of(f"{proc}/{pid}/ns/net") == ns


def scan(proc: str = "/proc") -> dict[NsId, int]:
    """Every network namespace a process is in, with one of its processes: one pass over
    `proc` (thread-group leaders; a thread that entered another namespace alone is not
    seen, nor an fd or a socket that keeps a namespace alive with no process in it)."""
    out: dict[NsId, int] = {}
    with os.scandir(proc) as it:
        for entry in it:
            name = entry.name
            if not name.isdigit():
                continue
            try:
                st = os.stat(f"{proc}/{name}/ns/net")  # noqa: PTH116 (hot loop)
            except OSError:  # gone meanwhile, or a zombie
                continue
            out.setdefault(NsId(st.st_dev, st.st_ino), int(name))
    return out


def cookie(sock: socket.socket | int) -> int:
    """The cookie of the namespace a socket was made in (0 if the kernel has none)."""
    s = sock if isinstance(sock, socket.socket) else socket.socket(fileno=os.dup(sock))
    try:
        return int.from_bytes(s.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8), "little")
    except OSError:
        return 0
    finally:
        if s is not sock:
            s.close()


def cookie_here() -> int:
    """The cookie of the calling thread's network namespace (run inside one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return cookie(s)


def boot_id() -> str:
    """This boot (a namespace's cookie and inode are unique within one boot only)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""
