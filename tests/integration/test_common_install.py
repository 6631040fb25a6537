# SPDX-License-Identifier: Apache-2.0
"""hpc.podnet._common, the one install path of the roles' artifacts (docs/roles/_common.md), run
by ansible-playbook on this host (connection local) against an artifact directory made here and
a web mirror of it on loopback: the files land where asked with the artifact's bytes and mode,
the calling role's handler runs when one changed, a second run and a check run change nothing,
a mirror's file is fetched once however often the play runs, and a damaged, missing or
unchecked artifact stops the play naming the file, before anything is installed."""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

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


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    """An artifact directory as `make artifacts` writes it: each file with its .sha256 beside."""
    d = tmp_path / "artifacts"
    d.mkdir()
    for name, data in (("tool-1.0-linux-amd64", TOOL), ("plugin-2.0", PLUGIN)):
        (d / name).write_bytes(data)
        (d / f"{name}.sha256").write_text(f"{sha(data)}  {name}\n")
    return d


@pytest.fixture
def play(tmp_path: Path) -> Path:
    p = tmp_path / "play.yml"
    p.write_text(PLAY)
    for sub in ("bin", "lib"):
        (tmp_path / "node" / sub).mkdir(parents=True)
    return p


def run(play: Path, *args: str, ok: bool = True) -> str:
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / "build/collections"),
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
        "ANSIBLE_NOCOLOR": "1",
    }
    r = subprocess.run(
        [BIN / "ansible-playbook", play, "-e", f"node={play.parent}/node", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert (r.returncode == 0) == ok, r.stdout[-4000:] + r.stderr[-2000:]
    return r.stdout


def changed(out: str) -> int:
    recap = out[out.rindex("PLAY RECAP") :]
    return int(recap.split("changed=")[1].split()[0])


def test_install_from_a_directory(play: Path, artifacts: Path) -> None:
    node = play.parent / "node"
    src = ("-e", f"podnet_artifact_dir={artifacts}")
    out = run(play, "--check", "--diff", *src)
    assert changed(out) > 0, "check mode on a fresh node reported nothing to do"
    assert not (node / "bin/tool").exists(), "check mode changed the node"
    run(play, *src)
    assert (node / "bin/tool").read_bytes() == TOOL
    assert (node / "lib/plugin").read_bytes() == PLUGIN
    assert oct((node / "bin/tool").stat().st_mode & 0o7777) == "0o755"
    assert oct((node / "lib/plugin").stat().st_mode & 0o7777) == "0o750"
    assert (node / "restarted").exists(), "the handler of a changed file did not run"
    (node / "restarted").unlink()
    out = run(play, *src)
    assert changed(out) == 0, out[-3000:]
    assert not (node / "restarted").exists(), "the handler ran with nothing changed"
    out = run(play, "--check", "--diff", *src)
    assert changed(out) == 0, out[-3000:]
    # a file changed on the node is put back, and its handler runs (the plugin's does not)
    (node / "bin/tool").write_bytes(b"tampered")
    out = run(play, *src)
    assert changed(out) == 2, out[-3000:]  # the copy and the handler
    assert (node / "bin/tool").read_bytes() == TOOL
    assert (node / "restarted").exists()


def test_sha256sums_and_pinned_checksums(play: Path, artifacts: Path) -> None:
    """SHA256SUMS at the top of the directory serves instead of the .sha256 files; a pinned
    sha256 wins over both."""
    for f in artifacts.glob("*.sha256"):
        f.unlink()
    out = run(play, "-e", f"podnet_artifact_dir={artifacts}", ok=False)
    assert "tool-1.0-linux-amd64: no sha256 for it" in out, out[-3000:]
    assert not (play.parent / "node/bin/tool").exists()
    (artifacts / "SHA256SUMS").write_text(
        f"{sha(TOOL)}  tool-1.0-linux-amd64\n{sha(PLUGIN)} *plugin-2.0\n"
    )
    run(play, "-e", f"podnet_artifact_dir={artifacts}")
    assert (play.parent / "node/bin/tool").read_bytes() == TOOL
    # a pinned sha256 that the file does not have stops the play
    pinned = play.read_text().replace('mode: "0755"}', 'mode: "0755", sha256: "' + "0" * 64 + '"}')
    play.write_text(pinned)
    out = run(play, "-e", f"podnet_artifact_dir={artifacts}", ok=False)
    assert f"is not the expected {'0' * 64}" in out, out[-3000:]


def test_a_damaged_or_missing_artifact_stops_the_play(play: Path, artifacts: Path) -> None:
    node = play.parent / "node"
    (artifacts / "tool-1.0-linux-amd64").write_bytes(TOOL + b"x")
    out = run(play, "-e", f"podnet_artifact_dir={artifacts}", ok=False)
    want = (
        f"{artifacts}/tool-1.0-linux-amd64: sha256 {sha(TOOL + b'x')} is not the expected "
        f"{sha(TOOL)} (a damaged or mixed-up artifact); nothing installed"
    )
    assert want in out, out[-3000:]
    assert not (node / "bin/tool").exists() and not (node / "lib/plugin").exists()
    (artifacts / "tool-1.0-linux-amd64").unlink()
    out = run(play, "-e", f"podnet_artifact_dir={artifacts}", ok=False)
    assert f"{artifacts}/tool-1.0-linux-amd64: missing" in out, out[-3000:]
    # no source at all, or a relative one (copy would look for it in the role's files/)
    out = run(play, ok=False)
    assert "no source for it: set podnet_artifact_dir" in out, out[-3000:]
    out = run(play, "-e", "podnet_artifact_dir=build/artifacts", ok=False)
    assert "an absolute path" in out, out[-3000:]


class _Mirror(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        self.server.gets.append(self.path)  # type: ignore[attr-defined]


@pytest.fixture
def mirror(artifacts: Path) -> Iterator[tuple[str, list[str]]]:
    """The artifacts (with a SHA256SUMS) on a loopback web server; the paths it was asked for."""
    (artifacts / "SHA256SUMS").write_text(
        f"{sha(TOOL)}  tool-1.0-linux-amd64\n{sha(PLUGIN)}  plugin-2.0\n"
    )
    handler = functools.partial(_Mirror, directory=str(artifacts))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.gets = []  # type: ignore[attr-defined]
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.gets  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()


def test_a_mirror_is_fetched_once(play: Path, mirror: tuple[str, list[str]]) -> None:
    url, gets = mirror
    cache = play.parent / "controller-cache"
    args = ("-e", f"podnet_artifact_url={url}/", "-e", f"podnet_artifact_cache_dir={cache}")
    run(play, "--check", *args)
    assert not (play.parent / "node/bin/tool").exists(), "check mode changed the node"
    run(play, *args)
    out = run(play, *args)
    assert changed(out) == 0, out[-3000:]
    fetched = [g for g in gets if g != "/SHA256SUMS"]
    assert sorted(fetched) == ["/plugin-2.0", "/tool-1.0-linux-amd64"], gets
    assert gets.count("/SHA256SUMS") == 3, gets
    assert (play.parent / "node/bin/tool").read_bytes() == TOOL
    # a damaged file in the controller's cache is fetched again, never installed
    with (cache / "tool-1.0-linux-amd64").open("ab") as f:
        f.write(b"x")
    run(play, *args)
    assert (cache / "tool-1.0-linux-amd64").read_bytes() == TOOL
    assert gets.count("/tool-1.0-linux-amd64") == 2, gets


def test_an_artifact_with_its_own_url(
    play: Path, artifacts: Path, mirror: tuple[str, list[str]]
) -> None:
    """A role's url method (coredns_url, etcd_url): no artifact source needed, the pinned sha256
    is required, the file is downloaded once into the controller's cache."""
    url, gets = mirror
    cache = play.parent / "controller-cache"
    play.write_text(
        PLAY.replace(
            'mode: "0755"}',
            f'mode: "0755", url: "{url}/tool-1.0-linux-amd64", sha256: "{sha(TOOL)}"}}',
        ).replace("          - {src: plugin-2.0", "          # - {src: plugin-2.0")
    )
    args = ("-e", f"podnet_artifact_cache_dir={cache}")
    run(play, *args)
    out = run(play, *args)
    assert changed(out) == 0, out[-3000:]
    assert (play.parent / "node/bin/tool").read_bytes() == TOOL
    assert gets == ["/tool-1.0-linux-amd64"], gets
    # without the pin: refused, nothing fetched
    play.write_text(play.read_text().replace(f', sha256: "{sha(TOOL)}"', ""))
    out = run(play, *args, ok=False)
    assert "tool-1.0-linux-amd64: no sha256 for it" in out, out[-3000:]
    assert gets == ["/tool-1.0-linux-amd64"], gets
