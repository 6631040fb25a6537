# SPDX-License-Identifier: Apache-2.0
"""The user's control plane, in its Slurm job (`podnet-hpk up` submits it): keys and
certificates, etcd on the pod's loopback, kube-apiserver at the pod's address and name
(port 6443), kube-controller-manager, CoreDNS for Service names, and podnet's kubelet.
Everything runs as the user, inside the job's podnet pod: only the user's pods and login
sessions reach it. SIGTERM (`podnet-hpk down`, `scancel`, the time limit) cancels every
pod's job, then stops the components."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import pwd
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from podnet.hpk import podplan, runner
from podnet.hpk.kubeapi import Client
from podnet.hpk.kubelet import Kubelet
from podnet.hpk.logserver import serve
from podnet.hpk.settings import Settings, user_state_dir

log = logging.getLogger("podnet.hpk.control-plane")

API_PORT = 6443
KUBELET_PORT = 10250
NODE_NAME = "podnet"
# a container name (a DNS-1123 label, as the API server checks): kubectl logs names a file by it
CONTAINER_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def kubeconfig(
    server: str, ca: Path, cert: Path, key: Path, user: str, name: str = "podnet-hpk"
) -> str:
    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": name, "cluster": {"server": server, "certificate-authority-data": b64(ca)}}
            ],
            "users": [
                {
                    "name": user,
                    "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)},
                }
            ],
            "contexts": [
                {"name": name, "context": {"cluster": name, "user": user, "namespace": "default"}}
            ],
            "current-context": name,
            "preferences": {},
        },
        sort_keys=False,
    )


def write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


def resolv_conf() -> tuple[list[str], list[str]]:
    servers, search = [], []
    with contextlib.suppress(OSError):
        for line in Path("/etc/resolv.conf").read_text().splitlines():
            f = line.split()
            if len(f) >= 2 and f[0] == "nameserver":
                servers.append(f[1])
            elif f and f[0] == "search":
                search = f[1:]
    return servers, search


def names_domain(user: str, search: list[str]) -> str:
    """The cluster's names domain `<cluster>`, from PODNET_JOB_DOMAIN or the pod's search
    list (the job's domain, then the user's `<user>.<cluster>`)."""
    dom = os.environ.get("PODNET_JOB_DOMAIN", "")
    if dom.count(".") >= 2:
        return dom.split(".", 2)[2]
    for s in search:
        if s.startswith(f"{user}."):
            return s[len(user) + 1 :]
    raise RuntimeError(
        f"no podnet names domain in PODNET_JOB_DOMAIN nor in the search list {search}: "
        "is this job in a pod?"
    )


def can_bind(ip: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((ip, port))
            return True
        except OSError:
            return False


class ControlPlane:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.state = user_state_dir(settings)
        self.dir = self.state / "control-plane"
        self.dir.mkdir(mode=0o700, exist_ok=True)
        self.pki = self.dir / "pki"
        self.job = os.environ.get("SLURM_JOB_ID", "")
        self.ip = runner.pod_ip()
        self.upstream, search = resolv_conf()
        self.cluster_name = names_domain(self.user, search)
        self.name = f"pod0.{self.job}.{self.user}.{self.cluster_name}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.stopping = threading.Event()
        self.kubelet: Kubelet | None = None

    def _status(self, **extra: Any) -> None:
        runner.write_json(
            self.state / "control-plane.json",
            {
                "job": self.job,
                "ip": self.ip,
                "name": self.name,
                "server": f"https://{self.name}:{API_PORT}",
                **extra,
            },
        )

    def _start(self, name: str, argv: list[str]) -> None:
        log.info("starting %s", name)
        with (self.dir / f"{name}.log").open("ab") as out:
            self.procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )

    def _wait_api(self, api: Client, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if api.healthy():
                return
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {p.returncode} (see {self.dir / (name + '.log')})"
                    )
            time.sleep(0.25)
        raise RuntimeError(
            f"the API server did not answer in {seconds:.0f} s (see {self.dir / 'apiserver.log'})"
        )

    def _wait_service_account(self, api: Client, seconds: float) -> None:
        """Pods are admitted once their namespace's service account exists: the controller
        manager makes `default`'s soon after it starts."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if api.get("/api/v1/namespaces/default/serviceaccounts/default") is not None:
                return
            p = self.procs["controller-manager"]
            if p.poll() is not None:
                raise RuntimeError(f"controller-manager exited with {p.returncode}")
            time.sleep(0.25)
        raise RuntimeError(
            f"no default service account after {seconds:.0f} s (controller-manager.log)"
        )

    def run(self) -> int:
        s = self.settings
        kube = s.binary("podnet-kube")
        names = [self.name]
        if self.job:
            names.append(
                f"pod0.{os.environ.get('SLURM_JOB_NAME', 'hpk')}.{self.user}.{self.cluster_name}"
            )
        subprocess.run(
            [kube, "pki", "--dir", str(self.pki), "--ip", self.ip, "--dns", ",".join(names)],
            check=True,
        )
        p = self.pki
        write_private(
            self.dir / "controller-manager.kubeconfig",
            kubeconfig(
                f"https://{self.ip}:{API_PORT}",
                p / "ca.crt",
                p / "controller-manager.crt",
                p / "controller-manager.key",
                "controller-manager",
            ),
        )
        server = f"https://{self.name}:{API_PORT}"
        self._start(
            "etcd",
            [
                s.binary("etcd"),
                "--name=hpk",
                f"--data-dir={self.dir / 'etcd'}",
                "--listen-client-urls=http://127.0.0.1:2379",
                "--advertise-client-urls=http://127.0.0.1:2379",
                "--listen-peer-urls=http://127.0.0.1:2380",
                "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                "--initial-cluster=hpk=http://127.0.0.1:2380",
                "--log-level=warn",
            ],
        )
        self._start(
            "apiserver",
            [
                kube,
                "apiserver",
                f"--advertise-address={self.ip}",
                "--bind-address=0.0.0.0",
                f"--secure-port={API_PORT}",
                "--etcd-servers=http://127.0.0.1:2379",
                f"--client-ca-file={p / 'ca.crt'}",
                f"--tls-cert-file={p / 'apiserver.crt'}",
                f"--tls-private-key-file={p / 'apiserver.key'}",
                f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
                f"--kubelet-certificate-authority={p / 'ca.crt'}",
                "--kubelet-preferred-address-types=InternalIP",
                f"--service-account-key-file={p / 'sa.pub'}",
                f"--service-account-signing-key-file={p / 'sa.key'}",
                f"--service-account-issuer=https://kubernetes.default.svc.{s.cluster_domain}",
                f"--service-cluster-ip-range={s.service_cidr}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=false",
                "--profiling=false",
                f"--cert-dir={self.dir / 'apiserver-certs'}",
            ],
        )
        api = Client(self.ip, API_PORT, p / "ca.crt", p / "kubelet.crt", p / "kubelet.key")
        self._wait_api(api, 180)
        self._start(
            "controller-manager",
            [
                kube,
                "controller-manager",
                f"--kubeconfig={self.dir / 'controller-manager.kubeconfig'}",
                f"--service-account-private-key-file={p / 'sa.key'}",
                f"--root-ca-file={p / 'ca.crt'}",
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--profiling=false",
            ],
        )
        self._wait_service_account(api, 60)
        dns = self._dns()
        cluster = podplan.Cluster(
            api_host=self.ip,
            api_port=API_PORT,
            dns_server=dns,
            search=[f"{self.user}.{self.cluster_name}"],
            node_name=NODE_NAME,
        )
        self.kubelet = Kubelet(api, s, cluster, self.state, self.ip, KUBELET_PORT)
        self.kubelet.start()
        if dns == self.ip:
            self._start_coredns(self.kubelet.dns_zone)
        serve(
            self.ip,
            KUBELET_PORT,
            p / "kubelet-serving.crt",
            p / "kubelet-serving.key",
            p / "ca.crt",
            self._logs,
        )
        write_private(
            self.state / "kubeconfig",
            kubeconfig(
                server, p / "ca.crt", p / "admin.crt", p / "admin.key", f"{self.user}-admin"
            ),
        )
        self._status(ready=True, started=time.time(), dns=dns)
        log.info("control plane ready at %s (%s)", server, self.ip)
        threading.Thread(target=self._supervise, name="supervise", daemon=True).start()
        threading.Thread(target=self._kubelet_threads, name="kubelet", daemon=True).start()
        self.stopping.wait()
        return self._stop()

    def _kubelet_threads(self) -> None:
        if self.kubelet is None:
            return
        try:
            self.kubelet.run()
        except Exception:  # the kubelet's end is the control plane's
            log.exception("the kubelet failed")
            self.stopping.set()

    def _dns(self) -> str:
        """Where pods ask for names: the control plane's CoreDNS (Service names, then
        podnet's), or podnet's DNS when port 53 cannot be had in this pod."""
        if can_bind(self.ip, 53):
            return self.ip
        log.warning("port 53 cannot be bound in this pod: Service names will not resolve in pods")
        return self.upstream[0] if self.upstream else "127.0.0.1"

    def _start_coredns(self, zone: Path) -> None:
        dom = self.settings.cluster_domain
        forward = " ".join(self.upstream) or "/etc/resolv.conf"
        corefile = (
            f"{dom}:53 {{\n  bind {self.ip}\n  file {zone} {{\n    reload 1s\n  }}\n  errors\n}}\n"
            f".:53 {{\n  bind {self.ip}\n  forward . {forward}\n  cache 5\n  errors\n}}\n"
        )
        (self.dir / "Corefile").write_text(corefile)
        self._start(
            "coredns", [self.settings.binary("coredns"), "-conf", str(self.dir / "Corefile")]
        )

    def _logs(self, namespace: str, pod: str, container: str, previous: bool) -> Any:
        if not CONTAINER_NAME.fullmatch(container):  # Kubernetes' own rule: a file name here
            return None
        entries = list(self.kubelet.entries.values()) if self.kubelet else []
        for e in entries:
            if e.namespace == namespace and e.name == pod:
                name = f"{container}.previous.log" if previous else f"{container}.log"
                path = e.poddir / "logs" / name

                def alive(e: Any = e) -> bool:
                    try:
                        st = json.loads((e.poddir / "status.json").read_text())
                    except (OSError, ValueError):
                        return True
                    return st.get("phase") not in ("Succeeded", "Failed")

                return path, alive
        return None

    def _supervise(self) -> None:
        while not self.stopping.wait(1):
            for name, p in self.procs.items():
                if p.poll() is not None:
                    log.error("%s exited with %s: the control plane stops", name, p.returncode)
                    self._status(ready=False, ended=f"{name} exited with {p.returncode}")
                    self.stopping.set()
                    return

    def stop(self) -> None:
        self.stopping.set()

    def _stop(self) -> int:
        if self.kubelet:
            self.kubelet.shutdown()
        # the API's clients first, etcd last; each gets SIGTERM, then SIGKILL after 15 s
        for group in (["coredns", "controller-manager"], ["apiserver"], ["etcd"]):
            procs = [p for name in group if (p := self.procs.get(name)) and p.poll() is None]
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        with contextlib.suppress(OSError):
            st = json.loads((self.state / "control-plane.json").read_text())
            if st.get("job") == self.job:
                st["ready"] = False
                st.setdefault("ended", "stopped")
                runner.write_json(self.state / "control-plane.json", st)
        return 0


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cp = ControlPlane(Settings.load())

    def on_term(_sig: int, _frame: object) -> None:
        cp.stop()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        return cp.run()
    except Exception as e:
        log.exception("the control plane failed: %s", e)
        with contextlib.suppress(OSError):
            cp._status(ready=False, ended=f"failed: {e}")
        cp._stop()
        return 1
