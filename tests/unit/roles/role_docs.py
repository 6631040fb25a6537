# SPDX-License-Identifier: Apache-2.0
"""The variables table of each role page (docs/roles/<role>.md), generated from the role's
meta/argument_specs.yml (the one description of each variable, which Ansible checks at run
time): `make role-docs` writes it, tests/unit/roles/test_role_docs.py checks it is current.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
BEGIN = "<!-- BEGIN VARIABLES: generated from meta/argument_specs.yml by `make role-docs` -->"
END = "<!-- END VARIABLES -->"
_MARKUP = re.compile(r"\b([CIOVP])\(([^)]*)\)")


def _text(value: Any) -> str:
    parts = value if isinstance(value, list) else [value or ""]
    text = " ".join(str(p).strip() for p in parts)
    text = _MARKUP.sub(lambda m: f"`{m.group(2)}`", text)
    return text.replace("|", "\\|").replace("\n", " ")


def _default(spec: dict[str, Any]) -> str:
    if "default" not in spec:
        return ""
    value = spec["default"]
    shown = value if isinstance(value, str) and value else json.dumps(value)
    return "`" + str(shown).replace("|", "\\|").replace("\n", " ") + "`"


def table(role: Path) -> str:
    specs = yaml.safe_load((role / "meta/argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"].get("options") or {}
    rows = [
        BEGIN,
        "",
        "| variable | type | default | description |",
        "| --- | --- | --- | --- |",
    ]
    for name in sorted(options):
        spec = options[name]
        kind = spec.get("type", "str")
        if kind == "list" and spec.get("elements"):
            kind = f"list of {spec['elements']}"
        rows.append(f"| `{name}` | {kind} | {_default(spec)} | {_text(spec.get('description'))} |")
    rows += ["", END]
    return "\n".join(rows)


def rendered(role: Path, page: str) -> str:
    block = table(role)
    if BEGIN in page and END in page:
        head, _begin, rest = page.partition(BEGIN)
        _old, _end, tail = rest.partition(END)
        return head + block + tail
    return page.rstrip("\n") + "\n\n## Variables\n\n" + block + "\n"


def roles() -> list[Path]:
    found = (ROOT / "roles").iterdir()
    return sorted(p for p in found if (p / "meta/argument_specs.yml").is_file())


def page_of(role: Path) -> Path:
    return ROOT / "docs/roles" / f"{role.name}.md"


def main() -> int:
    for role in roles():
        page = page_of(role)
        old = page.read_text() if page.exists() else f"# Role `hpc.podnet.{role.name}`\n"
        new = rendered(role, old)
        if new != old:
            page.write_text(new)
            print(f"role-docs: wrote {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
