# SPDX-License-Identifier: Apache-2.0
"""The daemons' logs with journald priorities (issue 35, item 6; podnet/logs.py): each line
prefixed `<N>` with its syslog priority when stderr is the journal (JOURNAL_STREAM names
that stream's device and inode), plain otherwise; and podnetd's and podnet-gatewayd's
startup errors reach the journal at priority err."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import TextIO

import pytest
from podnet import logs

REPO = Path(__file__).resolve().parents[3]


def journal_of(stream: TextIO) -> dict[str, str]:
    """The JOURNAL_STREAM systemd would set for `stream`."""
    st = os.fstat(stream.fileno())
    return {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}


@pytest.mark.parametrize(
    ("level", "prio"),
    [
        (logging.CRITICAL, 2),
        (logging.ERROR, 3),
        (logging.WARNING, 4),
        (logging.INFO, 6),
        (logging.DEBUG, 7),
        (logging.ERROR + 5, 3),
        (5, 7),
    ],
)
def test_levels_map_to_syslog_priorities(level: int, prio: int) -> None:
    assert logs.priority(level) == prio


def test_every_line_of_a_record_carries_its_priority() -> None:
    fmt = logs.JournalFormatter(logs.FORMAT)
    rec = logging.LogRecord("podnetd", logging.ERROR, __file__, 1, "GC failed", None, None)
    assert fmt.format(rec) == "<3>ERROR podnetd: GC failed"
    try:
        raise ValueError("boom")
    except ValueError:
        rec = logging.LogRecord(
            "podnet.node.reconcile", logging.ERROR, __file__, 1, "GC failed", None, sys.exc_info()
        )
    lines = fmt.format(rec).split("\n")
    assert len(lines) > 3 and all(x.startswith("<3>") for x in lines), lines
    assert lines[-1] == "<3>ValueError: boom"
    rec = logging.LogRecord("podnetd", logging.INFO, __file__, 1, "listening", None, None)
    assert fmt.format(rec) == "<6>INFO podnetd: listening"


def test_the_journal_is_recognized_by_the_streams_device_and_inode(tmp_path: Path) -> None:
    with open(tmp_path / "a", "w") as a, open(tmp_path / "b", "w") as b:
        env = journal_of(a)
        assert logs.to_journal(a, env)
        assert not logs.to_journal(b, env)  # another stream: a file, a pipe, a terminal
        assert not logs.to_journal(a, {})
        for bad in ("", "12", "x:y", "1:2:3", f"{env['JOURNAL_STREAM']}x"):
            assert not logs.to_journal(a, {"JOURNAL_STREAM": bad}), bad


def test_setup_prefixes_only_when_writing_to_the_journal(tmp_path: Path) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        for journal in (True, False):
            path = tmp_path / f"log-{journal}"
            with open(path, "w") as f:
                logs.setup("warning", f, journal_of(f) if journal else {})
                log = logging.getLogger("podnetd")
                log.info("not shown (below warning)")
                log.warning("etcd: unavailable")
                log.error("kernel error")
            got = path.read_text().splitlines()
            want = ["WARNING podnetd: etcd: unavailable", "ERROR podnetd: kernel error"]
            assert got == ([f"<4>{want[0]}", f"<3>{want[1]}"] if journal else want), got
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)


@pytest.mark.parametrize(
    ("module", "prog"),
    [("podnet.api.daemon", "podnetd"), ("podnet.gateway.daemon", "podnet-gatewayd")],
)
def test_a_daemons_configuration_error_is_an_error_in_the_journal(
    tmp_path: Path, module: str, prog: str
) -> None:
    """The daemon as systemd runs it: stderr the journal's stream, JOURNAL_STREAM set."""
    out = tmp_path / "stderr"
    env = {**os.environ, "PYTHONPATH": str(REPO / "agent" / "src")}
    with open(out, "w") as f:
        env.update(journal_of(f))
        r = subprocess.run(
            [sys.executable, "-m", module, "-c", str(tmp_path / "missing.yaml")],
            stderr=f,
            env=env,
            timeout=60,
            check=False,
        )
    assert r.returncode == 2
    text = out.read_text()
    assert text.startswith(f"<3>{prog}: configuration error: "), text
    # the same run on a terminal or a file: no prefix
    r2 = subprocess.run(
        [sys.executable, "-m", module, "-c", str(tmp_path / "missing.yaml")],
        capture_output=True,
        text=True,
        env={k: v for k, v in env.items() if k != "JOURNAL_STREAM"},
        timeout=60,
        check=False,
    )
    assert r2.returncode == 2 and r2.stderr.startswith(f"{prog}: configuration error: ")
