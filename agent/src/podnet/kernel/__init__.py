# SPDX-License-Identifier: Apache-2.0
"""The kernel layer: netlink, network and PID namespaces, the pods' data plane, nftables,
the egress route. Knows nothing of etcd, users' records or the agent above it."""
