"""Which Slurm job a process belongs to, and which jobs run here, from local evidence only.

Never an RPC to slurmctld: the Prolog/Epilog must not depend on the controller, and
thousands of nodes asking at once would hurt it. Evidence, strongest first:
the job cgroup in ``/proc/PID/cgroup`` (proctrack/cgroup, task/cgroup), ``SLURM_JOB_ID``
in ``/proc/PID/environ`` (proctrack/linuxproc), and slurmstepd process titles
(``slurmstepd: [123.0]``), which exist exactly while a job has a step on the node.
"""
from __future__ import annotations

import os
import re
from typing import List, Optional, Set

# v2: "0::/system.slice/slurmstepd.scope/job_123/step_0/user/task_0"
# v1: "4:memory:/slurm/uid_1000/job_123/step_0/task_0"; MULTIPLE_SLURMD adds a node name.
_CGROUP_JOB = re.compile(rb"/job_(\d+)(?:/|$)", re.MULTILINE)
# slurmstepd's setproctitle: "slurmstepd: [123.0]", "[123.extern]", "[123.batch]", het "[123+1.0]",
# and "[123]" from old releases that ran one slurmstepd per job.
_STEPD_TITLE = re.compile(rb"^slurmstepd: \[(\d+)[.+\]]")


def job_from_cgroup(text: bytes) -> Optional[str]:
    """Job id named by a /proc/PID/cgroup file (v1 or v2), None when not in a job cgroup."""
    m = _CGROUP_JOB.search(text)
    return m.group(1).decode() if m else None


def job_from_stepd_title(cmdline: bytes) -> Optional[str]:
    """Job id in a slurmstepd process title (its /proc/PID/cmdline), None otherwise."""
    m = _STEPD_TITLE.match(cmdline)
    return m.group(1).decode() if m else None


def _slurm_dir(name: str) -> bool:
    """Parents of job_N cgroups: v1 slurm[_NODE]/uid_N, v2 [NODE_]slurmstepd.scope."""
    return name.startswith(("slurm", "uid_")) or name.endswith("slurmstepd.scope")


def job_cgroup_dirs(root: str = "/sys/fs/cgroup", max_depth: int = 5) -> List[str]:
    """Job ids with a job_N cgroup under ``root`` (v1 controllers, v2 or hybrid).

    Used only when /proc hides other users' processes (hidepid), because a leftover
    process keeps its job cgroup alive: an existing job_N directory alone does not
    prove the job still runs.
    """
    jobs: Set[str] = set()
    stack = [(root, 0, False)]
    while stack:
        path, depth, in_slurm = stack.pop()
        try:
            it = os.scandir(path)
        except OSError:
            continue
        with it:
            for e in it:
                if not e.is_dir(follow_symlinks=False):
                    continue
                if in_slurm and e.name.startswith("job_") and e.name[4:].isdigit():
                    jobs.add(e.name[4:])
                elif depth < max_depth and (depth == 0 or e.name == "system.slice" or _slurm_dir(e.name)):
                    stack.append((e.path, depth + 1, _slurm_dir(e.name)))
    return sorted(jobs, key=int)
