"""Which Slurm job a process belongs to, and which jobs run here, from local evidence only.

Never an RPC to slurmctld: the Prolog/Epilog must not depend on the controller, and
thousands of nodes asking at once would hurt it. Evidence, strongest first:
the job cgroup in ``/proc/PID/cgroup`` (proctrack/cgroup, task/cgroup), ``SLURM_JOB_ID``
in ``/proc/PID/environ`` (proctrack/linuxproc), and slurmstepd process titles
(``slurmstepd: [123.0]``), which exist exactly while a job has a step on the node.

Since Slurm 26.05 the cgroup v2 job directory is named by the job's SLUID
(``slurmstepd.scope/s5K1KKYAYG5D00/step_0/...``) unless cgroup.conf says
``CgroupJobIdPaths=yes`` (``job_123``, the only form before 26.05). A SLUID is turned into
the job id by evidence that cannot be forged by the job's user: our own environment
(slurmd gives the Prolog/Epilog SLURM_JOB_SLUID with SLURM_JOB_ID) and the title of the
slurmstepd in that cgroup (``SLUID/step_N/slurm`` holds only slurmstepd, a root process).
A SLUID nothing resolves stays the job's name: a job that no longer runs here, which is
what a leftover is, and the id Slurm's own commands accept for it.
"""
from __future__ import annotations

import os
import re
import time
from typing import Dict, List, Optional, Set, Tuple

from ..ids import SLUID, is_job_id, is_sluid

# v2: "0::/system.slice/slurmstepd.scope/job_123/step_0/user/task_0"
# v1: "4:memory:/slurm/uid_1000/job_123/step_0/task_0"; MULTIPLE_SLURMD adds a node name.
_CGROUP_JOB = re.compile(rb"/job_(\d+)(?:/|$)", re.MULTILINE)
# v2 from 26.05: "0::/system.slice/slurmstepd.scope/s5K1KKYAYG5D00/step_0/user/task_0"
# (MULTIPLE_SLURMD: "<node>_slurmstepd.scope"); group 1 is the cgroup path up to the job dir.
_SCOPE = rb"/(?:[A-Za-z0-9._-]+_)?slurmstepd\.scope/"
_CGROUP_SLUID = re.compile(rb"^\d+:[^:\n]*:([^\n]*?" + _SCOPE + rb"(" + SLUID.pattern.encode() + rb"))(?:/|$)",
                           re.MULTILINE)
_CGROUP_STEP = re.compile(rb"(?:/job_(\d+)|" + _SCOPE + rb"(" + SLUID.pattern.encode()
                          + rb"))/step_([a-z0-9]+)(?:/|$)", re.MULTILINE)
CGROUP_ROOT = "/sys/fs/cgroup"
PROC = "/proc"
STEPD_UID = 0
"""slurmstepd runs as root."""
_known: Dict[str, str] = {}
"""SLUID -> job id: a SLUID names one run of one job, for good."""
_unknown: Dict[str, float] = {}
"""SLUID -> when it last resolved to nothing (asked again only after _RETRY_SECONDS)."""
_RETRY_SECONDS = 5.0
_MAX_CACHED = 4096
# slurmstepd's setproctitle: "slurmstepd: [123.0]", "[123.extern]", "[123.batch]", het "[123+1.0]",
# and "[123]" from old releases that ran one slurmstepd per job.
_STEPD_TITLE = re.compile(rb"^slurmstepd: \[(\d+)[.+\]]")


def cgroup_step(text: bytes) -> Optional[Tuple[str, str]]:
    """(job id or SLUID, step) of the step cgroup a /proc/PID/cgroup file names (v1, v2 with
    either naming), None outside a step cgroup. The step is "0", "batch", "extern", ..."""
    m = _CGROUP_STEP.search(text)
    if m is None:
        return None
    return (m.group(1) or m.group(2)).decode(), m.group(3).decode()


def job_from_cgroup(text: bytes, cgroup_root: str = CGROUP_ROOT, proc: str = PROC) -> Optional[str]:
    """Job id named by a /proc/PID/cgroup file, None when not in a job cgroup; a SLUID path
    gives the job id when resolve_sluid() can, else the SLUID itself."""
    m = _CGROUP_SLUID.search(text)
    if m:
        return resolve_sluid(m.group(2).decode(), cgroup_root + m.group(1).decode(), proc) or m.group(2).decode()
    m = _CGROUP_JOB.search(text)
    return m.group(1).decode() if m else None


