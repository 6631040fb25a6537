# SPDX-License-Identifier: Apache-2.0
"""Spare network namespaces: made ahead of the pods that will take them.

Creating a network namespace (unshare) and a veth pair are the dearest steps of a pod
and need nothing of the request, so a background thread keeps `SPARE_NETNS` spares ready:
a namespace held by an fd, with its netlink socket and sysctl made, and its veth (pod end
`eth0` down with a placeholder MAC, made in place; host end down, in no bridge, IPv6
address generation off). A pod takes one (`Dataplane.new_netns`), bind-mounts it on its
file and puts the host end into the user's bridge and up (one request). A spare is
reachable from nothing but podnetd's fd; its veth carries no frame (both ends down, no
address, no bridge), and goes with the namespace when podnetd closes the fd or exits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from podnet.kernel import netns, nl, nlquery, nlreq
from podnet.names import new_veth_name

log = logging.getLogger("podnet.dataplane")

#: network namespaces kept ready for the next pods (see the module's docstring)
SPARE_NETNS = 4
#: the pod end of a spare's veth (a container asking for another name gets no spare)
SPARE_IFNAME = "eth0"
#: a netlink socket
Socket = nl.Netlink

#: MAC of a pod's eth0 until its address is known (the link is down meanwhile)
PLACEHOLDER_MAC = "02:50:6e:ff:ff:fe"


@dataclass
class Spare:
    """A spare namespace: an fd that holds it, a netlink socket inside it, its veth."""

    fd: int
    sock: Socket
    veth: str  # host end (down, in no bridge)
    host_index: int
    eth0: int  # pod end (down, placeholder MAC), index inside
    lo: int
    mtu: int

    def close(self) -> None:
        """Free it (the kernel reaps the namespace and its veth)."""
        self.sock.close()
        os.close(self.fd)


class Spares:
    """The spares of one `Dataplane`, and the thread that makes them."""

    def __init__(self, host: netns.HostNetns, sock: Callable[[], Socket]) -> None:
        """`sock`: the calling thread's netlink socket in the daemon's netns."""
        self.host = host
        self._nl = sock
        self._spares: list[Spare] = []
        self._mtu = 0  # the pods' MTU, as the last pod asked (spares are made with it)
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def want(self) -> None:
        """Wake the thread: a pod's netlink work is done, or a spare was taken."""
        self._wanted.set()

    def take(self, mtu: int) -> Spare | None:
        """A spare namespace for a pod of MTU `mtu`, if one is ready. The background thread
        makes more once the pod is wired (`want`, from `Dataplane.wire_pod` and `discard`:
        its veth would compete with the pod's own netlink work for RTNL), or at once when
        none is left."""
        stale: list[Spare] = []
        with self._lock:
            if self._closed:
                return None
            if mtu != self._mtu:  # the first pod (or another MTU): made anew
                self._mtu = mtu
                stale, self._spares = self._spares, []
            spare = self._spares.pop() if self._spares else None
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="spare-netns", daemon=True)
                self._thread.start()
            urgent = not self._spares
        if urgent:
            self._wanted.set()
        for s in stale:
            s.close()
        return spare

    def bind(self, path: Path, spare: Spare) -> Socket:
        """The spare namespace on the pod's file `path`; its socket (the fd is closed)."""
        try:
            netns.bind_fd(path, spare.fd)
        except FileExistsError:
            with self._lock:  # the pod exists: the spare stays one
                keep = not self._closed and spare.mtu == self._mtu
                if keep:
                    self._spares.append(spare)
            if not keep:
                spare.close()
            raise
        except BaseException:
            spare.close()
            raise
        os.close(spare.fd)  # the mount holds the namespace now
        return spare.sock

    def _run(self) -> None:
        """The background thread: keeps SPARE_NETNS namespaces ready."""
        while True:
            self._wanted.wait()
            self._wanted.clear()
            while True:
                with self._lock:
                    if self._closed:
                        return
                    if len(self._spares) >= SPARE_NETNS:
                        break
                    mtu = self._mtu
                try:
                    spare = self._new(mtu)
                except OSError as e:
                    log.warning("spare network namespace not made: %s", e)
                    break  # the pods make their own; tried again at the next pod
                with self._lock:
                    if self._closed or mtu != self._mtu:
                        spare.close()
                        if self._closed:
                            return
                        continue
                    self._spares.append(spare)

    def _new(self, mtu: int) -> Spare:
        """A namespace held by an fd, with its socket, sysctl and veth (module docstring)."""
        fd, sock = self.host.spare(inside_new_netns)
        veth = new_veth_name()
        try:
            self._nl().batch(
                [
                    nlreq.veth(veth, SPARE_IFNAME, fd, mtu, 0, PLACEHOLDER_MAC),
                    nlreq.host_link_off_ipv6(veth),
                ]
            )
            host_index = nlquery.ifindex(self._nl(), veth)
            eth0, lo = nlquery.ifindex(sock, SPARE_IFNAME), nlquery.ifindex(sock, "lo")
        except BaseException:
            sock.close()
            os.close(fd)  # the veth goes with the namespace
            raise
        return Spare(fd, sock, veth, host_index, eth0, lo, mtu)

    def close(self) -> None:
        """Free the spares; no more are made."""
        with self._lock:
            self._closed = True
            spares, self._spares = self._spares, []
        self._wanted.set()
        for spare in spares:
            spare.close()


def inside_new_netns() -> nl.Netlink:
    """What a new pod namespace gets, run inside it: its netlink socket, unprivileged ping
    (in a fakeroot container too, whose root is a user here) and ports below 1024 for its
    user (a pod is one user's alone, as a container's network is: HPK's DNS for Service
    names listens on port 53 of the user's control plane pod, docs/hpk.md). Best effort:
    read-only /proc/sys/net."""
    sock = nl.Netlink()
    with contextlib.suppress(OSError):
        netns.write_sysctl("net.ipv4.ping_group_range", "0 2147483647")
    with contextlib.suppress(OSError):
        netns.write_sysctl("net.ipv4.ip_unprivileged_port_start", "0")
    return sock
