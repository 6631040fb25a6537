# SPDX-License-Identifier: Apache-2.0
"""Names: DNS-safe labels, netns and link names, pod MACs, etcd and SkyDNS keys."""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import os
import re

from podnet.contracts import DNS_PTR, DNS_ROOT, ETCD_KEYS, ETCD_ROOT

_LABEL_BAD = re.compile(r"[^a-z0-9-]+")
_DASHES = re.compile(r"-{2,}")
_LABEL_OK = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
#: labels the job-name rule must never produce (they name other things in the zone)
RESERVED_LABELS = frozenset({"login"})
GATEWAY_MAC = "02:50:6e:00:00:01"


def dns_label(text: str, fallback: str = "job") -> str:
    """A DNS label from arbitrary text: lower case, [a-z0-9-], no edge dashes, <= 63.

    Empty results become `fallback`.
    """
    s = text.lower()
    s = _LABEL_BAD.sub("-", s)
    s = _DASHES.sub("-", s).strip("-")
    s = s[:63].rstrip("-")
    return s or fallback


def login_label(node: str) -> str:
    """The DNS label of a node in login pod names (`<label>.login.<user>.<zone>`)."""
    return dns_label(node, "node")


def job_label(name: str) -> str:
    """The DNS label of a job name.

    Rules (docs/agent.md): `dns_label`, then a result that would collide with other
    names of the user's subdomain gets a `job-` prefix: `login` (login pods live at
    `<node>.login.<user>`) and all-digit names (the job-id names `pod<n>.<jobid>.<user>`).
    """
    s = dns_label(name)
    if s in RESERVED_LABELS or s.isdigit():
        s = dns_label("job-" + s)
    return s


def is_label(s: str) -> bool:
    return bool(_LABEL_OK.match(s))


def job_netns(job_id: int) -> str:
    return f"pn-j{job_id}"


def login_netns(uid: int) -> str:
    return f"pn-l{uid}"


#: netns names of containers: `pn-c` + 11 hex digits
CONTAINER_NS_PREFIX = "pn-c"


def container_netns(uid: int, container_id: str, ifname: str) -> str:
    """The netns file name of a container interface: `pn-c` + 11 hex digits."""
    h = hashlib.sha256(f"{uid}/{container_id}/{ifname}".encode()).hexdigest()
    return CONTAINER_NS_PREFIX + h[:11]


def is_container_netns(name: str) -> bool:
    return (
        len(name) == 15
        and name.startswith(CONTAINER_NS_PREFIX)
        and all(c in "0123456789abcdef" for c in name[4:])
    )


def bridge_name(vni: int) -> str:
    return f"pnbr{vni}"


def vxlan_name(vni: int) -> str:
    return f"pnvx{vni}"


def new_veth_name() -> str:
    """`pnv` + 12 hex digits: unique, so a name the kernel still reaps is never reused."""
    return "pnv" + os.urandom(6).hex()


def is_veth_name(name: str) -> bool:
    return (
        len(name) == 15
        and name.startswith("pnv")
        and all(c in "0123456789abcdef" for c in name[3:])
    )


@functools.lru_cache(maxsize=64)
def zone_path(zone: str) -> str:
    """SkyDNS path of a zone: `lab` -> `/skydns/lab`, `a.b.c` -> `/skydns/c/b/a`."""
    labels = [x for x in zone.strip(".").split(".") if x]
    return DNS_ROOT + "/".join(reversed(labels))


_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DOTTED = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")


def ptr_key(ip: str) -> str:
    """SkyDNS key of an IPv4 address's PTR record (`10.1.2.3` -> `.../in-addr/10/1/2/3`)."""
    # the allocator's own addresses (a 1000-node job: 1000 of them) without ipaddress's
    # parser; any other form (leading zeros, garbage) goes through it
    if _DOTTED.fullmatch(ip):
        return DNS_PTR + ip.replace(".", "/")
    a, b, c, d = ipaddress.IPv4Address(ip).packed
    return f"{DNS_PTR}{a}/{b}/{c}/{d}"


def _around(template: str, *fields: str) -> list[str]:
    """The literal parts of a key template around its `fields`, in that order
    (`"ips/{ip}"`, "ip" -> `["ips/", ""]`), so that a key is one f-string."""
    out, rest = [], template
    for f in fields:
        lit, sep, rest = rest.partition("{" + f + "}")
        if not sep:
            raise ValueError(f"contracts.toml: etcd key {template!r} has no {{{f}}}")
        out.append(lit)
    if "{" in rest:
        raise ValueError(f"contracts.toml: etcd key {template!r} has other fields")
    return [*out, rest]


