# SPDX-License-Identifier: Apache-2.0
"""podnet-gatewayd's own configuration (`/etc/podnet/gateway.yaml`, written by
hpc.podnet.gateway): the external interface and address, the published port range, the
metrics endpoint (host:port, off when absent)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml

from podnet.config import ConfigError

DEFAULT_GATEWAY_CONFIG = "/etc/podnet/gateway.yaml"


@dataclass
class GatewayConfig:
    external_interface: str
    external_ip: str
    ports: str = "20000-20999"
    metrics: str | None = None

    @classmethod
    def load(cls, path: str) -> GatewayConfig:
        try:
            d = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"{path}: {e}") from None
        if not isinstance(d, dict):
            raise ConfigError(f"{path}: expected a mapping")
        extra = sorted(set(d) - {"external_interface", "external_ip", "ports", "metrics"})
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
        metrics = d.get("metrics")
        if metrics is not None:
            host, _sep, port = str(metrics).rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"{path}: 'metrics' must be host:port, got {metrics!r}")
            metrics = str(metrics)
        return cls(ifname, ip, ports, metrics)
