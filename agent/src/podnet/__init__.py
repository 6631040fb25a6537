# SPDX-License-Identifier: Apache-2.0
"""podnet: pods (network namespaces) for Slurm jobs and login sessions."""

__version__ = "0.1.0"
