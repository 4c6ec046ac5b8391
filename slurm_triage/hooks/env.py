"""What a Prolog/Epilog may believe from its environment, validated.

slurmd builds this environment, but values such as SPANK_TRIAGE travel from the user's
command line: each is checked against a closed form before use, never used as a path or
a command, and anything else in the environment is ignored.
"""
from __future__ import annotations

import os
import re
from typing import List, Mapping, Optional

from .. import ids
from ..ids import TRIAGE_MODES



class JobEnv:
    """The job as its hook environment describes it (validated by ``from_environ``).

    ``partition``: SLURM_JOB_PARTITION, '' when absent or not a plain name; ``triage``: the
    opt-in mode ('on', 'deep') or '' when the job did not opt in; ``gpus``: GRES GPU indices
    (device minor numbers) of the job on this node, None when unknown.
    """

    def __init__(self, job_id: str, node: str, uid: Optional[int] = None, user: str = "", nodelist: str = "",
                 partition: str = "", triage: str = "", gpus: Optional[List[int]] = None,
                 warnings: Optional[List[str]] = None):
        self.job_id, self.node, self.uid, self.user, self.nodelist = job_id, node, uid, user, nodelist
        self.partition, self.triage, self.gpus = partition, triage, gpus
        self.warnings: List[str] = [] if warnings is None else warnings

    def __repr__(self) -> str:
        return (f"JobEnv(job_id={self.job_id!r}, node={self.node!r}, uid={self.uid!r}, triage={self.triage!r}, "
                f"gpus={self.gpus!r})")


class EnvError(Exception):
    pass


def _int_list(text: str) -> Optional[List[int]]:
    try:
        return [int(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        return None


def from_environ(env: Mapping[str, str] = os.environ) -> JobEnv:
    """Parse the hook environment; raise EnvError when the job id or node is unusable."""
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    if not ids.is_job_id(job_id):
        raise EnvError(f"SLURM_JOB_ID {job_id[:40]!r} is not a job id")
    node = env.get("SLURMD_NODENAME", "")
    if not ids.is_node(node):
        raise EnvError(f"SLURMD_NODENAME {node[:40]!r} is not a node name")
    out = JobEnv(job_id=job_id, node=node)
    uid = env.get("SLURM_JOB_UID", "")
    out.uid = int(uid) if uid.isdigit() else None
    user = env.get("SLURM_JOB_USER", "")
    out.user = user if re.match(r"^[A-Za-z0-9._][A-Za-z0-9._-]{0,31}$", user) else ""
    # 22.05 gives SLURM_NODELIST in the Prolog; later releases SLURM_JOB_NODELIST.
    out.nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    part = env.get("SLURM_JOB_PARTITION", "")
    out.partition = part if re.match(r"^[A-Za-z0-9_.-]{1,64}$", part) else ""
    mode = env.get("SPANK_TRIAGE")
    if mode is not None:
        mode = mode.strip() or "on"
        if mode in TRIAGE_MODES:
            out.triage = "" if mode == "off" else mode
        else:
            out.warnings.append(f"ignoring SPANK_TRIAGE={mode[:20]!r}: not one of {', '.join(TRIAGE_MODES)}")
    gpus = env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES")
    if gpus:
        out.gpus = _int_list(gpus)
    return out
