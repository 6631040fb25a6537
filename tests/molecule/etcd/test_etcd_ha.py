# SPDX-License-Identifier: Apache-2.0
"""hpc.podnet.etcd on a real 3-node lab (systemd-nspawn, Debian trixie, etcd 3.5).

The verify step of the molecule scenario `etcd` (tests/molecule/etcd), after molecule's
converge and idempotence; PODNET_ETCD_LAB_INVENTORY is the lab's inventory:

    MOLECULE_GLOB='tests/molecule/*/molecule.yml' molecule test -s etcd   (make test-etcd-ha)

The tests run in order and share the lab: check mode changes nothing, then a revoked
certificate, shrink to one member with etcd_remove_members, grow back through joins, a member
removed with etcd_member and re-added by the role, and a configuration change restarting
members one at a time. Idempotence is molecule's (after the converge) and asserted once more
here after a shrink, for removal; the later steps do not rerun the role to prove it again
(a minute of CI each).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
PLAY = Path(__file__).resolve().parent / "converge.yml"
INVENTORY = os.environ.get("PODNET_ETCD_LAB_INVENTORY", "")
KEY = "/podnet/lab-etcd-test/durable"
# The member's own copy of the gateway login (the admin certificate is only on the first
# member, ctl; etcd's JSON gateway takes no name from a certificate once authentication is on).
PKI = {
    "ca_cert": "/etc/etcd/pki/ca.crt",
    "client_cert": "/etc/etcd/pki/admin-gateway.crt",
    "client_key": "/etc/etcd/pki/admin-gateway.key",
    "login_user": "admin-gateway",
    "login_password_file": "/etc/etcd/pki/admin-gateway.password",
}

pytestmark = pytest.mark.skipif(
    not INVENTORY, reason="set PODNET_ETCD_LAB_INVENTORY to a lab inventory with 3 etcd nodes"
)


def env(json_out: bool = False) -> dict[str, str]:
    e = dict(os.environ)
    e["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    e["ANSIBLE_NOCOLOR"] = "1"
    # molecule's verify step exports ANSIBLE_FORCE_COLOR: colour codes in the recap's host names
    e.pop("ANSIBLE_FORCE_COLOR", None)
    e["PATH"] = f"{REPO / '.venv' / 'bin'}:{e.get('PATH', '')}"
    if json_out:
        e["ANSIBLE_LOAD_CALLBACK_PLUGINS"] = "1"
        e["ANSIBLE_STDOUT_CALLBACK"] = "ansible.builtin.json"
    return e


def playbook(*extra: str, inventory: str | None = None) -> dict[str, dict[str, int]]:
    """Run the converge play; returns the recap per host. Fails the test on failure."""
    cmd = ["ansible-playbook", "-i", inventory or INVENTORY, str(PLAY), *extra]
    proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, check=False)
    log = REPO / "tests" / "output" / "etcd-role-lab.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        f.write(f"\n#### {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}\n")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    recap: dict[str, dict[str, int]] = {}
    for m in re.finditer(r"^(\S+)\s+:\s+(.*)$", proc.stdout.split("PLAY RECAP")[-1], re.M):
        recap[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    assert recap and all("changed" in r for r in recap.values()), proc.stdout[-2000:]
    return recap


def module(host: str, name: str, args: dict[str, Any], check: bool = False) -> dict[str, Any]:
    cmd = ["ansible", "-i", INVENTORY, host, "-m", f"hpc.podnet.{name}", "-a", json.dumps(args)]
    if check:
        cmd.append("--check")
    proc = subprocess.run(
        cmd, cwd=REPO, env=env(json_out=True), capture_output=True, text=True, check=False
    )
    out = json.loads(proc.stdout)
    result: dict[str, Any] = out["plays"][0]["tasks"][0]["hosts"][host]
    return result


def shell(host: str, command: str) -> str:
    proc = subprocess.run(
        ["ansible", "-i", INVENTORY, host, "-m", "ansible.builtin.shell", "-a", command],
        cwd=REPO,
        env=env(json_out=True),
        capture_output=True,
        text=True,
        check=False,
    )
    res = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"][host]
    assert res.get("rc") == 0, res
    return str(res["stdout"])


def lab_hosts() -> dict[str, str]:
    inv = yaml.safe_load(Path(INVENTORY).read_text())
    hosts = inv["all"]["children"]["lab"]["hosts"]
    return {h: v["podnet_underlay_ip"] for h, v in hosts.items()}


def endpoint(host: str) -> str:
    return f"https://{lab_hosts()[host]}:2379"


def all_healthy(names: list[str]) -> None:
    for n in names:
        got = module(n, "etcd_key_info", {"key": KEY, "endpoints": [endpoint(n)], **PKI})
        assert not got.get("failed"), got


def test_check_mode_changes_nothing_and_members_serve_data() -> None:
    # molecule converged the lab and proved idempotence; check mode must agree
    recap = playbook("--check", "--diff")
    assert all(r["changed"] == 0 and r["failed"] == 0 for r in recap.values()), recap
    res = module("ctl", "etcd_key", {"key": KEY, "json": {"written": "before"}, **PKI})
    assert not res.get("failed"), res
    all_healthy(["ctl", "ctl2", "ctl3"])


def client(host: str) -> dict[str, str]:
    """The host's own per-host client certificate (converge.yml's post_tasks)."""
    return {
        "ca_cert": "/etc/podnet/pki/ca.crt",
        "client_cert": f"/etc/podnet/pki/podnetd-{host}.crt",
        "client_key": f"/etc/podnet/pki/podnetd-{host}.key",
    }


def test_admin_certificate_only_on_the_first_member_and_one_key_per_host() -> None:
    # the first member (etcd_admin_host) also holds the modules' gateway login
    admin = ["admin.key", "admin-gateway.key"]
    for h in ("ctl", "ctl2", "ctl3"):
        keys = sorted(shell(h, "cd /etc/podnet/pki && ls *.key").split())
        assert keys == sorted([f"podnetd-{h}.key"] + (admin if h == "ctl" else [])), keys
        subject = shell(h, f"openssl x509 -noout -subject -nameopt RFC2253 "
                           f"-in /etc/podnet/pki/podnetd-{h}.crt").strip()  # fmt: skip
        assert subject == f"subject=CN=podnetd-{h}"


def tls_client(host: str, member: str) -> str:
    """`etcdctl get` over gRPC from `host` to `member` with `host`'s own certificate:
    "revoked" when etcd refuses the certificate in the TLS handshake, "accepted" when the
    request reaches etcd (with authentication on, a certificate whose name is no etcd user
    with a grant is then refused by etcd's permission check, not by TLS)."""
    c = client(host)
    out = shell(host, f"etcdctl --endpoints={endpoint(member)} --cacert={c['ca_cert']} "
                      f"--cert={c['client_cert']} --key={c['client_key']} --dial-timeout=3s "
                      f"--command-timeout=6s get {KEY} 2>&1; echo rc=$?")  # fmt: skip
    if out.rstrip().endswith("rc=0") or "etcdserver: " in out:
        return "accepted"
    assert "rc=0" not in out, out
    return "revoked"


def test_revoked_certificate_refused_the_others_not() -> None:
    # the node certificates speak gRPC (the JSON gateway takes no name from them with
    # authentication on); revocation is etcd's CRL, checked in the TLS handshake
    for h in ("ctl2", "ctl3"):
        assert tls_client(h, "ctl") == "accepted", h
    recap = playbook("-e", '{"etcd_revoked_client_certs": ["podnetd-ctl2"]}')
    assert all(r["failed"] == 0 for r in recap.values()), recap
    for member in ("ctl", "ctl2", "ctl3"):
        assert tls_client("ctl2", member) == "revoked", f"{member} must refuse podnetd-ctl2"
        assert tls_client("ctl3", member) == "accepted", member
    # the revocation is withdrawn by the next test's run (the same role, without it)


def test_shrink_to_one_with_etcd_remove_members(tmp_path: Path) -> None:
    inv = yaml.safe_load(Path(INVENTORY).read_text())
    inv["all"]["children"]["lab"]["children"]["etcd"]["hosts"] = {"ctl": {}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inv))
    (tmp_path / "group_vars").symlink_to(REPO / "inventories" / "lab" / "group_vars")
    recap = playbook(
        "-e", '{"etcd_remove_members": ["ctl2", "ctl3"]}', inventory=str(tmp_path / "hosts.yml")
    )
    assert recap["ctl"]["failed"] == 0
    got = module("ctl", "etcd_key_info", {"key": KEY, **PKI})
    assert got["json"] == {"written": "before"}
    listed = module("ctl", "etcd_member", {"name": "ctl", "peer_urls": ["https://x:1"], **PKI},
                    check=True)  # fmt: skip
    assert [m["name"] for m in listed["members"]] == ["ctl"], listed
    assert shell("ctl2", "systemctl is-enabled etcd || true").strip() == "disabled"
    # the run without etcd_revoked_client_certs withdrew the revocation of podnetd-ctl2
    assert tls_client("ctl2", "ctl") == "accepted"
    # the same run again: nothing left to remove
    recap = playbook(
        "-e", '{"etcd_remove_members": ["ctl2", "ctl3"]}', inventory=str(tmp_path / "hosts.yml")
    )
    assert recap["ctl"]["changed"] == 0, recap


