"""C code of the SPANK plugin and the session helper.

* builds and runs test_podnet_c.c (escaper, request builder, reply parser with
  malformed replies, transport against a fake podnetd, session-helper logic),
  under AddressSanitizer/UBSan when the compiler has them;
* checks every request line it printed with Python's JSON parser;
* builds podnet_spank.so and podnet-session with the roles' Makefiles
  (-Wall -Wextra -Werror) against the installed Slurm headers;
* as root: runs the real setuid helper as an unprivileged user against a fake
  podnetd and a real network namespace (login, compute, refusals, admins,
  on_error, internal-sftp), checking netns, uids, capabilities and the PID the
  daemon saw.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
SPANK_DIR = ROOT / "roles" / "spank" / "files"
SESSION_DIR = ROOT / "roles" / "sshd_hooks" / "files"
HERE = Path(__file__).resolve().parent
WFLAGS = ["-Wall", "-Wextra", "-Werror"]
NOBODY = 65534


def _cc() -> str:
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        pytest.skip("no C compiler")
    return cc


def _sanitizer_flags(cc: str, tmp: Path) -> list[str]:
    probe = tmp / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    flags = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    res = subprocess.run(
        [cc, *flags, "-o", str(tmp / "probe"), str(probe)], capture_output=True, check=False
    )
    if res.returncode == 0 and subprocess.run([str(tmp / "probe")], check=False).returncode == 0:
        return flags
    return []


@pytest.fixture(scope="module")
def unit_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    cc = _cc()
    tmp = tmp_path_factory.mktemp("cunit")
    exe = tmp / "test_podnet_c"
    cmd = [
        cc,
        *WFLAGS,
        "-O1",
        "-g",
        *_sanitizer_flags(cc, tmp),
        f"-I{SPANK_DIR}",
        f"-I{SESSION_DIR}",
        "-o",
        str(exe),
        str(HERE / "test_podnet_c.c"),
        str(SPANK_DIR / "podnet_client.c"),
    ]
    subprocess.run(cmd, check=True)
    return subprocess.run(
        [str(exe)], capture_output=True, text=True, errors="replace", timeout=120, check=False
    )


def test_c_unit_program_passes(unit_run: subprocess.CompletedProcess[str]) -> None:
    failed = [line for line in unit_run.stdout.splitlines() if line.startswith("not ok")]
    assert unit_run.returncode == 0, "\n".join(failed) + unit_run.stderr
    assert "0 failed" in unit_run.stdout
    assert sum(line.startswith("ok ") for line in unit_run.stdout.splitlines()) > 100


def test_requests_are_valid_json(unit_run: subprocess.CompletedProcess[str]) -> None:
    reqs = [
        json.loads(line[4:]) for line in unit_run.stdout.splitlines() if line.startswith("REQ ")
    ]
    assert len(reqs) == 5
    up = reqs[0]
    assert up == {
        "v": 1,
        "op": "job_up",
        "job_id": 42,
        "user": "alice",
        "uid": 2001,
        "job_name": 'we ird"name\t\ufffd',
        "nodes": ["c1", 'c"2', "c\\3", "c\n4"],
        "node_index": 1,
    }
    assert reqs[1]["nodes"] == [] and reqs[1]["neg"] == -(2**63)
    assert reqs[2] == {"v": 1, "op": "login_acquire"}
    assert reqs[3] == {"v": 1, "op": "join", "target": "job"}
    assert reqs[4] == {"v": 1, "op": "join", "target": "job", "job_id": 77}


def _make(src: Path, tmp: Path, *args: str) -> Path:
    dest = tmp / src.name
    shutil.copytree(src, dest)
    res = subprocess.run(
        ["make", "-C", str(dest), *args], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "warning" not in res.stderr
    return dest


@pytest.mark.skipif(
    not Path("/usr/include/slurm/spank.h").exists(), reason="Slurm headers (libslurm-dev) missing"
)
def test_spank_plugin_builds(tmp_path: Path) -> None:
    _cc()
    out = _make(SPANK_DIR, tmp_path)
    so = out / "podnet_spank.so"
    syms = subprocess.run(
        ["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True, check=True
    ).stdout
    for sym in (
        "plugin_name",
        "plugin_type",
        "plugin_version",
        "slurm_spank_init",
        "slurm_spank_init_post_opt",
        "slurm_spank_task_init_privileged",
        "slurm_spank_exit",
        "slurm_spank_job_prolog",
        "slurm_spank_job_epilog",
    ):
        assert f" {sym}\n" in syms, sym
    # libslurm is not linked in: symbols come from the loading process
    ldd = subprocess.run(["ldd", str(so)], capture_output=True, text=True, check=False).stdout
    assert "libslurm" not in ldd


def test_session_helper_builds(tmp_path: Path) -> None:
    _cc()
    out = _make(SESSION_DIR, tmp_path, f"CLIENT_DIR={SPANK_DIR}")
    assert (out / "podnet-session").exists()


# ---------------------------------------------------------------------------
# the real setuid helper, as an unprivileged user, against a fake podnetd


class FakePodnetd:
    """One-line JSON request/reply server that records requests and peer creds."""

    def __init__(self, path: Path, reply: dict[str, Any]) -> None:
        self.path = path
        self.reply = reply
        self.requests: list[dict[str, Any]] = []
        self.peers: list[tuple[int, int, int]] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        path.chmod(0o666)
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                self.peers.append(struct.unpack("3i", cred))
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                if data:
                    self.requests.append(json.loads(data))
                    conn.sendall(json.dumps(self.reply).encode() + b"\n")

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(timeout=2)


@pytest.fixture(scope="module")
def helper_env() -> Iterator[dict[str, Any]]:
    if os.geteuid() != 0:
        pytest.skip("needs root (setuid binary, network namespace)")
    for tool in ("ip", "unshare", "setpriv", "mount"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} missing")
    cc = _cc()
    work = Path(tempfile.mkdtemp(prefix="pnut-", dir="/tmp"))
    work.chmod(0o755)
    netns = f"pnut{os.getpid()}"
    try:
        conf = work / "session.conf"
        exe = work / "podnet-session"
        subprocess.run(
            [
                cc,
                *WFLAGS,
                "-O2",
                f'-DPN_SESSION_CONF="{conf}"',
                f"-I{SPANK_DIR}",
                "-o",
                str(exe),
                str(SESSION_DIR / "podnet-session.c"),
                str(SPANK_DIR / "podnet_client.c"),
            ],
            check=True,
        )
        os.chown(exe, 0, 0)
        exe.chmod(0o4755)
        # a passwd copy where nobody has a real shell (bind-mounted in a
        # private mount namespace only)
        passwd = work / "passwd"
        lines = []
        for line in Path("/etc/passwd").read_text().splitlines():
            parts = line.split(":")
            if len(parts) == 7 and parts[2] == str(NOBODY):
                parts[6] = "/bin/sh"
            lines.append(":".join(parts))
        passwd.write_text("\n".join(lines) + "\n")
        passwd.chmod(0o644)
        fake_sftp = work / "fake-sftp-server"
        fake_sftp.write_text("#!/bin/sh\necho sftp-server-ran; readlink /proc/self/ns/net\n")
        fake_sftp.chmod(0o755)
        subprocess.run(["ip", "netns", "add", netns], check=True)
        yield {
            "work": work,
            "conf": conf,
            "exe": exe,
            "passwd": passwd,
            "netns": netns,
            "netns_ino": os.stat(f"/run/netns/{netns}").st_ino,
            "sock": work / "podnetd.sock",
            "sftp": fake_sftp,
        }
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=False)
        shutil.rmtree(work, ignore_errors=True)


PROBE = (
    "readlink /proc/self/ns/net; echo pid=$$; "
    "grep -E '^(Uid|Gid|CapEff|CapPrm|Groups):' /proc/self/status"
)


def _run_helper(env: dict[str, Any], conf: str, command: str | None = PROBE, **extra: str):
    env["conf"].write_text(conf)
    env["conf"].chmod(0o644)
    user_env = {"PATH": "/usr/bin:/bin"}
    if command is not None:
        user_env["SSH_ORIGINAL_COMMAND"] = command
    user_env.update(extra)
    env_args = [f"{k}={v}" for k, v in user_env.items()]
    script = 'mount --bind "$1" /etc/passwd && shift && exec "$@"'
    return subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            script,
            "sh",
            str(env["passwd"]),
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "env",
            "-i",
            *env_args,
            str(env["exe"]),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _pod_reply(env: dict[str, Any], uid: int = NOBODY, netns: str | None = None) -> dict[str, Any]:
    return {
        "v": 1,
        "ok": True,
        "pod": {
            "kind": "login",
            "name": env["netns"],
            "netns": netns or f"/run/netns/{env['netns']}",
            "ip": "203.0.113.7",
            "prefix": 24,
            "user": "nobody",
            "uid": uid,
        },
    }


def _conf(env: dict[str, Any], mode: str, **kw: str) -> str:
    lines = [f"mode={mode}", f"socket={env['sock']}", "timeout=5"]
    lines += [f"{k}={v}" for k, v in kw.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture
def daemon(helper_env: dict[str, Any]) -> Iterator[Any]:
    servers: list[FakePodnetd] = []

    def start(reply: dict[str, Any]) -> FakePodnetd:
        helper_env["sock"].unlink(missing_ok=True)
        srv = FakePodnetd(helper_env["sock"], reply)
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.close()
    helper_env["sock"].unlink(missing_ok=True)


def _status(out: str) -> dict[str, str]:
    res = {}
    for line in out.splitlines():
        if ":" in line and line.split(":")[0] in {"Uid", "Gid", "CapEff", "CapPrm", "Groups"}:
            key, val = line.split(":", 1)
            res[key] = " ".join(val.split())
    return res


def test_helper_login_pod(helper_env: dict[str, Any], daemon: Any) -> None:
    srv = daemon(_pod_reply(helper_env))
    res = _run_helper(helper_env, _conf(helper_env, "login"))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert f"net:[{helper_env['netns_ino']}]" in out
    st = _status(out)
    assert st["Uid"] == f"{NOBODY} {NOBODY} {NOBODY} {NOBODY}"
    assert st["Gid"] == f"{NOBODY} {NOBODY} {NOBODY} {NOBODY}"
    assert st["CapEff"] == "0000000000000000" and st["CapPrm"] == "0000000000000000"
    assert srv.requests == [{"v": 1, "op": "login_acquire"}]
    # the daemon saw the helper's PID, which the shell keeps (exec)
    pid = int(next(x for x in out.split() if x.startswith("pid=")).split("=")[1])
    assert srv.peers[0][0] == pid and srv.peers[0][1] == NOBODY


def test_helper_compute_job(helper_env: dict[str, Any], daemon: Any) -> None:
    srv = daemon(_pod_reply(helper_env))
    res = _run_helper(helper_env, _conf(helper_env, "compute"), SLURM_JOB_ID="42")
    assert res.returncode == 0, res.stderr
    assert f"net:[{helper_env['netns_ino']}]" in res.stdout
    assert srv.requests == [{"v": 1, "op": "join", "target": "job", "job_id": 42}]


def test_helper_login_shell(helper_env: dict[str, Any], daemon: Any) -> None:
    daemon(_pod_reply(helper_env))
    env = helper_env
    env["conf"].write_text(_conf(env, "login"))
    # no SSH_ORIGINAL_COMMAND: a login shell ("-sh") reading commands from stdin
    res = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            'mount --bind "$1" /etc/passwd && shift && exec "$@"',
            "sh",
            str(env["passwd"]),
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "env",
            "-i",
            "PATH=/usr/bin:/bin",
            str(env["exe"]),
        ],
        input="readlink /proc/self/ns/net; cat /proc/$$/cmdline | tr '\\0' ' '\n",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert f"net:[{env['netns_ino']}]" in res.stdout
    assert res.stdout.strip().endswith("-sh")


def test_helper_refuses_without_job(helper_env: dict[str, Any], daemon: Any) -> None:
    daemon({"v": 1, "ok": False, "error": {"code": "ENOENT", "message": "no job of nobody here"}})
    res = _run_helper(helper_env, _conf(helper_env, "compute", on_error="host"))
    assert res.returncode == 1
    assert "no running job on this node" in res.stderr
    assert "refused" in res.stderr
    assert "net:[" not in res.stdout


def test_helper_daemon_down(helper_env: dict[str, Any]) -> None:
    helper_env["sock"].unlink(missing_ok=True)
    res = _run_helper(helper_env, _conf(helper_env, "login"))
    assert res.returncode == 1
    assert "cannot connect to podnetd" in res.stderr
    host = os.readlink("/proc/self/ns/net")
    res = _run_helper(helper_env, _conf(helper_env, "login", on_error="host"))
    assert res.returncode == 0, res.stderr
    assert "continuing on the host network" in res.stderr
    assert host in res.stdout
    assert _status(res.stdout)["Uid"] == f"{NOBODY} {NOBODY} {NOBODY} {NOBODY}"


def test_helper_admin_never_captured(helper_env: dict[str, Any], daemon: Any) -> None:
    srv = daemon(_pod_reply(helper_env))
    # nobody's primary group is the admin group: shell runs unchanged
    res = _run_helper(helper_env, _conf(helper_env, "login", admin_group="nogroup"))
    assert res.returncode == 0, res.stderr
    assert os.readlink("/proc/self/ns/net") in res.stdout
    assert _status(res.stdout)["CapEff"] == "0000000000000000"
    assert srv.requests == []
    # a broken config still lets admins in (admin_group read before the error)
    res = _run_helper(helper_env, "admin_group=nogroup\nmode=broken\n")
    assert res.returncode == 0, res.stderr
    assert os.readlink("/proc/self/ns/net") in res.stdout
    # ... and refuses everybody else with a clear message
    res = _run_helper(helper_env, "mode=broken\n")
    assert res.returncode == 1
    assert "configuration error" in res.stderr


def test_helper_rejects_bad_pods(helper_env: dict[str, Any], daemon: Any) -> None:
    daemon(_pod_reply(helper_env, uid=NOBODY + 1))
    res = _run_helper(helper_env, _conf(helper_env, "login", on_error="host"))
    assert res.returncode == 1 and "another user" in res.stderr
    for bad in ("/etc/passwd", "/run/netns/../../etc/shadow", "/proc/1/ns/net"):
        daemon(_pod_reply(helper_env, netns=bad))
        res = _run_helper(helper_env, _conf(helper_env, "login"))
        assert res.returncode == 1, bad
        assert "bad pod from podnetd" in res.stderr, res.stderr
    daemon(_pod_reply(helper_env, netns="/run/netns/pnut-missing"))
    res = _run_helper(helper_env, _conf(helper_env, "login"))
    assert res.returncode == 1 and "bad pod" in res.stderr


def test_helper_internal_sftp(helper_env: dict[str, Any], daemon: Any) -> None:
    daemon(_pod_reply(helper_env))
    res = _run_helper(
        helper_env,
        _conf(helper_env, "login", sftp_server=str(helper_env["sftp"])),
        "internal-sftp",
    )
    assert res.returncode == 0, res.stderr
    assert "sftp-server-ran" in res.stdout
    assert f"net:[{helper_env['netns_ino']}]" in res.stdout


def test_helper_strips_loader_env(helper_env: dict[str, Any], daemon: Any) -> None:
    daemon(_pod_reply(helper_env))
    res = _run_helper(
        helper_env,
        _conf(helper_env, "login"),
        "env",
        LD_PRELOAD="/nonexistent.so",
        GLIBC_TUNABLES="x",
        KEEP_ME="yes",
    )
    assert res.returncode == 0, res.stderr
    assert "LD_PRELOAD" not in res.stdout and "GLIBC_TUNABLES" not in res.stdout
    assert "KEEP_ME=yes" in res.stdout
