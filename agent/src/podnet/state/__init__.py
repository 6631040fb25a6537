# SPDX-License-Identifier: Apache-2.0
"""The state layer: etcd (store), addresses (ipam, alloc), the node's lease, published
ports and the gateway policy records. Knows nothing of the kernel or the agent above it."""
