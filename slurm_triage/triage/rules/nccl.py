"""Collective-communication failures that need reasoning across lines: PyTorch ProcessGroupNCCL
watchdog timeouts (SeqNum lag per rank), store barrier counts, NCCL InfiniBand completion status."""
from __future__ import annotations

from typing import Dict, List

from ...model import Verdict
from ..model import LogEvent, TriageFinding, from_events
from .common import group_by, of_kind, only, rank_nodes, ranks_text, world_size


def watchdog_timeouts(events: List[LogEvent]) -> List[TriageFinding]:
    """Watchdog collective timeouts per rank; the rank(s) with the lowest last SeqNum lag the others."""
    evs = of_kind(events, "watchdog_timeout")
    if not evs:
        return []
    last: Dict[int, int] = {}
    for e in evs:  # a pasted line may be cut inside WorkNCCL(...): then it has no SeqNum
        if e.rank is not None and "seq" in e.fields:
            last[e.rank] = max(last.get(e.rank, -1), int(e.fields["seq"]))
    nodes = rank_nodes(events)
    size = world_size(events)
    ops = sorted({str(e.fields["op"]) for e in evs if "op" in e.fields}) or ["?"]
    timeouts = [int(e.fields["timeout_ms"]) for e in evs if "timeout_ms" in e.fields]
    timeout_s = max(timeouts) / 1000.0 if timeouts else None
    after = f" after {timeout_s:.0f} s" if timeout_s is not None else ""
    evidence: Dict[str, object] = {"timeout_seconds": timeout_s, "ops": ops,
                                   "last_seq_by_rank": {str(r): s for r, s in sorted(last.items())}}
    lagging: List[int] = []
    if len(set(last.values())) > 1:
        low = min(last.values())
        lagging = sorted(r for r, s in last.items() if s == low)
        summary = (f"collective hang: rank {ranks_text(lagging)} fell behind (SeqNum {low} vs "
                   f"{max(last.values())} on the others); the other ranks timed out waiting{after}")
        conf = 0.75
        action = "inspect the lagging rank's node first (py-spy dump, GPU util vs power, kernel log, dataloader)"
    else:
        seq = next(iter(last.values()), None)
        missing = sorted(set(range(size)) - set(last)) if size else []
        summary = (f"collective hang: {len(last) or len(evs)} rank(s) timed out in {'/'.join(ops)}"
                   + (f" SeqNum {seq}" if seq is not None else "") + after)
        if missing:
            summary += f"; rank {ranks_text(missing)} never reported and is the likely laggard"
            lagging = missing
            evidence["silent_ranks"] = missing
        conf = 0.6
        action = ("find the rank that did not join this collective (crashed, stuck in data loading or a "
                  "host-side deadlock): py-spy dump all ranks; check the earliest error in every rank's log")
    lag_nodes = sorted({nodes[r] for r in lagging if r in nodes})
    if lag_nodes:
        summary += f" on {', '.join(lag_nodes)}"
    evidence["lagging_ranks"] = lagging
    return [from_events(evs, id="log.watchdog", category="collective_hang", verdict=Verdict.FAIL,
                        confidence=conf, summary=summary, action=action,
                        rank=lagging[0] if len(lagging) == 1 else None, node=only(lag_nodes),
                        evidence=evidence, consequence=True)]