class Keys:
    """etcd keys of one cluster: the layout in contracts.toml (docs/architecture.md, "etcd
    layout"), one method per key."""

    def __init__(self, cluster: str) -> None:
        root = self.root = ETCD_ROOT.format(cluster=cluster)

        def around(name: str, *fields: str) -> list[str]:
            parts = _around(ETCD_KEYS[name], *fields)
            return [root + parts[0], *parts[1:]]

        self.config = "".join(around("config"))
        #: the gateways' external address and port range (podnet-gatewayd writes it)
        self.gateway_config = "".join(around("gateway_config"))
        #: the node that releases dead jobs' records this round (node/reconcile.py)
        self.records_gc = "".join(around("records_gc"))
        self._global_policy = "".join(around("gateway_policy"))
        self._user_policy = around("gateway_user_policy", "user")
        self._node, self._alive = around("node", "node"), around("alive", "node")
        self._block, self._user = around("block", "block"), around("user", "user")
        self._vni, self._ip, self._job = (
            around("vni", "vni"),
            around("ip", "ip"),
            around("job", "job_id"),
        )
        self._name = around("name", "user", "label")
        self._login = around("login", "node", "user")
        self._quota = around("quota", "user", "kind", "slot")
        self._job_node = around("job_node", "job_id", "node")
        self._vtep = around("vtep", "vni", "node")
        self._container = around("container", "node", "ns")
        self._published = around("published", "port")

    def node(self, node: str) -> str:
        a, b = self._node
        return f"{a}{node}{b}"

    def alive(self, node: str) -> str:
        a, b = self._alive
        return f"{a}{node}{b}"

    def block(self, cidr: str) -> str:
        a, b = self._block
        return f"{a}{cidr.replace('/', '-')}{b}"

    def user(self, user: str) -> str:
        a, b = self._user
        return f"{a}{user}{b}"

    def vni(self, vni: int) -> str:
        a, b = self._vni
        return f"{a}{vni}{b}"

    def ip(self, ip: str) -> str:
        a, b = self._ip
        return f"{a}{ip}{b}"

    def job(self, job_id: int) -> str:
        a, b = self._job
        return f"{a}{job_id}{b}"

    def name(self, user: str, label: str) -> str:
        a, b, c = self._name
        return f"{a}{user}{b}{label}{c}"

    def login(self, node: str, user: str) -> str:
        a, b, c = self._login
        return f"{a}{node}{b}{user}{c}"

    def quota(self, user: str, kind: str, slot: int | None = None) -> str:
        """A user's quota slot of a kind (state/quota.py); None: the prefix of them all."""
        a, b, c, d = self._quota
        return f"{a}{user}{b}{kind}{c}{'' if slot is None else slot}{d}"

    def job_node(self, job_id: int, node: str) -> str:
        a, b, c = self._job_node
        return f"{a}{job_id}{b}{node}{c}"

    def vtep(self, vni: int, node: str) -> str:
        a, b, c = self._vtep
        return f"{a}{vni}{b}{node}{c}"

    def container(self, node: str, ns: str) -> str:
        """A container's record (its netns `pn-c...` on `node`)."""
        a, b, c = self._container
        return f"{a}{node}{b}{ns}{c}"

    def gateway_policy(self, user: str | None = None) -> str:
        """The global gateway policy, or a user's (hpc.podnet.gateway_policy)."""
        if user is None:
            return self._global_policy
        a, b = self._user_policy
        return f"{a}{user}{b}"

    def published(self, external_port: int | None = None) -> str:
        """A published port's record (None: the prefix of them all)."""
        a, b = self._published
        return f"{a}{'' if external_port is None else external_port}{b}"

    def prefix(self, what: str) -> str:
        return f"{self.root}{what}/"


def mac_for_ip(ip: str) -> str:
    """Deterministic, locally administered MAC of a pod interface: 0a:58:<ip bytes>."""
    b = ipaddress.IPv4Address(ip).packed
    return "0a:58:" + ":".join(f"{x:02x}" for x in b)


def ip_of_mac(mac: str) -> str | None:
    """The address a pod MAC is derived from (`mac_for_ip`), None for any other MAC."""
    parts = mac.lower().split(":")
    if len(parts) != 6 or parts[:2] != ["0a", "58"]:
        return None
    try:
        return str(ipaddress.IPv4Address(bytes(int(x, 16) for x in parts[2:])))
    except ValueError:
        return None


def block_from_key(key: str) -> str:
    """`.../blocks/198.18.0.0-26` -> `198.18.0.0/26`."""
    last = key.rsplit("/", 1)[-1]
    net, _sep, plen = last.rpartition("-")
    return f"{net}/{plen}"
