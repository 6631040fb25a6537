# SPDX-License-Identifier: Apache-2.0
"""podnetd's API: the socket server and its handlers, the client, the CNI protocol,
metrics, and podnetd's entry point (daemon)."""
