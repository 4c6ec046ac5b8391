"""The Epilog: end snapshot, diff against the Prolog's baseline, this job's leftovers.

Runs as root on every node when the job ends. It reports what the job did to the GPUs
(energy, peak temperature, new Xids, ECC, remaps), finds what the job left behind, cleans
it up when configured, pushes the job summary (the node's `last_job` group, labelled with
the job id) and deletes the job's live groups.
Exit non-zero only when the node is unsafe: an unkillable leftover or a hardware FAIL.
"""
from __future__ import annotations

import errno
import os
import signal
import stat
import time
from typing import Any, Dict, List, Optional

from ..checks import run_checks
from ..config import Config
from ..model import Finding, Verdict, worst
from ..snapshot import preload_sinks, take
from .common import conclude, deliver_logged, internal_errors, publish, run_hook
from .env import JobEnv
from .prolog import grouping, job_gpu_uuids

LIVE_PHASES = ("prolog", "watch")


def gpu_diff(base: Optional[Dict[str, Any]], end: Optional[Dict[str, Any]], uuids: List[str]) -> Dict[str, Any]:
    """Per job GPU: what changed between the Prolog's snapshot and now."""
    b = {g.get("uuid"): g for g in ((base or {}).get("gpus") or [])}
    e = {g.get("uuid"): g for g in ((end or {}).get("gpus") or [])}
    out: Dict[str, Any] = {}
    for u in uuids:
        g0, g1 = b.get(u), e.get(u)
        if g0 is None or g1 is None:
            out[u] = {"missing_at": "end" if g1 is None else "start"}
            continue

        def delta(key: str) -> Optional[float]:
            if g0.get(key) is None or g1.get(key) is None:
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
    return out


def only_new_kernel_events(base: Optional[Dict[str, Any]], now: Optional[Dict[str, Any]]) -> None:
    """Keep the events logged since the Prolog; seqs compare only within one source."""
    if not base or not now or base.get("source") != now.get("source") or base.get("last_seq") is None:
        return
    now["events"] = [e for e in now.get("events", []) if (e.get("seq") or 0) > base["last_seq"]]


def job_leftovers(procs: Optional[Dict[str, Any]], env: JobEnv) -> List[Dict[str, Any]]:
    """Processes of this job still alive on this node (in the lab all nodes share /proc)."""
    out = []
    for p in (procs or {}).get("processes", []):
        if p.get("job_id") == env.job_id and p.get("node") in (None, env.node):
            if p.get("pid") != os.getpid():
                out.append(p)
    return out


def _alive(pid: int, start_time: Optional[float]) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            st = fh.read()
    except OSError:
        return False
    state = st[st.rfind(b")") + 2:st.rfind(b")") + 3]
    return state != b"Z"


