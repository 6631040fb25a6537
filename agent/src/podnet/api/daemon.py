# SPDX-License-Identifier: Apache-2.0
"""podnetd: the node agent's entry point (systemd service `podnetd`)."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import logging
import os
import resource
import signal
import socket
import sys
import threading
from types import FrameType

from podnet import __version__, logs
from podnet.api.handlers import Handler
from podnet.api.metrics import start_metrics
from podnet.api.server import Limits, Server
from podnet.config import DEFAULT_CONFIG, ConfigError, NodeConfig
from podnet.node.agent import Agent
from podnet.state.store import EtcdRequestError, EtcdUnavailable

log = logging.getLogger("podnetd")


M_ARENA_MAX = -8


def limit_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives each thread that allocates its own malloc arena (up to 8 per CPU); a
    daemon of short-lived connection threads and a few workers only pays RSS for them
    (the Python heap is shared anyway). Best effort: other libcs are left alone."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(M_ARENA_MAX, arenas)
    except (OSError, AttributeError):
        pass


#: file descriptors podnetd needs beside its connections (etcd, netlink, namespaces, logs)
FD_MARGIN = 512


def raise_fd_limit(sockets: int) -> None:
    """The soft RLIMIT_NOFILE up to what the connection bounds need (in service and waiting,
    plus a margin), within the hard limit: systemd gives services a soft 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = sockets + FD_MARGIN
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))


def parser() -> argparse.ArgumentParser:
    """podnetd's options (docs/man/podnetd.8.md describes each)."""
    ap = argparse.ArgumentParser(prog="podnetd", description="podnet node agent")
    ap.add_argument("-c", "--config", default=DEFAULT_CONFIG, help="node configuration file")
    ap.add_argument(
        "--check-config", action="store_true", help="validate the configuration file and exit"
    )
    ap.add_argument("--version", action="version", version=f"podnetd {__version__}")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        cfg = NodeConfig.load(args.config)
    except ConfigError as e:
        logs.fatal(f"podnetd: configuration error: {e}")
        return 2
    if args.check_config:
        print(f"podnetd: {args.config}: ok")
        return 0
    logs.setup(cfg.log_level)
    limit_malloc_arenas()
    agent = Agent(cfg)
    try:
        agent.start()
    except ConfigError as e:
        logs.fatal(f"podnetd: configuration error: {e}")
        return 2
    except (EtcdUnavailable, EtcdRequestError) as e:
        logs.fatal(f"podnetd: etcd unavailable at start: {e}")
        return 3
    limits = Limits(
        cfg.read_timeout,
        cfg.max_connections,
        cfg.root_connections,
        cfg.max_connections_per_user,
        cfg.max_waiting_per_user,
        cfg.max_waiting,
        cfg.wait_timeout,
    )
    raise_fd_limit(cfg.max_connections + cfg.max_waiting)
    handler = Handler(agent)
    server = Server(handler, cfg.socket, limits)
    server.bind()
    if cfg.metrics:
        start_metrics(cfg.metrics, agent, handler)
    done = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        del frame
        log.info("signal %d: stopping (pods stay up)", signum)
        done.set()
        server.close()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("podnetd %s on %s: listening on %s", __version__, cfg.node, cfg.socket)
    _notify_ready()
    t = threading.Thread(target=server.serve_forever, name="server", daemon=True)
    t.start()
    done.wait()
    agent.shutdown()
    log.info("stopped")
    logging.shutdown()
    # The pods stay up and every record is in etcd or on disk: nothing is left to flush.
    # The interpreter's own exit would join the etcd pool's workers and gRPC's threads, and
    # one in a call to an unreachable etcd holds it for that call's timeout (a stop seen
    # to take over 15 s on a loaded node): the process ends here instead.
    os._exit(0)


def _notify_ready() -> None:
    """sd_notify READY=1 without libsystemd (Type=notify units)."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(b"READY=1", addr)


if __name__ == "__main__":
    sys.exit(main())
