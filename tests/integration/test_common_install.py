# SPDX-License-Identifier: Apache-2.0
"""hpc.podnet._common, the one install path of the roles' artifacts (docs/roles/_common.md), run
by ansible-playbook on this host (connection local) against an artifact directory made here and
a web mirror of it on loopback: the files land where asked with the artifact's bytes and mode,
the calling role's handler runs when one changed, a second run and a check run change nothing,
a mirror's file is fetched once however often the play runs, and a damaged, missing or
unchecked artifact stops the play naming the file, before anything is installed. The native
entry point (the spank and sshd_hooks roles' binaries) picks the build of this host's Debian
release, architecture and Slurm release (`sinfo --version`, a script on PATH here: the lab's
e2e suites run the real one)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import Playbook, changed

PLAY = """
- name: Install artifacts
  hosts: localhost
  connection: local
  gather_facts: false
  handlers:
    - name: Test restart
      ansible.builtin.copy:
        content: restarted
        dest: "{{ node }}/restarted"
        mode: "0644"
  tasks:
    - name: Files
      ansible.builtin.include_role:
        name: hpc.podnet._common
        tasks_from: files
      vars:
        _common_files:
          - {src: tool-1.0-linux-amd64, dest: "{{ node }}/bin/tool", mode: "0755"}
          - {src: plugin-2.0, dest: "{{ node }}/lib/plugin", mode: "0750", notify: false}
        _common_notify: [Test restart]
"""

TOOL = b"\x7fELF tool " + os.urandom(4096)
PLUGIN = b"\x7fELF plugin " + os.urandom(2048)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_artifacts(tmp_path: Path) -> Path:
    """An artifact directory as `make artifacts` writes it: each file with its .sha256 beside."""
    d = tmp_path / "artifacts"
    d.mkdir()
    for name, data in (("tool-1.0-linux-amd64", TOOL), ("plugin-2.0", PLUGIN)):
        (d / name).write_bytes(data)
        (d / f"{name}.sha256").write_text(f"{sha(data)}  {name}\n")
    return d


def make_play(tmp_path: Path, text: str = PLAY) -> Playbook:
    """The play in tmp_path/play.yml, its node tmp_path/node (bin/, lib/). A cluster's name,
    as every inventory has (required; _common's dependency hpc.podnet.podnet names it in the
    default of podnet_pki_dir, which Ansible's check of its argument spec resolves)."""
    for sub in ("bin", "lib"):
        (tmp_path / "node" / sub).mkdir(parents=True)
    args = ("-e", f"node={tmp_path}/node", "-e", "podnet_cluster_name=t")
    return Playbook(tmp_path / "play.yml", args).write(text)


# Each test's scenario runs in a background thread (its own directory, ansible-playbook runs and
# web mirror; nothing shared), two at a time; the test waits for its own and re-raises what it
# raised. The runs are sequential within a scenario as before.
Scenario = Callable[[Path], None]
SCENARIOS: dict[str, Scenario] = {}


def scenario(fn: Scenario) -> Scenario:
    SCENARIOS[fn.__name__.lstrip("_")] = fn
    return fn


@pytest.fixture(scope="module")
def started(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[None]]]:
    """The scenarios of this module's selected tests, started at once."""
    selected = {
        item.name.removeprefix("test_")
        for item in request.session.items
        if getattr(item, "module", None) is request.module
    }
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="common-install")
    try:
        yield {
            name: pool.submit(fn, tmp_path_factory.mktemp(name[:30]))
            for name, fn in sorted(SCENARIOS.items(), key=lambda kv: -WEIGHT.get(kv[0], 0))
            if name in selected
        }
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@scenario
def _install_from_a_directory(d: Path) -> None:
    play, artifacts = make_play(d), make_artifacts(d)
    node = d / "node"
    src = ("-e", f"podnet_artifact_dir={artifacts}")
    out = play.run("--check", "--diff", *src)
    assert changed(out) > 0, "check mode on a fresh node reported nothing to do"
    assert not (node / "bin/tool").exists(), "check mode changed the node"
    play.run(*src)
    assert (node / "bin/tool").read_bytes() == TOOL
    assert (node / "lib/plugin").read_bytes() == PLUGIN
    assert oct((node / "bin/tool").stat().st_mode & 0o7777) == "0o755"
    assert oct((node / "lib/plugin").stat().st_mode & 0o7777) == "0o750"
    assert (node / "restarted").exists(), "the handler of a changed file did not run"
    (node / "restarted").unlink()
    out = play.run(*src)
    assert changed(out) == 0, out[-3000:]
    assert not (node / "restarted").exists(), "the handler ran with nothing changed"
    out = play.run("--check", "--diff", *src)
    assert changed(out) == 0, out[-3000:]
    # a file changed on the node is put back, and its handler runs (the plugin's does not)
    (node / "bin/tool").write_bytes(b"tampered")
    out = play.run(*src)
    assert changed(out) == 2, out[-3000:]  # the copy and the handler
    assert (node / "bin/tool").read_bytes() == TOOL
    assert (node / "restarted").exists()


