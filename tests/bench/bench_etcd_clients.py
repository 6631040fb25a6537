#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""CPU per request of etcd clients, on both sides, against one real etcd on loopback
(docs/dependencies.md, "etcd client": the measurement behind podnet's choice).

The etcd runs as the lab deploys it: TLS, client certificates (`--client-cert-auth`), and
either gRPC and HTTP on one port (etcd's default, `mixed`) or the JSON gateway on a port of
its own (`--listen-client-http-urls`, `split`: gRPC then gets etcd's native gRPC server).
Each candidate runs in a process of its own (its own Python and packages), one after the
other, in rounds (`PODNET_CLIENTS_ROUNDS`), so every candidate sees the machine in the same
state; each sends `PODNET_CLIENTS_N` requests of each kind, one at a time:

* `get`: a linearizable read of one key;
* `put`: one key;
* `txn`: a compare on a value and three puts (what a node sends when it publishes a pod);
* `watch`: receiving one event (another process puts keys one by one).

and reports the CPU it used and the CPU etcd used meanwhile (schedstat of every thread), per
request. The median over the rounds is printed (`NAME VALUE UNIT`) and written to
build/bench/etcd-clients.json.

Candidates (`PODNET_CLIENTS`, default all that import):
* `json`: podnet's store before issue 23 (etcd's v3 JSON gateway over http.client), taken
  from git (`PODNET_CLIENTS_JSON_REV`);
* `grpc`: podnet's store (grpcio, messages from etcd's .proto files);
* `pyetcd`: etcd-sdk-python (the maintained fork of python-etcd3), from the venv at
  `PODNET_CLIENTS_PYETCD_PY` (its python);
* `etcd3`: python-etcd3 0.12 from `PODNET_CLIENTS_ETCD3_PY`, which imports with protobuf
  >= 4 only with the pure-Python protobuf (PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python).
Candidates whose interpreter is not given are skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "agent/src"))

from podnet.state.store import Etcd  # noqa: E402

ETCD = os.environ.get("PODNET_BENCH_ETCD", "/usr/bin/etcd")
N = int(os.environ.get("PODNET_CLIENTS_N", "1000"))
ROUNDS = int(os.environ.get("PODNET_CLIENTS_ROUNDS", "3"))
JSON_REV = os.environ.get("PODNET_CLIENTS_JSON_REV", "13f37bf")
WANTED = os.environ.get("PODNET_CLIENTS", "json,grpc,pyetcd,etcd3").split(",")
MODES = os.environ.get("PODNET_CLIENTS_MODES", "mixed,split").split(",")
OUT = ROOT / "build/bench"


