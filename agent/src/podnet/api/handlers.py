# SPDX-License-Identifier: Apache-2.0
"""The socket API's requests (docs/api.md): dispatch, validation and authorization, pure
(testable without a socket). Who asks is SO_PEERCRED's word (`Peer`, from api.server),
never the request's. Malformed input gets an error reply and never reaches the agent.

The handlers call the node agent through `Ops`, the operations they use.
"""

from __future__ import annotations

import json
import logging
import pwd
from collections.abc import Callable
from typing import Any, Protocol

from podnet.api import cni
from podnet.config import ClusterConfig, NodeConfig
from podnet.errors import PodnetError
from podnet.names import mac_for_ip
from podnet.node.pods import Pod
from podnet.state.quota import QuotaExceeded
from podnet.state.store import EtcdRequestError, EtcdUnavailable
from podnet.stats import Tally

log = logging.getLogger("podnet.server")

VERSION = 1
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


class ContainerOps(Protocol):
    """What the handlers call of node.containers.Containers."""

    def add(
        self,
        caller_uid: int,
        caller_pid: int,
        container_id: str,
        ifname: str,
        netns_path: str,
        label: str,
        asked_uid: int | None,
        asked_pid: int | None,
    ) -> Pod: ...

    def find(
        self, caller_uid: int, container_id: str, ifname: str, uid: int | None
    ) -> Pod | None: ...

    def delete(self, pod: Pod) -> bool: ...

    def check(self, pod: Pod) -> list[str]: ...

    def gc_once(self) -> list[str]: ...


class Ops(Protocol):
    """What the handlers call of the node agent (node.agent.Agent)."""

    @property
    def cfg(self) -> NodeConfig: ...

    @property
    def cluster(self) -> ClusterConfig: ...

    @property
    def containers(self) -> ContainerOps: ...

    def job_up(
        self, job_id: int, user: str, uid: int, job_name: str, nodes: list[str], node_index: int
    ) -> Pod: ...

    def job_down(self, job_id: int) -> bool: ...

    def job_pidns(self, job_id: int, pid: int) -> bool: ...

    def job_get(self, job_id: int) -> Pod: ...

    def login_acquire(self, uid: int, pid: int) -> Pod: ...

    def login_release(self, uid: int) -> bool: ...

    def join(self, uid: int, target: str, job_id: int | None) -> Pod: ...

    def list_pods(self, uid: int | None) -> list[Pod]: ...

    def status(self) -> dict[str, Any]: ...

    def quota_usage(self, uid: int) -> dict[str, Any]: ...

    def publish(self, uid: int, root: bool, job: str, pod: int, port: int) -> dict[str, Any]: ...

    def unpublish(self, uid: int, root: bool, job: str, pod: int, port: int) -> int: ...

    def published(self, uid: int | None) -> list[dict[str, Any]]: ...


