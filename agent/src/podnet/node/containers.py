# SPDX-License-Identifier: Apache-2.0
"""Containers on their owner's private network (issue 10: the CNI plugin, podnet-container).

A container is an extra pod of kind `container`: an interface in a network namespace
that podnetd did not make for a job or a login, on the owner's bridge (the same VNI as
the user's jobs), with an address from this node's block and a DNS name
`<label>.<user>.<zone>` (record `/skydns/<zone>/<user>/<label>/ctr`: the label answers,
unless a live job of the user takes the same name, which wins as jobs do).

Who owns it is what the kernel says, never what the request claims:

* a namespace given by path (`/proc/<pid>/ns/net`, what CNI runtimes pass, or a
  bind-mounted file) is opened by podnetd and checked to be a network namespace; if its
  user namespace is not the host's, its owner is that user namespace's creator (a
  `--fakeroot` container, `unshare -rn`): a user may wire only namespaces of user
  namespaces they created themselves (so never the host's network, nor a job pod's);
* a namespace of the host's user namespace (made by a privileged runtime) may be wired
  by root only; its owner is the real uid of the process the path names, and only when
  that is root may root name the user (`uid`);
* with no path, podnetd makes the namespace (`pn-c...`) for the caller and ties it to
  the caller's process (`pid`, its start time): the `podnet-container` helper enters it,
  drops privileges and runs the unprivileged Apptainer in it.

podnetd keeps a bind mount of every container's namespace at `<netns_dir>/pn-c<hex>`,
which makes it adoptable after a restart like any pod; the etcd record
`containers/<node>/<pn-c...>` says whose it is, and which namespace (device, inode and
cookie of the one podnetd wired, and the boot). A container whose recorded process is
gone, or whose namespace holds no process any more however it was named, is released by
the container loop (every `CONTAINER_GC_SECONDS`, node/collect.py); DEL releases it at once.
At start, records of this node whose namespace is not here any more (a reboot) are released.

Quotas (state/quota.py): a user's containers on this node are counted here, under the
user's lock; their containers and addresses in the cluster by the allocation's transaction.

This module is the lifecycle and the rules; the layers below do the work, through the
calls pods use: a namespace's facts `kernel.nsfs`, the interface `PodWiring`
(`Dataplane.new_netns` + `wire_pod`, namespace `foreign`), the address and records
`Allocator.allocate_container` / `release_container`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pwd
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from podnet.config import ClusterConfig
from podnet.errors import PodnetError
from podnet.kernel import nsscan
from podnet.kernel.dataplane import Dataplane, NewNetns
from podnet.kernel.nsfs import NsFacts, alive, host_proc_path, open_netns, proc_start
from podnet.kernel.nsscan import NsId
from podnet.names import CONTAINER_NS_PREFIX as PREFIX
from podnet.names import container_netns as ns_name
from podnet.names import is_container_netns as is_container_ns
from podnet.node.collect import GRACE, Collector
from podnet.node.pods import Pod, PodTable, PodWiring
from podnet.node.usernets import UserNetworks
from podnet.state import quota
from podnet.state.alloc import Allocator, NoAddress

log = logging.getLogger("podnet.containers")

CONTAINER_GC_SECONDS = 2.0

_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_CID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,1023}$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.\-]{1,15}$")


def default_label(container_id: str) -> str:
    """The name of a container that asked for none: `c-` + 10 hex digits of its id."""
    return "c-" + hashlib.sha256(container_id.encode()).hexdigest()[:10]


def check_label(label: str) -> str:
    label = label.lower()
    if not _LABEL.match(label) or label == "login" or label.isdigit():
        raise PodnetError("EINVAL", f"container name {label!r} is not a usable DNS label")
    return label


def decide_owner(caller_uid: int, facts: NsFacts, asked_uid: int | None) -> int:
    """The uid a container's interface is for (pure: unit tested).

    Users may wire only namespaces of user namespaces they created; root may wire any
    namespace, and names the user only for root's own namespaces."""
    if not facts.host_userns and facts.userns_owner != 0:
        owner = facts.userns_owner
        if caller_uid not in (0, owner):
            raise PodnetError("EPERM", "that network namespace is not yours")
        if caller_uid == 0 and asked_uid not in (None, owner):
            raise PodnetError(
                "EPERM", f"that network namespace belongs to uid {owner}, not {asked_uid}"
            )
        return owner
    if caller_uid != 0:
        raise PodnetError(
            "EPERM",
            "only network namespaces of a user namespace you created (fakeroot, "
            "unshare -rn) can be wired by you; this one is the host's",
        )
    if facts.proc_uid:
        if asked_uid not in (None, facts.proc_uid):
            raise PodnetError(
                "EPERM", f"that process belongs to uid {facts.proc_uid}, not {asked_uid}"
            )
        return facts.proc_uid
    if asked_uid is None or asked_uid == 0:
        raise PodnetError("EINVAL", "a namespace of root's: name the user ('uid')")
    return asked_uid


