# SPDX-License-Identifier: Apache-2.0
"""`podnet`: pods, status and health of this node's podnet.

For users: `podnet pods` (your pods on this node, their names and addresses; `*` marks the
one you are in), `podnet status` (the node, your pods here and your quotas), `publish`,
`unpublish`, `published`. For administrators (root): the same for every user, `doctor`,
`verify`. A podnetd that is not running gives one line naming the socket and what to do
next, never a traceback.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from podnet import __version__
from podnet.api import client
from podnet.api.client import DEFAULT_SOCKET, ApiError
from podnet.cli import cluster, verify
from podnet.config import DEFAULT_CONFIG, ConfigError, NodeConfig
from podnet.kernel import capability, nl, nlquery
from podnet.names import Keys, ip_of_mac, is_veth_name
from podnet.state.clusterview import ClusterView
from podnet.state.store import Etcd, EtcdRequestError, EtcdUnavailable


def _print(data: Any, as_json: bool, text: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=True) if as_json else text)


class Unreachable(Exception):
    """podnetd could not be asked: one line for the user, with the next step."""


def not_reachable(sock: str, err: OSError) -> str:
    """What to tell a user whose `podnet` could not talk to podnetd at `sock`."""
    code = err.errno
    if isinstance(err, TimeoutError) or code == errno.ETIMEDOUT:
        return (
            f"podnetd at {sock} did not answer in time (busy or stuck): try again in a "
            "minute; if it persists, ask your administrators (`podnet doctor` as root)"
        )
    if code in (errno.ENOENT, errno.ENOTDIR):
        why = f"no {sock}"
    elif code == errno.ECONNREFUSED:
        why = f"nothing listens on {sock}"
    elif code in (errno.EACCES, errno.EPERM):
        return f"cannot connect to podnetd at {sock}: permission denied"
    else:
        return f"cannot reach podnetd at {sock}: {err.strerror or err}"
    return (
        f"podnetd is not running on this node ({why}): ask your administrators, or "
        "`systemctl status podnetd` as root"
    )


def call(op: str, sock: str, **kw: Any) -> dict[str, Any]:
    """One request to podnetd; a socket that cannot be used raises Unreachable, an error
    reply ApiError."""
    try:
        return client.call(op, sock, **kw)
    except OSError as e:
        raise Unreachable(not_reachable(sock, e)) from None
    except ValueError:  # not JSON: not podnetd
        raise Unreachable(f"{sock} answered something that is not podnetd's reply") from None


def _here() -> tuple[int, int] | None:
    """The network namespace this process is in (nsfs device and inode)."""
    try:
        st = Path("/proc/self/ns/net").stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _is_here(pod: dict[str, Any], here: tuple[int, int] | None) -> bool:
    """Whether `pod`'s network namespace is `here` (its file names the namespace)."""
    if here is None or not isinstance(pod.get("netns"), str):
        return False
    try:
        st = Path(pod["netns"]).stat()
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == here


def pods_text(pods: list[dict[str, Any]], here: tuple[int, int] | None) -> str:
    """The pods as a table; `*` marks the one this process is in."""
    lines = [f"  {'KIND':9} {'POD':14} {'IP':16} {'USER':10} {'JOB':>8}  NAMES"]
    for p in sorted(pods, key=lambda p: p["name"]):
        mark = "*" if _is_here(p, here) else " "
        lines.append(
            f"{mark} {p['kind']:9} {p['name']:14} {p['ip']:16} {p['user']:10} "
            f"{p.get('job_id') or '-':>8}  {' '.join(p.get('names', []))}"
        )
    return "\n".join(lines)


def cmd_pods(args: argparse.Namespace) -> int:
    pods = call("pods", args.socket)["pods"]
    here = _here()
    for p in pods:
        p["here"] = _is_here(p, here)
    _print(pods, args.json, pods_text(pods, here))
    return 0