class Peer:
    """Who is asking: SO_PEERCRED of the connection."""

    def __init__(self, pid: int, uid: int, gid: int) -> None:
        self.pid, self.uid, self.gid = pid, uid, gid

    @property
    def root(self) -> bool:
        return self.uid == 0


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

    def __init__(self, agent: Ops) -> None:
        self.agent = agent
        self.ops: dict[str, Callable[[Peer, dict[str, Any]], dict[str, Any]]] = {
            "job_up": self.job_up,
            "job_down": self.job_down,
            "job_get": self.job_get,
            "job_pidns": self.job_pidns,
            "login_acquire": self.login_acquire,
            "login_release": self.login_release,
            "join": self.join,
            "pods": self.pods,
            "status": self.status,
            "quota": self.quota,
            "publish": self.publish,
            "unpublish": self.unpublish,
            "published": self.published,
            "container_add": self.container_add,
            "container_del": self.container_del,
            "container_check": self.container_check,
            "container_gc": self.container_gc,
            "cni": self.cni,
        }
        #: failed requests by op and error code; quota refusals by op and limit (metrics)
        self.failed = Tally()
        self.quota_refused = Tally()

    def handle_line(self, peer: Peer, line: bytes) -> dict[str, Any]:
        op, reply = self._handle_line(peer, line)
        if not reply["ok"]:
            self.failed.add(op, reply["error"]["code"])
            if reply["error"]["code"] == "EQUOTA":
                self.quota_refused.add(op, str(reply["error"]["quota"]["limit"]))
        return reply

    def _handle_line(self, peer: Peer, line: bytes) -> tuple[str, dict[str, Any]]:
        """(the request's op for the metrics' labels: one of ours, or "invalid"; the reply)"""
        op = "invalid"
        try:
            try:
                req = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                raise PodnetError("EINVAL", "request is not valid JSON") from None
            if not isinstance(req, dict):
                raise PodnetError("EINVAL", "request must be a JSON object")
            asked = req.get("op")
            fn = self.ops.get(asked) if isinstance(asked, str) else None
            if fn is not None:
                op = str(asked)
            if req.get("v") != VERSION:
                raise PodnetError(
                    "EVERSION",
                    f"unsupported API version {req.get('v')!r} (this podnetd speaks {VERSION})",
                )
            if fn is None:
                raise PodnetError("EINVAL", f"unknown op {asked!r}")
            return op, {"v": VERSION, "ok": True, **fn(peer, req)}
        except QuotaExceeded as e:
            return op, _err(e.code, e.message, quota=e.details())
        except PodnetError as e:
            return op, _err(e.code, e.message)
        except (EtcdUnavailable, EtcdRequestError) as e:
            log.warning("etcd: %s", e)
            return op, _err("EUNAVAIL", f"podnet state store unavailable: {e}")
        except OSError as e:
            log.exception("kernel error")
            return op, _err("EUNAVAIL", f"kernel refused: {e}")
        except Exception as e:  # never crash the daemon on one request
            log.exception("internal error")
            return op, _err("EINTERNAL", f"internal error: {type(e).__name__}")

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

    def job_pidns(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        """The job's PID namespace is Slurm's (namespace/linux): `pid` is its PID 1."""
        self._root(peer)
        job_id = _int(req, "job_id", 1)
        pid = _int(req, "pid", 2, 2**22)
        return {"adopted": self.agent.job_pidns(job_id, pid)}

    def job_get(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        job_id = _int(req, "job_id", 1)
        pod = self.agent.job_get(job_id)
        if not peer.root and pod.uid != peer.uid:
            raise PodnetError("EPERM", f"job {job_id} is not yours")
        return {"pod": pod.public()}

    def login_acquire(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        if "login" not in self.agent.cfg.roles:
            raise PodnetError(
                "EPERM",
                f"{self.agent.cfg.node} is not a login node: login pods are made only on "
                "nodes with the login role",
            )
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

    def quota(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        """The caller's usage against each quota (root: any user's, `user`)."""
        uid = peer.uid
        if peer.root and "user" in req:
            name = _name(req, "user", 32)
            try:
                uid = pwd.getpwnam(name).pw_uid
            except KeyError:
                raise PodnetError("ENOENT", f"no user {name!r} on this node") from None
        return {"quota": self.agent.quota_usage(uid)}

    # -- containers (containers.py; the podnet CNI plugin and podnet-container) ----------
    def _container_args(self, req: dict[str, Any]) -> tuple[str, str]:
        return _name(req, "container_id", 1024), _name(req, "ifname", 15)

    def container_add(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        cid, ifname = self._container_args(req)
        netns = _text(req, "netns", 4096)
        label = _text(req, "name", 63)
        # root may name the user and the process (a runtime acting for a user); a user's
        # own identity is SO_PEERCRED's, whatever the request says
        uid = _opt_int(req, "uid", 1, 2**31 - 1) if peer.root else None
        pid = _opt_int(req, "pid", 1, 2**31 - 1) if peer.root else None
        pod = self.agent.containers.add(peer.uid, peer.pid, cid, ifname, netns, label, uid, pid)
        return {"pod": self._container_reply(pod)}

    def _container_reply(self, pod: Pod) -> dict[str, Any]:
        cc = self.agent.cluster
        out = dict(pod.public())
        out["mac"] = mac_for_ip(pod.ip)
        out["gateway"] = cc.gateway_ip
        out["dns"] = {
            "nameservers": list(cc.dns_servers),
            "domain": f"{pod.user}.{cc.zone}",
            "search": [f"{pod.user}.{cc.zone}", *cc.search_domains],
        }
        return out

    def _find_container(self, peer: Peer, req: dict[str, Any]) -> Pod | None:
        cid, ifname = self._container_args(req)
        uid = _opt_int(req, "uid", 1, 2**31 - 1) if peer.root else None
        return self.agent.containers.find(peer.uid, cid, ifname, uid)

    def container_del(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        pod = self._find_container(peer, req)
        return {"released": bool(pod and self.agent.containers.delete(pod))}

    def container_check(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        pod = self._find_container(peer, req)
        if pod is None:
            raise PodnetError("ENOENT", "no such container interface on this node")
        return {"pod": self._container_reply(pod), "problems": self.agent.containers.check(pod)}

    def container_gc(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        """CNI GC: the containers loop's collection, now (containers whose process is gone,
        any user's: what the loop does every CONTAINER_GC_SECONDS anyway)."""
        del peer, req
        return {"released": len(self.agent.containers.gc_once())}

    def cni(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        """The C CNI plugin's relay (agent/native/podnet_cni.c): a whole CNI request,
        served by podnet.api.cni on this caller's behalf; what the plugin prints and its
        exit status."""
        env = {
            "CNI_COMMAND": _text(req, "command", 16),
            "CNI_CONTAINERID": _text(req, "container_id", 1024),
            "CNI_NETNS": _text(req, "netns", 4096),
            "CNI_IFNAME": _text(req, "ifname", 64),
            "CNI_ARGS": _text(req, "args", 4096),
            "CNI_PATH": _text(req, "path", 4096),
        }
        config = _text(req, "config", cni.MAX_CONFIG).encode()

        def via(op: str, **args: Any) -> dict[str, Any]:
            return self.ops[op](peer, {"v": VERSION, "op": op, **args})

        rc, out = cni.serve(env, config, via)
        return {"cni_rc": rc, "cni_out": out}

    # -- published ports (podnet publish; docs/gateway.md) -------------------------------
    @staticmethod
    def _pub_args(req: dict[str, Any]) -> tuple[str, int, int]:
        job = _name(req, "job", 64)
        pod = _opt_int(req, "pod", 0, 100000) or 0
        port = _int(req, "port", 1, 65535)
        return job, pod, port

    def publish(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        job, pod, port = self._pub_args(req)
        return {"published": self.agent.publish(peer.uid, peer.root, job, pod, port)}

    def unpublish(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        job, pod, port = self._pub_args(req)
        return {"removed": self.agent.unpublish(peer.uid, peer.root, job, pod, port)}

    def published(self, peer: Peer, req: dict[str, Any]) -> dict[str, Any]:
        del req
        return {"published": self.agent.published(None if peer.root else peer.uid)}


def _err(code: str, message: str, **more: Any) -> dict[str, Any]:
    return {"v": VERSION, "ok": False, "error": {"code": code, "message": message, **more}}
