"""Closed forms for the Slurm identifiers we take from an environment: one definition for all.

Job ids, step ids and node names reach the hooks, the SPANK helper and the watcher from
the user's command line (srun/sbatch options, SPANK_TRIAGE), and end up in paths, process
titles and Pushgateway groups; each is checked here, whole (``fullmatch``: a trailing
newline is not a valid job id), before any use.
"""
from __future__ import annotations

import re

JOB_ID = re.compile(r"[0-9]{1,12}")
SLUID = re.compile(r"s[0-9A-F][0-9A-HJKMNP-TV-Z]{12}")
"""Slurm >= 26.05's job SLUID as Slurm prints it (src/common/sluid.c print_sluid): "s" and a
64-bit id in 13 Crockford base32 digits, the first of which holds only the top 4 bits.
Names the job's cgroup v2 directory and is SLURM_JOB_SLUID in the Prolog/Epilog and the job."""
STEP_ID = re.compile(r"[0-9]{1,10}|batch|extern|interactive")
"""A decimal step id or one of the named steps (the plugin's step_name())."""
NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A Slurm node name: cannot start with '-' (an option) or '.' (a path component)."""
HOSTLIST = re.compile(r"[A-Za-z0-9._,\[\]-]{0,65536}")
"""A Slurm hostlist expression (node[1-4],gpu-a01): no spaces, no shell characters."""
NUMERIC_ID = re.compile(r"[0-9]{1,10}")
"""A uid or gid."""

STEP_MODES = ("on", "deep")
"""The ``--triage`` modes that reach a step (``off`` never does)."""
TRIAGE_MODES = STEP_MODES + ("off",)
"""Every value ``--triage`` accepts (SPANK_TRIAGE in the Prolog/Epilog)."""


def is_job_id(s: str) -> bool:
    return JOB_ID.fullmatch(s) is not None


def is_sluid(s: str) -> bool:
    return SLUID.fullmatch(s) is not None


def is_node(s: str) -> bool:
    return NODE.fullmatch(s) is not None
