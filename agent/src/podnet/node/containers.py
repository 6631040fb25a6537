# SPDX-License-Identifier: Apache-2.0
"""Containers on their owner's private network (issue 10: the podnet CNI plugin, and the
`podnet-container` helper for Apptainer without a setuid starter).

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
`containers/<node>/<pn-c...>` says whose it is. A container whose process is gone is
released by the container loop (every `CONTAINER_GC_SECONDS`); DEL releases it at once.

This module is the lifecycle and the rules; the layers below do the work, through the
calls pods use: what the kernel says of a namespace is `kernel.nsfs`, the interface is
`PodWiring` (`Dataplane.new_netns` + `wire_pod`, with the namespace `foreign`), the address
and records are `Allocator.allocate_container` / `release_container`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pwd
import re
import threading
from typing import Any

from podnet.config import ClusterConfig
from podnet.errors import PodnetError
from podnet.kernel.dataplane import Dataplane
from podnet.kernel.nsfs import NsFacts, alive, host_proc_path, open_netns, proc_start
from podnet.names import CONTAINER_NS_PREFIX as PREFIX
from podnet.names import container_netns as ns_name
from podnet.names import is_container_netns as is_container_ns
from podnet.node.pods import Pod, PodTable, PodWiring
from podnet.node.usernets import UserNetworks
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
    return {
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
                pod.ip = self.alloc.allocate_container(
                    self.node, name, user, vni, _dns_name(pod), container_json(pod)
                )
            except BaseException as e:
                self.nets.release(vni, uid)
                if isinstance(e, NoAddress):
                    raise PodnetError("EUNAVAIL", str(e)) from None
                raise
            try:
                ns = self.wiring.new_container_netns(name, bri, ifname, fd)
                self.wiring.build(pod, [f"{user}.{cc.zone}"], ns)
            except BaseException:
                with contextlib.suppress(Exception):
                    self._release_records(pod)
                self.nets.release(vni, uid)
                raise
            self.pods.add(pod)
        log.info("container %s (%s) of %s: %s %s", container_id, ifname, user, name, pod.ip)
        return pod

    def _release_records(self, pod: Pod) -> None:
        self.alloc.release_container(self.node, pod.name, pod.user, pod.ip, _dns_name(pod))

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
        gone = []
        for p in self.pods.all():
            if p.kind == "container" and p.pid and not alive(p.pid, p.pid_start):
                log.info("GC: container %s of %s: process %d gone", p.name, p.user, p.pid)
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
        pod.veth = self.dp.pod_veth(name, pod.ifname) or ""
        if pod.veth and (not pod.pid or alive(pod.pid, pod.pid_start)):
            self.alloc.republish_container(
                self.node, name, pod.user, pod.vni, pod.ip, _dns_name(pod), container_json(pod)
            )
            return pod
        with contextlib.suppress(Exception):
            self.wiring.remove_kernel(pod)
        with contextlib.suppress(Exception):
            self._release_records(pod)
        return None


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
