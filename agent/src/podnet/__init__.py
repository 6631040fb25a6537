"""podnet: pods (network namespaces) for Slurm jobs and login sessions."""

__version__ = "0.1.0"
