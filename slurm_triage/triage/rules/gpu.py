"""GPU failures seen in job logs: NVIDIA Xid lines (kernel log copies) and CUDA runtime errors."""
from __future__ import annotations

from typing import Dict, List, Tuple

from ...model import Verdict
from ...pci import normalize
from ...xid_codes import CAUSED_BY, FAIL, XIDS
from ..model import LogEvent, TriageFinding, from_events
from .common import group_by, of_kind, only

def _pci(raw: str) -> str:
    try:
        return normalize(raw)
    except ValueError:
        return raw


def xid_class(xid: int) -> Tuple[str, bool, bool, bool]:
    """(meaning, fatal for the GPU, application's own error, consequence of another error), from the
    project's one Xid catalog (slurm_triage.xid_codes, after NVIDIA's)."""
    info = XIDS.get(xid)
    if info is None:
        return "see NVIDIA's Xid catalog", False, False, False
    return info.name, info.severity == FAIL, info.noise_alone and not info.consequence, info.consequence


def _named_cause(evs: List[LogEvent]) -> List[int]:
    """Codes the lines themselves name as their cause ("caused by previous Xid N")."""
    found = {int(m.group(1)) for e in evs for m in [CAUSED_BY.search(str(e.fields.get("detail") or ""))] if m}
    return sorted(found)


def xid_events(events: List[LogEvent]) -> List[TriageFinding]:
    """NVIDIA Xid lines per GPU and code: fatal codes are hardware roots; Xid 45 and lines that name
    their cause ("caused by previous Xid N") are consequences, and a named cause missing from the log
    becomes the root itself."""
    groups = group_by(events, "xid", lambda e: (_pci(str(e.fields["pci"])), int(e.fields["xid"])))
    bus = of_kind(events, "fallen_off_bus")
    if bus and not any(x == 79 for _, x in groups):
        groups[("", 79)] = bus
    out: List[TriageFinding] = []
    for (pci, xid), evs in groups.items():
        meaning, fatal, app, consequence = xid_class(xid)
        causes = _named_cause(evs)
        if fatal:
            verdict, conf = Verdict.FAIL, 0.9
            action = f"drain the node and reset/replace GPU {pci or '(see kernel log)'}; do not reschedule on it"
        elif app or consequence or causes:
            verdict, conf = Verdict.WARN, 0.4
            action = ("a consequence: see the error it follows" if consequence or causes else
                      "usually the application (bad kernel, out-of-bounds access): check the CUDA error of that rank")
        else:
            verdict, conf = Verdict.WARN, 0.6
            action = "watch this GPU's ECC/row-remap counters; drain if they keep rising"
        evidence: Dict[str, object] = {"xid": xid, "count": len(evs)}
        if causes:
            evidence["caused_by_xid"] = causes
        out.append(from_events(
            evs, id=f"log.xid.{xid}" + (f".{pci}" if pci else ""), category="gpu_hardware",
            verdict=verdict, confidence=conf, node=only(e.node for e in evs), gpu=pci or None,
            summary=f"Xid {xid} ({meaning}) on GPU {pci or '?'} ×{len(evs)}"
                    + (f", caused by Xid {', '.join(map(str, causes))}" if causes else ""),
            action=action, evidence=evidence, consequence=consequence or bool(causes),
            tier=0 if fatal else 1))
        out += [_inferred(pci, code, evs) for code in causes if (pci, code) not in groups]
    return out


def _inferred(pci: str, code: int, evs: List[LogEvent]) -> TriageFinding:
    """The Xid that consequence lines name as their cause when its own line is not in the log."""
    meaning, fatal, _, _ = xid_class(code)
    naming = [e for e in evs if f"previous Xid {code}" in str(e.fields.get("detail") or "")]
    return from_events(
        naming, id=f"log.xid.{code}" + (f".{pci}" if pci else ""), category="gpu_hardware",
        verdict=Verdict.FAIL if fatal else Verdict.WARN, confidence=0.8 if fatal else 0.5,
        node=only(e.node for e in naming), gpu=pci or None,
        summary=f"Xid {code} ({meaning}) on GPU {pci or '?'}, named by {len(naming)} later Xid line(s) as their cause",
        action=(f"drain the node and reset/replace GPU {pci or '(see kernel log)'}; find the Xid {code} line in the "
                "full kernel log" if fatal else f"look up Xid {code} in NVIDIA's catalog; find its own line in the full kernel log"),
        evidence={"xid": code, "inferred_from": "caused by previous Xid", "count": len(naming)},
        tier=0 if fatal else 1)


_CUDA = {
    "uncorrectable ECC error": (0.9, "uncorrectable ECC error in GPU memory",
                                "drain the node; check the GPU's row-remap and retired-page counters"),
    "an illegal memory access": (0.4, "illegal memory access (application bug, or Xid 13/31 hardware fault)",
                                 "check the kernel log of that node for Xid 13/31/43/79; none: debug the "
                                 "application with CUDA_LAUNCH_BLOCKING=1"),
    "unspecified launch failure": (0.5, "unspecified launch failure (kernel crashed or GPU reset)",
                                   "check the kernel log of that node for Xid; rerun elsewhere to tell GPU from code"),
}


def cuda_errors(events: List[LogEvent]) -> List[TriageFinding]:
    """CUDA runtime errors per message: ECC is hardware; illegal address / launch failure may be."""
    groups = group_by(events, "cuda_error", lambda e: str(e.fields["msg"]))
    out: List[TriageFinding] = []
    for msg, evs in groups.items():
        conf, meaning, action = _CUDA.get(msg, (0.4, msg, "check the kernel log of that node for Xid"))
        ranks = sorted({e.rank for e in evs if e.rank is not None})
        out.append(from_events(
            evs, id="log.cuda_error." + msg.replace(" ", "_").replace("-", "_"), category="gpu_hardware",
            verdict=Verdict.FAIL, confidence=conf, node=only(e.node for e in evs),
            gpu=only(e.gpu for e in evs), rank=ranks[0] if ranks else None,
            summary=f"CUDA error: {meaning}" + (f" on rank {','.join(map(str, ranks))}" if ranks else ""),
            action=action, evidence={"count": len(evs), "ranks": ranks}))
    return out
