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
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import pwd
import re
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podnet.errors import PodnetError
from podnet.kernel import netns, nl
from podnet.kernel.dataplane import PLACEHOLDER_MAC, NewNetns, PodSpec
from podnet.names import Keys, new_veth_name, ptr_key, zone_path
from podnet.node.pods import Pod
from podnet.state import store
from podnet.state.alloc import RECORD_TTL, Allocator, AllocError
from podnet.state.ipam import PoolExhausted
from podnet.state.store import cmp_absent, cmp_value, op_delete, op_put

if TYPE_CHECKING:
    from podnet.node.agent import Agent, _Rooms

log = logging.getLogger("podnet.containers")

PREFIX = "pn-c"
CONTAINER_GC_SECONDS = 2.0
MAX_ATTEMPTS = 20

# ioctls of nsfs (linux/nsfs.h)
NS_GET_USERNS = 0xB701
NS_GET_NSTYPE = 0xB703
NS_GET_OWNER_UID = 0xB704
CLONE_NEWNET = 0x40000000

#: where namespace files named by path may be (besides /proc/<pid>/ns/net)
NETNS_DIRS = ("/run/netns/", "/var/run/netns/", "/run/user/")

_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_CID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,1023}$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.\-]{1,15}$")
_PROC_NETNS = re.compile(r"^/proc/([1-9][0-9]{0,9})/(?:task/[1-9][0-9]{0,9}/)?ns/net$")


def ns_name(uid: int, container_id: str, ifname: str) -> str:
    """The netns file name of a container interface: `pn-c` + 11 hex digits."""
    h = hashlib.sha256(f"{uid}/{container_id}/{ifname}".encode()).hexdigest()
    return PREFIX + h[:11]


def is_container_ns(name: str) -> bool:
    return (
        len(name) == 15
        and name.startswith(PREFIX)
        and all(c in "0123456789abcdef" for c in name[4:])
    )


def default_label(container_id: str) -> str:
    """The name of a container that asked for none: `c-` + 10 hex digits of its id."""
    return "c-" + hashlib.sha256(container_id.encode()).hexdigest()[:10]


def check_label(label: str) -> str:
    label = label.lower()
    if not _LABEL.match(label) or label == "login" or label.isdigit():
        raise PodnetError("EINVAL", f"container name {label!r} is not a usable DNS label")
    return label


# -- who owns a network namespace -------------------------------------------------------
@dataclass
class NsFacts:
    """What the kernel says about a network namespace podnetd opened."""

    host_userns: bool  # its user namespace is podnetd's (the host's)
    userns_owner: int  # creator of its user namespace (0 for the host's)
    proc_uid: int | None  # real uid of the process the path names, if it names one
    pid: int  # that process (0: none)
    start: int  # its start time (clock ticks since boot; 0: none)
    ino: tuple[int, int]  # (st_dev, st_ino) of the namespace


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