def test_grow_back_to_three_through_joins() -> None:
    playbook()
    listed = module("ctl", "etcd_member", {"name": "ctl", "peer_urls": ["https://x:1"], **PKI},
                    check=True)  # fmt: skip
    assert sorted(m["name"] for m in listed["members"]) == ["ctl", "ctl2", "ctl3"], listed
    all_healthy(["ctl", "ctl2", "ctl3"])
    got = module("ctl3", "etcd_key_info", {"key": KEY, "endpoints": [endpoint("ctl3")],
                                      **PKI})  # fmt: skip
    assert got["json"] == {"written": "before"}, "a joined member serves the old data"


def test_member_removed_with_module_and_readded_by_role() -> None:
    res = module("ctl", "etcd_member", {"name": "ctl3", "state": "absent", **PKI})
    assert res["changed"] is True, res
    shell("ctl3", "systemctl stop etcd; rm -rf /var/lib/etcd/podnet/member")
    got = module("ctl2", "etcd_key_info", {"key": KEY, **PKI})
    assert got["json"] == {"written": "before"}, "two members still serve the data"
    playbook()
    all_healthy(["ctl", "ctl2", "ctl3"])
    got = module("ctl3", "etcd_key_info", {"key": KEY, "endpoints": [endpoint("ctl3")],
                                      **PKI})  # fmt: skip
    assert got["json"] == {"written": "before"}