def my_pods_text(node: str, pods: list[dict[str, Any]], here: tuple[int, int] | None) -> str:
    """A user's pods on this node: what, its name, its address (status's view)."""
    if not pods:
        return f"your pods on {node}: none"
    lines = [f"your pods on {node} (name, address; * the one you are in):"]
    for p in sorted(pods, key=lambda p: p["name"]):
        mark = "*" if _is_here(p, here) else " "
        what = f"job {p['job_id']}" if p.get("job_id") else p["kind"]
        name = p.get("fqdn") or " ".join(p.get("names", [])) or p["name"]
        lines.append(f"{mark} {what:15} {name:40} {p['ip']}")
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    if args.cluster:
        return cmd_cluster(args)
    st = call("status", args.socket)
    st.pop("v", None)
    st.pop("ok", None)
    etcd = st["etcd"]
    etcd_text = f"ok, version {etcd.get('version')}" if etcd.get("ok") else etcd.get("error")
    text = (
        f"node {st['node']} (cluster {st['cluster']}), podnetd {st['version']}\n"
        f"etcd: {etcd_text}\n"
        f"pods: {st['pods']}, users: {st['users']}"
    )
    if os.geteuid() != 0 and not args.user:
        # a user's own pods here (root: `podnet pods` lists every user's)
        mine = call("pods", args.socket)["pods"]
        st["my_pods"] = mine
        text += "\n" + my_pods_text(st["node"], mine, _here())
    try:
        extra = {"user": args.user} if args.user else {}
        st["quota"] = call("quota", args.socket, **extra)["quota"]
        text += "\n" + quota_text(st["quota"])
    except ApiError as e:
        if args.user:
            raise
        text += f"\nquotas: not shown ({e.message})"
    _print(st, args.json, text)
    return 0 if etcd.get("ok") else 1