def store_barrier_timeouts(events: List[LogEvent]) -> List[TriageFinding]:
    """Store-based barrier timeouts at init: fewer workers than world_size joined (or more: port clash);
    torch's periodic "Waiting in store based barrier" lines alone count too (weaker when short of world_size)."""
    evs = of_kind(events, "barrier_timeout")
    if not evs:
        return []
    e0 = max(evs, key=lambda e: abs(int(e.fields["world_size"]) - int(e.fields["worker_count"])))
    ws, wc = int(e0.fields["world_size"]), int(e0.fields["worker_count"])
    ranks = sorted({int(e.fields["barrier_rank"]) for e in evs})
    evidence = {"world_size": ws, "worker_count": wc, "timeout": e0.fields["timeout"], "ranks": ranks}
    if wc > ws:
        return [from_events(
            evs, id="log.store_barrier", category="config", verdict=Verdict.FAIL, confidence=0.7,
            summary=f"store barrier counted {wc} workers for world_size {ws}: more processes than expected "
                    "joined the same store (two runs sharing MASTER_ADDR:PORT, or a wrong world size)",
            action="give each job its own MASTER_PORT and check nnodes/nproc_per_node against the allocation",
            evidence=evidence)]
    # Only the periodic "Waiting in store based barrier" lines: init has not timed out (yet), a weaker sign.
    waiting = all(e.fields.get("waiting") for e in evs)
    return [from_events(
        evs, id="log.store_barrier", category="collective_hang", verdict=Verdict.FAIL,
        confidence=0.5 if waiting else 0.7,
        summary=(f"process group init is still waiting at the store barrier: {wc} of {ws} workers joined" if waiting
                 else f"process group init timed out: {ws - wc} of {ws} workers never reached the store barrier"),
        action="find the ranks that did not start (srun/torchrun errors, a node that failed, a slow import) "
               "and check that every node can reach MASTER_ADDR:MASTER_PORT",
        evidence={**evidence, "missing_workers": ws - wc})]


# ibv_wc_status values (libibverbs verbs.h) and what they mean for a training job.
IB_STATUS = {
    4: ("local protection error", "the NIC refused a local memory region: GPUDirect RDMA registration "
        "(nvidia-peermem / dmabuf), IOMMU/ACS settings"),
    5: ("work request flushed", "a consequence: the queue pair already failed on an earlier error"),
    8: ("local access error", "memory registration problem on this side"),
    10: ("remote access error", "the peer refused the access: its memory registration or the peer died"),
    12: ("transport retry counter exceeded", "the peer stopped answering: link down/flapping, peer process "
         "or node died, or heavy congestion"),
    13: ("RNR retry counter exceeded", "the receiver was not ready (peer stalled or died)"),
}


# Status 5 is a consequence; 12 (retry exceeded) is as often a RoCE/GID/MTU misconfiguration as a
# fabric fault, and 4 (local protection error: a memory registration the HCA refuses) as often a
# GPUDirect RDMA setup (peer memory module, IOMMU/ACS) as a fault, so both are named with less
# certainty than the unambiguous codes.
IB_CONFIDENCE = {4: 0.65, 5: 0.5, 12: 0.7}


def ib_completion_errors(events: List[LogEvent]) -> List[TriageFinding]:
    """NCCL NET/IB completion errors, with the ibv_wc_status decoded, per status."""
    groups = group_by(events, "ib_completion", lambda e: int(e.fields["status"]))
    out: List[TriageFinding] = []
    for status, evs in groups.items():
        name, meaning = IB_STATUS.get(status, (f"status {status}", "see ibv_wc_status in verbs.h"))
        nodes = sorted({e.node for e in evs if e.node})
        peers = sorted({str(e.fields["peer"]) for e in evs if "peer" in e.fields})
        vendor = sorted({int(e.fields["vendor_err"]) for e in evs})
        out.append(from_events(
            evs, id=f"log.ib_completion.{status}", category="network", verdict=Verdict.FAIL,
            confidence=IB_CONFIDENCE.get(status, 0.8), node=only(nodes), gpu=only(e.gpu for e in evs),
            summary=f"InfiniBand completion error {status} ({name})" + (f" on {', '.join(nodes)}" if nodes else "")
                    + (f" talking to {', '.join(peers[:4])}" + ("…" if len(peers) > 4 else "") if peers else ""),
            action=f"{meaning}; check port counters (symbol/link-downed, port_rcv_errors) on both ends "
                   "and ibstat/link flaps in the kernel log",
            evidence={"status": status, "status_name": name, "vendor_err": vendor, "nodes": nodes,
                      "peers": peers, "count": len(evs)},
            consequence=status == 5))
    return out
