# SPDX-License-Identifier: Apache-2.0
"""The `podnet` CNI plugin's protocol (CNI spec 1.0 and 1.1): request parsing, CNI replies,
and `serve`, which turns ADD/DEL/CHECK into podnetd's `container_add/del/check` requests
(over the socket, or in-process for podnetd's op `cni`). The command is cli/cni.py
(console script `podnet-cni`, installed as `podnet` in Apptainer's CNI plugin directory).

A CNI runtime (Apptainer) runs the plugin with the request in environment variables
(`CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS`, `CNI_PATH`) and
the network configuration as JSON on stdin; the plugin prints a result or an error object
as JSON on stdout. The parsing and replies do no I/O (tests/unit/python/test_cni.py); `run` talks to
podnetd over its socket. podnetd takes the container's owner from the kernel (the
user namespace of the netns, or the process `CNI_NETNS` names) and the caller's
SO_PEERCRED, never from CNI_ARGS: `PODNET_NAME` (or `K8S_POD_NAME`) only names the
container, `PODNET_UID` is heard only from root for root's own namespaces. VERSION needs
no daemon. Network configuration keys besides the standard ones: `socket` (podnetd's).

CNI 1.1's STATUS answers success while podnetd serves requests and reaches etcd (else
error 50). Its GC asks podnetd to collect now what its own GC loop collects every 2 s: the
containers whose process is gone. It releases no live container on a runtime's word: a
container's record does not say which network configuration or runtime made it (Apptainer,
cnitool, `podnet-container`), so `cni.dev/valid-attachments` of one runtime cannot speak for
the others'. A runtime's stale attachments reach the plugin as DELs (libcni's GC sends one
for each cached attachment that is not valid).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from podnet import DEFAULT_SOCKET

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

#: what this plugin speaks; the conflists it is listed in may use any of these
SUPPORTED_VERSIONS = ("0.4.0", "1.0.0", "1.1.0")
CNI_VERSION = "1.0.0"
COMMANDS = ("ADD", "DEL", "CHECK", "VERSION", "GC", "STATUS")
#: commands of CNI 1.1 (no container: only the network configuration)
NETWORK_COMMANDS = ("GC", "STATUS")
PLUGIN_TYPE = "podnet"
MAX_CONFIG = 64 * 1024

# Well-known error codes of the CNI spec
E_INCOMPATIBLE_VERSION = 1
E_UNSUPPORTED_FIELD = 2
E_UNKNOWN_CONTAINER = 3
E_INVALID_ENV = 4
E_IO = 5
E_DECODE = 6
E_INVALID_CONFIG = 7
E_TRY_AGAIN = 11
E_NOT_AVAILABLE = 50
#: plugin-specific codes (>= 100): podnetd refused, CHECK found drift
E_PODNETD = 100
E_DRIFT = 101

_CONTAINER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,1023}$")
_NETWORK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
_PROC_NETNS = re.compile(r"^/proc/([1-9][0-9]{0,9})/(?:task/[1-9][0-9]{0,9}/)?ns/net$")
#: the DNS label of a container name (`<container>.<user>.<cluster>`)
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class CniError(Exception):
    """A failure the plugin reports as a CNI error object (exit status 1)."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code, self.msg, self.details = code, msg, details

    def reply(self, version: str = CNI_VERSION) -> dict[str, Any]:
        out: dict[str, Any] = {"cniVersion": version, "code": self.code, "msg": self.msg}
        if self.details:
            out["details"] = self.details
        return out


class CniRequest:
    """A checked request (a plain class: the plugin starts once per ADD, and the
    dataclasses import alone cost it milliseconds)."""

    def __init__(
        self,
        command: str,
        version: str,
        container_id: str = "",
        netns: str = "",
        ifname: str = "",
        args: dict[str, str] | None = None,
        path: list[str] | None = None,
        network: str = "",
        config: dict[str, Any] | None = None,
        prev_result: dict[str, Any] | None = None,
    ) -> None:
        self.command, self.version = command, version
        self.container_id, self.netns, self.ifname = container_id, netns, ifname
        self.args = args if args is not None else {}
        self.path = path if path is not None else []
        self.network = network
        self.config = config if config is not None else {}
        self.prev_result = prev_result

    @property
    def netns_pid(self) -> int | None:
        """The process whose network namespace CNI_NETNS names (`/proc/<pid>/ns/net`,
        what Apptainer passes), or None for a bind-mounted one (`/run/netns/NAME`).
        podnetd takes the container's owner from this process's uid, never from CNI_ARGS."""
        m = _PROC_NETNS.match(self.netns)
        return int(m.group(1)) if m else None

    @property
    def container_name(self) -> str:
        """The DNS label asked for (`CNI_ARGS` `K8S_POD_NAME` or `PODNET_NAME`; a name is
        only a wish, the owner comes from the kernel), else one made of the container id."""
        for key in ("PODNET_NAME", "K8S_POD_NAME"):
            want = self.args.get(key, "").lower()
            if want:
                if not _LABEL.match(want):
                    raise CniError(E_INVALID_ENV, f"CNI_ARGS {key}={want!r} is not a DNS label")
                return want
        return "c-" + re.sub(r"[^a-z0-9]", "", self.container_id.lower())[:12]


