# SPDX-License-Identifier: Apache-2.0
"""preflight's kernel probe (roles/preflight/files/kernel_probe.sh) runs before podnet installs
nftables: on a node without the nft command it must still find nf_tables (it asks the kernel
over netlink with python3). Real: the probe's objects are made in a network namespace of its
own (unshare --net, root), with a PATH that has no nft."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parents[3] / "roles/preflight/files/kernel_probe.sh"


def _probe(path: str, *features: str) -> list[str]:
    out = subprocess.run(
        ["/bin/sh", str(PROBE), *features],
        env={"PATH": path, "LANG": "C"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.splitlines()


@pytest.mark.skipif(os.geteuid() != 0, reason="unshare --net needs root")
def test_nf_tables_found_without_nft(tmp_path: Path) -> None:
    for tool in ("unshare", "ip", "python3", "sh", "tr"):
        # the system's programs, as on a node (not a shim earlier on the caller's PATH, such
        # as pyenv's python3, a script that needs bash)
        found = shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin")
        assert found, tool
        (tmp_path / tool).symlink_to(found)
    assert not (tmp_path / "nft").exists()
    assert _probe(str(tmp_path), "nf_tables", "veth") == ["nf_tables ok", "veth ok"]


@pytest.mark.skipif(os.geteuid() != 0, reason="unshare --net needs root")
def test_unknown_feature_is_named() -> None:
    lines = _probe(os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "warp")
    assert lines == [
        "warp missing unknown feature (the probe knows veth, bridge, vxlan, nf_tables)"
    ]
