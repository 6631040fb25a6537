# SPDX-License-Identifier: Apache-2.0
"""The daemons' logs (podnetd, podnet-gatewayd): one line per record on stderr, and when
stderr is the journal, each line prefixed with its syslog priority the way sd-daemon(3)
says (`<3>` error, `<4>` warning, `<6>` info, `<7>` debug): journald takes the priority
from the prefix, so `journalctl -p err -u podnetd` shows podnetd's errors (without it every
line was info). systemd says that stderr is the journal by setting JOURNAL_STREAM to the
device and inode of the stream it connected (systemd.exec(5)); a terminal, a file or a
pipe gets no prefix. No dependency (python-systemd is not needed for this).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import TextIO

__all__ = ["FORMAT", "JournalFormatter", "fatal", "priority", "setup", "to_journal"]

FORMAT = "%(levelname)s %(name)s: %(message)s"


def priority(levelno: int) -> int:
    """The syslog priority of a logging level: 2 crit, 3 err, 4 warning, 6 info, 7 debug."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


def prefixed(text: str, prio: int) -> str:
    """Every line of `text` (a traceback's too) with the priority prefix: journald reads a
    stream line by line."""
    return "\n".join(f"<{prio}>{line}" for line in text.split("\n"))


class JournalFormatter(logging.Formatter):
    """FORMAT, each line prefixed with the record's priority."""

    def format(self, record: logging.LogRecord) -> str:
        return prefixed(super().format(record), priority(record.levelno))


def to_journal(stream: TextIO | None = None, env: Mapping[str, str] | None = None) -> bool:
    """Whether `stream` (default stderr) is the journal: JOURNAL_STREAM names its device
    and inode."""
    stream = sys.stderr if stream is None else stream
    env = os.environ if env is None else env
    dev, sep, ino = env.get("JOURNAL_STREAM", "").partition(":")
    if not sep or not dev.isdigit() or not ino.isdigit():
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


def setup(
    level: str, stream: TextIO | None = None, env: Mapping[str, str] | None = None
) -> logging.Handler:
    """The root logger writes to `stream` (default stderr) at `level`, with priorities when
    that is the journal; replaces any handler set before."""
    stream = sys.stderr if stream is None else stream
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        JournalFormatter(FORMAT) if to_journal(stream, env) else logging.Formatter(FORMAT)
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper()))
    return handler


def fatal(text: str, stream: TextIO | None = None, env: Mapping[str, str] | None = None) -> None:
    """A daemon's last words before logging is set up (a configuration error, etcd down at
    start): one line on stderr, at priority err in the journal."""
    stream = sys.stderr if stream is None else stream
    print(prefixed(text, 3) if to_journal(stream, env) else text, file=stream, flush=True)
