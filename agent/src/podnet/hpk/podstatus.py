# SPDX-License-Identifier: Apache-2.0
"""A pod's Kubernetes status from what Slurm and the pod's runner say (pure)."""

from __future__ import annotations

import time
from typing import Any

from podnet.hpk.slurm import JobState

# Slurm's end states and the reason a pod gets when its runner could not say more
_ENDED = {
    "TIMEOUT": ("DeadlineExceeded", "the pod's Slurm job reached its time limit"),
    "CANCELLED": ("SlurmCancelled", "the pod's Slurm job was cancelled"),
    "NODE_FAIL": ("NodeLost", "the node of the pod's Slurm job failed"),
    "OUT_OF_MEMORY": ("OOMKilled", "the pod's Slurm job ran out of memory"),
    "PREEMPTED": ("Preempted", "the pod's Slurm job was preempted"),
    "BOOT_FAIL": ("SlurmFailed", "the pod's Slurm job failed to boot its node"),
    "DEADLINE": ("DeadlineExceeded", "the pod's Slurm job passed its deadline"),
    "FAILED": ("SlurmFailed", "the pod's Slurm job failed"),
    "COMPLETED": ("SlurmFailed", "the pod's Slurm job ended before its containers said how"),
}
RUNNING_STATES = {"RUNNING", "COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT", "SUSPENDED"}


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _cond(kind: str, ok: bool, reason: str = "", message: str = "") -> dict[str, Any]:
    c: dict[str, Any] = {"type": kind, "status": "True" if ok else "False"}
    if reason:
        c["reason"] = reason
    if message:
        c["message"] = message
    return c


def _waiting(
    pod: dict[str, Any], kind: str, reason: str, message: str = ""
) -> list[dict[str, Any]]:
    out = []
    for c in pod["spec"].get(kind) or []:
        w: dict[str, Any] = {"reason": reason}
        if message:
            w["message"] = message
        out.append(
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"waiting": w},
            }
        )
    return out


def _from_runner(
    pod: dict[str, Any], kind: str, runner: list[dict[str, Any]], job: str
) -> list[dict[str, Any]]:
    images = {c["name"]: c.get("image", "") for c in pod["spec"].get(kind) or []}
    out = []
    for c in runner:
        if c["name"] not in images:
            continue
        running = "running" in c["state"]
        st: dict[str, Any] = {
            "name": c["name"],
            "image": images[c["name"]],
            "imageID": "",
            "containerID": f"podnet://{job}/{c['name']}",
            "ready": running,
            "started": running,
            "restartCount": c.get("restartCount", 0),
            "state": c["state"],
        }
        if c.get("lastState"):
            st["lastState"] = c["lastState"]
        out.append(st)
    return out


def _before_runner(
    pod: dict[str, Any],
    job: JobState | None,
    runner: dict[str, Any] | None,
    error: tuple[str, str] | None,
    unschedulable: str | None,
) -> dict[str, Any] | None:
    """The status of a pod whose containers have not started (None: they have)."""
    if unschedulable is not None:
        return {
            "phase": "Pending",
            "conditions": [_cond("PodScheduled", False, "Unschedulable", unschedulable)],
            "message": unschedulable,
            "reason": "Unschedulable",
            "containerStatuses": _waiting(pod, "containers", "Unschedulable", unschedulable),
        }
    if error is not None:
        reason, message = error
        return {
            "phase": "Pending",
            "conditions": [
                _cond("PodScheduled", True),
                _cond("Ready", False, "ContainersNotReady", message),
            ],
            "message": message,
            "reason": reason,
            "containerStatuses": _waiting(pod, "containers", reason, message),
        }
    if runner is None:
        if job is not None and job.state == "PENDING":
            msg = f"Slurm job {job.job_id} is pending ({job.reason})"
            return {
                "phase": "Pending",
                "conditions": [
                    _cond("PodScheduled", True),
                    _cond("Ready", False, "SlurmPending", msg),
                ],
                "message": msg,
                "containerStatuses": _waiting(pod, "containers", "SlurmPending", msg),
            }
        if job is None or job.state in RUNNING_STATES:
            return {
                "phase": "Pending",
                "conditions": [
                    _cond("PodScheduled", True),
                    _cond("Ready", False, "ContainersNotReady"),
                ],
                "containerStatuses": _waiting(pod, "containers", "ContainerCreating"),
            }
    return None


def status(
    pod: dict[str, Any],
    job: JobState | None,
    runner: dict[str, Any] | None,
    error: tuple[str, str] | None = None,
    unschedulable: str | None = None,
) -> dict[str, Any]:
    """The pod's status. `job` is None when Slurm no longer lists the job (or it was never
    submitted), `runner` the runner's status.json (None before it wrote one), `error` a
    (reason, message) that keeps the pod from running, `unschedulable` sbatch's refusal."""
    early = _before_runner(pod, job, runner, error, unschedulable)
    if early is not None:
        return early
    ended = job is None or job.state not in RUNNING_STATES | {"PENDING"}
    phase = runner["phase"] if runner else "Failed"
    reason = message = ""
    if ended and phase not in ("Succeeded", "Failed"):
        phase = "Failed"
    if ended and phase == "Failed":
        state = job.state.split()[0] if job else ""
        reason, message = _ENDED.get(state, ("SlurmFailed", "the pod's Slurm job ended"))
        if runner and runner.get("message") and state in ("", "COMPLETED", "FAILED"):
            reason, message = "Error", runner["message"]
        if job and job.exit_code:
            message += f" (Slurm exit code {job.exit_code})"
    jobid = job.job_id if job else (runner or {}).get("job", "")
    out: dict[str, Any] = {"phase": phase}
    containers = _from_runner(pod, "containers", runner["containers"], jobid) if runner else []
    if runner and runner.get("init"):
        out["initContainerStatuses"] = _from_runner(pod, "initContainers", runner["init"], jobid)
    if not containers:
        containers = _waiting(
            pod, "containers", "PodInitializing" if phase == "Pending" else reason or "Error"
        )
    out["containerStatuses"] = containers
    ready = phase == "Running" and all(c["ready"] for c in containers)
    out["conditions"] = [
        _cond("PodScheduled", True),
        _cond("Initialized", phase != "Pending" or not pod["spec"].get("initContainers")),
        _cond("ContainersReady", ready),
        _cond("Ready", ready),
    ]
    if runner:
        out["podIP"] = runner["ip"]
        out["podIPs"] = [{"ip": runner["ip"]}]
        out["hostIP"] = runner["ip"]
        out["startTime"] = runner.get("startedAt")
    if reason:
        out["reason"], out["message"] = reason, message
    elif runner and runner.get("message"):
        out["message"] = runner["message"]
    return out
