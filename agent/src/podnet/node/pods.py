# SPDX-License-Identifier: Apache-2.0
"""The node's pods: what a pod is, the table of this node's pods, and wiring one into the
kernel (data plane + firewall) and out again.

The table's lock guards the dictionary only: nothing waits on etcd, netlink or nftables
while holding it. Work on one user's pods is serialized by that user's lock
(`usernets.UserNetworks.lock`), so two requests for different users never wait on each
other.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from podnet.config import ClusterConfig
from podnet.kernel.dataplane import Dataplane, NewNetns, PodSpec
from podnet.kernel.firewall import Firewall
from podnet.kernel.nsscan import NsId
from podnet.names import login_label, mac_for_ip
from podnet.state.alloc import Job, JobPod


@dataclass
class Pod:
    kind: str  # job | login | container
    name: str
    netns: str
    ip: str
    prefix: int
    user: str
    uid: int
    vni: int
    job_id: int | None = None
    index: int | None = None
    names: list[str] = field(default_factory=list)
    veth: str = ""
    created: float = field(default_factory=time.time)
    # containers (containers.py): the runtime's id and interface, the process whose
    # exit releases it (pid + start time; 0: DEL only), the netns path it was given
    container_id: str = ""
    ifname: str = ""
    pid: int = 0
    pid_start: int = 0
    source: str = ""
    #: the quota slots it holds (state/quota.py; logins and containers of limited users)
    slots: dict[str, int] = field(default_factory=dict)
    #: a container's network namespace as podnetd wired it (node/collect.py): nsfs device
    #: and inode, its cookie; whether a process was seen in it since podnetd started
    ns_id: NsId | None = None
    ns_cookie: int = 0
    ns_seen: bool = False

    @property
    def foreign_netns(self) -> bool:
        """A container's namespace: it may outlive the pod, has no PID namespace of podnet's."""
        return self.kind == "container"

    def public(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("veth", "vni", "pid_start", "slots", "ns_id", "ns_cookie", "ns_seen"):
            d.pop(k, None)
        if self.kind != "container":
            for k in ("container_id", "ifname", "pid", "source"):
                d.pop(k, None)
        d.update(self.dns())
        return d

    def dns(self) -> dict[str, str]:
        """The pod's one unique name (`fqdn`) and, for a job pod, its job's domain under the
        job id (`domain`): what the SPANK plugin gives a task as PODNET_POD_NAME and
        PODNET_JOB_DOMAIN (docs/user-guide.md "What a task sees")."""
        if self.kind == "job" and self.job_id is not None:
            by_id = f"pod{self.index}.{self.job_id}."
            fqdn = next((n for n in self.names if n.startswith(by_id)), "")
            return {"fqdn": fqdn, "domain": fqdn.split(".", 1)[1]} if fqdn else {}
        return {"fqdn": self.names[0]} if self.names else {}

    @classmethod
    def of_job(cls, pod: JobPod, name: str, netns: str, cc: ClusterConfig, veth: str = "") -> Pod:
        z, job, index = cc.zone, pod.job, pod.index
        return cls(
            "job",
            name,
            netns,
            pod.ip,
            cc.pod_cidr.prefixlen,
            job.user,
            job.uid,
            job.vni,
            job.job_id,
            index,
            [f"pod{index}.{job.label}.{job.user}.{z}", f"pod{index}.{job.job_id}.{job.user}.{z}"],
            veth=veth,
        )

    @classmethod
    def of_login(
        cls,
        node: str,
        user: str,
        uid: int,
        ip: str,
        vni: int,
        name: str,
        netns: str,
        cc: ClusterConfig,
        veth: str = "",
    ) -> Pod:
        return cls(
            "login",
            name,
            netns,
            ip,
            cc.pod_cidr.prefixlen,
            user,
            uid,
            vni,
            names=[f"{login_label(node)}.login.{user}.{cc.zone}"],
            veth=veth,
        )


def job_search(job: Job, zone: str) -> list[str]:
    """A job pod's resolv.conf search list: its job, by label and id, then its user."""
    return search_of(job.label, job.job_id, job.user, zone)


