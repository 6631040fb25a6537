# SPDX-License-Identifier: Apache-2.0
"""`podnet-cni`: the podnet CNI plugin's command (podnet.api.cni holds the protocol, which
podnetd also serves in-process for the C plugin); `python -m podnet.cli.cni`."""

from __future__ import annotations

from podnet.api.cni import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
