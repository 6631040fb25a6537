# SPDX-License-Identifier: Apache-2.0
"""The collection as a site gets it (issue 14): the tarball holds what a site needs and
nothing of the lab, the tests or a developer's checkout, installs with ansible-galaxy,
and its playbooks parse from the installed copy alone. (The molecule lab deploys the
whole stack from the same installed tarball: `make test-molecule`.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _build(tmp: Path) -> Path:
    src = tmp / "src"
    # a developer's checkout: caches and build products beside the sources
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns("build", ".venv", ".git", "tests/output"),
        symlinks=True,
    )
    for junk in (".pytest_cache", ".mypy_cache", ".ruff_cache", "agent/src/podnet.egg-info"):
        (src / junk).mkdir(parents=True, exist_ok=True)
        (src / junk / "x").write_text("x")
    (src / "agent/native/podnet_spank.so").write_bytes(b"\0")
    out = tmp / "dist"
    subprocess.run(
        [BIN / "ansible-galaxy", "collection", "build", "--output-path", out, src],
        check=True,
        capture_output=True,
    )
    (tarball,) = out.glob("hpc-podnet-*.tar.gz")
    return tarball


@pytest.fixture(scope="module")
def tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build for the module's tests (each reads it or installs a copy of its own)."""
    return _build(tmp_path_factory.mktemp("tarball"))


def test_tarball_ships_what_a_site_needs_and_nothing_else(tarball: Path) -> None:
    with tarfile.open(tarball) as tf:
        names = {m.name.rstrip("/") for m in tf.getmembers()}
    top = {n.split("/")[0] for n in names}
    assert top <= {
        "MANIFEST.json",
        "FILES.json",
        "README.md",
        "LICENSE",
        "LICENSES",
        "CHANGELOG.md",
        "meta",
        "roles",
        "plugins",
        "playbooks",
        "docs",
        "inventories",
        "agent",
        "changelogs",
        "files",
    }, sorted(top)
    for gone in ("tests", "inventories/lab", "agent/native/tests", "agent/native/fuzz"):
        assert not any(n == gone or n.startswith(gone + "/") for n in names), gone
    for junk in (".pytest_cache", ".mypy_cache", ".ruff_cache", "egg-info", ".so", "__pycache__"):
        assert not any(junk in n for n in names), junk
    # what the roles build on the nodes from agent/native is there
    for role, var in (("spank", "spank_native_files"), ("sshd_hooks", "sshd_hooks_native_files")):
        files = yaml.safe_load((ROOT / f"roles/{role}/vars/main.yml").read_text())[var]
        missing = [f for f in files if f"agent/native/{f}" not in names]
        assert not missing, (role, missing)
    assert "agent/pyproject.toml" in names and "agent/src/podnet/node/agent.py" in names
    assert "playbooks/site.yml" in names and "inventories/sample/hosts.yml" in names
    # the alert rules a site's Prometheus loads (docs/monitoring.md)
    assert "files/prometheus/podnet.rules.yml" in names
    assert {"LICENSE", "LICENSES/Apache-2.0.txt", "LICENSES/GPL-3.0-or-later.txt"} <= names
    # the artifact builders a site runs (docs/admin-guide.md "Artifacts"), executable
    builders = {
        "agent/artifacts/build-artifacts.sh",
        "agent/artifacts/build-wheelhouse.sh",
        "agent/native/build-artifact.sh",
    }
    inputs = {
        "agent/requirements.txt",
        "agent/artifacts/coredns/go.mod",
        "agent/artifacts/coredns/go.sum",
        "agent/artifacts/coredns/main.go",
        "agent/artifacts/flannel/go.mod",
        "agent/artifacts/flannel/go.sum",
    }
    assert builders | inputs <= names, sorted((builders | inputs) - names)
    with tarfile.open(tarball) as tf:
        for b in builders:
            assert tf.getmember(b).mode & 0o111, f"{b} is not executable in the tarball"
    # the release data ships, the unreleased fragments and antsibull-changelog's cache do not
    assert {"changelogs/changelog.yaml", "changelogs/config.yaml"} <= names
    assert not any(
        n.startswith(("changelogs/fragments", "changelogs/.plugin-cache")) for n in names
    )
    print(f"tarball: {len(names)} entries, {tarball.stat().st_size} bytes")


