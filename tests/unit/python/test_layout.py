# SPDX-License-Identifier: Apache-2.0
"""The agent's source layout (issue 36): small modules, none over `MAX_LINES` lines."""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "agent" / "src" / "podnet"
MAX_LINES = 500


def lines(path: Path) -> int:
    """Lines as `wc -l` counts them: newline characters."""
    return path.read_bytes().count(b"\n")


def test_no_module_is_over_500_lines() -> None:
    sizes = {p.relative_to(SRC.parents[2]): lines(p) for p in sorted(SRC.rglob("*.py"))}
    assert sizes, f"no module found under {SRC}"
    over = [f"{p}: {n} lines" for p, n in sizes.items() if n > MAX_LINES]
    assert not over, f"modules over {MAX_LINES} lines (split them by concern): " + ", ".join(over)
