# SPDX-License-Identifier: Apache-2.0
"""Every role's meta/argument_specs.yml is in sync with its defaults/main.yml.

Same option names, and each default in the spec equals the default in defaults/main.yml
(compared as YAML values, so quoting and formatting may differ). An int or bool option whose
default is a template has no default in the spec (the docs linter wants a value of the
option's type there); its description says what the default is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[3] / "roles"
# hpc.podnet.podnet has no tasks: the cluster-wide defaults alone
ROLE_DIRS = sorted(
    p for p in ROLES.iterdir() if (p / "tasks").is_dir() or (p / "defaults").is_dir()
)


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text()) if path.exists() else None
    return data or {}


@pytest.mark.parametrize("role", ROLE_DIRS, ids=lambda p: p.name)
def test_argument_specs_match_defaults(role: Path) -> None:
    defaults = _load(role / "defaults" / "main.yml")
    specs = _load(role / "meta" / "argument_specs.yml")
    assert "argument_specs" in specs, f"{role.name}: meta/argument_specs.yml missing"
    options = specs["argument_specs"]["main"].get("options", {}) or {}
    assert sorted(options) == sorted(defaults), (
        f"{role.name}: only in defaults {sorted(set(defaults) - set(options))}, "
        f"only in argument_specs {sorted(set(options) - set(defaults))}"
    )
    for name, spec in options.items():
        default = defaults[name]
        templated = isinstance(default, str) and "{{" in default
        if templated and spec.get("type") in ("int", "bool") and "default" not in spec:
            text = spec.get("description") or ""
            text = text if isinstance(text, str) else " ".join(text)
            assert "Default" in text, f"{role.name}: {name}: description must give the default"
            continue
        assert spec.get("default") == default, f"{role.name}: default of {name} differs"
        assert spec.get("description"), f"{role.name}: {name} has no description"


@pytest.mark.parametrize("role", ROLE_DIRS, ids=lambda p: p.name)
def test_role_variables_are_prefixed(role: Path) -> None:
    defaults = _load(role / "defaults" / "main.yml")
    bad = [k for k in defaults if not k.startswith(role.name + "_")]
    assert not bad, f"{role.name}: defaults without the role prefix: {bad}"
