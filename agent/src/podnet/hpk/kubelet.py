# SPDX-License-Identifier: Apache-2.0
"""podnet's virtual kubelet (HPK's design, docs/hpk.md): one node that stands for the
cluster; every pod bound to it becomes one Slurm job of the user, whose podnet pod is the
Kubernetes pod's network. It also binds pods (Slurm places them: HPK's pass-through
scheduler) and writes the Service names the control plane's DNS serves.

This module holds the pods (watch, bind, submit, status, delete) and the loops; the Node
object and its Lease are in `podnet.hpk.kubenode`, the Service names' zone file in
`podnet.hpk.servicedns`."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import queue
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from podnet.hpk import kubenode, podplan, podspec, podstatus, slurm
from podnet.hpk.kubeapi import ApiError, Client
from podnet.hpk.servicedns import ServiceZone
from podnet.hpk.settings import Settings

log = logging.getLogger("podnet.hpk.kubelet")

HEARTBEAT = 10.0
SQUEUE_EVERY = 2.0
# how often the pods' status files are read (a stat and a small read each)
FILES_EVERY = 0.1


@dataclasses.dataclass
class Entry:
    uid: str
    namespace: str
    name: str
    poddir: Path
    pod: dict[str, Any]
    job: str = ""
    error: tuple[str, str] | None = None
    unschedulable: str | None = None
    sent: str = ""  # the last status sent, as JSON
    deleting: bool = False
    annotated: bool = False
    done: bool = False  # Succeeded or Failed was sent: nothing changes any more


class ApiSources:
    """podplan.Sources from the API."""

    def __init__(self, api: Client) -> None:
        self.api = api

    def config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.api.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.api.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")

    def token(
        self, namespace: str, service_account: str, audience: str | None, seconds: int
    ) -> str:
        body: dict[str, Any] = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": max(seconds, 600)},
        }
        if audience:
            body["spec"]["audiences"] = [audience]
        out = self.api.request(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token", body
        )
        return str(out["status"]["token"])


class Kubelet:
    def __init__(
        self,
        api: Client,
        settings: Settings,
        cluster: podplan.Cluster,
        state: Path,
        ip: str,
        port: int,
    ) -> None:
        self.api = api
        self.settings = settings
        self.cluster = cluster
        self.node = cluster.node_name
        self.state = state
        self.ip = ip
        self.port = port
        self.pods_dir = state / "pods"
        self.pods_dir.mkdir(parents=True, exist_ok=True)
        self.dns_zone = state / "dns" / f"{settings.cluster_domain}.zone"
        self.dns_zone.parent.mkdir(parents=True, exist_ok=True)
        self.zone = ServiceZone(
            api, self.dns_zone, settings.cluster_domain, cluster.api_host, cluster.dns_server
        )
        self.image_dirs = [
            Path(d.format(state=state, home=Path.home())) for d in settings.image_dirs
        ]
        self.sources = ApiSources(api)
        self.entries: dict[str, Entry] = {}
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stop = threading.Event()
        self.script = f'#!/bin/sh\nexec {sys.executable} -m podnet.hpk.runner "$PODNET_HPK_POD"\n'

    # --- the node -------------------------------------------------------------------
    def register(self) -> None:
        kubenode.register(self.api, self.node, self.ip, self.port)

    def heartbeat_loop(self) -> None:
        n = 0
        while not self.stop.wait(HEARTBEAT):
            n += 1
            try:
                kubenode.renew_lease(self.api, self.node)
                if n % 6 == 0:
                    kubenode.patch_status(self.api, self.node, self.ip, self.port)
            except (OSError, ApiError) as e:
                log.warning("heartbeat: %s", e)

    # --- pods -------------------------------------------------------------------------
    def watch_loop(self) -> None:
        """Every pod of the cluster, as events on the queue (a relist after each watch)."""
        while not self.stop.is_set():
            try:
                lst = self.api.request("GET", "/api/v1/pods")
                rv = lst["metadata"]["resourceVersion"]
                self.events.put({"type": "SYNC", "objects": lst.get("items", [])})
                for ev in self.api.watch(
                    "/api/v1/pods", {"resourceVersion": rv, "timeoutSeconds": 300}
                ):
                    if self.stop.is_set():
                        return
                    if ev.get("type") == "ERROR":
                        break
                    self.events.put(ev)
            except (OSError, ApiError, ValueError) as e:
                log.warning("pod watch: %s; again in 1 s", e)
                self.stop.wait(1)

    def _bind(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        if pod["spec"].get("schedulerName", "default-scheduler") not in (
            "default-scheduler",
            "podnet",
        ):
            return
        try:
            self.api.request(
                "POST",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
                {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": meta["name"], "uid": meta["uid"]},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": self.node},
                },
            )
        except ApiError as e:
            if e.status not in (404, 409):
                log.warning("bind %s/%s: %s", meta["namespace"], meta["name"], e)

    def _poddir(self, meta: dict[str, Any]) -> Path:
        return self.pods_dir / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"

    def handle(self, ev: dict[str, Any]) -> None:
        if ev["type"] == "SYNC":
            seen = set()
            for pod in ev["objects"]:
                seen.add(pod["metadata"]["uid"])
                self._pod_event("MODIFIED", pod)
            for uid in [u for u in self.entries if u not in seen]:
                self._gone(self.entries[uid])
            self._gc_dirs(seen)
            return
        self._pod_event(ev["type"], ev["object"])

    def _pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        if not spec.get("nodeName"):
            if kind != "DELETED" and not meta.get("deletionTimestamp"):
                self._bind(pod)
            return
        if spec["nodeName"] != self.node:
            return
        uid = meta["uid"]
        entry = self.entries.get(uid)
        if kind == "DELETED":
            if entry:
                self._gone(entry)
            return
        if entry is None:
            if (pod.get("status") or {}).get("phase") in (
                "Succeeded",
                "Failed",
            ) and not self._poddir(meta).exists():
                return
            entry = Entry(uid, meta["namespace"], meta["name"], self._poddir(meta), pod)
            self.entries[uid] = entry
            self._adopt_or_submit(entry)
        entry.pod = pod
        if meta.get("deletionTimestamp") and not entry.deleting:
            self._delete(entry)

    def _adopt_or_submit(self, entry: Entry) -> None:
        jobfile = entry.poddir / "job"
        if jobfile.exists():
            entry.job = jobfile.read_text().strip()
            return
        self._submit(entry)

    def _submit(self, entry: Entry) -> None:
        try:
            plan = podspec.plan(
                entry.pod, self.settings, self.cluster, entry.poddir, self.image_dirs, self.sources
            )
        except podplan.PodSpecError as e:
            entry.error = (e.reason, str(e))
            log.info("pod %s/%s: %s: %s", entry.namespace, entry.name, e.reason, e)
            return
        except ApiError as e:
            entry.error = ("CreateContainerConfigError", str(e))
            return
        entry.error = None
        d = entry.poddir
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        for sub in plan.dirs:
            (d / sub).mkdir(parents=True, exist_ok=True)
        for rel, (content, mode) in plan.files.items():
            p = d / rel
            p.write_bytes(content)
            p.chmod(mode)
        (d / "plan.json").write_text(plan.to_json())
        env = {"PODNET_HPK_POD": str(d)}
        try:
            job = slurm.sbatch([*plan.sbatch_args, "--export=ALL,PODNET_HPK_POD"], self.script, env)
        except slurm.SlurmError as e:
            entry.unschedulable = f"sbatch refused the pod's job: {e}"
            log.info("pod %s/%s: %s", entry.namespace, entry.name, entry.unschedulable)
            return
        entry.unschedulable = None
        entry.job = job
        (d / "job").write_text(job + "\n")
        log.info("pod %s/%s: Slurm job %s", entry.namespace, entry.name, job)

    def _delete(self, entry: Entry) -> None:
        entry.deleting = True
        if entry.job:
            try:
                slurm.scancel([entry.job])
            except slurm.SlurmError as e:
                log.warning("scancel %s: %s", entry.job, e)
        # the job's end is waited for in sync(): then the pod object goes

    def _gone(self, entry: Entry) -> None:
        """The pod object is gone: its job too, and its files."""
        if entry.job:
            try:
                slurm.scancel([entry.job])
            except slurm.SlurmError as e:
                log.warning("scancel %s: %s", entry.job, e)
        shutil.rmtree(entry.poddir, ignore_errors=True)
        self.entries.pop(entry.uid, None)

    def _gc_dirs(self, uids: set[str]) -> None:
        """Pod directories (and jobs) left by a kubelet before a restart whose pod is gone."""
        short = {u[:8] for u in uids}
        for d in self.pods_dir.iterdir():
            if d.name.rsplit("_", 1)[-1] in short:
                continue
            job = d / "job"
            if job.exists():
                try:
                    slurm.scancel([job.read_text().strip()])
                except slurm.SlurmError as e:
                    log.warning("scancel %s: %s", job.read_text().strip(), e)
            shutil.rmtree(d, ignore_errors=True)

    def sync(self, jobs: dict[str, slurm.JobState] | None) -> None:
        """Every pod's status from Slurm (`jobs`: squeue's, None when not asked this round)
        and its runner's status.json; a pod being deleted goes once its job ended."""
        for entry in list(self.entries.values()):
            if entry.done and not entry.deleting:
                continue
            runner = None
            with contextlib.suppress(OSError, ValueError):
                runner = json.loads((entry.poddir / "status.json").read_text())
            job: slurm.JobState | None
            if jobs is None:
                if not runner and not entry.error and not entry.unschedulable:
                    continue  # nothing new to say until squeue is asked
                job = slurm.JobState(entry.job, "RUNNING", "", "")
                if runner and runner.get("phase") in ("Succeeded", "Failed"):
                    job = None
            else:
                job = jobs.get(entry.job) if entry.job else None
                if job is not None and job.state not in podstatus.RUNNING_STATES | {"PENDING"}:
                    info = slurm.job_info(entry.job)
                    job = info or job
            if entry.deleting:
                if job is None or job.state not in podstatus.RUNNING_STATES | {"PENDING"}:
                    self._finalize(entry)
                continue
            if (
                entry.error
                and entry.error[0] in ("CreateContainerConfigError",)
                and jobs is not None
            ):
                self._submit(entry)  # a config map or secret may have come
            st = podstatus.status(entry.pod, job, runner, entry.error, entry.unschedulable)
            self._send(entry, st, runner)

    def _send(self, entry: Entry, st: dict[str, Any], runner: dict[str, Any] | None) -> None:
        text = json.dumps(st, sort_keys=True)
        if text == entry.sent:
            return
        try:
            if not entry.annotated and runner and runner.get("node"):
                self.api.request(
                    "PATCH",
                    f"/api/v1/namespaces/{entry.namespace}/pods/{entry.name}",
                    {
                        "metadata": {
                            "annotations": {
                                "podnet.hpc/slurm-job": entry.job,
                                "podnet.hpc/slurm-node": runner["node"],
                            }
                        }
                    },
                    content_type="application/merge-patch+json",
                )
                entry.annotated = True
            self.api.request(
                "PATCH",
                f"/api/v1/namespaces/{entry.namespace}/pods/{entry.name}/status",
                {"status": st},
                content_type="application/merge-patch+json",
            )
            entry.sent = text
            entry.done = st.get("phase") in ("Succeeded", "Failed") and bool(runner or entry.job)
        except ApiError as e:
            if e.status == 404:
                self._gone(entry)
            else:
                log.warning("status of %s/%s: %s", entry.namespace, entry.name, e)

    def _finalize(self, entry: Entry) -> None:
        try:
            self.api.request(
                "DELETE",
                f"/api/v1/namespaces/{entry.namespace}/pods/{entry.name}",
                {
                    "apiVersion": "v1",
                    "kind": "DeleteOptions",
                    "gracePeriodSeconds": 0,
                    "preconditions": {"uid": entry.uid},
                },
            )
        except ApiError as e:
            if e.status not in (404, 409):
                log.warning("delete %s/%s: %s", entry.namespace, entry.name, e)
                return
        self._gone(entry)

    # --- Service names -----------------------------------------------------------------
    def dns_sync(self) -> None:
        """The Service names' zone file, up to date (`ServiceZone.sync`)."""
        self.zone.sync()

    def dns_loop(self) -> None:
        while not self.stop.wait(1.0):
            try:
                self.dns_sync()
            except (OSError, ApiError, ValueError) as e:
                log.warning("service names: %s", e)

    # --- the loop ----------------------------------------------------------------------
    def start(self) -> None:
        """The node registered and the Service names' zone written (CoreDNS loads it)."""
        self.register()
        self.dns_sync()

    def run(self) -> None:
        """The kubelet's loops, after start() (the control plane calls both)."""
        for target in (self.watch_loop, self.heartbeat_loop, self.dns_loop):
            threading.Thread(target=target, name=target.__name__, daemon=True).start()
        last_squeue = 0.0
        while not self.stop.is_set():
            try:
                ev = self.events.get(timeout=FILES_EVERY)
                self.handle(ev)
                while True:  # what else came meanwhile
                    self.handle(self.events.get_nowait())
            except queue.Empty:
                pass
            except (OSError, ApiError, KeyError) as e:
                log.warning("pod event: %s", e)
            jobs = None
            if time.monotonic() - last_squeue >= SQUEUE_EVERY:
                last_squeue = time.monotonic()
                try:
                    jobs = slurm.squeue_mine()
                except slurm.SlurmError as e:
                    log.warning("squeue: %s", e)
            try:
                self.sync(jobs)
            except (OSError, ApiError) as e:
                log.warning("pod status: %s", e)

    def shutdown(self) -> None:
        """The control plane ends: every pod's job with it (nothing left behind)."""
        self.stop.set()
        jobs = [e.job for e in self.entries.values() if e.job]
        for d in self.pods_dir.iterdir() if self.pods_dir.exists() else []:
            j = d / "job"
            if j.exists():
                jobs.append(j.read_text().strip())
        try:
            slurm.scancel(sorted(set(jobs)))
        except slurm.SlurmError as e:
            log.warning("scancel at the end: %s", e)
