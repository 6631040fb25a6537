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

The package: config.py (gateway.yaml), state.py (the table's inputs from etcd), nft.py
(the table as nft commands), metrics.py (the metrics endpoint) with conntrackd.py
(conntrackd's flow-state sync statistics), daemon.py (the loop and main).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from podnet import __version__, logs
from podnet.config import DEFAULT_CONFIG, ClusterConfig, ConfigError, NodeConfig
from podnet.gateway import nft
from podnet.gateway.config import DEFAULT_GATEWAY_CONFIG, GatewayConfig
from podnet.gateway.metrics import VrrpWatch, holds_address, start_metrics
from podnet.gateway.nft import ruleset, update
from podnet.gateway.state import State, read_state
from podnet.names import Keys
from podnet.state.etcdops import cmp_mod, op_delete
from podnet.state.store import Etcd, EtcdRequestError, EtcdUnavailable
from podnet.stats import ETCD_BUCKETS, Histogram, Tally

log = logging.getLogger("podnet.gateway")

DEBOUNCE = 0.05


class Gateway:
    def __init__(self, cfg: NodeConfig, gcfg: GatewayConfig) -> None:
        self.cfg = cfg
        self.gcfg = gcfg
        self.keys = Keys(cfg.cluster)
        # what the metrics read (gateway/metrics.py)
        self.syncs = Tally()
        self.sync_seconds = Histogram()
        self.etcd_seconds = Histogram(ETCD_BUCKETS)
        self.sync_failures = 0
        self.released = 0
        self.vrrp = VrrpWatch()
        self.etcd = Etcd.of_node(cfg, observe=self.etcd_seconds.observe)
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.cur: State | None = None  # what the kernel table holds
        self.applied = 0

    @property
    def external_ip(self) -> str:
        return self.gcfg.external_ip

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
        nft.apply(text)

    def sync(self, pod_cidr: str) -> float:
        t0 = time.monotonic()
        st, stale = read_state(self.etcd, self.keys)
        for kv in stale:
            # guarded: a record rewritten meanwhile stays
            self.etcd.txn([cmp_mod(kv.key, kv.mod_revision)], [op_delete(kv.key)])
            self.released += 1
            log.info("publication %s released (its job is gone)", kv.key.rsplit("/", 1)[-1])
        cmd = update(self.cur, st) if self.cur is not None else None
        if cmd is None:
            self.apply(ruleset(pod_cidr, self.gcfg.external_interface, self.gcfg.external_ip, st))
            self.applied += 1
            self.syncs.add("full")
        elif cmd:
            kind = "update"
            try:
                self.apply(cmd)
            except RuntimeError as e:  # out of step with the kernel: start over
                log.warning("incremental update failed (%s): full replace", e)
                self.apply(
                    ruleset(pod_cidr, self.gcfg.external_interface, self.gcfg.external_ip, st)
                )
                kind = "replace"
            self.applied += 1
            self.syncs.add(kind)
        self.cur = st
        took = time.monotonic() - t0
        self.sync_seconds.observe(took)
        return took

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
            self.watch_vrrp()
            time.sleep(DEBOUNCE)
            self.wake.clear()
            try:
                took = self.sync(pod_cidr)
                log.debug("sync in %.1f ms", took * 1000)
            except (EtcdUnavailable, EtcdRequestError, RuntimeError) as e:
                self.sync_failures += 1
                log.warning("sync failed (retrying): %s", e)
                self.wake.set()
                self.stop.wait(1.0)

    def watch_vrrp(self) -> None:
        """Note (and log) a change of whether this gateway holds the external address."""
        if self.vrrp.observe(holds_address(self.external_ip)):
            if self.vrrp.master:
                log.warning(
                    "VRRP: this gateway took the external address %s (failover)", self.external_ip
                )
            else:
                log.warning("VRRP: this gateway lost the external address %s", self.external_ip)

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
        logs.fatal(f"podnet-gatewayd: configuration error: {e}")
        return 2
    if args.check_config:
        print(f"podnet-gatewayd: {args.gateway_config}: ok")
        return 0
    logs.setup(cfg.log_level)
    gw = Gateway(cfg, gcfg)
    if gcfg.metrics:
        start_metrics(gcfg.metrics, gw)

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