def container_json(pod: Pod) -> dict[str, Any]:
    """A container's record in etcd (`Keys.container`): what adoption rebuilds it from."""
    d: dict[str, Any] = {
        "user": pod.user,
        "uid": pod.uid,
        "ip": pod.ip,
        "vni": pod.vni,
        "names": pod.names,
        "container_id": pod.container_id,
        "ifname": pod.ifname,
        "pid": pod.pid,
        "start": pod.pid_start,
        "source": pod.source,
        "created": pod.created,
    }
    if pod.ns_id is not None:
        d["ns"] = {
            "dev": pod.ns_id.dev,
            "ino": pod.ns_id.ino,
            "cookie": pod.ns_cookie,
            "boot": nsscan.boot_id(),
        }
    if pod.slots:
        d["slots"] = pod.slots
    return d


def recorded_ns(d: dict[str, Any]) -> tuple[NsId, int, str] | None:
    """(namespace, cookie, boot) of a container's record; None for a record without."""
    ns = d.get("ns")
    if not isinstance(ns, dict):
        return None
    try:
        return NsId(int(ns["dev"]), int(ns["ino"])), int(ns["cookie"]), str(ns["boot"])
    except (KeyError, TypeError, ValueError):
        return None


def _dns_name(pod: Pod) -> str:
    return pod.names[0] if pod.names else ""


