# SPDX-License-Identifier: Apache-2.0
"""nftables rules of a node: static chains that look up sets; per-pod state as set elements.

Two tables, owned by podnetd alone (docs/agent.md explains every rule):

* `bridge podnet`: anti-spoofing on pod ports (a pod sends only its own MAC + IP, IPv4
  and ARP only), the shared gateway MAC never crosses VXLAN.
* `inet podnet`: VXLAN only from registered node underlay IPs; routed pod <-> pod
  dropped; pods <-> cluster host networks allowed; pods <-> anything else dropped.
  Locally generated: a user socket never emits VXLAN (the kernel's tunnels own no user
  socket, so `meta skuid` does not match them), and only the `host_uids` (root, the
  Slurm user) open connections to pods: a user's host-side process reaches no pod.

The data path (docs/bench.md, "data path"): a frame meets at most two interface-name
tests per chain, and a frame bridged inside a user's network is never tracked (`notrack`
in the bridge table: br_netfilter would otherwise hand every such frame to conntrack, and
no rule looks at its state). Frames to the gateway MAC (routed pod <-> host traffic) stay
tracked for the output chain's `ct state established,related`.

Per pod, one element in `bridge podnet ports`, with the pod's fast path objects in
`netdev podnet` (fastpath.py), in one nf_tables batch of its own (nftnl.py, ~0.05 ms). A
full replace (delete + recreate the tables in one transaction) is used only to
resynchronise (at start, when the node table changes).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import threading
import time
from pathlib import Path

from podnet.kernel import fastpath, nftnl
from podnet.names import GATEWAY_MAC

try:
    import nftables
except ImportError:  # pragma: no cover - python3-nftables is a hard dependency on nodes
    nftables = None


log = logging.getLogger("podnet.firewall")


class FirewallError(RuntimeError):
    pass


#: Flannel's VXLAN port (HPK-style containers; roles/flannel): the default of the cluster
#: configuration's `other_vxlan_ports`, filtered as podnet's own
FLANNEL_VXLAN_PORT = 8472
#: mark bit of packets a local socket routes into a VXLAN device (Flannel's flannel.1): the
#: kernel keeps the socket as the owner of the encapsulated packet, so the marked outer
#: packet is told from a datagram a user's socket sends to a VXLAN port itself
TUNNEL_MARK = 0x504E0000
#: the cgroup (v2) whose sockets reach pods from the host network with any uid: the SPANK
#: plugin keeps the slurmstepd of a step on the host network (`--podnet=no`) in it while
#: Slurm connects to srun's IO and terminal ports with the user's uid (srun may be in a
#: login or job pod); only root can join it, and the step's tasks are born outside it
#: (agent/native/podnet_spank.c, PN_STEPD_CGROUP)
STEPD_CGROUP = "podnet-stepd"
CGROUP_FS = Path("/sys/fs/cgroup")
#: `meta skuid` in this range: the packet belongs to a socket with an owner (a process's);
#: packets of no socket (the kernel's VXLAN, ICMP errors, RSTs) never match
ANY_UID = "0-4294967295"


def ruleset(
    pod_cidr: str,
    vxlan_port: int,
    allowed: list[str],
    vteps: list[str],
    ports: list[tuple[str, str, str]],
    host_uids: list[int] | None = None,
    other_vxlan_ports: list[int] | None = None,
    egress_gateway: str = "",
    underlay_interface: str = "",
    gateway_node: bool = False,
    stepd_cgroup: str = "",
) -> str:
    """The whole podnet ruleset (nft syntax) for an atomic replace.

    `other_vxlan_ports`: VXLAN ports of other overlays on the node (Flannel's, default
    8472), guarded like podnet's: received from registered nodes only, never sent by a
    user socket, never sent by a pod.

    `egress_gateway` (the gateways' virtual address): pods' traffic routed to it may
    leave (the gateway polices it), replies come back, and connections to published
    ports come in from the underlay (`underlay_interface`) with outside sources.
    `gateway_node`: this node is a gateway; its own table (`inet podnet_gw`) polices
    pods <-> outside, this one keeps only the pod <-> pod and VXLAN drops.
    `stepd_cgroup`: STEPD_CGROUP's path under /sys/fs/cgroup (`stepd_cgroup()`), whose
    sockets reach pods like the `host_uids`' ("": none).
    """

    def elems(items: list[str]) -> str:
        return f"elements = {{ {', '.join(items)} }}" if items else ""

    others = [FLANNEL_VXLAN_PORT] if other_vxlan_ports is None else other_vxlan_ports
    vx_ports = elems([str(p) for p in sorted({vxlan_port, *others})])
    uids = elems([str(u) for u in sorted(set(host_uids if host_uids is not None else [0]))])

    port_elems = elems([f'"{p}" . {m} . {i}' for p, m, i in ports])
    egress = _egress(pod_cidr, egress_gateway, underlay_interface, gateway_node)
    stepd = (
        f'\n        ip daddr {pod_cidr} socket cgroupv2 level 1 "{stepd_cgroup}" accept '
        'comment "slurmstepd of a step on the host network, connecting to srun"'
        if stepd_cgroup
        else ""
    )
    return f"""
add table bridge podnet
delete table bridge podnet
table bridge podnet {{
    set ports {{ type ifname . ether_addr . ipv4_addr; {port_elems} }}
    chain prerouting {{
        type filter hook prerouting priority -200; policy accept;
        # one interface-name test for a frame from VXLAN, two from a pod ("pnv*" also
        # matches "pnvx*": VXLAN first; a goto ends in this chain's policy, not the next rule)
        iifname "pnvx*" goto vxlan_in
        iifname "pnv*" goto pod_in
    }}
    chain vxlan_in {{
        ether saddr {GATEWAY_MAC} drop
        ether daddr {GATEWAY_MAC} drop
        # a frame inside the user's network: never tracked (br_netfilter would hand it to
        # conntrack; no podnet rule looks at the state of bridged frames)
        notrack
    }}
    chain pod_in {{
        # bridged (not to the gateway MAC): untracked; routed (to the gateway): tracked,
        # so replies of host services to the pod are `ct state established`
        ether type ip ether daddr != {GATEWAY_MAC} iifname . ether saddr . ip saddr @ports \
notrack accept
        ether type ip iifname . ether saddr . ip saddr @ports accept
        ether type arp iifname . ether saddr . arp saddr ip @ports \
iifname . arp saddr ether . arp saddr ip @ports accept
        drop
    }}
    chain output {{
        type filter hook output priority -200; policy accept;
        oifname "pnvx*" ether saddr {GATEWAY_MAC} drop
    }}
}}
add table inet podnet
delete table inet podnet
table inet podnet {{
    set vteps {{ type ipv4_addr; {elems(vteps)} }}
    set hosts {{ type ipv4_addr; flags interval; auto-merge; {elems(allowed)} }}
    set vxlan_ports {{ type inet_service; {vx_ports} }}
    set host_uids {{ type uid; {uids} }}
    chain input {{
        type filter hook input priority -10; policy accept;
        # VXLAN in VXLAN (a datagram to a VXLAN port that came out of a tunnel): never
        meta iifkind "vxlan" udp dport @vxlan_ports drop
        udp dport @vxlan_ports ip saddr != @vteps drop
        iifname "pnbr*" goto from_pods
    }}
    chain from_pods {{
        udp dport @vxlan_ports drop
        ip daddr @hosts accept
        drop
    }}
    chain output {{
        type filter hook output priority -10; policy accept;
        # VXLAN only from the kernel's tunnels, never from a user socket: a socket's
        # datagram to a VXLAN port sent into a tunnel (VXLAN in VXLAN) is dropped; a
        # socket's packet into a VXLAN device (hosts reach Flannel's containers) is marked,
        # and its encapsulation, still owned by that socket, passes; any other
        # datagram a socket sends to a VXLAN port is dropped
        udp dport @vxlan_ports meta oifkind "vxlan" meta skuid {ANY_UID} drop
        meta oifkind "vxlan" meta mark set meta mark | {TUNNEL_MARK:#x}
        udp dport @vxlan_ports meta mark & {TUNNEL_MARK:#x} != {TUNNEL_MARK:#x} \
meta skuid {ANY_UID} drop
        # hosts reach pods: replies, and connections of the system identities only
        ip daddr {pod_cidr} ct state established,related accept
        ip daddr {pod_cidr} meta skuid @host_uids accept{stepd}
        ip daddr {pod_cidr} meta skuid {ANY_UID} drop
    }}
    chain forward {{
        type filter hook forward priority -10; policy accept;
        # frames bridged inside a user's network reach this hook through br_netfilter
        # (bridge device in and out); routed ones were addressed to the gateway MAC
        iifname "pnbr*" oifname "pnbr*" ether daddr != {GATEWAY_MAC} accept
        ip saddr {pod_cidr} ip daddr {pod_cidr} drop
        ip saddr {pod_cidr} udp dport @vxlan_ports drop
        ip saddr {pod_cidr} ip daddr @hosts accept
        ip saddr @hosts ip daddr {pod_cidr} accept{egress}
        ip saddr {pod_cidr} drop
        ip daddr {pod_cidr} drop
        iifname "pnbr*" drop
        oifname "pnbr*" drop
    }}
}}
"""


def _egress(pod_cidr: str, gateway: str, underlay: str, gateway_node: bool) -> str:
    if gateway_node:
        return '\n        accept comment "gateway: table inet podnet_gw polices pods <-> outside"'
    if not gateway:
        return ""
    lines = [
        f'ip saddr {pod_cidr} rt ip nexthop {gateway} accept comment "egress: to the gateway"',
        f"ip daddr {pod_cidr} ct state established,related accept",
    ]
    if underlay:
        lines.append(
            f'iifname "{underlay}" ip daddr {pod_cidr} ip saddr != @hosts accept '
            'comment "published ports: outside sources come only through the gateway"'
        )
    return "".join(f"\n        {x}" for x in lines)


def stepd_cgroup(fs: Path = CGROUP_FS) -> str:
    """Makes STEPD_CGROUP at the top of the cgroup v2 hierarchy (mounted on `fs`, or on
    `fs`/unified in systemd's hybrid layout); returns its path under `fs`, as nft names
    it, or "" without a cgroup v2 hierarchy."""
    for mnt in (fs, fs / "unified"):
        if (mnt / "cgroup.controllers").exists():
            d = mnt / STEPD_CGROUP
            d.mkdir(mode=0o755, exist_ok=True)
            return str(d.relative_to(fs))
    return ""


class StepdCgroup:
    """STEPD_CGROUP as the ruleset names it. nft resolves the path to the cgroup's id when
    the rules load: a cgroup removed and made again (systemd's shutdown removes every empty
    cgroup it finds, an admin's rmdir) is another cgroup, which the
    loaded rule no longer matches. `moved()` tells when the rules must load again."""

    def __init__(self, fs: Path = CGROUP_FS) -> None:
        self.fs = fs
        self.path = ""  # under fs, as nft names it ("": none)
        self.ino = 0  # the cgroup's id when the rules last loaded
        self.retry_at = 0.0  # after a failure: when to try again

    def ensure(self) -> str:
        """Makes the cgroup if it is gone and notes its id; its nft path, "" without."""
        self.path = stepd_cgroup(self.fs)
        self.ino = (self.fs / self.path).stat().st_ino if self.path else 0
        return self.path

    def failed(self, retry_after: float = 60.0) -> None:
        self.path, self.ino = "", 0
        self.retry_at = time.monotonic() + retry_after

    def moved(self) -> bool:
        if not self.path:
            return bool(self.retry_at) and time.monotonic() >= self.retry_at
        try:
            return (self.fs / self.path).stat().st_ino != self.ino
        except OSError:
            return True


class Firewall:
    def __init__(
        self,
        pod_cidr: ipaddress.IPv4Network,
        vxlan_port: int,
        allowed: list[ipaddress.IPv4Network],
        host_uids: list[int] | None = None,
        other_vxlan_ports: list[int] | None = None,
        egress_gateway: str = "",
        underlay_interface: str = "",
        gateway_node: bool = False,
        cgroup_fs: Path | None = CGROUP_FS,
    ) -> None:
        if nftables is None:
            raise FirewallError("python3-nftables (libnftables) is not installed")
        self.nft = nftables.Nftables()
        self.nft.set_json_output(True)
        self.lock = threading.RLock()
        self.sock = nftnl.Socket()
        self.pod_cidr = str(pod_cidr)
        self.vxlan_port = vxlan_port
        self.allowed = [str(n) for n in allowed]
        self.host_uids = list(host_uids) if host_uids is not None else [0]
        self.other_vxlan_ports = other_vxlan_ports
        self.egress_gateway = egress_gateway
        self.underlay_interface = underlay_interface
        self.gateway_node = gateway_node
        stepd = StepdCgroup(cgroup_fs) if cgroup_fs else None
        self.stepd = stepd if stepd is not None and self._stepd_supported(stepd) else None
        self.fast = fastpath.FastPath(self.sock, self._fast_supported())

    def _fast_supported(self) -> bool:
        """netdev chains and `fwd` (else the overlay keeps the bridge path alone)."""
        with self.lock:
            rc, _out, err = self.nft.cmd(fastpath.PROBE)
        if rc != 0:
            log.warning(
                "no netdev fwd in nftables (%s): the overlay's fast path is off",
                str(err).strip().splitlines()[0] if str(err).strip() else rc,
            )
        return bool(rc == 0)

    def _stepd_supported(self, stepd: StepdCgroup) -> bool:
        """The kernel and nft match sockets by cgroup v2 (Linux >= 5.13), and there is a
        cgroup v2 hierarchy: else steps on the host network cannot reach srun in a pod
        (the filter drops them as any user socket), which the log says once."""
        try:
            path = stepd.ensure()
        except OSError as e:
            log.warning(
                "no cgroup %s (%s): opt-out steps cannot reach srun in a pod", STEPD_CGROUP, e
            )
            return False
        if not path:
            log.warning("no cgroup v2 hierarchy: opt-out steps cannot reach srun in a pod")
            return False
        probe = (
            "add table inet podnet_probe\n"
            "add chain inet podnet_probe c\n"
            f'add rule inet podnet_probe c socket cgroupv2 level 1 "{path}" accept\n'
        )
        with self.lock:
            self.nft.set_dry_run(True)
            try:
                rc, _out, err = self.nft.cmd(probe)
            finally:
                self.nft.set_dry_run(False)
        if rc != 0:
            log.warning(
                "nft cannot match sockets by cgroup (%s): opt-out steps cannot reach srun in a pod",
                str(err).strip().splitlines()[0] if str(err).strip() else rc,
            )
            return False
        return True

    def stepd_moved(self) -> bool:
        """STEPD_CGROUP is gone or is another cgroup than the rules name: resync."""
        return self.stepd is not None and self.stepd.moved()

    def _cmd(self, text: str) -> None:
        with self.lock:
            rc, _out, err = self.nft.cmd(text)
        if rc != 0:
            raise FirewallError(f"nft: {err.strip().splitlines()[0] if err.strip() else rc}")

    def resync(self, vteps: list[str], ports: list[tuple[str, str, str, int]]) -> None:
        """Every table replaced: the rules, `vteps`, the pods' `ports` (veth, MAC, IPv4,
        VNI) and their fast path objects."""
        with self.lock:
            self._resync(vteps, ports)
            if self.fast.enabled:
                self.fast.fill([fastpath.Port(*p) for p in ports])

    def _resync(self, vteps: list[str], ports: list[tuple[str, str, str, int]]) -> None:
        def rules(stepd: str) -> str:
            return ruleset(
                self.pod_cidr,
                self.vxlan_port,
                self.allowed,
                sorted(set(vteps)),
                [(p, m, i) for p, m, i, _vni in ports],
                self.host_uids,
                self.other_vxlan_ports,
                self.egress_gateway,
                self.underlay_interface,
                self.gateway_node,
                stepd,
            ) + (fastpath.SKELETON if self.fast.enabled else "")

        if self.stepd is None:
            self._cmd(rules(""))
            return
        err: Exception | None = None
        for _attempt in range(3):
            try:
                self._cmd(rules(self.stepd.ensure()))
                self.stepd.retry_at = 0.0
                return
            except (OSError, FirewallError) as e:  # made, then removed before nft read it
                err = e
        # never fail the node for it: the isolation rules load without the exception
        log.warning(
            "cgroup %s unusable (%s): rules loaded without it, retried in 60 s", STEPD_CGROUP, err
        )
        self.stepd.failed()
        self._cmd(rules(""))

    def add_port(self, port: str, mac: str, ip: str, vni: int) -> None:
        """A pod's anti-spoofing element and its fast path, in one transaction."""
        element = nftnl.add_elements(
            nftnl.NFPROTO_BRIDGE, "podnet", "ports", [_port_key(port, mac, ip)]
        )
        p = fastpath.Port(port, mac, ip, vni)
        with self.lock:
            fast: list[nftnl.Message] = []
            if self.fast.enabled:
                try:
                    fast = self.fast.add(p)
                except OSError as e:
                    log.warning("fast path of %s (%s) not made: %s", port, ip, e)
            try:
                self.sock.commit([element, *fast])
            except OSError as e:
                if not fast:
                    raise FirewallError(f"nft: {e}") from None
                log.warning("fast path of %s (%s) not made: %s", port, ip, e)
                try:
                    self.sock.commit([element])
                except OSError as e2:
                    raise FirewallError(f"nft: {e2}") from None
                return
            if fast:
                self.fast.added(p)

    def del_port(self, port: str, mac: str, ip: str) -> None:
        element = nftnl.del_elements(
            nftnl.NFPROTO_BRIDGE, "podnet", "ports", [_port_key(port, mac, ip)]
        )
        with self.lock, contextlib.suppress(OSError):  # already gone
            self.sock.commit([*self.fast.remove(port), element])


def _port_key(port: str, mac: str, ip: str) -> tuple[bytes, bytes]:
    """The key of `bridge podnet ports` (type ifname . ether_addr . ipv4_addr)."""
    return nftnl.concat(nftnl.ifname(port), nftnl.mac(mac), nftnl.ipv4(ip)), b""
