# SPDX-License-Identifier: Apache-2.0
"""A real 3-member etcd cluster on loopback with TLS and client-cert auth, for module tests.

Uses etcd 3.5 (trixie's, unpacked by `make artifacts`; what the lab and sites run) when it
is there, else the host's /usr/bin/etcd (3.4 on the dev machine); PODNET_TEST_ETCD overrides.
A throwaway CA and certificates are made with `cryptography`; ports are picked free; data
dirs live in pytest's tmp dir. Every process started here is stopped by pid at the end.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# etcd 3.5 (what the lab and sites run: auth/status, the gateway's auth behaviour) when
# `make artifacts` unpacked trixie's, else the host's.
_ETCD_35 = Path(os.environ.get("PODNET_CACHE_DIR", "/var/cache/podnet-dev")) / (
    "artifacts/etcd-server/usr/bin/etcd"
)
ETCD = os.environ.get("PODNET_TEST_ETCD", str(_ETCD_35) if _ETCD_35.exists() else "/usr/bin/etcd")
ETCDCTL = os.environ.get("PODNET_TEST_ETCDCTL", "/usr/bin/etcdctl")
# Client certificates made besides admin: common names = etcd user names (auth tests).
CLIENT_NAMES = ("root", "coredns", "podnetd-n1", "podnetd-n2")
GATEWAY_NAMES = (*CLIENT_NAMES, "gateway")
REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- PKI ------------------------------------------------------------------------------
def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def make_pki(d: Path) -> dict[str, Path]:
    d.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "podnet-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), True
        )
        .sign(ca_key, hashes.SHA256())
    )
    (d / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_key(d / "ca.key", ca_key)

    def issue(name: str, server: bool, cn: bool = True) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)] if cn else [])
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                    if server
                    else [ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    ]
                ),
                critical=False,
            )
        cert = builder.sign(ca_key, hashes.SHA256())
        (d / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(d / f"{name}.key", key)

    issue("server", server=True)
    issue("admin", server=False)
    for name in CLIENT_NAMES:
        issue(name, server=False)
    # no common name: what etcd's JSON gateway accepts once authentication is on (with a login)
    issue("gateway", server=False, cn=False)
    return {
        **{f"{name}_cert": d / f"{name}.crt" for name in GATEWAY_NAMES},
        **{f"{name}_key": d / f"{name}.key" for name in GATEWAY_NAMES},
        "ca": d / "ca.crt",
        "server_cert": d / "server.crt",
        "server_key": d / "server.key",
        "admin_cert": d / "admin.crt",
        "admin_key": d / "admin.key",
    }


# -- cluster --------------------------------------------------------------------------
@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def client_url(self) -> str:
        return f"https://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"https://127.0.0.1:{self.peer_port}"


@dataclass
class EtcdCluster:
    base: Path
    pki: dict[str, Path]
    members: dict[str, Member] = field(default_factory=dict)
    cluster_token: str = "podnet-test"  # noqa: S105 (etcd --initial-cluster-token, not a secret)

    # ---- members
    def new_member(self, name: str) -> Member:
        m = Member(
            name=name,
            client_port=_free_port(),
            peer_port=_free_port(),
            data_dir=self.base / f"{name}.data",
            log=self.base / f"{name}.log",
        )
        self.members[name] = m
        return m

    def initial_cluster(self, names: list[str]) -> str:
        return ",".join(f"{n}={self.members[n].peer_url}" for n in names)

    def start(self, name: str, initial_cluster: str, state: str = "new") -> None:
        m = self.members[name]
        p = self.pki
        args = [
            ETCD,
            "--name", name,
            "--data-dir", str(m.data_dir),
            "--listen-client-urls", m.client_url,
            "--advertise-client-urls", m.client_url,
            "--listen-peer-urls", m.peer_url,
            "--initial-advertise-peer-urls", m.peer_url,
            "--initial-cluster", initial_cluster,
            "--initial-cluster-state", state,
            "--initial-cluster-token", self.cluster_token,
            "--cert-file", str(p["server_cert"]),
            "--key-file", str(p["server_key"]),
            "--trusted-ca-file", str(p["ca"]),
            "--client-cert-auth",
            "--peer-cert-file", str(p["server_cert"]),
            "--peer-key-file", str(p["server_key"]),
            "--peer-trusted-ca-file", str(p["ca"]),
            "--peer-client-cert-auth",
            "--max-txn-ops", "4096",
            "--max-request-bytes", "10485760",
            "--logger", "zap",
            "--heartbeat-interval", "50",
            "--election-timeout", "500",
        ]  # fmt: skip
        log = m.log.open("ab")
        m.proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        log.close()

    def stop(self, name: str) -> None:
        m = self.members[name]
        if m.proc is None:
            return
        if m.proc.poll() is None:
            m.proc.send_signal(signal.SIGTERM)
            try:
                m.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                m.proc.kill()
                m.proc.wait(timeout=10)
        m.proc = None

    def wipe(self, name: str) -> None:
        shutil.rmtree(self.members[name].data_dir, ignore_errors=True)

    # ---- direct HTTP (independent of the code under test)
    def _ctx(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki["ca"]))
        ctx.load_cert_chain(str(self.pki["admin_cert"]), str(self.pki["admin_key"]))
        return ctx

    def call(self, name: str, path: str, body: dict[str, Any], timeout: float = 3) -> Any:
        req = urllib.request.Request(  # noqa: S310 (https URL built here)
            f"{self.members[name].client_url}/v3/{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(  # noqa: S310
            req, context=self._ctx(), timeout=timeout
        ) as resp:
            return json.loads(resp.read())

    def healthy(self, name: str) -> bool:
        try:
            self.call(name, "kv/range", {"key": "aGVhbHRo"}, timeout=2)
        except (OSError, ValueError):
            return False
        return True

    def wait_healthy(self, names: list[str], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.healthy(n) for n in names):
                return
            for n in names:
                proc = self.members[n].proc
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(
                        f"etcd {n} exited: {self.members[n].log.read_text()[-3000:]}"
                    )
            time.sleep(0.2)
        raise TimeoutError(f"etcd members {names} not healthy after {timeout}s")

    def member_names(self) -> list[str]:
        first = next(n for n, m in self.members.items() if m.proc is not None)
        data = self.call(first, "cluster/member/list", {})
        return sorted(m.get("name", "") for m in data.get("members", []))

    def endpoints(self, names: list[str] | None = None) -> list[str]:
        return [
            m.client_url
            for n, m in self.members.items()
            if (names is None or n in names) and m.proc is not None
        ]

    def tls_args(self) -> dict[str, str]:
        return {
            "ca_cert": str(self.pki["ca"]),
            "client_cert": str(self.pki["admin_cert"]),
            "client_key": str(self.pki["admin_key"]),
        }


@pytest.fixture(scope="module")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    if not os.access(ETCD, os.X_OK):
        pytest.skip(f"{ETCD} not installed")
    base = tmp_path_factory.mktemp("etcd")
    cluster = EtcdCluster(base=base, pki=make_pki(base / "pki"))
    names = ["m1", "m2", "m3"]
    for n in names:
        cluster.new_member(n)
    initial = cluster.initial_cluster(names)
    try:
        for n in names:
            cluster.start(n, initial)
        cluster.wait_healthy(names)
        yield cluster
    finally:
        for n in list(cluster.members):
            cluster.stop(n)


# -- running the modules as real Ansible ------------------------------------------------
def ansible_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_DEPRECATION_WARNINGS="0",
        ANSIBLE_LOCALHOST_WARNING="0",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="0",
    )
    venv_bin = REPO / ".venv" / "bin"
    if venv_bin.is_dir():
        env["PATH"] = f"{venv_bin}:{env.get('PATH', '')}"
    return env


def _run_module(
    module: str, args: dict[str, Any], check: bool = False, diff: bool = False
) -> dict[str, Any]:
    """`ansible localhost -m hpc.podnet.<module> -a <json>`; returns the host's result."""
    cmd = [
        "ansible",
        "localhost",
        "-c",
        "local",
        "-m",
        f"hpc.podnet.{module}",
        "-a",
        json.dumps(args),
    ]
    if check:
        cmd.append("--check")
    if diff:
        cmd.append("--diff")
    proc = subprocess.run(
        cmd, cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=120, check=False
    )
    try:
        out = json.loads(proc.stdout)
    except ValueError as exc:
        raise AssertionError(f"ansible output is not JSON: {proc.stdout}\n{proc.stderr}") from exc
    result: dict[str, Any] = out["plays"][0]["tasks"][0]["hosts"]["localhost"]
    return result


