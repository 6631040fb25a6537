# SPDX-License-Identifier: Apache-2.0
"""A pod's plan, what `podspec.plan` makes of a Kubernetes pod and the pod's job runs
(`runner`, through plan.json): its types, the error that says why a pod cannot run, what
a pod refers to in the API (`Sources`) and the values only the running job knows."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Protocol

# values of the pod only the running job knows: the runner fills them in
RUNTIME_POD_IP = "$(podnet:pod-ip)"
RUNTIME_NODE = "$(podnet:node)"


class PodSpecError(Exception):
    """A pod podnet cannot run as it is: `reason` is the Kubernetes-style reason shown in
    the pod's status (ErrImagePull, CreateContainerConfigError, ...), str() the message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Sources(Protocol):
    """What a pod refers to in the API."""

    def config_map(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def token(
        self, namespace: str, service_account: str, audience: str | None, seconds: int
    ) -> str: ...


@dataclasses.dataclass(frozen=True)
class ContainerPlan:
    name: str
    # the Apptainer command line, the env file's path inside it as written by the runner
    argv: list[str]
    env: list[tuple[str, str]]


@dataclasses.dataclass(frozen=True)
class PodPlan:
    key: str  # namespace/name
    uid: str
    job_name: str
    restart_policy: str
    grace_seconds: int
    init: list[ContainerPlan]
    containers: list[ContainerPlan]
    sbatch_args: list[str]
    # files the kubelet writes into the pod's directory before the job starts: relative
    # path -> (content, mode)
    files: dict[str, tuple[bytes, int]]
    dirs: list[str]

    def to_json(self) -> str:
        return json.dumps(
            {
                "key": self.key,
                "uid": self.uid,
                "restart_policy": self.restart_policy,
                "grace_seconds": self.grace_seconds,
                "init": [dataclasses.asdict(c) for c in self.init],
                "containers": [dataclasses.asdict(c) for c in self.containers],
            },
            indent=1,
        )


@dataclasses.dataclass(frozen=True)
class Cluster:
    """What every pod of this user's cluster gets."""

    api_host: str  # the API server's pod address
    api_port: int
    dns_server: str  # the control plane's DNS (Service names), its pod address
    search: list[str]  # resolv.conf search domains after the Kubernetes ones
    node_name: str
