# SPDX-License-Identifier: Apache-2.0
"""Who owns a network namespace, as the kernel says (nsfs ioctls, /proc): what podnetd
reads of a container's namespace before it wires it (node.containers decides from it).

A namespace named by path (`/proc/<pid>/ns/net`, what CNI runtimes pass, or a bind-mounted
file under NETNS_DIRS) is opened and checked to be a network namespace; its user
namespace, that user namespace's creator, and the process the path names (its real uid
and start time, so a recycled pid is never taken for it) come from the kernel, never from
the request.
"""

from __future__ import annotations

import fcntl
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from podnet.errors import PodnetError

# ioctls of nsfs (linux/nsfs.h)
NS_GET_USERNS = 0xB701
NS_GET_NSTYPE = 0xB703
NS_GET_OWNER_UID = 0xB704
CLONE_NEWNET = 0x40000000

#: where namespace files named by path may be (besides /proc/<pid>/ns/net)
NETNS_DIRS = ("/run/netns/", "/var/run/netns/", "/run/user/")

_PROC_NETNS = re.compile(r"^/proc/([1-9][0-9]{0,9})/(?:task/[1-9][0-9]{0,9}/)?ns/net$")


@dataclass
class NsFacts:
    """What the kernel says about a network namespace podnetd opened."""

    host_userns: bool  # its user namespace is podnetd's (the host's)
    userns_owner: int  # creator of its user namespace (0 for the host's)
    proc_uid: int | None  # real uid of the process the path names, if it names one
    pid: int  # that process (0: none)
    start: int  # its start time (clock ticks since boot; 0: none)
    ino: tuple[int, int]  # (st_dev, st_ino) of the namespace


def proc_start(pid: int) -> int:
    """Start time of a process (clock ticks since boot), 0 if it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return 0
    # after the command's ")": state is field 3, starttime field 22
    rest = data[data.rfind(b")") + 2 :].split()
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return 0


def proc_uid(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def alive(pid: int, start: int) -> bool:
    return pid > 0 and proc_start(pid) == start and start != 0


def _pid_ns(pid: int | str) -> tuple[int, int] | None:
    try:
        st = Path(f"/proc/{pid}/ns/pid").stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def host_proc_path(path: str, caller_pid: int) -> str:
    """`/proc/<pid>/ns/net` as the caller's pid namespace numbers it, in podnetd's numbers.
    A runtime in a job step (jobs have pid namespaces of their own) names its container by
    its own pid numbers; podnetd's /proc has the host's. The process is looked for in the
    caller's pid namespace only (NSpid); not found: a path that does not exist. Other
    paths, and callers in podnetd's pid namespace, are returned as they are."""
    m = _PROC_NETNS.match(path)
    ns = _pid_ns(caller_pid) if m and caller_pid > 0 else None
    if m is None or ns is None or ns == _pid_ns("self"):
        return path
    want = m.group(1)
    for p in Path("/proc").iterdir():
        d = p.name
        if not d.isdigit() or _pid_ns(d) != ns:
            continue
        try:
            status = (p / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:"):
                if line.split()[-1] == want:
                    return f"/proc/{d}/ns/net"
                break
    return f"/proc/{want}/ns/net/not-in-the-callers-pid-namespace"


def open_netns(path: str) -> tuple[int, NsFacts]:
    """Open a network namespace named by `path` and read who owns it; the caller closes
    the fd. Raises PodnetError for anything that is not a network namespace."""
    if "\0" in path or len(path) > 4096 or ".." in path.split("/"):
        raise PodnetError("EINVAL", "'netns' must be an absolute path")
    if not _PROC_NETNS.match(path) and not path.startswith(NETNS_DIRS):
        raise PodnetError(
            "EINVAL", f"'netns' must be /proc/<pid>/ns/net or under {', '.join(NETNS_DIRS)}"
        )
    try:
        # O_NONBLOCK: a FIFO or a device named here must not hold the thread
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise PodnetError("ENOENT", f"{path}: {e.strerror}") from None
    try:
        try:
            kind = fcntl.ioctl(fd, NS_GET_NSTYPE)
        except OSError:
            raise PodnetError("EINVAL", f"{path} is not a namespace") from None
        if kind != CLONE_NEWNET:
            raise PodnetError("EINVAL", f"{path} is not a network namespace")
        st = os.fstat(fd)
        ufd = fcntl.ioctl(fd, NS_GET_USERNS)
        try:
            owner = struct.unpack("I", fcntl.ioctl(ufd, NS_GET_OWNER_UID, b"\0" * 4))[0]
            host = os.fstat(ufd).st_ino == Path("/proc/self/ns/user").stat().st_ino
        finally:
            os.close(ufd)
        pid, start, puid = 0, 0, None
        m = _PROC_NETNS.match(path)
        if m:
            pid = int(m.group(1))
            start = proc_start(pid)
            puid = proc_uid(pid)
            # the pid was not reused between the open and the reads
            try:
                again = Path(path).stat()
            except OSError:
                raise PodnetError("ENOENT", f"{path}: process gone") from None
            if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) or not start:
                raise PodnetError("ENOENT", f"{path}: process gone")
        if (st.st_dev, st.st_ino) == _own_netns():
            raise PodnetError("EINVAL", "that is the host's network namespace")
        return fd, NsFacts(host, int(owner), puid, pid, start, (st.st_dev, st.st_ino))
    except BaseException:
        os.close(fd)
        raise


def _own_netns() -> tuple[int, int]:
    st = Path("/proc/self/ns/net").stat()  # the main thread: the host netns
    return st.st_dev, st.st_ino
