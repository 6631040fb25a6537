# SPDX-License-Identifier: Apache-2.0
"""The Service names of a user's Kubernetes (`podnet.hpk.kubelet`): the zone file the
control plane's CoreDNS serves, `<svc>.<ns>.svc.<domain>` -> the ready addresses of the
Service's endpoints, rewritten when they change."""

from __future__ import annotations

import time
from pathlib import Path

from podnet.hpk.kubeapi import Client


class ServiceZone:
    """The zone file `path` of domain `domain`; `api_host`: the API server's address
    (`kubernetes.default.svc`), `dns_server`: CoreDNS's."""

    def __init__(
        self, api: Client, path: Path, domain: str, api_host: str, dns_server: str
    ) -> None:
        self.api = api
        self.path = path
        self.domain = domain
        self.api_host = api_host
        self.dns_server = dns_server
        self._body: str | None = None
        self._serial = 0

    def sync(self) -> None:
        """`<svc>.<ns>.svc.<domain>` -> the ready addresses of its endpoints, in the zone
        file the control plane's CoreDNS serves (headless or not: there is no kube-proxy,
        so a Service name always gives its pods' podnet addresses, as HPK does). Names that
        are not there get NXDOMAIN (the zone has its SOA)."""
        records = {("kubernetes.default.svc", self.api_host)}
        eps = self.api.request("GET", "/api/v1/endpoints")
        for ep in eps.get("items", []):
            meta = ep["metadata"]
            if meta["namespace"] == "default" and meta["name"] == "kubernetes":
                continue
            rel = f"{meta['name']}.{meta['namespace']}.svc"
            for subset in ep.get("subsets") or []:
                for a in subset.get("addresses") or []:
                    records.add((rel, a["ip"]))
                    if a.get("hostname"):
                        records.add((f"{a['hostname']}.{rel}", a["ip"]))
        body = "".join(f"{name} 5 IN A {ip}\n" for name, ip in sorted(records))
        if body == self._body:
            return
        self._body = body
        self._serial = max(self._serial + 1, int(time.time()))
        dom = self.domain
        text = (
            f"$ORIGIN {dom}.\n"
            f"@ 5 IN SOA ns.dns.{dom}. hostmaster.{dom}. {self._serial} 60 30 3600 5\n"
            f"@ 5 IN NS ns.dns.{dom}.\n"
            f"ns.dns 5 IN A {self.dns_server}\n" + body
        )
        tmp = self.path.with_name(".zone.tmp")
        tmp.write_text(text)
        tmp.replace(self.path)
