# SPDX-License-Identifier: Apache-2.0
"""The native binaries are built once per platform on the controller (`make artifacts`:
agent/native/build-artifact.sh on the lab's node image), or for a platform the release lacks
once on a node by the deployment (PODNET_E2E_NATIVE_BUILT: the site-install lane's own Slurm),
and copied to the nodes: no node keeps a build, and each runs exactly the binaries of the
artifact (issues 14, 35)."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import REPO, ssh

ARTIFACTS = os.environ.get("PODNET_WHEELHOUSE_DIR", str(REPO / "build/artifacts"))
#: where the deployment put the builds it made on a node for a platform the release lacks
#: (podnet_native_build_dir: a site's own Slurm release, tests/site-install/run.sh)
BUILT_ON_NODE = os.environ.get("PODNET_E2E_NATIVE_BUILT", "")
INSTALLED = {
    "podnet_spank.so": "/usr/local/lib/podnet/podnet_spank.so",
    "podnet-init": "/usr/local/lib/podnet/podnet-init",
    "podnet-image-exec": "/usr/local/lib/podnet/podnet-image-exec",
    "pam_podnet.so": "/usr/local/lib/security/pam_podnet.so",
    "podnet-container": "/usr/local/bin/podnet-container",
}


def _artifact_sums(node: str) -> dict[str, str]:
    release = ssh(node, ". /etc/os-release; echo $VERSION_CODENAME").stdout.strip()
    arch = ssh(node, "dpkg --print-architecture").stdout.strip()
    slurm = ssh(node, "sinfo --version").stdout.split()[1].rsplit(".", 1)[0]
    found = sorted(
        p
        for d in (ARTIFACTS, BUILT_ON_NODE)
        if d
        for p in Path(d).glob(f"podnet-native-*-{release}-{arch}-slurm{slurm}")
    )
    where = f"{ARTIFACTS} {BUILT_ON_NODE}".strip()
    assert found, f"no native artifact for {release}-{arch}-slurm{slurm} in {where}"
    sums = {}
    for line in (found[-1] / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        sums[name] = digest
    return sums


def test_nodes_run_the_prebuilt_binaries_and_build_nothing() -> None:
    for node in ("c1", "c2", "login"):
        sums = _artifact_sums(node)
        r = ssh(node, "sha256sum " + " ".join(INSTALLED.values()))
        installed = {path: digest for digest, path in (ln.split() for ln in r.stdout.splitlines())}
        for name, path in INSTALLED.items():
            assert installed[path] == sums[name], (node, name)
        mode = ssh(node, "stat -c '%a %U' /usr/local/bin/podnet-container").stdout.split()
        assert mode == ["4755", "root"], (node, mode)
        # no build directory: the roles copied binaries, they compiled nothing here
        r = ssh(node, "ls /usr/local/src/podnet 2>/dev/null | wc -l")
        assert r.stdout.strip() == "0", (node, r.stdout)
