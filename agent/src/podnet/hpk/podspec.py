# SPDX-License-Identifier: Apache-2.0
"""A Kubernetes pod -> the Slurm job that runs it and the Apptainer commands of its
containers (docs/hpk.md, "How a pod runs"). Pure: what the API holds (config maps,
secrets, tokens) comes through `Sources`, the files to write come back in the plan (the
plan's types are `podnet.hpk.podplan`'s)."""

from __future__ import annotations

import base64
import posixpath
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from podnet.hpk import quantity
from podnet.hpk.podplan import (
    RUNTIME_POD_IP,
    Cluster,
    ContainerPlan,
    PodPlan,
    PodSpecError,
    Sources,
)
from podnet.hpk.settings import Settings

# HPK's annotation (its papers: extra sbatch flags of a pod's job) and podnet's own name
FLAGS_ANNOTATIONS = ("slurm.hpk.io/flags", "podnet.hpc/slurm-flags")
_DNS_LABEL = re.compile(r"[^a-z0-9-]+")
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


def job_name(namespace: str, name: str) -> str:
    """The Slurm job name of a pod: its podnet names are `pod0.<this>.<user>.<cluster>`."""
    base = name if namespace == "default" else f"{name}-{namespace}"
    return _DNS_LABEL.sub("-", base.lower()).strip("-")[:63] or "pod"


def resolve_image(image: str, dirs: list[Path]) -> Path:
    """`busybox`, `busybox:1.36`, `docker.io/library/busybox:latest`, `/abs/x.sif`: the SIF
    file or image directory to run; PodSpecError(ErrImagePull) naming what was looked for."""
    if image.startswith("/"):
        p = Path(image)
        if p.exists():
            return p
        raise PodSpecError("ErrImagePull", f"image {image}: no such file or directory")
    ref = image.split("@", 1)[0]
    if ":" in ref.rsplit("/", 1)[-1]:
        repo, tag = ref.rsplit(":", 1)
    else:
        repo, tag = ref, ""
    name = repo.rsplit("/", 1)[-1]
    if any(part in ("", ".", "..") for part in repo.split("/")):
        raise PodSpecError(
            "InvalidImageName", f"image {image!r}: not a name podnet can map to a file"
        )
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) or (
        tag and not re.fullmatch(r"[A-Za-z0-9._-]+", tag)
    ):
        raise PodSpecError(
            "InvalidImageName", f"image {image!r}: not a name podnet can map to a file"
        )
    candidates: list[Path] = []
    for d in dirs:
        if tag and tag != "latest":
            candidates += [d / f"{name}_{tag}.sif", d / f"{name}_{tag}"]
        else:
            candidates += [d / f"{name}.sif", d / name, d / f"{name}_latest.sif"]
    for c in candidates:
        if c.is_file() or (c.is_dir() and not c.name.endswith(".sif")):
            return c
    raise PodSpecError(
        "ErrImagePull",
        f"image {image}: none of {', '.join(str(c) for c in candidates)} exists "
        "(podnet runs images from SIF files or image directories: docs/hpk.md)",
    )


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) references: defined ones replaced, others kept, $$ -> $."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(sub, text)


def _sbatch_args(pod: dict[str, Any], settings: Settings, poddir: Path) -> list[str]:
    spec = pod["spec"]
    meta = pod["metadata"]
    cpus = 0
    mem = 0
    for c in spec.get("containers", []):
        req = {
            **(c.get("resources", {}).get("limits") or {}),
            **(c.get("resources", {}).get("requests") or {}),
        }
        try:
            if "cpu" in req:
                cpus += quantity.cpus(req["cpu"])
            if "memory" in req:
                mem += quantity.mebibytes(req["memory"])
        except quantity.QuantityError as e:
            raise PodSpecError("InvalidResources", f"container {c.get('name')}: {e}") from e
    args = [
        f"--job-name={job_name(meta['namespace'], meta['name'])}",
        "--nodes=1",
        "--ntasks=1",
        f"--cpus-per-task={max(cpus, 1)}",
        f"--output={poddir / 'slurm.out'}",
        "--open-mode=append",
        "--kill-on-invalid-dep=yes",
        f"--comment=podnet-hpk pod {meta['namespace']}/{meta['name']} uid {meta['uid']}",
    ]
    if mem:
        args.append(f"--mem={mem}M")
    deadline = spec.get("activeDeadlineSeconds")
    if isinstance(deadline, int) and deadline > 0:
        args.append(f"--time={max(1, -(-deadline // 60))}")
    args += list(settings.sbatch_args)
    for a in FLAGS_ANNOTATIONS:
        flags = (meta.get("annotations") or {}).get(a)
        if flags:
            try:
                args += shlex.split(flags)
            except ValueError as e:
                raise PodSpecError("InvalidSlurmFlags", f"annotation {a}: {e}") from e
    return args


