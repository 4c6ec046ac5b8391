"""The watcher's evidence bundles of a job: each hang episode with the ranks' threads,
environment, py-spy stacks and the samples that tripped it.

The watcher writes them as the job's user to ``[watcher] evidence_dir/slurm-triage-<uid>/
<job>/hang-<node>-<step>-<time>.json`` on each node, so they are visible from where triage
runs when that directory is shared (or on the node itself); what cannot be read is a
source note, never an error. The directory is shared with every other user, so only bundles
owned by the job's user (or root, or whoever runs triage) are believed: regular files only,
opened without following links or blocking on a FIFO, and size-capped.
"""
from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

from ... import ids
from .pushgateway import node_facts

MAX_BYTES = 32 << 20  # a bundle holds samples and stacks: bounded, never unbounded input
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def trusted_uids(job_uid: Optional[int]) -> Set[int]:
    """Owners whose bundles are believed: the job's user, root, and the caller (their own files)."""
    return {0, os.getuid()} | ({job_uid} if job_uid is not None else set())


def _owned_dir(path: str, uids: Set[int]) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid in uids


def read_bundle(path: str, uids: Set[int]) -> Dict[str, Any]:
    """One bundle's JSON; OSError/ValueError naming why it is not believed (link, FIFO, owner, size)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError("a symbolic link: not followed") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_uid not in uids:
            raise ValueError(f"owned by uid {st.st_uid}, not by the job's user or root")
        if st.st_size > MAX_BYTES:
            raise ValueError(f"larger than {MAX_BYTES} bytes")
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            data = fh.read(MAX_BYTES + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES} bytes")
    return json.loads(data.decode("utf-8", "replace"))


def _candidates(evidence_dir: str, job_id: str, uids: Set[int]) -> Iterable[str]:
    """hang-*.json paths under the trusted users' own slurm-triage-<uid>/<job> directories."""
    for uid in sorted(uids):
        job_dir = os.path.join(evidence_dir, f"slurm-triage-{uid}", job_id)
        if not (_owned_dir(os.path.dirname(job_dir), uids) and _owned_dir(job_dir, uids)):
            continue
        try:
            names = sorted(os.listdir(job_dir))
        except OSError:
            continue
        for name in names:
            if name.startswith("hang-") and name.endswith(".json"):
                yield os.path.join(job_dir, name)


WINDOW_SLACK_SECONDS = 60.0
"""Clock skew between nodes allowed when a bundle's detection time is held against the job's run."""


def _outside(data: Dict[str, Any], window: Tuple[Optional[float], Optional[float]]) -> bool:
    """True when the bundle was detected clearly before the job started or after it ended: an earlier job
    of the same id (a controller whose job ids started over, a lab made afresh)."""
    at = data.get("detected_at")
    if not isinstance(at, (int, float)) or isinstance(at, bool):
        return False
    start, end = window
    return bool((start and at < start - WINDOW_SLACK_SECONDS) or (end and at > end + WINDOW_SLACK_SECONDS))


def gather(evidence_dir: str, job_id: str, job_uid: Optional[int] = None,
           window: Tuple[Optional[float], Optional[float]] = (None, None)
           ) -> Tuple[Dict[str, Dict[str, Any]], Dict[str, Any]]:
    """Per-node facts (``watch``: ``hang_suspected``, ``bundles``) and the source record.

    ``job_uid``: the job's user (from Slurm); without it only root's and the caller's bundles count.
    ``window``: the job's (start, end) where known; a bundle detected outside it is another run's."""
    if not ids.is_job_id(job_id):
        return {}, {"read": False, "error": f"not a job id: {job_id!r}"}
    uids = trusted_uids(job_uid)
    nodes: Dict[str, Dict[str, Any]] = {}
    read: List[str] = []
    errors: List[str] = []
    stale = 0
    for path in _candidates(evidence_dir, job_id, uids):
        try:
            data = read_bundle(path, uids)
        except (OSError, ValueError) as e:
            errors.append(f"{path}: {e}"[:300])
            continue
        if not isinstance(data, dict) or str(data.get("job_id")) != job_id or not data.get("node"):
            continue
        if _outside(data, window):
            stale += 1
            continue
        read.append(path)
        facts = node_facts(nodes, str(data["node"]))
        if "bundles" not in facts["sources"]:
            facts["sources"].append("bundles")
        watch = facts["watch"]
        if data.get("kind") == "power_axiom_hang":
            watch["hang_suspected"] = True
        watch.setdefault("bundles", []).append(path)
    record: Dict[str, Any] = {"read": bool(read), "dir": evidence_dir, "files": len(read)}
    if stale:
        record["outside_the_job"] = stale  # detected before its start or after its end: an earlier job of this id
    if errors:
        record["errors"] = errors[:5]
    if not read and not errors:
        record["error"] = "no evidence bundle for the job (none written, or the directory is not shared here)"
    return nodes, record
