# SPDX-License-Identifier: Apache-2.0
"""The cluster-wide podnet_* variables have their defaults in one place, the role
hpc.podnet.podnet (roles/podnet/defaults/main.yml, docs/roles/podnet.md):

- no role, template or playbook writes one of them with `| default(...)` again (a second
  default, which drifts: the PKI directory's was '~/.podnet/pki' in preflight and
  '~/.podnet/pki/<cluster>' everywhere else);
- every role that reads one depends on hpc.podnet.podnet (meta/main.yml), so it sees the
  defaults run alone, from a playbook, or included by another role;
- docs/architecture.md's table of the cluster-wide variables gives the same defaults.

(tests/unit/roles/test_argument_specs.py checks the role's argument spec against its
defaults; tests/unit/python/test_contracts.py those the cluster configuration shares with
agent/src/podnet/contracts.toml.)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
ROLES = ROOT / "roles"
DEFAULTS: dict[str, Any] = yaml.safe_load((ROLES / "podnet/defaults/main.yml").read_text())
NAMES = "|".join(sorted(DEFAULTS))
READ = re.compile(rf"\b({NAMES})\b")
DEFAULTED = re.compile(rf"\b({NAMES}) *\| *default\(")
OTHER_ROLES = sorted(p for p in ROLES.iterdir() if p.is_dir() and p.name != "podnet")


def _files(*dirs: Path) -> list[Path]:
    found = (p for d in dirs for p in d.rglob("*"))
    return sorted(p for p in found if p.is_file() and p.suffix in (".yml", ".j2"))


def test_the_role_holds_cluster_wide_variables_only() -> None:
    assert DEFAULTS and all(k.startswith("podnet_") for k in DEFAULTS)
    # required, or a host's own (its default: the host's facts)
    assert "podnet_cluster_name" not in DEFAULTS and "podnet_underlay_ip" not in DEFAULTS


def test_no_second_default() -> None:
    found = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in _files(ROLES, ROOT / "playbooks")
        if not p.is_relative_to(ROLES / "podnet")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if DEFAULTED.search(line)
    ]
    assert not found, "defaults of hpc.podnet.podnet written again: " + "; ".join(found)


@pytest.mark.parametrize("role", OTHER_ROLES, ids=lambda p: p.name)
def test_a_role_that_reads_them_depends_on_the_role(role: Path) -> None:
    reads = sorted({m for p in _files(role) for m in READ.findall(p.read_text())})
    meta = yaml.safe_load((role / "meta/main.yml").read_text())
    deps = [d["role"] if isinstance(d, dict) else d for d in meta.get("dependencies") or []]
    if reads:
        assert "hpc.podnet.podnet" in deps, f"{role.name} reads {reads}: add the dependency"


def test_the_architecture_table_gives_the_same_defaults() -> None:
    text = (ROOT / "docs/architecture.md").read_text()
    rows = dict(re.findall(r"^\| `(podnet_\w+)` \| `([^`]*)` \|", text, re.M))
    listed = {k: v for k, v in rows.items() if k in DEFAULTS}
    assert len(listed) >= 8, rows
    for var, shown in listed.items():
        value = yaml.safe_load(shown.replace("<cluster>", "{{ podnet_cluster_name }}"))
        assert value == DEFAULTS[var], f"docs/architecture.md: {var} {shown!r}"
