# SPDX-License-Identifier: Apache-2.0
"""podnet-gatewayd: the gateway's nftables table from etcd (docs/gateway.md).

Runs on the nodes of the `gateway` group next to podnetd (which routes the pod address
blocks to their nodes). It watches `/podnet/<cluster>/` and, within DEBOUNCE of a change,
rebuilds one table, `inet podnet_gw`, in one atomic nft transaction:

* egress: pods -> outside, SNAT to the gateways' external virtual address (keepalived
  moves it; conntrackd keeps the NAT state on the standby), each packet through the
  policy sets (gwpolicy: user deny, user allow, global deny, global allow, default);
* ingress: only published ports (DNAT map `external port -> pod ip . port`); nothing
  else from outside reaches a pod;
* hairpin: routed pod -> pod through the gateway is dropped (two users' pods never
  talk through it, also not through a published address).

Publications whose job is gone (no `jobs/<id>`, or its pod's IP now belongs to
another job) are deleted here.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from podnet import __version__
from podnet.config import DEFAULT_CONFIG, ClusterConfig, ConfigError, NodeConfig
from podnet.names import Keys
from podnet.policy_format import PolicyError
from podnet.state.gwpolicy import Compiled, Policy, compile_policy, parse_policy
from podnet.state.store import KV, Etcd, EtcdRequestError, EtcdUnavailable, b64, op_delete

try:
    import nftables
except ImportError:  # pragma: no cover - python3-nftables is a dependency on gateways
    nftables = None

log = logging.getLogger("podnet.gateway")

DEFAULT_GATEWAY_CONFIG = "/etc/podnet/gateway.yaml"
DEBOUNCE = 0.05
TABLE = "podnet_gw"


@dataclass
class GatewayConfig:
    external_interface: str
    external_ip: str
    ports: str = "20000-20999"

    @classmethod
    def load(cls, path: str) -> GatewayConfig:
        try:
            d = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"{path}: {e}") from None
        if not isinstance(d, dict):
            raise ConfigError(f"{path}: expected a mapping")
        extra = sorted(set(d) - {"external_interface", "external_ip", "ports"})
        if extra:
            raise ConfigError(f"{path}: unknown setting(s): {', '.join(extra)}")
        try:
            ip = str(ipaddress.IPv4Address(str(d.get("external_ip"))))
        except ValueError:
            raise ConfigError(f"{path}: 'external_ip' is not an IPv4 address") from None
        ifname = d.get("external_interface")
        if not isinstance(ifname, str) or not 0 < len(ifname) <= 15 or '"' in ifname:
            raise ConfigError(f"{path}: 'external_interface' is not an interface name")
        ports = str(d.get("ports", "20000-20999"))
        lo, _sep, hi = ports.partition("-")
        if not (lo.isdigit() and hi.isdigit() and 0 < int(lo) <= int(hi) < 65536):
            raise ConfigError(f"{path}: 'ports' must be lo-hi, got {ports!r}")
        return cls(ifname, ip, ports)


@dataclass
class State:
    """What the table is made of (read from etcd in one pass)."""

    pod_vni: dict[str, int] = field(default_factory=dict)
    published: dict[int, tuple[str, int]] = field(default_factory=dict)
    compiled: Compiled = field(default_factory=lambda: compile_policy(Policy(), {}))


def _elems(items: list[str]) -> str:
    return f"elements = {{ {', '.join(items)} }}; " if items else ""


KEY = "ip daddr . meta l4proto . th dport"


def _user_objects(vni: int, deny: list[str], allow: list[str]) -> str:
    """A user's two sets, their chain and the verdict map element (nft commands)."""
    t = f"inet {TABLE}"
    return (
        f"add set {t} u{vni}_deny {{ typeof {KEY}; flags interval; {_elems(deny)}}}\n"
        f"add set {t} u{vni}_allow {{ typeof {KEY}; flags interval; {_elems(allow)}}}\n"
        f"add chain {t} u{vni}\n"
        f"add rule {t} u{vni} {KEY} @u{vni}_deny counter drop\n"
        f"add rule {t} u{vni} {KEY} @u{vni}_allow counter accept\n"
        f"add element {t} user_chain {{ {vni} : jump u{vni} }}\n"
    )


def _user_delete(vni: int) -> str:
    t = f"inet {TABLE}"
    return (
        f"delete element {t} user_chain {{ {vni} }}\n"
        f"delete chain {t} u{vni}\n"
        f"delete set {t} u{vni}_deny\n"
        f"delete set {t} u{vni}_allow\n"
    )


