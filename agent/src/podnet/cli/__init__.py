# SPDX-License-Identifier: Apache-2.0
"""Front ends of the user-facing programs: `podnet` (podnet.cli.podnet) and
`podnet-cni` (podnet.cli.cni)."""
