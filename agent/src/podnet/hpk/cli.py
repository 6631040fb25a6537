# SPDX-License-Identifier: Apache-2.0
"""`podnet-hpk`: a user's own Kubernetes in Slurm jobs (docs/hpk.md).

podnet-hpk up       submit the control plane (or find it running); wait until its API
                    answers; the kubeconfig in ~/.kube/config (plain kubectl works)
podnet-hpk down     stop it: every pod's job and the control plane's
podnet-hpk status   where it stands
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from podnet.hpk import controlplane, runner, slurm
from podnet.hpk.settings import Settings, SettingsError, user_state_dir

KUBE_MARK = "podnet-hpk"  # the context name that says a kubeconfig is ours to replace


def _state(settings: Settings) -> Path:
    return user_state_dir(settings)


def _cp(state: Path) -> dict[str, Any]:
    try:
        data = json.loads((state / "control-plane.json").read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _job(job_id: str) -> slurm.JobState | None:
    if not job_id:
        return None
    return slurm.job_info(job_id)


def _install_kubeconfig(state: Path) -> str:
    """~/.kube/config from the control plane's, unless the user has one of another cluster
    there: then ~/.kube/podnet-hpk.config (and the message says so)."""
    text = (state / "kubeconfig").read_text()
    kube = Path.home() / ".kube"
    kube.mkdir(mode=0o700, exist_ok=True)
    dest = kube / "config"
    if dest.exists():
        try:
            mine = (yaml.safe_load(dest.read_text()) or {}).get("current-context") == KUBE_MARK
        except (OSError, yaml.YAMLError, AttributeError):
            mine = False
        if not mine:
            dest = kube / "podnet-hpk.config"
    tmp = dest.with_name(f".{dest.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(dest)
    if dest.name != "config":
        return f"kubeconfig: {dest} (~/.kube/config is another cluster's: export KUBECONFIG={dest})"
    return f"kubeconfig: {dest}"


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    state = _state(settings)
    cp = _cp(state)
    job = _job(cp.get("job", ""))
    if job and job.state in ("RUNNING", "PENDING") and cp.get("ready"):
        print(f"podnet-hpk: the control plane is up (job {job.job_id}): {cp['server']}")
        print(_install_kubeconfig(state))
        return 0
    if job and job.state in ("RUNNING", "PENDING", "CONFIGURING"):
        job_id = job.job_id
        print(f"podnet-hpk: the control plane's job {job_id} is starting; waiting for it")
    else:
        sbatch_args = [
            f"--job-name={args.name}",
            "--nodes=1",
            "--ntasks=1",
            f"--cpus-per-task={args.cpus or settings.control_plane_cpus}",
            f"--time={args.time or settings.control_plane_time}",
            f"--output={state / 'control-plane.log'}",
            "--open-mode=append",
            "--comment=podnet-hpk control plane",
            *settings.sbatch_args,
            *(["--nodelist", args.nodelist] if args.nodelist else []),
        ]
        script = f"#!/bin/sh\nexec {sys.executable} -m podnet.hpk.cli control-plane\n"
        try:
            job_id = slurm.sbatch(sbatch_args, script)
        except slurm.SlurmError as e:
            print(f"podnet-hpk: sbatch refused the control plane's job: {e}", file=sys.stderr)
            return 1
        print(f"podnet-hpk: control plane submitted as job {job_id}")
    t0 = time.monotonic()
    while time.monotonic() - t0 < args.wait:
        cp = _cp(state)
        if cp.get("job") == job_id and cp.get("ready"):
            print(
                f"podnet-hpk: API server ready at {cp['server']} ({cp['ip']}) "
                f"in {time.monotonic() - t0:.1f} s"
            )
            print(_install_kubeconfig(state))
            return 0
        if cp.get("job") == job_id and cp.get("ended"):
            print(
                f"podnet-hpk: the control plane failed: {cp['ended']}\n"
                f"{_tail(state / 'control-plane.log')}",
                file=sys.stderr,
            )
            return 1
        info = slurm.job_info(job_id)
        if info is None or info.state not in ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING"):
            what = f"{info.state} ({info.reason})" if info else "gone"
            print(
                f"podnet-hpk: the control plane's job {job_id} ended: {what}\n"
                f"{_tail(state / 'control-plane.log')}",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.3)
    print(
        f"podnet-hpk: the control plane (job {job_id}) did not answer in {args.wait:.0f} s; "
        f"`podnet-hpk status` tells where it is, {state / 'control-plane.log'} what it said",
        file=sys.stderr,
    )
    return 1


def _pod_jobs(state: Path) -> list[str]:
    out = []
    pods = state / "pods"
    if pods.exists():
        for d in pods.iterdir():
            j = d / "job"
            if j.exists():
                out.append(j.read_text().strip())
    return out


def cmd_down(args: argparse.Namespace, settings: Settings) -> int:
    state = _state(settings)
    cp = _cp(state)
    jobs = [j for j in [cp.get("job", "")] if j]
    if not jobs:
        print("podnet-hpk: no control plane recorded")
    try:
        # the control plane cancels its pods' jobs when it gets SIGTERM; the pods' jobs are
        # cancelled here too, should it be gone already
        slurm.scancel(jobs)
        deadline = time.monotonic() + args.wait
        while time.monotonic() < deadline:
            info = slurm.job_info(jobs[0]) if jobs else None
            if info is None or info.state not in (
                "RUNNING",
                "PENDING",
                "CONFIGURING",
                "COMPLETING",
            ):
                break
            time.sleep(0.5)
        left = [
            j
            for j in _pod_jobs(state)
            if (i := slurm.job_info(j)) and i.state in ("RUNNING", "PENDING", "CONFIGURING")
        ]
        slurm.scancel(left)
    except slurm.SlurmError as e:
        print(f"podnet-hpk: {e}", file=sys.stderr)
        return 1
    if args.purge:
        for sub in ("control-plane", "pods", "dns"):
            shutil.rmtree(state / sub, ignore_errors=True)
        for f in ("control-plane.json", "kubeconfig", "control-plane.log"):
            (state / f).unlink(missing_ok=True)
        print(
            f"podnet-hpk: {'control plane (job ' + jobs[0] + ') stopped, ' if jobs else ''}"
            f"its state removed from {state}: the next `podnet-hpk up` makes a new cluster"
        )
    elif jobs:
        print(
            f"podnet-hpk: control plane (job {jobs[0]}) stopped; its state stays in {state} "
            "(`podnet-hpk up` resumes; `podnet-hpk down --purge` removes it)"
        )
    return 0


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    state = _state(settings)
    cp = _cp(state)
    job = _job(cp.get("job", ""))
    out: dict[str, Any] = {"state_dir": str(state), **cp}
    if job:
        out["job_state"] = job.state
        out["job_reason"] = job.reason
    up = bool(job and job.state == "RUNNING" and cp.get("ready"))
    out["up"] = up
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
    elif up:
        print(
            f"up: job {cp['job']} on {job.nodes if job else '?'}, API {cp['server']} ({cp['ip']})"
        )
    elif not cp:
        print("down: never started (podnet-hpk up)")
    else:
        why = f"{job.state} ({job.reason})" if job else "gone from Slurm"
        if job and (job.state == "TIMEOUT" or job.reason == "TimeLimit"):
            why = "TIMEOUT: it reached its time limit"
        print(
            f"down: job {cp.get('job')} {why}; {cp.get('ended', '')}".rstrip("; ")
            + "; `podnet-hpk up` resumes it"
        )
    return 0 if up else 3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="podnet-hpk", description="Your own Kubernetes in Slurm jobs on podnet (docs/hpk.md)."
    )
    sub = ap.add_subparsers(dest="cmd", metavar="{up,down,status}")
    up = sub.add_parser(
        "up", help="start (or find) your control plane; kubeconfig in ~/.kube/config"
    )
    up.add_argument(
        "--time", help="the control plane job's time limit (Slurm's format; site default)"
    )
    up.add_argument("--cpus", type=int, help="CPUs of the control plane's job (site default)")
    up.add_argument("--nodelist", "-w", help="where the control plane runs (sbatch -w)")
    up.add_argument("--name", default="hpk", help="the control plane job's name (default hpk)")
    up.add_argument(
        "--wait", type=float, default=300, help="seconds to wait for the API (default 300)"
    )
    down = sub.add_parser("down", help="stop your control plane and every pod's job")
    down.add_argument("--wait", type=float, default=60, help="seconds to wait for the jobs to end")
    down.add_argument(
        "--purge",
        action="store_true",
        help="also remove the cluster's state (objects, keys, pods' files): "
        "the next up makes a new cluster",
    )
    st = sub.add_parser("status", help="where your control plane stands (exit 0: up, 3: down)")
    st.add_argument("--json", action="store_true", help="JSON output")
    cs = sub.add_parser(
        "check-settings", help="check a site settings file (the hpk role's validate)"
    )
    cs.add_argument("path", type=Path)
    sub.add_parser("control-plane", help=argparse.SUPPRESS)
    rp = sub.add_parser("run-pod", help=argparse.SUPPRESS)
    rp.add_argument("poddir")
    args = ap.parse_args(argv)
    if args.cmd is None:
        ap.print_help()
        return 2
    try:
        if args.cmd == "run-pod":
            return runner.main(args.poddir)
        if args.cmd == "check-settings":
            Settings.load(args.path, missing_ok=False)
            print(f"podnet-hpk: {args.path}: ok")
            return 0
        if args.cmd == "control-plane":
            return controlplane.main()
        settings = Settings.load()
        return {"up": cmd_up, "down": cmd_down, "status": cmd_status}[args.cmd](args, settings)
    except (SettingsError, slurm.SlurmError, OSError) as e:
        print(f"podnet-hpk: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
