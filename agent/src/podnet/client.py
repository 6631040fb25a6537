"""A small client of the podnetd socket (used by the CLI and the tests)."""

from __future__ import annotations

import contextlib
import json
import socket
from typing import Any

DEFAULT_SOCKET = "/run/podnet/podnetd.sock"


class ApiError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def call(
    op: str, sock_path: str = DEFAULT_SOCKET, timeout: float = 60.0, **args: Any
) -> dict[str, Any]:
    """One request; returns the reply's fields or raises ApiError."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(sock_path)
        # podnetd may answer and hang up before reading (a refusal): read its reply
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(json.dumps({"v": 1, "op": op, **args}).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    if not buf.strip():
        raise ApiError("EUNAVAIL", "podnetd closed the connection without a reply")
    reply = json.loads(buf)
    if not reply.get("ok"):
        err = reply.get("error") or {}
        raise ApiError(str(err.get("code", "EINTERNAL")), str(err.get("message", "")))
    return dict(reply)
