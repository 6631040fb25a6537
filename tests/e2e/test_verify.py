# SPDX-License-Identifier: Apache-2.0
"""`podnet verify` on the lab (issue 22): the playbook `hpc.podnet.verify` proves isolation
between alice, bob and carol (job pods on c1 and c2, login pods, containers, host-side
processes, and `ext` outside the cluster when the lab has gateways); with a rule on login
that lets bob's host-side processes reach pods (alice's among them), verify fails and
shows the cells; interrupted by SIGINT or SIGTERM, it leaves nothing behind."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import LAB, REPO, lab_inventory, ssh, wait_for

USERS = "alice,bob,carol"
NODES = "c1,c2"
KEY = "/root/.ssh/podnet-verify-key"
OUT = REPO / "tests" / "output"
SSH_OPTS = (
    "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes "
    f"-o LogLevel=ERROR -i {KEY}"
)


def _inventory() -> dict[str, Any]:
    return dict(yaml.safe_load(lab_inventory().read_text())["all"]["children"]["lab"])


INV = _inventory()
GATEWAYS = bool(INV["children"]["gateway"].get("hosts"))


@pytest.fixture(scope="module")
def external() -> Iterator[list[str]]:
    """verify's options for `ext`, the lab's host outside the cluster (gateway labs): the
    login node reaches it over SSH through gw1 with the lab's key, copied there for the
    module and removed after. Port 8090: the lab's policy lets pods reach it over TCP
    (8000-8099) and ICMP, not UDP."""
    if not GATEWAYS:
        yield []
        return
    key = Path(f"/var/lib/podnet-lab/{LAB}/ssh/id_ed25519").read_text()
    ssh("login", f"install -d -m 0700 /root/.ssh && umask 077 && cat >{KEY} <<'EOF'\n{key}EOF")
    gw1 = INV["hosts"]["gw1"]["ansible_host"]
    ext = str(INV["vars"]["podnet_lab_gateway_external_host"])
    cmd = f"ssh {SSH_OPTS} -o 'ProxyCommand=ssh {SSH_OPTS} -W %h:%p root@{gw1}' root@{ext}"
    try:
        yield ["--external-cmd", cmd, "--external-ip", ext, "--external-port", "8090"]
    finally:
        ssh("login", f"rm -f {KEY}", check=False)


def _save(name: str, text: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"verify-{LAB}-{name}.log").write_text(text)


def _verify(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    cmd = shlex.join(["podnet", "verify", "--users", USERS, "--nodes", NODES, *args])
    return ssh("login", cmd, check=False, timeout=timeout)


def _nothing_left(tag: str) -> None:
    """No job, step, probe or container of the run `tag` (podnet-verify-<pid>)."""
    assert ssh("login", f"squeue -h -n {tag} -o %i").stdout.strip() == ""
    for node in ("login", "c1", "c2"):
        left = ssh(node, f"pgrep -af '{tag}' | grep -v pgrep || true").stdout.strip()
        assert left == "", f"{node}: {left}"
    for node in ("c1", "c2"):
        ctrs = [
            p
            for p in json.loads(ssh(node, "podnet --json pods").stdout)
            if p.get("kind") == "container" and str(p.get("name", "")).startswith("pnvfy")
        ]
        assert ctrs == [], f"{node}: {ctrs}"


def test_the_playbook_proves_isolation(external: list[str]) -> None:
    extra: dict[str, Any] = {
        "verify_users": USERS.split(","),
        "verify_nodes": NODES.split(","),
    }
    if external:
        opts = dict(zip(external[::2], external[1::2], strict=True))
        extra |= {
            "verify_external_cmd": opts["--external-cmd"],
            "verify_external_ip": opts["--external-ip"],
            "verify_external_port": int(opts["--external-port"]),
        }
    env = {
        **os.environ,
        "LAB_NAME": LAB,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
    }
    r = subprocess.run(
        [
            "ansible-playbook",
            "-i",
            str(lab_inventory()),
            str(REPO / "playbooks" / "verify.yml"),
            "-e",
            json.dumps(extra),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    _save("playbook", r.stdout + r.stderr)
    assert r.returncode == 0, f"{r.stdout[-8000:]}\n{r.stderr}"
    out = r.stdout
    for proto in ("TCP", "UDP", "ICMP"):
        assert f"=== {proto}" in out, out[-4000:]
    assert len(re.findall(r"incorrect:0, result=true", out)) == 3, out[-4000:]
    assert "podnet verify: ok: observed = expected" in out
    names = ["alice/job@c1", "bob/job@c2", "carol/login@login", "alice/ctr@c1", "bob/host@login"]
    # the first table's header row (the YAML callback quotes it: - '-   alice/job@c1 ...')
    header = next(ln for ln in out.splitlines() if re.search(r"'-\s+alice/job@c1", ln))
    for name in names + (["ext"] if external else []):
        assert f" {name}" in header, f"{name} not probed:\n{header}"


@pytest.fixture
def broken_rule() -> Iterator[None]:
    """On login only, what a wrong rule would do: bob's sockets on the host network reach
    pods, as if he were one of `agent_host_users`. (A rule between two users' bridges
    would change nothing: pods reach their own network on-link, at L2, and never route
    to it.)"""
    uid = ssh("login", "id -u bob").stdout.strip()
    rule = f'meta skuid {uid} ip daddr 198.18.0.0/15 accept comment "pnverify-broken"'
    ssh("login", f"nft insert rule inet podnet output {rule}")
    try:
        yield
    finally:
        out = ssh("login", "nft -a list chain inet podnet output").stdout
        for h in re.findall(r'"pnverify-broken" # handle (\d+)', out):
            ssh("login", f"nft delete rule inet podnet output handle {h}", check=False)


def test_verify_fails_and_shows_the_cell_of_a_broken_rule(broken_rule: None) -> None:
    del broken_rule
    r = _verify(["--no-container"])
    _save("broken-rule", r.stdout + r.stderr)
    assert r.returncode == 1, f"exit {r.returncode}\n{r.stdout[-6000:]}\n{r.stderr}"
    for proto in ("tcp", "udp", "icmp"):
        line = f"MISMATCH {proto} bob/host@login -> alice/job@c1: expected X, observed ."
        assert line in r.stdout, r.stdout[-6000:]
    assert "podnet verify: FAILED:" in r.stdout
    # the comparison table marks the cell: row bob/host@login, column alice/job@c1
    cmp = r.stdout.split("=== TCP")[1].split("comparison:\n\n")[1].split("\n\n")[0].splitlines()
    cols = cmp[0].split("\t")
    row = next(ln.split("\t") for ln in cmp if ln.startswith("bob/host@login\t"))
    assert row[cols.index("alice/job@c1")] == "X", cmp
    # only bob's host side is wrong: alice's and carol's host sides still reach no pod
    assert "MISMATCH tcp alice/host@login ->" not in r.stdout
    assert "MISMATCH tcp carol/host@login ->" not in r.stdout
    tag = re.findall(r"podnet-verify-\d+", r.stderr)[0]
    _nothing_left(tag)


@pytest.mark.parametrize(
    ("signal", "at", "code"), [("INT", "probing", 130), ("TERM", "starting", 143)]
)
def test_verify_cleans_up_when_interrupted(signal: str, at: str, code: int) -> None:
    """SIGINT while it probes, SIGTERM while its endpoints start: everything it started
    goes, it says so, and it exits 128 + the signal."""
    out = f"/tmp/pnverify-{signal}.out"
    args = shlex.join(["podnet", "verify", "--users", USERS, "--nodes", NODES, "--timeout", "10"])
    script = f"{args} >{out} 2>&1 </dev/null & echo $! >{out}.pid; wait $!; echo rc=$? >>{out}"
    ssh(
        "login",
        f"rm -f {out} {out}.pid; setsid sh -c {shlex.quote(script)} >/dev/null 2>&1 </dev/null &",
    )

    def pidfile() -> str:
        return str(ssh("login", f"cat {out}.pid", check=False).stdout.strip())

    pid = wait_for(pidfile, 30)
    mark = {"probing": "endpoints up: probing", "starting": "jobs running: starting"}[at]
    wait_for(lambda: mark in ssh("login", f"cat {out}").stdout, 300, 0.5)
    ssh("login", f"kill -{signal} {pid}")
    text = wait_for(lambda: "rc=" in (t := ssh("login", f"cat {out}").stdout) and t, 180, 1)
    ssh("login", f"rm -f {out} {out}.pid")
    _save(f"interrupted-{signal}", text)
    assert f"interrupted (SIG{signal}); cleaned up" in text, text
    assert f"rc={code}" in text, text
    tag = re.findall(r"podnet-verify-\d+", text)[0]
    _nothing_left(tag)
