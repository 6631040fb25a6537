# SPDX-License-Identifier: Apache-2.0
"""Every source file states its license (SPDX), as LICENSE says."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_source_file_has_an_spdx_line() -> None:
    files = subprocess.run(
        ["git", "ls-files", "*.py", "*.c", "*.h", "*.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert files
    missing = [
        f
        for f in files
        if "SPDX-License-Identifier:" not in "".join((ROOT / f).open().readlines()[:5])
    ]
    assert not missing, missing
