# SPDX-License-Identifier: Apache-2.0
"""The SPANK plugin's include arrows go one way (agent/native/podnet_spank_common.h): the
dispatch includes the contexts' headers; a context's file its own header and the shared
ones, never another context's; the shared headers no context's."""

from __future__ import annotations

import re
from pathlib import Path

NATIVE = Path(__file__).resolve().parents[3] / "agent" / "native"
CONTEXTS = ("extern", "step", "task", "job_script")
SHARED = ("opts", "common", "env", "slurm")


def _includes(path: Path) -> set[str]:
    return set(re.findall(r'^#include "([^"]+)"', path.read_text(), re.M))


def _header(part: str) -> str:
    return f"podnet_spank_{part}.h"


def test_every_spank_file_is_a_context_a_shared_part_or_the_dispatch() -> None:
    parts = {p.name.removeprefix("podnet_spank").lstrip("_").rsplit(".", 1)[0]
             for p in NATIVE.glob("podnet_spank*.[ch]")}  # fmt: skip
    assert parts == {"", *CONTEXTS, *SHARED}


def test_the_dispatch_includes_the_contexts_and_nothing_includes_it() -> None:
    assert {_header(c) for c in CONTEXTS} <= _includes(NATIVE / "podnet_spank.c")
    assert not (NATIVE / "podnet_spank.h").exists()


def test_a_context_includes_its_own_header_and_shared_ones_only() -> None:
    for ctx in CONTEXTS:
        for path in (NATIVE / f"podnet_spank_{ctx}.c", NATIVE / _header(ctx)):
            got = {h for h in _includes(path) if h.startswith("podnet_spank")}
            if path.suffix == ".c":
                assert _header(ctx) in got, path.name
            allowed = {_header(ctx)} | {_header(s) for s in SHARED}
            assert got <= allowed, f"{path.name} includes {sorted(got - allowed)}"


def test_the_shared_parts_include_no_context() -> None:
    for part in SHARED:
        for path in NATIVE.glob(f"podnet_spank_{part}.[ch]"):
            got = {h for h in _includes(path) if h.startswith("podnet_spank")}
            assert not got & {_header(c) for c in CONTEXTS}, path.name
    # common is below opts: the state and helpers know nothing of the options
    for path in NATIVE.glob("podnet_spank_common.[ch]"):
        assert _header("opts") not in _includes(path), path.name
