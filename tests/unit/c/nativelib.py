# SPDX-License-Identifier: Apache-2.0
"""Helpers of tests/unit/c: where agent/native is, make -C there, the compiler and
whether the sanitizers work here (a module of its own: test modules import it, never
conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
NATIVE = ROOT / "agent" / "native"


def make_env() -> dict[str, str]:
    """This process's environment without a calling make's job server and flags: under
    `make -j2 check` they would reach the test's own make ("-jN forced in submake")."""
    return {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}


def make(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """make -C agent/native ARGS (never in the source tree: callers pass O=)."""
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(NATIVE), *args],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        check=False,
        env=make_env(),
    )


def cc() -> str:
    found = shutil.which("gcc") or shutil.which("cc")
    if not found:
        pytest.skip("no C compiler")
    return found


def sanitizers_work(tmp: Path) -> bool:
    """The Makefile's SAN flags compile, link and run here (not in every container)."""
    probe = tmp / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    flags = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    res = subprocess.run(
        [cc(), *flags, "-o", str(tmp / "probe"), str(probe)], capture_output=True, check=False
    )
    return res.returncode == 0 and subprocess.run([str(tmp / "probe")], check=False).returncode == 0
