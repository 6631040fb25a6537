# SPDX-License-Identifier: Apache-2.0
"""Air-gapped nodes (podnet_package_source: bundle) get every Debian package from the bundle's
archive only if the roles install packages through hpc.podnet._common (packages.yml, debs.yml),
which sets that archive up first: a role's own apt task would reach for the node's apt sources.
The exceptions are the paths preflight refuses with bundle (roles/preflight/tasks/cluster.yml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
# file -> why its apt task may stay (each refused by preflight with podnet_package_source bundle)
ALLOWED = {
    "roles/apptainer/tasks/install_apt.yml": "apptainer_install_method apt: its own apt source",
    "roles/apptainer/handlers/main.yml": "apptainer_install_method apt: its own apt source",
    "roles/spank/tasks/build.yml": "spank_build_on_node: compilers",
    "roles/sshd_hooks/tasks/build.yml": "sshd_hooks_build_on_node: compilers",
}
APT = {"ansible.builtin.apt", "apt", "ansible.builtin.package", "package"}


def _tasks(node: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(node, list):
        for t in node:
            out += _tasks(t)
    elif isinstance(node, dict):
        out.append(node)
        for key in ("block", "rescue", "always"):
            out += _tasks(node.get(key))
    return out


def test_roles_install_packages_through_common() -> None:
    found = []
    for f in sorted((ROOT / "roles").glob("*/*/*.yml")):
        rel = str(f.relative_to(ROOT))
        if rel.startswith("roles/_common/") or f.parent.name not in ("tasks", "handlers"):
            continue
        for task in _tasks(yaml.safe_load(f.read_text())):
            if APT & task.keys() and rel not in ALLOWED:
                found.append(f"{rel}: {task.get('name')}")
    assert not found, f"apt outside hpc.podnet._common (use tasks_from: packages): {found}"


def test_allowed_paths_are_refused_with_bundle() -> None:
    preflight = (ROOT / "roles/preflight/tasks/cluster.yml").read_text()
    for var in ("apptainer_install_method", "spank_build_on_node", "sshd_hooks_build_on_node"):
        assert var in preflight.split("podnet_package_source", 1)[1], var
    for rel in ALLOWED:
        assert (ROOT / rel).is_file(), rel