class Containers:
    """container_add / container_del / container_check / GC / adoption, on the components
    pods use (the pod table, user networks, the allocator, the wiring)."""

    def __init__(
        self,
        node: str,
        cc: ClusterConfig,
        pods: PodTable,
        nets: UserNetworks,
        alloc: Allocator,
        dp: Dataplane,
        wiring: PodWiring,
        outside_jobs: bool,
        unlimited: frozenset[int] = frozenset({0}),
        limits: Callable[[], quota.Limits] | None = None,
        grace: float = GRACE,
    ) -> None:
        self.node = node
        self.cc = cc
        self.pods = pods
        self.nets = nets
        self.alloc = alloc
        self.dp = dp
        self.wiring = wiring
        #: containers also without a job of their owner here (agent_containers_outside_jobs)
        self.outside_jobs = outside_jobs
        #: uids no quota applies to (root, host_users), the quotas now, the collector
        self.unlimited = unlimited
        self.limits = limits or (lambda: quota.Limits.of(cc))
        self.collector = Collector(grace=grace)
        self._gc_lock = threading.Lock()

    # -- add ---------------------------------------------------------------------------
    def add(
        self,
        caller_uid: int,
        caller_pid: int,
        container_id: str,
        ifname: str,
        netns_path: str,
        label: str,
        asked_uid: int | None,
        asked_pid: int | None,
    ) -> Pod:
        if not _CID.match(container_id):
            raise PodnetError("EINVAL", "'container_id' must be [A-Za-z0-9_.-], 1-1024 long")
        if not _IFNAME.match(ifname):
            raise PodnetError("EINVAL", "'ifname' is not an interface name")
        label = check_label(label) if label else default_label(container_id)
        fd = -1
        if netns_path:
            fd, facts = open_netns(host_proc_path(netns_path, caller_pid))
            try:
                uid = decide_owner(caller_uid, facts, asked_uid)
            except BaseException:
                os.close(fd)
                raise
            pid, start, source = facts.pid, facts.start, netns_path
        else:
            if caller_uid == 0:
                if asked_uid is None or asked_uid == 0:
                    raise PodnetError("EINVAL", "root must name the user: 'uid'")
                uid, pid = asked_uid, asked_pid or 0
            else:
                uid, pid = caller_uid, caller_pid
            start = proc_start(pid) if pid else 0
            if pid and not start:
                raise PodnetError("ENOENT", f"process {pid} is gone")
            source = ""
        try:
            return self._add(uid, pid, start, source, container_id, ifname, label, fd)
        finally:
            if fd >= 0:
                os.close(fd)

    def _allowed(self, uid: int) -> None:
        if self.outside_jobs:
            return
        if not any(p.kind == "job" for p in self.pods.all(uid)):
            raise PodnetError(
                "EPERM",
                f"containers need a job of yours on {self.node} (this node does not allow "
                "containers outside jobs: agent_containers_outside_jobs)",
            )

    def _add(
        self,
        uid: int,
        pid: int,
        start: int,
        source: str,
        container_id: str,
        ifname: str,
        label: str,
        fd: int,
    ) -> Pod:
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            raise PodnetError("EINVAL", f"uid {uid} has no user name") from None
        if uid == 0:
            raise PodnetError("EPERM", "root's containers are not on a user network")
        self._allowed(uid)
        cc = self.cc
        name = ns_name(uid, container_id, ifname)
        with self.nets.lock(uid):
            pod = self.pods.get(name)
            if pod is not None:
                return pod
            limits = self._limits(uid, user)
            vni, bri = self.nets.ensure(user, uid)
            pod = Pod(
                "container",
                name,
                str(self.dp.netns_path(name)),
                "",
                cc.pod_cidr.prefixlen,
                user,
                uid,
                vni,
                names=[f"{label}.{user}.{cc.zone}"],
                container_id=container_id,
                ifname=ifname,
                pid=pid,
                pid_start=start,
                source=source,
            )
            try:
                # the namespace first: its identity goes into the record
                ns = self.wiring.new_container_netns(name, bri, ifname, fd)
            except BaseException:
                self.nets.release(vni, uid)
                raise
            try:
                self._identify(pod, ns)
                record = container_json(pod)
                pod.ip = self.alloc.allocate_container(
                    self.node, name, user, vni, _dns_name(pod), record, limits
                )
                pod.slots = quota.slots_of(record)
            except BaseException as e:
                self.dp.discard(ns)
                self.nets.release(vni, uid)
                if isinstance(e, NoAddress):
                    raise PodnetError("EUNAVAIL", str(e)) from None
                raise
            try:
                self.wiring.build(pod, [f"{user}.{cc.zone}"], ns)
            except BaseException:
                with contextlib.suppress(Exception):
                    self._release_records(pod)
                self.nets.release(vni, uid)
                raise
            self.pods.add(pod)
        if not pid:
            with self._gc_lock:  # the collector's witnesses: one writer at a time
                self.collector.look(pod)
        log.info("container %s (%s) of %s: %s %s", container_id, ifname, user, name, pod.ip)
        return pod

    def _limits(self, uid: int, user: str) -> dict[str, int] | None:
        """The cluster-wide limits a container of `uid` takes slots of (None: not
        limited); QuotaExceeded when the user's containers on this node are at their
        limit (the caller holds the user's lock: the count cannot change meanwhile)."""
        if uid in self.unlimited:
            return None
        q = self.limits()
        here = sum(1 for p in self.pods.all(uid) if p.kind == "container")
        if here >= q.containers_per_node:
            raise quota.QuotaExceeded(
                user, "containers_per_node", q.containers_per_node, here, self.node
            )
        return {"containers": q.containers, "addresses": q.addresses}

    def _identify(self, pod: Pod, ns: NewNetns) -> None:
        """The namespace podnetd holds at the pod's file (its bind mount) and its cookie
        (from the netlink socket `new_netns` opened inside it): what the record keeps."""
        pod.ns_id = nsscan.ns_of(pod.netns)
        pod.ns_cookie = nsscan.cookie(ns.nl.sock)

    def _release_records(self, pod: Pod) -> None:
        self.alloc.release_container(
            self.node, pod.name, pod.user, pod.ip, _dns_name(pod), pod.slots
        )

    # -- del ---------------------------------------------------------------------------
    def find(self, caller_uid: int, container_id: str, ifname: str, uid: int | None) -> Pod | None:
        if caller_uid != 0:
            return self.pods.get(ns_name(caller_uid, container_id, ifname))
        if uid is not None:
            return self.pods.get(ns_name(uid, container_id, ifname))
        for p in self.pods.all():
            if p.kind == "container" and (p.container_id, p.ifname) == (container_id, ifname):
                return p
        return None

    def delete(self, pod: Pod) -> bool:
        with self.nets.lock(pod.uid):
            if self.pods.pop(pod.name) is None:
                return False
            self.wiring.unbuild(pod)
            self._release_records(pod)
            self.nets.release(pod.vni, pod.uid)
        log.info("container %s of %s released (%s)", pod.container_id, pod.user, pod.ip)
        return True

    # -- check -------------------------------------------------------------------------
    def check(self, pod: Pod) -> list[str]:
        """What differs from what ADD made (empty: nothing)."""
        problems = []
        if pod.pid and not alive(pod.pid, pod.pid_start):
            problems.append(f"the container's process {pod.pid} is gone")
        return problems + self.dp.pod_problems(pod.name, pod.veth, pod.ifname, pod.ip, pod.vni)

    # -- GC and adoption ---------------------------------------------------------------
    def gc_once(self) -> list[str]:
        """Release the containers node/collect.py finds dead; their names."""
        gone = []
        with self._gc_lock:  # the loop and container_gc: one pass at a time
            dead = self.collector.dead(self.pods.all())
        for v in dead:
            p = v.pod
            log.info("GC: container %s (%s) of %s: %s", p.name, p.container_id, p.user, v.why)
            try:
                if self.delete(p):
                    gone.append(p.name)
            except Exception:
                log.exception("GC of container %s failed", p.name)
        return gone

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(CONTAINER_GC_SECONDS):
            with contextlib.suppress(Exception):
                self.gc_once()

    def adopt(self, name: str) -> Pod | None:
        """A container namespace left by an earlier podnetd: its record, if its process
        lives and its interface is there; else its records are released (None)."""
        d = self.alloc.get_container(self.node, name)
        if d is None:
            return None
        pod = Pod(
            "container",
            name,
            str(self.dp.netns_path(name)),
            str(d["ip"]),
            self.cc.pod_cidr.prefixlen,
            str(d["user"]),
            int(d["uid"]),
            int(d["vni"]),
            names=[str(x) for x in d.get("names", [])],
            container_id=str(d.get("container_id", "")),
            ifname=str(d.get("ifname", "eth0")),
            pid=int(d.get("pid", 0)),
            pid_start=int(d.get("start", 0)),
            source=str(d.get("source", "")),
            created=float(d.get("created", 0)),
        )
        pod.slots = quota.slots_of(d)
        pod.veth = self.dp.pod_veth(name, pod.ifname) or ""
        same = self._same_namespace(pod, d)
        if pod.veth and same and (not pod.pid or alive(pod.pid, pod.pid_start)):
            record = container_json(pod)
            self.alloc.republish_container(
                self.node, name, pod.user, pod.vni, pod.ip, _dns_name(pod), record
            )
            pod.slots = quota.slots_of(record)
            return pod
        if not same:
            log.warning(
                "container %s: the namespace at %s is not the one recorded", name, pod.netns
            )
        with contextlib.suppress(Exception):
            self.wiring.remove_kernel(pod)
        with contextlib.suppress(Exception):
            self._release_records(pod)
        return None

    def _same_namespace(self, pod: Pod, d: dict[str, Any]) -> bool:
        """Whether the namespace at the pod's file is the one its record names (same
        boot, device, inode and cookie); sets the pod's identity from the file. A record
        of an older podnet names none: the file's is taken (podnetd's own bind mount)."""
        here = nsscan.ns_of(pod.netns)
        if here is None:
            return False
        try:
            cookie = self.dp.host.run_in(Path(pod.netns), nsscan.cookie_here)
        except OSError:
            return False
        pod.ns_id, pod.ns_cookie = here, cookie
        rec = recorded_ns(d)
        if rec is None:
            return True
        ns, rec_cookie, boot = rec
        return ns == here and rec_cookie == cookie and boot == nsscan.boot_id()

    def release_unadopted(self) -> list[str]:
        """At start, after adoption: release the records of containers of this node that
        were not adopted (their namespace is gone: a reboot, or the file was removed)."""
        done = []
        for name in self.alloc.container_names(self.node):
            if self.pods.get(name) is not None:
                continue
            d = self.alloc.get_container(self.node, name)
            if d is None:
                continue
            try:
                dns = [str(x) for x in d.get("names", [])]
                self.alloc.release_container(
                    self.node,
                    name,
                    str(d["user"]),
                    str(d["ip"]),
                    dns[0] if dns else "",
                    quota.slots_of(d),
                )
            except (KeyError, TypeError, ValueError):
                log.warning("container record %s is unreadable: left as it is", name)
                continue
            log.info("container %s of %s: its namespace is gone, records released", name, d["user"])
            done.append(name)
        return done


__all__ = [
    "CONTAINER_GC_SECONDS",
    "PREFIX",
    "Containers",
    "NsFacts",
    "check_label",
    "decide_owner",
    "default_label",
    "host_proc_path",
    "is_container_ns",
    "ns_name",
    "open_netns",
]
