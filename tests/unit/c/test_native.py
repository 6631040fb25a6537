# SPDX-License-Identifier: Apache-2.0
"""agent/native, the C side of podnet (SPANK plugin, pam_podnet.so, the podnetd client).

* runs its unit test programs, one per file (tests/test_util.c: UTF-8, the bounded
  buffer, integers; test_json.c: escaper, request builder, reply parser;
  test_transport.c: pn_call against a fake podnetd; test_pod.c: netns and pod name
  checks; test_session.c: pam_podnet.so's configuration, requests and outcomes;
  test_spank.c: the SPANK plugin's PODNET_POD_* values and the environment forms of
  its options, against stand-ins of Slurm's calls),
  under ASan/UBSan when available;
* checks every request line they printed with Python's JSON parser;
* differential tests of podnet_json.c against Python's json module: escaped random
  byte strings read back as the input (invalid UTF-8 and NUL as U+FFFD), and random
  and mutated replies, where the C parser must never accept what Python rejects and
  must read what it accepts as Python does;
* builds podnet_spank.so and pam_podnet.so from exactly the files the roles copy
  (vars/main.yml), checks their exports and that they call no other program.
The fuzz targets run in test_fuzz.py; the module's real work (sshd, Slurm, setns) is
tested on the lab: tests/e2e.
"""

from __future__ import annotations

import json
import random
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from nativelib import NATIVE, ROOT, cc, make_env

UNITS = {"test_util": 40, "test_json": 84, "test_transport": 12, "test_pod": 12, "test_session": 34}
# the SPANK plugin's options and environment (tests/test_spank.c): built where Slurm's
# headers are (the Makefile's condition), as the plugin itself
if Path("/usr/include/slurm/spank.h").exists():
    UNITS["test_spank"] = 28


def _run(exe: Path, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [str(exe), *args], input=data, capture_output=True, timeout=120, check=False
    )


@pytest.mark.parametrize("name", sorted(UNITS))
def test_unit_program_passes(native: Path, name: str) -> None:
    res = _run(native / name)
    out = res.stdout.decode("utf-8", "replace")
    failed = [line for line in out.splitlines() if line.startswith("not ok")]
    assert res.returncode == 0, "\n".join(failed) + res.stderr.decode("utf-8", "replace")
    assert "checks, 0 failed" in out
    assert sum(line.startswith("ok ") for line in out.splitlines()) >= UNITS[name]


