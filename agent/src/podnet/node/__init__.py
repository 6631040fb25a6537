# SPDX-License-Identifier: Apache-2.0
"""The node layer: podnetd's agent on top of the kernel and state layers (pods, user
networks, the etcd sync loop, login sessions, reconcile and GC, containers)."""
