"""slurm-triage: make gang-scheduled GPU jobs fail fast and explain themselves."""

__version__ = "0.1.0"