def log(msg: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pki(d: Path) -> None:
    """A CA, etcd's server certificate and a client certificate (CN bench), EC P-256 as
    the etcd role issues them."""

    def run(*a: str) -> None:
        subprocess.run(a, cwd=d, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run(
        "openssl",
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=bench-ca",
    )
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        (d / f"{name}.ext").write_text(ext + "\n")
        run(
            "openssl",
            "req",
            *ec,
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={'etcd' if name == 'server' else 'bench'}",
        )
        run(
            "openssl",
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.crt",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
        )


# -- the candidates (run in their own process: the code below is sent as a script) ----------
CANDIDATE = textwrap.dedent(
    r"""
    import json, os, resource, sys, threading, time
    kind, grpc_url, http_url, pki, etcd_pid, n = sys.argv[1:7]
    etcd_pid, n = int(etcd_pid), int(n)
    ca, cert, key = (f"{pki}/{f}" for f in ("ca.crt", "client.crt", "client.key"))

    def etcd_cpu():
        t = 0
        for tid in os.listdir(f"/proc/{etcd_pid}/task"):
            try:
                with open(f"/proc/{etcd_pid}/task/{tid}/schedstat") as f:
                    t += int(f.read().split()[0])
            except OSError:
                pass
        return t / 1e9

    def own_cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    if kind in ("json", "grpc"):
        if kind == "json":  # the JSON client (JSON_REV): one store.py
            sys.path.insert(0, os.environ["CAND_PATH"])
            from store import Etcd, cmp_value, op_put
        else:
            from podnet.state.etcdops import cmp_value, op_put
            from podnet.state.store import Etcd
        c = Etcd([http_url if kind == "json" else grpc_url], ca, cert, key, 10.0)
        get = lambda k: c.get(k)
        put = lambda k, v: c.put(k, v)
        def txn(k, v):
            puts = [op_put(k + "/a", v), op_put(k + "/b", v), op_put(k + "/c", v)]
            r = c.txn([cmp_value(k + "/owner", "o")], puts)
            assert r.succeeded
        def watch(prefix, count, ready):
            got = threading.Event(); seen = [0]
            def cb(kind, key, kv):
                seen[0] += 1
                if seen[0] >= count:
                    got.set()
            rev = c.get_prefix(prefix, keys_only=True)[1]
            c.watch_prefix(prefix, rev, cb, lambda: rev, threading.Event())
            time.sleep(0.5)
            ready()
            got.wait(120)
            return seen[0]
    else:  # pyetcd (etcd-sdk-python) and python-etcd3 share one API
        import urllib.parse
        if kind == "pyetcd":
            import pyetcd as mod
        else:
            import etcd3 as mod
        u = urllib.parse.urlsplit(grpc_url)
        c = mod.client(u.hostname, u.port, ca_cert=ca, cert_key=key, cert_cert=cert, timeout=10)
        get = lambda k: c.get(k)
        put = lambda k, v: c.put(k, v)
        def txn(k, v):
            t = c.transactions
            ok, _ = c.transaction(
                compare=[t.value(k + "/owner") == "o"],
                success=[t.put(k + "/a", v), t.put(k + "/b", v), t.put(k + "/c", v)],
                failure=[])
            assert ok
        def watch(prefix, count, ready):
            events, cancel = c.watch_prefix(prefix)
            time.sleep(0.5)
            ready()
            seen = 0
            for _ in events:
                seen += 1
                if seen >= count:
                    break
            cancel()
            return seen

    base = f"/bench/{kind}/{os.getpid()}"
    put(base + "/txn/owner", "o")
    value = json.dumps({"host": "198.18.1.2", "ttl": 30})
    for i in range(100):  # warm up: connections, caches
        get(base + "/k"); put(base + "/k", value); txn(base + "/txn", value)
    out = {}
    for what, fn in (("get", lambda i: get(base + "/k")),
                     ("put", lambda i: put(base + f"/p{i % 50}", value)),
                     ("txn", lambda i: txn(base + "/txn", value))):
        e0, c0, t0 = etcd_cpu(), own_cpu(), time.perf_counter()
        for i in range(n):
            fn(i)
        out[what] = {"client_ms": (own_cpu() - c0) * 1000 / n,
                     "etcd_ms": (etcd_cpu() - e0) * 1000 / n,
                     "wall_ms": (time.perf_counter() - t0) * 1000 / n}
    # watch: the parent puts n keys after our "ready" line; we count their events
    marks = {}
    def ready():
        marks["c0"] = own_cpu()
        print("ready", flush=True)
    got = watch(f"/bench/watch/{kind}/", n, ready)
    out["watch"] = {"client_ms": (own_cpu() - marks["c0"]) * 1000 / n, "events": got}
    print(json.dumps(out), flush=True)
    os._exit(0)
    """
)


def candidates(tmp: Path) -> dict[str, tuple[str, dict[str, str]]]:
    """name -> (python, extra environment)"""
    have: dict[str, tuple[str, dict[str, str]]] = {}
    venv_py = (
        str(ROOT / ".venv/bin/python") if (ROOT / ".venv/bin/python").exists() else sys.executable
    )
    if "json" in WANTED:
        d = tmp / "json"
        d.mkdir()
        src = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{JSON_REV}:agent/src/podnet/state/store.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (d / "store.py").write_text(src)
        have["json"] = (venv_py, {"CAND_PATH": str(d)})
    if "grpc" in WANTED:
        have["grpc"] = (
            venv_py,
            {"PYTHONPATH": str(ROOT / "agent/src")},
        )
    for name, var, env in (
        ("pyetcd", "PODNET_CLIENTS_PYETCD_PY", {}),
        ("etcd3", "PODNET_CLIENTS_ETCD3_PY", {"PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}),
    ):
        if name in WANTED and os.environ.get(var):
            have[name] = (os.environ[var], env)
    return have


class EtcdProc:
    def __init__(self, d: Path, mode: str) -> None:
        self.dir = d
        port, peer, http = free_port(), free_port(), free_port()
        self.grpc_url = f"https://127.0.0.1:{port}"
        self.http_url = f"https://127.0.0.1:{http}" if mode == "split" else self.grpc_url
        args = [
            ETCD,
            "--name=clients",
            f"--data-dir={d / 'data'}",
            f"--listen-client-urls={self.grpc_url}",
            f"--advertise-client-urls={self.grpc_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=clients=http://127.0.0.1:{peer}",
            f"--cert-file={d / 'server.crt'}",
            f"--key-file={d / 'server.key'}",
            f"--trusted-ca-file={d / 'ca.crt'}",
            "--client-cert-auth",
            "--log-level=warn",
        ]
        if mode == "split":
            args.append(f"--listen-client-http-urls={self.http_url}")
        self.log = open(d / f"etcd-{mode}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        time.sleep(1.5)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(15)
        self.log.close()
        shutil.rmtree(self.dir / "data", ignore_errors=True)


def run_one(
    name: str, py: str, env: dict[str, str], e: EtcdProc, pki_dir: Path, feeder: Any
) -> dict[str, Any]:
    p = subprocess.Popen(
        [py, "-c", CANDIDATE, name, e.grpc_url, e.http_url, str(pki_dir), str(e.proc.pid), str(N)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    if line.strip() != "ready":
        p.wait(30)
        raise RuntimeError(f"{name}: {line!r}")
    for i in range(N):
        feeder.put(f"/bench/watch/{name}/{i % 50}", f"v{i}")
    out = json.loads(p.stdout.readline())
    p.wait(30)
    if out["watch"]["events"] < N:
        raise RuntimeError(f"{name}: {out['watch']['events']} of {N} watch events")
    return dict(out)


def main() -> int:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="pbclients-") as t:
        tmp = Path(t)
        pki(tmp)
        cands = candidates(tmp)
        log(f"candidates: {', '.join(cands)}; {N} requests of each kind, {ROUNDS} rounds")
        for mode in MODES:
            e = EtcdProc(tmp, mode)
            feeder = Etcd(
                [e.grpc_url],
                str(tmp / "ca.crt"),
                str(tmp / "client.crt"),
                str(tmp / "client.key"),
                10.0,
            )
            runs: dict[str, list[dict[str, Any]]] = {c: [] for c in cands}
            try:
                for r in range(ROUNDS):
                    for name, (py, env) in cands.items():
                        try:
                            runs[name].append(run_one(name, py, env, e, tmp, feeder))
                        except Exception as ex:  # a candidate that fails is reported, not fatal
                            log(f"{mode} round {r}: {name} failed: {ex}")
                    log(f"{mode}: round {r + 1} of {ROUNDS} done")
            finally:
                feeder.close()
                e.close()
            for name, rs in runs.items():
                if not rs:
                    continue
                res: dict[str, Any] = {}
                for what in ("get", "put", "txn", "watch"):
                    for side in ("client_ms", "etcd_ms", "wall_ms"):
                        vals = [x[what][side] for x in rs if side in x[what]]
                        if vals:
                            res.setdefault(what, {})[side] = round(statistics.median(vals), 4)
                results[f"{mode}/{name}"] = res
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "etcd-clients.json").write_text(json.dumps(results, indent=2) + "\n")
    for key, res in results.items():
        mode, name = key.split("/")
        for what, sides in res.items():
            for side, v in sides.items():
                print(f"etcd_client_{what}_{side.removesuffix('_ms')}_ms_{name}_{mode} {v} ms")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
