# SPDX-License-Identifier: Apache-2.0
"""Node configuration (YAML file) and cluster configuration (etcd key `config`).

Everything is validated up front; a problem raises ConfigError with a one-line message
naming the setting, and the daemon exits with status 2.
"""

from __future__ import annotations

import ipaddress
import pwd
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from podnet import DEFAULT_SOCKET
from podnet.contracts import CLUSTER_DEFAULTS
from podnet.names import is_label

DEFAULT_CONFIG = "/etc/podnet/podnet.yaml"
_NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")


class ConfigError(ValueError):
    pass


def _req(d: dict[str, Any], key: str, where: str) -> Any:
    if key not in d or d[key] is None:
        raise ConfigError(f"{where}: missing required setting '{key}'")
    return d[key]


def _str(v: Any, key: str, where: str) -> str:
    if not isinstance(v, str) or not v:
        raise ConfigError(f"{where}: '{key}' must be a non-empty string")
    return v


def _int(v: Any, key: str, where: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ConfigError(f"{where}: '{key}' must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def _num(v: Any, key: str, where: str, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        raise ConfigError(f"{where}: '{key}' must be a number in [{lo}, {hi}], got {v!r}")
    return float(v)


def _ipv4(v: Any, key: str, where: str) -> str:
    try:
        return str(ipaddress.IPv4Address(str(v)))
    except ValueError:
        raise ConfigError(f"{where}: '{key}' is not an IPv4 address: {v!r}") from None


def _net(v: Any, key: str, where: str) -> ipaddress.IPv4Network:
    try:
        return ipaddress.IPv4Network(str(v), strict=True)
    except ValueError as e:
        raise ConfigError(f"{where}: '{key}' is not an IPv4 network: {v!r} ({e})") from None


def _strlist(v: Any, key: str, where: str) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise ConfigError(f"{where}: '{key}' must be a list of strings")
    return list(v)


def _uid(v: Any, where: str) -> int:
    """A user name or uid of `host_users`, as a uid (the name must exist on the node)."""
    if isinstance(v, int) and not isinstance(v, bool):
        if not 0 <= v < 2**32 - 1:
            raise ConfigError(f"{where}: 'host_users': uid out of range: {v}")
        return v
    if not isinstance(v, str) or not v:
        raise ConfigError(f"{where}: 'host_users' entries must be user names or uids")
    if v.isdigit():
        return _uid(int(v), where)
    try:
        return pwd.getpwnam(v).pw_uid
    except KeyError:
        raise ConfigError(
            f"{where}: 'host_users': unknown user {v!r} on this node "
            "(list only users that exist here, or give a uid)"
        ) from None


@dataclass
class NodeConfig:
    node: str
    underlay_interface: str
    underlay_ip: str
    cluster: str
    etcd_endpoints: list[str]
    etcd_ca: str | None = None
    etcd_cert: str | None = None
    etcd_key: str | None = None
    etcd_timeout: float = 5.0
    socket: str = DEFAULT_SOCKET
    netns_dir: str = "/run/netns"
    #: pods' PID namespaces (<dir>/<pod>) and the program that starts their PID 1;
    #: pid_init "" gives pods a network namespace only
    pidns_dir: str = "/run/podnet/pidns"
    pid_init: str = ""
    resolv_dir: str = "/etc/netns"
    state_dir: str = "/var/lib/podnet"
    metrics: str | None = None
    job_source: list[str] = field(
        default_factory=lambda: ["squeue", "--noheader", "--format=%A", "--states=all"]
    )
    #: the running jobs (their ids, as job_source): a pod whose records etcd lost (a restore
    #: to an older snapshot) is kept and its records written back only if its job is here
    running_job_source: list[str] = field(
        default_factory=lambda: [
            "squeue",
            "--noheader",
            "--format=%A",
            "--states=RUNNING,SUSPENDED,CONFIGURING",
        ]
    )
    gc_interval: float = 60.0
    #: seconds a user's bridge + VXLAN stay after their last pod on the node (0: at once)
    user_net_linger: float = 120.0
    #: seconds for a whole request line to arrive (not per read)
    read_timeout: float = 10.0
    #: connections at once; `root_connections` of them only for root (the Slurm plugin,
    #: the SSH hooks), and at most `max_connections_per_user` for any other uid
    max_connections: int = 256
    root_connections: int = 32
    max_connections_per_user: int = 8
    #: a user's connections beyond `max_connections_per_user` wait their turn (docs/api.md
    #: "Connections"): at most this many per user, `max_waiting` in all, `wait_timeout` s each
    max_waiting_per_user: int = 64
    max_waiting: int = 256
    wait_timeout: float = 30.0
    roles: list[str] = field(default_factory=list)
    log_level: str = "info"
    #: users (names or uids) whose host-side sockets may open connections to pods:
    #: root, the Slurm user (slurmctld); every other host-side socket reaches no pod
    host_users: list[str] = field(default_factory=lambda: ["root"])
    #: containers (`container_add`, the podnet CNI plugin) for users without a job pod on
    #: this node (login nodes: HPK outside a job); False: only beside a job pod
    containers_outside_jobs: bool = False
    #: seconds a container whose network namespace never held a process is kept (a
    #: runtime that wires the namespace before it starts the container's process)
    container_grace: float = 30.0
    #: host_users resolved to uids (at load; not a setting)
    host_uids: list[int] = field(default_factory=lambda: [0])

    @classmethod
    def from_dict(cls, d: Any, where: str) -> NodeConfig:
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: expected a mapping at the top level")
        known = set(cls.__dataclass_fields__) - {"host_uids"}
        extra = sorted(set(d) - known)
        if extra:
            raise ConfigError(f"{where}: unknown setting(s): {', '.join(extra)}")
        node = _str(_req(d, "node", where), "node", where)
        if not _NODE_RE.match(node):
            raise ConfigError(f"{where}: 'node' is not a valid node name: {node!r}")
        ifname = _str(_req(d, "underlay_interface", where), "underlay_interface", where)
        if not _IFNAME_RE.match(ifname):
            raise ConfigError(f"{where}: 'underlay_interface' is not an interface name")
        cluster = _str(_req(d, "cluster", where), "cluster", where)
        if not is_label(cluster):
            raise ConfigError(f"{where}: 'cluster' must be a DNS label ([a-z0-9-]): {cluster!r}")
        eps = _strlist(_req(d, "etcd_endpoints", where), "etcd_endpoints", where)
        if not eps:
            raise ConfigError(f"{where}: 'etcd_endpoints' is empty")
        for ep in eps:
            u = urlsplit(ep)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise ConfigError(f"{where}: etcd endpoint must be http(s)://host:port: {ep!r}")
        c = cls(
            node=node,
            underlay_interface=ifname,
            underlay_ip=_ipv4(_req(d, "underlay_ip", where), "underlay_ip", where),
            cluster=cluster,
            etcd_endpoints=eps,
        )
        tls = [d.get(k) for k in ("etcd_ca", "etcd_cert", "etcd_key")]
        if any(tls):
            for k in ("etcd_ca", "etcd_cert", "etcd_key"):
                p = _str(d.get(k), k, where)
                if not Path(p).is_file():
                    raise ConfigError(f"{where}: '{k}' file not found: {p}")
            c.etcd_ca, c.etcd_cert, c.etcd_key = (str(x) for x in tls)
        if any(urlsplit(ep).scheme == "https" for ep in eps) and not c.etcd_ca:
            raise ConfigError(f"{where}: https etcd endpoints need etcd_ca/etcd_cert/etcd_key")
        for k in ("socket", "netns_dir", "pidns_dir", "resolv_dir", "state_dir"):
            if k in d:
                v = _str(d[k], k, where)
                if not v.startswith("/"):
                    raise ConfigError(f"{where}: '{k}' must be an absolute path")
                setattr(c, k, v)
        if d.get("pid_init"):
            v = _str(d["pid_init"], "pid_init", where)
            if not v.startswith("/"):
                raise ConfigError(f"{where}: 'pid_init' must be an absolute path")
            c.pid_init = v
        if d.get("metrics") is not None:
            m = _str(d["metrics"], "metrics", where)
            host, _sep, port = m.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"{where}: 'metrics' must be host:port, got {m!r}")
            c.metrics = m
        if "job_source" in d:
            c.job_source = _strlist(d["job_source"], "job_source", where)
            if not c.job_source:
                raise ConfigError(f"{where}: 'job_source' is empty")
        if "running_job_source" in d:
            c.running_job_source = _strlist(d["running_job_source"], "running_job_source", where)
            if not c.running_job_source:
                raise ConfigError(f"{where}: 'running_job_source' is empty")
        if "etcd_timeout" in d:
            c.etcd_timeout = _num(d["etcd_timeout"], "etcd_timeout", where, 0.1, 120)
        if "gc_interval" in d:
            c.gc_interval = _num(d["gc_interval"], "gc_interval", where, 0.2, 86400)
        if "user_net_linger" in d:
            c.user_net_linger = _num(d["user_net_linger"], "user_net_linger", where, 0, 86400)
        if "container_grace" in d:
            c.container_grace = _num(d["container_grace"], "container_grace", where, 0, 86400)
        if "read_timeout" in d:
            c.read_timeout = _num(d["read_timeout"], "read_timeout", where, 0.05, 600)
        if "max_connections" in d:
            c.max_connections = _int(d["max_connections"], "max_connections", where, 2, 65536)
        if "root_connections" in d:
            c.root_connections = _int(d["root_connections"], "root_connections", where, 1, 65535)
        if "max_connections_per_user" in d:
            c.max_connections_per_user = _int(
                d["max_connections_per_user"], "max_connections_per_user", where, 1, 65535
            )
        if "max_waiting_per_user" in d:
            c.max_waiting_per_user = _int(
                d["max_waiting_per_user"], "max_waiting_per_user", where, 0, 65535
            )
        if "max_waiting" in d:
            c.max_waiting = _int(d["max_waiting"], "max_waiting", where, 0, 65535)
        if "wait_timeout" in d:
            c.wait_timeout = _num(d["wait_timeout"], "wait_timeout", where, 0.1, 600)
        if c.root_connections >= c.max_connections:
            raise ConfigError(
                f"{where}: 'root_connections' ({c.root_connections}) must be smaller than "
                f"'max_connections' ({c.max_connections}): users need some"
            )
        if "containers_outside_jobs" in d:
            v = d["containers_outside_jobs"]
            if not isinstance(v, bool):
                raise ConfigError(f"{where}: 'containers_outside_jobs' must be true or false")
            c.containers_outside_jobs = v
        if "roles" in d:
            c.roles = _strlist(d["roles"], "roles", where)
        if "log_level" in d:
            lv = _str(d["log_level"], "log_level", where).lower()
            if lv not in ("debug", "info", "warning", "error"):
                raise ConfigError(f"{where}: 'log_level' must be debug|info|warning|error")
            c.log_level = lv
        if "host_users" in d:
            v = d["host_users"]
            if not isinstance(v, list) or not v:
                raise ConfigError(f"{where}: 'host_users' must be a non-empty list")
            c.host_users = [str(x) for x in v]
            c.host_uids = [_uid(x, where) for x in v]
        return c

    @classmethod
    def load(cls, path: str) -> NodeConfig:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: invalid YAML: {str(e).splitlines()[0]}") from None
        return cls.from_dict(data, path)


FAILURE_POLICIES = ("fail", "retry")
_D = CLUSTER_DEFAULTS
#: the quota settings and their largest values (a user bridge holds 1023 ports: a node's
#: limit leaves room for the user's job and login pods there)
QUOTA_SETTINGS = {
    "quota_containers_per_node": 1000,
    "quota_containers": 1_000_000,
    "quota_login_pods": 1_000_000,
    "quota_addresses": 1_000_000,
}


@dataclass
class ClusterConfig:
    pod_cidr: ipaddress.IPv4Network
    block_prefix: int
    zone: str
    # the defaults of the settings the agent role writes: contracts.toml's
    vxlan_port: int = _D["vxlan_port"]
    #: other VXLAN ports on the nodes (Flannel's): user sockets may not send to them and
    #: they are received from registered nodes only, as podnet's own
    other_vxlan_ports: list[int] = field(default_factory=lambda: list(_D["other_vxlan_ports"]))
    underlay_mtu: int = 1500
    vni_min: int = _D["vni_min"]
    vni_max: int = _D["vni_max"]
    search_domains: list[str] = field(default_factory=list)
    dns_servers: list[str] = field(default_factory=list)
    host_cidrs: list[ipaddress.IPv4Network] = field(default_factory=list)
    gateway_ip: str = _D["gateway_ip"]
    login_lease_ttl: int = _D["login_lease_ttl"]
    login_grace: float = float(_D["login_grace"])
    failure_policy: str = _D["failure_policy"]
    failure_retry_seconds: float = float(_D["failure_retry_seconds"])
    #: the gateways' virtual address on the cluster network: pods' traffic to anything
    #: outside the cluster goes there (docs/gateway.md); "" = no gateway, no way out
    egress_gateway: str = ""
    #: per-user quotas (docs/security.md "Quotas"; root and host_users are not limited):
    #: containers on one node, containers and login pods in the cluster, and the addresses
    #: of both together (job pods are Slurm's to admit: never refused, never counted)
    quota_containers_per_node: int = _D["quota_containers_per_node"]
    quota_containers: int = _D["quota_containers"]
    quota_login_pods: int = _D["quota_login_pods"]
    quota_addresses: int = _D["quota_addresses"]

    @property
    def pod_mtu(self) -> int:
        return self.underlay_mtu - 50

    @classmethod
    def unknown_settings(cls, d: dict[str, Any]) -> list[str]:
        """Keys of `d` this version does not know (a newer podnet's settings, or typos)."""
        return sorted(set(d) - set(cls.__dataclass_fields__))

    @classmethod
    def from_dict(cls, d: Any, where: str = "etcd config", strict: bool = True) -> ClusterConfig:
        """The cluster configuration from etcd's JSON. strict=False ignores settings this
        version does not know: the configuration is shared by every node, and during a
        rolling upgrade the newer podnet writes settings that the nodes not yet upgraded
        must be able to start without (the caller warns)."""
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: expected a JSON object")
        extra = cls.unknown_settings(d)
        if extra and strict:
            raise ConfigError(f"{where}: unknown setting(s): {', '.join(extra)}")
        d = {k: v for k, v in d.items() if k not in extra}
        cidr = _net(_req(d, "pod_cidr", where), "pod_cidr", where)
        bp = _int(_req(d, "block_prefix", where), "block_prefix", where, 8, 30)
        if bp < cidr.prefixlen:
            raise ConfigError(f"{where}: 'block_prefix' /{bp} is larger than pod_cidr {cidr}")
        zone = _str(_req(d, "zone", where), "zone", where).strip(".").lower()
        if not all(is_label(x) for x in zone.split(".")):
            raise ConfigError(f"{where}: 'zone' is not a DNS name: {zone!r}")
        c = cls(pod_cidr=cidr, block_prefix=bp, zone=zone)
        if "vxlan_port" in d:
            c.vxlan_port = _int(d["vxlan_port"], "vxlan_port", where, 1, 65535)
        if "other_vxlan_ports" in d:
            ports = d["other_vxlan_ports"]
            if not isinstance(ports, list):
                raise ConfigError(f"{where}: 'other_vxlan_ports' must be a list of ports")
            c.other_vxlan_ports = [_int(x, "other_vxlan_ports", where, 1, 65535) for x in ports]
        if "underlay_mtu" in d:
            c.underlay_mtu = _int(d["underlay_mtu"], "underlay_mtu", where, 1280, 65535)
        if "vni_min" in d:
            c.vni_min = _int(d["vni_min"], "vni_min", where, 1, 16777215)
        if "vni_max" in d:
            c.vni_max = _int(d["vni_max"], "vni_max", where, 1, 16777215)
        if c.vni_min > c.vni_max:
            raise ConfigError(f"{where}: vni_min > vni_max")
        if "search_domains" in d:
            c.search_domains = _strlist(d["search_domains"], "search_domains", where)
        if "dns_servers" in d:
            c.dns_servers = [
                _ipv4(x, "dns_servers", where)
                for x in _strlist(d["dns_servers"], "dns_servers", where)
            ]
        if "host_cidrs" in d:
            c.host_cidrs = [
                _net(x, "host_cidrs", where) for x in _strlist(d["host_cidrs"], "host_cidrs", where)
            ]
            for n in c.host_cidrs:
                if n.overlaps(cidr):
                    raise ConfigError(f"{where}: host_cidrs entry {n} overlaps pod_cidr {cidr}")
        if "gateway_ip" in d:
            c.gateway_ip = _ipv4(d["gateway_ip"], "gateway_ip", where)
            if ipaddress.IPv4Address(c.gateway_ip) in cidr:
                raise ConfigError(f"{where}: 'gateway_ip' must not be inside pod_cidr")
        if d.get("egress_gateway"):
            c.egress_gateway = _ipv4(d["egress_gateway"], "egress_gateway", where)
            if ipaddress.IPv4Address(c.egress_gateway) in cidr:
                raise ConfigError(f"{where}: 'egress_gateway' must not be inside pod_cidr")
        for key, hi in QUOTA_SETTINGS.items():
            if key in d:
                setattr(c, key, _int(d[key], key, where, 0, hi))
        if "login_lease_ttl" in d:
            c.login_lease_ttl = _int(d["login_lease_ttl"], "login_lease_ttl", where, 5, 86400)
        if "login_grace" in d:
            c.login_grace = _num(d["login_grace"], "login_grace", where, 0, 86400)
        if "failure_policy" in d:
            fp = d["failure_policy"]
            if fp not in FAILURE_POLICIES:
                raise ConfigError(
                    f"{where}: 'failure_policy' must be one of "
                    f"{', '.join(FAILURE_POLICIES)}, got {fp!r}"
                )
            c.failure_policy = fp
        if "failure_retry_seconds" in d:
            c.failure_retry_seconds = _num(
                d["failure_retry_seconds"], "failure_retry_seconds", where, 0, 3600
            )
        return c