def cmd_cluster(args: argparse.Namespace) -> int:
    """`status --cluster`: every node, etcd, the pool, from etcd (cli/cluster.py)."""
    if os.geteuid() != 0:
        print("podnet: status --cluster reads etcd with the node's credentials: run it as root",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        cfg = NodeConfig.load(args.config)
        keys = Keys(cfg.cluster)
        etcd = Etcd.of_node(cfg)

        def status_of(ep: str) -> dict[str, Any]:
            one = Etcd.of_node(cfg, [ep])
            try:
                return one.status()
            finally:
                one.close()

        try:
            rep = cluster.report(cluster.read(etcd, keys, cfg.etcd_endpoints, status_of))
        finally:
            etcd.close()
    except ConfigError as e:
        print(f"podnet: {e}", file=sys.stderr)
        return 2
    except (EtcdUnavailable, EtcdRequestError) as e:
        print(f"podnet: etcd: {e}", file=sys.stderr)
        return 1
    _print(rep, args.json, cluster.text(rep))
    return 0 if rep["ok"] else 1


def quota_text(q: dict[str, Any]) -> str:
    """A user's usage against each quota (docs/user-guide.md, "Quotas")."""
    if not q.get("limited"):
        return f"quotas: {q.get('user')} is not limited (root, agent_host_users)"
    rows = [
        (f"{r['label']}{' (' + r['node'] + ')' if r.get('node') else ''}", r["held"], r["value"])
        for r in q.get("limits", [])
    ]
    width = max((len(label) for label, _h, _v in rows), default=0)
    lines = [f"quotas of {q.get('user')} (held / limit):"]
    for label, held, value in rows:
        mark = "  at the limit" if held >= value else ""
        lines.append(f"  {label:{width}}  {held:>5} / {value}{mark}")
    return "\n".join(lines)


def _target(text: str) -> tuple[str, int]:
    """`<job>[/pod<n>]` -> (job, n): a job id or one of your job names."""
    job, _sep, pod = text.partition("/")
    if not pod:
        return job, 0
    if not pod.startswith("pod") or not pod[3:].isdigit():
        raise SystemExit(f"podnet: {text!r}: expected <job>[/pod<n>]")
    return job, int(pod[3:])


def cmd_publish(args: argparse.Namespace) -> int:
    job, pod = _target(args.target)
    rec = call("publish", args.socket, job=job, pod=pod, port=args.port)["published"]
    _print(rec, args.json, rec["address"])
    return 0


def cmd_unpublish(args: argparse.Namespace) -> int:
    job, pod = _target(args.target)
    n = call("unpublish", args.socket, job=job, pod=pod, port=args.port)["removed"]
    _print({"removed": n}, args.json, f"unpublished ({n})" if n else "was not published")
    return 0


def cmd_published(args: argparse.Namespace) -> int:
    recs = call("published", args.socket)["published"]
    lines = [f"{'ADDRESS':22} {'USER':10} {'JOB':>8} {'POD':>4}  TARGET"]
    for r in recs:
        target = f"{r['ip']}:{r['port']}"
        lines.append(f"{r['address']:22} {r['user']:10} {r['job_id']:>8} {r['pod']:>4}  {target}")
    _print(recs, args.json, "\n".join(lines))
    return 0


def _check(name: str, ok: bool, detail: str) -> dict[str, Any]:
    return {"check": name, "ok": ok, "detail": detail}


def cmd_doctor(args: argparse.Namespace) -> int:
    checks: list[dict[str, Any]] = []
    try:
        cfg = NodeConfig.load(args.config)
        checks.append(_check("config", True, args.config))
        sock = cfg.socket if args.socket == DEFAULT_SOCKET else args.socket
    except ConfigError as e:
        checks.append(_check("config", False, str(e)))
        cfg, sock = None, args.socket
    checks += _kernel_checks()
    try:
        st = call("status", sock, timeout=10)
        checks.append(_check("socket", True, sock))
        etcd = st["etcd"]
        checks.append(
            _check("etcd", bool(etcd.get("ok")), str(etcd.get("version") or etcd.get("error")))
        )
    except (Unreachable, ApiError) as e:
        checks.append(_check("socket", False, f"{sock}: {e}"))
    if cfg is not None and os.geteuid() == 0:
        checks += _fdb_drift(cfg)
        checks.append(_host_addresses())
    ok = all(c["ok"] for c in checks)
    text = "\n".join(
        f"{'skip' if c.get('skipped') else 'ok  ' if c['ok'] else 'FAIL'} {c['check']}: "
        f"{c['detail']}"
        for c in checks
    )
    _print({"ok": ok, "checks": checks}, args.json, text)
    return 0 if ok else 1


def _kernel_checks(
    probe: Callable[[], dict[str, str]] = capability.probe, root: bool | None = None
) -> list[dict[str, Any]]:
    """What podnetd builds, built for real in a throwaway network namespace (as root)."""
    if not (os.geteuid() == 0 if root is None else root):
        return [
            {**_check(f"kernel:{k}", True, "not checked (needs root)"), "skipped": True}
            for k in capability.CHECKS
        ]
    done = {
        "netns": "made one",
        "bridge": "created and up",
        "veth": "created, in the bridge, up",
        "vxlan": "created, in the bridge, up",
    }
    return [
        _check(f"kernel:{k}", not err, err or f"{done[k]} (throwaway network namespace)")
        for k, err in probe().items()
    ]


def _host_addresses() -> dict[str, Any]:
    """podnet's host-side links carry no address (MPI and friends would pick it up)."""
    try:
        with nl.Netlink() as sock:
            names = {
                int(v["index"]): k
                for k, v in nlquery.links(sock).items()
                if k.startswith(("pnbr", "pnvx")) or is_veth_name(k)
            }
            found = sorted(
                f"{names[i]} {ip}" for i, _f, ip, _p in nlquery.addresses(sock) if i in names
            )
    except OSError as e:
        return _check("host-addresses", False, str(e))
    if found:
        return _check(
            "host-addresses", False, f"on podnet links (restart podnetd): {', '.join(found)}"
        )
    return _check("host-addresses", True, "podnet links carry no address")


def _fdb_drift(cfg: NodeConfig) -> list[dict[str, Any]]:
    """Each local user VXLAN: made to ask for remote pods (`l3miss`, not an older podnetd's
    flooding device), and each remote pod it has met sent to the node that owns the pod's
    block, at its registered address (what podnetd's overlay resolves: node/overlay.py)."""
    out = []
    try:
        view = ClusterView.load(Etcd.of_node(cfg), Keys(cfg.cluster), cfg.node)
        with nl.Netlink() as sock:
            for name, info in nlquery.links(sock).items():
                if info["kind"] != "vxlan" or not name.startswith("pnvx"):
                    continue
                flood, unicast = nlquery.fdb_entries(sock, int(info["index"]))
                wrong = sorted(
                    f"{ip} -> {dst} (owner: {view.vtep_of(ip) or 'none'})"
                    for mac, dst in unicast.items()
                    if (ip := ip_of_mac(mac)) is not None and view.vtep_of(ip) != dst
                )
                problems = []
                if not info.get("l3miss"):
                    problems.append("made by an older podnetd (restart podnetd)")
                if flood:
                    problems.append(f"floods to {sorted(flood)}")
                if wrong:
                    problems.append(f"sends to the wrong node: {', '.join(wrong)}")
                detail = "; ".join(problems) or f"in sync ({len(unicast)} remote pods met)"
                out.append(_check(f"fdb:{name}", not problems, detail))
    except (EtcdUnavailable, EtcdRequestError, OSError, ConfigError) as e:
        out.append(_check("fdb", False, str(e)))
    return out


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "pods": cmd_pods,
    "status": cmd_status,
    "doctor": cmd_doctor,
    "publish": cmd_publish,
    "unpublish": cmd_unpublish,
    "published": cmd_published,
    "verify": verify.cmd_verify,
}

