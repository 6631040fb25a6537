# SPDX-License-Identifier: Apache-2.0
"""The UNIX socket API (docs/api.md): JSON lines, authorization from SO_PEERCRED only.

Each connection gets a thread. Admission (`Admission`) bounds them: `max_connections` in
all, of which `root_connections` only for root (the Slurm plugin, the SSH hooks), and
`max_connections_per_user` for any other uid, so one user cannot hold the socket against
the others. A request line is at most 64 KiB and must arrive whole within `read_timeout`
(a deadline for the request, not per read: a newline every few seconds does not keep a
connection). Non-root callers get one request per connection. What a request does is
api.handlers'.
"""

from __future__ import annotations

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

__all__ = ["MAX_LINE", "Admission", "Handler", "Limits", "Peer", "Server", "peer_of"]

MAX_LINE = 64 * 1024


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


class Admission:
    """Who may open one more connection: a total, slots kept for root, a bound per uid."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.lock = threading.Lock()
        self.total = 0
        self.users = 0  # connections of non-root callers
        self.by_uid: dict[int, int] = {}

    def enter(self, uid: int) -> str | None:
        """Takes a slot for `uid`; returns None, or why it was refused."""
        lim = self.limits
        with self.lock:
            if self.total >= lim.max_connections:
                return "too many connections to podnetd, retry"
            if uid != 0:
                if self.users >= lim.max_connections - lim.root_connections:
                    return "too many user connections to podnetd, retry"
                if self.by_uid.get(uid, 0) >= lim.max_connections_per_user:
                    return (
                        f"too many connections from uid {uid} "
                        f"(at most {lim.max_connections_per_user} at once)"
                    )
                self.users += 1
            self.total += 1
            self.by_uid[uid] = self.by_uid.get(uid, 0) + 1
            return None

    def leave(self, uid: int) -> None:
        with self.lock:
            self.total -= 1
            if uid != 0:
                self.users -= 1
            left = self.by_uid[uid] - 1
            if left:
                self.by_uid[uid] = left
            else:
                del self.by_uid[uid]


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
        while not self.stopping.is_set():
            try:
                conn = self.sock.accept()[0]
            except OSError:
                if self.stopping.is_set():
                    return
                raise
            try:
                peer = peer_of(conn)
            except OSError:
                conn.close()
                continue
            refused = self.admission.enter(peer.uid)
            if refused is not None:
                conn.settimeout(0)  # never let a full client buffer stall the accept loop
                _send(conn, _err("EUNAVAIL", refused))
                conn.close()
                continue
            threading.Thread(target=self._conn, args=(conn, peer), daemon=True).start()

    def _conn(self, conn: socket.socket, peer: Peer) -> None:
        try:
            self._serve(conn, peer)
        except OSError:
            pass
        finally:
            conn.close()
            self.admission.leave(peer.uid)

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
