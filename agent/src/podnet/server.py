"""The UNIX socket API (docs/api.md): JSON lines, authorization from SO_PEERCRED only.

Each connection gets a thread (bounded by `max_connections`); each request line is at most
64 KiB and must arrive within `read_timeout`. Malformed input gets an error reply and
never reaches the agent.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from podnet.agent import Agent, PodnetError
from podnet.store import EtcdRequestError, EtcdUnavailable

log = logging.getLogger("podnet.server")

VERSION = 1
MAX_LINE = 64 * 1024
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


class Peer:
    def __init__(self, pid: int, uid: int, gid: int) -> None:
        self.pid, self.uid, self.gid = pid, uid, gid

    @property
    def root(self) -> bool:
        return self.uid == 0


def peer_of(conn: socket.socket) -> Peer:
    data = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", data)
    return Peer(pid, uid, gid)


def _opt_int(req: dict[str, Any], key: str, lo: int = 0, hi: int = 2**32 - 1) -> int | None:
    v = req.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise PodnetError("EINVAL", f"'{key}' must be an integer in [{lo}, {hi}]")
    return v


def _int(req: dict[str, Any], key: str, lo: int = 0, hi: int = 2**32 - 1) -> int:
    v = _opt_int(req, key, lo, hi)
    if v is None:
        raise PodnetError("EINVAL", f"'{key}' is required")
    return v


def _name(req: dict[str, Any], key: str, maxlen: int = 64) -> str:
    v = req.get(key)
    if (
        not isinstance(v, str)
        or not v
        or len(v) > maxlen
        or not set(v) <= _NAME_CHARS
        or v.startswith("-")
    ):
        raise PodnetError(
            "EINVAL", f"'{key}' must be a name of 1-{maxlen} characters [A-Za-z0-9._-]"
        )
    return v


def _text(req: dict[str, Any], key: str, maxlen: int = 1024) -> str:
    v = req.get(key, "")
    if not isinstance(v, str) or len(v) > maxlen:
        raise PodnetError("EINVAL", f"'{key}' must be a string of at most {maxlen} characters")
    return v


class Handler:
    """Request dispatch and authorization (pure: testable without a socket)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.ops: dict[str, Callable[[Peer, dict[str, Any]], dict[str, Any]]] = {
            "job_up": self.job_up,
            "job_down": self.job_down,
            "job_get": self.job_get,
            "login_acquire": self.login_acquire,
            "login_release": self.login_release,
            "join": self.join,
            "pods": self.pods,
            "status": self.status,
        }

    def handle_line(self, peer: Peer, line: bytes) -> dict[str, Any]:
        try:
            try:
                req = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                raise PodnetError("EINVAL", "request is not valid JSON") from None
            if not isinstance(req, dict):
                raise PodnetError("EINVAL", "request must be a JSON object")
            if req.get("v") != VERSION:
                raise PodnetError(
                    "EVERSION",
                    f"unsupported API version {req.get('v')!r} (this podnetd speaks {VERSION})",
                )
            op = req.get("op")
            fn = self.ops.get(op) if isinstance(op, str) else None
            if fn is None:
                raise PodnetError("EINVAL", f"unknown op {op!r}")
            return {"v": VERSION, "ok": True, **fn(peer, req)}
        except PodnetError as e:
            return _err(e.code, e.message)
        except (EtcdUnavailable, EtcdRequestError) as e:
            log.warning("etcd: %s", e)
            return _err("EUNAVAIL", f"podnet state store unavailable: {e}")
        except OSError as e:
            log.exception("kernel error")
            return _err("EUNAVAIL", f"kernel refused: {e}")
        except Exception as e:  # never crash the daemon on one request
            log.exception("internal error")
            return _err("EINTERNAL", f"internal error: {type(e).__name__}")

    @staticmethod
    def _root(peer: Peer) -> None:
        if not peer.root:
            raise PodnetError("EPERM", "only root (the Slurm plugin) may do this")

    def job_up(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        self._root(peer)
        job_id = _int(req, "job_id", 1)
        uid = _int(req, "uid", 1, 2**31 - 1)
        user = _name(req, "user", 32)
        job_name = _text(req, "job_name", 1024)
        nodes = req.get("nodes")
        if not isinstance(nodes, list) or not 1 <= len(nodes) <= 100000:
            raise PodnetError("EINVAL", "'nodes' must be a non-empty list")
        for n in nodes:
            if not isinstance(n, str) or not n or len(n) > 64 or not set(n) <= _NAME_CHARS:
                raise PodnetError("EINVAL", "'nodes' entries must be node names")
        index = _int(req, "node_index", 0, len(nodes) - 1)
        pod = self.agent.job_up(job_id, user, uid, job_name, [str(n) for n in nodes], index)
        return {"pod": pod.public()}

    def job_down(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        self._root(peer)
        job_id = _int(req, "job_id", 1)
        return {"released": self.agent.job_down(job_id)}

    def job_get(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        job_id = _int(req, "job_id", 1)
        pod = self.agent.job_get(job_id)
        if not peer.root and pod.uid != peer.uid:
            raise PodnetError("EPERM", f"job {job_id} is not yours")
        return {"pod": pod.public()}

    def login_acquire(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        if peer.root:
            uid = _opt_int(req, "uid", 1, 2**31 - 1)
            pid = _opt_int(req, "pid", 1, 2**31 - 1) or 0
            if uid is None:
                raise PodnetError("EINVAL", "root must name the user: 'uid'")
        else:
            uid, pid = peer.uid, peer.pid
        return {"pod": self.agent.login_acquire(uid, pid).public()}

    def login_release(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        uid = peer.uid
        if "uid" in req:
            asked = _int(req, "uid", 0, 2**31 - 1)
            if asked != peer.uid and not peer.root:
                raise PodnetError("EPERM", "you may only release your own login pod")
            uid = asked
        return {"released": self.agent.login_release(uid)}

    def join(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        target = req.get("target")
        if target not in ("login", "job"):
            raise PodnetError("EINVAL", '\'target\' must be "login" or "job"')
        job_id = _opt_int(req, "job_id", 1) if target == "job" else None
        uid = peer.uid
        if peer.root and "uid" in req:
            uid = _int(req, "uid", 0, 2**31 - 1)
        return {"pod": self.agent.join(uid, str(target), job_id).public()}

    def pods(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        del req
        pods = self.agent.list_pods(None if peer.root else peer.uid)
        return {"pods": [p.public() for p in pods]}

    def status(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        del peer, req
        return self.agent.status()


def _err(code: str, message: str) -> dict[str, Any]:
    return {"v": VERSION, "ok": False, "error": {"code": code, "message": message}}


class Server:
    def __init__(
        self, handler: Handler, path: str, read_timeout: float, max_connections: int
    ) -> None:
        self.handler = handler
        self.path = path
        self.read_timeout = read_timeout
        self.slots = threading.BoundedSemaphore(max_connections)
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
        s.listen(128)
        self.sock = s

    def serve_forever(self) -> None:
        if self.sock is None:
            raise RuntimeError("bind() first")
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                if self.stopping.is_set():
                    return
                raise
            if not self.slots.acquire(blocking=False):
                _send(conn, _err("EUNAVAIL", "too many connections, retry"))
                conn.close()
                continue
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, conn: socket.socket) -> None:
        try:
            peer = peer_of(conn)
            conn.settimeout(self.read_timeout)
            buf = b""
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    if len(buf) > MAX_LINE:
                        _send(conn, _err("ETOOBIG", f"request longer than {MAX_LINE} bytes"))
                        return
                    try:
                        chunk = conn.recv(65536)
                    except TimeoutError:
                        if buf:
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
                _send(conn, self.handler.handle_line(peer, line))
        except OSError:
            pass
        finally:
            conn.close()
            self.slots.release()

    def close(self) -> None:
        self.stopping.set()
        if self.sock is not None:
            self.sock.close()


def _send(conn: socket.socket, reply: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the client went away: nothing to tell it
        conn.sendall(json.dumps(reply, separators=(",", ":")).encode() + b"\n")
