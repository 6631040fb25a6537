# SPDX-License-Identifier: Apache-2.0
"""conntrackd's flow-state sync statistics for podnet-gatewayd's metrics (docs/monitoring.md).

conntrackd answers `conntrackd -s` (general: its caches, the sync channel's traffic, lost
and malformed messages), `-s network` (the same in detail) and `-s queue` (the FT-FW
resend queue: messages sent, not yet acknowledged by the peer) on its control socket (the
role's /var/run/conntrackd.ctl, named in /etc/conntrackd/conntrackd.conf). `Conntrackd`
runs the three with a short timeout in a thread of its own, every INTERVAL seconds (a
scrape never waits for conntrackd), and `parse_stats` reads their text: a pure function
that returns what it understood and the lines it did not (the format of conntrackd 1.4.7,
Debian 12, and 1.4.8, Debian 13; tests/unit/python/test_gateway_conntrackd.py)."""

from __future__ import annotations

import logging
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["Cache", "Conntrackd", "Queue", "Stats", "families", "parse_stats"]

log = logging.getLogger("podnet.gateway")

#: how often the statistics are read, and how long one command may take
INTERVAL = 5.0
TIMEOUT = 2.0
#: the requests run, each as `conntrackd -s <what>`; only the first must answer for `up`
REQUESTS: tuple[tuple[str, ...], ...] = ((), ("network",), ("queue",))

CHANGES = ("created", "updated", "destroyed")
DIRECTIONS = {"sent": "sent", "send": "sent", "recv": "received"}

# `-s`: "connections created:\t\t  5\tfailed:\t  0"; `-s queue`: "current elements:\t  1"
# (counts are C integers: at most 20 digits, and no int() of an endless one)
_VALUE = re.compile(r"^([A-Za-z][A-Za-z ]*?):\s+(\d{1,20})(?:\s+failed:\s+(\d{1,20}))?$")
# the channel's traffic: "  3672 Bytes sent     3680 Bytes recv"; "  0 Malformed msgs  0 Lost msgs"
_PAIRS = re.compile(r"(\d{1,20}) ([A-Za-z][A-Za-z ]*?)(?=\s+\d|\s*$)")
# "UDP traffic (active device=host0):", "UDP traffic device=host0 status=RUNNING role=ACTIVE:",
# "TCP traffic (active device=eth1) server=... client=...:", "multicast traffic ..."
_CHANNEL = re.compile(r"^(UDP|TCP|multicast) traffic\b.*\bdevice=([^\s)]+).*:$")


@dataclass
class Cache:
    """One of conntrackd's caches: `internal` (this gateway's flows) or `external` (the
    peer's: its cache, or with DisableExternalCache, as the role sets, what it injected into
    the kernel's table; no entry count then)."""

    entries: int | None = None
    changes: dict[str, int] = field(default_factory=dict)  # created/updated/destroyed: ok
    failures: dict[str, int] = field(default_factory=dict)  # ... that failed


@dataclass
class Queue:
    elements: int = 0
    maximum: int = 0
    full: int = 0  # "not enough space errors"


@dataclass
class Stats:
    """What `parse_stats` understood; absent parts stay empty (None: not in the text)."""

    caches: dict[str, Cache] = field(default_factory=dict)
    #: the sync channels' traffic by device: ("bytes"|"packets"|"errors", "sent"|"received")
    channels: dict[str, dict[tuple[str, str], int]] = field(default_factory=dict)
    malformed: int | None = None  # sync messages received malformed
    lost: int | None = None  # sync messages never received (gaps in the sequence)
    before: int | None = None  # received with a sequence number before the expected one
    queues: dict[str, Queue] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)  # lines not understood

    @property
    def synced(self) -> bool:
        """Whether this looks like a sync daemon's answer (an internal cache and a channel)."""
        return "internal" in self.caches and bool(self.channels)


def _cache_line(cache: Cache, name: str, a: int, b: str | None) -> bool:
    if name == "current active connections":
        cache.entries = a
        return True
    what = name.removeprefix("connections ")
    if what in CHANGES and b is not None:
        cache.changes[what], cache.failures[what] = a, int(b)
        return True
    return False


def _queue_line(q: Queue, name: str, a: int) -> bool:
    if name == "current elements":
        q.elements = a
    elif name == "maximum elements":
        q.maximum = a
    elif name == "not enough space errors":
        q.full = a
    else:
        return False
    return True