class _Builder:
    def __init__(
        self,
        pod: dict[str, Any],
        settings: Settings,
        cluster: Cluster,
        poddir: Path,
        image_dirs: list[Path],
        sources: Sources,
    ) -> None:
        self.pod = pod
        self.meta = pod["metadata"]
        self.spec = pod["spec"]
        self.ns = self.meta["namespace"]
        self.settings = settings
        self.cluster = cluster
        self.poddir = poddir
        self.image_dirs = image_dirs
        self.sources = sources
        self.files: dict[str, tuple[bytes, int]] = {}
        self.dirs: list[str] = ["logs"]
        self.volumes: dict[str, Path] = {}

    # --- volumes ---------------------------------------------------------------------
    def _keyed(
        self, vol: str, data: dict[str, bytes], items: list[dict[str, Any]] | None, mode: int
    ) -> None:
        base = f"volumes/{vol}"
        self.dirs.append(base)
        chosen = (
            [(i["key"], i.get("path", i["key"]), i.get("mode")) for i in items]
            if items
            else [(k, k, None) for k in data]
        )
        for key, given, item_mode in chosen:
            if key not in data:
                raise PodSpecError("CreateContainerConfigError", f"volume {vol}: no key {key!r}")
            rel = posixpath.normpath(given)
            if rel.startswith(("/", "..")):
                raise PodSpecError(
                    "CreateContainerConfigError", f"volume {vol}: path {rel!r} leaves the volume"
                )
            parent = posixpath.dirname(rel)
            if parent:
                self.dirs.append(f"{base}/{parent}")
            self.files[f"{base}/{rel}"] = (
                data[key],
                item_mode if isinstance(item_mode, int) else mode,
            )
        self.volumes[vol] = self.poddir / base

    def _config_map_data(self, name: str, optional: bool) -> dict[str, bytes]:
        cm = self.sources.config_map(self.ns, name)
        if cm is None:
            if optional:
                return {}
            raise PodSpecError(
                "CreateContainerConfigError", f"configmap {self.ns}/{name} not found"
            )
        data = {k: v.encode() for k, v in (cm.get("data") or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (cm.get("binaryData") or {}).items()})
        return data

    def _secret_data(self, name: str, optional: bool) -> dict[str, bytes]:
        s = self.sources.secret(self.ns, name)
        if s is None:
            if optional:
                return {}
            raise PodSpecError("CreateContainerConfigError", f"secret {self.ns}/{name} not found")
        data = {k: base64.b64decode(v) for k, v in (s.get("data") or {}).items()}
        data.update({k: v.encode() for k, v in (s.get("stringData") or {}).items()})
        return data

    def _field(self, path: str) -> str:
        m = self.meta
        known: dict[str, Callable[[], str]] = {
            "metadata.name": lambda: m["name"],
            "metadata.namespace": lambda: m["namespace"],
            "metadata.uid": lambda: m["uid"],
            "spec.nodeName": lambda: self.cluster.node_name,
            "spec.serviceAccountName": lambda: self.spec.get("serviceAccountName", "default"),
            "status.podIP": lambda: RUNTIME_POD_IP,
            "status.podIPs": lambda: RUNTIME_POD_IP,
            "status.hostIP": lambda: RUNTIME_POD_IP,
        }
        ann = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if ann:
            return str((m.get(ann.group(1)) or {}).get(ann.group(2), ""))
        if path not in known:
            raise PodSpecError(
                "CreateContainerConfigError", f"fieldRef {path}: not supported by podnet"
            )
        return known[path]()

    def volumes_of_pod(self) -> None:
        for v in self.spec.get("volumes") or []:
            name = v["name"]
            if "emptyDir" in v:
                self.dirs.append(f"volumes/{name}")
                self.volumes[name] = self.poddir / "volumes" / name
            elif "hostPath" in v:
                path = posixpath.normpath(v["hostPath"]["path"])
                if not any(
                    path == p.rstrip("/") or path.startswith(p.rstrip("/") + "/")
                    for p in self.settings.host_path_prefixes
                ):
                    allowed = ", ".join(self.settings.host_path_prefixes) or "none"
                    raise PodSpecError(
                        "HostPathNotAllowed",
                        f"volume {name}: hostPath {path} is outside what the site allows "
                        f"(host_path_prefixes: {allowed})",
                    )
                self.volumes[name] = Path(path)
            elif "configMap" in v:
                src = v["configMap"]
                data = self._config_map_data(src["name"], bool(src.get("optional")))
                self._keyed(name, data, src.get("items"), src.get("defaultMode", 0o644))
            elif "secret" in v:
                src = v["secret"]
                data = self._secret_data(src["secretName"], bool(src.get("optional")))
                self._keyed(name, data, src.get("items"), src.get("defaultMode", 0o600) & 0o700)
            elif "downwardAPI" in v:
                items = v["downwardAPI"].get("items") or []
                data = {
                    i["path"]: self._field(i["fieldRef"]["fieldPath"]).encode()
                    for i in items
                    if "fieldRef" in i
                }
                self._keyed(name, data, None, 0o644)
            elif "projected" in v:
                data = {}
                for src in v["projected"].get("sources") or []:
                    data.update(self._projected(src))
                self._keyed(name, data, None, v["projected"].get("defaultMode", 0o600) & 0o700)
            else:
                kinds = sorted(k for k in v if k != "name")
                raise PodSpecError(
                    "UnsupportedVolume",
                    f"volume {name}: {', '.join(kinds)} not supported by podnet",
                )

    def _projected(self, src: dict[str, Any]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        if "serviceAccountToken" in src:
            t = src["serviceAccountToken"]
            sa = self.spec.get("serviceAccountName") or "default"
            out[t["path"]] = self.sources.token(
                self.ns, sa, t.get("audience"), int(t.get("expirationSeconds", 3600))
            ).encode()
        for kind, fetch in (("configMap", self._config_map_data), ("secret", self._secret_data)):
            if kind in src:
                s = src[kind]
                data = fetch(s["name"], bool(s.get("optional")))
                for i in s.get("items") or [{"key": k, "path": k} for k in data]:
                    if i["key"] in data:
                        out[i.get("path", i["key"])] = data[i["key"]]
        if "downwardAPI" in src:
            for i in src["downwardAPI"].get("items") or []:
                if "fieldRef" in i:
                    out[i["path"]] = self._field(i["fieldRef"]["fieldPath"]).encode()
        return out

    # --- containers ------------------------------------------------------------------
    def _env_from(self, c: dict[str, Any], env: dict[str, str]) -> None:
        for src in c.get("envFrom") or []:
            prefix = src.get("prefix", "")
            if "configMapRef" in src:
                r = src["configMapRef"]
                data = self._config_map_data(r["name"], bool(r.get("optional")))
            elif "secretRef" in src:
                r = src["secretRef"]
                data = self._secret_data(r["name"], bool(r.get("optional")))
            else:
                continue
            for k, val in data.items():
                env[prefix + k] = val.decode(errors="replace")

    def _env(self, c: dict[str, Any]) -> list[tuple[str, str]]:
        env: dict[str, str] = {
            "KUBERNETES_SERVICE_HOST": self.cluster.api_host,
            "KUBERNETES_SERVICE_PORT": str(self.cluster.api_port),
            "HOSTNAME": self.meta["name"],
        }
        self._env_from(c, env)
        for e in c.get("env") or []:
            name = e["name"]
            if "value" in e or "valueFrom" not in e:
                env[name] = expand(e.get("value", ""), env)
                continue
            vf = e["valueFrom"]
            if "fieldRef" in vf:
                env[name] = self._field(vf["fieldRef"]["fieldPath"])
            elif "configMapKeyRef" in vf or "secretKeyRef" in vf:
                ref = vf.get("configMapKeyRef") or vf["secretKeyRef"]
                fetch = self._config_map_data if "configMapKeyRef" in vf else self._secret_data
                data = fetch(ref["name"], bool(ref.get("optional")))
                if ref["key"] in data:
                    env[name] = data[ref["key"]].decode(errors="replace")
                elif not ref.get("optional"):
                    raise PodSpecError(
                        "CreateContainerConfigError",
                        f"env {name}: no key {ref['key']!r} in {ref['name']}",
                    )
            elif "resourceFieldRef" in vf:
                env[name] = "0"
            else:
                raise PodSpecError(
                    "CreateContainerConfigError", f"env {name}: valueFrom not supported by podnet"
                )
        return list(env.items())

    def container(self, c: dict[str, Any]) -> ContainerPlan:
        name = c["name"]
        image = resolve_image(c.get("image") or "", self.image_dirs)
        env = self._env(c)
        envmap = dict(env)
        command = [expand(a, envmap) for a in c.get("command") or []]
        args = [expand(a, envmap) for a in c.get("args") or []]
        # -q: Apptainer's own notes (a SIF unpacked to a sandbox...) stay out of the pod's log
        argv = [
            self.settings.apptainer,
            "-q",
            "exec" if command else "run",
            "--contain",
            "--cleanenv",
        ]
        argv += ["--env-file", str(self.poddir / f"env/{name}.env")]
        argv += ["--bind", f"{self.poddir / 'resolv.conf'}:/etc/resolv.conf"]
        argv += ["--bind", f"{self.poddir / 'hosts'}:/etc/hosts"]
        for m in c.get("volumeMounts") or []:
            src = self.volumes.get(m["name"])
            if src is None:
                raise PodSpecError(
                    "CreateContainerConfigError", f"container {name}: no volume {m['name']!r}"
                )
            if m.get("subPath"):
                sub = posixpath.normpath(m["subPath"])
                if sub.startswith(("/", "..")):
                    raise PodSpecError(
                        "CreateContainerConfigError",
                        f"container {name}: subPath {sub!r} leaves the volume",
                    )
                src = src / sub
            dst = m["mountPath"]
            if "," in str(src) or ":" in str(src) or "," in dst or ":" in dst:
                raise PodSpecError(
                    "CreateContainerConfigError",
                    f"container {name}: mount path {dst!r} has ',' or ':'",
                )
            argv += ["--bind", f"{src}:{dst}{':ro' if m.get('readOnly') else ''}"]
        if c.get("workingDir"):
            argv += ["--pwd", c["workingDir"]]
        argv.append(str(image))
        argv += command + args
        return ContainerPlan(name=name, argv=argv, env=env)

    def files_of_pod(self) -> None:
        ns = self.ns
        dom = self.settings.cluster_domain
        search = [f"{ns}.svc.{dom}", f"svc.{dom}", dom, *self.cluster.search]
        resolv = (
            f"nameserver {self.cluster.dns_server}\nsearch {' '.join(search)}\noptions ndots:5\n"
        )
        self.files["resolv.conf"] = (resolv.encode(), 0o644)
        # the pod's own line is added by the runner (its address is known there)
        self.files["hosts"] = (
            b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
            0o644,
        )
        self.dirs.append("env")


def plan(
    pod: dict[str, Any],
    settings: Settings,
    cluster: Cluster,
    poddir: Path,
    image_dirs: list[Path],
    sources: Sources,
) -> PodPlan:
    """How to run `pod` (PodSpecError when it cannot run as it is)."""
    b = _Builder(pod, settings, cluster, poddir, image_dirs, sources)
    spec = pod["spec"]
    b.volumes_of_pod()
    b.files_of_pod()
    if not spec.get("containers"):
        raise PodSpecError("CreateContainerConfigError", "the pod has no containers")
    init = [b.container(c) for c in spec.get("initContainers") or []]
    containers = [b.container(c) for c in spec["containers"]]
    meta = pod["metadata"]
    grace = spec.get("terminationGracePeriodSeconds")
    return PodPlan(
        key=f"{meta['namespace']}/{meta['name']}",
        uid=meta["uid"],
        job_name=job_name(meta["namespace"], meta["name"]),
        restart_policy=spec.get("restartPolicy", "Always"),
        grace_seconds=min(int(grace) if isinstance(grace, int) else 30, 120),
        init=init,
        containers=containers,
        sbatch_args=_sbatch_args(pod, settings, poddir),
        files=b.files,
        dirs=sorted(set(b.dirs)),
    )
