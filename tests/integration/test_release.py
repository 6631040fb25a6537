# SPDX-License-Identifier: Apache-2.0
"""make release (tests/release/release.sh), built from the artifacts `make artifacts` built on
this machine (no lab, nothing downloaded): dist/podnet-<version>/ holds the collection tarball,
the artifact bundle and a SHA256SUMS over all of it. The bundle holds exactly the files the
roles install on nodes that stock Debian has not (named as the roles' defaults name them), each
one the bytes that was built, with its own SHA256SUMS; a second build gives the same bytes; the
tarball installs with ansible-galaxy into an empty collections path; and hpc.podnet._common
installs from the bundle with no other checksum than its SHA256SUMS."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import Playbook

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CACHE = Path(os.environ.get("PODNET_CACHE_DIR", "/var/cache/podnet-dev")) / "artifacts"
BUILT = Path(os.environ.get("PODNET_WHEELHOUSE_DIR", str(REPO / "build/artifacts")))
VERSION = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
NATIVE_FILES = {
    "podnet_spank.so",
    "pam_podnet.so",
    "podnet-init",
    "podnet-image-exec",
    "podnet-container",
    "podnet-cni",
}


def role_default(role: str, var: str) -> str:
    """A default of roles/ROLE/defaults/main.yml, its {{ other_default }} references resolved."""
    defaults = yaml.safe_load((REPO / f"roles/{role}/defaults/main.yml").read_text())
    value = str(defaults[var])
    while m := re.search(r"\{\{ *([a-z0-9_]+) *\}\}", value):
        value = value.replace(m.group(0), str(defaults[m.group(1)]))
    return value


def sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sums(index: Path) -> dict[str, str]:
    out = {}
    for line in index.read_text().splitlines():
        digest, name = line.split("  ", 1)
        out[name.removeprefix("./")] = digest
    return out


def files_under(top: Path) -> set[str]:
    return {str(p.relative_to(top)) for p in top.rglob("*") if p.is_file()}


def release(out: Path) -> str:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PODNET_WHEELHOUSE_DIR": str(BUILT)}
    r = subprocess.run(
        [REPO / "tests/release/release.sh", out],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist") / f"podnet-{VERSION}"
    print(release(out))
    return out


def test_sha256sums_cover_the_whole_release(dist: Path) -> None:
    index = sums(dist / "SHA256SUMS")
    assert set(index) == files_under(dist) - {"SHA256SUMS"}
    bad = [name for name, digest in index.items() if sha(dist / name) != digest]
    assert not bad, bad
    assert f"hpc-podnet-{VERSION}.tar.gz" in index
    # the collection podnet's needs, for a controller without Galaxy (issue 35)
    assert [n for n in index if n.startswith("community-crypto-") and n.endswith(".tar.gz")]
    # the bundle's own index (podnet_artifact_dir=<release>/artifacts): paths inside it
    bundle = dist / "artifacts"
    inner = sums(bundle / "SHA256SUMS")
    assert set(inner) == files_under(bundle) - {"SHA256SUMS"}
    assert all(index[f"artifacts/{name}"] == digest for name, digest in inner.items())


def test_the_bundle_holds_what_the_roles_install_and_nothing_else(dist: Path) -> None:
    bundle = dist / "artifacts"
    single = {
        role_default("coredns", "coredns_artifact_name"),
        role_default("flannel", "flannel_artifact_name"),
        role_default("flannel", "flannel_cni_artifact_name"),
        role_default("flannel", "flannel_cni_plugins_artifact_name"),
        role_default("apptainer", "apptainer_artifact_name"),
        role_default("etcd", "etcd_artifact_name"),
        role_default("hpk", "hpk_kube_artifact_name"),
    }
    # Apptainer for Debian 12 and the Debian packages of air-gapped nodes: built on demand
    # (agent/artifacts/build-apptainer-deb.sh, build-debian-packages.sh: by make release and the
    # site lane, not by make artifacts); Prometheus's tarball (fetch-prometheus.sh, make
    # artifacts): each in the bundle exactly when it was built (agent/artifacts/bundle.sh)
    for name in (
        role_default("apptainer", "apptainer_bookworm_artifact_name"),
        "podnet-debs-bookworm.tar",
        "podnet-debs-trixie.tar",
        role_default("prometheus", "prometheus_artifact_name"),
    ):
        if (CACHE / f"{name}.sha256").is_file():
            single.add(name)
    natives = {p.name for p in BUILT.glob(f"podnet-native-{VERSION}-*") if p.is_dir()}
    assert natives, f"no native build in {BUILT} (make artifacts)"
    wheelhouse = f"podnet-wheelhouse-{role_default('agent', 'agent_version')}"
    top = {p.name for p in bundle.iterdir()}
    assert top == single | natives | {wheelhouse, "SHA256SUMS"}, sorted(top)
    for name in single:
        # the bytes that were built (the builders' .sha256 beside them in the cache)
        assert sha(bundle / name) == (CACHE / f"{name}.sha256").read_text().split()[0], name
        assert not (bundle / name).is_symlink()
    for d in natives:
        got = {p.name for p in (bundle / d).iterdir()}
        assert got == NATIVE_FILES | {"SHA256SUMS", "PLATFORM"}, (d, sorted(got))
        for name, digest in sums(bundle / d / "SHA256SUMS").items():
            assert sha(bundle / d / name) == digest == sha(BUILT / d / name), (d, name)
    wheels = sums(bundle / wheelhouse / "SHA256SUMS")
    assert f"podnet-{VERSION}-py3-none-any.whl" in wheels
    assert set(wheels) | {"SHA256SUMS"} == {p.name for p in (bundle / wheelhouse).iterdir()}
    names = files_under(bundle)
    assert not [n for n in names if "/." in f"/{n}" or "cnitool" in n or n.endswith(".sha256")]


def test_a_second_build_gives_the_same_bytes(dist: Path, tmp_path: Path) -> None:
    again = tmp_path / f"podnet-{VERSION}"
    release(again)
    assert (again / "SHA256SUMS").read_bytes() == (dist / "SHA256SUMS").read_bytes()


def test_the_tarball_installs_into_an_empty_collections_path(dist: Path, tmp_path: Path) -> None:
    path = tmp_path / "collections"
    # a site's controller: no checkout's ansible.cfg (its collections_path links the checkout)
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(path),
        "ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        # only what the release holds: not the community.crypto of this venv's ansible package
        "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "false",
    }
    # a controller without Galaxy: the collection and its dependency from the release alone
    (crypto,) = dist.glob("community-crypto-*.tar.gz")
    r = subprocess.run(
        [
            BIN / "ansible-galaxy",
            "collection",
            "install",
            "--offline",
            "-p",
            path,
            crypto,
            dist / f"hpc-podnet-{VERSION}.tar.gz",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    coll = path / "ansible_collections/hpc/podnet"
    manifest = json.loads((coll / "MANIFEST.json").read_text())
    assert manifest["collection_info"]["version"] == VERSION
    assert (coll / "roles/_common/tasks/native.yml").is_file()
    assert (coll / "agent/artifacts/bundle.sh").stat().st_mode & 0o111
    assert not (coll / "dist").exists() and not (coll / "build").exists()
    r = subprocess.run(
        [BIN / "ansible-galaxy", "collection", "list", "hpc.podnet", "-p", path],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0 and f"hpc.podnet {VERSION}" in " ".join(r.stdout.split()), r.stdout
    assert (path / "ansible_collections/community/crypto/MANIFEST.json").is_file()


PLAY = """
- name: Install from the release's bundle
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    podnet_cluster_name: t
  tasks:
    - name: Files
      ansible.builtin.include_role:
        name: hpc.podnet._common
        tasks_from: files
      vars:
        _common_files: "{{ files }}"
"""


def test_the_roles_install_from_the_bundle(
    dist: Path, tmp_path: Path, playbook: Callable[[str], Playbook]
) -> None:
    """No pinned sha256 and no .sha256 beside the files: the bundle's SHA256SUMS is the index."""
    node = tmp_path / "node"
    node.mkdir()
    names = [
        role_default("coredns", "coredns_artifact_name"),
        role_default("flannel", "flannel_artifact_name"),
    ]
    files = [{"src": n, "dest": str(node / n), "mode": "0755"} for n in names]
    extra = json.dumps({"podnet_artifact_dir": str(dist / "artifacts"), "files": files})
    playbook(PLAY).run("-e", extra)
    for n in names:
        assert sha(node / n) == sha(dist / "artifacts" / n), n
