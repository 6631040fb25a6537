# SPDX-License-Identifier: Apache-2.0
"""The artifact builders a site runs ship in the collection (agent/artifacts/, issue 14):
they may read only what the tarball holds, and the wheelhouse's pins are the versions the
tests run with."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: what the builders source (not run on their own)
LIB = ROOT / "agent/artifacts/lib.sh"
SOURCED = [LIB, ROOT / "agent/artifacts/role_default.sh"]
BUILDERS = [
    *sorted(p for p in (ROOT / "agent/artifacts").glob("*.sh") if p not in SOURCED),
    ROOT / "agent/native/build-artifact.sh",
]


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_wheelhouse_pins_are_the_tested_versions() -> None:
    agent = _pins(ROOT / "agent/requirements.txt")
    dev = _pins(ROOT / "requirements-dev.txt")
    assert agent, "agent/requirements.txt pins nothing"
    assert {k: dev.get(k) for k in agent} == agent


def test_builders_read_nothing_the_tarball_leaves_out() -> None:
    assert len(BUILDERS) == 8, BUILDERS
    for script in [*BUILDERS, *SOURCED]:
        code = "\n".join(
            line for line in script.read_text().splitlines() if not line.lstrip().startswith("#")
        )
        for unshipped in ("tests/", "requirements-dev.txt", "inventories/lab"):
            assert unshipped not in code, (script.name, unshipped)
        assert script in SOURCED or script.stat().st_mode & 0o111, f"{script} is not executable"
