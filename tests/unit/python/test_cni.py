# SPDX-License-Identifier: Apache-2.0
"""The podnet CNI plugin's request parsing and replies (agent/src/podnet/api/cni.py):
what Apptainer hands a plugin, checked as the CNI 1.0 spec says, and errors as CNI
error objects with the spec's codes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from podnet.api import cni

CONF = {"cniVersion": "1.0.0", "name": "podnet", "type": "podnet"}
ENV = {
    "CNI_COMMAND": "ADD",
    "CNI_CONTAINERID": "apptainer-4f2a9c",
    "CNI_NETNS": "/proc/4242/ns/net",
    "CNI_IFNAME": "eth0",
    "CNI_PATH": "/usr/lib/cni:/opt/cni/bin",
    "CNI_ARGS": "IgnoreUnknown=1;PODNET_NAME=Ctl",
}


def _req(env: dict[str, str] | None = None, conf: Any = None) -> cni.CniRequest:
    data = json.dumps(CONF if conf is None else conf).encode()
    return cni.parse_request({**ENV, **(env or {})}, data)


def _code(env: dict[str, str] | None = None, conf: Any = None, raw: bytes | None = None) -> int:
    with pytest.raises(cni.CniError) as e:
        if raw is not None:
            cni.parse_request({**ENV, **(env or {})}, raw)
        else:
            _req(env, conf)
    reply = e.value.reply()
    assert reply["code"] == e.value.code and reply["msg"]
    return e.value.code


def test_add_request_is_parsed() -> None:
    r = _req()
    assert (r.command, r.version, r.network) == ("ADD", "1.0.0", "podnet")
    assert r.container_id == "apptainer-4f2a9c" and r.ifname == "eth0"
    assert r.path == ["/usr/lib/cni", "/opt/cni/bin"]
    assert r.args == {"IgnoreUnknown": "1", "PODNET_NAME": "Ctl"}
    assert r.netns_pid == 4242
    assert r.container_name == "ctl"


def test_identity_comes_from_the_netns_process_not_from_args() -> None:
    assert _req({"CNI_NETNS": "/proc/77/task/78/ns/net"}).netns_pid == 77
    for path in ("/run/netns/x", "/proc/self/ns/net", "/proc/0/ns/net", "/proc/1/ns/net/.."):
        assert _req({"CNI_NETNS": path}).netns_pid is None, path
    # CNI_ARGS may name the container, never its owner: no uid/user key is read
    r = _req({"CNI_ARGS": "K8S_POD_NAMESPACE=bob;USER=bob;UID=0"})
    assert r.container_name == "c-apptainer4f2"


def test_version_needs_no_container() -> None:
    r = cni.parse_request({"CNI_COMMAND": "VERSION"}, b'{"cniVersion": "0.4.0"}')
    assert r.command == "VERSION" and r.version == "0.4.0"
    assert cni.parse_request({"CNI_COMMAND": "VERSION"}, b"").version == "1.0.0"
    reply = cni.version_reply()
    assert reply == {"cniVersion": "1.0.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]}


@pytest.mark.parametrize(
    ("env", "code"),
    [
        ({"CNI_COMMAND": ""}, cni.E_INVALID_ENV),
        ({"CNI_COMMAND": "FROB"}, cni.E_INVALID_ENV),
        ({"CNI_CONTAINERID": ""}, cni.E_INVALID_ENV),
        ({"CNI_CONTAINERID": "../../etc"}, cni.E_INVALID_ENV),
        ({"CNI_IFNAME": "a-very-long-ifname0"}, cni.E_INVALID_ENV),
        ({"CNI_IFNAME": "eth/0"}, cni.E_INVALID_ENV),
        ({"CNI_IFNAME": ".."}, cni.E_INVALID_ENV),
        ({"CNI_NETNS": ""}, cni.E_INVALID_ENV),
        ({"CNI_NETNS": "relative/ns"}, cni.E_INVALID_ENV),
        ({"CNI_ARGS": "novalue"}, cni.E_INVALID_ENV),
        ({"CNI_ARGS": "bad key=1"}, cni.E_INVALID_ENV),
    ],
)
def test_bad_environment_is_error_4(env: dict[str, str], code: int) -> None:
    assert _code(env) == code


def test_bad_container_name_is_refused() -> None:
    with pytest.raises(cni.CniError):
        _ = _req({"CNI_ARGS": "PODNET_NAME=a.b"}).container_name


@pytest.mark.parametrize(
    ("conf", "code"),
    [
        ({**CONF, "cniVersion": "0.3.1"}, cni.E_INCOMPATIBLE_VERSION),
        ({**CONF, "cniVersion": 1}, cni.E_INVALID_CONFIG),
        ({**CONF, "type": "bridge"}, cni.E_INVALID_CONFIG),
        ({**CONF, "name": ""}, cni.E_INVALID_CONFIG),
        ({**CONF, "name": "a b"}, cni.E_INVALID_CONFIG),
        ([CONF], cni.E_DECODE),
    ],
)
def test_bad_config_is_refused(conf: Any, code: int) -> None:
    assert _code(conf=conf) == code


def test_undecodable_or_huge_config() -> None:
    assert _code(raw=b"{not json") == cni.E_DECODE
    assert _code(raw=b"\xff\xfe") == cni.E_DECODE
    big = json.dumps({**CONF, "pad": "x" * cni.MAX_CONFIG}).encode()
    assert _code(raw=big) == cni.E_INVALID_CONFIG


def test_del_without_netns_and_check_needs_prev_result() -> None:
    r = _req({"CNI_COMMAND": "DEL", "CNI_NETNS": ""})
    assert r.command == "DEL" and r.netns == "" and r.netns_pid is None
    assert _code({"CNI_COMMAND": "CHECK"}) == cni.E_INVALID_CONFIG
    prev = {"cniVersion": "1.0.0", "ips": [{"address": "198.18.0.9/15"}]}
    r = _req({"CNI_COMMAND": "CHECK"}, {**CONF, "prevResult": prev})
    assert r.prev_result == prev


def test_add_result_follows_the_requested_version() -> None:
    dns = {"nameservers": ["198.51.100.10"], "search": ["alice.lab"]}
    res = cni.add_result(_req(), "0a:58:c6:12:00:09", "198.18.0.9", 15, "169.254.0.1", dns)
    assert res["ips"] == [{"address": "198.18.0.9/15", "gateway": "169.254.0.1", "interface": 0}]
    assert res["interfaces"][0] == {
        "name": "eth0",
        "mac": "0a:58:c6:12:00:09",
        "sandbox": "/proc/4242/ns/net",
    }
    old = cni.add_result(_req(conf={**CONF, "cniVersion": "0.4.0"}), "m", "198.18.0.9", 15, "g", {})
    assert old["cniVersion"] == "0.4.0" and old["ips"][0]["version"] == "4"
    err = cni.CniError(cni.E_TRY_AGAIN, "podnetd busy", "retry").reply("0.4.0")
    assert err == {"cniVersion": "0.4.0", "code": 11, "msg": "podnetd busy", "details": "retry"}


def test_gc_and_status_of_cni_1_1() -> None:
    """GC and STATUS carry only the network configuration (no container, netns,
    ifname); they need cniVersion 1.1.0. STATUS reports podnetd's etcd as CNI error 50
    (not available); GC asks podnetd for its collection of containers whose process is
    gone, nothing else (`cni.dev/valid-attachments` is not a list of every runtime's)."""
    conf = {**CONF, "cniVersion": "1.1.0", "cni.dev/valid-attachments": []}
    bare = {"CNI_CONTAINERID": "", "CNI_NETNS": "", "CNI_IFNAME": ""}
    for command in ("GC", "STATUS"):
        r = _req({**bare, "CNI_COMMAND": command}, conf)
        assert (r.command, r.version, r.network, r.container_id) == (command, "1.1.0", "podnet", "")
        assert _code({"CNI_COMMAND": command}) == cni.E_INCOMPATIBLE_VERSION
    calls: list[str] = []
    etcd: dict[str, Any] = {"ok": True}

    def via(op: str, **args: Any) -> dict[str, Any]:
        assert not args
        calls.append(op)
        return {"etcd": etcd} if op == "status" else {"released": 0}

    data = json.dumps(conf).encode()
    assert cni.serve({**ENV, **bare, "CNI_COMMAND": "STATUS"}, data, via) == (0, "")
    assert cni.serve({**ENV, **bare, "CNI_COMMAND": "GC"}, data, via) == (0, "")
    assert calls == ["status", "container_gc"]
    etcd.update(ok=False, error="connection refused")
    rc, out = cni.serve({**ENV, **bare, "CNI_COMMAND": "STATUS"}, data, via)
    err = json.loads(out)
    assert rc == 1 and err["code"] == cni.E_NOT_AVAILABLE and "refused" in err["details"]
    # a 1.1.0 ADD is a 1.0.0 one
    assert _req(conf={**CONF, "cniVersion": "1.1.0"}).version == "1.1.0"
