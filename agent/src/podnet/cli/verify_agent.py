# SPDX-License-Identifier: Apache-2.0
"""The probe `podnet verify` runs in each endpoint (a job pod, a login pod, a container, a
node's host network, a host outside the cluster): standard library only, shipped as its
own source (`python3 -u -c SOURCE ARGS`), so it runs wherever a python3 is.

It listens on a TCP and a UDP port and logs every token that arrives; it probes what the
controller asks (TCP connect + token, UDP datagrams with the token, ICMP echo with the
token) and answers on stdout, one JSON object per line. It exits when its stdin closes
(the controller ended, however it ended) or on {"op": "quit"}.

ARGS: one JSON object: `port` (0: any), `fsuid`/`fsgid` (run as root, make every socket
the user's: setfsuid(2) around socket(2), which is what the kernel, and podnet's host
filter, know of a socket's owner), `tag` (marks the process for the controller's clean-up).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import select
import socket
import struct
import sys
import threading
import time
from typing import Any

#: the command line's JSON (main() reads it; importing this module runs nothing)
ARGS: dict[str, Any] = {}
_libc = ctypes.CDLL(None, use_errno=True)
_arrivals: list[dict[str, str]] = []
_lock = threading.Lock()
_out = threading.Lock()


def emit(obj: dict[str, Any]) -> None:
    with _out:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def mksock(family: int, kind: int, proto: int = 0) -> socket.socket:
    """A socket owned by `fsuid` (this thread's filesystem ids for the call only)."""
    uid, gid = ARGS.get("fsuid"), ARGS.get("fsgid")
    if uid is None:
        return socket.socket(family, kind, proto)
    _libc.setfsgid(int(gid if gid is not None else uid))
    _libc.setfsuid(int(uid))
    try:
        if int(_libc.setfsuid(-1)) != int(uid):  # -1 only reads it back
            raise OSError("setfsuid failed")
        return socket.socket(family, kind, proto)
    finally:
        _libc.setfsuid(0)
        _libc.setfsgid(0)


def addresses() -> list[str]:
    """IPv4 addresses of this network namespace's interfaces, loopback left out."""
    out = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _i, name in socket.if_nameindex():
            req = struct.pack("256s", name.encode()[:15])
            try:
                res = fcntl.ioctl(s.fileno(), 0x8915, req)  # SIOCGIFADDR
            except OSError:
                continue
            ip = socket.inet_ntoa(res[20:24])
            if not ip.startswith("127."):
                out.append(ip)
    return out


def note(proto: str, token: str, src: str) -> None:
    with _lock:
        _arrivals.append({"proto": proto, "token": token, "src": src})


def serve_tcp(t: socket.socket) -> None:
    while True:
        c, a = t.accept()
        threading.Thread(target=read_token, args=(c, a[0]), daemon=True).start()


def read_token(c: socket.socket, src: str) -> None:
    with c:
        c.settimeout(5)
        data = b""
        with contextlib.suppress(OSError):
            while b"\n" not in data and len(data) < 256:
                chunk = c.recv(256)
                if not chunk:
                    break
                data += chunk
        note("tcp", data.decode(errors="replace").strip(), src)


def serve_udp(u: socket.socket) -> None:
    while True:
        data, a = u.recvfrom(512)
        note("udp", data.decode(errors="replace").strip(), a[0])


def probe_tcp(ip: str, port: int, token: str, timeout: float) -> dict[str, Any]:
    s = mksock(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect((ip, port))
        s.sendall(token.encode() + b"\n")
        return {"ok": True, "err": ""}
    except OSError as e:
        return {"ok": False, "err": e.strerror or str(e)}
    finally:
        s.close()


def probe_udp(ip: str, port: int, token: str, timeout: float) -> dict[str, Any]:
    """Datagrams only: whether one arrived, the other end says."""
    s = mksock(socket.AF_INET, socket.SOCK_DGRAM)
    err = ""
    try:
        for _attempt in range(3):
            try:
                s.sendto(token.encode(), (ip, port))
            except OSError as e:
                err = e.strerror or str(e)
            time.sleep(min(0.2, timeout / 3))
    finally:
        s.close()
    return {"ok": None, "err": err}


def _csum(b: bytes) -> int:
    if len(b) % 2:
        b += b"\0"
    s: int = sum(struct.unpack(f"!{len(b) // 2}H", b))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


def probe_icmp(ip: str, token: str, timeout: float) -> dict[str, Any]:
    """An echo request carrying the token; reachable when its reply comes back."""
    raw = False
    try:
        s = mksock(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    except OSError:
        try:
            s = mksock(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
            raw = True
        except OSError as e:
            return {"ok": False, "err": f"no ICMP socket: {e.strerror or e}", "untested": True}
    ident = os.getpid() & 0xFFFF
    payload = token.encode()
    try:
        end = time.monotonic() + timeout
        for seq in (1, 2):
            hdr = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
            pkt = hdr[:2] + struct.pack("!H", _csum(hdr + payload)) + hdr[4:] + payload
            try:
                s.sendto(pkt, (ip, 0))
            except OSError as e:
                return {"ok": False, "err": e.strerror or str(e)}
            wait_until = min(end, time.monotonic() + timeout / 2)
            while time.monotonic() < wait_until:
                ready = select.select([s], [], [], max(0.0, wait_until - time.monotonic()))[0]
                if not ready:
                    break
                data, a = s.recvfrom(2048)
                if raw:
                    data = data[(data[0] & 0x0F) * 4 :]
                if a[0] == ip and data[:1] == b"\0" and payload in data[8:]:
                    return {"ok": True, "err": ""}
        return {"ok": False, "err": "no echo reply"}
    finally:
        s.close()


def probe(reqs: list[dict[str, Any]], timeout: float) -> dict[str, Any]:
    results: dict[str, Any] = {}

    def one(r: dict[str, Any]) -> None:
        if r["proto"] == "tcp":
            res = probe_tcp(r["ip"], int(r["port"]), r["token"], timeout)
        elif r["proto"] == "udp":
            res = probe_udp(r["ip"], int(r["port"]), r["token"], timeout)
        else:
            res = probe_icmp(r["ip"], r["token"], timeout)
        results[str(r["id"])] = res

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in reqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    return results


def main() -> None:
    ARGS.update(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})
    port = int(ARGS.get("port") or 0)
    t = mksock(socket.AF_INET, socket.SOCK_STREAM)
    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.bind(("0.0.0.0", port))  # noqa: S104 - every address of the endpoint is probed
    t.listen(128)
    u = mksock(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("0.0.0.0", port))  # noqa: S104
    threading.Thread(target=serve_tcp, args=(t,), daemon=True).start()
    threading.Thread(target=serve_udp, args=(u,), daemon=True).start()
    emit(
        {
            "op": "ready",
            "addrs": addresses(),
            "tcp": t.getsockname()[1],
            "udp": u.getsockname()[1],
            "uid": os.getuid(),
        }
    )
    for line in sys.stdin:
        try:
            cmd = json.loads(line)
        except ValueError:
            continue
        op = cmd.get("op")
        if op == "probe":
            emit({"op": "probe", "results": probe(cmd["targets"], float(cmd["timeout"]))})
        elif op == "arrivals":
            with _lock:
                got = list(_arrivals)
            emit({"op": "arrivals", "arrivals": got})
        elif op == "quit":
            break


if __name__ == "__main__":
    main()
