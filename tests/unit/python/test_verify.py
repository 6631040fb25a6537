# SPDX-License-Identifier: Apache-2.0
"""`podnet verify`'s logic without a cluster (issue 22): the expected reachability of each
kind of endpoint pair, the truth tables in the Kubernetes netpol format, a mismatch shown
by its cell, and the probe itself between two local endpoints (TCP, UDP, the token).
tests/e2e/test_verify.py runs the whole command on a lab."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import time
from typing import Any

import pytest
from podnet.cli import verify_model, verify_run, verify_tables
from podnet.state.gwpolicy import compile_policy, parse_policy

A1 = verify_model.Endpoint("alice/job@c1", "job", "alice", 2001, "c1", "198.18.0.2")
A2 = verify_model.Endpoint("alice/login@login", "login", "alice", 2001, "login", "198.18.0.66")
AC = verify_model.Endpoint("alice/ctr@c1", "ctr", "alice", 2001, "c1", "198.18.0.3")
AH = verify_model.Endpoint("alice/host@login", "host", "alice", 2001, "login", "198.51.100.11")
B1 = verify_model.Endpoint("bob/job@c1", "job", "bob", 2002, "c1", "198.18.0.4")
BH = verify_model.Endpoint("bob/host@login", "host", "bob", 2002, "login", "198.51.100.11")
EXT = verify_model.Endpoint("ext", "ext", ip="203.0.113.220", tcp=8080, udp=8080)


def _model() -> verify_model.Model:
    g = parse_policy(
        {
            "default": "deny",
            "egress": [
                {
                    "action": "allow",
                    "cidr": "203.0.113.128/25",
                    "proto": "tcp",
                    "ports": "8000-8099",
                },
                {"action": "allow", "cidr": "203.0.113.128/25", "proto": "icmp"},
            ],
        },
        "global",
    )
    bob = parse_policy(
        {"egress": [{"action": "deny", "cidr": "203.0.113.220/32", "proto": "any"}]},
        "bob",
        user=True,
    )
    return verify_model.Model(
        [ipaddress.IPv4Network("198.51.100.0/26")],
        True,
        compile_policy(g, {5002: bob}),
        {"alice": 5001, "bob": 5002},
    )


def test_expected_reachability_of_every_kind_of_pair() -> None:
    m = _model()
    e = verify_model.expect
    for p in verify_model.PROTOCOLS:
        # a user's pods reach each other, never another user's
        assert e(m, A1, A2, p) and e(m, A2, AC, p) and e(m, AC, A1, p)
        assert not e(m, A1, B1, p) and not e(m, B1, AC, p) and not e(m, B1, A2, p)
        # host-side processes reach no pod, not even their own user's; pods reach hosts
        assert e(m, AH, A1, p) is False and e(m, AH, A2, p) is False
        assert e(m, A1, AH, p) and e(m, B1, AH, p)
        assert e(m, AH, BH, p) and e(m, A1, A1, p)
        # outside: never in; out as the policy says; host <-> outside not probed
        assert e(m, EXT, A1, p) is False
        assert e(m, AH, EXT, p) is None and e(m, EXT, AH, p) is None
        assert e(m, B1, EXT, p) is False  # bob's own deny
    assert e(m, A1, EXT, "tcp") is True and e(m, A1, EXT, "icmp") is True
    assert e(m, A1, EXT, "udp") is False  # no UDP rule: the default
    # a host outside host_cidrs is not reached by pods; no gateway: no way out
    far = verify_model.Endpoint("x/host@far", "host", "x", 1, "far", "10.1.2.3")
    assert e(m, A1, far, "tcp") is False
    assert e(verify_model.Model(m.host_cidrs, False), A1, EXT, "icmp") is False


def _tables(obs_flip: tuple[str, str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    eps = [A1, B1, AH]
    m = _model()
    names = [x.name for x in eps]
    exp = {p: verify_tables.TruthTable(names) for p in verify_model.PROTOCOLS}
    obs = {p: verify_tables.TruthTable(names) for p in verify_model.PROTOCOLS}
    for p in verify_model.PROTOCOLS:
        for a in eps:
            for b in eps:
                v = verify_model.expect(m, a, b, p)
                exp[p].set(a.name, b.name, v)
                flip = obs_flip == (a.name, b.name) and p == "tcp"
                obs[p].set(a.name, b.name, (not v) if flip else v)
    return exp, obs


def test_tables_print_in_the_netpol_format(capsys: pytest.CaptureFixture[str]) -> None:
    exp, obs = _tables()
    assert verify_tables.report(obs, exp) == 0
    out = capsys.readouterr().out
    assert "reachability: correct:9, incorrect:0, result=true" in out
    assert (
        "expected:\n\n-\talice/job@c1\tbob/job@c1\talice/host@login\n"
        "alice/job@c1\t.\tX\t.\n"
        "bob/job@c1\tX\t.\t.\n"
        "alice/host@login\tX\tX\t.\n"
    ) in out
    assert "podnet verify: ok: observed = expected (27 cells, 3 endpoints)" in out


def test_a_mismatch_fails_and_names_its_cell(capsys: pytest.CaptureFixture[str]) -> None:
    exp, obs = _tables(obs_flip=("bob/job@c1", "alice/job@c1"))
    assert verify_tables.report(obs, exp) == 1
    out = capsys.readouterr().out
    assert "=== TCP\nreachability: correct:8, incorrect:1, result=false" in out
    cmp = out.split("comparison:\n\n")[1].split("\n\n")[0].splitlines()
    assert cmp[2] == "bob/job@c1\tX\t.\t."
    assert "MISMATCH tcp bob/job@c1 -> alice/job@c1: expected X, observed ." in out
    assert "podnet verify: FAILED: 1 of 27 cells differ" in out


def test_a_missing_observation_is_a_failure(capsys: pytest.CaptureFixture[str]) -> None:
    exp, obs = _tables()
    del obs["icmp"].values[("alice/host@login", "bob/job@c1")]  # e.g. no ICMP socket
    assert verify_tables.report(obs, exp) == 1
    assert "expected X, observed ?" in capsys.readouterr().out


def _agent() -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-u", "-c", verify_run.AGENT_SOURCE, json.dumps({"tag": "unit"})],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    )


def test_the_probe_between_two_local_endpoints() -> None:
    a, b = _agent(), _agent()
    try:
        ea = verify_model.Endpoint("a", "host", proc=a, ip="127.0.0.1")
        eb = verify_model.Endpoint("b", "host", proc=b, ip="127.0.0.1")
        ready = verify_run._read(eb, "ready", 20)
        verify_run._read(ea, "ready", 20)
        targets = [
            {"id": "t", "ip": "127.0.0.1", "proto": "tcp", "port": ready["tcp"], "token": "t"},
            {"id": "u", "ip": "127.0.0.1", "proto": "udp", "port": ready["udp"], "token": "u"},
            {"id": "closed", "ip": "127.0.0.1", "proto": "tcp", "port": 1, "token": "c"},
        ]
        verify_run._send(ea, {"op": "probe", "targets": targets, "timeout": 2})
        res = verify_run._read(ea, "probe", 30)["results"]
        assert res["t"]["ok"] is True and res["closed"]["ok"] is False, res
        time.sleep(0.5)
        verify_run._send(eb, {"op": "arrivals"})
        got = {(x["proto"], x["token"]) for x in verify_run._read(eb, "arrivals", 10)["arrivals"]}
        assert got == {("tcp", "t"), ("udp", "u")}, got
        verify_run._send(ea, {"op": "quit"})
        assert a.wait(10) == 0
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
            p.wait()
    # a probe whose controller is gone (stdin closed) exits by itself
    assert b.returncode is not None


def test_aligned_tables_pad_with_spaces() -> None:
    exp, _obs = _tables()
    text = exp["tcp"].pretty(aligned=True).splitlines()
    assert text[0] == "-                 alice/job@c1  bob/job@c1  alice/host@login"
    assert text[2] == "bob/job@c1        X             .           ."
    assert "\t" not in "\n".join(text)
