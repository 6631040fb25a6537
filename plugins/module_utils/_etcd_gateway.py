# SPDX-License-Identifier: Apache-2.0
# Copyright (c) podnet developers
# Apache License 2.0 (see galaxy.yml)
"""Minimal client for etcd's v3 JSON gateway (grpc-gateway), for hpc.podnet modules.

Private module utility: the API may change without notice. It speaks HTTPS with
client certificates through ``ansible.module_utils.urls.open_url`` so managed
nodes need nothing beyond Ansible itself. Keys and values travel base64-encoded;
64-bit integers come back as JSON strings (grpc-gateway convention).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import time
import typing as t
from urllib.error import HTTPError, URLError

from ansible.module_utils.urls import open_url

# Options shared by every etcd module (documented in the hpc.podnet.etcd doc fragment).
ETCD_COMMON_ARGUMENT_SPEC: dict[str, dict[str, t.Any]] = {
    "endpoints": {
        "type": "list",
        "elements": "str",
        "default": ["https://127.0.0.1:2379"],
    },
    "ca_cert": {"type": "path", "default": "/etc/podnet/pki/ca.crt"},
    "client_cert": {"type": "path", "default": "/etc/podnet/pki/admin.crt"},
    "client_key": {"type": "path", "default": "/etc/podnet/pki/admin.key"},
    "timeout": {"type": "float", "default": 10.0},
    "login_user": {"type": "str"},
    "login_password": {"type": "str", "no_log": True},
    "login_password_file": {"type": "path", "no_log": False},
}

# etcd refuses a membership change with this before proposing it (strict reconfig check),
# also while a member reconnected less than 5 s ago: safe to retry for a few seconds.
_UNHEALTHY_MARKER = "unhealthy cluster"
RECONFIG_RETRY_SECONDS = 8.0

# etcd's answer to auth/authenticate while authentication is off: no token needed.
_AUTH_OFF_MARKER = "authentication is not enabled"
_BAD_TOKEN_MARKERS = ("invalid auth token", "auth token is expired")

# etcd errors worth one more try on the same or another endpoint.
_TRANSIENT_MARKERS = (
    "leader changed",
    "no leader",
    "request timed out",
    "too many requests",
    "not capable",
)

Opener = t.Callable[..., t.Any]
Json = dict[str, t.Any]


class EtcdGatewayError(Exception):
    """Any failure talking to etcd; ``str()`` is a message fit for fail_json."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def b64(text: str | bytes) -> str:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return base64.b64encode(raw).decode("ascii")


def unb64(data: str | None) -> str:
    if not data:
        return ""
    return base64.b64decode(data).decode("utf-8", errors="replace")


def prefix_range_end(prefix: str) -> str:
    """Range end covering every key that starts with ``prefix`` (as etcdctl --prefix)."""
    raw = bytearray(prefix.encode("utf-8"))
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return b64(bytes(raw))
        raw.pop()
    # empty prefix (or all 0xff): every key
    return b64(b"\x00")


def member_id_hex(member_id: str | int) -> str:
    return f"{int(member_id):x}"