def _pairs_line(st: Stats, section: str, line: str) -> bool:
    """A line of counts, each followed by what it counts; all understood or none taken."""
    pairs = _PAIRS.findall(line)
    if not pairs or "".join(f"{n} {w}" for n, w in pairs) != re.sub(r"\s+(?=\d)", "", line):
        return False
    if section == "message tracking":
        got = {
            {"Malformed msgs": "malformed", "Lost msgs": "lost"}.get(w): int(n) for n, w in pairs
        }
        if None in got:
            return False
        st.malformed = got.get("malformed", st.malformed)
        st.lost = got.get("lost", st.lost)
        return True
    if not section.startswith("channel "):
        return False
    counts: dict[tuple[str, str], int] = {}
    for n, what in pairs:
        kind, _sp, direction = what.partition(" ")
        k = {"Bytes": "bytes", "Pckts": "packets", "Error": "errors"}.get(kind)
        d = DIRECTIONS.get(direction)
        if k is None or d is None:
            return False
        counts[(k, d)] = int(n)
    st.channels[section.removeprefix("channel ")].update(counts)
    return True


def _value_line(st: Stats, section: str, sub: str, name: str, a: int, b: str | None) -> bool:
    if section.startswith("cache "):
        return _cache_line(st.caches[section.removeprefix("cache ")], name, a, b)
    if section.startswith("queue "):
        return _queue_line(st.queues[section.removeprefix("queue ")], name, a)
    if section == "network statistics" and (sub, name) == ("recv", "Malformed messages"):
        st.malformed = a
        return True
    if section == "sequence tracking statistics" and sub == "recv":
        if name == "Packets lost":
            st.lost = a
            return True
        if name == "Packets before":
            st.before = a
            return True
    # the rest of `-s network` (the malformed messages by reason), `allocated queue nodes`
    return section == "network statistics" or name == "allocated queue nodes"


def _header(st: Stats, line: str) -> str | None:
    """The section a header line opens (None: not a header)."""
    if m := _CHANNEL.match(line):
        st.channels.setdefault(m.group(2), {})
        return f"channel {m.group(2)}"
    if m := re.fullmatch(r"cache ([a-z]+):", line):
        st.caches.setdefault(m.group(1), Cache())
        return f"cache {m.group(1)}"
    if line == "external inject:":
        st.caches.setdefault("external", Cache())
        return "cache external"
    if m := re.fullmatch(r"queue ([a-z]+):", line):
        st.queues.setdefault(m.group(1), Queue())
        return f"queue {m.group(1)}"
    if line in (
        "traffic processed:",
        "message tracking:",
        "network statistics:",
        "sequence tracking statistics:",
    ):
        return line[:-1]
    return None


def parse_stats(text: str) -> Stats:
    """What conntrackd's statistics (`-s`, `-s network`, `-s queue`, one text or several
    joined) say. Never raises: lines it does not understand, and lines outside any section
    it knows, end in `unknown`; empty or foreign text gives an empty `Stats` (`synced`
    False)."""
    st = Stats()
    section = sub = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            section = sub = ""
            continue
        if (h := _header(st, line)) is not None:
            section, sub = h, ""
            continue
        if section in ("network statistics", "sequence tracking statistics") and line in (
            "recv:",
            "send:",
        ):
            sub = line[:-1]
            continue
        ok = False
        if m := _VALUE.match(line):
            ok = _value_line(st, section, sub, m.group(1), int(m.group(2)), m.group(3))
        elif section == "traffic processed":
            ok = bool(re.fullmatch(r"\d+ Bytes\s+\d+ Pckts", line))  # flows' traffic: not sync
        elif section:
            ok = _pairs_line(st, section, line)
        if not ok:
            st.unknown.append(raw)
    return st


Runner = Callable[[Sequence[str], float], str]