def environ_sluid(env: Optional[Dict[str, str]] = None) -> Optional[Tuple[str, str]]:
    """(SLUID, job id) from SLURM_JOB_SLUID and SLURM_JOB_ID of ``env`` (default: ours), when
    both are well formed: what slurmd gives the Prolog/Epilog (and a job's steps) from 26.05."""
    env = os.environ if env is None else env
    sluid, job = env.get("SLURM_JOB_SLUID", ""), env.get("SLURM_JOB_ID", "")
    return (sluid, job) if is_sluid(sluid) and is_job_id(job) else None


def resolve_sluid(sluid: str, job_dir: str, proc: str = PROC) -> Optional[str]:
    """The job id of ``sluid``, whose cgroup directory is ``job_dir``: from our environment,
    else the title of a root slurmstepd in ``job_dir/step_*/slurm``; None when neither says."""
    if sluid in _known:
        return _known[sluid]
    own = environ_sluid()
    if own and own[0] == sluid:
        return _remember(sluid, own[1])
    if time.monotonic() - _unknown.get(sluid, -_RETRY_SECONDS) < _RETRY_SECONDS:
        return None
    job = _stepd_job(job_dir, proc)
    if job:
        return _remember(sluid, job)
    if len(_unknown) >= _MAX_CACHED:
        _unknown.clear()
    _unknown[sluid] = time.monotonic()
    return None


def _remember(sluid: str, job: str) -> str:
    if len(_known) >= _MAX_CACHED:
        _known.clear()
    _known[sluid] = job
    _unknown.pop(sluid, None)
    return job


def _stepd_job(job_dir: str, proc: str) -> Optional[str]:
    """Job id in the title of a slurmstepd (uid 0) listed in ``job_dir/step_*/slurm``."""
    try:
        steps = [e.name for e in os.scandir(job_dir) if e.name.startswith("step_")]
    except OSError:
        return None
    for step in sorted(steps):
        try:
            with open(f"{job_dir}/{step}/slurm/cgroup.procs", "rb") as fh:
                pids = fh.read(4096).split()
        except OSError:
            continue
        for pid in pids[:4]:
            if not pid.isdigit():
                continue
            try:
                if os.stat(f"{proc}/{pid.decode()}").st_uid != STEPD_UID:
                    continue
                with open(f"{proc}/{pid.decode()}/cmdline", "rb") as fh:
                    job = job_from_stepd_title(fh.read(256))
            except OSError:
                continue
            if job:
                return job
    return None


def sort_key(job: str) -> Tuple[int, int, str]:
    """Numeric job ids in order, then SLUIDs (which sort by time as text)."""
    return (0, int(job), "") if job.isdigit() else (1, 0, job)


def job_from_stepd_title(cmdline: bytes) -> Optional[str]:
    """Job id in a slurmstepd process title (its /proc/PID/cmdline), None otherwise."""
    m = _STEPD_TITLE.match(cmdline)
    return m.group(1).decode() if m else None


def _slurm_dir(name: str) -> bool:
    """Parents of job_N cgroups: v1 slurm[_NODE]/uid_N, v2 [NODE_]slurmstepd.scope."""
    return name.startswith(("slurm", "uid_")) or name.endswith("slurmstepd.scope")


def job_cgroup_dirs(root: str = CGROUP_ROOT, max_depth: int = 5, proc: str = PROC) -> List[str]:
    """Job ids with a job_N or SLUID cgroup under ``root`` (v1 controllers, v2 or hybrid); a
    SLUID is given as its job id when resolve_sluid() knows it, else as itself.

    Used only when /proc hides other users' processes (hidepid), because a leftover
    process keeps its job cgroup alive: an existing job directory alone does not
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
                elif in_slurm and path.endswith("slurmstepd.scope") and is_sluid(e.name):
                    jobs.add(resolve_sluid(e.name, e.path, proc) or e.name)
                elif depth < max_depth and (depth == 0 or e.name == "system.slice" or _slurm_dir(e.name)):
                    stack.append((e.path, depth + 1, _slurm_dir(e.name)))
    return sorted(jobs, key=sort_key)
