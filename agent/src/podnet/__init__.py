# SPDX-License-Identifier: Apache-2.0
"""podnet: pods (network namespaces) for Slurm jobs and login sessions.

Layout and import direction: docs/agent.md, "Code layout"."""

__version__ = "0.2.0"
#: podnetd's socket (NodeConfig `socket`), where the clients look unless told
DEFAULT_SOCKET = "/run/podnet/podnetd.sock"
