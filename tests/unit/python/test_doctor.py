# SPDX-License-Identifier: Apache-2.0
"""`podnet doctor`'s kernel checks (issue 22, point 5): they build what podnetd builds in a
throwaway network namespace instead of reading a module list. The logic with failures
injected (a kernel that refuses VXLAN devices, or any link), and the real thing on this
machine (as root), before and after dropping CAP_NET_ADMIN. tests/e2e/test_doctor.py runs
`podnet doctor` on every node of a lab."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from podnet.cli import podnet as cli
from podnet.kernel import capability, nl, nlquery

REPO = Path(__file__).resolve().parents[3]


class RefusingNetlink:
    """Accepts every request but those whose description starts with one of `refuse`
    (errno `code`): what a kernel without that kind of link answers."""

    def __init__(self, refuse: tuple[str, ...], code: int) -> None:
        self.refuse, self.code = refuse, code
        self.made: list[str] = []

    def batch(self, reqs: list[nl.Request]) -> list[int]:
        for r in reqs:
            if r.what.startswith(self.refuse):
                raise nl.NetlinkError(self.code, r.what)
            self.made.append(r.what)
        return [0] * len(reqs)


def _links(sock: Any) -> dict[str, dict[str, Any]]:
    made = " ".join(sock.made)
    names = ["lo"] + [n for n in ("pndbr", "pnda", "pndvx") if f" {n}" in made]
    return {n: {"index": i + 1} for i, n in enumerate(names)}


def test_a_kernel_without_vxlan_fails_only_that_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nlquery, "links", _links)
    got = capability.build(RefusingNetlink(("create vxlan",), errno.EOPNOTSUPP))  # type: ignore[arg-type]
    assert got["bridge"] == "" and got["veth"] == ""
    assert got["vxlan"] == (
        "cannot create a VXLAN device: the kernel cannot make one "
        "(module vxlan not loadable, not built in)"
    )
    checks = cli._kernel_checks(lambda: {"netns": ""} | got, root=True)
    assert [(c["check"], c["ok"]) for c in checks] == [
        ("kernel:netns", True),
        ("kernel:bridge", True),
        ("kernel:veth", True),
        ("kernel:vxlan", False),
    ]


def test_no_bridge_still_tries_the_others_without_a_master(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(nlquery, "links", _links)
    sock = RefusingNetlink(("create bridge",), errno.EPERM)
    got = capability.build(sock)  # type: ignore[arg-type]
    assert got["bridge"] == "cannot create a bridge: not permitted (CAP_NET_ADMIN missing?)"
    assert got["veth"] == "" and got["vxlan"] == ""
    assert any(w.startswith("create veth") for w in sock.made)


def test_not_root_is_skipped_not_failed() -> None:
    checks = cli._kernel_checks(lambda: pytest.fail("probed"), root=False)  # type: ignore[arg-type, return-value]
    assert all(c["ok"] and c["skipped"] for c in checks)
    assert [c["check"] for c in checks] == [f"kernel:{k}" for k in capability.CHECKS]


DROP_NET_ADMIN = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-net_admin"]
PROBE = "from podnet.kernel import capability; import json; print(json.dumps(capability.probe()))"


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a network namespace: root only")
def test_real_probe_works_and_fails_without_cap_net_admin() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "agent" / "src")}
    ok = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True
    )
    assert ok.stdout.strip() == '{"netns": "", "bridge": "", "veth": "", "vxlan": ""}', ok
    # the same, in a process without CAP_NET_ADMIN (a container without it, a unit with
    # CapabilityBoundingSet=): every kind of link is refused, and doctor says why
    bad = subprocess.run(
        [*DROP_NET_ADMIN, sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert '"netns": ""' in bad.stdout, bad
    assert '"vxlan": "cannot create a VXLAN device: not permitted' in bad.stdout, bad