def _set_elems(name: str, old: list[str], new: list[str]) -> str:
    """Commands that turn set `name` from `old` into `new` (flush + add: intervals)."""
    if old == new:
        return ""
    t = f"inet {TABLE}"
    cmd = f"flush set {t} {name}\n"
    if new:
        cmd += f"add element {t} {name} {{ {', '.join(new)} }}\n"
    return cmd


def _map_diff(name: str, old: dict[str, str], new: dict[str, str]) -> str:
    t = f"inet {TABLE}"
    gone = [k for k in old if k not in new or old[k] != new[k]]
    came = [f"{k} : {v}" for k, v in new.items() if k not in old or old[k] != v]
    cmd = ""
    if gone:
        cmd += f"delete element {t} {name} {{ {', '.join(gone)} }}\n"
    if came:
        cmd += f"add element {t} {name} {{ {', '.join(came)} }}\n"
    return cmd


def _pods(st: State) -> dict[str, str]:
    return {ip: str(vni) for ip, vni in st.pod_vni.items()}


def _pubs(st: State) -> dict[str, str]:
    return {str(p): f"{ip} . {port}" for p, (ip, port) in st.published.items()}


def update(old: State, new: State) -> str | None:
    """nft commands (one transaction) from the table of `old` to that of `new`, or None
    when only a full replace will do (the default verdict changed)."""
    oc, nc = old.compiled, new.compiled
    if oc.default != nc.default:
        return None
    cmd = _map_diff("pod_user", _pods(old), _pods(new))
    cmd += _map_diff("published", _pubs(old), _pubs(new))
    cmd += _set_elems("global_deny", oc.global_deny, nc.global_deny)
    cmd += _set_elems("global_allow", oc.global_allow, nc.global_allow)
    for vni in sorted(set(oc.users) | set(nc.users)):
        if vni not in nc.users:
            cmd += _user_delete(vni)
        elif vni not in oc.users:
            cmd += _user_objects(vni, *nc.users[vni])
        else:
            (od, oa), (nd, na) = oc.users[vni], nc.users[vni]
            cmd += _set_elems(f"u{vni}_deny", od, nd) + _set_elems(f"u{vni}_allow", oa, na)
    return cmd


def ruleset(pod_cidr: str, ext_if: str, ext_ip: str, st: State) -> str:
    """The whole gateway table (nft syntax), for an atomic replace (start, resync)."""
    c = st.compiled
    pods = [f"{ip} : {vni}" for ip, vni in sorted(st.pod_vni.items())]
    pub = [f"{p} : {ip} . {port}" for p, (ip, port) in sorted(st.published.items())]
    default = "accept" if c.default == "allow" else "drop"
    users = "".join(_user_objects(vni, *sets) for vni, sets in sorted(c.users.items()))
    return f"""
add table inet {TABLE}
delete table inet {TABLE}
table inet {TABLE} {{
    map pod_user {{ type ipv4_addr : mark; {_elems(pods)}}}
    map user_chain {{ type mark : verdict; }}
    set global_deny {{ typeof {KEY}; flags interval; {_elems(c.global_deny)}}}
    set global_allow {{ typeof {KEY}; flags interval; {_elems(c.global_allow)}}}
    map published {{ typeof tcp dport : ip daddr . tcp dport; {_elems(pub)}}}
    chain prerouting {{
        type nat hook prerouting priority dstnat; policy accept;
        iifname "{ext_if}" ip daddr {ext_ip} dnat ip to tcp dport map @published
    }}
    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        oifname "{ext_if}" ip saddr {pod_cidr} snat ip to {ext_ip}
    }}
    chain forward {{
        type filter hook forward priority filter; policy accept;
        ip saddr {pod_cidr} ip daddr {pod_cidr} counter drop comment "hairpin"
        iifname "{ext_if}" ip daddr {pod_cidr} ct status dnat ct direction original accept
        iifname "{ext_if}" ip daddr {pod_cidr} ct state established,related \
ct direction reply accept
        iifname "{ext_if}" counter drop comment "nothing unpublished from outside"
        oifname "{ext_if}" ip saddr {pod_cidr} ct status dnat ct direction reply accept
        oifname "{ext_if}" ip saddr {pod_cidr} goto egress
        oifname "{ext_if}" counter drop comment "only pods leave through the gateway"
    }}
    chain egress {{
        meta mark set ip saddr map @pod_user
        meta mark 0 counter drop comment "not a known pod"
        meta mark vmap @user_chain
        {KEY} @global_deny counter drop
        {KEY} @global_allow counter accept
        counter {default} comment "default"
    }}
}}
{users}"""


