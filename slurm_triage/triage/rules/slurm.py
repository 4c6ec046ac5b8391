"""Slurm's own verdicts: banners printed into job logs (``*** JOB 123 ON node CANCELLED AT ... DUE TO ... ***``)
and the job's end state in accounting."""
from __future__ import annotations

from typing import Dict, List, Optional

from ...model import Verdict
from ..model import JobEvidence, LogEvent, TriageFinding, from_events
from .common import of_kind, only

# reason -> (verdict, confidence, is a consequence of something else, summary, action)
_REASONS = {
    "TIME LIMIT": (Verdict.FAIL, 0.8, True, "job hit its time limit",
                   "if the job stalled before the limit, see the earlier finding; else raise --time or checkpoint"),
    "NODE FAILURE": (Verdict.FAIL, 0.85, False, "Slurm lost a node of the job (NODE_FAIL)",
                     "check that node (slurmd/slurmctld logs, kernel log, power) before reusing it; requeue"),
    "PREEMPTION": (Verdict.WARN, 0.9, False, "job was preempted by a higher-priority job",
                   "expected under the partition's preemption policy; resume from the last checkpoint"),
    None: (Verdict.WARN, 0.5, True, "job/step was cancelled (by a user, or by srun after a task failed)",
           "look at the earlier findings; `sacct -j JOBID -o JobID,State,ExitCode,Reason` says who"),
}


def cancellations(events: List[LogEvent]) -> List[TriageFinding]:
    """Cancellation banners grouped by reason: node failure and preemption are causes, the rest symptoms."""
    groups: Dict[Optional[str], List[LogEvent]] = {}
    for e in of_kind(events, "slurm_cancel"):
        reason = e.fields.get("reason")
        groups.setdefault(str(reason).strip() if reason else None, []).append(e)
    out: List[TriageFinding] = []
    for reason, evs in groups.items():
        verdict, conf, consequence, summary, action = _REASONS.get(
            reason, (Verdict.WARN, 0.6, False, f"job cancelled due to {reason}", "see sacct for the reason"))
        nodes = sorted({e.node for e in evs if e.node})
        key = (reason or "cancelled").lower().replace(" ", "_")
        out.append(from_events(
            evs, id=f"log.slurm.{key}", category="scheduler", verdict=verdict, confidence=conf,
            node=only(nodes), summary=summary + (f" ({', '.join(nodes)})" if nodes else ""), action=action,
            evidence={"reason": reason, "ids": sorted({str(e.fields["id"]) for e in evs}),
                      "at": sorted({str(e.fields["at"]) for e in evs}), "nodes": nodes},
            consequence=consequence))
    return out


def memory_request_refused(events: List[LogEvent]) -> List[TriageFinding]:
    """A refusal because no node can satisfy the request, beside the job's own memory request: config.

    Slurm answers 'Requested node configuration is not available' when no node of the partition (or
    cluster) could ever run the job as asked. With a --mem/--mem-per-cpu/--mem-per-gpu on the submit
    line or in the script, the size asked for is the likeliest reason: the job's configuration, not the
    cluster's state (without one, submission_refused names a scheduler refusal as before)."""
    refusals = of_kind(events, "slurm_node_config_unavailable")
    asks = of_kind(events, "slurm_memory_request")
    if not refusals or not asks:
        return []
    requests = list(dict.fromkeys(f"{e.fields.get('option')}={e.fields.get('mem')}" for e in asks))
    clusters = list(dict.fromkeys(e.fields["cluster"] for e in refusals if e.fields.get("cluster")))
    where = f" on {', '.join(clusters)}" if clusters else ""
    return [from_events(
        refusals, id="log.memory_request_refused", category="config", verdict=Verdict.FAIL, confidence=0.7,
        summary=f"Slurm refused the job{where}: no node can satisfy the request, and the job asks for "
                f"{', '.join(requests[:3])}: more memory than the eligible nodes have",
        action="lower the memory request to what the partition's nodes offer (sinfo -o '%P %m' shows RealMemory "
               "in MB) or submit to a partition/cluster with larger nodes; a rule or template that computes the "
               "size must cap it at the nodes' memory",
        evidence={"requests": requests, "clusters": clusters, "request_lines": [e.text for e in asks[:3]]})]


# Slurm job state -> (category, verdict, confidence, consequence, summary, action)
_STATES = {
    "TIMEOUT": ("scheduler", Verdict.FAIL, 0.8, True, "job hit its time limit",
                "if the job stalled before the limit, see the earlier finding; else raise --time or checkpoint"),
    "NODE_FAIL": ("scheduler", Verdict.FAIL, 0.85, False, "Slurm lost a node of the job (NODE_FAIL)",
                  "check that node (slurmd/slurmctld logs, kernel log, power) before reusing it; requeue"),
    "PREEMPTED": ("scheduler", Verdict.WARN, 0.9, False, "job was preempted by a higher-priority job",
                  "expected under the partition's preemption policy; resume from the last checkpoint"),
    "OUT_OF_MEMORY": ("memory", Verdict.FAIL, 0.85, False, "Slurm ended the job: out of memory (cgroup)",
                      "request more memory (--mem / --mem-per-gpu) or reduce host-side buffers"),
    "BOOT_FAIL": ("scheduler", Verdict.FAIL, 0.8, False, "a node failed to boot for the job",
                  "check the node's boot/health; Slurm requeues the job when allowed"),
    "DEADLINE": ("scheduler", Verdict.WARN, 0.8, False, "job reached its --deadline", "resubmit with a later deadline"),
    "CANCELLED": ("scheduler", Verdict.WARN, 0.5, True, "job was cancelled",
                  "look at the earlier findings; sacct's State column says who cancelled it"),
}


def job_state(ev: JobEvidence) -> List[TriageFinding]:
    """Slurm's own end state of the job (accounting): time limit, node failure, preemption, OOM, cancel."""
    job = ev.job or {}
    state = str(job.get("state") or "").split("+")[0].split(" ")[0]
    if state not in _STATES:
        return []
    cat, verdict, conf, consequence, summary, action = _STATES[state]
    restarts = job.get("restarts") or 0
    if restarts:
        summary += f" (requeued {restarts}×)"
    f = TriageFinding(id=f"slurm.{state.lower()}", category=cat, verdict=verdict, confidence=conf,
                      summary=summary, action=action, consequence=consequence,
                      evidence={"state": job.get("state"), "exit_code": job.get("exit_code"),
                                "signal": job.get("signal"), "reason": job.get("reason"), "restarts": restarts,
                                "end": job.get("end"), "time_limit_seconds": job.get("time_limit_seconds")})
    f.first_time = job.get("end") if state in ("TIMEOUT", "CANCELLED") else (job.get("end") or job.get("start"))
    return [f]
