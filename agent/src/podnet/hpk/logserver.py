# SPDX-License-Identifier: Apache-2.0
"""The kubelet's HTTPS port: `kubectl logs` through the API server
(`/containerLogs/<namespace>/<pod>/<container>`), with the cluster CA's serving
certificate, answering only clients with a certificate of the same CA (the API server's
kubelet client certificate)."""

from __future__ import annotations

import http.server
import logging
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("podnet.hpk.logs")

# (namespace, pod, container, previous) -> the log file, and whether it may still grow
Lookup = Callable[[str, str, str, bool], "tuple[Path, Callable[[], bool]] | None"]


def _tail(data: bytes, lines: int) -> bytes:
    if lines < 0:
        return data
    if lines == 0:
        return b""
    parts = data.split(b"\n")
    if parts and parts[-1] == b"":
        parts = parts[:-1]
        return b"\n".join(parts[-lines:]) + b"\n"
    return b"\n".join(parts[-lines:])


class _Handler(http.server.BaseHTTPRequestHandler):
    lookup: Lookup
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s " + format, self.client_address[0], *args)

    def _error(self, code: int, text: str) -> None:
        body = text.encode() + b"\n"
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        q = urllib.parse.parse_qs(url.query)
        if url.path == "/healthz":
            self._error(200, "ok")
            return
        if len(parts) != 4 or parts[0] != "containerLogs":
            self._error(404, f"not served by podnet's kubelet: {url.path}")
            return
        previous = q.get("previous", ["false"])[0] == "true"
        found = self.lookup(parts[1], parts[2], parts[3], previous)
        if found is None:
            self._error(
                404, f"no log of container {parts[3]} of pod {parts[1]}/{parts[2]} on this node"
            )
            return
        path, alive = found
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        try:
            tail = int(q.get("tailLines", ["-1"])[0])
            limit = int(q.get("limitBytes", ["0"])[0])
        except ValueError:
            self._error(400, "tailLines and limitBytes are integers")
            return
        data = _tail(data, tail)
        if limit > 0:
            data = data[:limit]
        follow = q.get("follow", ["false"])[0] == "true"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        if not follow:
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._chunk(data)
        self._follow(path, path.stat().st_size if path.exists() else 0, alive)

    def _follow(self, path: Path, offset: int, alive: Callable[[], bool]) -> None:
        """What the log gains, until its container ended (or the client went)."""
        try:
            while True:
                grew = b""
                if path.exists() and path.stat().st_size > offset:
                    with path.open("rb") as f:
                        f.seek(offset)
                        grew = f.read()
                    offset += len(grew)
                    self._chunk(grew)
                elif not alive():
                    break
                else:
                    time.sleep(0.5)
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()


def serve(
    ip: str, port: int, cert: Path, key: Path, ca: Path, lookup: Lookup
) -> http.server.ThreadingHTTPServer:
    """Start serving in a thread; the server (shutdown() stops it)."""
    handler = type("Handler", (_Handler,), {"lookup": staticmethod(lookup)})
    server = http.server.ThreadingHTTPServer((ip, port), handler)
    server.daemon_threads = True
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert), str(key))
    ctx.load_verify_locations(str(ca))
    ctx.verify_mode = ssl.CERT_REQUIRED
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="logserver", daemon=True).start()
    return server
