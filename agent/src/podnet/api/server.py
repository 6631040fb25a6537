# SPDX-License-Identifier: Apache-2.0
"""The UNIX socket API (docs/api.md): JSON lines, authorization from SO_PEERCRED only.

Each connection in service gets a thread. Admission (`Admission`) bounds them:
`max_connections` in all, of which `root_connections` only for root (the Slurm plugin, the
SSH hooks), and `max_connections_per_user` for any other uid, so one user cannot hold the
socket against the others. A user's connections beyond their own bound wait their turn in
a queue of that uid (FIFO; at most `max_waiting_per_user` of them and `max_waiting` in all,
for at most `wait_timeout` seconds each): a waiting connection holds a file descriptor and
no thread, and a thread that ends a connection takes the next one waiting for its uid
(docs/api.md, "Connections"). A request line is at most 64 KiB and must arrive whole within
`read_timeout` of the connection's service starting (a deadline for the request, not per
read: a newline every few seconds does not keep a connection). Non-root callers get one
request per connection. What a request does is api.handlers'.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podnet.api.handlers import Handler, Peer, _err

__all__ = [
    "MAX_LINE",
    "Admission",
    "Handler",
    "Limits",
    "Peer",
    "Server",
    "Verdict",
    "Waiting",
    "peer_of",
]

MAX_LINE = 64 * 1024
#: how often the accept loop turns away connections that waited too long
SWEEP_S = 0.5


def peer_of(conn: socket.socket) -> Peer:
    data = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", data)
    return Peer(pid, uid, gid)


@dataclass(frozen=True)
class Limits:
    """Connection bounds of the socket (NodeConfig's settings of the same names)."""

    read_timeout: float = 10.0
    max_connections: int = 256
    root_connections: int = 32
    max_connections_per_user: int = 8
    #: a user's connections waiting for one of their `max_connections_per_user` slots
    max_waiting_per_user: int = 64
    #: waiting connections of all users together
    max_waiting: int = 256
    #: seconds a connection may wait for its slot (then EUNAVAIL)
    wait_timeout: float = 30.0


@dataclass
class Waiting:
    """A connection waiting for a slot of its uid."""

    conn: Any  # socket.socket (anything with close() in the unit tests)
    peer: Peer
    since: float


@dataclass(frozen=True)
class Verdict:
    """Admission's answer: `admit` (serve it now), `wait` (queued), or refused (`reason`)."""

    admit: bool = False
    wait: bool = False
    reason: str = ""


class Admission:
    """Who may open one more connection: a total, slots kept for root, a bound per uid,
    and behind each user's bound a queue of that user's waiting connections."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.lock = threading.Lock()
        self.total = 0
        self.users = 0  # connections in service of non-root callers
        self.by_uid: dict[int, int] = {}
        self.waiting: dict[int, collections.deque[Waiting]] = {}
        self.n_waiting = 0

    def enter(self, uid: int, item: Waiting | None = None) -> Verdict:
        """Takes a slot for `uid` (admit), or queues `item` behind the uid's own bound
        (wait), or says why not."""
        lim = self.limits
        with self.lock:
            if self.total >= lim.max_connections:
                return Verdict(reason="too many connections to podnetd, retry")
            if uid != 0:
                if self.users >= lim.max_connections - lim.root_connections:
                    return Verdict(reason="too many user connections to podnetd, retry")
                if self.by_uid.get(uid, 0) >= lim.max_connections_per_user:
                    queue = self.waiting.get(uid)
                    held = len(queue) if queue else 0
                    if (
                        item is None
                        or held >= lim.max_waiting_per_user
                        or self.n_waiting >= lim.max_waiting
                    ):
                        return Verdict(
                            reason=f"too many connections from uid {uid} "
                            f"({lim.max_connections_per_user} at once, "
                            f"{lim.max_waiting_per_user} waiting), retry later"
                        )
                    self.waiting.setdefault(uid, collections.deque()).append(item)
                    self.n_waiting += 1
                    return Verdict(wait=True)
                self.users += 1
            self.total += 1
            self.by_uid[uid] = self.by_uid.get(uid, 0) + 1
            return Verdict(admit=True)

    def next_or_leave(self, uid: int, now: float) -> tuple[Waiting | None, list[Waiting]]:
        """The end of one of `uid`'s connections: its slot goes to the uid's oldest waiting
        connection that has not waited too long (returned first), or is given back. Also
        returns the waiting connections found too old (to be refused)."""
        expired: list[Waiting] = []
        with self.lock:
            queue = self.waiting.get(uid)
            while queue:
                w = queue.popleft()
                self.n_waiting -= 1
                if not queue:
                    del self.waiting[uid]
                if now - w.since > self.limits.wait_timeout:
                    expired.append(w)
                    continue
                return w, expired  # the slot passes on: the counts stay
            self.total -= 1
            if uid != 0:
                self.users -= 1
            left = self.by_uid[uid] - 1
            if left:
                self.by_uid[uid] = left
            else:
                del self.by_uid[uid]
            return None, expired

    def leave(self, uid: int) -> None:
        """Gives `uid`'s slot back, whoever waits (tests, and the end of the server)."""
        with self.lock:
            self.total -= 1
            if uid != 0:
                self.users -= 1
            left = self.by_uid[uid] - 1
            if left:
                self.by_uid[uid] = left
            else:
                del self.by_uid[uid]

    def expire(self, now: float) -> list[Waiting]:
        """Takes out every waiting connection that waited longer than `wait_timeout`."""
        out: list[Waiting] = []
        limit = self.limits.wait_timeout
        with self.lock:
            for uid in list(self.waiting):
                queue = self.waiting[uid]
                while queue and now - queue[0].since > limit:
                    out.append(queue.popleft())
                    self.n_waiting -= 1
                if not queue:
                    del self.waiting[uid]
        return out


class Server:
    def __init__(self, handler: Handler, path: str, limits: Limits) -> None:
        self.handler = handler
        self.path = path
        self.limits = limits
        self.admission = Admission(limits)
        self.sock: socket.socket | None = None
        self.stopping = threading.Event()

    def bind(self) -> None:
        path = Path(self.path)
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(tmp))
        # every user may connect: authorization is per request, from SO_PEERCRED
        tmp.chmod(0o666)
        tmp.replace(path)
        s.listen(1024)  # the kernel caps it at net.core.somaxconn
        self.sock = s

    def serve_forever(self) -> None:
        if self.sock is None:
            raise RuntimeError("bind() first")
        self.sock.settimeout(SWEEP_S)
        next_sweep = time.monotonic() + SWEEP_S
        while not self.stopping.is_set():
            now = time.monotonic()
            if now >= next_sweep:
                for w in self.admission.expire(now):
                    self._turn_away(w)
                next_sweep = now + SWEEP_S
            try:
                conn = self.sock.accept()[0]
            except TimeoutError:
                continue
            except OSError:
                if self.stopping.is_set():
                    return
                raise
            try:
                peer = peer_of(conn)
            except OSError:
                conn.close()
                continue
            conn.settimeout(None)  # accept() gave it the listening socket's timeout
            verdict = self.admission.enter(peer.uid, Waiting(conn, peer, time.monotonic()))
            if verdict.wait:
                continue  # a thread of its uid takes it when one of theirs ends
            if not verdict.admit:
                conn.settimeout(0)  # never let a full client buffer stall the accept loop
                _send(conn, _err("EUNAVAIL", verdict.reason))
                conn.close()
                continue
            threading.Thread(target=self._conn, args=(conn, peer), daemon=True).start()

    def _turn_away(self, w: Waiting) -> None:
        """A connection that waited `wait_timeout` for a slot of its uid: EUNAVAIL."""
        lim = self.limits
        w.conn.settimeout(0)
        _send(
            w.conn,
            _err(
                "EUNAVAIL",
                f"too many connections from uid {w.peer.uid}: waited {lim.wait_timeout:g} s "
                f"for one of its {lim.max_connections_per_user} at once, retry later",
            ),
        )
        w.conn.close()

    def _conn(self, conn: socket.socket, peer: Peer) -> None:
        """Serves a connection, then the connections waiting for this uid, one by one."""
        uid = peer.uid
        while True:
            try:
                self._serve(conn, peer)
            except OSError:
                pass
            finally:
                conn.close()
            nxt, expired = self.admission.next_or_leave(uid, time.monotonic())
            for w in expired:
                self._turn_away(w)
            if nxt is None:
                return
            conn, peer = nxt.conn, nxt.peer

    def _serve(self, conn: socket.socket, peer: Peer) -> None:
        buf = b""
        deadline = time.monotonic() + self.limits.read_timeout
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > MAX_LINE:
                    _send(conn, _err("ETOOBIG", f"request longer than {MAX_LINE} bytes"))
                    return
                left = deadline - time.monotonic()
                try:
                    if left <= 0:
                        raise TimeoutError
                    conn.settimeout(left)
                    chunk = conn.recv(65536)
                except TimeoutError:
                    if buf.strip():
                        _send(conn, _err("EINVAL", "incomplete request (timeout)"))
                    return
                if not chunk:
                    if buf.strip():
                        _send(conn, _err("EINVAL", "incomplete request (no newline)"))
                    return
                buf += chunk
                continue
            line, buf = buf[:nl], buf[nl + 1 :]
            if len(line) > MAX_LINE:
                _send(conn, _err("ETOOBIG", f"request longer than {MAX_LINE} bytes"))
                return
            if not line.strip():
                continue
            reply = self.handler.handle_line(peer, line)
            conn.settimeout(self.limits.read_timeout)  # a client that never reads
            _send(conn, reply)
            if not peer.root:
                return  # one request per connection for users
            deadline = time.monotonic() + self.limits.read_timeout

    def close(self) -> None:
        self.stopping.set()
        if self.sock is not None:
            self.sock.close()


def _send(conn: socket.socket, reply: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the client went away: nothing to tell it
        conn.sendall(json.dumps(reply, separators=(",", ":")).encode() + b"\n")