EPILOG = """\
Your pods: each job of yours has a pod (a network namespace) on each of its nodes, named
pod<n>.<job id>.<user>.<cluster>; your login sessions are in your login pod. In a task,
PODNET_POD_NAME, PODNET_POD_IP and PODNET_JOB_DOMAIN say which pod it runs in.
`podnet <command> --help` describes a command; podnet's user guide (docs/user-guide.md)
the rest."""


def parser() -> argparse.ArgumentParser:
    # the options are accepted before and after the command (`podnet --json pods`,
    # `podnet pods --json`); SUPPRESS keeps a later default from hiding an earlier value
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--socket",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help=f"podnetd's socket on this node (default {DEFAULT_SOCKET})",
    )
    common.add_argument(
        "--config",
        default=argparse.SUPPRESS,
        metavar="FILE",
        help=f"the node's podnet configuration, read by doctor and verify (default "
        f"{DEFAULT_CONFIG})",
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="machine-readable output (JSON) instead of text",
    )
    ap = argparse.ArgumentParser(
        prog="podnet",
        description="podnet on this node: your pods, their names and addresses, your\n"
        "quotas; for administrators, health checks and isolation proofs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    ap.add_argument("--version", action="version", version=f"podnet {__version__}")
    sub = ap.add_subparsers(dest="cmd", title="commands", metavar="<command>")
    sub.add_parser(
        "pods",
        parents=[common],
        help="your pods on this node: names, addresses, jobs (root: every pod of the node)",
    )
    st = sub.add_parser(
        "status",
        parents=[common],
        help="the node and podnetd, your pods here, and your usage against each quota",
    )
    st.add_argument("--user", default="", metavar="NAME", help="root: that user's quotas")
    st.add_argument(
        "--cluster",
        action="store_true",
        help="root: every node's podnetd, etcd, the address pool and the top users, from "
        "etcd (exit 1 when something is wrong)",
    )
    sub.add_parser(
        "doctor",
        parents=[common],
        help="health checks (etcd, kernel, socket, FDB drift, host addresses)",
    )
    for verb, what in (("publish", "publish"), ("unpublish", "stop publishing")):
        p = sub.add_parser(
            verb,
            parents=[common],
            help=f"{what} a TCP port of one of your pods on the gateway's external address",
        )
        p.add_argument("target", help="<job>[/pod<n>]: a job id or name, pod index (0)")
        p.add_argument("port", type=int, help="TCP port in the pod")
    sub.add_parser("published", parents=[common], help="your published ports (root: all)")
    verify.add_parser(sub, [common])
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.cmd is None:
        ap.print_help()
        return 2
    for key, default in (("socket", DEFAULT_SOCKET), ("config", DEFAULT_CONFIG), ("json", False)):
        if not hasattr(args, key):
            setattr(args, key, default)
    try:
        return COMMANDS[args.cmd](args)
    except ApiError as e:
        print(f"podnet: {e}", file=sys.stderr)
        return 1
    except Unreachable as e:
        print(f"podnet: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the commands' own files (verify's, doctor's)
        where = f"{e.filename}: " if e.filename else ""
        print(f"podnet: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