def test_requests_are_valid_json(native: Path) -> None:
    reqs = [
        json.loads(line[4:].decode())  # a request line is UTF-8, whatever it carries
        for name in ("test_json", "test_session")
        for line in _run(native / name).stdout.splitlines()
        if line.startswith(b"REQ ")
    ]
    assert len(reqs) == 5
    assert reqs[0] == {
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


# --- differential tests against Python's json ---------------------------------------


def _records(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def _sanitized(b: bytes) -> str:
    """What the escaper promises a reader: NUL and every byte that starts no well-formed
    UTF-8 sequence become U+FFFD, one per byte (Python's strict decoder decides)."""
    out, i = [], 0
    while i < len(b):
        for n in (1, 2, 3, 4):
            try:
                ch = b[i : i + n].decode("utf-8")
            except UnicodeDecodeError:
                continue
            break
        else:
            ch, n = "\ufffd", 1
        out.append("\ufffd" if ch == "\0" else ch)
        i += n
    return "".join(out)


HOT = [0, 0x1F, 0x22, 0x5C, 0x7F, 0x80, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xED, 0xEF, 0xF0]
HOT += [0xF4, 0xF5, 0xFF, 0x0A, 0x0D, 0x09, 0x2F, 0x75]


def _random_bytes(rng: random.Random) -> bytes:
    kind = rng.randrange(4)
    if kind == 0:  # bytes, often the interesting ones
        return bytes(
            rng.choice(HOT) if rng.random() < 0.5 else rng.randrange(256)
            for _ in range(rng.randrange(40))
        )
    if kind == 1:  # valid text of any plane
        cps = [
            rng.choice([rng.randrange(0x80), rng.randrange(0x800), rng.randrange(0x10000)])
            for _ in range(rng.randrange(20))
        ]
        cps += [rng.randrange(0x10000, 0x110000) for _ in range(rng.randrange(3))]
        text = "".join(chr(c) for c in cps if not 0xD800 <= c <= 0xDFFF)
        return text.encode()
    if kind == 2:  # text with encoded surrogates and overlong forms
        parts = [
            chr(rng.randrange(0xD800, 0xE000)).encode("utf-8", "surrogatepass"),
            b"\xc0\xaf",
            b"\xe0\x80\xaf",
            b"\xf0\x80\x80\xaf",
            b"\xf4\x90\x80\x80",
            b"ok",
        ]
        return b"".join(rng.choice(parts) for _ in range(rng.randrange(1, 6)))
    text = "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(30)))
    raw = bytearray(text.replace("\ud800", "").encode("utf-8", "replace"))
    for _ in range(rng.randrange(1, 4)):  # then cut or corrupt it
        if raw:
            raw[rng.randrange(len(raw))] = rng.randrange(256)
    return bytes(raw[: rng.randrange(len(raw) + 1)])


def test_escape_round_trip_matches_python_json(native: Path) -> None:
    rng = random.Random(1313)
    inputs = [bytes(range(256)), b"\xed\xa0\x80\xed\xb0\x80"] + [
        _random_bytes(rng) for _ in range(20000)
    ]
    res = _run(native / "json_filter", "escape", data=_records(inputs))
    assert res.returncode == 0, res.stderr.decode("utf-8", "replace")
    lines = res.stdout.split(b"\n")
    assert lines[-1] == b"" and len(lines) == len(inputs) + 1
    for raw, esc in zip(inputs, lines, strict=False):
        text = esc.decode("utf-8")  # the escaper's output is always UTF-8
        assert json.loads('"' + text + '"') == _sanitized(raw), (raw, esc)


FIELDS = {
    "code": 32,
    "message": 512,
    "name": 64,
    "netns": 256,
    "ip": 64,
    "user": 64,
    "fqdn": 256,
    "domain": 256,
}
POD_STRS = ("name", "netns", "ip", "user", "fqdn", "domain")
INT64 = range(-(2**63), 2**63)


def _rand_str(rng: random.Random, maxlen: int = 12) -> str:
    pool = 'abcxyz-_./é€😀"\\\n\t\x01\x7f '
    if rng.random() < 0.02:
        pool += "\0"
    return "".join(rng.choice(pool) for _ in range(rng.randrange(maxlen)))


def _rand_value(rng: random.Random, depth: int) -> Any:
    k = rng.randrange(9 if depth < 36 else 6)
    if k == 0:
        return rng.choice([True, False, None])
    if k == 1:
        return rng.choice([0, -1, 7, 2**63 - 1, -(2**63), 2**64, -(2**64), 1.5, -2.5e-7, 1e300])
    if k in (2, 3, 4):
        return _rand_str(rng, rng.choice([4, 12, 80, 700]))
    if k == 5:
        return rng.randrange(-5, 5000)
    if k in (6, 7):
        return [_rand_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = [*FIELDS, "uid", "v"]
    return {
        _rand_str(rng, 6) if rng.random() < 0.3 else rng.choice(keys): _rand_value(rng, depth + 1)
        for _ in range(rng.randrange(4))
    }


def _maybe(rng: random.Random, p: float, good: Any, bad: list[Any]) -> Any:
    """good with probability p, else one of bad"""
    return good if rng.random() < p else rng.choice(bad)


def _rand_reply(rng: random.Random) -> dict[str, Any]:
    """A reply as podnetd could send it, with a few wrong types, sizes and values."""
    doc: dict[str, Any] = {}
    if rng.random() < 0.97:
        doc["v"] = _maybe(rng, 0.9, 1, [2, "1", 1.0, True, 0])
    if rng.random() < 0.97:
        doc["ok"] = _maybe(rng, 0.9, rng.random() < 0.5, [1, "true", None])
    if rng.random() < 0.3:
        doc["released"] = _maybe(rng, 0.9, rng.random() < 0.5, [0, "no"])
    if rng.random() < 0.6:
        error = {
            k: _maybe(rng, 0.97, _rand_str(rng, rng.choice([8, 8, 8, 40, 700])), [5])
            for k in ("code", "message")
            if rng.random() < 0.9
        }
        doc["error"] = _maybe(rng, 0.97, error, ["x"])
    if rng.random() < 0.6:
        pod: dict[str, Any] = {
            k: _maybe(rng, 0.97, _rand_str(rng, rng.choice([10] * 6 + [70, 300])), [7])
            for k in POD_STRS
            if rng.random() < 0.8
        }
        if rng.random() < 0.8:
            pod["uid"] = _maybe(rng, 0.7, 1001, [-1, 0, 2**63 - 1, 2**63, "1", 1.0, True])
        pod["extra"] = _rand_value(rng, 2)
        doc["pod"] = _maybe(rng, 0.97, pod, [[]])
    for _ in range(rng.randrange(3)):
        doc[_rand_str(rng, 40) or "x"] = _rand_value(rng, 1)
    items = list(doc.items())
    rng.shuffle(items)
    return dict(items)


def _depth(v: Any) -> int:
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    return 0


def _keys_ok(v: Any) -> bool:
    if isinstance(v, dict):
        return all("\0" not in k and _keys_ok(x) for k, x in v.items())
    if isinstance(v, list):
        return all(_keys_ok(x) for x in v)
    return True


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v in INT64


class _Obj(dict[str, Any]):
    """A JSON object that remembers which member names it had more than once."""

    dups: frozenset[str] = frozenset()


def _pairs(pairs: list[tuple[str, Any]]) -> _Obj:
    obj = _Obj(pairs)
    names = [k for k, _ in pairs]
    obj.dups = frozenset(k for k in names if names.count(k) > 1)
    return obj


def _dup(obj: Any, names: set[str]) -> bool:
    return bool(getattr(obj, "dups", frozenset()) & names)


def _expected(doc: Any) -> tuple[Any, ...] | None:
    """What pn_parse_reply makes of a JSON document (None: refused), from
    podnet_json.h's contract."""
    if not isinstance(doc, dict):
        return None
    err, pod = doc.get("error", {}), doc.get("pod", {})
    ok = doc.get("ok")
    shape = [
        _depth(doc) <= 32 and _keys_ok(doc),
        _is_int(doc.get("v")) and doc.get("v") == 1,
        isinstance(ok, bool),
        isinstance(doc.get("released", True), bool),
        isinstance(err, dict) and isinstance(pod, dict),
        # a known member twice is malformed (Python keeps the last one)
        not _dup(doc, {"v", "ok", "released", "error", "pod"}),
        not _dup(err, {"code", "message"}),
        not _dup(pod, {*POD_STRS, "uid"}),
    ]
    if not all(shape):
        return None
    strs: dict[str, str] = {}
    for obj, names in ((err, ("code", "message")), (pod, POD_STRS)):
        for name in names:
            s = obj.get(name, "")
            fits = name == "message" or len(str(s).encode()) < FIELDS[name]
            if not isinstance(s, str) or "\0" in s or not fits:
                return None
            strs[name] = s
    if not _is_int(pod.get("uid", -1)) or (not ok and "code" not in err):
        return None
    if not ok and "message" not in err:
        strs["message"] = strs["code"]
    return (int(ok), 1, int(doc.get("released", -1)), pod.get("uid", -1), strs)


def _c_result(line: str) -> tuple[Any, ...] | None:
    if line == "ERR":
        return None
    f = line.split(" ")
    strs = [bytes.fromhex(x).decode() if x != "-" else "" for x in f[5:]]
    return (
        int(f[1]),
        int(f[2]),
        int(f[3]),
        int(f[4]),
        dict(zip(("code", "message", *POD_STRS), strs, strict=True)),
    )


def _same(c: tuple[Any, ...], py: tuple[Any, ...]) -> bool:
    cm, pm = c[4]["message"], py[4]["message"]
    if len(pm.encode()) >= 512:  # shortened at a UTF-8 boundary, marked with "..."
        cut = cm[:-3]
        if not (cm.endswith("...") and pm.startswith(cut) and len(cm.encode()) > 500):
            return False
        c, py = (*c[:4], {**c[4], "message": ""}), (*py[:4], {**py[4], "message": ""})
    return c == py


TOKENS = [
    b'"',
    b"\\",
    b"\\u",
    b"}",
    b"{",
    b"]",
    b"[",
    b",",
    b":",
    b'"v":1,',
    b'"ok":true,',
    b"\\ud800",
    b"\xc3",
    b"\x00",
    b"1e",
    b"-",
    b"0",
    b"null",
    b"tru",
    b" ",
    b'""',
]


def _mutate(rng: random.Random, b: bytes) -> bytes:
    out = bytearray(b)
    for _ in range(rng.randrange(1, 3)):
        at = rng.randrange(len(out) + 1)
        op = rng.choice([0, 1, 2, 3, 4, 4, 4, 5])
        if op == 0 and out:
            out[min(at, len(out) - 1)] = rng.choice(HOT + list(b'{}[]:,"-.eE0tfn '))
        elif op == 1:
            out[at:at] = rng.choice(TOKENS)
        elif op == 2:
            del out[at : at + rng.randrange(1, 6)]
        elif op == 3:  # repeat a known member: "k": v -> "k": v,"k": v
            key = rng.choice(
                [b'"ok"', b'"v"', b'"uid"', b'"code"', b'"name"', b'"fqdn"', b'"released"']
            )
            i = out.find(key)
            ends = [j for j in (out.find(b",", i), out.find(b"}", i)) if j > i >= 0]
            if ends:
                j = min(ends)
                out[j:j] = b"," + out[i:j]
        elif op == 4:  # at a structural character: insert, drop or swap a token
            marks = [i for i, c in enumerate(out) if c in b'{}[],:"0123456789']
            if marks:
                i = rng.choice(marks)
                edit = rng.randrange(3)
                if edit == 0:
                    out[i:i] = rng.choice(TOKENS)
                elif edit == 1:
                    del out[i]
                else:
                    out[i : i + 1] = rng.choice(TOKENS)
        else:
            out = out[:at]
    return bytes(out)


def test_reply_parser_agrees_with_python_json(native: Path) -> None:
    rng = random.Random(1314)
    docs = [_rand_reply(rng) for _ in range(4000)]
    generated = [
        json.dumps(
            d,
            ensure_ascii=rng.random() < 0.5,
            separators=rng.choice([(",", ":"), (", ", ": "), (" ,\t", " :\r\n")]),
        ).encode()
        + rng.choice([b"", b"\n", b"\r\n", b" "])
        for d in docs
    ]
    seeds = [p.read_bytes() for p in sorted((NATIVE / "fuzz" / "corpus" / "reply").iterdir())]
    # mutate replies the parser takes: most edits of a refused one stay refused
    good = [g for g, d in zip(generated, docs, strict=True) if _expected(d) is not None]
    mutated = [_mutate(rng, rng.choice(good + seeds)) for _ in range(6000)]
    inputs = generated + seeds + mutated
    res = _run(native / "json_filter", "reply", data=_records(inputs))
    assert res.returncode == 0, res.stderr.decode("utf-8", "replace")
    results = [_c_result(x) for x in res.stdout.decode().splitlines()]
    assert len(results) == len(inputs)
    accepted = 0
    for i, (raw, got) in enumerate(zip(inputs, results, strict=True)):
        if i < len(generated):  # a document we know: the exact outcome
            want = _expected(docs[i])
            assert (got is None) == (want is None), (raw, got, want)
        if got is None:
            continue
        accepted += 1
        # never accepted unless Python reads the same object from the same bytes
        try:
            doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_pairs)
        except ValueError:  # not UTF-8, or not JSON
            pytest.fail(f"the C parser accepts what Python's json refuses: {raw!r}")
        want = _expected(doc)
        assert want is not None and _same(got, want), (raw, got, want)
    assert accepted > 500  # the generator makes enough good replies (853 with seed 1314)


# --- the libraries, built the roles' way ---------------------------------------------


def _role_build(tmp: Path, role: str, target: str) -> Path:
    """Copy the files the role copies (its vars/main.yml) to a directory of their own
    and run the role's command there, twice (the second must change nothing)."""
    names = yaml.safe_load((ROOT / "roles" / role / "vars" / "main.yml").read_text())[
        f"{role}_native_files"
    ]
    dest = tmp / role
    dest.mkdir()
    for name in names:
        shutil.copy2(NATIVE / name, dest / name)
    for i in range(2):
        res = subprocess.run(
            ["make", "-C", str(dest), target],
            capture_output=True,
            text=True,
            check=False,
            env=make_env(),
        )
        assert res.returncode == 0, res.stdout + res.stderr
        assert "warning" not in res.stderr
        assert ("is up to date" in res.stdout) == (i == 1), res.stdout
    return dest / target


SHELL_OUTS = {
    "system",
    "popen",
    "execl",
    "execle",
    "execlp",
    "execv",
    "execve",
    "execvp",
    "execvpe",
    "fexecve",
    "fork",
    "vfork",
    "posix_spawn",
    "posix_spawnp",
    "wordexp",
}


def _undefined(so: Path) -> set[str]:
    out = subprocess.run(
        ["nm", "-D", "--undefined-only", str(so)], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


@pytest.mark.skipif(
    not Path("/usr/include/slurm/spank.h").exists(), reason="Slurm headers (libslurm-dev) missing"
)
def test_spank_plugin_builds_from_the_roles_files(tmp_path: Path) -> None:
    cc()
    so = _role_build(tmp_path, "spank", "podnet_spank.so")
    syms = subprocess.run(
        ["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True, check=True
    ).stdout
    # the plugin's name and version and its entry points (podnet_spank.c, the dispatch),
    # nothing else: the other files' functions and the client's stay inside
    exported = {line.split()[-1] for line in syms.splitlines() if line.strip()}
    assert {s for s in exported if not s.startswith("_")} == {
        "plugin_name",
        "plugin_type",
        "plugin_version",
        "spank_plugin_version",
        "slurm_spank_init",
        "slurm_spank_init_post_opt",
        "slurm_spank_task_init_privileged",
        "slurm_spank_task_init",
        "slurm_spank_user_init",
        "slurm_spank_task_post_fork",
        "slurm_spank_exit",
        "slurm_spank_job_prolog",
        "slurm_spank_job_epilog",
    }
    # libslurm is not linked in: symbols come from the loading process
    ldd = subprocess.run(["ldd", str(so)], capture_output=True, text=True, check=False).stdout
    assert "libslurm" not in ldd
    assert not _undefined(so) & SHELL_OUTS  # runs in slurmstepd as root


@pytest.mark.skipif(
    not Path("/usr/include/security/pam_modules.h").exists(),
    reason="PAM headers (libpam0g-dev) missing",
)
def test_pam_module_builds_from_the_roles_files(tmp_path: Path) -> None:
    cc()
    so = _role_build(tmp_path, "sshd_hooks", "pam_podnet.so")
    syms = subprocess.run(
        ["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True, check=True
    ).stdout.split()
    exported = sorted(s for s in syms if s.startswith(("pam_", "pn_", "conf_", "ask_")))
    assert exported == ["pam_sm_acct_mgmt", "pam_sm_close_session", "pam_sm_open_session"]
    assert not _undefined(so) & SHELL_OUTS  # runs in sshd's monitor as root


def test_image_exec_runs_apptainer_with_the_tasks_program(tmp_path: Path) -> None:
    """podnet-image-exec (the task's program with --podnet-image): `apptainer exec`
    with the PMIx directories bound, the image, then the task's own
    argv; its private variables gone. A script plays Apptainer and prints what it got."""
    cc()
    exe = _role_build(tmp_path, "spank", "podnet-image-exec")
    fake = tmp_path / "apptainer"
    fake.write_text(
        "#!/usr/bin/python3\nimport json, os, sys\n"
        "print(json.dumps({'argv': sys.argv, 'env': dict(os.environ)}))\n"
    )
    fake.chmod(0o755)
    pmix = tmp_path / "pmix.7.0"
    pmix.mkdir()
    env = {
        "PATH": "/usr/bin:/bin",
        "PODNET_IMAGE": "/images/app.sif",
        "PODNET_IMAGE_ARGV0": "/tmp/prog",
        "PODNET_APPTAINER": str(fake),
        "PMIX_SERVER_TMPDIR": str(pmix),
        "PMIX_SYSTEM_TMPDIR": str(pmix),  # bound once
        "SLURM_PMIX_TMPDIR": "/nonexistent",  # not a directory: not bound
    }
    res = subprocess.run(
        [str(exe), "a b", "-c"], env=env, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["argv"][1:] == [
        "exec",
        "--bind",
        str(pmix),
        "/images/app.sif",
        "/tmp/prog",
        "a b",
        "-c",
    ], got["argv"]
    assert got["env"]["PODNET_IMAGE"] == "/images/app.sif"
    assert got["env"]["PMIX_SERVER_TMPDIR"] == str(pmix)
    for gone in ("PODNET_IMAGE_ARGV0", "PODNET_APPTAINER"):
        assert gone not in got["env"], gone
    # Apptainer missing: the step's output says which image and why
    res = subprocess.run(
        [str(exe), "x"],
        env={**env, "PODNET_APPTAINER": "/nonexistent/apptainer"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 127
    assert "--podnet-image=/images/app.sif: cannot run /nonexistent/apptainer" in res.stderr
    # run by anything but the plugin: a clear error
    bad = subprocess.run(
        [str(exe), "x"], env={"PATH": "/usr/bin"}, capture_output=True, text=True, check=False
    )
    assert bad.returncode == 127 and "run by the podnet SPANK plugin only" in bad.stderr


def test_container_helper_builds_and_runs_no_program_but_the_callers(tmp_path: Path) -> None:
    """podnet-container (setuid root): from the spank role's files, warning-free; its one
    exec is the caller's command after dropping privileges (no system, popen, fork)."""
    cc()
    exe = _role_build(tmp_path, "spank", "podnet-container")
    assert _undefined(exe) & SHELL_OUTS == {"execvp"}
    # not setuid here: it says so and runs nothing
    r = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(exe), "--", "id"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 126 and "setuid" in r.stderr and "uid=" not in r.stdout, r
    r = subprocess.run(
        [str(exe), "--name", "Bad_Name", "--", "id"], capture_output=True, text=True, check=False
    )
    assert r.returncode == 126 and "DNS label" in r.stderr, r
    r = subprocess.run([str(exe)], capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "usage" in r.stderr


def test_cni_plugin_relays_the_request_and_prints_podnetds_answer(tmp_path: Path) -> None:
    """podnet-cni (the podnet CNI plugin in C): the CNI variables and the configuration
    from stdin go to podnetd as one `cni` request; it prints `cni_out` and exits with
    `cni_rc`; refusals and a missing daemon are CNI error objects."""
    import json as _json  # noqa: PLC0415
    import socket as _socket  # noqa: PLC0415
    import threading  # noqa: PLC0415

    cc()
    exe = _role_build(tmp_path, "spank", "podnet-cni")
    assert not _undefined(exe) & SHELL_OUTS
    path = tmp_path / "s"
    srv = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(4)
    seen: list[dict[str, Any]] = []
    replies = [
        {"v": 1, "ok": True, "cni_rc": 0, "cni_out": '{"cniVersion":"1.0.0","ips":[]}\n'},
        {"v": 1, "ok": True, "cni_rc": 1, "cni_out": '{"code":101,"msg":"drift"}\n'},
        {"v": 1, "ok": False, "error": {"code": "EPERM", "message": 'not "yours"'}},
    ]

    def serve() -> None:
        for reply in replies:
            conn = srv.accept()[0]
            with conn:
                buf = b""
                while not buf.endswith(b"\n"):
                    buf += conn.recv(65536)
                seen.append(_json.loads(buf))
                conn.sendall(_json.dumps(reply).encode() + b"\n")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    conf = '{"cniVersion":"1.0.0","name":"podnet","type":"podnet","x":"\\u00e9\\n"}'
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "ctr-1",
        "CNI_NETNS": "/proc/42/ns/net",
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": "PODNET_NAME=web",
        "CNI_PATH": "/usr/lib/cni",
        "PODNET_SOCKET": str(path),
    }
    outs = [
        subprocess.run([str(exe)], input=conf, env=env, capture_output=True, text=True, check=False)
        for _ in replies
    ]
    t.join(5)
    assert seen[0] == {
        "v": 1,
        "op": "cni",
        "command": "ADD",
        "container_id": "ctr-1",
        "netns": "/proc/42/ns/net",
        "ifname": "eth0",
        "args": "PODNET_NAME=web",
        "path": "/usr/lib/cni",
        "config": conf,
    }
    assert (outs[0].returncode, outs[0].stdout) == (0, '{"cniVersion":"1.0.0","ips":[]}\n')
    assert outs[1].returncode == 1 and _json.loads(outs[1].stdout)["code"] == 101
    err = _json.loads(outs[2].stdout)
    assert outs[2].returncode == 1 and err["code"] == 100 and 'not "yours"' in err["msg"]
    # no daemon: try again later; VERSION needs none
    r = subprocess.run(
        [str(exe)],
        input=conf,
        env={**env, "PODNET_SOCKET": str(tmp_path / "x")},
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 1 and _json.loads(r.stdout)["code"] == 11
    # CNI 1.1 STATUS without a daemon: "not available" (50), not "try again"
    r = subprocess.run(
        [str(exe)],
        input=conf,
        env={**env, "CNI_COMMAND": "STATUS", "PODNET_SOCKET": str(tmp_path / "x")},
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 1 and _json.loads(r.stdout)["code"] == 50
    r = subprocess.run(
        [str(exe)],
        input="",
        env={"CNI_COMMAND": "VERSION"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert _json.loads(r.stdout)["supportedVersions"] == ["0.4.0", "1.0.0", "1.1.0"]
    assert r.returncode == 0
