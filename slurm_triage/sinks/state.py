"""JSON state per job (baselines, verdicts) and per node, under node.state_dir.

Layout: ``jobs/<job_id>/<kind>.json`` and, for node-level records such as the last
``slurm-triage check``, ``node/<kind>.json``. The job id comes from the environment of a
root hook, so it is validated against Slurm's forms (``123``, array ``123_4``) before it
touches a path. Writes are atomic so a concurrent reader never sees half a file.
"""
from __future__ import annotations

import json
import os
import re
import stat
import time
from typing import Any, Dict, List, NamedTuple, Optional

from ..config import Config
from .atomic import write_atomic

SCHEMA = 1
_JOB_ID = re.compile(r"[0-9]+(_[0-9]+)?")
_KIND = re.compile(r"[a-z][a-z0-9_-]*")


class Record(NamedTuple):
    job_id: Optional[str]
    kind: str
    saved_at: float
    data: Dict[str, Any]


def _dir(cfg: Config, job_id: Optional[str]) -> str:
    root = cfg.get("node", "state_dir")
    if not root:
        raise ValueError("node.state_dir is empty: no state can be kept")
    if job_id is None:
        return os.path.join(root, "node")
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
        raise ValueError(f"invalid Slurm job id {job_id!r}")
    return os.path.join(root, "jobs", job_id)


def _file(directory: str, kind: str) -> str:
    if not _KIND.fullmatch(kind):
        raise ValueError(f"invalid state kind {kind!r}")
    return os.path.join(directory, kind + ".json")


def save(cfg: Config, job_id: Optional[str], kind: str, data: Dict[str, Any]) -> str:
    """Store ``data`` as ``kind`` for ``job_id`` (None: node-level); returns the path."""
    directory = _dir(cfg, job_id)
    path = _file(directory, kind)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    record = {"schema": SCHEMA, "job_id": job_id, "kind": kind, "saved_at": time.time(), "data": data}
    write_atomic(path, json.dumps(record, sort_keys=True).encode())
    return path


def _read(path: str) -> Optional[Record]:
    try:
        with open(path, "rb") as fh:
            r = json.load(fh)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None
    if not isinstance(r, dict) or r.get("schema") != SCHEMA or not isinstance(r.get("data"), dict):
        return None
    return Record(r.get("job_id"), r.get("kind", ""), float(r.get("saved_at", 0)), r["data"])


def load(cfg: Config, job_id: Optional[str], kind: str) -> Optional[Dict[str, Any]]:
    """The data saved as ``kind`` for ``job_id``, or None (absent, unreadable, other schema)."""
    r = _read(_file(_dir(cfg, job_id), kind))
    return r.data if r else None


def saved_at(cfg: Config, job_id: Optional[str], kind: str) -> Optional[float]:
    """When ``kind`` was last saved for ``job_id`` (time.time()), None if it was not."""
    r = _read(_file(_dir(cfg, job_id), kind))
    return r.saved_at if r else None


def _job_dirs(cfg: Config) -> List[str]:
    jobs = os.path.join(cfg.get("node", "state_dir"), "jobs")
    try:
        return [os.path.join(jobs, n) for n in os.listdir(jobs) if _JOB_ID.fullmatch(n)]
    except FileNotFoundError:
        return []


def latest(cfg: Config, kind: str = "check") -> Optional[Record]:
    """The most recently saved ``kind`` record, node-level or from any job."""
    candidates = [_file(_dir(cfg, None), kind)] + [_file(d, kind) for d in _job_dirs(cfg)]
    best: Optional[Record] = None
    for path in candidates:
        r = _read(path)
        if r is not None and (best is None or r.saved_at > best.saved_at):
            best = r
    return best


def prune(cfg: Config, max_age_days: float) -> int:
    """Remove job directories not written for ``max_age_days``; returns how many.

    Only real directories named like job ids are removed, never a symlink's target.
    """
    cutoff = time.time() - max_age_days * 86400
    removed = 0
    for d in _job_dirs(cfg):
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_mtime < cutoff:
            import shutil  # only when old job states are pruned: every hook imports this module

            shutil.rmtree(d)
            removed += 1
    return removed
