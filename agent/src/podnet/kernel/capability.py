# SPDX-License-Identifier: Apache-2.0
"""Can this node build pods? Tried, not looked up: in a throwaway network namespace (a
child process's own, gone when it exits), the links podnetd makes, with the netlink
requests podnetd sends (`podnet.kernel.nl`): a bridge, a veth pair with one end in it and
a VXLAN device in it, each brought up. Built in or a module makes no difference; a
module the kernel cannot load, a missing capability (CAP_NET_ADMIN, CAP_SYS_ADMIN for the
namespace) or a kernel without the feature does (`podnet doctor`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import select
import time
from collections.abc import Callable
from pathlib import Path

from podnet.kernel import nl, nlquery, nlreq

CLONE_NEWNET = 0x40000000
#: what `probe()` reports, in order: the namespace, then each kind of link
CHECKS = ("netns", "bridge", "veth", "vxlan")
#: names inside the throwaway namespace (nothing else lives there)
_BRIDGE, _VETH, _PEER, _VXLAN = "pndbr", "pnda", "pndb", "pndvx"
_MTU = 1500


def _hint(kind: str, module: str, err: OSError) -> str:
    code = err.errno or 0
    if code in (errno.EOPNOTSUPP, errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT):
        why = f"the kernel cannot make one (module {module} not loadable, not built in)"
    elif code == errno.EPERM:
        why = "not permitted (CAP_NET_ADMIN missing?)"
    else:
        why = os.strerror(code) if code else str(err)
    return f"cannot create a {kind}: {why}"


def _index(sock: nl.Netlink, name: str) -> int:
    info = nlquery.links(sock).get(name)
    if info is None:
        raise OSError(errno.ENODEV, f"{name} missing after its creation")
    return int(info["index"])


def build(sock: nl.Netlink) -> dict[str, str]:
    """Makes and brings up each kind of link in the current network namespace; returns
    check -> "" (works) or why not. A failed bridge does not stop the others (they are
    then made without a master)."""
    out: dict[str, str] = {}
    master = 0
    try:
        sock.batch([nlreq.bridge(_BRIDGE, "02:70:6e:64:00:01", _MTU), *nlreq.host_link_up(_BRIDGE)])
        master = _index(sock, _BRIDGE)
        out["bridge"] = ""
    except OSError as e:
        out["bridge"] = _hint("bridge", "bridge", e)
    try:
        with Path("/proc/thread-self/ns/net").open("rb") as ns:
            sock.batch(
                [
                    nlreq.veth(_VETH, _PEER, ns.fileno(), _MTU, master, "02:70:6e:64:00:02"),
                    *nlreq.host_link_up(_VETH),
                    *nlreq.host_link_up(_PEER),
                ]
            )
        out["veth"] = ""
    except OSError as e:
        out["veth"] = _hint("veth pair", "veth", e)
    try:
        lo = _index(sock, "lo")
        sock.batch(
            [
                nlreq.vxlan(_VXLAN, 4242, "127.0.0.1", lo, 4789, _MTU - 50, master),
                *nlreq.host_link_up(_VXLAN),
            ]
        )
        out["vxlan"] = ""
    except OSError as e:
        out["vxlan"] = _hint("VXLAN device", "vxlan", e)
    return out


def _unshare_net() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _child(w: int, builder: Callable[[nl.Netlink], dict[str, str]]) -> None:
    result: dict[str, str]
    try:
        _unshare_net()
    except OSError as e:
        why = f"cannot make a network namespace: {e.strerror} (CAP_SYS_ADMIN missing?)"
        result = {"netns": why} | dict.fromkeys(CHECKS[1:], "not tried (no namespace)")
    else:
        try:
            with nl.Netlink() as sock:
                result = {"netns": ""} | builder(sock)
        except OSError as e:
            result = {"netns": ""} | dict.fromkeys(CHECKS[1:], f"netlink: {e}")
    os.write(w, json.dumps(result).encode())


def probe(
    timeout: float = 20.0, builder: Callable[[nl.Netlink], dict[str, str]] = build
) -> dict[str, str]:
    """Each of CHECKS -> "" (works) or why not, tried in a forked child's own network
    namespace, which the kernel removes with the child (and everything made in it)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            os.close(r)
            _child(w, builder)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    end = time.monotonic() + timeout
    try:
        while True:
            left = end - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, 9)
                return dict.fromkeys(CHECKS, f"no answer within {timeout:.0f} s")
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    try:
        got = json.loads(data)
    except ValueError:
        return dict.fromkeys(CHECKS, "the check's process failed")
    return {k: str(got.get(k, "not reported")) for k in CHECKS}
