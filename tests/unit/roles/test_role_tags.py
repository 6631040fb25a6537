# SPDX-License-Identifier: Apache-2.0
"""Every task of a role carries its phase tag, included task files too (docs/development.md
"Tags").

Ansible gives the tasks of a dynamically included file (include_tasks, include_role) the tags
of the include's parents (an import, a block, an `apply`), never the include's own `tags:`:
those select the include alone. So:

- every task of roles/<role>/tasks/main.yml has a tag `<role>_install`, `<role>_configure`,
  `<role>_run` or `always` (other task files are imported or included from there and inherit);
  preflight and the lifecycle roles (PHASELESS) have no phases: each is one step of its
  playbooks, whose plays carry the playbook's tag (validate.yml's and confirm's `always`);
- an include that has tags of its own repeats them in `apply: {tags: ...}`, wherever it is
  (main.yml, a nested task file, a handler), or its tasks would run untagged.

The molecule scenario coredns checks the result on a lab: a run with
`--tags coredns_configure` reaches tasks four includes deep (the etcd role's client_cert.yml,
ca.yml and issue_cert.yml through include_role).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[3] / "roles"
ROLE_DIRS = sorted(p for p in ROLES.iterdir() if (p / "tasks").is_dir())
#: roles without install/configure/run phases (docs/development.md "Tags")
PHASELESS = {"preflight", "confirm", "backup", "restore", "reset", "remove_node", "scale", "certs"}
INCLUDES = (
    "ansible.builtin.include_tasks",
    "ansible.builtin.include_role",
    "include_tasks",
    "include_role",
)


def _tasks(items: list[dict[str, Any]] | None) -> Iterator[dict[str, Any]]:
    """The tasks of a task list, blocks flattened (with their own tags merged in)."""
    for task in items or []:
        inner = [k for k in ("block", "rescue", "always") if k in task]
        if inner:
            for key in inner:
                for sub in _tasks(task[key]):
                    yield {**sub, "tags": _tags(sub) + _tags(task)}
        else:
            yield task


def _tags(task: dict[str, Any]) -> list[str]:
    tags = task.get("tags", [])
    return [tags] if isinstance(tags, str) else list(tags)


def _task_files(role: Path) -> list[Path]:
    return sorted([*(role / "tasks").glob("**/*.yml"), *(role / "handlers").glob("**/*.yml")])


@pytest.mark.parametrize(
    "role", [r for r in ROLE_DIRS if r.name not in PHASELESS], ids=lambda p: p.name
)
def test_every_main_task_has_a_phase_tag(role: Path) -> None:
    phases = {f"{role.name}_install", f"{role.name}_configure", f"{role.name}_run", "always"}
    untagged = [
        task.get("name", "?")
        for task in _tasks(yaml.safe_load((role / "tasks" / "main.yml").read_text()))
        if not phases & set(_tags(task))
    ]
    assert not untagged, f"{role.name}: tasks of tasks/main.yml without a phase tag: {untagged}"


@pytest.mark.parametrize("role", ROLE_DIRS, ids=lambda p: p.name)
def test_includes_with_tags_apply_them(role: Path) -> None:
    lost = []
    for path in _task_files(role):
        for task in _tasks(yaml.safe_load(path.read_text())):
            module = next((m for m in INCLUDES if m in task), None)
            own = set(_tags(task)) - {"always"} if module else set()
            if not own:
                continue
            args = task[module] if isinstance(task[module], dict) else {}
            applied = args.get("apply", {}).get("tags", [])
            applied = {applied} if isinstance(applied, str) else set(applied)
            if not own <= applied:
                lost.append(f"{path.relative_to(ROLES)}: {task.get('name', '?')} {sorted(own)}")
    assert not lost, "includes whose tags do not reach the included tasks (add apply): " + str(lost)
