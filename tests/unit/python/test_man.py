# SPDX-License-Identifier: Apache-2.0
"""The man pages' sources (docs/man/*.md) name every command and option of the programs
they describe, so a new option cannot ship without its line there. That the installed
pages are these sources rendered is `tests/man.sh --check` (make lint)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from podnet.api import daemon
from podnet.cli import podnet as cli

ROOT = Path(__file__).resolve().parents[3]
MAN = ROOT / "docs" / "man"


def options(ap: argparse.ArgumentParser) -> set[str]:
    return {s for a in ap._actions for s in a.option_strings if s.startswith("--")}


def test_podnet_1_names_every_command_and_option() -> None:
    page = (MAN / "podnet.1.md").read_text()
    ap = cli.parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"command {c}" for c in sub.choices if f"**{c}**" not in page]
    missing += [f"option {o}" for o in options(ap) if f"**{o}**" not in page]
    status = sub.choices["status"]
    missing += [f"status {o}" for o in options(status) - options(ap) if f"**{o}**" not in page]
    assert not missing, f"docs/man/podnet.1.md lacks: {missing}"


def test_podnetd_8_names_every_option() -> None:
    page = (MAN / "podnetd.8.md").read_text()
    missing = [o for o in options(daemon.parser()) if f"**{o}**" not in page]
    assert not missing, f"docs/man/podnetd.8.md lacks: {missing}"


def test_podnet_container_1_names_every_option_of_its_usage() -> None:
    page = (MAN / "podnet-container.1.md").read_text()
    src = (ROOT / "agent" / "native" / "podnet_container.c").read_text()
    usage = re.search(r'"usage: podnet-container ([^"]*)', src)
    assert usage, "podnet_container.c: no usage line"
    opts = set(re.findall(r"--[a-z][a-z-]*", usage.group(1)))
    assert opts, usage.group(1)
    missing = [o for o in opts if f"**{o}**" not in page]
    assert not missing, f"docs/man/podnet-container.1.md lacks: {missing}"


def test_every_page_has_the_sections_man_readers_expect() -> None:
    for src in MAN.glob("*.md"):
        text = src.read_text()
        name, section = src.stem.rsplit(".", 1)
        assert text.startswith(f'% {name.upper()} {section} "" "podnet" "podnet manual"\n'), src
        for head in ("# NAME", "# SYNOPSIS", "# DESCRIPTION", "# SEE ALSO"):
            assert f"\n{head}\n" in text, (src, head)