class EtcdGateway:
    """Calls ``POST <endpoint>/v3/<path>`` on the first endpoint that answers."""

    def __init__(
        self,
        endpoints: list[str],
        *,
        ca_cert: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        timeout: float = 10.0,
        opener: Opener = open_url,
        retries: int = 2,
        login_user: str | None = None,
        login_password: str | None = None,
    ) -> None:
        if not endpoints:
            raise EtcdGatewayError("no etcd endpoint given (option endpoints is empty)")
        for endpoint in endpoints:
            if not endpoint.startswith(("https://", "http://")):
                raise EtcdGatewayError(
                    f"endpoint {endpoint!r} is not an http(s) URL (example: https://127.0.0.1:2379)"
                )
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.ca_cert = ca_cert
        self.client_cert = client_cert
        self.client_key = client_key
        self.timeout = timeout
        self.opener = opener
        self.retries = retries
        # etcd's JSON gateway ignores the client certificate's common name once
        # authentication is on: requests then carry a token from auth/authenticate.
        self.login_user = login_user
        self.login_password = login_password
        self._token: str | None = None
        self._token_checked = False

    # -- transport -------------------------------------------------------------------
    def _post_once(self, endpoint: str, path: str, body: Json) -> Json:
        url = f"{endpoint}/v3/{path}"
        headers = {"Content-Type": "application/json"}
        if self._token:
            headers["Authorization"] = self._token
        try:
            resp = self.opener(
                url,
                data=json.dumps(body),
                headers=headers,
                method="POST",
                timeout=self.timeout,
                validate_certs=True,
                use_proxy=False,
                ca_path=self.ca_cert,
                client_cert=self.client_cert,
                client_key=self.client_key,
                follow_redirects="none",
            )
            raw = resp.read()
        except HTTPError as exc:
            detail = ""
            try:
                err_body: bytes = exc.read() or b"{}"
            except (OSError, AttributeError):
                err_body = b"{}"
            try:
                payload = json.loads(err_body)
                detail = payload.get("error") or payload.get("message") or ""
            except (ValueError, AttributeError):
                # etcd's plain-text refusals (embed/serve.go) are not JSON
                detail = _plain_refusal(err_body)
            msg = f"{url}: HTTP {exc.code} {detail or exc.reason}"
            raise EtcdGatewayError(msg, code=exc.code) from exc
        except ssl.SSLError as exc:
            raise _ConnectError(f"{url}: TLS error: {exc}") from exc
        except URLError as exc:
            reason = exc.reason
            if isinstance(reason, ssl.SSLError):
                raise _ConnectError(f"{url}: TLS error: {reason}") from exc
            sent = not isinstance(reason, (socket.timeout, TimeoutError))
            raise _ConnectError(f"{url}: unreachable: {reason}", before_send=sent) from exc
        except TimeoutError as exc:
            raise _ConnectError(
                f"{url}: timed out after {self.timeout}s", before_send=False
            ) from exc
        except (OSError, ValueError) as exc:
            # open_url raises ValueError for unreadable certificate files and the like
            raise _ConnectError(f"{url}: {exc}") from exc
        try:
            data = json.loads(raw or b"{}")
        except ValueError as exc:
            snippet = raw[:200].decode("utf-8", errors="replace") if raw else ""
            raise EtcdGatewayError(
                f"{url}: answer is not JSON (is this an etcd v3 endpoint?): {snippet!r}"
            ) from exc
        if not isinstance(data, dict):
            raise EtcdGatewayError(f"{url}: unexpected answer {data!r}")
        if "error" in data and "header" not in data:
            raise EtcdGatewayError("{}: {}".format(url, data.get("error")), code=data.get("code"))
        return data

    def reconfigure(self, path: str, body: Json) -> Json:
        """A membership change: sent once, retried only while etcd refuses it up front
        as "unhealthy cluster" (a member is down or reconnected just now)."""
        deadline = time.monotonic() + RECONFIG_RETRY_SECONDS
        while True:
            try:
                return self.post(path, body, idempotent=False)
            except EtcdGatewayError as exc:
                if _UNHEALTHY_MARKER not in str(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(1.0)

    def authenticate(self, force: bool = False) -> None:
        """Get a token for login_user (once; again with ``force``). No token while etcd's
        authentication is off."""
        if not self.login_user or (self._token_checked and not force):
            return
        self._token = None
        self._token_checked = True
        try:
            data = self._post_all(
                "auth/authenticate",
                {"name": self.login_user, "password": self.login_password or ""},
                idempotent=True,
            )
        except EtcdGatewayError as exc:
            if _AUTH_OFF_MARKER in str(exc):
                return
            raise EtcdGatewayError(f"etcd login as {self.login_user!r} failed: {exc}") from exc
        self._token = str(data.get("token") or "") or None

    def post(self, path: str, body: Json, idempotent: bool = True) -> Json:
        """POST to the first endpoint that answers; transient etcd errors are retried.

        A non-idempotent call (membership changes) moves on only when an endpoint
        refused the connection: a timeout or an etcd error may mean it was applied.
        With login_user, a token is fetched first and fetched again once if etcd
        says it expired (a refused request was not applied).
        """
        self.authenticate()
        try:
            return self._post_all(path, body, idempotent)
        except EtcdGatewayError as exc:
            if not self.login_user or not any(m in str(exc) for m in _BAD_TOKEN_MARKERS):
                raise
        self.authenticate(force=True)
        return self._post_all(path, body, idempotent)

    def _post_all(self, path: str, body: Json, idempotent: bool) -> Json:
        errors: list[str] = []
        for attempt in range(self.retries + 1):
            for endpoint in self.endpoints:
                try:
                    return self._post_once(endpoint, path, body)
                except _ConnectError as exc:
                    if not idempotent and not exc.before_send:
                        raise
                    errors.append(str(exc))
                except EtcdGatewayError as exc:
                    if not idempotent or not any(m in str(exc) for m in _TRANSIENT_MARKERS):
                        raise
                    errors.append(str(exc))
            if attempt < self.retries:
                time.sleep(0.5 * (attempt + 1))
        raise EtcdGatewayError(
            "no etcd endpoint answered ({}): {}".format(
                ", ".join(self.endpoints), "; ".join(errors)
            )
        )

    # -- kv ----------------------------------------------------------------------------
    def get(self, key: str, prefix: bool = False) -> tuple[list[Json], int]:
        """Return (kvs, revision); kvs have decoded ``key``/``value`` and int revisions."""
        body: Json = {"key": b64(key)}
        if prefix:
            body["range_end"] = prefix_range_end(key)
        data = self.post("kv/range", body)
        return [_decode_kv(kv) for kv in data.get("kvs", [])], _header_revision(data)

    def put(self, key: str, value: str) -> Json:
        return self.post("kv/put", {"key": b64(key), "value": b64(value)})

    def put_if_unchanged(self, key: str, value: str, mod_revision: int) -> bool:
        """Write ``value`` only if the key's mod_revision is still ``mod_revision``
        (0 = the key must not exist). Returns whether the write happened."""
        compare = {
            "key": b64(key),
            "target": "MOD",
            "result": "EQUAL",
            "mod_revision": str(mod_revision),
        }
        data = self.post(
            "kv/txn",
            {
                "compare": [compare],
                "success": [{"request_put": {"key": b64(key), "value": b64(value)}}],
            },
        )
        return bool(data.get("succeeded", False))

    def delete(self, key: str, prefix: bool = False) -> list[Json]:
        body: Json = {"key": b64(key), "prev_kv": True}
        if prefix:
            body["range_end"] = prefix_range_end(key)
        data = self.post("kv/deleterange", body)
        return [_decode_kv(kv) for kv in data.get("prev_kvs", [])]

    # -- cluster -----------------------------------------------------------------------
    def member_list(self) -> list[Json]:
        data = self.post("cluster/member/list", {})
        return [_decode_member(m) for m in data.get("members", [])]

    def member_add(self, peer_urls: list[str], learner: bool = False) -> Json:
        body: Json = {"peerURLs": peer_urls}
        if learner:
            body["isLearner"] = True
        data = self.reconfigure("cluster/member/add", body)
        return _decode_member(data.get("member", {}))

    def member_remove(self, member_id: int) -> None:
        self.reconfigure("cluster/member/remove", {"ID": str(member_id)})

    def member_update(self, member_id: int, peer_urls: list[str]) -> None:
        self.reconfigure("cluster/member/update", {"ID": str(member_id), "peerURLs": peer_urls})

    def member_promote(self, member_id: int) -> None:
        self.reconfigure("cluster/member/promote", {"ID": str(member_id)})

    # -- auth (users, roles, key-range permissions) -------------------------------------
    def auth_enabled(self) -> bool:
        """etcd 3.5+ (auth/status)."""
        data = self.post("auth/status", {})
        return bool(data.get("enabled", False))

    def auth_enable(self) -> None:
        self.post("auth/enable", {}, idempotent=False)

    def auth_disable(self) -> None:
        self.post("auth/disable", {}, idempotent=False)

    def user_list(self) -> list[str]:
        return sorted(self.post("auth/user/list", {}).get("users") or [])

    def user_roles(self, name: str) -> list[str]:
        return sorted(self.post("auth/user/get", {"name": name}).get("roles") or [])

    def user_add(self, name: str, password: str | None) -> None:
        body: Json = {"name": name}
        if password:
            body["password"] = password
        else:
            body["options"] = {"no_password": True}
        self.post("auth/user/add", body, idempotent=False)

    def user_delete(self, name: str) -> None:
        self.post("auth/user/delete", {"name": name}, idempotent=False)

    def user_change_password(self, name: str, password: str) -> None:
        self.post("auth/user/changepw", {"name": name, "password": password}, idempotent=False)

    def user_grant_role(self, name: str, role: str) -> None:
        self.post("auth/user/grant", {"user": name, "role": role}, idempotent=False)

    def user_revoke_role(self, name: str, role: str) -> None:
        self.post("auth/user/revoke", {"name": name, "role": role}, idempotent=False)

    def role_list(self) -> list[str]:
        return sorted(self.post("auth/role/list", {}).get("roles") or [])

    def role_permissions(self, role: str) -> list[Json]:
        """Permissions as dicts: ``type`` (read, write, readwrite), ``key`` and
        ``range_end`` (decoded; range_end empty for a single key)."""
        data = self.post("auth/role/get", {"role": role})
        return [_decode_perm(p) for p in data.get("perm") or []]

    def role_add(self, role: str) -> None:
        self.post("auth/role/add", {"name": role}, idempotent=False)

    def role_delete(self, role: str) -> None:
        self.post("auth/role/delete", {"role": role}, idempotent=False)

    def role_grant(self, role: str, perm: Json) -> None:
        body = {
            "name": role,
            "perm": {
                "permType": perm["type"].upper(),
                "key": b64(perm["key"]),
                "range_end": b64(perm["range_end"]),
            },
        }
        self.post("auth/role/grant", body, idempotent=False)

    def role_revoke(self, role: str, perm: Json) -> None:
        body = {"role": role, "key": b64(perm["key"]), "range_end": b64(perm["range_end"])}
        self.post("auth/role/revoke", body, idempotent=False)

    def endpoint_healthy(self, endpoint: str) -> bool:
        """True when this one endpoint answers a maintenance/status call."""
        try:
            self._post_once(endpoint.rstrip("/"), "maintenance/status", {})
        except (EtcdGatewayError, _ConnectError):
            return False
        return True


class _ConnectError(EtcdGatewayError):
    """The endpoint could not be reached (another endpoint may still answer)."""

    def __init__(self, message: str, before_send: bool = True) -> None:
        super().__init__(message)
        self.before_send = before_send


_CN_REFUSAL = "CommonName of client sending a request against gateway"


def _plain_refusal(body: bytes) -> str:
    text = body.decode("utf-8", errors="replace")
    if _CN_REFUSAL in text:
        return (
            "etcd authentication is on and its JSON gateway refuses client certificates with a "
            "common name: use a certificate without one, with login_user and login_password"
        )
    return text.strip()[:200]


def _header_revision(data: Json) -> int:
    header = data.get("header") or {}
    return int(header.get("revision", 0) or 0)


def _decode_kv(kv: Json) -> Json:
    return {
        "key": unb64(kv.get("key")),
        "value": unb64(kv.get("value")),
        "create_revision": int(kv.get("create_revision", 0) or 0),
        "mod_revision": int(kv.get("mod_revision", 0) or 0),
        "version": int(kv.get("version", 0) or 0),
    }


def _decode_member(member: Json) -> Json:
    member_id = int(member.get("ID", 0) or 0)
    return {
        "id": member_id,
        "id_hex": member_id_hex(member_id),
        "name": member.get("name", "") or "",
        "peer_urls": list(member.get("peerURLs") or []),
        "client_urls": list(member.get("clientURLs") or []),
        "is_learner": bool(member.get("isLearner", False)),
    }


def prefix_end(prefix: str) -> str:
    """``prefix_range_end`` decoded (the raw range end for a prefix)."""
    return base64.b64decode(prefix_range_end(prefix)).decode("utf-8", errors="surrogateescape")


def _decode_perm(perm: Json) -> Json:
    # grpc-gateway leaves out enum zero values: a missing permType is READ
    return {
        "type": str(perm.get("permType") or "READ").lower(),
        "key": unb64(perm.get("key")),
        "range_end": unb64(perm.get("range_end")),
    }


def login_password(params: dict[str, t.Any]) -> str | None:
    """login_password, or the first line of login_password_file (a missing file: none;
    etcd then refuses the login if authentication is on)."""
    if params.get("login_password") is not None:
        return str(params["login_password"])
    path = params.get("login_password_file")
    if not path or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.readline().rstrip("\n")


def gateway_from_module_params(params: dict[str, t.Any]) -> EtcdGateway:
    return EtcdGateway(
        endpoints=list(params["endpoints"]),
        ca_cert=params.get("ca_cert"),
        client_cert=params.get("client_cert"),
        client_key=params.get("client_key"),
        timeout=float(params.get("timeout") or 10.0),
        login_user=params.get("login_user"),
        login_password=login_password(params),
    )


def not_deployed(params: dict[str, t.Any]) -> str | None:
    """Why this node cannot talk to etcd yet, or None: the CA or client certificate files
    are missing (the etcd role writes them; in check mode it only says it would)."""
    missing = [
        str(params[opt])
        for opt in ("ca_cert", "client_cert", "client_key")
        if params.get(opt) and not os.path.exists(params[opt])
    ]
    if not missing:
        return None
    return "{} {} not exist yet".format(", ".join(missing), "does" if len(missing) == 1 else "do")


def check_mode_not_deployed(module: t.Any, changed: bool = True, **result: t.Any) -> None:
    """In check mode, when etcd's client certificates are not deployed yet (nothing is
    installed, or the run that would install them is this check), exit with ``changed``
    and a message saying so instead of failing. Outside check mode it does nothing: the
    request is made and a missing file fails loudly."""
    if not module.check_mode:
        return
    reason = not_deployed(module.params)
    if reason is None:
        return
    msg = (
        f"check mode: {reason} (etcd not deployed yet): the change cannot be computed, "
        "it would be made once etcd runs"
        if changed
        else f"check mode: {reason} (etcd not deployed yet): nothing to read"
    )
    module.exit_json(changed=changed, msg=msg, not_deployed=True, **result)


def run_module(
    module: t.Any,
    run: t.Callable[[dict[str, t.Any], bool, EtcdGateway], dict[str, t.Any]],
    errors: tuple[type[Exception], ...],
) -> None:
    """The end of every writing module: run against the gateway, fail on the module's
    own errors or the gateway's, drop the diff unless asked for, exit. In check mode
    without etcd's client certificates (not deployed yet): changed, with a message."""
    check_mode_not_deployed(module)
    caught: tuple[type[Exception], ...] = (EtcdGatewayError, *errors)
    try:
        result = run(module.params, module.check_mode, gateway_from_module_params(module.params))
    except caught as exc:
        module.fail_json(msg=str(exc))
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)
