"""Kernel-log checks: Xid codes, GPUs fallen off the bus, PCIe AER errors on GPUs.

Each GPU is named by UUID when the ``gpu`` facts (or the kernel's own ``GPU at PCI:``
line) know its bus id, so a drain reason points at the board to pull. Application Xids
(13, 31, 43, ...) only WARN, and they are folded into the fatal finding when a fatal Xid hit
the same GPU, because there they are consequences, not causes. Consequences (Xid 45, or any
line "caused by previous Xid N") never drain on their own: they are attributed to the named
cause (on any GPU of the node) when it is logged, else they WARN and say what caused them.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

from .. import xid_codes
from ..config import Config
from ..model import Finding, Verdict
from . import Facts, check

AER_CORRECTED_WARN_COUNT = 10
"""Corrected AER errors on one GPU in one window before we WARN (a few are normal)."""
MAX_TEXTS = 3


def _gpu_map(facts: Facts) -> Dict[str, Dict[str, Any]]:
    gpu = facts.get("gpu") or {}
    return {g["pci_bus_id"]: g for g in gpu.get("gpus", []) if g.get("pci_bus_id")}


def _who(bus: str, uuid: Optional[str], gpus: Dict[str, Dict[str, Any]]) -> Tuple[Optional[str], str]:
    """(UUID or None, human name) for a bus id: "GPU 3 (GPU-…, 0000:18:00.0)"."""
    g = gpus.get(bus)
    uuid = (g or {}).get("uuid") or uuid
    index = (g or {}).get("index")
    label = f"GPU {index}" if index is not None else "GPU"
    return uuid, f"{label} ({uuid + ', ' if uuid else ''}{bus})"


def _events(facts: Facts, kind: str) -> List[Dict[str, Any]]:
    return [e for e in facts["kernel"].get("events", []) if e.get("kind") == kind]


def _window(evs: List[Dict[str, Any]]) -> Dict[str, Any]:
    seqs = [e["seq"] for e in evs if e.get("seq") is not None]
    times = [e["time"] for e in evs if e.get("time") is not None]
    out: Dict[str, Any] = {"count": len(evs), "first_seq": min(seqs) if seqs else None,
                           "last_seq": max(seqs) if seqs else None,
                           "lines": [e["text"] for e in evs[:MAX_TEXTS]]}
    if times:
        out["first_seen_uptime_seconds"] = min(times)
        out["last_seen_uptime_seconds"] = max(times)
    return out


def _most_within(evs: List[Dict[str, Any]], seconds: float) -> int:
    """Most events inside any window of ``seconds`` (all of them when times are unknown)."""
    times = sorted(e["time"] for e in evs if e.get("time") is not None)
    if len(times) < len(evs):
        return len(evs)
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] > seconds:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def _cause_of(bus: str, code: int, evs: List[Dict[str, Any]], fatal: List[Tuple[str, int]]) -> Optional[Tuple[str, int]]:
    """The fatal (bus, Xid) group a consequence or application Xid belongs to, if logged here.

    A named cause ("caused by previous Xid N") is looked for on this GPU first, then on any
    GPU of the node (one GPU's fault makes its peers clean up too); an unnamed one can only
    be the fatal Xid of the same GPU.
    """
    named = sorted({c for c in (xid_codes.caused_by(e.get("text", "")) for e in evs) if c is not None})
    for c in named:
        for key in sorted(fatal, key=lambda k: k[0] != bus):
            if key[1] == c:
                return key
    if named:
        return None
    info = xid_codes.lookup(code)
    if info is not None and info.noise_alone:
        return next((k for k in fatal if k[0] == bus), None)
    return None


@check("kernel.xid", needs=("kernel",))
def xid(facts: Facts, cfg: Config) -> List[Finding]:
    """NVIDIA Xid errors: FAIL on hardware Xids (48, 79, 94, 95, ...), WARN on application Xids;
    consequences (45, "caused by previous Xid N") are attributed to their cause, never drain."""
    gpus = _gpu_map(facts)
    groups: "OrderedDict[Tuple[str, int], List[Dict[str, Any]]]" = OrderedDict()
    for e in _events(facts, "xid"):
        groups.setdefault((e["pci_bus_id"], e["xid"]), []).append(e)
    fatal: List[Tuple[str, int]] = []
    for key, evs in groups.items():
        named_cause = any(xid_codes.caused_by(e.get("text", "")) is not None for e in evs)
        if not named_cause and any(xid_codes.severity_for(key[1], e.get("text", "")) == xid_codes.FAIL for e in evs):
            fatal.append(key)
    attached: Dict[Tuple[str, int], List[Dict[str, Any]]] = {}
    standalone: Dict[Tuple[str, int], Optional[int]] = {}
    for key, evs in groups.items():
        if key in fatal:
            continue
        cause = _cause_of(key[0], key[1], evs, fatal)
        if cause is not None:
            attached.setdefault(cause, []).append({"xid": key[1], "pci_bus_id": key[0], "count": len(evs)})
        else:
            standalone[key] = next((c for c in (xid_codes.caused_by(e.get("text", "")) for e in evs)
                                    if c is not None), None)
    findings: List[Finding] = []
    for (bus, code), evs in groups.items():
        if (bus, code) not in fatal and (bus, code) not in standalone:
            continue  # folded into its cause's finding
        info = xid_codes.lookup(code)
        uuid, name = _who(bus, next((e.get("uuid") for e in evs if e.get("uuid")), None), gpus)
        meaning = info.name if info else "not in slurm-triage's Xid table (see NVIDIA's Xid catalog)"
        fail = (bus, code) in fatal
        evidence = {"xid": code, "pci_bus_id": bus, **_window(evs)}
        summary = f"Xid {code} on {name}: {meaning}" + (f" (x{len(evs)})" if len(evs) > 1 else "")
        if fail:
            evidence["accompanying_xids"] = sorted({c for (b, c) in groups if b == bus and c != code})
            evidence["consequences"] = attached.get((bus, code), [])
            others = [c for c in evidence["consequences"] if c["pci_bus_id"] != bus]
            if others:
                summary += f"; caused {sum(c['count'] for c in others)} Xid(s) on {len({c['pci_bus_id'] for c in others})} other GPU(s)"
        else:
            cause = standalone[(bus, code)]
            if cause is not None:
                evidence["caused_by_xid"] = cause
                summary += f"; caused by Xid {cause}, which is not in this log window"
            if info is not None and info.recur is not None:
                n = _most_within(evs, info.recur[1])
                if n >= info.recur[0]:
                    evidence["recurring"] = {"count": n, "window_seconds": info.recur[1]}
                    summary += f"; recurring: {n} within {info.recur[1]:g} s on this GPU"
        findings.append(Finding(
            id="kernel.xid", verdict=Verdict.FAIL if fail else Verdict.WARN, gpu=uuid,
            summary=summary, evidence=evidence,
            action=info.action if info else "look the code up in NVIDIA's Xid catalog; report if it repeats",
            hardware=fail and (info.hardware if info else False)))
    return findings


@check("kernel.fallen_off_bus", needs=("kernel",))
def fallen_off_bus(facts: Facts, cfg: Config) -> List[Finding]:
    """A GPU "fallen off the bus" message without an Xid 79 for it (probe-time form): FAIL."""
    gpus = _gpu_map(facts)
    xid79 = {e["pci_bus_id"] for e in _events(facts, "xid") if e.get("xid") == 79}
    groups: "OrderedDict[str, List[Dict[str, Any]]]" = OrderedDict()
    for e in _events(facts, "fallen_off_bus"):
        if e["pci_bus_id"] not in xid79:  # already a kernel.xid FAIL
            groups.setdefault(e["pci_bus_id"], []).append(e)
    findings = []
    for bus, evs in groups.items():
        uuid, name = _who(bus, next((e.get("uuid") for e in evs if e.get("uuid")), None), gpus)
        findings.append(Finding(
            id="kernel.fallen_off_bus", verdict=Verdict.FAIL, gpu=uuid, hardware=True,
            summary=f"{name} has fallen off the bus (no Xid logged)",
            evidence={"pci_bus_id": bus, **_window(evs)},
            action=xid_codes.XIDS[79].action))
    return findings


@check("kernel.aer", needs=("kernel",))
def aer(facts: Facts, cfg: Config) -> List[Finding]:
    """PCIe AER errors on a GPU: uncorrectable -> FAIL, many corrected -> WARN."""
    gpus = _gpu_map(facts)
    # GPU bus ids: NVML's list, every bus the NVIDIA driver logged about, and devices bound to "nvidia".
    gpu_buses = set(gpus) | {e["pci_bus_id"] for e in facts["kernel"].get("events", [])
                             if e.get("kind") in ("xid", "fallen_off_bus")}
    groups: "OrderedDict[Tuple[str, str], List[Dict[str, Any]]]" = OrderedDict()
    for e in _events(facts, "aer"):
        if e["pci_bus_id"] in gpu_buses or e.get("driver") == "nvidia":
            groups.setdefault((e["pci_bus_id"], e.get("severity") or "fatal"), []).append(e)
    findings = []
    for (bus, sev), evs in groups.items():
        uuid, name = _who(bus, None, gpus)
        evidence = {"pci_bus_id": bus, "severity": sev, **_window(evs)}
        if sev == "corrected":
            if len(evs) < AER_CORRECTED_WARN_COUNT:
                continue
            findings.append(Finding(
                id="kernel.aer", verdict=Verdict.WARN, gpu=uuid, evidence=evidence,
                summary=f"{len(evs)} corrected PCIe errors on {name}",
                action="check the PCIe link (riser, slot, cable); watch for link degradation or Xid 79"))
        else:
            findings.append(Finding(
                id="kernel.aer", verdict=Verdict.FAIL, gpu=uuid, hardware=True, evidence=evidence,
                summary=f"uncorrectable ({sev}) PCIe error on {name}" + (f" (x{len(evs)})" if len(evs) > 1 else ""),
                action="drain the node; reseat/check the GPU, riser and slot, then power-cycle"))
    return findings
