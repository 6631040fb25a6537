# SPDX-License-Identifier: Apache-2.0
"""A small client of the podnetd socket (used by the CLI and the tests)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from typing import Any

from podnet import DEFAULT_SOCKET
from podnet.errors import PodnetError

__all__ = ["DEFAULT_SOCKET", "ApiError", "call"]

#: an error reply of podnetd: podnet's one error type, named for the client side
ApiError = PodnetError


def _connect(s: socket.socket, path: str, deadline: float) -> None:
    """Connect; while podnetd's accept queue is full (a flood of connections from
    someone else), try again until the deadline, as the C client does."""
    pause = 0.005
    while True:
        try:
            s.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() + pause > deadline:
                raise TimeoutError(f"{path}: podnetd's queue stayed full") from None
            time.sleep(pause)
            pause = min(pause * 2, 0.1)


def call(
    op: str, sock_path: str = DEFAULT_SOCKET, timeout: float = 60.0, **args: Any
) -> dict[str, Any]:
    """One request; returns the reply's fields or raises ApiError."""
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        _connect(s, sock_path, deadline)
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
