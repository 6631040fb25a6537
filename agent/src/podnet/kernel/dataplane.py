# SPDX-License-Identifier: Apache-2.0
"""Kernel side of pods: per-user bridge + VXLAN, pod netns + veth, routes, FDB.

Everything goes through one rtnetlink socket in the daemon's netns (`nl.Netlink`) and,
per pod, one socket opened inside the new netns by a worker thread (no fork). A pod:

* netns file `<netns_dir>/<name>`; `lo` up; `eth0` (veth peer, MAC derived from the IP)
  with `<ip>/<pod prefix>`, MTU underlay - 50, default route via the anycast gateway
  (`gateway_ip`: a static neighbour entry in the pod to `GATEWAY_MAC`, the MAC of every
  user bridge of every node).
* host end `pnv<12 hex>` in the user's bridge `pnbr<vni>`, a /32 route to the pod on
  that bridge (hosts reach the pod without NAT).

The host network stays as it was: podnet's host-side links (bridges, VXLANs, veth host
ends) carry no address at all, IPv4 or IPv6 (address generation off), so applications
that enumerate interfaces (MPI, PMIx, UCX, NCCL) never pick one. The host forwards from
an address-less bridge and answers pods from its underlay address.

Teardown removes the netns file; the kernel reaps the veth. The bridge and VXLAN of a
user are removed with the user's last pod on the node.

A pod takes a spare network namespace, made ahead with its veth, when one is ready
(`podnet.kernel.spares`); without a spare (a burst, the first pod, a container's own
interface name) the pod makes its own, as before.

This module holds the pods; the user's bridge, VXLAN and FDB and the routes to other
nodes' blocks are `UserLinks` (`podnet.kernel.userlinks`), mixed into `Dataplane`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from podnet.errors import PodnetError
from podnet.kernel import netns, nl, nlquery, nlreq
from podnet.kernel.pidns import PidNamespaces
from podnet.kernel.spares import PLACEHOLDER_MAC, SPARE_IFNAME, Spare, Spares, inside_new_netns
from podnet.kernel.userlinks import UserLinks
from podnet.names import GATEWAY_MAC, bridge_name, is_veth_name, mac_for_ip, new_veth_name

log = logging.getLogger("podnet.dataplane")

#: a pod's ARP request for a pod of another node is answered by the user's VXLAN once
#: podnetd has resolved it (`podnet.kernel.vxmiss`, `podnet.node.overlay`): the pod asks
#: again every ARP_RETRANS_MS, up to ARP_PROBES times (the kernel's default: every second,
#: 3 times, so a pod's first packet to another node would wait a second)
ARP_RETRANS_MS = 20
ARP_PROBES = 50


class DataplaneError(RuntimeError):
    pass


@dataclass
class PodSpec:
    name: str  # netns name
    ip: str
    prefix: int
    vni: int
    mtu: int
    gateway_ip: str


@dataclass
class NewNetns:
    """A pod netns just created, with a netlink socket opened inside it."""

    name: str
    nl: nl.Netlink
    veth: str  # host end, in the user's bridge
    eth0: int  # pod end (index inside the pod)
    lo: int
    bridge: int
    #: a container's namespace (`new_netns` with `foreign`): it may outlive the pod
    foreign: bool = False
    #: (search, servers) of the resolv.conf written already (`prepare_resolv`)
    resolv: tuple[list[str], list[str]] | None = None


class Dataplane(UserLinks):
    def __init__(
        self,
        netns_dir: str,
        resolv_dir: str,
        underlay_interface: str,
        underlay_ip: str,
        vxlan_port: int,
        underlay_mtu: int,
        pidns: PidNamespaces | None = None,
    ) -> None:
        self.netns_dir = Path(netns_dir)
        #: pods' PID namespaces (pidns.py); None or disabled: network namespace only
        self.pidns = pidns
        self.resolv_dir = Path(resolv_dir)
        self.underlay_ip = underlay_ip
        self.vxlan_port = vxlan_port
        self.underlay_mtu = underlay_mtu
        self.host = netns.HostNetns()
        self._tls = threading.local()
        self.bridges: dict[int, int] = {}  # vni -> bridge ifindex of users present here
        self.vxlans: dict[int, int] = {}  # VXLAN ifindex -> vni of users present here
        self.lock = threading.Lock()  # user bridge/VXLAN creation and removal
        self.spares = Spares(self.host, self.nl)
        netns.make_shared_dir(self.netns_dir)
        links = nlquery.links(self.nl())
        if underlay_interface not in links:
            raise DataplaneError(f"underlay interface {underlay_interface} not found")
        self.underlay_index = int(links[underlay_interface]["index"])

    def nl(self) -> nl.Netlink:
        """This thread's rtnetlink socket in the daemon's netns (sockets are not shared)."""
        sock: nl.Netlink | None = getattr(self._tls, "nl", None)
        if sock is None:
            sock = nl.Netlink()
            self._tls.nl = sock
        return sock

    # -- pods --------------------------------------------------------------------------
    def netns_path(self, name: str) -> Path:
        return self.netns_dir / name

    def new_netns(
        self,
        name: str,
        bridge_index: int,
        mtu: int,
        ifname: str = "eth0",
        foreign: bool = False,
        netns_fd: int = -1,
    ) -> NewNetns:
        """First half of a pod, which needs no address yet (podnetd makes it while the
        allocation is on its way to etcd): the pod's netns, and a veth whose host end is
        up in the user's bridge and whose pod end `ifname` is down, with a placeholder MAC
        (the real one derives from the address). Raises if the pod exists already.

        `foreign`: a container's namespace, which may outlive the pod (its veth is deleted
        by name on removal) and gets no PID namespace; `netns_fd` (with `foreign`): an
        existing namespace (a runtime's), bound on the pod's file instead of a new one."""

        path = self.netns_path(name)
        spare = self.spares.take(mtu) if netns_fd < 0 and ifname == SPARE_IFNAME else None
        if spare is not None:
            return self._new_from_spare(name, path, spare, bridge_index, foreign)
        if netns_fd < 0:
            pod_nl = self.host.create(path, inside_new_netns)
        else:
            pod_nl = _bind(self.host, path, netns_fd)
        veth = new_veth_name()
        try:
            if netns_fd >= 0 and _has_link(pod_nl, ifname):
                raise PodnetError("EEXIST", f"the container already has an interface {ifname}")
            if self.pidns is not None and not foreign:
                self.pidns.create(name)
            fd = os.open(str(path), os.O_RDONLY | os.O_CLOEXEC)
            try:
                self.nl().batch(
                    [
                        nlreq.veth(veth, ifname, fd, mtu, bridge_index, PLACEHOLDER_MAC),
                        *nlreq.host_link_up(veth),
                    ]
                )
            finally:
                os.close(fd)
            eth0, lo = nlquery.ifindex(pod_nl, ifname), nlquery.ifindex(pod_nl, "lo")
            return NewNetns(name, pod_nl, veth, eth0, lo, bridge_index, foreign)
        except BaseException:
            pod_nl.close()
            self.remove_pod(name, None, veth if foreign else "", pid_namespace=not foreign)
            raise

    def _new_from_spare(
        self, name: str, path: Path, spare: Spare, bridge_index: int, foreign: bool
    ) -> NewNetns:
        """`new_netns` from a spare: its namespace on the pod's file, its veth's host end
        into the user's bridge and up."""
        pod_nl = self.spares.bind(path, spare)
        try:
            if self.pidns is not None and not foreign:
                self.pidns.create(name)
            self.nl().batch([nlreq.enslave_up(spare.host_index, bridge_index)])
            return NewNetns(name, pod_nl, spare.veth, spare.eth0, spare.lo, bridge_index, foreign)
        except BaseException:
            pod_nl.close()
            self.remove_pod(name, None, spare.veth if foreign else "", pid_namespace=not foreign)
            raise

    def discard(self, ns: NewNetns) -> None:
        """Undo `new_netns` (the allocation failed); a foreign namespace lives on, without
        the veth."""
        self.spares.want()  # as after wire_pod (`Spares.take`)
        ns.nl.close()
        if ns.foreign:
            self.remove_pod(ns.name, None, ns.veth, pid_namespace=False)
        else:
            self.remove_pod(ns.name, None)

    def wire_pod(
        self, ns: NewNetns, spec: PodSpec, search: list[str], dns_servers: list[str]
    ) -> str:
        """Second half of a pod (after `new_netns`): MAC, address, routes, resolv.conf;
        returns the host-side veth name."""
        try:
            ns.nl.batch(
                [
                    nlreq.link_up(ns.lo),
                    nlreq.addr(ns.eth0, spec.ip, spec.prefix),
                    nlreq.link_up_with_mac(ns.eth0, mac_for_ip(spec.ip)),
                    nlreq.neigh(ns.eth0, spec.gateway_ip, GATEWAY_MAC),
                    nlreq.arp_probes(ns.eth0, ARP_RETRANS_MS, ARP_PROBES),
                    nlreq.route(spec.gateway_ip, 32, oif=ns.eth0, scope=nl.RT_SCOPE_LINK),
                    nlreq.route(nl.ANY, 0, gateway=spec.gateway_ip, oif=ns.eth0),
                ]
            )
            self.nl().batch(
                [nlreq.route(spec.ip, 32, oif=ns.bridge, scope=nl.RT_SCOPE_LINK, replace=True)]
            )
            if ns.resolv != (search, dns_servers):
                self.write_resolv(spec.name, search, dns_servers)
        except BaseException:
            ns.nl.close()
            self.remove_pod(
                spec.name, spec.ip, ns.veth if ns.foreign else "", pid_namespace=not ns.foreign
            )
            raise
        finally:
            self.spares.want()  # the pod's netlink work is done: refill (`Spares.take`)
        ns.nl.close()
        return ns.veth

    def write_resolv(self, name: str, search: list[str], servers: list[str]) -> None:
        d = self.resolv_dir / name
        d.mkdir(parents=True, exist_ok=True)
        lines = ["# podnet: pod " + name]
        if search:
            lines.append("search " + " ".join(search))
        lines += [f"nameserver {s}" for s in servers]
        lines.append("options ndots:2 timeout:2 attempts:2")
        # written in place: nothing reads a pod's file before the pod is ready
        fd = os.open(d / "resolv.conf", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.fchmod(fd, 0o644)  # whatever the umask
            os.write(fd, ("\n".join(lines) + "\n").encode())
        finally:
            os.close(fd)

    def remove_pod(
        self, name: str, ip: str | None, veth: str = "", pid_namespace: bool = True
    ) -> bool:
        """Remove a pod's netns (the kernel reaps its veth), route and resolv.conf. `veth`:
        deleted first, by name (a container's namespace may live on: a dump of every link
        would cost more than all else with hundreds of them); `pid_namespace` False: the
        pod has none of podnet's (a container)."""
        if veth:
            with contextlib.suppress(nl.NetlinkError):
                self.nl().batch([nlreq.del_link_named(veth)])
        existed = netns.remove(self.netns_path(name))
        if self.pidns is not None and pid_namespace:
            self.pidns.remove(name)
        if ip:
            try:
                self.nl().batch([nlreq.route(ip, 32, delete=True)])
            except nl.NetlinkError as e:
                if e.errno not in (errno.ESRCH, errno.ENOENT):
                    raise
        self.remove_resolv(name)
        return existed

    def remove_resolv(self, name: str) -> None:
        """The resolv.conf of pod `name` and its directory (unless someone else's file is
        in it)."""
        d = self.resolv_dir / name
        for f in (d / "resolv.conf", d / "resolv.conf.tmp"):
            f.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty: someone else's file, keep it
            d.rmdir()

    def remove_stale_files(self) -> list[str]:
        """Delete pod files that are not namespaces (an agent killed between creating the
        file and mounting the namespace on it leaves an empty file)."""
        stale = []
        if self.netns_dir.is_dir():
            for p in self.netns_dir.iterdir():
                if p.name.startswith("pn-") and not netns.is_netns(p):
                    netns.remove(p)
                    stale.append(p.name)
        return stale

    def pod_netns_names(self) -> list[str]:
        if not self.netns_dir.is_dir():
            return []
        return sorted(
            p.name
            for p in self.netns_dir.iterdir()
            if p.name.startswith("pn-") and netns.is_netns(p)
        )

    def pod_veth(self, name: str, ifname: str = "eth0") -> str | None:
        """Host-side veth of a pod (the link whose peer is `ifname` in the pod's netns)."""
        path = self.netns_path(name)
        try:
            pod_nl = self.host.run_in(path, nl.Netlink)
        except OSError:
            return None
        try:
            eth0 = nlquery.links(pod_nl).get(ifname)
        finally:
            pod_nl.close()
        if not eth0:
            return None
        peer = eth0.get("link")
        for lname, info in nlquery.links(self.nl()).items():
            if is_veth_name(lname) and peer and int(info["index"]) == int(peer):
                return lname
        return None

    def pod_problems(self, name: str, veth: str, ifname: str, ip: str, vni: int) -> list[str]:
        """How a pod's interface differs from what `new_netns` + `wire_pod` made (empty:
        nothing): its host end and bridge, its interface and address inside."""
        problems = []
        host = nlquery.links(self.nl()).get(veth)
        bridge = self.user_bridge(vni)
        if host is None:
            problems.append(f"host end {veth} is missing")
        elif bridge is not None and int(host["master"]) != bridge:
            problems.append(f"host end {veth} is not in the user's bridge")
        try:
            inner = self.host.run_in(self.netns_path(name), nl.Netlink)
        except OSError as e:
            problems.append(f"the container's network namespace is gone ({e.strerror})")
            return problems
        try:
            if ifname not in nlquery.links(inner):
                problems.append(f"interface {ifname} is missing in the container")
            else:
                have = nlquery.first_ipv4(inner, ifname)
                if have != ip:
                    problems.append(f"{ifname} has address {have}, not {ip}")
        finally:
            inner.close()
        return problems

    def remove_pod_routes_except(self, keep: set[str]) -> None:
        """Delete our /32 pod routes whose pod is not in `keep` (reconcile)."""
        reqs = [
            nlreq.route(d, 32, delete=True)
            for d, plen, _o, gw, _t in nlquery.podnet_routes(self.nl())
            if plen == 32 and not gw and d not in keep
        ]
        for chunk in nl.chunks(reqs, 256):
            self.nl().batch(chunk)

    def set_pod_routes(self, pods: dict[str, int]) -> None:
        """(Re)install the /32 route of each local pod (ip -> vni) on its user's bridge."""
        links = nlquery.links(self.nl())
        reqs = [
            nlreq.route(
                ip,
                32,
                oif=int(links[bridge_name(vni)]["index"]),
                scope=nl.RT_SCOPE_LINK,
                replace=True,
            )
            for ip, vni in sorted(pods.items())
            if bridge_name(vni) in links
        ]
        for chunk in nl.chunks(reqs, 256):
            self.nl().batch(chunk)

    def close(self) -> None:
        self.spares.close()
        sock: nl.Netlink | None = getattr(self._tls, "nl", None)
        if sock is not None:
            sock.close()


def _has_link(sock: nl.Netlink, name: str) -> bool:
    try:
        nlquery.ifindex(sock, name)
    except OSError as e:
        if e.errno == errno.ENODEV:
            return False
        raise
    return True


def _bind(host: netns.HostNetns, path: Path, fd: int) -> nl.Netlink:
    """Keep the namespace `fd` reachable as `path` (adoption after a restart); a netlink
    socket inside it."""
    netns.bind_fd(path, fd)
    try:
        return host.run_in(path, nl.Netlink)
    except BaseException:
        netns.remove(path)
        raise