def _env(env: Mapping[str, str], key: str) -> str:
    v = env.get(key, "")
    if not v:
        raise CniError(E_INVALID_ENV, f"{key} is not set")
    return v


def parse_args(text: str) -> dict[str, str]:
    """CNI_ARGS: `K1=V1;K2=V2` (spec: alphanumeric keys, no `;` in values)."""
    out: dict[str, str] = {}
    if not text:
        return out
    for part in text.split(";"):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9_]{1,64}", key) or len(value) > 1024:
            raise CniError(E_INVALID_ENV, f"CNI_ARGS: malformed pair {part[:80]!r}")
        out[key] = value
    return out


def parse_config(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_CONFIG:
        raise CniError(E_INVALID_CONFIG, f"network configuration over {MAX_CONFIG} bytes")
    try:
        conf = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise CniError(E_DECODE, "network configuration is not JSON", str(e)) from None
    if not isinstance(conf, dict):
        raise CniError(E_DECODE, "network configuration is not a JSON object")
    return conf


def _network(conf: dict[str, Any], version: str) -> str:
    """The network's name, once the version and the plugin type are ours."""
    if version not in SUPPORTED_VERSIONS:
        raise CniError(
            E_INCOMPATIBLE_VERSION,
            f"cniVersion {version!r} is not supported",
            f"supported: {', '.join(SUPPORTED_VERSIONS)}",
        )
    if conf.get("type") != PLUGIN_TYPE:
        raise CniError(E_INVALID_CONFIG, f"plugin type must be {PLUGIN_TYPE!r}")
    name = conf.get("name")
    if not isinstance(name, str) or not _NETWORK_NAME.match(name):
        raise CniError(E_INVALID_CONFIG, "network 'name' missing or not [A-Za-z0-9_.-]")
    return name


def parse_request(env: Mapping[str, str], stdin: bytes) -> CniRequest:
    """The request a runtime made (spec 1.0, "Parameters"), checked; raises CniError."""
    command = _env(env, "CNI_COMMAND")
    if command not in COMMANDS:
        raise CniError(E_INVALID_ENV, f"CNI_COMMAND {command[:20]!r} is not one of {COMMANDS}")
    conf = parse_config(stdin) if stdin.strip() or command != "VERSION" else {}
    version = conf.get("cniVersion", CNI_VERSION)
    if not isinstance(version, str):
        raise CniError(E_INVALID_CONFIG, "cniVersion must be a string")
    if command == "VERSION":
        return CniRequest(command, version)
    name = _network(conf, version)
    if command in NETWORK_COMMANDS:
        if version in ("0.4.0", "1.0.0"):
            raise CniError(E_INCOMPATIBLE_VERSION, f"{command} needs cniVersion 1.1.0")
        return CniRequest(command=command, version=version, network=name, config=conf)
    container_id = _env(env, "CNI_CONTAINERID")
    if not _CONTAINER_ID.match(container_id):
        raise CniError(E_INVALID_ENV, "CNI_CONTAINERID must be [A-Za-z0-9_.-], 1-1024 long")
    ifname = _env(env, "CNI_IFNAME")
    if len(ifname) > 15 or ifname in (".", "..") or not re.fullmatch(r"[^\s/:]+", ifname):
        raise CniError(E_INVALID_ENV, f"CNI_IFNAME {ifname[:20]!r} is not an interface name")
    netns = env.get("CNI_NETNS", "")
    if command in ("ADD", "CHECK") and not netns:
        raise CniError(E_INVALID_ENV, "CNI_NETNS is not set")
    if netns and (not netns.startswith("/") or "\0" in netns or len(netns) > 4096):
        raise CniError(E_INVALID_ENV, "CNI_NETNS must be an absolute path")
    prev = conf.get("prevResult")
    if command == "CHECK" and not isinstance(prev, dict):
        raise CniError(E_INVALID_CONFIG, "CHECK needs prevResult")
    return CniRequest(
        command=command,
        version=version,
        container_id=container_id,
        netns=netns,
        ifname=ifname,
        args=parse_args(env.get("CNI_ARGS", "")),
        path=[p for p in env.get("CNI_PATH", "").split(":") if p],
        network=name,
        config=conf,
        prev_result=prev if isinstance(prev, dict) else None,
    )


def version_reply(version: str = CNI_VERSION) -> dict[str, Any]:
    return {"cniVersion": version, "supportedVersions": list(SUPPORTED_VERSIONS)}


def add_result(
    req: CniRequest, mac: str, ip: str, prefix: int, gateway: str, dns: dict[str, Any]
) -> dict[str, Any]:
    """The ADD result (spec 1.0 "Success"): one interface in the container, its address."""
    addr: dict[str, Any] = {"address": f"{ip}/{prefix}", "gateway": gateway, "interface": 0}
    if req.version == "0.4.0":
        addr["version"] = "4"  # dropped in 1.0
    return {
        "cniVersion": req.version,
        "interfaces": [{"name": req.ifname, "mac": mac, "sandbox": req.netns}],
        "ips": [addr],
        "routes": [{"dst": "0.0.0.0/0", "gw": gateway}],
        "dns": dns,
    }


def _socket(req: CniRequest) -> str:
    path = req.config.get("socket", DEFAULT_SOCKET)
    if not isinstance(path, str) or not path.startswith("/"):
        raise CniError(E_INVALID_CONFIG, "'socket' must be an absolute path")
    return path


def _call(req: CniRequest, op: str, via: Any, **args: Any) -> dict[str, Any]:
    from podnet.api import client  # noqa: PLC0415 (VERSION needs no socket code)

    try:
        if via is not None:
            return dict(via(op, **args))
        return client.call(op, _socket(req), timeout=60.0, **args)
    except client.ApiError as e:
        if e.code == "EUNAVAIL":
            raise CniError(E_TRY_AGAIN, f"podnetd: {e.message}") from None
        if e.code == "ENOENT" and op != "container_add":
            raise CniError(E_UNKNOWN_CONTAINER, f"podnetd: {e.message}") from None
        raise CniError(E_PODNETD, f"podnetd refused ({e.code}): {e.message}") from None
    except (OSError, ValueError) as e:
        raise CniError(E_TRY_AGAIN, f"podnetd at {_socket(req)}: {e}") from None


def _ident(req: CniRequest) -> dict[str, Any]:
    out: dict[str, Any] = {"container_id": req.container_id, "ifname": req.ifname}
    uid = req.args.get("PODNET_UID", "")
    if uid:
        if not uid.isdigit():
            raise CniError(E_INVALID_ENV, "CNI_ARGS PODNET_UID must be a number")
        out["uid"] = int(uid)
    return out


def run(req: CniRequest, via: Any = None) -> dict[str, Any] | None:
    """Serve one request; the result to print (None: nothing, DEL). `via`: call podnetd's
    operations in-process (op "cni") instead of over its socket."""
    if req.command == "VERSION":
        return version_reply(req.version)
    if req.command == "ADD":
        named = any(req.args.get(k) for k in ("PODNET_NAME", "K8S_POD_NAME"))
        args = _ident(req)
        if named:  # else podnetd names it c-<hash of the container id>
            args["name"] = req.container_name
        pod = _call(req, "container_add", via, netns=req.netns, **args)["pod"]
        return add_result(
            req, pod["mac"], pod["ip"], int(pod["prefix"]), pod["gateway"], pod["dns"]
        )
    if req.command == "STATUS":
        try:
            etcd = _call(req, "status", via).get("etcd") or {}
        except CniError as e:
            raise CniError(E_NOT_AVAILABLE, e.msg, e.details) from None
        if not etcd.get("ok"):
            raise CniError(E_NOT_AVAILABLE, "podnetd cannot reach etcd", str(etcd.get("error")))
        return None
    if req.command == "GC":
        _call(req, "container_gc", via)
        return None
    if req.command == "DEL":
        try:
            _call(req, "container_del", via, **_ident(req))
        except CniError as e:
            if e.code != E_UNKNOWN_CONTAINER:
                raise
        return None
    # CHECK
    reply = _call(req, "container_check", via, **_ident(req))
    problems = list(reply.get("problems") or [])
    prev = req.prev_result or {}
    want = {str(a.get("address", "")).split("/", maxsplit=1)[0] for a in prev.get("ips", [])}
    if want and reply["pod"]["ip"] not in want:
        problems.append(f"podnetd has {reply['pod']['ip']}, prevResult says {sorted(want)}")
    if problems:
        raise CniError(E_DRIFT, "container network drifted", "; ".join(problems))
    return None


def serve(env: Mapping[str, str], data: bytes, via: Any = None) -> tuple[int, str]:
    """One plugin run: (exit status, what to print)."""
    version = CNI_VERSION
    try:
        req = parse_request(env, data)
        version = req.version if req.version in SUPPORTED_VERSIONS else CNI_VERSION
        result = run(req, via)
    except CniError as e:
        return 1, json.dumps(e.reply(version)) + "\n"
    return 0, "" if result is None else json.dumps(result) + "\n"
