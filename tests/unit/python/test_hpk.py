# SPDX-License-Identifier: Apache-2.0
"""HPK's logic (agent/src/podnet/hpk): a Kubernetes pod -> its Slurm job and Apptainer
commands, its status from Slurm and the runner, the runner itself with real processes
(plain commands in place of Apptainer), quantities and settings. The lab runs the real
thing (tests/e2e/test_hpk.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from podnet.hpk import controlplane, kubelet, podplan, podspec, podstatus, quantity, runner, slurm
from podnet.hpk.settings import Settings, SettingsError, user_state_dir
from podnet.hpk.slurm import JobState, clean_env

CLUSTER = podplan.Cluster("198.18.0.5", 6443, "198.18.0.5", ["alice.lab"], "podnet")


class Src:
    def __init__(self) -> None:
        self.cms: dict[str, dict[str, Any]] = {
            "web": {"data": {"index.html": "hello\n", "port": "8080"}}
        }
        self.secrets: dict[str, dict[str, Any]] = {"pw": {"data": {"password": "czNjcjN0"}}}

    def config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.cms.get(name)

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.secrets.get(name)

    def token(
        self, namespace: str, service_account: str, audience: str | None, seconds: int
    ) -> str:
        return f"token-{namespace}-{service_account}"


def pod(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "1"]}]
    }
    base.update(spec)
    return {
        "metadata": {
            "name": "web-1",
            "namespace": "default",
            "uid": "0123456789abcdef",
            "annotations": {},
        },
        "spec": base,
    }


@pytest.fixture
def images(tmp_path: Path) -> Path:
    d = tmp_path / "images"
    d.mkdir()
    (d / "busybox.sif").write_bytes(b"sif")
    (d / "debian").mkdir()
    (d / "tool_1.2.sif").write_bytes(b"sif")
    return d


def test_images_map_to_files_and_a_missing_one_names_what_was_looked_for(images: Path) -> None:
    assert podspec.resolve_image("busybox", [images]) == images / "busybox.sif"
    assert (
        podspec.resolve_image("docker.io/library/busybox:latest", [images])
        == images / "busybox.sif"
    )
    assert podspec.resolve_image("debian", [images]) == images / "debian"
    assert podspec.resolve_image("tool:1.2", [images]) == images / "tool_1.2.sif"
    with pytest.raises(podplan.PodSpecError) as e:
        podspec.resolve_image("nginx:1.27", [images])
    assert e.value.reason == "ErrImagePull"
    assert str(images / "nginx_1.27.sif") in str(e.value)
    with pytest.raises(podplan.PodSpecError) as e:
        podspec.resolve_image("../../etc/passwd", [images])
    assert e.value.reason == "InvalidImageName"


def test_a_pod_becomes_one_job_with_its_requests_and_flags(tmp_path: Path, images: Path) -> None:
    p = pod(
        containers=[
            {
                "name": "a",
                "image": "busybox",
                "command": ["true"],
                "resources": {"requests": {"cpu": "500m", "memory": "64Mi"}},
            },
            {
                "name": "b",
                "image": "busybox",
                "command": ["true"],
                "resources": {"limits": {"cpu": "2", "memory": "1Gi"}},
            },
        ],
        activeDeadlineSeconds=90,
    )
    p["metadata"]["annotations"] = {"slurm.hpk.io/flags": "-w c2 --partition=debug"}
    plan = podspec.plan(p, Settings(), CLUSTER, tmp_path / "pod", [images], Src())
    args = plan.sbatch_args
    assert "--job-name=web-1" in args and "--cpus-per-task=3" in args and "--mem=1088M" in args
    assert "--time=2" in args and args[-3:] == ["-w", "c2", "--partition=debug"]
    assert plan.key == "default/web-1" and plan.restart_policy == "Always"


def test_containers_get_env_volumes_and_their_command(tmp_path: Path, images: Path) -> None:
    poddir = tmp_path / "pod"
    p = pod(
        containers=[
            {
                "name": "web",
                "image": "busybox",
                "command": ["httpd", "-f", "-p", "$(PORT)"],
                "env": [
                    {
                        "name": "PORT",
                        "valueFrom": {"configMapKeyRef": {"name": "web", "key": "port"}},
                    },
                    {"name": "ME", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {
                        "name": "PW",
                        "valueFrom": {"secretKeyRef": {"name": "pw", "key": "password"}},
                    },
                    {"name": "URL", "value": "http://$(ME):$(PORT)/ $$(x)"},
                ],
                "volumeMounts": [
                    {"name": "html", "mountPath": "/www", "readOnly": True},
                    {"name": "scratch", "mountPath": "/scratch"},
                ],
                "workingDir": "/www",
            }
        ],
        volumes=[
            {"name": "html", "configMap": {"name": "web"}},
            {"name": "scratch", "emptyDir": {}},
        ],
    )
    plan = podspec.plan(
        p, Settings(apptainer="/usr/bin/apptainer"), CLUSTER, poddir, [images], Src()
    )
    (c,) = plan.containers
    env = dict(c.env)
    assert env["PORT"] == "8080" and env["PW"] == "s3cr3t" and env["ME"] == podplan.RUNTIME_POD_IP
    assert env["URL"] == f"http://{podplan.RUNTIME_POD_IP}:8080/ $(x)"
    assert env["KUBERNETES_SERVICE_HOST"] == "198.18.0.5"
    argv = c.argv
    assert argv[:5] == ["/usr/bin/apptainer", "-q", "exec", "--contain", "--cleanenv"]
    assert argv[-5:] == [str(images / "busybox.sif"), "httpd", "-f", "-p", "8080"]
    binds = [argv[i + 1] for i, a in enumerate(argv) if a == "--bind"]
    assert (
        f"{poddir}/volumes/html:/www:ro" in binds and f"{poddir}/volumes/scratch:/scratch" in binds
    )
    assert f"{poddir}/resolv.conf:/etc/resolv.conf" in binds
    assert plan.files["volumes/html/index.html"] == (b"hello\n", 0o644)
    resolv = plan.files["resolv.conf"][0].decode()
    assert (
        "nameserver 198.18.0.5" in resolv
        and "search default.svc.cluster.local svc.cluster.local" in resolv
    )


def test_only_args_run_the_image_and_no_command_runs_it_bare(tmp_path: Path, images: Path) -> None:
    p = pod(
        containers=[
            {"name": "a", "image": "busybox", "args": ["-c", "echo hi"]},
            {"name": "b", "image": "busybox"},
        ]
    )
    plan = podspec.plan(p, Settings(), CLUSTER, tmp_path, [images], Src())
    a, b = plan.containers
    assert a.argv[2] == "run" and a.argv[-2:] == ["-c", "echo hi"]
    assert b.argv[2] == "run" and b.argv[-1] == str(images / "busybox.sif")


@pytest.mark.parametrize(
    ("volume", "reason"),
    [
        ({"name": "h", "hostPath": {"path": "/etc"}}, "HostPathNotAllowed"),
        ({"name": "h", "hostPath": {"path": "/shared/data/../../etc"}}, "HostPathNotAllowed"),
        ({"name": "h", "nfs": {"server": "x", "path": "/"}}, "UnsupportedVolume"),
        ({"name": "h", "configMap": {"name": "nope"}}, "CreateContainerConfigError"),
        (
            {"name": "h", "configMap": {"name": "web", "items": [{"key": "port", "path": "../x"}]}},
            "CreateContainerConfigError",
        ),
    ],
)
def test_volumes_podnet_cannot_give_say_why(
    tmp_path: Path, images: Path, volume: dict[str, Any], reason: str
) -> None:
    p = pod(volumes=[volume])
    with pytest.raises(podplan.PodSpecError) as e:
        podspec.plan(
            p, Settings(host_path_prefixes=("/shared/data",)), CLUSTER, tmp_path, [images], Src()
        )
    assert e.value.reason == reason, e.value


def test_host_paths_under_an_allowed_prefix_are_bound(tmp_path: Path, images: Path) -> None:
    p = pod(volumes=[{"name": "d", "hostPath": {"path": "/shared/data/run1"}}])
    p["spec"]["containers"][0]["volumeMounts"] = [{"name": "d", "mountPath": "/data"}]
    plan = podspec.plan(
        p, Settings(host_path_prefixes=("/shared/data",)), CLUSTER, tmp_path, [images], Src()
    )
    assert "/shared/data/run1:/data" in plan.containers[0].argv


def test_the_service_account_volume_is_projected(tmp_path: Path, images: Path) -> None:
    p = pod(
        volumes=[
            {
                "name": "kube-api-access",
                "projected": {
                    "sources": [
                        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                        {
                            "configMap": {
                                "name": "web",
                                "items": [{"key": "index.html", "path": "ca.crt"}],
                            }
                        },
                        {
                            "downwardAPI": {
                                "items": [
                                    {
                                        "path": "namespace",
                                        "fieldRef": {"fieldPath": "metadata.namespace"},
                                    }
                                ]
                            }
                        },
                    ]
                },
            }
        ]
    )
    plan = podspec.plan(p, Settings(), CLUSTER, tmp_path, [images], Src())
    assert plan.files["volumes/kube-api-access/token"] == (b"token-default-default", 0o600)
    assert plan.files["volumes/kube-api-access/namespace"][0] == b"default"
    assert plan.files["volumes/kube-api-access/ca.crt"][0] == b"hello\n"


def test_job_names_are_dns_labels() -> None:
    assert podspec.job_name("default", "Web_1") == "web-1"
    assert podspec.job_name("team-a", "web") == "web-team-a"
    assert len(podspec.job_name("default", "x" * 300)) == 63


def test_quantities() -> None:
    assert quantity.cpus("500m") == 1 and quantity.cpus("2") == 2 and quantity.cpus("2.1") == 3
    assert (
        quantity.mebibytes("64Mi") == 64
        and quantity.mebibytes("1G") == 954
        and quantity.mebibytes("1Gi") == 1024
    )
    with pytest.raises(quantity.QuantityError):
        quantity.cpus("lots")


# --- status ------------------------------------------------------------------------
def test_status_follows_slurm_then_the_runner() -> None:
    p = pod()
    pending = podstatus.status(p, JobState("7", "PENDING", "Resources", ""), None)
    assert pending["phase"] == "Pending" and "Resources" in pending["message"]
    run = {
        "phase": "Running",
        "ip": "198.19.0.9",
        "job": "7",
        "startedAt": "x",
        "init": [],
        "containers": [{"name": "c", "state": {"running": {"startedAt": "x"}}, "restartCount": 0}],
    }
    st = podstatus.status(p, JobState("7", "RUNNING", "None", "c1"), run)
    assert st["phase"] == "Running" and st["podIP"] == "198.19.0.9"
    assert {"type": "Ready", "status": "True"} in st["conditions"]
    done = {
        **run,
        "phase": "Succeeded",
        "containers": [{"name": "c", "state": {"terminated": {"exitCode": 0}}}],
    }
    assert podstatus.status(p, None, done)["phase"] == "Succeeded"
    # the job hit its time limit while the containers ran: Failed, and why
    st = podstatus.status(p, JobState("7", "TIMEOUT", "TimeLimit", "c1", "0:15"), run)
    assert st["phase"] == "Failed" and st["reason"] == "DeadlineExceeded"
    # the job ended without the runner saying anything
    st = podstatus.status(p, JobState("7", "FAILED", "NonZeroExitCode", "c1", "1:0"), None)
    assert st["phase"] == "Failed" and "1:0" in st["message"]


def test_status_of_pods_that_cannot_start() -> None:
    p = pod()
    st = podstatus.status(
        p, None, None, error=("ErrImagePull", "image busybox: none of /x.sif exists")
    )
    assert (
        st["phase"] == "Pending"
        and st["containerStatuses"][0]["state"]["waiting"]["reason"] == "ErrImagePull"
    )
    st = podstatus.status(
        p, None, None, unschedulable="sbatch: error: Requested node configuration is not available"
    )
    assert st["phase"] == "Pending" and st["reason"] == "Unschedulable"
    assert st["conditions"][0] == {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "sbatch: error: Requested node configuration is not available",
    }


# --- the runner ----------------------------------------------------------------------
def _write_plan(
    d: Path, init: list[list[str]], containers: list[list[str]], policy: str = "Never"
) -> None:
    (d / "logs").mkdir(parents=True)
    (d / "hosts").write_text("127.0.0.1\tlocalhost\n")

    def c(i: int, argv: list[str]) -> dict[str, Any]:
        return {"name": f"c{i}", "argv": argv, "env": [["IP", podplan.RUNTIME_POD_IP]]}

    (d / "plan.json").write_text(
        json.dumps(
            {
                "key": "default/web-1",
                "uid": "u",
                "restart_policy": policy,
                "grace_seconds": 2,
                "init": [c(i + 10, a) for i, a in enumerate(init)],
                "containers": [c(i, a) for i, a in enumerate(containers)],
            }
        )
    )


def _run(d: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "podnet.hpk.runner", str(d)],
        env={**os.environ, "PODNET_POD_IP": "198.18.9.9"},
        text=True,
    )


def test_runner_runs_init_containers_in_order_then_the_containers(tmp_path: Path) -> None:
    out = tmp_path / "order"
    sh = "/bin/sh"
    _write_plan(
        tmp_path,
        init=[[sh, "-c", f"echo init1 >> {out}"], [sh, "-c", f"echo init2 >> {out}"]],
        containers=[[sh, "-c", f"echo main >> {out}; echo hello from c0"], [sh, "-c", "exit 3"]],
    )
    assert _run(tmp_path).wait(30) == 1
    assert out.read_text().split() == ["init1", "init2", "main"]
    st = json.loads((tmp_path / "status.json").read_text())
    assert st["phase"] == "Failed" and st["ip"] == "198.18.9.9"
    codes = {c["name"]: c["state"]["terminated"]["exitCode"] for c in st["containers"]}
    assert codes == {"c0": 0, "c1": 3}
    assert (tmp_path / "logs" / "c0.log").read_text() == "hello from c0\n"
    assert "198.18.9.9\tweb-1" in (tmp_path / "hosts").read_text()
    assert (tmp_path / "env" / "c0.env").read_text().startswith("IP=198.18.9.9")


def test_runner_fails_the_pod_on_a_failed_init_container_with_restart_never(tmp_path: Path) -> None:
    _write_plan(tmp_path, init=[["/bin/false"]], containers=[["/bin/true"]])
    assert _run(tmp_path).wait(30) == 1
    st = json.loads((tmp_path / "status.json").read_text())
    assert st["phase"] == "Failed" and "init container c10" in st["message"]
    assert st["containers"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}


def test_runner_restarts_on_failure_and_stops_on_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = tmp_path / "count"
    _write_plan(
        tmp_path,
        init=[],
        containers=[["/bin/sh", "-c", f"echo x >> {count}; exit 1"]],
        policy="OnFailure",
    )
    r = runner.Runner(tmp_path)
    monkeypatch.setattr(runner, "BACKOFF_FIRST", 0.1)
    for c in r.containers:
        c.backoff = 0.1
    t = threading.Thread(target=r.run)
    t.start()
    deadline = time.monotonic() + 20
    while (
        time.monotonic() < deadline and len(count.read_text().split() if count.exists() else []) < 3
    ):
        time.sleep(0.05)
    r.stop()
    t.join(20)
    assert not t.is_alive()
    st = json.loads((tmp_path / "status.json").read_text())
    assert st["containers"][0]["restartCount"] >= 2
    assert st["phase"] == "Failed" and "stopped" in st["message"]


def test_runner_sigterm_reaches_the_containers(tmp_path: Path) -> None:
    mark = tmp_path / "got-term"
    _write_plan(
        tmp_path,
        init=[],
        containers=[
            [
                "/bin/sh",
                "-c",
                f"trap 'echo term > {mark}; exit 0' TERM; while :; do sleep 0.1; done",
            ]
        ],
        policy="Always",
    )
    p = _run(tmp_path)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        st = (
            json.loads((tmp_path / "status.json").read_text())
            if (tmp_path / "status.json").exists()
            else {}
        )
        if st.get("phase") == "Running":
            break
        time.sleep(0.05)
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)
    assert p.wait(20) == 1
    assert mark.read_text() == "term\n"


# --- settings ------------------------------------------------------------------------
def test_settings_refuse_unknown_keys_and_wrong_types() -> None:
    assert Settings.from_dict({"host_path_prefixes": ["/shared"]}).host_path_prefixes == (
        "/shared",
    )
    with pytest.raises(SettingsError, match="unknown setting 'imagedirs'"):
        Settings.from_dict({"imagedirs": []})
    with pytest.raises(SettingsError, match="control_plane_cpus must be a int"):
        Settings.from_dict({"control_plane_cpus": "2"})


def test_a_state_dir_someone_else_can_write_is_refused(tmp_path: Path) -> None:
    s = Settings(state_dir=str(tmp_path / "{user}"))
    d = user_state_dir(s)
    assert (d.stat().st_mode & 0o777) == 0o700
    d.chmod(0o777)
    with pytest.raises(SettingsError, match="writable by others"):
        user_state_dir(s)


def test_jobs_made_from_a_job_do_not_inherit_its_slurm_variables() -> None:
    env = clean_env(
        {"SLURM_JOB_ID": "3", "SBATCH_PARTITION": "x", "PODNET_POD_IP": "1", "HOME": "/h"}
    )
    assert env == {"HOME": "/h"}


# --- the kubelet, against a fake API server and a fake Slurm -------------------------------
class FakeApi:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        self.calls.append((method, path, body))
        if path == "/api/v1/endpoints":
            return {
                "items": [
                    {
                        "metadata": {"namespace": "default", "name": "web"},
                        "subsets": [{"addresses": [{"ip": "198.19.0.7"}, {"ip": "198.18.0.9"}]}],
                    }
                ]
            }
        return {}

    def get(self, path: str, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
        self.calls.append(("GET", path, None))
        return None

    def of(self, method: str, suffix: str) -> list[Any]:
        return [b for m, p, b in self.calls if m == method and p.endswith(suffix)]


class FakeSlurm:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.submitted: list[list[str]] = []
        self.cancelled: list[str] = []
        monkeypatch.setattr(slurm, "sbatch", self.sbatch)
        monkeypatch.setattr(slurm, "scancel", self.scancel)
        monkeypatch.setattr(slurm, "job_info", lambda job: None)

    def sbatch(self, args: list[str], script: str, env: Any = None) -> str:
        if any(a.startswith("--cpus-per-task=64") for a in args):
            raise slurm.SlurmError("sbatch: error: Requested node configuration is not available")
        self.submitted.append(args)
        assert env == {
            "PODNET_HPK_POD": next(a for a in args if a.startswith("--output=")).split("=")[1][:-10]
        }
        return str(40 + len(self.submitted))

    def scancel(self, jobs: list[str], signal: str | None = None) -> None:
        self.cancelled += jobs


def test_the_kubelet_binds_submits_reports_and_deletes(
    tmp_path: Path, images: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = FakeApi()
    fake = FakeSlurm(monkeypatch)
    settings = Settings(image_dirs=(str(images),))
    k = kubelet.Kubelet(api, settings, CLUSTER, tmp_path / "state", "198.18.0.5", 10250)  # type: ignore[arg-type]
    p = pod()
    k.handle({"type": "ADDED", "object": p})
    (binding,) = api.of("POST", "/pods/web-1/binding")
    assert binding["target"] == {"apiVersion": "v1", "kind": "Node", "name": "podnet"}
    assert not fake.submitted
    p["spec"]["nodeName"] = "podnet"
    k.handle({"type": "MODIFIED", "object": p})
    (args,) = fake.submitted
    assert "--job-name=web-1" in args
    (entry,) = k.entries.values()
    assert (entry.poddir / "job").read_text() == "41\n" and (entry.poddir / "plan.json").exists()
    # the job pending, then the runner's word: Pending, then Running with the pod's address
    k.sync({"41": JobState("41", "PENDING", "Priority", "")})
    assert api.of("PATCH", "/pods/web-1/status")[-1]["status"]["phase"] == "Pending"
    (entry.poddir / "status.json").write_text(
        json.dumps(
            {
                "phase": "Running",
                "ip": "198.19.0.7",
                "node": "c2",
                "job": "41",
                "startedAt": "t",
                "init": [],
                "containers": [{"name": "c", "state": {"running": {"startedAt": "t"}}}],
            }
        )
    )
    k.sync(None)
    st = api.of("PATCH", "/pods/web-1/status")[-1]["status"]
    assert st["phase"] == "Running" and st["podIP"] == "198.19.0.7"
    ann = api.of("PATCH", "/namespaces/default/pods/web-1")[-1]["metadata"]["annotations"]
    assert ann == {"podnet.hpc/slurm-job": "41", "podnet.hpc/slurm-node": "c2"}
    sent = len(api.calls)
    k.sync(None)  # nothing changed: nothing sent
    assert len(api.calls) == sent
    # kubectl delete: the job is cancelled; once it ended, the pod object goes, then its files
    p["metadata"]["deletionTimestamp"] = "now"
    k.handle({"type": "MODIFIED", "object": p})
    assert fake.cancelled == ["41"]
    k.sync({"41": JobState("41", "RUNNING", "None", "c2")})
    assert not api.of("DELETE", "/pods/web-1")
    k.sync({})
    (delete,) = api.of("DELETE", "/pods/web-1")
    assert delete["preconditions"] == {"uid": p["metadata"]["uid"]}
    assert not entry.poddir.exists() and not k.entries


def test_the_kubelet_says_why_a_pod_cannot_run(
    tmp_path: Path, images: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = FakeApi()
    fake = FakeSlurm(monkeypatch)
    k = kubelet.Kubelet(
        api, Settings(image_dirs=(str(images),)), CLUSTER, tmp_path, "198.18.0.5", 10250
    )  # type: ignore[arg-type]
    noimage = pod(nodeName="podnet", containers=[{"name": "c", "image": "nginx"}])
    toobig = pod(
        nodeName="podnet",
        containers=[{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "64"}}}],
    )
    toobig["metadata"] = {**toobig["metadata"], "name": "big", "uid": "fedcba9876543210"}
    k.handle({"type": "SYNC", "objects": [noimage, toobig]})
    assert not fake.submitted
    k.sync({})
    by_pod = {
        path.split("/")[-2]: body["status"]
        for m, path, body in api.calls
        if path.endswith("/status")
    }
    waiting = by_pod["web-1"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "ErrImagePull" and str(images / "nginx.sif") in waiting["message"]
    assert (
        by_pod["big"]["reason"] == "Unschedulable"
        and "node configuration" in by_pod["big"]["message"]
    )


def test_service_names_are_the_ready_endpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = FakeApi()
    k = kubelet.Kubelet(api, Settings(), CLUSTER, tmp_path, "198.18.0.5", 10250)  # type: ignore[arg-type]
    k.dns_sync()
    zone = k.dns_zone.read_text().splitlines()
    assert zone[0] == "$ORIGIN cluster.local." and " IN SOA " in zone[1]
    assert (
        "web.default.svc 5 IN A 198.19.0.7" in zone and "web.default.svc 5 IN A 198.18.0.9" in zone
    )
    assert "kubernetes.default.svc 5 IN A 198.18.0.5" in zone
    serial = zone[1].split()[6]
    k.dns_sync()  # the same records: the same file, the same serial
    assert k.dns_zone.read_text().splitlines()[1].split()[6] == serial


def test_kubectl_logs_serve_only_container_names_kubernetes_allows(tmp_path: Path) -> None:
    """The log server names a file by the request's container: only a DNS-1123 label, as the
    API server allows for a container, is looked up."""
    cp = controlplane.ControlPlane.__new__(controlplane.ControlPlane)
    poddir = tmp_path / "pod"
    (poddir / "logs").mkdir(parents=True)
    entry = SimpleNamespace(namespace="default", name="web", poddir=poddir)
    cp.kubelet = SimpleNamespace(entries={"uid": entry})  # type: ignore[assignment]
    found = cp._logs("default", "web", "httpd", False)
    assert found is not None and found[0] == poddir / "logs" / "httpd.log"
    assert cp._logs("default", "web", "httpd", True)[0] == poddir / "logs" / "httpd.previous.log"
    for bad in ("..", ".", "Httpd", "a.b", "-x", "x" * 64, "", "a%2Fb"):
        assert cp._logs("default", "web", bad, False) is None, bad
    assert cp._logs("default", "other", "httpd", False) is None
