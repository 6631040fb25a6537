# SPDX-License-Identifier: Apache-2.0
"""Slurm's commands as the user: submit, list, cancel, and what a job ended with."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from collections.abc import Mapping

# what the submitting environment must not pass to a job it makes (the control plane's
# own job's variables would become the new job's defaults or confuse its steps)
_JOB_VARS = re.compile(r"^(SLURM_|SBATCH_|SALLOC_|SRUN_|PODNET_|OMPI_|PMIX_)")


class SlurmError(Exception):
    """A Slurm command failed: str() is its message."""


@dataclasses.dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    reason: str  # squeue's %r: why pending, or None
    nodes: str
    exit_code: str = ""  # scontrol's ExitCode=N:S once ended


def clean_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    return {k: v for k, v in (os.environ if env is None else env).items() if not _JOB_VARS.match(k)}


def _run(
    argv: list[str],
    timeout: float = 60,
    input_text: str | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    exe = shutil.which(argv[0]) or argv[0]
    try:
        p = subprocess.run(
            [exe, *argv[1:]],
            capture_output=True,
            check=False,
            text=True,
            timeout=timeout,
            env={**clean_env(), **(env or {})},
            input=input_text,
        )
    except FileNotFoundError as e:
        raise SlurmError(f"{argv[0]}: not found (is this a Slurm node?)") from e
    except subprocess.TimeoutExpired as e:
        raise SlurmError(f"{argv[0]}: no answer in {timeout:.0f} s") from e
    if p.returncode != 0:
        msg = (p.stderr or p.stdout).strip().replace("\n", "; ")
        raise SlurmError(msg or f"{argv[0]} exited with {p.returncode}")
    return p.stdout


def sbatch(args: list[str], script: str, env: Mapping[str, str] | None = None) -> str:
    """Submit `script` (its text) with `args` (and `env` added to the environment): the job id."""
    out = _run(["sbatch", "--parsable", *args], input_text=script, env=env).strip()
    job = out.split(";", 1)[0]
    if not job.isdigit():
        raise SlurmError(f"sbatch said {out!r}, not a job id")
    return job


def scancel(job_ids: list[str], signal: str | None = None) -> None:
    if job_ids:
        _run(["scancel", *([f"--signal={signal}"] if signal else []), *job_ids])


def squeue_mine(name_prefix: str | None = None) -> dict[str, JobState]:
    """The user's jobs Slurm still lists: id -> state."""
    out = _run(["squeue", "--me", "-h", "-t", "all", "-o", "%i|%T|%r|%N|%j"])
    jobs = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) != 5:
            continue
        if name_prefix and not parts[4].startswith(name_prefix):
            continue
        jobs[parts[0]] = JobState(parts[0], parts[1], parts[2], parts[3])
    return jobs


def job_info(job_id: str) -> JobState | None:
    """A job's state and exit code from `scontrol show job` (None once Slurm forgot it)."""
    try:
        out = _run(["scontrol", "-o", "show", "job", job_id])
    except SlurmError as e:
        if "Invalid job id" in str(e):
            return None
        raise
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    return JobState(
        job_id,
        fields.get("JobState", "UNKNOWN"),
        fields.get("Reason", ""),
        fields.get("NodeList", ""),
        fields.get("ExitCode", ""),
    )
