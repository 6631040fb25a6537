# SPDX-License-Identifier: Apache-2.0
"""pyroute2's four rtnetlink message classes, without the rest of pyroute2.

`import pyroute2.netlink.rtnl.ifinfmsg` runs pyroute2's package `__init__` first, which
imports all of pyroute2 (NDB with sqlite3, IPDB, plan9, ipset, unittest.mock,
multiprocessing...): 8 MB of podnetd's RSS for the four classes nl.py decodes with. So
the package is entered without running its `__init__` (its submodules import as usual); the
`__init__` runs after all, once, the first time anything asks the package for a name that
is not a submodule (`from pyroute2 import IPRoute` in the same process keeps working). If
something imported pyroute2 before, nothing changes.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any


def _enter_package() -> None:
    if "pyroute2" in sys.modules:
        return
    spec = importlib.util.find_spec("pyroute2")
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return  # the import below says what is wrong
    pkg = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def rest_of_pyroute2(name: str) -> Any:
        if not name.startswith("__"):  # a submodule (`from pyroute2 import config`)
            try:
                return importlib.import_module(f"pyroute2.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"pyroute2.{name}":
                    raise
        del pkg.__dict__["__getattr__"]
        loader.exec_module(pkg)
        return getattr(pkg, name)

    pkg.__dict__["__getattr__"] = rest_of_pyroute2
    sys.modules["pyroute2"] = pkg


_enter_package()

from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg  # noqa: E402
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg  # noqa: E402
from pyroute2.netlink.rtnl.ndmsg import ndmsg  # noqa: E402
from pyroute2.netlink.rtnl.rtmsg import rtmsg  # noqa: E402

__all__ = ["ifaddrmsg", "ifinfmsg", "ndmsg", "rtmsg"]