def test_install_from_a_directory(started: dict[str, Future[None]]) -> None:
    started["install_from_a_directory"].result()


@scenario
def _sha256sums_and_pinned_checksums(d: Path) -> None:
    """SHA256SUMS at the top of the directory serves instead of the .sha256 files; a pinned
    sha256 wins over both."""
    play, artifacts = make_play(d), make_artifacts(d)
    for f in artifacts.glob("*.sha256"):
        f.unlink()
    out = play.run("-e", f"podnet_artifact_dir={artifacts}", ok=False)
    assert "tool-1.0-linux-amd64: no sha256 for it" in out, out[-3000:]
    assert not (d / "node/bin/tool").exists()
    (artifacts / "SHA256SUMS").write_text(
        f"{sha(TOOL)}  tool-1.0-linux-amd64\n{sha(PLUGIN)} *plugin-2.0\n"
    )
    play.run("-e", f"podnet_artifact_dir={artifacts}")
    assert (d / "node/bin/tool").read_bytes() == TOOL
    # a pinned sha256 that the file does not have stops the play
    play.write(PLAY.replace('mode: "0755"}', 'mode: "0755", sha256: "' + "0" * 64 + '"}'))
    out = play.run("-e", f"podnet_artifact_dir={artifacts}", ok=False)
    assert f"is not the expected {'0' * 64}" in out, out[-3000:]


def test_sha256sums_and_pinned_checksums(started: dict[str, Future[None]]) -> None:
    started["sha256sums_and_pinned_checksums"].result()


@scenario
def _a_damaged_or_missing_artifact_stops_the_play(d: Path) -> None:
    play, artifacts = make_play(d), make_artifacts(d)
    node = d / "node"
    (artifacts / "tool-1.0-linux-amd64").write_bytes(TOOL + b"x")
    out = play.run("-e", f"podnet_artifact_dir={artifacts}", ok=False)
    want = (
        f"{artifacts}/tool-1.0-linux-amd64: sha256 {sha(TOOL + b'x')} is not the expected "
        f"{sha(TOOL)} (a damaged or mixed-up artifact); nothing installed"
    )
    assert want in out, out[-3000:]
    assert not (node / "bin/tool").exists() and not (node / "lib/plugin").exists()
    (artifacts / "tool-1.0-linux-amd64").unlink()
    out = play.run("-e", f"podnet_artifact_dir={artifacts}", ok=False)
    assert f"{artifacts}/tool-1.0-linux-amd64: missing" in out, out[-3000:]
    # no source at all, or a relative one (copy would look for it in the role's files/)
    out = play.run(ok=False)
    assert "no source for it: set podnet_artifact_dir" in out, out[-3000:]
    out = play.run("-e", "podnet_artifact_dir=build/artifacts", ok=False)
    assert "an absolute path" in out, out[-3000:]


def test_a_damaged_or_missing_artifact_stops_the_play(started: dict[str, Future[None]]) -> None:
    started["a_damaged_or_missing_artifact_stops_the_play"].result()


