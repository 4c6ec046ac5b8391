"""What an NVIDIA Xid code means for a node: fail it, warn, or treat it as the job's own error.

Facts follow NVIDIA's public Xid catalog (docs.nvidia.com/deploy/xid-errors, the
"Resolution Bucket" columns: 13/31/43 are RESTART_APP, 45 is a preemptive cleanup after
earlier errors) and common fleet practice (NVIDIA k8s-device-plugin and Meta GCM skip
13/31/43/45/68/109 as application errors); the wording is ours. A code absent from the
table is judged WARN (never a drain) with a pointer to the catalog.

Consequences never drain on their own: Xid 45 always, and any line that names its cause
("caused by previous Xid N", recorded in tests/data/kernel/xid45_after_nvlink.journal.log).
They are attributed to that cause when it is in the log. Application Xids that only matter
when they recur carry a ``recur`` threshold (our policy, not NVIDIA's): that many on one GPU
within the window makes the finding say so, still without a drain.

The recovery action newer drivers report (NVML field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
nvmlDeviceGpuRecoveryAction_t; the value behind Xid 154) is in RECOVERY_ACTIONS; values from
NVIDIA's NVML headers and "GPU Memory Error Management: Error Recovery and Response Flags"
(docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt).
"""
from __future__ import annotations

import re
from typing import Dict, NamedTuple, Optional, Tuple

FAIL = "fail"
WARN = "warn"


class XidInfo(NamedTuple):
    code: int
    name: str
    """Short meaning, used in drain reasons and summaries."""
    severity: str
    """FAIL: the GPU is unsafe until reset/repair; WARN: worth a look, keeps the node."""
    action: str
    hardware: bool
    """True when the fault is the GPU/board/link, not the application."""
    noise_alone: bool = False
    """An application error or a consequence of another Xid: only WARN when seen on its own."""
    consequence: bool = False
    """Logged because of an earlier error (Xid 45): attributed to that error, never a cause."""
    recur: Optional[Tuple[int, float]] = None
    """(count, seconds): this many on one GPU within that window is worth saying (no drain)."""


_RESET = "drain the node, reset the GPU (or reboot) and run diagnostics; RMA if it recurs"
_APP = "look at the job's code/CUDA errors; the node stays in service"
_RECUR = (20, 3600.0)

_TABLE = (
    XidInfo(8, "GPU stopped processing (channel idle timeout)", WARN,
            "restart the application; report if it repeats on the same GPU", False, True),
    XidInfo(13, "graphics engine exception (illegal instruction/address in a kernel)", WARN, _APP, False, True,
            recur=_RECUR),
    XidInfo(31, "GPU memory page fault (MMU fault, usually a bad pointer)", WARN,
            _APP + "; repeated faults on one GPU across jobs point at hardware", False, True, recur=_RECUR),
    XidInfo(32, "invalid or corrupted push buffer stream", WARN, _APP, False, True),
    XidInfo(43, "GPU stopped processing (the channel was reset after an app fault)", WARN, _APP, False, True,
            recur=_RECUR),
    XidInfo(45, "preemptive cleanup after a previous error (consequence, not a cause)", WARN,
            "look for the Xid that came before it on this GPU", False, True, consequence=True),
    XidInfo(48, "double-bit ECC error (uncorrectable memory error)", FAIL, _RESET, True),
    XidInfo(61, "internal micro-controller breakpoint/warning", FAIL, _RESET, True),
    XidInfo(62, "internal micro-controller halt", FAIL, _RESET, True),
    XidInfo(63, "memory row remap/page retirement recorded (reset needed to apply it)", WARN,
            "reset the GPU when it is idle so the pending remap takes effect", True),
    XidInfo(64, "memory row remap/page retirement failed", FAIL,
            "drain the node; the GPU's memory self-repair is exhausted: RMA", True),
    XidInfo(68, "video decoder (NVDEC) exception", WARN, _APP, False, True),
    XidInfo(69, "graphics engine class error", WARN, _APP, False, True),
    XidInfo(74, "NVLink error", FAIL,
            "drain the node, reset the GPUs on the link, check NVLink/NVSwitch; RMA if it recurs", True),
    XidInfo(79, "GPU has fallen off the bus", FAIL,
            "drain the node and power-cycle it; reseat/check PCIe riser, power and the card; RMA if it recurs",
            True),
    XidInfo(92, "high single-bit ECC error rate", WARN,
            "watch the GPU's ECC counters; plan a reset/diagnostics at the next maintenance", True),
    XidInfo(94, "contained ECC error (the affected application was stopped)", FAIL,
            "drain the node and reset the GPU to remap the bad memory row", True),
    XidInfo(95, "uncontained ECC error (every application on the GPU is affected)", FAIL, _RESET, True),
    XidInfo(109, "context switch timeout", WARN, _APP, False, True),
    XidInfo(119, "GSP firmware RPC timeout", FAIL, _RESET, True),
    XidInfo(120, "GSP firmware error", FAIL, _RESET, True),
    XidInfo(121, "C2C (chip-to-chip) link error", FAIL, _RESET, True),
    XidInfo(140, "unrecovered ECC error", FAIL, _RESET, True),
    XidInfo(144, "NVLink SAW error", FAIL, _RESET, True),
    XidInfo(145, "NVLink RLW error", FAIL, _RESET, True),
    XidInfo(146, "NVLink TLW error", FAIL, _RESET, True),
    XidInfo(147, "NVLink TREX error", FAIL, _RESET, True),
    XidInfo(148, "NVLink NVLPW control error", FAIL, _RESET, True),
    XidInfo(149, "NVLink NETIR error", FAIL, _RESET, True),
    XidInfo(150, "NVLink MSE error", FAIL, _RESET, True),
    XidInfo(154, "GPU recovery action changed (the driver asks for a reset/reboot)", FAIL,
            "drain the node and do the recovery action named in the log line", True),
)

XIDS: Dict[int, XidInfo] = {x.code: x for x in _TABLE}

# NVLink Xids 144-150 carry their own fatality in the text: "... Nonfatal XC0 ..." vs "... Fatal ...".
NVLINK_CODES = range(144, 151)


CAUSED_BY = re.compile(r"caused by previous Xid (\d+)")
"""How newer drivers name the cause in a consequence's line (e.g. Xid 45)."""

RECOVERY_ACTIONS: Dict[int, Tuple[str, str]] = {
    0: ("none", ""),
    1: ("GPU reset", FAIL),
    2: ("node reboot", FAIL),
    3: ("drain peer-to-peer traffic", FAIL),
    4: ("drain peer-to-peer traffic and reset the GPU", FAIL),
    5: ("recover the IMEX domain", WARN),
    6: ("reset the GPU's PCIe bus", FAIL),
    7: ("reboot the system", FAIL),
}
"""nvmlDeviceGpuRecoveryAction_t value -> (what the driver asks for, verdict; "" = nothing)."""


def caused_by(text: str) -> Optional[int]:
    """The Xid a line says caused it, None when it names none."""
    m = CAUSED_BY.search(text or "")
    return int(m.group(1)) if m else None


def lookup(code: int) -> Optional[XidInfo]:
    """The table entry for ``code``, or None when we do not know it."""
    return XIDS.get(code)


def severity_for(code: int, text: str = "") -> str:
    """FAIL or WARN for one occurrence; NVLink codes marked "Nonfatal" in the line are WARN."""
    info = XIDS.get(code)
    if info is None:
        return WARN
    if code in NVLINK_CODES and " Nonfatal " in text:
        return WARN
    return info.severity