@dataclass
class Raw:
    """The etcd records the gateway table is made of."""

    ips: dict[str, dict[str, Any]] = field(default_factory=dict)
    user_vni: dict[str, int] = field(default_factory=dict)
    jobs: set[int] = field(default_factory=set)
    user_pol: dict[str, Any] = field(default_factory=dict)
    global_pol: Any = None
    pubs: list[KV] = field(default_factory=list)

    def add(self, rel: str, kv: KV) -> None:
        if rel.startswith("ips/"):
            d = kv.json()
            if isinstance(d, dict):
                self.ips[rel[4:]] = d
        elif rel.startswith("users/"):
            self.user_vni[rel[6:]] = int(kv.json()["vni"])
        elif rel.startswith("jobs/"):
            self.jobs.add(int(rel[5:]))
        elif rel == "gateway/policy/global":
            self.global_pol = kv.json()
        elif rel.startswith("gateway/policy/users/"):  # parsed once per text (_parse_cached)
            self.user_pol[rel[len("gateway/policy/users/") :]] = kv.value
        elif rel.startswith("gateway/published/"):
            self.pubs.append(kv)


def read_state(etcd: Etcd, keys: Keys) -> tuple[State, list[KV]]:
    """The table's inputs; also the publications whose job is gone (to delete)."""
    kvs, _rev = etcd.get_prefix(keys.root)
    raw = Raw()
    for kv in kvs:
        try:
            raw.add(kv.key[len(keys.root) :], kv)
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring unreadable %s", kv.key)
    return build_state(raw)


def build_state(raw: Raw) -> tuple[State, list[KV]]:
    st = State()
    for ip, d in raw.ips.items():
        vni = d.get("vni")
        if isinstance(vni, int) and vni > 0:
            st.pod_vni[ip] = vni
    st.compiled = compile_policy(*_policies(raw))
    stale: list[KV] = []
    for kv in raw.pubs:
        try:
            d = kv.json()
            ext = int(kv.key.rsplit("/", 1)[-1])
            job_id, ip, port = int(d["job_id"]), str(d["ip"]), int(d["port"])
        except (ValueError, KeyError, TypeError):
            stale.append(kv)
            continue
        # the job ended, or the address is another job's now: the publication is released
        if job_id not in raw.jobs or raw.ips.get(ip, {}).get("job_id") != job_id:
            stale.append(kv)
            continue
        st.published[ext] = (ip, port)
    return st, stale


#: parsed policies by their JSON text: a change re-parses only the policies that changed
_PARSED: dict[str, Policy] = {}


def _parse_cached(pol: Any, where: str, user: bool) -> Policy:
    """`pol`: the JSON text of a policy record (or the parsed value)."""
    key = f"{user}:{pol if isinstance(pol, str) else json.dumps(pol, sort_keys=True)}"
    p = _PARSED.get(key)
    if p is None:
        try:
            data = json.loads(pol) if isinstance(pol, str) else pol
        except ValueError:
            raise PolicyError(f"{where}: not JSON") from None
        p = parse_policy(data, where, user=user)
        if len(_PARSED) > 100000:
            _PARSED.clear()
        _PARSED[key] = p
    return p


def _policies(raw: Raw) -> tuple[Policy, dict[int, Policy]]:
    try:
        gp = _parse_cached(raw.global_pol, "gateway/policy/global", False)
    except PolicyError as e:
        log.error("%s: keeping default deny", e)
        gp = Policy()
    users: dict[int, Policy] = {}
    for user, pol in raw.user_pol.items():
        if user not in raw.user_vni:
            continue  # no network yet: nothing of theirs to match
        try:
            users[raw.user_vni[user]] = _parse_cached(pol, f"policy of {user}", True)
        except PolicyError as e:
            log.error("%s: the user gets the global policy only", e)
    return gp, users


