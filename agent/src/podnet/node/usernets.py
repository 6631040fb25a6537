# SPDX-License-Identifier: Apache-2.0
"""Per-user networks on this node: the user's VNI, bridge and VXLAN device, from the user's
first pod here until `user_net_linger` seconds after their last one. Where the user's pods
on other nodes are, the VXLAN asks when it meets one (`node/overlay.py`, from the block
map): nothing is registered for it. For podnetd of
earlier versions during a rolling upgrade, which still read `vteps/<vni>/<node>`, this
node writes its own there too, in the background, until etcd refuses it (authentication
on: nodes may not write there).

Everything about one user's network and pods on this node happens under that user's lock
(`lock(uid)`): the first pod of a user builds the network once, the last one schedules
its removal, and the linger timer re-checks under the same lock before removing it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from podnet.kernel.dataplane import Dataplane
from podnet.names import Keys
from podnet.node.pods import PodTable
from podnet.state.alloc import Allocator
from podnet.state.clusterview import ClusterView
from podnet.state.store import Etcd, EtcdPermissionDenied, EtcdRequestError, EtcdUnavailable

log = logging.getLogger("podnet.usernets")


class UserNetworks:
    def __init__(
        self,
        etcd: Etcd,
        keys: Keys,
        alloc: Allocator,
        dp: Dataplane,
        pods: PodTable,
        node: str,
        underlay_ip: str,
        linger: float,
        view: ClusterView,
    ) -> None:
        """`view`: the users' VNIs, as the watches say."""
        self.etcd = etcd
        self.keys = keys
        self.alloc = alloc
        self.dp = dp
        self.pods = pods
        self.node = node
        self.underlay_ip = underlay_ip
        self.linger = linger
        self._locks: dict[int, threading.Lock] = {}
        self._vnis: dict[str, int] = {}  # a user's VNI never changes
        self._registered: set[int] = set()  # VNIs with a legacy VTEP key of this node
        self._idle: dict[int, tuple[float, int]] = {}  # vni -> (last pod gone, uid)
        self._mutex = threading.Lock()  # the four tables above
        self.view = view
        #: legacy VTEP keys (`vteps/<vni>/<node>`) while etcd takes them
        self._legacy = True
        self._bg = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vtep-legacy")

    def lock(self, uid: int) -> threading.Lock:
        """The user's lock: held while their network or pods on this node change."""
        with self._mutex:
            return self._locks.setdefault(uid, threading.Lock())

    def vni(self, user: str, uid: int) -> int:
        with self._mutex:
            vni = self._vnis.get(user)
        if vni is None:
            vni = self.view.user_vni(user)
        if vni is None:
            vni = self.alloc.user_vni(user, uid)
            with self._mutex:
                self._vnis[user] = vni
        return vni

    def ensure(self, user: str, uid: int) -> tuple[int, int]:
        """(vni, bridge index): the user's VNI, bridge and VXLAN. Called with the user's
        lock held."""
        vni = self.vni(user, uid)
        with self._mutex:
            self._idle.pop(vni, None)
        bri = self.dp.user_bridge(vni)
        if bri is None:  # first pod of this user here: bridge and VXLAN
            bri = self.dp.ensure_user(vni)
        self.register_vteps([vni])
        return vni, bri

    def register_vteps(self, vnis: Iterable[int]) -> None:
        """This node's legacy VTEP keys (read by podnetd of earlier versions), in the
        background, while etcd takes them."""
        with self._mutex:
            todo = [v for v in vnis if v not in self._registered] if self._legacy else []
            self._registered.update(todo)
        for vni in todo:
            self._bg.submit(self._legacy_put, vni)

    def _legacy_put(self, vni: int) -> None:
        try:
            self.etcd.put(self.keys.vtep(vni, self.node), {"ip": self.underlay_ip})
        except EtcdPermissionDenied:
            log.info("etcd refuses legacy VTEP keys (authentication on): none written from now on")
            self._legacy = False
        except (EtcdUnavailable, EtcdRequestError) as e:
            log.debug("legacy VTEP key of VNI %d: %s", vni, e)
            with self._mutex:
                self._registered.discard(vni)

    def release(self, vni: int, uid: int) -> None:
        """A pod of this VNI is gone: if it was the user's last one here, their network
        stays for `linger` seconds (a user running short jobs one after the other pays
        for it once, not per job), then `remove_idle` removes it. Called with the
        user's lock held."""
        if self.pods.uses_vni(vni):
            return
        if self.linger > 0:
            with self._mutex:
                self._idle.setdefault(vni, (time.monotonic(), uid))
            return
        self._remove(vni)

    def _remove(self, vni: int) -> None:
        with self._mutex:
            legacy = vni in self._registered and self._legacy
            self._registered.discard(vni)
        if legacy:
            with contextlib.suppress(EtcdUnavailable, EtcdRequestError):
                self.etcd.delete(self.keys.vtep(vni, self.node))
        self.dp.remove_user(vni)

    def remove_idle(self, now: float) -> list[int]:
        """Remove the networks idle for `linger` seconds, each under its user's lock (a
        pod being built keeps its bridge); returns their VNIs."""
        with self._mutex:
            due = [(v, uid) for v, (t, uid) in self._idle.items() if now - t >= self.linger]
        done = []
        for vni, uid in due:
            with self.lock(uid):
                with self._mutex:
                    if self._idle.pop(vni, None) is None:
                        continue
                if self.pods.uses_vni(vni):
                    continue
                self._remove(vni)
                done.append(vni)
        return done

    def remove_unused(self, vnis_in_use: set[int]) -> None:
        """At start: the networks of users with no pod left on this node go; those with
        pods are taken over as this podnetd makes them (an older podnetd's VXLAN made
        again: `Dataplane.ensure_user`), so their misses are answered."""
        for vni in self.dp.user_ports():
            if vni not in vnis_in_use:
                self.dp.remove_user(vni)
        for vni in sorted(vnis_in_use):
            self.dp.ensure_user(vni)

    def run(self, stop: threading.Event) -> None:
        """The linger timer."""
        while not stop.wait(min(5.0, max(0.5, self.linger / 4))):
            try:
                for vni in self.remove_idle(time.monotonic()):
                    log.info("VNI %d: no pod here for %.0f s, network removed", vni, self.linger)
            except Exception:
                log.exception("removing idle user networks failed")
