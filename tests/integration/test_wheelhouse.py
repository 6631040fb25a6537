# SPDX-License-Identifier: Apache-2.0
"""The wheelhouse `make artifacts` builds installs offline on every supported node Python:
Debian 12's 3.11 here (the host's own /usr/bin/python3; the lab's trixie nodes install it on
3.13 in every deploy), with nothing but the wheelhouse (pip --no-index)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = Path(os.environ.get("PODNET_WHEELHOUSE_DIR", ROOT / "build/artifacts"))
#: a node's environment: no PYTHONPATH (the Makefile points it at agent/src, where the dev
#: venv's editable install leaves podnet.egg-info: pip would take podnet as installed, and
#: the import below would read the sources instead of the wheel)
NODE_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _wheelhouse() -> Path:
    found = sorted(WHEELHOUSE.glob("podnet-wheelhouse-*"))
    assert found, f"no wheelhouse in {WHEELHOUSE}: run `make artifacts`"
    return found[-1]


def test_wheelhouse_has_wheels_for_python_3_11_and_3_13() -> None:
    names = [p.name for p in _wheelhouse().glob("*.whl")]
    binary = [n for n in names if "-cp3" in n]
    for tag in ("cp311", "cp313"):
        assert any(f"-{tag}-" in n for n in binary), (tag, names)


@pytest.mark.skipif(
    subprocess.run(
        ["/usr/bin/python3", "-c", "import sys; assert sys.version_info[:2] == (3, 11)"],
        check=False,
    ).returncode
    != 0,
    reason="needs Debian 12's Python 3.11 as /usr/bin/python3 (the machine this project runs on)",
)
def test_wheelhouse_installs_offline_on_debian12_python(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", venv], check=True)
    wh = _wheelhouse()
    r = subprocess.run(
        [venv / "bin/pip", "install", "-q", "--no-index", "--find-links", wh, "podnet"],
        capture_output=True,
        text=True,
        check=False,
        env=NODE_ENV,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(
        [
            venv / "bin/python",
            "-c",
            "import podnet.node.agent, yaml, pyroute2; print(yaml.__file__)",
        ],
        capture_output=True,
        text=True,
        check=False,
        env=NODE_ENV,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert sys.prefix not in r.stdout  # the venv's own PyYAML, from the wheelhouse
    for exe in ("podnetd", "podnet"):
        assert (venv / "bin" / exe).exists(), exe
