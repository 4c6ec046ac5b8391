"""GPU failures seen in job logs: NVIDIA Xid lines (kernel log copies) and CUDA runtime errors."""
from __future__ import annotations

from typing import Dict, List, Tuple

from ...model import Verdict
from ...pci import normalize
from ..model import LogEvent, TriageFinding, from_events
from .common import group_by, of_kind, only

# Xid -> (meaning, fatal for the GPU, caused by the application rather than the hardware).
XIDS: Dict[int, Tuple[str, bool, bool]] = {
    13: ("graphics engine exception", False, True),
    31: ("GPU memory page fault (MMU)", False, True),
    43: ("GPU stopped processing (channel reset)", False, True),
    45: ("preemptive cleanup after an earlier error", False, True),
    48: ("double-bit ECC error", True, False),
    61: ("internal micro-controller breakpoint", True, False),
    62: ("internal micro-controller halt", True, False),
    63: ("ECC page retirement / row remap recorded", False, False),
    64: ("ECC page retirement / row remap failure", True, False),
    74: ("NVLink error", True, False),
    79: ("GPU has fallen off the bus", True, False),
    92: ("high single-bit ECC error rate", False, False),
    94: ("contained uncorrectable ECC error", True, False),
    95: ("uncontained uncorrectable ECC error", True, False),
    119: ("GSP RPC timeout", True, False),
    120: ("GSP error", True, False),
}


def _pci(raw: str) -> str:
    try:
        return normalize(raw)
    except ValueError:
        return raw


def xid_events(events: List[LogEvent]) -> List[TriageFinding]:
    """NVIDIA Xid lines per GPU and code; fatal codes are hardware roots, Xid 45 is a consequence."""
    groups = group_by(events, "xid", lambda e: (_pci(str(e.fields["pci"])), int(e.fields["xid"])))
    bus = of_kind(events, "fallen_off_bus")
    if bus and not any(x == 79 for _, x in groups):
        groups[("", 79)] = bus
    out: List[TriageFinding] = []
    for (pci, xid), evs in groups.items():
        meaning, fatal, app = XIDS.get(xid, ("see NVIDIA's Xid catalog", False, False))
        if fatal:
            verdict, conf = Verdict.FAIL, 0.9
            action = f"drain the node and reset/replace GPU {pci or '(see kernel log)'}; do not reschedule on it"
        elif app:
            verdict, conf = Verdict.WARN, 0.4
            action = "usually the application (bad kernel, out-of-bounds access): check the CUDA error of that rank"
        else:
            verdict, conf = Verdict.WARN, 0.6
            action = "watch this GPU's ECC/row-remap counters; drain if they keep rising"
        f = from_events(evs, id=f"log.xid.{xid}" + (f".{pci}" if pci else ""), category="gpu_hardware",
                        verdict=verdict, confidence=conf, node=only(e.node for e in evs), gpu=pci or None,
                        summary=f"Xid {xid} ({meaning}) on GPU {pci or '?'} ×{len(evs)}",
                        action=action, evidence={"xid": xid, "count": len(evs)},
                        consequence=xid == 45, tier=0 if fatal else 1)
        out.append(f)
    return out


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
