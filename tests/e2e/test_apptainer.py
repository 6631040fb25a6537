# SPDX-License-Identifier: Apache-2.0
"""The apptainer role (roles/apptainer): a user builds a SIF from a directory and runs
it in a job, with and without --fakeroot, in the job's pod network namespace."""

from __future__ import annotations

import base64
import re
from pathlib import Path

from conftest import needs, ssh

pytestmark = needs("apptainer")

# A tiny root file system from the node's own binaries (no image registry in the lab).
MKROOT = (Path(__file__).resolve().parent / "apptainer-mkroot.sh").read_text()


def install_mkroot(node: str) -> str:
    """Put the root file system script on a node; return its path."""
    b64 = base64.b64encode(MKROOT.encode()).decode()
    path = "/tmp/podnet-e2e-mkroot.sh"
    ssh(node, f"echo {b64} | base64 -d >{path} && chmod 0755 {path}")
    return path


def alice_srun(args: str, cmd: str, timeout: float = 180) -> str:
    return ssh(
        "alice@login",
        f"cd /tmp && srun -N1 -w c1 -t 5 {args} {cmd}",
        timeout=timeout,
    ).stdout


def test_role_installs_the_pinned_package_and_its_config() -> None:
    for node in ("login", "c1", "c2"):
        pkg = ssh(node, "dpkg-query -W -f '${Version} ${db:Status-Abbrev}' apptainer").stdout
        # Debian 12: podnet's build of the same Debian source (sid's needs glibc 2.38)
        release = ssh(node, ". /etc/os-release && echo $VERSION_CODENAME").stdout.strip()
        version = "1.4.5-2+podnet1~deb12" if release == "bookworm" else "1.4.5-2"
        assert pkg.startswith(f"{version} hi"), (node, pkg)
        conf = ssh(node, "cat /etc/apptainer/apptainer.conf").stdout
        assert re.search(r"^root default capabilities = no$", conf, re.M), node
        # fakeroot ranges: the role's, collision-free (checked by podnet-subid-check)
        for f in ("subuid", "subgid"):
            ssh(node, f"/usr/local/sbin/podnet-subid-check /etc/{f}")
            assert re.search(r"^alice:1000000000:65536$", ssh(node, f"cat /etc/{f}").stdout, re.M)


def test_overlapping_subid_ranges_are_refused() -> None:
    bad = ssh(
        "c1",
        "printf 'x:100000:65536\\ny:165535:10\\n' >/tmp/pnsub && "
        "/usr/local/sbin/podnet-subid-check /tmp/pnsub 2>&1; echo rc=$?",
    ).stdout
    assert "overlaps" in bad and "rc=1" in bad, bad


def test_a_broken_apptainer_conf_is_refused_by_the_checker() -> None:
    out = ssh(
        "c1",
        "printf 'bind path = /etc/hosts\\nallow setuid = maybe-not\\n' >/tmp/pnconf && "
        "/usr/local/sbin/podnet-apptainer-conf-check /tmp/pnconf 2>&1; echo rc=$?",
    ).stdout
    assert "rc=0" not in out and "allow setuid" in out, out
    # the running file was not touched by the check
    ssh("c1", "grep -q '^root default capabilities = no$' /etc/apptainer/apptainer.conf")


def test_user_builds_a_sif_from_a_directory_and_runs_it_in_a_job() -> None:
    mkroot = install_mkroot("c1")
    build = alice_srun(
        "",
        f"sh -c '{mkroot} /tmp/alice-e2e-root && "
        "apptainer -q build -F /tmp/alice-e2e.sif /tmp/alice-e2e-root >/dev/null && echo built'",
    )
    assert "built" in build, build
    sif = "/tmp/alice-e2e.sif"
    plain = alice_srun("", f"apptainer -q exec {sif} sh -c 'cat /etc/podnet-image; id -u'")
    assert plain.split() == ["podnet-test-image", "2001"], plain
    fake = alice_srun(
        "", f"apptainer -q exec --fakeroot {sif} sh -c 'id -u; cat /proc/self/uid_map'"
    )
    # root in the container, and the role's sub-uid range behind it (without a range
    # Apptainer falls back to mapping the user alone: no uid but 0 would exist)
    assert fake.split()[0] == "0", fake
    assert re.search(r"^\s*1\s+1000000000\s+65536$", fake, re.M), fake
    # the container shares the step's network namespace: the job's pod
    step_ns, cont_ns = alice_srun(
        "", f"sh -c 'n=/proc/self/ns/net; readlink $n; apptainer -q exec {sif} readlink $n'"
    ).split()
    host_ns = ssh("c1", "readlink /proc/1/ns/net").stdout.strip()
    assert cont_ns == step_ns != host_ns, (cont_ns, step_ns, host_ns)
    ssh("c1", "rm -rf /tmp/alice-e2e.sif /tmp/alice-e2e-root")