class _Mirror(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        self.server.gets.append(self.path)  # type: ignore[attr-defined]


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[tuple[str, list[str]]]:
    """DIRECTORY on a loopback web server: its URL, the paths it was asked for."""
    handler = functools.partial(_Mirror, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.gets = []  # type: ignore[attr-defined]
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.gets  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()


def mirror(artifacts: Path) -> contextlib.AbstractContextManager[tuple[str, list[str]]]:
    """The artifacts (with a SHA256SUMS) on a loopback web server; the paths it was asked for."""
    (artifacts / "SHA256SUMS").write_text(
        f"{sha(TOOL)}  tool-1.0-linux-amd64\n{sha(PLUGIN)}  plugin-2.0\n"
    )
    return serve(artifacts)


@scenario
def _a_mirror_is_fetched_once(d: Path) -> None:
    play = make_play(d)
    with mirror(make_artifacts(d)) as (url, gets):
        cache = d / "controller-cache"
        args = ("-e", f"podnet_artifact_url={url}/", "-e", f"podnet_artifact_cache_dir={cache}")
        play.run("--check", *args)
        assert not (d / "node/bin/tool").exists(), "check mode changed the node"
        play.run(*args)
        out = play.run(*args)
        assert changed(out) == 0, out[-3000:]
        fetched = [g for g in gets if g != "/SHA256SUMS"]
        assert sorted(fetched) == ["/plugin-2.0", "/tool-1.0-linux-amd64"], gets
        assert gets.count("/SHA256SUMS") == 3, gets
        assert (d / "node/bin/tool").read_bytes() == TOOL
        # a damaged file in the controller's cache is fetched again, never installed
        with (cache / "tool-1.0-linux-amd64").open("ab") as f:
            f.write(b"x")
        play.run(*args)
        assert (cache / "tool-1.0-linux-amd64").read_bytes() == TOOL
        assert gets.count("/tool-1.0-linux-amd64") == 2, gets


def test_a_mirror_is_fetched_once(started: dict[str, Future[None]]) -> None:
    started["a_mirror_is_fetched_once"].result()


@scenario
def _an_artifact_with_its_own_url(d: Path) -> None:
    """A role's url method (coredns_url, etcd_url): no artifact source needed, the pinned sha256
    is required, the file is downloaded once into the controller's cache."""
    play = make_play(d)
    with mirror(make_artifacts(d)) as (url, gets):
        cache = d / "controller-cache"
        play.write(
            PLAY.replace(
                'mode: "0755"}',
                f'mode: "0755", url: "{url}/tool-1.0-linux-amd64", sha256: "{sha(TOOL)}"}}',
            ).replace("          - {src: plugin-2.0", "          # - {src: plugin-2.0")
        )
        args = ("-e", f"podnet_artifact_cache_dir={cache}")
        play.run(*args)
        out = play.run(*args)
        assert changed(out) == 0, out[-3000:]
        assert (d / "node/bin/tool").read_bytes() == TOOL
        assert gets == ["/tool-1.0-linux-amd64"], gets
        # without the pin: refused, nothing fetched
        play.write(play.path.read_text().replace(f', sha256: "{sha(TOOL)}"', ""))
        out = play.run(*args, ok=False)
        assert "tool-1.0-linux-amd64: no sha256 for it" in out, out[-3000:]
        assert gets == ["/tool-1.0-linux-amd64"], gets


def test_an_artifact_with_its_own_url(started: dict[str, Future[None]]) -> None:
    started["an_artifact_with_its_own_url"].result()


# --- native: the node's build of agent/native ------------------------------------------------

NATIVE_PLAY = """
- name: Install the native build
  hosts: localhost
  connection: local
  gather_facts: false
  handlers:
    - name: Test restart
      ansible.builtin.copy:
        content: restarted
        dest: "{{ node }}/restarted"
        mode: "0644"
  tasks:
    - name: Native
      ansible.builtin.include_role:
        name: hpc.podnet._common
        tasks_from: native
      vars:
        _common_native_version: "9.8.7"
        _common_native_dir: "{{ native_dir | default('') }}"
        _common_native_build_on_node_var: test_build_on_node
        _common_native_files:
          - {name: plugin.so, dest: "{{ node }}/lib/plugin.so", mode: "0644"}
          - {name: helper, dest: "{{ node }}/bin/helper", mode: "0755", notify: false}
        _common_notify: [Test restart]
    - name: Files beside it (a second list of the same play)
      ansible.builtin.include_role:
        name: hpc.podnet._common
        tasks_from: files
      vars:
        _common_files:
          - {src: tool-1.0-linux-amd64, dest: "{{ node }}/bin/tool", mode: "0755", notify: false}
"""


def _release() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip('"')
    raise AssertionError("no VERSION_CODENAME in /etc/os-release")


ARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64el"}.get(
    os.uname().machine, os.uname().machine
)


def build_name(slurm: str) -> str:
    return f"podnet-native-9.8.7-{_release()}-{ARCH}-slurm{slurm}"


def native_build(base: Path, slurm: str) -> dict[str, bytes]:
    """A build directory as agent/native/build-artifact.sh writes it (SHA256SUMS, PLATFORM)."""
    d = base / build_name(slurm)
    d.mkdir(parents=True)
    files = {
        "plugin.so": b"\x7fELF plugin for " + slurm.encode() + os.urandom(512),
        "helper": b"\x7fELF helper for " + slurm.encode() + os.urandom(512),
    }
    for name, data in files.items():
        (d / name).write_bytes(data)
    (d / "SHA256SUMS").write_text("".join(f"{sha(data)}  {name}\n" for name, data in files.items()))
    (d / "PLATFORM").write_text(f"{_release()}-{ARCH}-slurm{slurm}\n")
    return files


def make_native(tmp_path: Path) -> tuple[Playbook, Path, dict[str, dict[str, bytes]]]:
    """The play, a controller directory with builds for two Slurm releases of this host's
    platform (and one of another podnet version), and a PATH whose sinfo says 24.11."""
    play = make_play(tmp_path, NATIVE_PLAY)
    builds = tmp_path / "native"
    got = {v: native_build(builds, v) for v in ("22.05", "24.11")}
    other = builds / build_name("24.11").replace("9.8.7", "9.8.6")
    other.mkdir()
    fakebin = tmp_path / "slurm-bin"
    fakebin.mkdir()
    sinfo = fakebin / "sinfo"
    sinfo.write_text("#!/bin/sh\necho 'slurm 24.11.5'\n")
    sinfo.chmod(0o755)
    return play, builds, got


def with_sinfo(tmp_path: Path) -> str:
    return f"{tmp_path / 'slurm-bin'}:{os.environ['PATH']}"


@scenario
def _native_installs_the_build_of_the_node_platform(d: Path) -> None:
    (play, builds, got), artifacts = make_native(d), make_artifacts(d)
    node = d / "node"
    path = with_sinfo(d)
    args = ("-e", f"native_dir={builds}", "-e", f"podnet_artifact_dir={artifacts}")
    out = play.run("--check", "--diff", *args, path=path)
    assert changed(out) > 0, out[-3000:]
    assert not (node / "lib/plugin.so").exists(), "check mode changed the node"
    play.run(*args, path=path)
    assert (node / "lib/plugin.so").read_bytes() == got["24.11"]["plugin.so"]
    assert (node / "bin/helper").read_bytes() == got["24.11"]["helper"]
    assert oct((node / "bin/helper").stat().st_mode & 0o7777) == "0o755"
    assert (node / "bin/tool").read_bytes() == TOOL, "the files list beside it was not installed"
    assert (node / "restarted").exists(), "the handler of a changed file did not run"
    (node / "restarted").unlink()
    out = play.run(*args, path=path)
    assert changed(out) == 0, out[-3000:]
    out = play.run("--check", *args, path=path)
    assert changed(out) == 0, out[-3000:]
    # the helper changed on the node: put back, without the plugin's handler
    (node / "bin/helper").write_bytes(b"tampered")
    out = play.run(*args, path=path)
    assert changed(out) == 1, out[-3000:]
    assert not (node / "restarted").exists()
    # Slurm upgraded to 22.05's build (the other build directory): the plugin follows
    (d / "slurm-bin/sinfo").write_text("#!/bin/sh\necho 'slurm 22.05.8'\n")
    play.run(*args, path=path)
    assert (node / "lib/plugin.so").read_bytes() == got["22.05"]["plugin.so"]
    assert (node / "restarted").exists()


def test_native_installs_the_build_of_the_node_platform(started: dict[str, Future[None]]) -> None:
    started["native_installs_the_build_of_the_node_platform"].result()


@scenario
def _native_refuses_a_missing_or_damaged_build(d: Path) -> None:
    (play, builds, got), artifacts = make_native(d), make_artifacts(d)
    node = d / "node"
    path = with_sinfo(d)
    args = ("-e", f"native_dir={builds}", "-e", f"podnet_artifact_dir={artifacts}")
    (d / "slurm-bin/sinfo").write_text("#!/bin/sh\necho 'slurm 25.05.1'\n")
    out = play.run(*args, path=path, ok=False)
    assert "no native build of podnet 9.8.7 for this node" in out, out[-3000:]
    assert build_name("25.05") in out and "test_build_on_node: true" in out, out[-3000:]
    assert not any(node.rglob("*.so")) and not (node / "bin/tool").exists()
    (d / "slurm-bin/sinfo").write_text("#!/bin/sh\necho 'slurm 24.11.5'\n")
    plugin = builds / build_name("24.11") / "plugin.so"
    plugin.write_bytes(got["24.11"]["plugin.so"] + b"x")
    out = play.run(*args, path=path, ok=False)
    assert f"{plugin}: sha256 " in out and "nothing installed" in out, out[-3000:]
    assert not (node / "lib/plugin.so").exists() and not (node / "bin/helper").exists()
    # a real run without sinfo (no Slurm) stops; check mode shows the newest build instead
    out = play.run(*args, ok=False)
    assert "sinfo" in out, out[-3000:]
    plugin.write_bytes(got["24.11"]["plugin.so"])
    out = play.run("--check", *args)
    assert f"showing the binaries of {build_name('24.11')}" in out, out[-3000:]
    assert changed(out) > 0 and not (node / "lib/plugin.so").exists(), out[-3000:]


def test_native_refuses_a_missing_or_damaged_build(started: dict[str, Future[None]]) -> None:
    started["native_refuses_a_missing_or_damaged_build"].result()


@scenario
def _native_from_the_artifact_source(d: Path) -> None:
    """No directory of its own: the builds are part of the artifact source, a directory
    (the build's own SHA256SUMS serves) or a mirror (its SHA256SUMS names each file)."""
    (play, builds, got), artifacts = make_native(d), make_artifacts(d)
    node = d / "node"
    path = with_sinfo(d)
    for b in builds.iterdir():
        b.rename(artifacts / b.name)
    play.run("-e", f"podnet_artifact_dir={artifacts}", path=path)
    assert (node / "lib/plugin.so").read_bytes() == got["24.11"]["plugin.so"]
    for f in node.rglob("*"):
        if f.is_file():
            f.unlink()
    (artifacts / "SHA256SUMS").write_text(
        f"{sha(TOOL)}  tool-1.0-linux-amd64\n{sha(PLUGIN)}  plugin-2.0\n"
        + "".join(
            f"{sha(data)}  {build_name(v)}/{name}\n"
            for v, fs in got.items()
            for name, data in fs.items()
        )
    )
    with serve(artifacts) as (url, gets):
        cache = d / "controller-cache"
        args = ("-e", f"podnet_artifact_url={url}", "-e", f"podnet_artifact_cache_dir={cache}")
        play.run(*args, path=path)
        out = play.run(*args, path=path)
        assert changed(out) == 0, out[-3000:]
        fetched = sorted(g for g in gets if g != "/SHA256SUMS")
    assert fetched == sorted(
        [
            f"/{build_name('24.11')}/helper",
            f"/{build_name('24.11')}/plugin.so",
            "/tool-1.0-linux-amd64",
        ]
    ), fetched
    assert (node / "lib/plugin.so").read_bytes() == got["24.11"]["plugin.so"]


def test_native_from_the_artifact_source(started: dict[str, Future[None]]) -> None:
    started["native_from_the_artifact_source"].result()


#: the scenarios' relative length (runs): the longest start first
WEIGHT = {
    "native_installs_the_build_of_the_node_platform": 6,
    "install_from_a_directory": 5,
    "a_mirror_is_fetched_once": 4,
    "native_refuses_a_missing_or_damaged_build": 4,
    "native_from_the_artifact_source": 3,
    "sha256sums_and_pinned_checksums": 3,
    "an_artifact_with_its_own_url": 3,
    "a_damaged_or_missing_artifact_stops_the_play": 2,
}
