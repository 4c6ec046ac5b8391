"""The Epilog: end snapshot, diff against the Prolog's baseline, this job's leftovers.

Runs as root on every node when the job ends. It reports what the job did to the GPUs
(energy, peak temperature, new Xids, ECC, remaps), finds what the job left behind, cleans
it up when configured, pushes the job summary (the node's `last_job` group, labelled with
the job id) and deletes the job's live groups.
Exit non-zero only when the node is unsafe: an unkillable leftover or a hardware FAIL.
"""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from .. import snapshot
from ..config import Config
from ..deadline import Spare
from .common import conclude, deliver_logged, internal_errors, publish, run_hook
from .prolog import grouping, job_gpu_uuids, warm_up

if TYPE_CHECKING:
    from ..model import Finding
    from .env import JobEnv

LIVE_PHASES = ("prolog", "watch")


COUNTERS = ("energy_joules", "ecc_uncorrected_volatile", "ecc_uncorrected_aggregate")
"""Fields that only grow, except when the driver reloads or the GPU is reset."""


def gpu_diff(base: Optional[Dict[str, Any]], end: Optional[Dict[str, Any]], uuids: List[str]) -> Dict[str, Any]:
    """Per job GPU: what changed between the Prolog's snapshot and now.

    A counter that went backwards was reset (driver reload, GPU reset) during the job: its
    difference means nothing, so it is None and ``counter_reset`` names it, never a
    negative figure."""
    b = {g.get("uuid"): g for g in ((base or {}).get("gpus") or [])}
    e = {g.get("uuid"): g for g in ((end or {}).get("gpus") or [])}
    out: Dict[str, Any] = {}
    for u in uuids:
        g0, g1 = b.get(u), e.get(u)
        if g0 is None or g1 is None:
            out[u] = {"missing_at": "end" if g1 is None else "start"}
            continue

        reset: List[str] = []

        def delta(key: str) -> Optional[float]:
            if g0.get(key) is None or g1.get(key) is None:
                return None
            if key in COUNTERS and g1[key] < g0[key]:
                reset.append(key)
                return None
            return g1[key] - g0[key]

        temps = [t for t in (g0.get("temperature_celsius"), g1.get("temperature_celsius")) if t is not None]
        out[u] = {
            "index": g1.get("index"),
            "energy_joules": delta("energy_joules"),
            "max_temperature_celsius": max(temps) if temps else None,
            "ecc_uncorrected_volatile_delta": delta("ecc_uncorrected_volatile"),
            "ecc_uncorrected_aggregate_delta": delta("ecc_uncorrected_aggregate"),
            "remap_pending": bool(g1.get("remap_pending")) and not g0.get("remap_pending"),
            "remap_failure": bool(g1.get("remap_failure")) and not g0.get("remap_failure"),
            "clock_event_names_at_end": g1.get("clock_event_names") or [],
            "lost": bool(g1.get("lost")),
        }
        if reset:
            out[u]["counter_reset"] = reset
    return out


def only_new_kernel_events(base: Optional[Dict[str, Any]], now: Optional[Dict[str, Any]]) -> None:
    """Keep the events logged since the Prolog; seqs compare only within one source."""
    if not base or not now or base.get("source") != now.get("source") or base.get("last_seq") is None:
        return
    now["events"] = [e for e in now.get("events", []) if (e.get("seq") or 0) > base["last_seq"]]


def job_leftovers(procs: Optional[Dict[str, Any]], env: JobEnv) -> List[Dict[str, Any]]:
    """Processes of this job still alive on this node (in the lab all nodes share /proc).

    A job id read from an environment is the process owner's claim: any user can export
    another job's SLURM_JOB_ID, so such a process counts only when it runs as the job's uid.
    """
    out = []
    for p in (procs or {}).get("processes", []):
        if p.get("job_id") == env.job_id and p.get("node") in (None, env.node):
            if p.get("job_source") == "environ" and p.get("uid") != env.uid:
                continue
            if p.get("pid") != os.getpid():
                out.append(p)
    return out


def _user_has_other_job(procs: Dict[str, Any], env: JobEnv) -> bool:
    running = set(procs.get("running_jobs", []))
    return any(p.get("uid") == env.uid and p.get("job_id") in running and p.get("job_id") != env.job_id
               for p in procs.get("processes", []))


