# SPDX-License-Identifier: Apache-2.0
"""Login sessions: which processes hold each user's login pod on this node.

`pam_podnet.so` registers the sshd session process of every login (`login_acquire` with
its pid). A session is identified by (pid, start time), so a recycled pid is not taken
for a live session. When a user has had no live session for `grace` seconds, `due`
names them and the agent releases their login pod. The table is persisted in
`<state_dir>/sessions.json`, so a restart of podnetd keeps it.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from podnet.kernel.nsfs import proc_start


class LoginSessions:
    def __init__(self, state_dir: Path, starttime: Callable[[int], int] | None = None) -> None:
        self.path = state_dir / "sessions.json"
        self.starttime = starttime or proc_start
        self._sessions: dict[int, dict[int, int]] = {}  # uid -> {pid: starttime}
        self._idle_since: dict[int, float] = {}
        self._lock = threading.Lock()

    def load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        with self._lock, contextlib.suppress(AttributeError, ValueError, TypeError):
            for u, pids in data.items():
                self._sessions[int(u)] = {int(p): int(s) for p, s in pids.items()}

    def add(self, uid: int, pid: int) -> None:
        with self._lock:
            self._sessions.setdefault(uid, {})[pid] = self.starttime(pid)
            self._idle_since.pop(uid, None)
            self._save()

    def drop(self, uid: int) -> None:
        with self._lock:
            self._sessions.pop(uid, None)
            self._idle_since.pop(uid, None)
            self._save()

    def pids(self, uid: int) -> dict[int, int]:
        with self._lock:
            return dict(self._sessions.get(uid, {}))

    def due(self, now: float, login_uids: Iterable[int], grace: float) -> list[int]:
        """Users (of those with a login pod) without a live session for `grace` seconds."""
        out = []
        with self._lock:
            changed = False
            for uid in set(login_uids):
                pids = self._sessions.get(uid, {})
                live = {p: s for p, s in pids.items() if s and self.starttime(p) == s}
                if live != pids:
                    self._sessions[uid] = live
                    changed = True
                if live:
                    self._idle_since.pop(uid, None)
                    continue
                since = self._idle_since.setdefault(uid, now)
                if now - since >= grace:
                    out.append(uid)
            if changed:
                self._save()
        return out

    def _save(self) -> None:
        data = {str(u): {str(p): s for p, s in pids.items()} for u, pids in self._sessions.items()}
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.path)
