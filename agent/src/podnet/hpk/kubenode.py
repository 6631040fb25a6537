# SPDX-License-Identifier: Apache-2.0
"""The virtual kubelet's Node object (`podnet.hpk.kubelet`): its registration, its status
(the cluster's capacity from sinfo, its addresses, the kubelet's port, Ready) and its
Lease in kube-node-lease, which the kubelet's heartbeat renews."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from podnet.hpk import podstatus, slurm
from podnet.hpk.kubeapi import ApiError, Client

log = logging.getLogger("podnet.hpk.kubelet")

LEASE_SECONDS = 40


def micro_now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1e6):06d}Z"


def capacity() -> dict[str, str]:
    """The cluster's CPUs and memory, from sinfo (every node once)."""
    cpus = mem = nodes = 0
    try:
        out = slurm._run(["sinfo", "-h", "-N", "-o", "%N %c %m"])
        seen = set()
        for line in out.splitlines():
            n, c, m = line.split()
            if n in seen:
                continue
            seen.add(n)
            nodes += 1
            cpus += int(c)
            mem += int(m.rstrip("+"))
    except (slurm.SlurmError, ValueError) as e:
        log.warning("sinfo: %s: the node shows no capacity", e)
    return {"cpu": str(max(cpus, 1)), "memory": f"{max(mem, 1)}Mi", "pods": "1000"}


def node_status(node: str, ip: str, port: int) -> dict[str, Any]:
    """The Node's status: capacity, addresses, the kubelet's port, Ready."""
    hb = podstatus.now()
    cap = capacity()
    return {
        "capacity": cap,
        "allocatable": cap,
        "addresses": [
            {"type": "InternalIP", "address": ip},
            {"type": "Hostname", "address": node},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        "nodeInfo": {
            "kubeletVersion": "podnet-hpk",
            "operatingSystem": "linux",
            "architecture": "amd64",
            "containerRuntimeVersion": "apptainer",
            "kernelVersion": os.uname().release,
            "osImage": "Slurm (podnet)",
            "kubeProxyVersion": "",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
        },
        "conditions": [
            {
                "type": t,
                "status": s,
                "reason": r,
                "lastHeartbeatTime": hb,
                "lastTransitionTime": hb,
            }
            for t, s, r in (
                ("Ready", "True", "KubeletReady"),
                ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                ("PIDPressure", "False", "KubeletHasSufficientPID"),
            )
        ],
    }


def register(api: Client, node: str, ip: str, port: int) -> None:
    """The Node object (made unless there), its status and its Lease."""
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node,
            "labels": {
                "kubernetes.io/hostname": node,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "virtual-kubelet",
                "podnet.hpc/slurm": "true",
            },
        },
        "spec": {},
    }
    try:
        api.request("POST", "/api/v1/nodes", body)
    except ApiError as e:
        if e.status != 409:
            raise
    patch_status(api, node, ip, port)
    renew_lease(api, node)


def patch_status(api: Client, node: str, ip: str, port: int) -> None:
    """The Node's status, sent again (heartbeat: the conditions' lastHeartbeatTime)."""
    api.request(
        "PATCH",
        f"/api/v1/nodes/{node}/status",
        {"status": node_status(node, ip, port)},
        content_type="application/merge-patch+json",
    )


def renew_lease(api: Client, node: str) -> None:
    """The node's Lease in kube-node-lease, renewed now (made unless there)."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}"
    spec = {
        "holderIdentity": node,
        "leaseDurationSeconds": LEASE_SECONDS,
        "renewTime": micro_now(),
    }
    lease = api.get(path)
    if lease is None:
        api.request(
            "POST",
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": node},
                "spec": spec,
            },
        )
    else:
        api.request("PATCH", path, {"spec": spec}, content_type="application/merge-patch+json")
