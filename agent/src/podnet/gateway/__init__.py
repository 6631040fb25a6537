# SPDX-License-Identifier: Apache-2.0
"""podnet-gatewayd: the gateways' nftables table from etcd (docs/gateway.md)."""
