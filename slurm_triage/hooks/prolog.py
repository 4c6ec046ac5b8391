"""The Prolog: baseline snapshot, node checks, state, push, drain on a hardware FAIL.

Runs as root on every node of the allocation (PrologFlags=Alloc) before the job starts.
Exit 1 only for a hardware-meaning FAIL, so Slurm takes the node out and requeues (batch)
or cancels (srun) the job; everything else exits 0.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from .. import snapshot
from ..config import Config
from ..deadline import Spare
from .common import conclude, deliver_logged, internal_errors, publish, run_hook

if TYPE_CHECKING:
    from ..model import Finding
    from .env import JobEnv


def warm_up(push_now: bool) -> None:
    """Import what the hook needs once its probes are in: run while they work (their imports
    would otherwise follow them on the critical path of every job's start). ``push_now``: the
    hook pushes itself (a --triage job), so the sinks' libraries too."""
    from .. import checks
    from ..sinks import spool, state  # noqa: F401

    checks.load_all()
    if push_now:
        snapshot.preload_sinks()


def job_gpu_uuids(snapshot: Dict[str, Any], env: JobEnv) -> List[str]:
    """UUIDs of the job's GPUs: GRES indices are device minors, not NVML indices."""
    gpus = (snapshot.get("gpu") or {}).get("gpus") or []
    if env.gpus is None:
        return [g["uuid"] for g in gpus if g.get("uuid")]
    return [g["uuid"] for g in gpus if g.get("uuid") and g.get("minor") in env.gpus]


def prolog(cfg: Config, env: JobEnv, pending: Optional[snapshot.Pending] = None) -> int:
    from ..checks import run_checks
    from ..model import Verdict, worst

    t0 = time.monotonic()
    # A --triage job's gate reads this push before the job may start: it is sent before the
    # hook exits (its imports overlap the probes). Other jobs' OK results are published in
    # the background (common.in_background): the job does not wait for them.
    push_now = bool(env.triage and cfg.get("pushgateway", "url"))
    snap = (pending or snapshot.start(cfg)).result(meanwhile=lambda: warm_up(push_now))
    if env.triage:
        from ..step.sampling import sample_gpus

        snap["gpu_samples"] = sample_gpus(cfg, cfg.get("hooks", "sample_seconds"))
        if "error" in snap["gpu_samples"]:
            snap["errors"]["gpu_samples"] = snap["gpu_samples"].pop("error")
            snap["gpu_samples"] = None
    findings = run_checks(snap, cfg)
    verdict = worst(f.verdict for f in findings)
    record: Dict[str, Any] = {
        "job_id": env.job_id, "node": env.node, "uid": env.uid, "triage": env.triage,
        "nodelist": env.nodelist, "job_gpus": job_gpu_uuids(snap, env), "verdict": verdict.value,
        "findings": [f.to_dict() for f in findings], "snapshot": snap,
    }
    if env.triage:
        from ..step.sampling import peer_figures

        record["peer"] = peer_figures(snap)
    drained, seconds = publish(cfg, env, "prolog", record, snap, findings, t0,
                               lambda s: _push(cfg, env, snap, findings, record, s),
                               background=(cfg.get("hooks", "background_push") and not env.triage
                                           and verdict == Verdict.OK))
    summary = f"job {env.job_id}: {verdict.value} ({len(findings)} findings, {seconds:.2f} s)"
    if verdict != Verdict.OK:
        summary += ": " + "; ".join(f"{f.id} {f.summary}" for f in findings[:3])
    return conclude(cfg, "prolog", summary, drained, verdict != Verdict.OK)


def _push(cfg: Config, env: JobEnv, snap: Dict[str, Any], findings: List[Finding],
          record: Dict[str, Any], seconds: float) -> None:
    """The job's live group stays lean (verdict, findings, peer figures: what the gang gate
    reads for every node in one query); per-GPU series go to the textfile collector."""
    from ..breaker import suppressed_total
    from ..sinks import peer_metrics
    from ..sinks.exposition import render
    from ..sinks.spool import Op, stats

    extra = {"hook_duration_seconds": seconds, "internal_errors": internal_errors(cfg),
             "drain_suppressed": suppressed_total(cfg), **stats(cfg)}
    body = render(snap, findings, extra, gpus=False, more=peer_metrics.families(record.get("peer")))
    deliver_logged(cfg, "prolog", env, [Op(grouping(env, "prolog"), body)])


def grouping(env: JobEnv, phase: str) -> Dict[str, str]:
    return {"job": "slurm_triage", "instance": env.node, "slurm_job_id": env.job_id, "phase": phase}


def main(gpu_spare: Optional[Spare] = None) -> int:
    """The hook; ``gpu_spare``: the GPU probe's child, pre-forked by the hook's __main__."""
    return run_hook("prolog", "prolog_deadline_seconds", prolog, start=snapshot.starter(gpu_spare))
