"""What our own Prolog/Epilog found on the job's nodes: leftovers, public dashboards, hardware.

The node checks already judged these (``slurm_triage.checks``); triage lifts their non-OK
findings to the job: a leftover of an earlier job found by the Prolog is a cause (it held GPU
memory, ports, /dev/shm), one left by this job at the Epilog is a symptom of how it ended.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple

from ...model import Verdict
from ..model import JobEvidence, TriageFinding

# Longest prefix first: heat and throttling are thermal_power, other GPU checks hardware.
_HARDWARE_PREFIX = {"gpu.temperature": "thermal_power", "gpu.throttle": "thermal_power", "gpu.": "gpu_hardware",
                    "kernel.": "gpu_hardware", "rdma.": "network"}


_PHASES = {"prolog": 0, "watch": 1, "epilog": 2, "last_job": 3}


def _each(ev: JobEvidence) -> Iterator[Tuple[str, Dict[str, Any]]]:
    """Each node check finding once: the same check/GPU/process seen at several phases (Prolog,
    Epilog, the pushed summary) is one finding, from its earliest phase, listing them all."""
    for node, facts in sorted(ev.nodes.items()):
        seen: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
        for f in sorted(facts.get("findings") or [], key=lambda f: _PHASES.get(f["phase"], 9)):
            key = (f["id"], f.get("gpu"), f.get("pid"))
            if key in seen:
                seen[key]["phases"].append(f["phase"])
            else:
                seen[key] = {**f, "phases": [f["phase"]]}
        yield from ((node, f) for f in seen.values())


def _make(node: str, f: Dict[str, Any], category: str, summary: str, action: str, conf: float,
          consequence: bool = False, tier: int = 1) -> TriageFinding:
    t: Optional[float] = f.get("time") if isinstance(f.get("time"), (int, float)) else None
    out = TriageFinding(
        id=f"node.{f['phase']}.{f['id']}.{node}" + (f".{f['gpu']}" if f.get("gpu") else "")
           + (f".{f['pid']}" if f.get("pid") else ""),
        category=category, verdict=Verdict(f["verdict"]) if f["verdict"] in Verdict.__members__ else Verdict.WARN,
        confidence=conf, node=node, gpu=f.get("gpu"), summary=summary, action=action,
        evidence={"check": f["id"], "phases": f.get("phases", [f["phase"]]), "node_verdict": f["verdict"],
                  **({"pid": f["pid"]} if f.get("pid") else {}), **(f.get("evidence") or {})},
        consequence=consequence, tier=tier)
    out.first_time = t
    return out


def leftovers(ev: JobEvidence) -> List[TriageFinding]:
    """Leftover processes/IPC files: an earlier job's (Prolog) is a cause, this job's own (Epilog) a symptom."""
    out: List[TriageFinding] = []
    for node, f in _each(ev):
        if not str(f["id"]).startswith("leftover."):
            continue
        at_start = f["phase"] == "prolog"
        what = f.get("summary") or f"{f['id']} on {node}"
        out.append(_make(
            node, f, "host_resources",
            ("before the job started: " if at_start else "after the job ended: ") + what,
            "kill the leftover (it holds GPU memory, ports or /dev/shm the next job needs) and find the job "
            "that left it" if at_start else "the job left processes/IPC behind: check how it was stopped "
            "(srun --kill-on-bad-exit, signal handling); enable hooks.cleanup",
            0.75 if at_start else 0.5, consequence=not at_start))
    n_left = {n: f.get("leftover_processes") for n, f in ev.nodes.items() if f.get("leftover_processes")}
    if n_left and not out:
        for node, count in sorted(n_left.items()):
            out.append(_make(node, {"id": "leftover.process", "phase": "last_job", "verdict": "WARN"},
                             "host_resources", f"{count:.0f} process(es) of the job still alive at its Epilog on {node}",
                             "check how the job was stopped; enable hooks.cleanup", 0.5, consequence=True))
    return out


def public_dashboards(ev: JobEvidence) -> List[TriageFinding]:
    """Dashboards (Ray, TensorBoard, Jupyter ...) the job bound on 0.0.0.0/:: — open to the whole network."""
    return [_make(node, f, "security", f.get("summary") or f"public listener on {node}",
                  "bind the dashboard to 127.0.0.1 and reach it through an SSH tunnel", 0.9)
            for node, f in _each(ev) if f["id"] == "listener.public"]


def node_hardware(ev: JobEvidence) -> List[TriageFinding]:
    """Hardware findings of the node checks (Xid, ECC, lost GPU, IB port) at the job's start or end."""
    out: List[TriageFinding] = []
    for node, f in _each(ev):
        cat = next((c for p, c in _HARDWARE_PREFIX.items() if str(f["id"]).startswith(p)), None)
        if cat is None or not (f.get("hardware") or f["verdict"] == "FAIL"):
            continue
        out.append(_make(node, f, cat, f.get("summary") or f"{f['id']} {f['verdict']} on {node} ({f['phase']})",
                         "drain the node (the Prolog/Epilog may have done so: scontrol show node) and "
                         "reset/replace the part", 0.85 if f.get("hardware") else 0.6,
                         tier=0 if f.get("hardware") else 1))
    return out


def rdma_rises(ev: JobEvidence) -> List[TriageFinding]:
    """RDMA error counters that rose on a node's port during the job (Epilog vs Prolog), with their rate."""
    job = ev.job or {}
    start, end = job.get("start"), job.get("end")
    seconds = end - start if isinstance(start, (int, float)) and isinstance(end, (int, float)) and end > start else None
    steps = (ev.metrics or {}).get("step_time") or {}
    out: List[TriageFinding] = []
    for node, f in _each(ev):
        rises = (f.get("evidence") or {}).get("rises")
        if f["id"] != "rdma.errors" or f["phase"] != "epilog" or not isinstance(rises, dict) or not rises:
            continue
        port = f"{(f.get('evidence') or {}).get('device')} port {(f.get('evidence') or {}).get('port')}"
        rates = {c: round(d / seconds, 3) for c, d in rises.items()} if seconds else {}
        what = ", ".join(f"{c} +{d}" + (f" ({rates[c]:g}/s)" if c in rates else "") for c, d in rises.items())
        t = _make(node, f, "network", f"{node} {port}: {what} during the job",
                  "check the link of this port (cable, transceiver, switch port: ibstat, perfquery) and "
                  "exclude the node (sbatch --exclude) until it is clean; retransmits slow every collective", 0.7)
        t.evidence.update({"port": port, "rate_per_second": rates, "job_seconds": seconds})
        if node in steps:
            t.evidence["step_time_seconds"] = steps[node]
        out.append(t)
    return out
