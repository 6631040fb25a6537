# SPDX-License-Identifier: Apache-2.0
"""HPK on podnet (docs/hpk.md): a user's own Kubernetes in Slurm jobs, done as users do it,
over SSH on the login node (their login pod): `podnet-hpk up`, plain `kubectl`. Every
Kubernetes pod is one Slurm job of the user, on the user's private network: its podnet
address is the pod IP, Service names resolve to the pods, another user's pods and API
server are out of reach and their names do not resolve. Pods that cannot run say why;
`kubectl delete` and `podnet-hpk down` leave no job, address or name behind."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import LAB, POD_CIDR, REPO, needs, pods, ssh, wait_for

pytestmark = needs("hpk")

WEB = """
apiVersion: v1
kind: ConfigMap
metadata: {name: site}
data: {index.html: "hello from podnet\\n"}
---
apiVersion: v1
kind: Pod
metadata:
  name: web-c1
  labels: {app: web}
  annotations: {slurm.hpk.io/flags: "-w c1"}
spec:
  containers:
  - name: httpd
    image: busybox
    command: [httpd, -f, -p, "8080", -h, /www]
    volumeMounts: [{name: site, mountPath: /www}]
  volumes: [{name: site, configMap: {name: site}}]
---
apiVersion: v1
kind: Pod
metadata:
  name: web-c2
  labels: {app: web}
  annotations: {podnet.hpc/slurm-flags: "-w c2"}
