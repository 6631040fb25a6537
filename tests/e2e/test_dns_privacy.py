# SPDX-License-Identifier: Apache-2.0
"""Name privacy (issue 22, item 3; docs/security.md "Name privacy").

As users do it: bob SSHes into the login node (his login pod) and asks the cluster's DNS
(his pod's resolver: CoreDNS on ctl) for alice's job and login names, her whole subtree
(ANY, wildcard, AXFR) and `dig -x` of her addresses: NXDOMAIN, nothing of hers. alice,
the same way, gets her answers. root on ctl (a DNS host) sees everything; bob's
host-side processes (on login's host network, as a cron job runs; an opt-out step on c1)
and bob on ctl itself see none of alice's names. A public name (a site's record) answers
everyone, and a cached answer for alice is checked again for bob.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import CLUSTER, etcdctl, pod_of, ssh, wait_for
from test_attack_ssh import ssh_cmd

Z = CLUSTER
PUBLIC_NAME = f"e2edns.svc.{Z}"  # a site's public name (written by the test)
WEB_NAME = f"e2eweb.svc.{Z}"  # a site's name that points at alice's pod


def _underlay(node: str) -> str:
    return ssh(node, "ip -4 -o addr show host0").stdout.split()[3].split("/")[0]


@pytest.fixture(scope="module")
def world(jobs: dict[str, int]) -> Iterator[dict[str, Any]]:
    """alice's and bob's jobs, alice's login pod (kept by a background SSH session of
    hers), the DNS server, and two public names of the site."""
    dns = _underlay("ctl")
    keep = subprocess.Popen(
        [*ssh_cmd("alice", "login"), "sleep 900"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        login_ip = wait_for(
            lambda: re.findall(
                r"198\.1[89]\.\d+\.\d+", ssh("alice@login", "ip -br -4 addr show eth0").stdout
            )
        )[0]
        etcdctl(f'put /skydns/{Z}/svc/e2edns \'{{"host":"{dns}"}}\'')
        etcdctl(f'put /skydns/{Z}/svc/e2eweb \'{{"host":"pod0.e2ea.alice.{Z}"}}\'')
        yield {
            "dns": dns,
            "alice_job": jobs["alice"],
            "bob_job": jobs["bob"],
            "alice_ips": [pod_of("c1", jobs["alice"])["ip"], pod_of("c2", jobs["alice"])["ip"]],
            "alice_login": login_ip,
            "bob_ip": pod_of("c1", jobs["bob"])["ip"],
        }
    finally:
        etcdctl(f"del --prefix /skydns/{Z}/svc/e2e")
        keep.terminate()
        keep.wait(timeout=30)


def _alice_queries(w: dict[str, Any]) -> list[str]:
    """alice's names, her subtree and her addresses' reverse names, as dig arguments."""
    return [
        f"pod0.e2ea.alice.{Z} A",
        f"pod1.e2ea.alice.{Z} A",
        f"e2ea.alice.{Z} A",
        f"pod0.{w['alice_job']}.alice.{Z} A",
        f"login.login.alice.{Z} A",
        f"alice.{Z} A",
        f"alice.{Z} ANY",
        f"*.alice.{Z} A",
        f"POD0.E2EA.ALICE.{Z.upper()} A",
        *(f"-x {ip}" for ip in [*w["alice_ips"], w["alice_login"]]),
    ]


def _ask(w: dict[str, Any], queries: list[str], dns: str | None = None) -> str:
    """A shell script that asks each query with dig and prints `Q <query> | <status> <data>`."""
    server = dns or w["dns"]
    lines = ["set -f"]  # no globbing of "*.alice..."
    for q in queries:
        lines.append(
            f"printf 'Q %s | ' '{q}'; dig +time=3 +tries=2 +noall +comments +answer @{server} {q} "
            "| awk '/status:/ {match($0, /status: [A-Z]+/); "
            "s = substr($0, RSTART + 8, RLENGTH - 8)}"
            ' !/^;/ && NF >= 5 {a = a " " $NF} END {print s a}\''
        )
    return "\n".join(lines) + "\n"


def _put(node: str, path: str, text: str) -> None:
    ssh(node, f"cat > {path} <<'PNEOF'\n{text}PNEOF\nchmod 644 {path}")


def _results(out: str) -> dict[str, str]:
    res = {}
    for line in out.splitlines():
        if line.startswith("Q "):
            q, _, r = line[2:].partition(" | ")
            res[q] = r.strip()
    return res


def _leaks(w: dict[str, Any], text: str) -> list[str]:
    """alice's addresses and names in dig's records (not its comments, which echo the
    question)."""
    records = "\n".join(ln for ln in text.splitlines() if not ln.startswith(";"))
    found = [ip for ip in [*w["alice_ips"], w["alice_login"]] if ip in records]
    return found + re.findall(r"\S*\.alice\." + re.escape(Z), records)


def test_bob_in_his_login_pod_gets_nxdomain_for_alice(world: dict[str, Any]) -> None:
    w = world
    qs = _alice_queries(w)
    out = ssh("bob@login", _ask(w, qs) + f"getent hosts pod0.e2ea.alice.{Z}; echo getent=$?").stdout
    res = _results(out)
    assert set(res) == set(qs), out
    assert {q: r for q, r in res.items() if r != "NXDOMAIN"} == {}, out
    assert "getent=2" in out, out
    # listings: a zone transfer of her zone and a wildcard over the cluster zone
    lists = ssh(
        "bob@login",
        f"dig +time=3 +tries=2 @{w['dns']} alice.{Z} AXFR; "
        f"dig +time=3 +tries=2 @{w['dns']} '*.{Z}' A; dig +time=3 +tries=2 @{w['dns']} {Z} A",
    ).stdout
    assert _leaks(w, lists) == [], lists
    # his own names still answer
    assert w["bob_ip"] in ssh("bob@login", f"getent hosts pod0.e2eb.bob.{Z}").stdout


def test_alice_in_her_login_pod_gets_her_answers(world: dict[str, Any]) -> None:
    w = world
    out = ssh("alice@login", _ask(w, _alice_queries(w)) + "\ngetent hosts pod0.e2ea").stdout
    res = _results(out)
    a1, a2 = w["alice_ips"]
    assert res[f"pod0.e2ea.alice.{Z} A"] == f"NOERROR {a1}", out
    assert res[f"pod1.e2ea.alice.{Z} A"] == f"NOERROR {a2}", out
    assert sorted(res[f"e2ea.alice.{Z} A"].split()[1:]) == sorted([a1, a2]), out
    assert res[f"pod0.{w['alice_job']}.alice.{Z} A"] == f"NOERROR {a1}", out
    assert res[f"login.login.alice.{Z} A"] == f"NOERROR {w['alice_login']}", out
    assert res[f"-x {a1}"] == f"NOERROR pod0.{w['alice_job']}.alice.{Z}.", out
    assert res[f"-x {w['alice_login']}"] == f"NOERROR login.login.alice.{Z}.", out
    assert a1 in out.splitlines()[-1], out  # getent through her pod's resolver


def test_root_on_the_dns_host_sees_every_name(world: dict[str, Any]) -> None:
    w = world
    a1 = w["alice_ips"][0]
    for server in ("127.0.0.1", w["dns"]):
        res = _results(ssh("ctl", _ask(w, [f"pod0.e2ea.alice.{Z} A", f"-x {a1}"], server)).stdout)
        assert res[f"pod0.e2ea.alice.{Z} A"] == f"NOERROR {a1}", res
        assert res[f"-x {a1}"] == f"NOERROR pod0.{w['alice_job']}.alice.{Z}.", res


def test_bob_host_side_processes_learn_nothing_of_alice(world: dict[str, Any]) -> None:
    """bob outside any pod: a process on login's host network (as a cron job of his
    runs: `runuser`, since an SSH session of his is in his login pod), an opt-out step on
    c1 submitted from his SSH session, and a process of his on ctl, the DNS host itself,
    over loopback (CoreDNS asks the kernel whose the socket is: bob's, not root's)."""
    w = world
    qs = _alice_queries(w)
    script = "/tmp/e2e-dns-ask.sh"
    _put("login", script, _ask(w, qs))
    _put("c1", script, _ask(w, qs))
    _put("ctl", script, _ask(w, qs, "127.0.0.1"))
    runs = {
        "login host network": ssh("login", f"cd /tmp && runuser -u bob -- sh {script}"),
        # submitted as bob does: from his SSH session (his login pod)
        "opt-out step on c1": ssh(
            "bob@login",
            f"cd /tmp && srun --podnet=no -N1 -w c1 -t 2 sh {script}",
            timeout=180,
        ),
        "bob on ctl (loopback)": ssh("ctl", f"cd /tmp && runuser -u bob -- sh {script}"),
    }
    bad = {}
    for where, r in runs.items():
        res = _results(r.stdout)
        if set(res) != set(qs) or any(v != "NXDOMAIN" for v in res.values()):
            bad[where] = r.stdout + r.stderr
    assert bad == {}, bad


def test_public_names_answer_everyone(world: dict[str, Any]) -> None:
    w = world
    q = _ask(w, [f"{PUBLIC_NAME} A"])
    want = {f"{PUBLIC_NAME} A": f"NOERROR {w['dns']}"}
    for who in ("alice@login", "bob@login"):
        assert _results(ssh(who, q).stdout) == want, who
    _put("login", "/tmp/e2e-dns-public.sh", q)
    assert _results(ssh("login", "runuser -u bob -- sh /tmp/e2e-dns-public.sh").stdout) == want


def test_an_answer_cached_for_alice_is_checked_again_for_bob(world: dict[str, Any]) -> None:
    """A site's name that points at alice's pod: alice's pod asks, bob's right after (within
    the cache time): bob's answer comes from the cache and holds nothing of hers. One
    shell on c1 asks from both job pods, as each user; repeated until bob's query was a
    cache hit (on a busy machine the pair can outlast the cache time)."""
    w = world
    a, b = pod_of("c1", w["alice_job"]), pod_of("c1", w["bob_job"])
    dig = f"dig +time=3 +tries=2 @{w['dns']} {WEB_NAME} A"
    script = (
        f"ip netns exec {a['netns'].rsplit('/', 1)[-1]} runuser -u alice -- {dig}; echo ====; "
        f"ip netns exec {b['netns'].rsplit('/', 1)[-1]} runuser -u bob -- {dig}"
    )
    for _ in range(5):
        ssh("c1", f"ip netns exec {a['netns'].rsplit('/', 1)[-1]} runuser -u alice -- {dig}")
        hits = _cache_hits(w)
        alice_out, _sep, bob_out = ssh("c1", script).stdout.partition("====")
        assert w["alice_ips"][0] in alice_out, alice_out
        assert "status: NXDOMAIN" in bob_out and _leaks(w, bob_out) == [], bob_out
        if _cache_hits(w) >= hits + 2:  # alice's and bob's answers both came from the cache
            return
    pytest.fail("bob's query never came from the cache: the test proved nothing")


def _cache_hits(w: dict[str, Any]) -> int:
    text = ssh(
        "ctl",
        'python3 -c "import urllib.request; '
        f"print(urllib.request.urlopen('http://{w['dns']}:9153/metrics').read().decode())\"",
    ).stdout
    return sum(
        int(float(line.split()[-1]))
        for line in text.splitlines()
        if line.startswith("coredns_cache_hits_total")
    )
