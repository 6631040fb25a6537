# SPDX-License-Identifier: Apache-2.0
"""podnetd imports pyroute2's message classes without the rest of pyroute2 (8 MB of RSS),
and a later `from pyroute2 import ...` in the same process still gets all of it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "agent" / "src"


def _run(code: str) -> str:
    r = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(SRC)!r})\n{code}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return r.stdout.strip()


def test_nl_does_not_import_the_rest_of_pyroute2() -> None:
    out = _run(
        "import podnet.kernel.nl as nl\n"
        "m = nl.ifinfmsg()\n"
        "print(sorted(k for k in ('pyroute2.ndb', 'pyroute2.ipdb', 'sqlite3', 'unittest.mock')"
        " if k in sys.modules))"
    )
    assert out == "[]"


def test_the_rest_of_pyroute2_still_imports_on_demand() -> None:
    out = _run(
        "import podnet.kernel.nl\n"
        "from pyroute2 import IPRoute, config\n"
        "import pyroute2\n"
        "print(IPRoute.__name__, 'pyroute2.ndb' in sys.modules, bool(pyroute2.__version__))"
    )
    assert out == "IPRoute True True"
