# SPDX-License-Identifier: Apache-2.0
"""The host-side filter's exception for slurmstepd (issue 22, point 4): the cgroup podnetd
makes for it, found in each cgroup layout, and its rule's place in the output chain. The
rule runs for real in tests/agent/test_stepd_cgroup.py and tests/e2e/test_optout.py."""

from __future__ import annotations

from pathlib import Path

from podnet.kernel import firewall


def _output(stepd: str) -> list[str]:
    text = firewall.ruleset("198.18.0.0/15", 4789, [], [], [], [0], stepd_cgroup=stepd)
    out = text[text.index("chain output {", text.index("table inet podnet")) :]
    return [ln.strip() for ln in out[: out.index("}")].splitlines() if ln.strip()]


def test_stepd_cgroup_in_each_cgroup_layout(tmp_path: Path) -> None:
    # unified (cgroup v2 on /sys/fs/cgroup)
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpu memory\n")
    assert firewall.stepd_cgroup(v2) == "podnet-stepd"
    assert (v2 / "podnet-stepd").is_dir()
    assert firewall.stepd_cgroup(v2) == "podnet-stepd"  # made once, kept
    # systemd's hybrid layout: cgroup v2 on /sys/fs/cgroup/unified
    hy = tmp_path / "hybrid"
    (hy / "unified").mkdir(parents=True)
    (hy / "unified" / "cgroup.controllers").write_text("\n")
    assert firewall.stepd_cgroup(hy) == "unified/podnet-stepd"
    assert (hy / "unified" / "podnet-stepd").is_dir()
    # cgroup v1 alone: none (the filter then has no exception)
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    assert firewall.stepd_cgroup(v1) == ""
    assert not (v1 / "podnet-stepd").exists()


def test_stepd_rule_sits_between_the_system_uids_and_the_user_drop() -> None:
    out = _output("unified/podnet-stepd")
    rule = next(i for i, ln in enumerate(out) if "socket cgroupv2" in ln)
    assert out[rule].startswith(
        'ip daddr 198.18.0.0/15 socket cgroupv2 level 1 "unified/podnet-stepd" accept'
    )
    assert "meta skuid @host_uids accept" in out[rule - 1]
    assert out[rule + 1] == "ip daddr 198.18.0.0/15 meta skuid 0-4294967295 drop"
    # no cgroup v2: no exception, every user socket to a pod is dropped as before
    assert not any("cgroupv2" in ln for ln in _output(""))


def test_a_cgroup_made_again_is_noticed(tmp_path: Path) -> None:
    """systemd's shutdown removes empty cgroups (in the lab, any node's, since the nodes
    share one hierarchy): the same path is then another cgroup, which the loaded rule does
    not match, and podnetd's quiet sync pass reloads the rules."""
    (tmp_path / "cgroup.controllers").write_text("\n")
    c = firewall.StepdCgroup(tmp_path)
    assert c.ensure() == "podnet-stepd"
    assert not c.moved()
    (tmp_path / "podnet-stepd").rmdir()
    assert c.moved()  # gone
    (tmp_path / "podnet-stepd").mkdir()
    c.ensure()
    (tmp_path / "podnet-stepd").rename(tmp_path / "old")  # kept: its inode is not reused
    (tmp_path / "podnet-stepd").mkdir()
    assert c.moved()  # another cgroup at the same path (cgroup ids are never reused)
    c.ensure()
    assert not c.moved()
    # after a failure: tried again, not at once
    c.failed(retry_after=0.0)
    assert c.moved()
    c.failed(retry_after=60.0)
    assert not c.moved()