def proc_start(pid: int) -> int:
    """Start time of a process (clock ticks since boot), 0 if it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return 0
    rest = data[data.rfind(b")") + 2 :].split()
    return int(rest[19]) if len(rest) > 19 else 0


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


# -- etcd records ------------------------------------------------------------------------
def record_ops(keys: Keys, zone: str, node: str, pod: Pod) -> list[dict[str, Any]]:
    label = pod.names[0].split(".", 1)[0] if pod.names else ""
    ops = [
        op_put(
            keys.ip(pod.ip),
            {"kind": "container", "node": node, "user": pod.user, "vni": pod.vni, "ns": pod.name},
        ),
        op_put(keys.container(node, pod.name), container_json(pod)),
    ]
    if label:
        ops.append(
            op_put(f"{zone_path(zone)}/{pod.user}/{label}/ctr", {"host": pod.ip, "ttl": RECORD_TTL})
        )
        ops.append(op_put(ptr_key(pod.ip), {"host": pod.names[0], "ttl": RECORD_TTL}))
    return ops


def container_json(pod: Pod) -> dict[str, Any]:
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


def allocate(alloc: Allocator, keys: Keys, node: str, pod: Pod, label: str) -> str:
    """An address of this node's block for `pod` and its records, one transaction
    (the address and the name are created-if-absent); returns the IP."""
    name_key = keys.name(pod.user, label) if label else ""
    for attempt in range(MAX_ATTEMPTS):
        new_blocks: list[Any] = []
        try:
            ip = alloc.next_address(node, new_blocks)
        except PoolExhausted:
            alloc._release([], new_blocks)
            raise PodnetError("EUNAVAIL", "the pod network has no free address block") from None
        if ip is None:
            raise PodnetError("EUNAVAIL", "no free address")
        pod.ip = ip
        compare = [cmp_absent(keys.ip(ip))]
        ops: list[dict[str, Any]] = []
        for blk, n in new_blocks:
            compare.append(cmp_absent(keys.block(str(blk))))
            ops.append(op_put(keys.block(str(blk)), {"node": n}))
        if name_key:
            compare.append(cmp_absent(name_key))
            ops.append(op_put(name_key, {"container": pod.name, "node": node}))
        ops += record_ops(keys, alloc.zone, node, pod)
        r = alloc.etcd.txn(compare, ops, [store.op_get(name_key)] if name_key else [])
        if r.succeeded:
            alloc.ipam.mark([ip])
            alloc.ipam.release_pending([ip])
            alloc.ipam.confirm_blocks(blk for blk, _n in new_blocks)
            return ip
        alloc._release([ip], new_blocks)
        if name_key and r.range_kvs(0):
            raise PodnetError(
                "EEXIST", f"the name {label}.{pod.user}.{alloc.zone} is taken (a job or container)"
            )
        alloc.load_view()
        time.sleep(min(0.01 * (attempt + 1), 0.2))
    raise AllocError(f"could not allocate a container address for {pod.user} (contention)")


def release_records(alloc: Allocator, keys: Keys, node: str, pod: Pod) -> None:
    label = pod.names[0].split(".", 1)[0] if pod.names else ""
    ops = [
        op_delete(keys.ip(pod.ip)),
        op_delete(keys.container(node, pod.name)),
        op_delete(ptr_key(pod.ip)),
    ]
    if label:
        ops.append(op_delete(f"{zone_path(alloc.zone)}/{pod.user}/{label}/ctr"))
        name_key = keys.name(pod.user, label)
        # one round trip: the name's claim goes only while it is this container's
        alloc.etcd.txn(
            [cmp_value(name_key, store.json_dumps({"container": pod.name, "node": node}))],
            [*ops, op_delete(name_key)],
            ops,
        )
    else:
        alloc.etcd.put_many(ops)
    alloc.ipam.mark([pod.ip], used=False)


# -- the manager -------------------------------------------------------------------------
class Containers:
    """container_add / container_del / container_check / GC / adoption, on the agent's
    rooms (`agent.rooms`)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    @property
    def r(self) -> _Rooms:
        return self.agent.rooms

    @property
    def node(self) -> str:
        return str(self.agent.cfg.node)

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
        if self.agent.cfg.containers_outside_jobs:
            return
        if not any(p.kind == "job" for p in self.agent.pods.all(uid)):
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
        r, a = self.r, self.agent
        name = ns_name(uid, container_id, ifname)
        path = r.dp.netns_path(name)
        with r.nets.lock(uid):
            pod = a.pods.get(name)
            if pod is not None:
                return pod
            vni, bri = r.nets.ensure(user, uid)
            pod = Pod(
                "container",
                name,
                str(path),
                "",
                r.cc.pod_cidr.prefixlen,
                user,
                uid,
                vni,
                names=[f"{label}.{user}.{r.cc.zone}"],
                container_id=container_id,
                ifname=ifname,
                pid=pid,
                pid_start=start,
                source=source,
            )
            try:
                allocate(r.alloc, a.keys, self.node, pod, label)
            except BaseException:
                r.nets.release(vni, uid)
                raise
            try:
                pod.veth = self._wire(pod, bri, fd)
                r.fw.add_port(pod.veth, nl.mac_for_ip(pod.ip), pod.ip)
            except BaseException:
                self._unwire(pod)
                with contextlib.suppress(Exception):
                    release_records(r.alloc, a.keys, self.node, pod)
                r.nets.release(vni, uid)
                raise
            a.pods.add(pod)
        log.info("container %s (%s) of %s: %s %s", container_id, ifname, user, name, pod.ip)
        return pod

    def _wire(self, pod: Pod, bridge: int, fd: int) -> str:
        r = self.r
        path = Path(pod.netns)
        if fd >= 0:
            # keep the namespace reachable under our name (adoption after a restart)
            f = os.open(str(path), os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
            os.close(f)
            try:
                netns.mount_bind(f"/proc/self/fd/{fd}", str(path))
            except BaseException:
                path.unlink(missing_ok=True)
                raise
            inner = r.dp.host.run_in(path, nl.Netlink)
        else:

            def inside() -> nl.Netlink:
                sock = nl.Netlink()
                # unprivileged ping (a fakeroot container's root is a user here)
                with contextlib.suppress(OSError):
                    netns.write_sysctl("net.ipv4.ping_group_range", "0 2147483647")
                return sock

            inner = r.dp.host.create(path, inside)
        owned: nl.Netlink | None = inner
        try:
            if pod.ifname in nl.links(inner):
                raise PodnetError("EEXIST", f"the container already has an interface {pod.ifname}")
            veth = new_veth_name()
            nsfd = os.open(str(path), os.O_RDONLY | os.O_CLOEXEC)
            try:
                r.dp.nl().batch(
                    [
                        nl.veth(veth, pod.ifname, nsfd, r.cc.pod_mtu, bridge, PLACEHOLDER_MAC),
                        *nl.host_link_up(veth),
                    ]
                )
            finally:
                os.close(nsfd)
            plinks = nl.links(inner)
            ns = NewNetns(
                pod.name,
                inner,
                veth,
                int(plinks[pod.ifname]["index"]),
                int(plinks["lo"]["index"]),
                bridge,
            )
            spec = PodSpec(pod.name, pod.ip, pod.prefix, pod.vni, r.cc.pod_mtu, r.cc.gateway_ip)
            search = [f"{pod.user}.{r.cc.zone}", *r.cc.search_domains]
            # wire_pod closes `inner`, and removes the netns file on failure
            owned = None
            return str(r.dp.wire_pod(ns, spec, search, r.cc.dns_servers))
        finally:
            if owned is not None:
                owned.close()

    # -- del ---------------------------------------------------------------------------
    def find(self, caller_uid: int, container_id: str, ifname: str, uid: int | None) -> Pod | None:
        if caller_uid != 0:
            return self.agent.pods.get(ns_name(caller_uid, container_id, ifname))
        if uid is not None:
            return self.agent.pods.get(ns_name(uid, container_id, ifname))
        for p in self.agent.pods.all():
            if p.kind == "container" and (p.container_id, p.ifname) == (container_id, ifname):
                return p
        return None

    def delete(self, pod: Pod) -> bool:
        r, a = self.r, self.agent
        with r.nets.lock(pod.uid):
            if a.pods.pop(pod.name) is None:
                return False
            self._unwire(pod)
            if pod.veth:
                r.fw.del_port(pod.veth, nl.mac_for_ip(pod.ip), pod.ip)
            release_records(r.alloc, a.keys, self.node, pod)
            r.nets.release(pod.vni, pod.uid)
        log.info("container %s of %s released (%s)", pod.container_id, pod.user, pod.ip)
        return True

    def _unwire(self, pod: Pod) -> None:
        r = self.r
        # the container's namespace may live on (DEL before exit): take our link out (by
        # name: a dump of every link cost DEL more than all else with hundreds of them)
        if pod.veth:
            with contextlib.suppress(nl.NetlinkError):
                r.dp.nl().batch([nl.del_link_named(pod.veth)])
        netns.remove(Path(pod.netns))
        if pod.ip:
            try:
                r.dp.nl().batch([nl.route(pod.ip, 32, delete=True)])
            except nl.NetlinkError as e:
                if e.errno not in (errno.ESRCH, errno.ENOENT):
                    raise
        d = r.dp.resolv_dir / pod.name
        for f in (d / "resolv.conf", d / "resolv.conf.tmp"):
            f.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            d.rmdir()

    # -- check -------------------------------------------------------------------------
    def check(self, pod: Pod) -> list[str]:
        """What differs from what ADD made (empty: nothing)."""
        r = self.r
        problems = []
        if pod.pid and not alive(pod.pid, pod.pid_start):
            problems.append(f"the container's process {pod.pid} is gone")
        links = nl.links(r.dp.nl())
        host = links.get(pod.veth)
        bridge = r.dp.user_bridge(pod.vni)
        if host is None:
            problems.append(f"host end {pod.veth} is missing")
        elif bridge is not None and int(host["master"]) != bridge:
            problems.append(f"host end {pod.veth} is not in the user's bridge")
        try:
            inner = r.dp.host.run_in(Path(pod.netns), nl.Netlink)
        except OSError as e:
            problems.append(f"the container's network namespace is gone ({e.strerror})")
            return problems
        try:
            if pod.ifname not in nl.links(inner):
                problems.append(f"interface {pod.ifname} is missing in the container")
            else:
                ip = nl.first_ipv4(inner, pod.ifname)
                if ip != pod.ip:
                    problems.append(f"{pod.ifname} has address {ip}, not {pod.ip}")
        finally:
            inner.close()
        return problems

    # -- GC and adoption ---------------------------------------------------------------
    def gc_once(self) -> list[str]:
        gone = []
        for p in self.agent.pods.all():
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
        r, a = self.r, self.agent
        kv = a.etcd.get(a.keys.container(self.node, name))
        if kv is None:
            return None
        d = kv.json()
        pod = Pod(
            "container",
            name,
            str(r.dp.netns_path(name)),
            str(d["ip"]),
            r.cc.pod_cidr.prefixlen,
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
        veth = self._host_end(pod)
        if veth and (not pod.pid or alive(pod.pid, pod.pid_start)):
            pod.veth = veth
            a.etcd.put_many(record_ops(a.keys, r.alloc.zone, self.node, pod))
            return pod
        pod.veth = veth
        with contextlib.suppress(Exception):
            self._unwire(pod)
        with contextlib.suppress(Exception):
            release_records(r.alloc, a.keys, self.node, pod)
        return None

    def _host_end(self, pod: Pod) -> str:
        r = self.r
        try:
            inner = r.dp.host.run_in(Path(pod.netns), nl.Netlink)
        except OSError:
            return ""
        try:
            link = nl.links(inner).get(pod.ifname)
        finally:
            inner.close()
        if not link:
            return ""
        peer = int(link.get("link") or 0)
        for lname, info in nl.links(r.dp.nl()).items():
            if lname.startswith("pnv") and int(info["index"]) == peer:
                return lname
        return ""


def cni_dns(pod: Pod, zone: str, servers: list[str], search: list[str]) -> dict[str, Any]:
    return {"nameservers": servers, "domain": f"{pod.user}.{zone}", "search": search}


__all__ = [
    "CONTAINER_GC_SECONDS",
    "Containers",
    "NsFacts",
    "cni_dns",
    "decide_owner",
    "default_label",
    "is_container_ns",
    "ns_name",
    "open_netns",
]
