# SPDX-License-Identifier: Apache-2.0
"""A real CoreDNS (the slim build from `make artifacts`) answers what the agents wrote."""

from __future__ import annotations

import glob
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Node, free_port, sh, wait_for
from test_pods import job_up

CACHE = os.environ.get("PODNET_CACHE_DIR", "/var/cache/podnet-dev")


@pytest.fixture(scope="module")
def coredns(workdir: Path, etcd: Any) -> Iterator[int]:
    found = sorted(glob.glob(f"{CACHE}/artifacts/coredns-*-linux-amd64"))
    if not found:
        pytest.fail(f"no CoreDNS in {CACHE}/artifacts: run `make artifacts`")
    port = free_port()
    conf = workdir / "Corefile"
    conf.write_text(f"""t:{port} 19.198.in-addr.arpa:{port} {{
    bind 127.0.0.1
    errors
    etcd t in-addr.arpa {{
        path /skydns
        endpoint {etcd.url}
    }}
    loadbalance
}}
""")
    log = open(workdir / "coredns.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([found[-1], "-conf", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "CoreDNS-" in (workdir / "coredns.log").read_text(), 10)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def dig(port: int, *q: str) -> list[str]:
    """The records of one clean answer. dig prints transport trouble (a timeout, then a
    retry; a stray reply: ";; Warning: query response not set") on stdout beside the
    records: on a loaded machine such a line once became an "answer". An exchange with
    such a line is asked again; the records are never mixed with diagnostics."""
    out = ""
    for _ in range(5):
        r = sh(
            "dig", "+short", "+time=3", "+tries=1", "@127.0.0.1", "-p", str(port), *q, check=False
        )
        out = r.stdout
        lines = [x.strip() for x in out.splitlines() if x.strip()]
        if r.returncode == 0 and not any(x.startswith(";") for x in lines):
            return sorted(lines)
        time.sleep(0.2)
    raise AssertionError(f"dig {' '.join(q)}: no clean answer in 5 tries:\n{out}")


def test_pod_names_job_name_and_ptr(cluster: dict[str, Node], coredns: int) -> None:
    n1, n2 = cluster["n1"], cluster["n2"]
    pods = [job_up(n, 701, "alice", 2001, "My_Sim.2", ["n1", "n2"]) for n in (n1, n2)]
    assert dig(coredns, "pod0.my-sim-2.alice.t") == [pods[0]["ip"]]
    assert dig(coredns, "pod1.my-sim-2.alice.t") == [pods[1]["ip"]]
    assert dig(coredns, "pod1.701.alice.t") == [pods[1]["ip"]]
    assert dig(coredns, "my-sim-2.alice.t") == sorted(p["ip"] for p in pods)
    assert dig(coredns, "-x", pods[0]["ip"]) == ["pod0.701.alice.t."]
    # a second live job with the same name: the newest owns the name, the job id name stays
    newer = job_up(n1, 702, "alice", 2001, "My_Sim.2", ["n1"])
    assert dig(coredns, "my-sim-2.alice.t") == [newer["ip"]]
    assert dig(coredns, "pod0.701.alice.t") == [pods[0]["ip"]]
    # the older job ending does not remove the newer job's name
    for n in (n1, n2):
        n.call("job_down", job_id=701)
    assert dig(coredns, "pod1.701.alice.t") == []
    assert dig(coredns, "-x", pods[0]["ip"]) == []
    assert dig(coredns, "my-sim-2.alice.t") == [newer["ip"]]
    n1.call("job_down", job_id=702)
    assert dig(coredns, "my-sim-2.alice.t") == []
    # a node of an older job that comes up after a newer job took the name publishes its
    # pod under the job id only (the name's records are the newer job's)
    old0 = job_up(n1, 703, "alice", 2001, "late", ["n1", "n2"])
    new0 = job_up(n1, 704, "alice", 2001, "late", ["n1"])
    old1 = job_up(n2, 703, "alice", 2001, "late", ["n1", "n2"])
    assert dig(coredns, "late.alice.t") == [new0["ip"]]
    assert dig(coredns, "pod1.late.alice.t") == []
    assert dig(coredns, "pod1.703.alice.t") == [old1["ip"]]
    assert dig(coredns, "pod0.703.alice.t") == [old0["ip"]]
    for n, j in ((n1, 703), (n2, 703), (n1, 704)):
        n.call("job_down", job_id=j)
    assert dig(coredns, "late.alice.t") == []
