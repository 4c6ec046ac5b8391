"""Host-side failures in job logs: out of memory (GPU, kernel, cgroup), /dev/shm, busy ports."""
from __future__ import annotations

from typing import List

from ...model import Verdict
from ..model import LogEvent, TriageFinding, from_events
from .common import of_kind, only


def out_of_memory(events: List[LogEvent]) -> List[TriageFinding]:
    """CUDA OOM (GPU memory) and host OOM: kernel OOM killer or the step's cgroup (slurmstepd)."""
    out: List[TriageFinding] = []
    cuda = of_kind(events, "cuda_oom")
    if cuda:
        ranks = sorted({e.rank for e in cuda if e.rank is not None})
        alloc = next((e.fields["alloc"] for e in cuda if "alloc" in e.fields), None)
        out.append(from_events(
            cuda, id="log.oom.cuda", category="memory", verdict=Verdict.FAIL, confidence=0.9,
            node=only(e.node for e in cuda), gpu=only(e.gpu for e in cuda), rank=ranks[0] if ranks else None,
            summary="CUDA out of memory" + (f" (tried to allocate {alloc})" if alloc else "")
                    + (f" on rank {','.join(map(str, ranks))}" if ranks else ""),
            action="reduce the per-GPU batch/sequence size or enable activation checkpointing/sharding; "
                   "check that no leftover process held GPU memory on that node",
            evidence={"count": len(cuda), "ranks": ranks, **({"tried_to_allocate": alloc} if alloc else {})}))
    host = of_kind(events, "host_oom", "cgroup_oom")
    if host:
        killed = sum(int(e.fields.get("count", 0)) for e in host)
        steps = sorted({str(e.fields["step"]) for e in host if "step" in e.fields})
        nodes = sorted({e.node for e in host if e.node})
        out.append(from_events(
            host, id="log.oom.host", category="memory", verdict=Verdict.FAIL, confidence=0.9,
            node=only(nodes),
            summary="host memory exhausted: processes OOM-killed"
                    + (f" in step {', '.join(steps)}" if steps else "") + (f" on {', '.join(nodes)}" if nodes else ""),
            action="request more memory (--mem / --mem-per-gpu) or reduce dataloader workers/prefetch; "
                   "check pinned-memory and shared-memory use per rank",
            evidence={"oom_kill_events": killed, "steps": steps, "nodes": nodes}))
    return out


def shm_exhausted(events: List[LogEvent]) -> List[TriageFinding]:
    """NCCL could not create its /dev/shm segments: the tmpfs is full (stale segments) or too small."""
    evs = of_kind(events, "shm_exhausted")
    if not evs:
        return []
    sizes = [int(e.fields.get("size") or e.fields.get("seg_size") or 0) for e in evs]
    return [from_events(
        evs, id="log.shm", category="host_resources", verdict=Verdict.FAIL, confidence=0.9,
        node=only(e.node for e in evs),
        summary="/dev/shm exhausted: NCCL could not allocate shared-memory segments",
        action="remove stale /dev/shm/nccl-* segments of earlier jobs and size /dev/shm for the job "
               "(containers: --shm-size); NCCL_SHM_DISABLE=1 only as a slow fallback",
        evidence={"count": len(evs), "segment_bytes": max(sizes) if any(sizes) else None,
                  "nodes": sorted({e.node for e in evs if e.node})})]


def address_in_use(events: List[LogEvent]) -> List[TriageFinding]:
    """The rendezvous/TCPStore port was already bound (EADDRINUSE): another job or a leftover holds it."""
    evs = of_kind(events, "addr_in_use")
    if not evs:
        return []
    binds = sorted({str(e.fields["bind"]) for e in evs if "bind" in e.fields})
    ports = sorted({b.rsplit(":", 1)[-1] for b in binds})
    return [from_events(
        evs, id="log.addr_in_use", category="config", verdict=Verdict.FAIL, confidence=0.85,
        node=only(e.node for e in evs),
        summary="rendezvous port already in use" + (f" ({', '.join(ports)})" if ports else ""),
        action="give each job its own MASTER_PORT (e.g. derived from SLURM_JOB_ID) and look for a leftover "
               "process of an earlier job still listening on it",
        evidence={"count": len(evs), "binds": binds, "ports": ports})]
