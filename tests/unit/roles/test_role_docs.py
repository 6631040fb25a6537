# SPDX-License-Identifier: Apache-2.0
"""Each role page lists every variable of the role as its argument spec describes it."""

from __future__ import annotations

from pathlib import Path

import pytest
from role_docs import page_of, rendered, roles


@pytest.mark.parametrize("role", roles(), ids=lambda p: p.name)
def test_role_page_lists_the_argument_specs(role: Path) -> None:
    page = page_of(role)
    assert page.exists(), f"{page} missing: run `make role-docs`"
    text = page.read_text()
    assert rendered(role, text) == text, f"{page} is out of date: run `make role-docs`"
