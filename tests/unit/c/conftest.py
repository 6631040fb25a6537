# SPDX-License-Identifier: Apache-2.0
"""The C component, agent/native, built once per session by its own Makefile into a
temporary directory (O=...): its unit test programs and drivers, under AddressSanitizer/
UBSan when the compiler has them."""

from __future__ import annotations

from pathlib import Path

import pytest
from nativelib import cc, make, sanitizers_work


@pytest.fixture(scope="session")
def native(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """O= directory holding tests/'s programs (test_json, ..., json_filter,
    pod_resolver_driver) built by `make tests`."""
    cc()
    out = tmp_path_factory.mktemp("native")
    san = [] if sanitizers_work(out) else ["SAN="]
    res = make(f"O={out}", *san, "-j2", "tests")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "warning" not in res.stderr
    return out
