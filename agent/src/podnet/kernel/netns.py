# SPDX-License-Identifier: Apache-2.0
"""Network namespaces without forking: unshare in the calling thread, bind-mount, setns back.

A network namespace change with unshare(2)/setns(2) affects only the calling thread, so
any worker thread can create a pod namespace: it unshares, bind-mounts
/proc/thread-self/ns/net onto the pod's file (which keeps the namespace alive), opens
whatever sockets it needs there (they stay bound to that namespace), then returns to
the daemon's namespace. If returning fails the thread is unusable and the error is fatal
for the request (the caller must not keep using the thread's netns).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

CLONE_NEWNET = 0x40000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SHARED = 1 << 20
MNT_DETACH = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_void_p,
]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]

T = TypeVar("T")


class NetnsError(OSError):
    pass


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise NetnsError(e, f"{what}: {os.strerror(e)}")


def mount_bind(src: str, dst: str) -> None:
    _check(_libc.mount(src.encode(), dst.encode(), None, MS_BIND, None), f"bind {src} {dst}")


def umount(path: str) -> None:
    rc = _libc.umount2(path.encode(), MNT_DETACH)
    if rc != 0:
        e = ctypes.get_errno()
        if e not in (errno.EINVAL, errno.ENOENT):
            raise NetnsError(e, f"umount {path}: {os.strerror(e)}")


def make_shared_dir(d: Path) -> None:
    """Make `d` a shared mount point (as iproute2 does for /run/netns).

    Namespace bind mounts made in it then propagate to other mount namespaces.
    """
    d.mkdir(parents=True, exist_ok=True)
    if _libc.mount(b"none", str(d).encode(), None, MS_SHARED | MS_REC, None) == 0:
        return
    mount_bind(str(d), str(d))
    _check(
        _libc.mount(b"none", str(d).encode(), None, MS_SHARED | MS_REC, None), f"make-shared {d}"
    )


class HostNetns:
    """The daemon's own network namespace, to return to after a pod is created."""

    def __init__(self) -> None:
        self.fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self.ino = os.fstat(self.fd).st_ino

    def create(self, path: Path, inside: Callable[[], T]) -> T:
        """Create a netns at `path` and run `inside()` in it (same thread), then come back.

        `inside` typically opens sockets and writes /proc/sys/net values of the new
        namespace. On failure the namespace file is removed again.
        """
        fd = os.open(str(path), os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
        os.close(fd)
        mounted = False
        try:
            _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
            try:
                mount_bind("/proc/thread-self/ns/net", str(path))
                mounted = True
                return inside()
            finally:
                self.back()
        except BaseException:
            if mounted:
                umount(str(path))
            path.unlink(missing_ok=True)
            raise

    def spare(self, inside: Callable[[], T]) -> tuple[int, T]:
        """A new netns that has no file yet: (an fd that holds it, `inside()` run in it).
        `bind_fd` gives it its file later; closing the fd without that frees it."""
        _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        try:
            fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                return fd, inside()
            except BaseException:
                os.close(fd)
                raise
        finally:
            self.back()

    def back(self) -> None:
        rc = _libc.setns(self.fd, CLONE_NEWNET)
        if rc != 0:
            e = ctypes.get_errno()
            # a thread stuck in a pod netns must not serve other requests
            raise SystemExit(f"podnetd: setns back to the host netns failed: {os.strerror(e)}")

    def run_in(self, path: Path, fn: Callable[[], T]) -> T:
        """Run `fn` with the calling thread inside an existing netns."""
        fd = os.open(str(path), os.O_RDONLY | os.O_CLOEXEC)
        try:
            _check(_libc.setns(fd, CLONE_NEWNET), f"setns {path}")
            try:
                return fn()
            finally:
                self.back()
        finally:
            os.close(fd)


def bind_fd(path: Path, fd: int) -> None:
    """Give the namespace held by `fd` its file `path` (which must not exist yet)."""
    f = os.open(str(path), os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
    os.close(f)
    try:
        mount_bind(f"/proc/self/fd/{fd}", str(path))
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def remove(path: Path) -> bool:
    """Unmount and unlink a netns file; the kernel reaps its interfaces. True if it existed."""
    existed = path.exists()
    umount(str(path))
    path.unlink(missing_ok=True)
    return existed


def is_netns(path: Path) -> bool:
    """True if `path` is a mounted network namespace (not a stale empty file)."""
    try:
        fd = os.open(str(path), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        # an nsfs inode lives on the nsfs superblock (dev differs from the dir's fs)
        return st.st_dev != path.parent.stat().st_dev
    finally:
        os.close(fd)


def write_sysctl(name: str, value: str) -> None:
    """Write /proc/sys/<name> in the calling thread's network namespace."""
    with open("/proc/sys/" + name.replace(".", "/"), "w") as f:  # noqa: PTH123
        f.write(value)