def clean_up(cfg: Config, env: JobEnv, procs: Dict[str, Any], leftovers: List[Dict[str, Any]],
             started: float, findings: List[Finding]) -> Dict[str, Any]:
    """Kill this job's leftovers and remove its IPC files when configured; findings for what
    could not be done. ``killed`` lists only processes that were signalled and are gone."""
    from ..model import Finding, Verdict
    from .cleanup import KILL_WAIT_SECONDS, kill_leftovers, remove_ipc_files

    cleanup: Dict[str, Any] = {}
    if not cfg.get("hooks", "cleanup"):
        return cleanup
    if leftovers:
        done = kill_leftovers(leftovers, env.uid, cfg.get("hooks", "cleanup_grace_seconds"))
        cleanup["killed"] = done["killed"]
        for p in done["survivors"]:
            stuck = p.get("state") == "D"
            findings.append(Finding(
                id="leftover.unkillable", verdict=Verdict.FAIL, hardware=True, pid=p["pid"],
                summary=(f"job {env.job_id} process {p['pid']} ({p['comm']}) still there {KILL_WAIT_SECONDS:g} s "
                         f"after SIGKILL" + (" (state D: stuck in the kernel)" if stuck else f" (state {p.get('state')})")),
                evidence={"state": p.get("state"), "job_id": env.job_id, "kill_wait_seconds": KILL_WAIT_SECONDS},
                action="the process is stuck in the kernel (often a GPU driver wait): reboot the node"))
        for e in done["errors"]:
            findings.append(Finding(
                id="leftover.cleanup", verdict=Verdict.WARN, pid=e["pid"],
                summary=f"job {env.job_id} process {e['pid']} could not be signalled: {e['error']}",
                evidence={"job_id": env.job_id, **e}, action="look at the process by hand"))
    if env.uid not in (None, 0) and not _user_has_other_job(procs, env):
        mine = [f for f in procs.get("ipc_files", []) if f.get("uid") == env.uid and not f.get("symlink")
                and (f.get("mtime") or 0) >= started - 1]
        cleanup["removed"], errors = remove_ipc_files(mine, env.uid)
        if errors:
            cleanup["remove_errors"] = errors
            findings.append(Finding(
                id="leftover.cleanup", verdict=Verdict.WARN,
                summary=(f"job {env.job_id}: {len(errors)} IPC file(s) could not be removed, e.g. "
                         f"{errors[0]['path']}: {errors[0]['error']}"),
                evidence={"job_id": env.job_id, "count": len(errors), "files": errors[:10]},
                action="remove them by hand (a name swapped for a directory, an immutable file)"))
    return cleanup


def epilog(cfg: Config, env: JobEnv, pending: Optional[snapshot.Pending] = None) -> int:
    from ..checks import run_checks
    from ..model import Verdict, worst
    from ..sinks import state

    t0 = time.monotonic()
    base = state.load(cfg, env.job_id, "prolog") or {}
    base_snap = base.get("snapshot") or {}
    # An OK Epilog's results are published in the background (common.in_background), like
    # the Prolog's; the node is released without waiting for requests and prometheus_client.
    background = cfg.get("hooks", "background_push")
    push_now = bool(cfg.get("pushgateway", "url") and not background)
    snap = (pending or snapshot.start(cfg)).result(meanwhile=lambda: warm_up(push_now))
    only_new_kernel_events(base_snap.get("kernel"), snap.get("kernel"))
    snap["baseline"] = {"rdma": base_snap.get("rdma"), "time": base_snap.get("time")}
    uuids = base.get("job_gpus") or job_gpu_uuids(snap, env)
    diff = gpu_diff(base_snap.get("gpu"), snap.get("gpu"), uuids)
    leftovers = job_leftovers(snap.get("procs"), env)
    findings = run_checks(snap, cfg)
    cleanup = clean_up(cfg, env, snap.get("procs") or {}, leftovers, base_snap.get("time") or 0, findings)
    verdict = worst(f.verdict for f in findings)
    record = {"job_id": env.job_id, "node": env.node, "triage": env.triage, "verdict": verdict.value,
              "gpu_diff": diff,
              "leftovers": [{k: p.get(k) for k in ("pid", "comm", "uid", "listen", "libs")} for p in leftovers],
              "cleanup": cleanup, "findings": [f.to_dict() for f in findings], "snapshot": snap,
              "baseline_verdict": base.get("verdict")}
    drained, seconds = publish(cfg, env, "epilog", record, snap, findings, t0,
                               lambda s: _push(cfg, env, snap, findings, record, s),
                               background=background and verdict == Verdict.OK and not leftovers)
    summary = (f"job {env.job_id}: {verdict.value}, {len(leftovers)} leftover processes, "
               f"{len(cleanup.get('removed', []))} IPC files removed ({seconds:.2f} s)")
    return conclude(cfg, "epilog", summary, drained, verdict != Verdict.OK or bool(leftovers))


def _push(cfg: Config, env: JobEnv, snap: Dict[str, Any], findings: List[Finding],
          record: Dict[str, Any], seconds: float) -> None:
    from ..breaker import suppressed_total
    from ..sinks.exposition import render
    from ..sinks.spool import Op, stats

    extra = {"hook_duration_seconds": seconds, "internal_errors": internal_errors(cfg),
             "leftover_processes": len(record["leftovers"]), "drain_suppressed": suppressed_total(cfg),
             **stats(cfg)}
    # Each job's summary has a group of its own, so a spool replayed after an outage still
    # gives Prometheus every job; a later Epilog deletes it after pushgateway.result_keep_seconds
    # (the Pushgateway never forgets on its own). The live groups go in the same batch,
    # within one push budget.
    body = render(snap, findings, extra, gpu_diff=record["gpu_diff"], labels={"slurm_job_id": env.job_id})
    ops = [Op(grouping(env, "last_job"), body, keep_seconds=cfg.get("pushgateway", "result_keep_seconds"))]
    ops += [Op(grouping(env, phase)) for phase in LIVE_PHASES]
    deliver_logged(cfg, "epilog", env, ops)


def main(gpu_spare: Optional[Spare] = None) -> int:
    """The hook; ``gpu_spare``: the GPU probe's child, pre-forked by the hook's __main__."""
    return run_hook("epilog", "epilog_deadline_seconds", epilog, start=snapshot.starter(gpu_spare))
