"""What finished jobs left behind: processes, IPC files, GPU compute processes.

A job is running when a slurmstepd names it (``procs.running_jobs``). Anything tagged
with another job id outlived its job: Slurm failed to kill it (escaped the cgroup,
unkillable D state) and the next job inherits its GPUs, ports and shared memory.
Leftovers are the job's fault, not the node's hardware, so ``hardware`` stays False.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Set

from ..config import Config
from ..model import Finding, Verdict
from . import Facts, check


def _this_node(p: Dict[str, Any], node: str) -> bool:
    """Where nodes share one PID namespace (the lab), SLURMD_NODENAME tells whose process it is."""
    return not (p.get("node") and node and p["node"] != node)


def _gpu_by_device(facts: Facts) -> Dict[str, str]:
    """/dev/nvidiaN -> GPU UUID, when GPU facts are at hand (N is the minor number)."""
    gpu = facts.get("gpu") or {}
    return {f"/dev/nvidia{g['minor']}": g["uuid"] for g in gpu.get("gpus", []) if g.get("minor") is not None}


@check("leftover.process", needs=("procs",))
def leftover_process(facts: Facts, cfg: Config) -> List[Finding]:
    """A process of a job that no longer runs here; FAIL when it still holds /dev/nvidia*."""
    procs = facts["procs"]
    node = facts.get("node", "")
    running = set(procs["running_jobs"])
    devices = _gpu_by_device(facts)
    out: List[Finding] = []
    for p in procs["processes"]:
        job = p.get("job_id")
        if not job or job in running or not _this_node(p, node):
            continue
        gpus = sorted({devices[d] for d in p["dev_nvidia"] if d in devices})
        held = []
        if p["dev_nvidia"]:
            held.append("GPU devices " + ",".join(p["dev_nvidia"]))
        if p["listen"]:
            held.append("ports " + ",".join(str(s["port"]) for s in p["listen"]))
        if p["libs"]:
            held.append("libs " + ",".join(p["libs"]))
        if p.get("shm"):
            held.append(f"{len(p['shm'])} IPC file(s)")
        fail = bool(p["dev_nvidia"])
        out.append(Finding(
            id="leftover.process", verdict=Verdict.FAIL if fail else Verdict.WARN, pid=p["pid"],
            gpu=gpus[0] if len(gpus) == 1 else None,
            summary=(f"pid {p['pid']} ({p['comm']}, uid {p['uid']}) "
                     + (f"of job {job} outlived its job" if p.get("job_source") != "environ"
                        else f"claims job {job} (SLURM_JOB_ID in its environment), which no longer runs")
                     + (f"; holds {'; '.join(held)}" if held else "")),
            evidence={"job_id": job, "job_source": p["job_source"], "uid": p["uid"], "comm": p["comm"],
                      "cmdline": p["cmdline"], "state": p["state"], "start_time": p["start_time"],
                      "dev_nvidia": p["dev_nvidia"], "gpu_uuids": gpus, "listen": p["listen"],
                      "libs": p["libs"], "shm": p.get("shm", []), "tcp_connections": p["tcp_connections"],
                      "running_jobs": sorted(running)},
            action=(f"kill -9 {p['pid']}" + ("; if it stays (state D), the node must be drained and rebooted"
                                              if fail else "") + "; find why Slurm did not reap it (cgroup escape?)")))
    return out


def _live_job_uids(procs: Dict[str, Any], running: Set[str]) -> Set[int]:
    return {p["uid"] for p in procs["processes"] if p.get("job_id") in running}


@check("leftover.ipc", needs=("procs",))
def leftover_ipc(facts: Facts, cfg: Config) -> List[Finding]:
    """NCCL/MPI/UCX/PSM2/torch files in /dev/shm or /tmp that no running job can own."""
    procs = facts["procs"]
    node = facts.get("node", "")
    running = set(procs["running_jobs"])
    live_uids = _live_job_uids(procs, running)
    holders: Dict[str, List[Dict[str, Any]]] = {}
    for p in procs["processes"]:
        for path in p.get("shm", []):
            holders.setdefault(path, []).append(p)
    out: List[Finding] = []
    for f in procs["ipc_files"]:
        held_by = holders.get(f["path"], [])
        why: Optional[str] = None
        if f["symlink"]:
            why = "is a symlink (suspicious in a shared directory; not followed)"
        elif held_by:
            if any(p.get("job_id") in running or not p.get("job_id") for p in held_by):
                continue  # in use by a running job, or by a process outside Slurm
            if not any(_this_node(p, node) for p in held_by):
                continue  # another node's leftover (nodes sharing /dev/shm): that node reports it
            why = "is held only by leftover process(es) " + ",".join(
                f"{p['pid']} (job {p['job_id']})" for p in held_by)
        elif f["uid"] not in live_uids:
            why = f"belongs to uid {f['uid']}, who has no running job here"
        if why is None:
            continue
        out.append(Finding(
            id="leftover.ipc", verdict=Verdict.WARN, pid=held_by[0]["pid"] if held_by else None,
            summary=f"{f['kind']} IPC file {f['path']} {why}",
            evidence={"path": f["path"], "kind": f["kind"], "uid": f["uid"], "size_bytes": f["size_bytes"],
                      "mtime": f["mtime"], "symlink": f["symlink"], "holders": [p["pid"] for p in held_by]},
            action=("remove the link itself (never its target)" if f["symlink"] else
                    "remove it after its holders are gone; the epilog cleans up files of the finished job")))
    omitted = procs.get("ipc_files_omitted") or {}
    if omitted.get("count") or omitted.get("unscanned_dirs"):
        where = ", ".join(f"{n} in {d}" for d, n in sorted(omitted.get("by_dir", {}).items()))
        unscanned = omitted.get("unscanned_dirs") or []
        out.insert(0, Finding(  # first: a cap on findings (checks.capped) keeps it
            id="leftover.ipc", verdict=Verdict.WARN,
            summary=(f"{omitted.get('count', 0)} more IPC files not examined ({where or 'none listed'})"
                     + (f"; {', '.join(unscanned)} hold(s) too many entries to scan" if unscanned else "")),
            evidence=dict(omitted),
            action="look at who fills the directory (ls -lU | head); clean it up by hand"))
    return out


@check("gpu.orphan_process", needs=("gpu", "procs"))
def gpu_orphan_process(facts: Facts, cfg: Config) -> List[Finding]:
    """A GPU compute process that belongs to no running job: it blocks that GPU for the next job."""
    procs = facts["procs"]
    running = set(procs["running_jobs"])
    by_pid = {p["pid"]: p for p in procs["processes"]}
    out: List[Finding] = []
    for g in facts["gpu"].get("gpus", []):
        for gp in g.get("processes") or []:
            p = by_pid.get(gp["pid"])
            # A pid NVML reports but /proc does not show lives in another PID namespace
            # (a container): nothing here can tell whose it is, so it is not judged.
            if p is None or p.get("job_id") in running:
                continue
            verdict = Verdict.FAIL
            what = (f"({p['comm']}, uid {p['uid']}) belongs to job {p['job_id']}, which no longer runs"
                    if p.get("job_id") else f"({p['comm']}, uid {p['uid']}) belongs to no Slurm job")
            out.append(Finding(
                id="gpu.orphan_process", verdict=verdict, gpu=g["uuid"], pid=gp["pid"],
                summary=f"GPU {g['index']} ({g['uuid']}): compute process {gp['pid']} {what}",
                evidence={"pci_bus_id": g.get("pci_bus_id"), "used_bytes": gp.get("used_bytes"),
                          "job_id": p.get("job_id") if p else None, "running_jobs": sorted(running)},
                action=f"kill -9 {gp['pid']}; if the GPU memory is not freed, drain the node"))
    return out