def run_conntrackd(args: Sequence[str], timeout: float) -> str:
    """stdout of `conntrackd <args>`; RuntimeError when it fails or takes too long."""
    try:
        r = subprocess.run(
            ["conntrackd", *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"conntrackd {' '.join(args)}: {e}") from e
    if r.returncode != 0:
        err = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        raise RuntimeError(f"conntrackd {' '.join(args)}: {err}")
    return r.stdout


class Conntrackd:
    """The latest statistics conntrackd gave, read every `interval` seconds."""

    def __init__(
        self, run: Runner = run_conntrackd, interval: float = INTERVAL, timeout: float = TIMEOUT
    ) -> None:
        self.run = run
        self.interval = interval
        self.timeout = timeout
        self.lock = threading.Lock()
        self._latest: tuple[float, Stats | None] = (0.0, None)
        self._warned_unknown = False
        self._error: str | None = ""  # "": not read yet; None: the last read worked

    def read(self) -> Stats | None:
        """Ask conntrackd now; None when it does not answer `-s` with a sync daemon's
        statistics (the other requests only add to them)."""
        texts: list[str] = []
        error = None
        for i, args in enumerate(("-s", *a) for a in REQUESTS):
            try:
                texts.append(self.run(args, self.timeout))
            except RuntimeError as e:
                if i == 0:
                    error = str(e)
                    break
                log.debug("%s", e)
        st = parse_stats("\n\n".join(texts)) if texts else None
        if error is None and (st is None or not st.synced):
            error = "conntrackd -s: no sync statistics in its answer (not in sync mode?)"
        if st is not None and st.unknown and not self._warned_unknown:
            self._warned_unknown = True
            log.warning(
                "conntrackd -s: %d lines not understood: %r", len(st.unknown), st.unknown[:3]
            )
        if error != self._error:
            if error:
                log.warning("conntrackd's statistics: %s", error)
            elif self._error:
                log.info("conntrackd's statistics: read again")
            self._error = error
        got = None if error else st
        with self.lock:
            self._latest = (time.monotonic(), got)
        return got

    def latest(self) -> Stats | None:
        """The last statistics read, if they are recent (a stuck reader is no answer)."""
        with self.lock:
            at, st = self._latest
        return st if time.monotonic() - at <= 3 * self.interval + self.timeout else None

    def start(self, stop: threading.Event | None = None) -> threading.Thread:
        stop = stop or threading.Event()

        def loop() -> None:
            while True:
                try:
                    self.read()
                except Exception:  # a bug here must not end the thread: logged, tried again
                    log.exception("conntrackd's statistics")
                if stop.wait(self.interval):
                    return

        t = threading.Thread(target=loop, name="conntrackd-stats", daemon=True)
        t.start()
        return t


Family = CounterMetricFamily | GaugeMetricFamily

_P = "podnet_gateway_conntrackd"


def families(st: Stats | None) -> Iterator[Family]:
    """The metrics of `st`; only `up` 0 when conntrackd did not answer (no stale counts)."""
    yield GaugeMetricFamily(
        f"{_P}_up",
        "1 when conntrackd answered its statistics request (conntrackd -s) in sync mode",
        value=1 if st is not None else 0,
    )
    if st is None:
        return
    for what, doc in (
        ("bytes", "Bytes of flow-state sync messages on the sync channel, by direction"),
        ("packets", "Datagrams of flow-state sync messages on the sync channel, by direction"),
        ("errors", "Sync channel send and receive errors, by direction"),
    ):
        c = CounterMetricFamily(f"{_P}_sync_{what}", doc, labels=["direction"])
        for direction in ("sent", "received"):
            n = sum(ch.get((what, direction), 0) for ch in st.channels.values())
            c.add_metric([direction], n)
        yield c
    for name, value, doc in (
        ("lost", st.lost, "Sync messages lost: gaps in the sequence of those received"),
        ("malformed", st.malformed, "Sync messages received malformed"),
        (
            "before",
            st.before,
            "Sync messages received with a sequence number before the expected one "
            "(conntrackd's 'Packets before': a resent message received already, or reordered)",
        ),
    ):
        if value is not None:
            yield CounterMetricFamily(f"{_P}_sync_messages_{name}", doc, value=value)
    entries = GaugeMetricFamily(
        f"{_P}_cache_entries",
        "Flows in conntrackd's caches: internal (this gateway's, synced to the peer), "
        "external (the peer's; none with DisableExternalCache, as the role sets)",
        labels=["cache"],
    )
    changes = CounterMetricFamily(
        f"{_P}_cache_changes",
        "Flows conntrackd created, updated and destroyed in its cache: internal (this "
        "gateway's), external (the peer's, injected into this kernel's table)",
        labels=["cache", "change"],
    )
    failures = CounterMetricFamily(
        f"{_P}_cache_failures",
        "Cache changes that failed (external: the peer's flow not injected into the kernel)",
        labels=["cache", "change"],
    )
    for name, cache in sorted(st.caches.items()):
        if cache.entries is not None:
            entries.add_metric([name], cache.entries)
        for change in CHANGES:
            if change in cache.changes:
                changes.add_metric([name, change], cache.changes[change])
                failures.add_metric([name, change], cache.failures[change])
    yield from (entries, changes, failures)
    if st.queues:
        elements = GaugeMetricFamily(
            f"{_P}_queue_elements",
            "Messages in conntrackd's queues: rsqueue (sent, not acknowledged by the peer "
            "yet: resent until they are), txqueue (to send), errorq",
            labels=["queue"],
        )
        full = CounterMetricFamily(
            f"{_P}_queue_full",
            "Messages not queued for want of space, by queue",
            labels=["queue"],
        )
        for name, q in sorted(st.queues.items()):
            elements.add_metric([name], q.elements)
            full.add_metric([name], q.full)
        yield from (elements, full)
