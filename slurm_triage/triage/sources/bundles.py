"""The watcher's evidence bundles of a job: each hang episode with the ranks' threads,
environment, py-spy stacks and the samples that tripped it.

The watcher writes them as the job's user to ``[watcher] evidence_dir/slurm-triage-<uid>/
<job>/hang-<node>-<step>-<time>.json`` on each node, so they are visible from where triage
runs when that directory is shared (or on the node itself); what cannot be read is a
source note, never an error.
"""
from __future__ import annotations

import glob
import json
import os
from typing import Any, Dict, List, Tuple

from ... import ids
from .pushgateway import node_facts

MAX_BYTES = 32 << 20  # a bundle holds samples and stacks: bounded, never unbounded input


def gather(evidence_dir: str, job_id: str) -> Tuple[Dict[str, Dict[str, Any]], Dict[str, Any]]:
    """Per-node facts (``watch``: ``hang_suspected``, ``bundles``) and the source record."""
    if not ids.is_job_id(job_id):
        return {}, {"read": False, "error": f"not a job id: {job_id!r}"}
    pattern = os.path.join(evidence_dir, "slurm-triage-*", job_id, "hang-*.json")
    nodes: Dict[str, Dict[str, Any]] = {}
    read: List[str] = []
    errors: List[str] = []
    for path in sorted(glob.glob(pattern)):
        try:
            if os.lstat(path).st_size > MAX_BYTES:
                raise ValueError(f"larger than {MAX_BYTES} bytes")
            with open(path, encoding="utf-8", errors="replace") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as e:
            errors.append(f"{path}: {e}"[:300])
            continue
        if not isinstance(data, dict) or str(data.get("job_id")) != job_id or not data.get("node"):
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
    if errors:
        record["errors"] = errors[:5]
    if not read and not errors:
        record["error"] = "no evidence bundle for the job (none written, or the directory is not shared here)"
    return nodes, record
