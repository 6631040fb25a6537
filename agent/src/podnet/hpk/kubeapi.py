# SPDX-License-Identifier: Apache-2.0
"""Kubernetes' REST API, the few calls the kubelet makes (docs/dependencies.md says why
not the `kubernetes` client): JSON over HTTPS with the client certificate of the user's
cluster, and watches as streams of JSON lines."""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class Client:
    def __init__(
        self, host: str, port: int, ca: Path, cert: Path, key: Path, timeout: float = 30
    ) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.ctx = ssl.create_default_context(cafile=str(ca))
        self.ctx.load_cert_chain(str(cert), str(key))
        # the API server's certificate names its pod address; it is checked against the CA
        # (ours, made for this cluster) and by that address
        self.ctx.check_hostname = True

    def _conn(self, timeout: float | None) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    @staticmethod
    def _url(path: str, params: dict[str, Any] | None) -> str:
        return path + ("?" + urllib.parse.urlencode(params) if params else "")

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        conn = self._conn(self.timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Accept": "application/json"}
            if data is not None:
                headers["Content-Type"] = content_type
            conn.request(method, self._url(path, params), body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        if resp.status >= 300:
            try:
                message = json.loads(raw).get("message", raw.decode(errors="replace"))
            except ValueError:
                message = raw.decode(errors="replace")
            raise ApiError(resp.status, message)
        return json.loads(raw) if raw else {}

    def get(self, path: str, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
        try:
            return self.request("GET", path, params=params)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def watch(self, path: str, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The events of a watch from `params['resourceVersion']` until the server ends it."""
        conn = self._conn(None)
        try:
            conn.request(
                "GET",
                self._url(path, {**params, "watch": "1"}),
                headers={"Accept": "application/json"},
            )
            resp = conn.getresponse()
            if resp.status >= 300:
                raise ApiError(resp.status, resp.read().decode(errors="replace"))
            while True:
                line = resp.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()

    def healthy(self) -> bool:
        try:
            conn = self._conn(5)
            conn.request("GET", "/readyz")
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        except (OSError, http.client.HTTPException):
            return False
