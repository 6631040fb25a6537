# SPDX-License-Identifier: Apache-2.0
"""`podnet doctor` tests what it claims (issue 22, point 5): on every node of a working lab
(controller, login, compute, gateways) it builds a bridge, a veth pair and a VXLAN device
in a throwaway network namespace and passes every check (it used to read a module list and
fail on kernels that have them built in); where a capability is really missing (here:
CAP_NET_ADMIN, dropped as a container or a unit's CapabilityBoundingSet would) it fails
and says which."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from conftest import lab_inventory, ssh


def _nodes() -> list[str]:
    inv: dict[str, Any] = yaml.safe_load(lab_inventory().read_text())
    return list(inv["all"]["children"]["lab"]["hosts"])


@pytest.mark.parametrize("node", _nodes())
def test_doctor_passes_on_every_node(node: str) -> None:
    r = ssh(node, "podnet doctor", check=False, timeout=120)
    out = r.stdout
    assert r.returncode == 0, f"{node}: exit {r.returncode}\n{out}\n{r.stderr}"
    for k in ("netns", "bridge", "veth", "vxlan"):
        assert f"ok   kernel:{k}: " in out, out
    assert "FAIL" not in out, out
    # nothing is left behind: no link of the check on the node's own network
    links = ssh(node, "ip -o link show").stdout
    assert not any(n in links for n in ("pndbr", "pnda", "pndvx")), links


def test_doctor_fails_where_links_cannot_be_made() -> None:
    r = ssh(
        "c1",
        "setpriv --inh-caps=-all --ambient-caps=-all --bounding-set=-net_admin podnet doctor",
        check=False,
        timeout=120,
    )
    out = r.stdout
    assert r.returncode == 1, f"exit {r.returncode}\n{out}\n{r.stderr}"
    assert "ok   kernel:netns: " in out, out
    for k, what in (("bridge", "bridge"), ("veth", "veth pair"), ("vxlan", "VXLAN device")):
        assert f"FAIL kernel:{k}: cannot create a {what}: not permitted" in out, out
