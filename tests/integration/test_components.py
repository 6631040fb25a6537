# SPDX-License-Identifier: Apache-2.0
"""Apptainer and Flannel are a site's choice (docs/admin-guide.md "Inventory"): with
podnet_apptainer_enabled / podnet_flannel_enabled false, the collection's playbooks that deploy
them (apptainer.yml, flannel.yml, and site.yml, scale.yml and upgrade.yml through them) run
none of their tasks. ansible-playbook in check mode against this host (connection local) as
the only compute node: had any task of the roles run, it would show in the recap (and most
would fail here: no etcd, no artifacts)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import Playbook

REPO = Path(__file__).resolve().parents[2]

INVENTORY = """
all:
  vars:
    ansible_connection: local
    ansible_python_interpreter: "{python}"
    podnet_cluster_name: t
    podnet_pod_cidr: 198.18.0.0/15
    podnet_underlay_ip: 127.0.0.1
  children:
    compute:
      hosts:
        node1: {{}}
    login: {{}}
    etcd:
      hosts:
        etcd1: {{}}
"""


def run(inventory: Path, playbook: str, *args: str, ok: bool = True) -> str:
    return Playbook(REPO / "playbooks" / playbook, ("-i", str(inventory))).run(
        *args, ok=ok, timeout=300
    )


@pytest.mark.parametrize(
    ("playbook", "switch"),
    [
        ("apptainer.yml", "podnet_apptainer_enabled"),
        ("flannel.yml", "podnet_flannel_enabled"),
    ],
)
def test_a_component_switched_off_runs_nothing(tmp_path: Path, playbook: str, switch: str) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(INVENTORY.format(python=sys.executable))
    out = run(inventory, playbook, "--check", "-e", f"{switch}=false")
    recap = out[out.rindex("PLAY RECAP") :]
    assert "node1" in recap and "ok=0 " in recap and "changed=0 " in recap, out[-3000:]
    assert "failed=0 " in recap, out[-3000:]
    # the control: switched on (the default), the role's tasks run (and stop here, no etcd)
    out = run(inventory, playbook, "--check", ok=False)
    recap = out[out.rindex("PLAY RECAP") :]
    assert "ok=0 " not in recap or "failed=0 " not in recap, out[-3000:]


@pytest.mark.parametrize("private", ["false", "true"])
def test_the_cluster_wide_defaults_reach_the_role(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private: str
) -> None:
    """The roles read the cluster-wide defaults of hpc.podnet.podnet (docs/roles/podnet.md), their
    dependency, whether a play's role defaults are public or private (ANSIBLE_PRIVATE_ROLE_VARS):
    hpk.yml with podnet_hpk_enabled unset runs none of its tasks (the default, false). Had the
    default not reached the role, its `when` (hpk_enabled: podnet_hpk_enabled) would fail."""
    monkeypatch.setenv("ANSIBLE_PRIVATE_ROLE_VARS", private)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(INVENTORY.format(python=sys.executable))
    out = run(inventory, "hpk.yml", "--check")
    recap = out[out.rindex("PLAY RECAP") :]
    assert "node1" in recap and "ok=0 " in recap and "failed=0 " in recap, out[-3000:]
