# SPDX-License-Identifier: Apache-2.0
"""Pods' way out: a policy route on nodes with pods (docs/gateway.md).

Traffic from the pod CIDR keeps every specific route of the main table (cluster
networks, other nodes' pod blocks: `suppress_prefixlength 0` skips only the default
route) and otherwise follows table EGRESS_TABLE, whose one route is the default via the
gateways' virtual address. Without a gateway both rules and the route are removed, and
pods reach nothing outside the cluster (the firewall drops it anyway).
"""

from __future__ import annotations

import logging
import subprocess

log = logging.getLogger("podnet.egress")

EGRESS_TABLE = 1771
PREF_MAIN, PREF_EGRESS = 1770, 1771


def _ip(*args: str, check: bool = True) -> bool:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and r.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r.returncode == 0


def ensure_egress_route(gateway: str, interface: str) -> None:
    """Put the default route of EGRESS_TABLE back if the kernel dropped it (link down)."""
    if not gateway:
        return
    r = subprocess.run(
        ["ip", "-4", "route", "show", "table", str(EGRESS_TABLE)],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode == 0 and "default" not in r.stdout:
        log.warning("egress route was gone (link down?): restored")
        _replace_default(gateway, interface)


def _replace_default(gateway: str, interface: str) -> None:
    """The default route of EGRESS_TABLE: via the gateways' cluster-side address."""
    _ip("-4", "route", "replace", "default", "via", gateway, "dev", interface,
        "table", str(EGRESS_TABLE))  # fmt: skip


def set_egress_route(pod_cidr: str, gateway: str, interface: str) -> None:
    """Install (gateway set) or remove (gateway "") the egress policy route."""
    for pref in (PREF_MAIN, PREF_EGRESS):
        while _ip("-4", "rule", "del", "pref", str(pref), check=False):
            pass
    _ip("-4", "route", "flush", "table", str(EGRESS_TABLE), check=False)
    if not gateway:
        return
    _replace_default(gateway, interface)
    _ip(
        "-4",
        "rule",
        "add",
        "pref",
        str(PREF_MAIN),
        "from",
        pod_cidr,
        "lookup",
        "main",
        "suppress_prefixlength",
        "0",
    )
    _ip(
        "-4", "rule", "add", "pref", str(PREF_EGRESS), "from", pod_cidr, "lookup", str(EGRESS_TABLE)
    )
    log.info("egress: %s -> %s via %s", pod_cidr, gateway, interface)