class Gateway:
    def __init__(self, cfg: NodeConfig, gcfg: GatewayConfig) -> None:
        self.cfg = cfg
        self.gcfg = gcfg
        self.keys = Keys(cfg.cluster)
        self.etcd = Etcd(
            cfg.etcd_endpoints, cfg.etcd_ca, cfg.etcd_cert, cfg.etcd_key, cfg.etcd_timeout
        )
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.cur: State | None = None  # what the kernel table holds
        self.applied = 0

    def pod_cidr(self) -> str:
        d = self.etcd.get_json(self.keys.config)
        if d is None:
            raise ConfigError(f"etcd key {self.keys.config} is missing")
        return str(ClusterConfig.from_dict(d, strict=False).pod_cidr)

    def publish_config(self) -> None:
        self.etcd.put(
            self.keys.gateway_config,
            {"external_ip": self.gcfg.external_ip, "ports": self.gcfg.ports},
        )

    def apply(self, text: str) -> None:
        if nftables is None:
            raise RuntimeError("python3-nftables (libnftables) is not installed")
        nft = nftables.Nftables()
        rc, _out, err = nft.cmd(text)
        if rc != 0:
            raise RuntimeError(f"nft: {str(err).strip()}")

    def sync(self, pod_cidr: str) -> float:
        t0 = time.monotonic()
        st, stale = read_state(self.etcd, self.keys)
        for kv in stale:
            # guarded: a record rewritten meanwhile stays
            cmp = {
                "key": b64(kv.key),
                "target": "MOD",
                "result": "EQUAL",
                "mod_revision": str(kv.mod_revision),
            }
            self.etcd.txn([cmp], [op_delete(kv.key)])
            log.info("publication %s released (its job is gone)", kv.key.rsplit("/", 1)[-1])
        cmd = update(self.cur, st) if self.cur is not None else None
        if cmd is None:
            self.apply(ruleset(pod_cidr, self.gcfg.external_interface, self.gcfg.external_ip, st))
            self.applied += 1
        elif cmd:
            try:
                self.apply(cmd)
            except RuntimeError as e:  # out of step with the kernel: start over
                log.warning("incremental update failed (%s): full replace", e)
                self.apply(
                    ruleset(pod_cidr, self.gcfg.external_interface, self.gcfg.external_ip, st)
                )
            self.applied += 1
        self.cur = st
        return time.monotonic() - t0

    def run(self) -> None:
        # forwarding; and flows the peer synced (conntrackd) carry TCP windows a little
        # behind: accept their packets instead of marking them invalid
        for path in ("ipv4/ip_forward", "netfilter/nf_conntrack_tcp_be_liberal"):
            try:
                Path("/proc/sys/net", path).write_text("1")
            except OSError as e:
                log.warning("net.%s: %s", path.replace("/", "."), e)
        pod_cidr = self.pod_cidr()
        self.publish_config()
        _kvs, rev = self.etcd.get_prefix(self.keys.prefix("gateway"), keys_only=True)
        self.etcd.watch_prefix(
            self.keys.root, rev + 1, lambda *_a: self.wake.set(), self._resync, self.stop
        )
        self.wake.set()
        while not self.stop.is_set():
            self.wake.wait(5.0)  # also a periodic pass (jobs that ended while we were away)
            if self.stop.is_set():
                break
            time.sleep(DEBOUNCE)
            self.wake.clear()
            try:
                took = self.sync(pod_cidr)
                log.debug("sync in %.1f ms", took * 1000)
            except (EtcdUnavailable, EtcdRequestError, RuntimeError) as e:
                log.warning("sync failed (retrying): %s", e)
                self.wake.set()
                self.stop.wait(1.0)

    def _resync(self) -> int:
        self.wake.set()
        _kvs, rev = self.etcd.get_prefix(self.keys.prefix("gateway"), keys_only=True)
        return rev


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="podnet-gatewayd", description="podnet gateway rules")
    ap.add_argument("-c", "--config", default=DEFAULT_CONFIG, help="node configuration file")
    ap.add_argument("-g", "--gateway-config", default=DEFAULT_GATEWAY_CONFIG)
    ap.add_argument("--check-config", action="store_true")
    ap.add_argument("--version", action="version", version=f"podnet-gatewayd {__version__}")
    args = ap.parse_args(argv)
    try:
        cfg = NodeConfig.load(args.config)
        gcfg = GatewayConfig.load(args.gateway_config)
    except ConfigError as e:
        print(f"podnet-gatewayd: configuration error: {e}", file=sys.stderr)
        return 2
    if args.check_config:
        print(f"podnet-gatewayd: {args.gateway_config}: ok")
        return 0
    logging.basicConfig(
        level=getattr(logging, cfg.log_level.upper()), format="%(levelname)s %(name)s: %(message)s"
    )
    gw = Gateway(cfg, gcfg)

    def stop(signum: int, frame: FrameType | None) -> None:
        del frame
        log.info("signal %d: stopping (the table stays)", signum)
        gw.stop.set()
        gw.wake.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not gw.stop.is_set():
        try:
            gw.run()
        except (EtcdUnavailable, EtcdRequestError, ConfigError) as e:
            log.warning("etcd: %s; retrying", e)
            gw.stop.wait(2.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