def kill_leftovers(cfg: Config, env: JobEnv, procs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """SIGTERM, grace, SIGKILL; only processes of the job's own uid. Returns survivors."""
    targets = [p for p in procs if env.uid is not None and p.get("uid") == env.uid and env.uid != 0]
    for p in targets:
        try:
            os.kill(p["pid"], signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + cfg.get("hooks", "cleanup_grace_seconds")
    while time.monotonic() < deadline and any(_alive(p["pid"], p.get("start_time")) for p in targets):
        time.sleep(0.05)
    for p in targets:
        if _alive(p["pid"], p.get("start_time")):
            try:
                os.kill(p["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
    time.sleep(0.2)
    return [p for p in targets if _alive(p["pid"], p.get("start_time"))]


def remove_ipc_files(files: List[Dict[str, Any]], uid: int) -> List[str]:
    """Unlink regular files owned by ``uid`` inside their scanned directory, never via a link."""
    removed = []
    for f in files:
        d, name = f.get("dir"), f.get("name")
        if not d or not name or "/" in name or name in (".", ".."):
            continue
        try:
            dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            st = os.lstat(name, dir_fd=dfd)
            if st.st_uid != uid or not stat.S_ISREG(st.st_mode):
                continue
            os.unlink(name, dir_fd=dfd)
            removed.append(os.path.join(d, name))
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
        finally:
            os.close(dfd)
    return removed


def _user_has_other_job(procs: Dict[str, Any], env: JobEnv) -> bool:
    running = set(procs.get("running_jobs", []))
    return any(p.get("uid") == env.uid and p.get("job_id") in running and p.get("job_id") != env.job_id
               for p in procs.get("processes", []))


def epilog(cfg: Config, env: JobEnv) -> int:
    from ..sinks import state

    t0 = time.monotonic()
    base = state.load(cfg, env.job_id, "prolog") or {}
    base_snap = base.get("snapshot") or {}
    snap = take(cfg, meanwhile=preload_sinks if cfg.get("pushgateway", "url") else None)
    only_new_kernel_events(base_snap.get("kernel"), snap.get("kernel"))
    snap["baseline"] = {"rdma": base_snap.get("rdma"), "time": base_snap.get("time")}
    uuids = base.get("job_gpus") or job_gpu_uuids(snap, env)
    diff = gpu_diff(base_snap.get("gpu"), snap.get("gpu"), uuids)
    leftovers = job_leftovers(snap.get("procs"), env)
    findings = run_checks(snap, cfg)
    cleanup: Dict[str, Any] = {}
    if leftovers and cfg.get("hooks", "cleanup"):
        survivors = kill_leftovers(cfg, env, leftovers)
        cleanup["killed"] = [p["pid"] for p in leftovers if p not in survivors]
        for p in survivors:
            findings.append(Finding(
                id="leftover.unkillable", verdict=Verdict.FAIL, hardware=True, pid=p["pid"],
                summary=f"job {env.job_id} process {p['pid']} ({p.get('comm', '?')}) survived SIGKILL",
                evidence={"state": p.get("state"), "job_id": env.job_id},
                action="the process is stuck in the kernel (often a GPU driver wait): reboot the node"))
    procs = snap.get("procs") or {}
    if cfg.get("hooks", "cleanup") and env.uid not in (None, 0) and not _user_has_other_job(procs, env):
        started = base_snap.get("time") or 0
        mine = [f for f in procs.get("ipc_files", []) if f.get("uid") == env.uid and not f.get("symlink")
                and (f.get("mtime") or 0) >= started - 1]
        cleanup["removed"] = remove_ipc_files(mine, env.uid)
    verdict = worst(f.verdict for f in findings)
    record = {"job_id": env.job_id, "node": env.node, "triage": env.triage, "verdict": verdict.value,
              "gpu_diff": diff,
              "leftovers": [{k: p.get(k) for k in ("pid", "comm", "uid", "listen", "libs")} for p in leftovers],
              "cleanup": cleanup, "findings": [f.to_dict() for f in findings], "snapshot": snap,
              "baseline_verdict": base.get("verdict")}
    drained, seconds = publish(cfg, env, "epilog", record, snap, findings, t0,
                               lambda s: _push(cfg, env, snap, findings, record, s))
    summary = (f"job {env.job_id}: {verdict.value}, {len(leftovers)} leftover processes, "
               f"{len(cleanup.get('removed', []))} IPC files removed ({seconds:.2f} s)")
    return conclude(cfg, "epilog", summary, drained, verdict != Verdict.OK or bool(leftovers))


def _push(cfg: Config, env: JobEnv, snap: Dict[str, Any], findings: List[Finding],
          record: Dict[str, Any], seconds: float) -> None:
    from ..sinks.exposition import render
    from ..sinks.spool import stats

    extra = {"hook_duration_seconds": seconds, "internal_errors": internal_errors(cfg),
             "leftover_processes": len(record["leftovers"]), **stats(cfg)}
    # One "last_job" group per node, replaced by each Epilog: the Pushgateway stays bounded
    # (it never forgets on its own) while Prometheus keeps every job's summary by its label.
    key = {"job": "slurm_triage", "instance": env.node, "phase": "last_job"}
    deliver_logged(cfg, "epilog", env, key, render(snap, findings, extra, gpu_diff=record["gpu_diff"],
                                                   labels={"slurm_job_id": env.job_id}))
    for phase in LIVE_PHASES:
        deliver_logged(cfg, "epilog", env, grouping(env, phase), delete=True)


def main() -> int:
    return run_hook("epilog", "epilog_deadline_seconds", epilog)
