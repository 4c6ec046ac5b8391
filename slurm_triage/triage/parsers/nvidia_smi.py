"""The default ``nvidia-smi`` table, and the one-line errors nvidia-smi prints instead of it.

Each GPU takes two table rows (three since R525 with "MIG M."):
``|   0  NVIDIA A10     On  |   00000000:06:00.0 Off |    0 |`` then
``|  0%   32C    P8    21W /  150W |   1MiB /  23028MiB |   0%   Default |``; a cell that NVML could
not read shows ``ERR!``. When NVML cannot open a GPU at all nvidia-smi prints only
``Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error`` (or "GPU is lost").
"""
from __future__ import annotations

import re
from typing import List, Optional

from ..model import LogEvent
from .base import Doc, bus_id, number

_ROW1 = re.compile(r"^\|\s+(?P<index>\d+)\s+(?P<name>.+?)\s+(?P<persist>On|Off)\s*\|\s*"
                   r"(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s+(?P<disp>On|Off|N/A)\s*\|"
                   r"\s*(?P<ecc>[^|]*?)\s*\|")
_CELL = r"(?:ERR!|N/A|\[N/A\]|[\d.]+\s*[A-Za-z%]*)"
_ROW2 = re.compile(r"^\|\s*(?P<fan>" + _CELL + r")\s+(?P<temp>" + _CELL + r")\s+(?P<perf>P\d+|ERR!|N/A)\s+"
                   r"(?P<power>" + _CELL + r")\s*/\s*(?P<cap>" + _CELL + r")\s*\|\s*(?P<used>" + _CELL + r")\s*/\s*"
                   r"(?P<total>" + _CELL + r")\s*\|\s*(?P<util>" + _CELL + r")\s+(?P<mode>[^|]*?)\s*\|")
_HANDLE = re.compile(r"Unable to (?:determine|detect) the device handle for (?:GPU|gpu)\s*"
                     r"(?P<bus>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]):\s*(?P<error>[^\r\n]+?)\s*$")
_NO_DEVICES = re.compile(r"^\s*No devices were found\s*$")
_FAILED_NVML = re.compile(r"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver")


def _value(cell: str) -> Optional[float]:
    return None if "ERR!" in cell or "N/A" in cell else number(cell)


def parse(doc: Doc) -> List[LogEvent]:
    """``smi_row`` per table GPU; ``smi_handle_error``, ``smi_no_devices``, ``smi_no_driver`` lines."""
    out: List[LogEvent] = []
    pending = None
    for n, line in enumerate(doc.lines, 1):
        m = _HANDLE.search(line)
        if m:
            out.append(doc.event("smi_handle_error", n, gpu=bus_id(m["bus"]), bus_id=bus_id(m["bus"]),
                                 error=m["error"].rstrip(".")))
            continue
        if _NO_DEVICES.match(line):
            out.append(doc.event("smi_no_devices", n))
            continue
        if _FAILED_NVML.search(line):
            out.append(doc.event("smi_no_driver", n))
            continue
        if not line.startswith("|"):
            pending = None
            continue
        m = _ROW1.match(line)
        if m:
            pending = (n, m)
            continue
        m2 = _ROW2.match(line)
        if m2 and pending is not None:
            n1, m1 = pending
            pending = None
            cells = {"ecc": m1["ecc"], **{k: m2[k] for k in ("fan", "temp", "perf", "power", "cap", "used",
                                                              "total", "util")}}
            ecc = m1["ecc"].strip()
            bus = bus_id(m1["bus"])
            out.append(doc.event(
                "smi_row", n1, doc.lines[n1 - 1].strip() + " " + line.strip(), gpu=bus, index=int(m1["index"]),
                name=m1["name"].strip(), bus_id=bus, persistence=m1["persist"] == "On",
                ecc_uncorrectable=int(ecc) if ecc.isdigit() else None,
                temp_c=_value(m2["temp"]), perf=m2["perf"], power_w=_value(m2["power"]),
                power_cap_w=_value(m2["cap"]), mem_used_mib=_value(m2["used"]), mem_total_mib=_value(m2["total"]),
                util_pct=_value(m2["util"]),
                err_cells=sorted(k for k, v in cells.items() if "ERR!" in v) or None))
    return out