def test_config_change_restarts_one_at_a_time_with_snapshots() -> None:
    before = {h: shell(h, "systemctl show -p ExecMainStartTimestampMonotonic --value etcd")
              for h in ("ctl", "ctl2", "ctl3")}  # fmt: skip
    recap = playbook("-e", "etcd_heartbeat_interval=120")
    assert all(r["changed"] > 0 for r in recap.values()), recap
    starts = {h: int(shell(h, "systemctl show -p ExecMainStartTimestampMonotonic --value etcd"))
              for h in ("ctl", "ctl2", "ctl3")}  # fmt: skip
    assert all(starts[h] != int(before[h]) for h in starts), (before, starts)
    # one member at a time: each restart began after the previous member was ready again
    # (CLOCK_MONOTONIC is the host kernel's, shared by the nspawn nodes)
    ordered = sorted(starts.values())
    assert all(b - a > 200_000 for a, b in itertools.pairwise(ordered)), starts
    for h in ("ctl", "ctl2", "ctl3"):
        assert shell(h, "ls /var/backups/etcd/ | grep -c '^etcd-.*\\.db$'").strip() != "0"
        assert "--heartbeat-interval=120" in shell(h, "systemctl cat etcd")
    all_healthy(["ctl", "ctl2", "ctl3"])
    # the last test: the lab goes now (no run back to the defaults: 70-90 s of CI)