def test_installed_tarball_parses_on_its_own(tarball: Path, tmp_path: Path) -> None:
    dest = tmp_path / "collections"
    # a site's controller: no ansible.cfg of the checkout (make exports ANSIBLE_CONFIG)
    env = {
        **{k: v for k, v in os.environ.items() if k != "ANSIBLE_CONFIG"},
        "ANSIBLE_COLLECTIONS_PATH": str(dest),
        "ANSIBLE_ROLES_PATH": str(tmp_path / "none"),
    }
    # from outside the checkout: its ansible.cfg finds the in-place collection
    # (.collections), and galaxy would then call the tarball "already installed"
    subprocess.run(
        [BIN / "ansible-galaxy", "collection", "install", "--no-deps", "-p", dest, tarball],
        check=True,
        capture_output=True,
        env=env,
        cwd=tmp_path,
    )
    assert (dest / "ansible_collections/hpc/podnet/MANIFEST.json").is_file()
    inv = dest / "ansible_collections/hpc/podnet/inventories/sample/hosts.yml"
    playbooks = [
        "hpc.podnet.site",
        "hpc.podnet.podnet",
        "hpc.podnet.backup",
        "hpc.podnet.restore",
        "hpc.podnet.reset",
        "hpc.podnet.remove_node",
        "hpc.podnet.upgrade",
        "hpc.podnet.scale",
        "hpc.podnet.certs",
    ]
    # one run parses them all (ansible-playbook takes several; any that does not parse fails it)
    r = subprocess.run(
        [BIN / "ansible-playbook", "-i", inv, "--syntax-check", *playbooks],
        env=env,
        cwd=tmp_path,  # not the checkout: its ansible.cfg points at .collections
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    # each was read from the installed copy: the syntax check names every playbook it parsed
    for pb in playbooks:
        installed = dest / "ansible_collections/hpc/podnet/playbooks" / f"{pb.split('.')[-1]}.yml"
        assert f"playbook: {installed}" in r.stdout, (pb, r.stdout)
    # tags per role phase and per component, from the installed copy
    r = subprocess.run(
        [BIN / "ansible-playbook", "-i", inv, "--list-tags", "hpc.podnet.site"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    for role in (
        "etcd",
        "coredns",
        "agent",
        "spank",
        "sshd_hooks",
        "gateway",
        "apptainer",
        "flannel",
        "slurm",
    ):
        for tag in (role, f"{role}_install", f"{role}_configure", f"{role}_run"):
            assert re.search(rf"[\[ ,]{tag}[,\]]", r.stdout), (tag, r.stdout)
    r = subprocess.run(
        [
            BIN / "ansible-playbook",
            "-i",
            inv,
            "--list-tasks",
            "--tags",
            "etcd_configure",
            "hpc.podnet.site",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    # (every role's argument spec check is tagged always by Ansible itself)
    roles = set(re.findall(r"^\s+(hpc\.podnet\.\w+) : (?!Validating arguments)", r.stdout, re.M))
    assert roles == {"hpc.podnet.preflight", "hpc.podnet.etcd"}, (roles, r.stdout)
    assert "Write the systemd unit" in r.stdout and "Install etcd" not in r.stdout, r.stdout
    # the sample inventory as a site copies it (issue 35, one install story): the PKI in a
    # directory the controller's user owns, next to the inventory; the release's artifacts/;
    # etcd 3.5 from the release's tarball (Debian 12)
    site = tmp_path / "mysite"
    shutil.copytree(inv.parent, site)
    for var, want in (
        ("podnet_pki_dir", f"{site}/pki/hpc1"),
        ("podnet_artifact_dir", "/srv/podnet/podnet-0.2.0/artifacts"),
        ("etcd_install_method", "artifact"),
    ):
        r = subprocess.run(
            [
                BIN / "ansible",
                "-i",
                site / "hosts.yml",
                "node001",
                "-m",
                "ansible.builtin.debug",
                "-a",
                f"var={var}",
            ],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        )
        assert f'"{var}": "{want}"' in r.stdout, (var, r.stdout)


def test_installed_wheelhouse_builder_builds(tarball: Path, tmp_path: Path) -> None:
    """An air-gapped site's step: the wheelhouse from the installed collection alone."""
    dest = tmp_path / "collections"
    subprocess.run(
        [BIN / "ansible-galaxy", "collection", "install", "--no-deps", "-p", dest, tarball],
        check=True,
        capture_output=True,
        env={**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(dest)},
        cwd=tmp_path,
    )
    coll = dest / "ansible_collections/hpc/podnet"
    out = tmp_path / "artifacts"
    r = subprocess.run(
        [coll / "agent/artifacts/build-wheelhouse.sh"],
        env={**os.environ, "PODNET_WHEELHOUSE_DIR": str(out), "PYTHON": sys.executable},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (house,) = out.glob("podnet-wheelhouse-*")
    wheels = sorted(p.name for p in house.glob("*.whl"))
    assert any(w.startswith("podnet-") for w in wheels), wheels
    sums = (house / "SHA256SUMS").read_text()
    assert all(w in sums for w in wheels), (wheels, sums)
