# SPDX-License-Identifier: Apache-2.0
"""End-to-end tests on a lab deployed by playbooks/site.yml (tests/lab/lab.sh).

PODNET_E2E_LAB names the lab (default pnlab, i.e. `make lab`); the molecule scenario runs
these tests against its own lab (pnmol) in its verify step.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
LAB = os.environ.get("PODNET_E2E_LAB", "pnlab")
CLUSTER = os.environ.get("PODNET_E2E_CLUSTER", "lab")
POD_CIDR = "198.18.0.0/15"

#: what failed or was skipped, in full (make test-molecule prints it after a failed verify: the
#: molecule output around it is too long to keep in a CI log's tail)
FAILURES = REPO / "tests" / "output" / f"e2e-failures-{LAB}.txt"


def pytest_sessionstart(session: pytest.Session) -> None:
    del session
    FAILURES.unlink(missing_ok=True)


def _record(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Append a failed or skipped test, or a module that failed to import or skipped itself
    as a whole (the molecule lab's verify fails on any skip: a test that quietly stops
    running is a failure there)."""
    what = "FAILED" if report.failed else "SKIPPED" if report.skipped else ""
    if not what:
        return
    took = f", {report.duration:.1f} s" if isinstance(report, pytest.TestReport) else ""
    FAILURES.parent.mkdir(parents=True, exist_ok=True)
    with FAILURES.open("a") as f:
        f.write(f"==== {what} {report.nodeid} ({report.when}{took})\n")
        f.write(report.longreprtext[-6000:] + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _record(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _record(report)


if os.geteuid() != 0:
    pytest.skip("e2e tests need root (lab.sh ssh)", allow_module_level=True)
if not Path(f"/var/lib/podnet-lab/{LAB}/lab.env").exists():
    pytest.skip(f"lab {LAB} is not up (make lab)", allow_module_level=True)


def ssh(
    target: str, cmd: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `cmd` (a shell command line) on a lab node as root or as user@node. As root, with
    PODNET_E2E_ROOT_PATH's directories first on PATH (a site's Slurm off root's default PATH,
    as an admin's login shell has it: tests/site-install/run.sh)."""
    env = {**os.environ, "LAB_NAME": LAB}
    if "@" not in target and os.environ.get("PODNET_E2E_ROOT_PATH"):
        cmd = f"PATH={os.environ['PODNET_E2E_ROOT_PATH']}:$PATH; {cmd}"
    r = subprocess.run(
        [str(REPO / "tests/lab/lab.sh"), "ssh", target, cmd],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and r.returncode != 0:
        raise AssertionError(f"{target}: {cmd!r} exited {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def lab_inventory() -> Path:
    """The lab's inventory, wherever it was written (inventories/lab for pnlab,
    LAB_INVENTORY for molecule's lab, the lab's state directory otherwise)."""
    r = subprocess.run(
        [str(REPO / "tests/lab/lab.sh"), "inventory"],
        env={**os.environ, "LAB_NAME": LAB},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return Path(r.stdout.strip())


@functools.cache
def component_on(name: str) -> bool:
    """Whether the lab was deployed with component `name` (apptainer, flannel): the
    podnet_<name>_enabled of its inventory as c1 sees it (default true; docs/admin-guide.md
    "Inventory")."""
    inventory = Path(sys.executable).parent / "ansible-inventory"
    r = subprocess.run(
        [str(inventory), "-i", str(lab_inventory()), "--host", "c1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    value = json.loads(r.stdout).get(f"podnet_{name}_enabled", True)
    return str(value).lower() not in ("false", "no", "0", "off")


def needs(component: str) -> pytest.MarkDecorator:
    """Skip a test that needs `component` only where the lab switched it off; in a lab that
    has it, a missing component fails the test."""
    return pytest.mark.skipif(
        not component_on(component),
        reason=f"{component} is switched off in this lab (podnet_{component}_enabled: false)",
    )


def pods(node: str) -> list[dict[str, Any]]:
    return list(json.loads(ssh(node, "podnet --json pods").stdout))


def wait_for(fn: Any, timeout: float = 60.0, step: float = 0.5) -> Any:
    end = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < end:
        try:
            last = fn()
            if last:
                return last
        except AssertionError as e:
            last = e
        time.sleep(step)
    raise AssertionError(f"timed out; last: {last!r}")


def sbatch(user: str, name: str, nodes: str = "c1,c2", script: str = "sleep 600") -> int:
    """A job of `user`, submitted as users submit: from their SSH session on the login
    node (their login pod)."""
    out = ssh(
        f"{user}@login",
        f"cd /tmp && sbatch --parsable -J {name} -w {nodes} "
        f"-N {len(nodes.split(','))} -o /tmp/{name}-%j.out --wrap '{script}'",
    ).stdout
    job = int(re.findall(r"\d+", out)[0])
    wait_for(lambda: ssh("login", f"squeue -h -j {job} -o %T").stdout.strip() == "RUNNING", 60)
    return job


def scancel(job: int) -> None:
    ssh("login", f"scancel {job}", check=False)
    wait_for(
        lambda: ssh("login", f"squeue -h -j {job} -o %T", check=False).stdout.strip() == "", 60
    )


@contextlib.contextmanager
def running_jobs(**specs: tuple[str, ...]) -> Iterator[dict[str, int]]:
    """Start one job per key (`sbatch`'s arguments: user, name[, nodes[, script]]) and cancel
    every job started, at the end or when a later one fails to start."""
    started: dict[str, int] = {}
    try:
        for key, args in specs.items():
            started[key] = sbatch(*args)
        yield started
    finally:
        for job in started.values():
            scancel(job)


def pod_of(node: str, job: int) -> dict[str, Any]:
    return next(p for p in pods(node) if p.get("job_id") == job)


def settle_to_job(user: str, node: str, job: int) -> None:
    """Wait until `job` is `user`'s only job pod on `node`: an SSH session joins the user's
    newest job pod there, and pods of jobs that just ended go in their epilog, after srun or
    `sbatch --wait` return."""
    wait_for(lambda: all(p.get("job_id") in (None, job) for p in pods(node) if p["user"] == user))


def in_pod(node: str, netns: str, cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`ip netns exec` (also the pod's resolv.conf) on a node, as root: what an admin sees
    of a pod's network. A user's process in a pod is started as users do: an SSH session
    (`ssh("alice@c1", ...)` joins her job's pod there) or a step from the login node."""
    name = Path(netns).name
    return ssh(node, f"ip netns exec {name} {cmd}", check=check)


@pytest.fixture(scope="session")
def jobs() -> Iterator[dict[str, int]]:
    """alice and bob each run a 2-node job for the whole session (cancelled at its end; the
    session takes more than 10 min on a busy machine, so the jobs must outlast any default)."""
    with running_jobs(
        alice=("alice", "e2ea", "c1,c2", "sleep 7200"), bob=("bob", "e2eb", "c1,c2", "sleep 7200")
    ) as j:
        yield j


def etcdctl(args: str) -> str:
    pki = "/etc/podnet/pki"
    return ssh(
        "ctl",
        f"etcdctl --endpoints=https://127.0.0.1:2379 --cacert={pki}/ca.crt "
        f"--cert={pki}/admin.crt --key={pki}/admin.key {args}",
    ).stdout


def _inventory_hosts(group: str) -> dict[str, dict[str, Any]]:
    """{host: its inventory variables} of `group` in the lab's inventory (nested groups
    searched), the variables taken from wherever the host is defined."""
    tree = yaml.safe_load(lab_inventory().read_text())["all"]
    hostvars: dict[str, dict[str, Any]] = {}
    members: set[str] = set()

    def walk(name: str, g: dict[str, Any]) -> None:
        for h, v in (g.get("hosts") or {}).items():
            hostvars.setdefault(h, {}).update(v or {})
            if name == group:
                members.add(h)
        for child, cg in (g.get("children") or {}).items():
            walk(child, cg or {})

    walk("all", tree)
    return {h: hostvars[h] for h in sorted(members)}


@functools.cache
def prometheus_url() -> str | None:
    """The lab's Prometheus (hpc.podnet.prometheus on the `prometheus` group: ctl; port 9090
    of its underlay address, reached from here over the lab bridge), None in a lab without."""
    hosts = _inventory_hosts("prometheus")
    if not hosts:
        return None
    host = next(iter(hosts.values()))
    return f"http://{host['podnet_underlay_ip']}:9090"


def prometheus_api(path: str, **params: str) -> Any:
    """GET /api/v1/<path> of the lab's Prometheus: its `data`."""
    url = f"{prometheus_url()}/api/v1/{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 (the lab's own address)
        body = json.load(r)
    assert body.get("status") == "success", body
    return body["data"]


def prometheus_value(query: str) -> float | None:
    """The value of an instant query with one result (None: no result)."""
    res = prometheus_api("query", query=query)["result"]
    assert len(res) <= 1, res
    return float(res[0]["value"][1]) if res else None


def firing(alertname: str, **labels: str) -> list[dict[str, Any]]:
    """The alerts `alertname` with `labels` that fire now in the lab's Prometheus."""
    return [
        a
        for a in prometheus_api("alerts")["alerts"]
        if a["labels"].get("alertname") == alertname
        and a["state"] == "firing"
        and all(a["labels"].get(k) == v for k, v in labels.items())
    ]


def save_evidence(name: str, text: str) -> None:
    """With PODNET_E2E_EVIDENCE=DIR, keep `text` as DIR/name (outputs a report quotes)."""
    out = os.environ.get("PODNET_E2E_EVIDENCE")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / name).write_text(text)