spec:
  containers:
  - name: httpd
    image: busybox
    command: [httpd, -f, -p, "8080", -h, /www]
    volumeMounts: [{name: site, mountPath: /www}]
  volumes: [{name: site, configMap: {name: site}}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: None
  selector: {app: web}
  ports: [{port: 8080}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: dep}
spec:
  replicas: 2
  selector: {matchLabels: {app: dep}}
  template:
    metadata: {labels: {app: dep}}
    spec:
      containers:
      - {name: main, image: busybox, command: [sleep, "3600"], resources: {requests: {cpu: 100m}}}
"""

FETCH = """
apiVersion: batch/v1
kind: Job
metadata: {name: fetch}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: fetch
        image: busybox
        command:
        - sh
        - -c
        - |
          for i in $(seq 60); do
            if wget -q -T 3 -O- http://web:8080/; then
              echo "fetched from web: $(nslookup web.default.svc.cluster.local | grep -c Address)"
              exit 0
            fi
            sleep 1
          done
          exit 1
      - name: py
        image: python
        command:
        - python3
        - -c
        - |
          import socket, time, urllib.request
          for _ in range(60):
              try:
                  page = urllib.request.urlopen("http://web:8080/", timeout=3).read().decode()
              except OSError:
                  time.sleep(1)
                  continue
              addrs = sorted({a[4][0] for a in socket.getaddrinfo("web", 8080, socket.AF_INET)})
              print("python fetched", page.strip(), "from", len(addrs), "addresses")
              break
          else:
              raise SystemExit("web unreachable")
"""

BROKEN = """
apiVersion: v1
kind: Pod
metadata: {name: noimage}
spec:
  containers: [{name: c, image: "nosuchimage:1.0", command: [sleep, "1"]}]
---
apiVersion: v1
kind: Pod
metadata: {name: toobig}
spec:
  containers:
  - {name: c, image: busybox, command: [sleep, "1"], resources: {requests: {cpu: "64"}}}
"""


def kubectl(user: str, args: str, stdin: str | None = None, check: bool = True) -> str:
    """`kubectl` as `user` in their SSH session on login (a manifest on stdin)."""
    if stdin is None:
        return ssh(f"{user}@login", f"kubectl {args}", check=check, timeout=120).stdout
    env = {**os.environ, "LAB_NAME": LAB}
    r = subprocess.run(
        [str(REPO / "tests/lab/lab.sh"), "ssh", f"{user}@login", f"kubectl {args}"],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if check and r.returncode != 0:
        raise AssertionError(f"kubectl {args}: {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def kpods(user: str) -> dict[str, dict[str, Any]]:
    out = json.loads(kubectl(user, "get pods -o json"))
    return {p["metadata"]["name"]: p for p in out["items"]}


def user_jobs(user: str) -> list[str]:
    """`user`'s jobs that podnet-hpk made (their comment says so: the session's other jobs,
    conftest's `jobs`, run beside them), as `id name state`."""
    out = ssh("login", f"squeue -h -u {user} -o '%i %j %T|%k'").stdout.splitlines()
    return [line.split("|")[0] for line in out if line.split("|", 1)[-1].startswith("podnet-hpk")]


@pytest.fixture(scope="module", autouse=True)
def images() -> None:
    subprocess.run(
        [str(REPO / "tests/lab/hpk-images.sh"), "c1"],
        env={**os.environ, "LAB_NAME": LAB},
        check=True,
        timeout=300,
    )


def _cluster(user: str) -> Iterator[dict[str, Any]]:
    """`user`'s control plane, up as they type `podnet-hpk up`; down at the end whatever
    happened."""
    ssh(f"{user}@login", "podnet-hpk down --purge", check=False, timeout=180)
    try:
        out = ssh(f"{user}@login", "podnet-hpk up", timeout=400).stdout
        assert "API server ready" in out, out
        yield json.loads(ssh(f"{user}@login", "podnet-hpk status --json").stdout)
    finally:
        ssh(f"{user}@login", "podnet-hpk down --purge", check=False, timeout=180)


@pytest.fixture(scope="module")
def alice() -> Iterator[dict[str, Any]]:
    yield from _cluster("alice")


@pytest.fixture(scope="module")
def bob() -> Iterator[dict[str, Any]]:
    yield from _cluster("bob")


def test_up_gives_the_user_a_kubeconfig_and_an_api_at_the_pod(alice: dict[str, Any]) -> None:
    mode = ssh("alice@login", "stat -c %a ~/.kube/config").stdout.strip()
    assert mode == "600"
    st = json.loads(ssh("alice@login", "podnet-hpk status --json").stdout)
    assert st["up"] and st["server"].startswith(f"https://pod0.{st['job']}.alice.")
    assert ipaddress.ip_address(st["ip"]) in ipaddress.ip_network(POD_CIDR)
    nodes = kubectl("alice", "get nodes -o name").split()
    assert nodes == ["node/podnet"], nodes
    # the control plane is one of alice's Slurm jobs
    assert any(line.startswith(f"{st['job']} hpk RUNNING") for line in user_jobs("alice"))


def test_pods_services_deployments_and_jobs_run_as_slurm_jobs(alice: dict[str, Any]) -> None:
    kubectl("alice", "apply -f -", WEB)

    def running() -> dict[str, dict[str, Any]]:
        ps = kpods("alice")
        up = {n: p for n, p in ps.items() if p["status"].get("phase") == "Running"}
        deps = [n for n in up if n.startswith("dep-")]
        return up if {"web-c1", "web-c2"} <= up.keys() and len(deps) == 2 else {}

    up = wait_for(running, 240, 2)
    for name, p in up.items():
        ip = p["status"]["podIP"]
        assert ipaddress.ip_address(ip) in ipaddress.ip_network(POD_CIDR), (name, ip)
    assert up["web-c1"]["metadata"]["annotations"]["podnet.hpc/slurm-node"] == "c1"
    assert up["web-c2"]["metadata"]["annotations"]["podnet.hpc/slurm-node"] == "c2"
    # each pod is a job of alice's, named after it
    jobs = user_jobs("alice")
    for name in ("web-c1", "web-c2"):
        job = up[name]["metadata"]["annotations"]["podnet.hpc/slurm-job"]
        assert f"{job} {name} RUNNING" in jobs, jobs
    # the pod's address is its job's podnet pod on that node
    c1 = {p["ip"] for p in pods("c1") if p["user"] == "alice"}
    assert up["web-c1"]["status"]["podIP"] in c1
    kubectl("alice", "apply -f -", FETCH)
    wait_for(
        lambda: (
            json.loads(kubectl("alice", "get job fetch -o json"))["status"].get("succeeded") == 1
        ),
        240,
        2,
    )
    logs = kubectl("alice", "logs job/fetch -c fetch")
    assert "hello from podnet" in logs and "fetched from web: " in logs, logs
    # the lab's Debian python3 image (tests/lab/hpk-images.sh), same pod, same Service name
    logs = kubectl("alice", "logs job/fetch -c py")
    assert "python fetched hello from podnet from 2 addresses" in logs, logs
    wide = kubectl("alice", "get pods -o wide")
    print(wide)


def test_pods_that_cannot_run_say_why(alice: dict[str, Any]) -> None:
    kubectl("alice", "apply -f -", BROKEN)

    def said() -> tuple[str, str] | None:
        ps = kpods("alice")
        a = (
            ps["noimage"]["status"]
            .get("containerStatuses", [{}])[0]
            .get("state", {})
            .get("waiting", {})
        )
        b = ps["toobig"]["status"]
        if a.get("reason") == "ErrImagePull" and b.get("reason") == "Unschedulable":
            return a.get("message", ""), b.get("message", "")
        return None

    image, big = wait_for(said, 120, 2)
    assert "/shared/images/nosuchimage_1.0.sif" in image, image
    assert "sbatch" in big, big
    kubectl("alice", "delete pod noimage toobig --wait=true")


def test_another_user_reaches_nothing_of_alice_and_resolves_none_of_her_names(
    alice: dict[str, Any], bob: dict[str, Any]
) -> None:
    a, b = alice, bob
    ps = kpods("alice")
    targets = [ps["web-c1"]["status"]["podIP"], ps["web-c2"]["status"]["podIP"], a["ip"]]
    # /bin/ping: iputils' (tests/lab/hpk-images.sh); busybox's sh would run its own applet
    probe = "\n".join(
        [
            'probe() { if "$@" >/dev/null 2>&1; then echo REACH; else echo BLOCKED; fi; }',
            # controls: bob's own API server answers the same probes
            f"echo own-tcp $(probe nc -w 3 {b['ip']} 6443 </dev/null)",
            f"echo own-icmp $(probe /bin/ping -c 1 -W 2 {b['ip']})",
            f"echo own-udp $(probe nslookup kubernetes.default.svc.cluster.local {b['ip']})",
            *[f"echo tcp-{t} $(probe nc -w 3 {t} 8080 </dev/null)" for t in targets[:2]],
            f"echo api-{a['ip']} $(probe nc -w 3 {a['ip']} 6443 </dev/null)",
            *[f"echo icmp-{t} $(probe /bin/ping -c 1 -W 2 {t})" for t in targets],
            f"echo udp-dns-{a['ip']} $(probe nslookup web.default.svc.cluster.local {a['ip']})",
            "echo svc-name $(nslookup web.default.svc.cluster.local >/dev/null 2>&1"
            " && echo RESOLVES || echo NXDOMAIN)",
            f"echo job-name $(nslookup pod0.{a['job']}.alice.lab >/dev/null 2>&1"
            " && echo RESOLVES || echo NXDOMAIN)",
        ]
    )
    manifest = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: probe}\nspec:\n  restartPolicy: Never\n"
        "  containers:\n  - name: probe\n    image: busybox\n    command: [sh, -c, "
        + json.dumps(probe)
        + "]\n"
    )
    kubectl("bob", "apply -f -", manifest)
    wait_for(
        lambda: kpods("bob")["probe"]["status"].get("phase") in ("Succeeded", "Failed"), 180, 2
    )
    out = dict(
        line.split(" ", 1) for line in kubectl("bob", "logs probe").splitlines() if " " in line
    )
    print(out)
    assert out.pop("own-tcp") == "REACH" and out.pop("own-icmp") == "REACH", out
    assert out.pop("own-udp") == "REACH", out
    assert out.pop("svc-name") == "NXDOMAIN" and out.pop("job-name") == "NXDOMAIN", out
    assert out and set(out.values()) == {"BLOCKED"}, out
    # bob's kubectl does not reach alice's API server either (from his login pod)
    r = ssh("bob@login", f"nc -w 3 {a['ip']} 6443 </dev/null", check=False)
    assert r.returncode != 0