@pytest.fixture
def run_module() -> Any:
    """`ansible localhost -m hpc.podnet.<module>` as a fixture."""
    return _run_module


@pytest.fixture
def free_port() -> Any:
    return _free_port


@pytest.fixture
def pki_factory() -> Any:
    return make_pki


# -- playbooks against this host ----------------------------------------------------------
def playbook_env(path: str | None = None) -> dict[str, str]:
    """The test's environment for ansible-playbook: the checkout's collection (build/collections,
    `make deps`), no colour, no warnings about the implicit localhost; `path` replaces PATH."""
    return {
        **os.environ,
        "PATH": path or os.environ["PATH"],
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / "build/collections"),
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
        "ANSIBLE_NOCOLOR": "1",
    }


@dataclass
class Playbook:
    """A playbook in a file, run by ansible-playbook on this host (its plays say `hosts:
    localhost`, `connection: local`); `args` go on every run (e.g. `-e node=DIR`)."""

    path: Path
    args: tuple[str, ...] = ()

    def write(self, text: str) -> Playbook:
        self.path.write_text(text)
        return self

    def run(
        self, *args: str, ok: bool = True, path: str | None = None, timeout: float = 600
    ) -> str:
        """One ansible-playbook run; asserts it succeeded (`ok`) or failed; returns its stdout."""
        r = subprocess.run(
            [BIN / "ansible-playbook", self.path, *self.args, *args],
            env=playbook_env(path),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert (r.returncode == 0) == ok, r.stdout[-4000:] + r.stderr[-2000:]
        return r.stdout


def changed(out: str) -> int:
    """The `changed=` count of the (only) host in a run's PLAY RECAP."""
    recap = out[out.rindex("PLAY RECAP") :]
    return int(recap.split("changed=")[1].split()[0])


@pytest.fixture
def playbook(tmp_path: Path) -> Callable[[str], Playbook]:
    """playbook(TEXT): the playbook TEXT written to tmp_path/play.yml, to run."""
    return lambda text: Playbook(tmp_path / "play.yml").write(text)
