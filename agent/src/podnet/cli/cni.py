# SPDX-License-Identifier: Apache-2.0
"""`podnet-cni`: the podnet CNI plugin's command (`python -m podnet.cli.cni`): the request
from the environment and stdin, the reply on stdout, the exit status. The protocol is
podnet.api.cni, which podnetd also serves in-process for the C plugin."""

from __future__ import annotations

from typing import IO, TYPE_CHECKING

from podnet.api.cni import MAX_CONFIG, serve

if TYPE_CHECKING:
    from collections.abc import Mapping


def main(
    env: Mapping[str, str] | None = None,
    stdin: IO[bytes] | None = None,
    stdout: IO[str] | None = None,
) -> int:
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415

    env = os.environ if env is None else env
    out = sys.stdout if stdout is None else stdout
    data = (sys.stdin.buffer if stdin is None else stdin).read(MAX_CONFIG + 1)
    rc, text = serve(env, data)
    out.write(text)
    out.flush()
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