def test_a_control_plane_at_its_time_limit_ends_clearly_with_its_pods(bob: dict[str, Any]) -> None:
    """bob lowers his control plane's time limit (users may): it ends at that limit with
    every pod's job, and `podnet-hpk status` says so."""
    kubectl(
        "bob",
        "apply -f -",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: sleeper}\nspec:\n"
        "  containers: [{name: c, image: busybox, command: [sleep, '3600']}]\n",
    )
    wait_for(lambda: kpods("bob")["sleeper"]["status"].get("phase") == "Running", 180, 2)
    assert len(user_jobs("bob")) == 2
    ssh("bob@login", f"scontrol update JobId={bob['job']} TimeLimit=1")

    def ended() -> str:
        r = ssh("bob@login", "podnet-hpk status", check=False)
        return r.stdout if r.returncode == 3 else ""

    out = wait_for(ended, 300, 5)
    assert "TIMEOUT" in out and "podnet-hpk up" in out, out
    wait_for(lambda: user_jobs("bob") == [], 120, 2)


def test_delete_and_down_leave_no_job_address_or_name(alice: dict[str, Any]) -> None:
    a = alice
    made = [p["metadata"]["annotations"]["podnet.hpc/slurm-job"] for p in kpods("alice").values()]
    assert len(made) >= 4, made
    kubectl("alice", "delete deployment dep --wait=false")
    kubectl("alice", "delete job fetch --wait=false")
    kubectl("alice", "delete pod web-c1 web-c2 --wait=true --timeout=120s")
    wait_for(lambda: list(kpods("alice")) == [], 180, 2)
    wait_for(lambda: [j for j in user_jobs("alice") if " hpk " not in j] == [], 120, 2)
    ssh("alice@login", "podnet-hpk down", timeout=180)
    wait_for(lambda: user_jobs("alice") == [], 120, 2)
    # no pod of those jobs is left (alice's other jobs of the session keep theirs)
    hpk_jobs = {int(a["job"]), *(int(j) for j in made)}
    for node in ("c1", "c2"):
        wait_for(lambda node=node: not [p for p in pods(node) if p.get("job_id") in hpk_jobs], 60)
    r = ssh("alice@login", f"getent hosts pod0.{a['job']}.alice.lab", check=False)
    assert r.returncode != 0, r.stdout
    st = ssh("alice@login", "podnet-hpk status", check=False)
    assert st.returncode == 3 and "down" in st.stdout, st.stdout