def search_of(label: str, job_id: int, user: str, zone: str) -> list[str]:
    """`job_search` from what a request says, before the job's record is known."""
    return [f"{label}.{user}.{zone}", f"{job_id}.{user}.{zone}", f"{user}.{zone}"]


class PodTable:
    """This node's pods by netns name."""

    def __init__(self) -> None:
        self._pods: dict[str, Pod] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Pod | None:
        with self._lock:
            return self._pods.get(name)

    def add(self, pod: Pod) -> None:
        with self._lock:
            self._pods[pod.name] = pod

    def pop(self, name: str) -> Pod | None:
        with self._lock:
            return self._pods.pop(name, None)

    def all(self, uid: int | None = None) -> list[Pod]:
        with self._lock:
            return [p for p in self._pods.values() if uid is None or p.uid == uid]

    def uses_vni(self, vni: int) -> bool:
        with self._lock:
            return any(p.vni == vni for p in self._pods.values())

    def fw_ports(self) -> list[tuple[str, str, str, int]]:
        """(veth, MAC, IP, VNI) of every wired pod: the firewall's anti-spoofing set and
        fast path."""
        return [(p.veth, mac_for_ip(p.ip), p.ip, p.vni) for p in self.all() if p.veth]


class PodWiring:
    """A pod into the kernel and out: netns, veth, address, routes, resolv.conf, and its
    port in the firewall's anti-spoofing set."""

    def __init__(self, dp: Dataplane, fw: Firewall, cc: ClusterConfig) -> None:
        self.dp = dp
        self.fw = fw
        self.cc = cc

    def new_netns(self, name: str, bridge: int) -> NewNetns:
        """The pod's namespace and veth."""
        return self.dp.new_netns(name, bridge, self.cc.pod_mtu)

    def prepare_resolv(self, name: str, search: list[str]) -> tuple[list[str], list[str]]:
        """The resolv.conf of pod `name` for the search list `search` (before the pod's
        namespace exists: `build` writes it again only if the pod's search list turns
        out otherwise); returns what it wrote, for `NewNetns.resolv`."""
        cc = self.cc
        full, servers = search + cc.search_domains, list(cc.dns_servers)
        self.dp.write_resolv(name, full, servers)
        return full, servers

    def drop_resolv(self, name: str, error: BaseException | None) -> None:
        """The resolv.conf `prepare_resolv` wrote for pod `name` whose namespace was not
        made (`error`): gone, unless the pod's file exists already (someone else's pod of
        that name keeps it)."""
        if not isinstance(error, FileExistsError):
            self.dp.remove_resolv(name)

    def new_container_netns(self, name: str, bridge: int, ifname: str, fd: int) -> NewNetns:
        """A container's: the runtime's namespace `fd` (-1: a new one), interface `ifname`."""
        return self.dp.new_netns(name, bridge, self.cc.pod_mtu, ifname, True, fd)

    def build(self, pod: Pod, search: list[str], ns: NewNetns) -> None:
        cc = self.cc
        spec = PodSpec(pod.name, pod.ip, pod.prefix, pod.vni, cc.pod_mtu, cc.gateway_ip)
        pod.veth = self.dp.wire_pod(ns, spec, search + cc.search_domains, cc.dns_servers)
        try:
            self.fw.add_port(pod.veth, mac_for_ip(pod.ip), pod.ip, pod.vni)
        except Exception:
            self.remove_kernel(pod)
            raise

    def remove_kernel(self, pod: Pod) -> bool:
        """The pod's namespace, route and resolv.conf (its firewall port stays)."""
        if pod.foreign_netns:
            return self.dp.remove_pod(pod.name, pod.ip, pod.veth, pid_namespace=False)
        return self.dp.remove_pod(pod.name, pod.ip)

    def unbuild(self, pod: Pod) -> bool:
        """Undo `build`; True if the netns existed."""
        existed = self.remove_kernel(pod)
        if pod.veth:
            self.fw.del_port(pod.veth, mac_for_ip(pod.ip), pod.ip)
        return existed

    def remove(self, name: str, pod: Pod | None) -> bool:
        """Remove the pod `name` whether or not the table knows it."""
        return self.unbuild(pod) if pod else self.dp.remove_pod(name, None)
