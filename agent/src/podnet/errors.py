# SPDX-License-Identifier: Apache-2.0
"""podnet's one error type: a code of the API (docs/api.md) and a message.

podnetd raises it wherever a request cannot be served (the socket server answers with its
code and message), and the client raises it for an error reply (`api.client.ApiError` is
the same class), so a code travels from where it arises to the program that prints it.
"""

from __future__ import annotations


class PodnetError(Exception):
    """An error with an API code (`EINVAL`, `EPERM`, `ENOENT`, `EUNAVAIL`, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
