"""The ``rocm-smi`` summary table (AMD GPUs), between its ``ROCm System Management Interface`` banner
and ``End of ROCm SMI Log``.

Its columns changed over releases: ``GPU  DID  Temp  AvgPwr  SCLK  MCLK  Fan  Perf  OverDrive  ECC``
(ROCm 1.x), ``GPU  Temp (DieEdge)  AvgPwr  SCLK  MCLK  Fan  Perf  PwrCap  VRAM%  GPU%`` (later), with
``Temp (Junction)`` on newer GPUs. Column names are separated by two or more spaces, cells by any;
a row whose cell count differs from the header's is skipped rather than guessed.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional

from ..model import LogEvent
from .base import Doc, number

_BANNER = "ROCm System Management Interface"
_END = "End of ROCm SMI Log"


def _temp_key(name: str) -> Optional[str]:
    low = name.lower()
    if not low.startswith("temp"):
        return None
    if "junction" in low or "hotspot" in low:
        return "junction_temp_c"
    if "mem" in low:
        return "mem_temp_c"
    return "temp_c"  # plain "Temp" is the edge sensor


def _fields(header: List[str], cells: List[str]) -> Dict[str, object]:
    out: Dict[str, object] = {}
    for name, cell in zip(header, cells):
        value = None if cell.upper() in ("N/A", "NA") else number(cell)
        low = name.lower()
        key = _temp_key(name) or {"avgpwr": "power_w", "power": "power_w", "pwrcap": "power_cap_w",
                                  "fan": "fan_pct", "gpu%": "util_pct"}.get(low)
        if key and value is not None and key not in out:
            out[key] = value
        elif low == "perf":
            out["perf"] = cell
    return out


def parse(doc: Doc) -> List[LogEvent]:
    """``rocm_row`` per GPU row (fields: index, temp_c, junction_temp_c, mem_temp_c, power_w, power_cap_w,
    fan_pct, util_pct, perf)."""
    if _BANNER not in doc.text:
        return []
    out: List[LogEvent] = []
    inside = False
    header: Optional[List[str]] = None
    for n, line in enumerate(doc.lines, 1):
        if _BANNER in line:
            inside, header = True, None
            continue
        if _END in line:
            inside, header = False, None
            continue
        if not inside or not line.strip() or set(line.strip()) <= set("=-"):
            continue
        names = re.split(r"\s{2,}", line.strip())
        if names and names[0] in ("GPU", "Device", "GPU[") and any(_temp_key(c) for c in names):
            header = names
            continue
        cells = line.split()
        if header is None or not cells or not cells[0].isdigit() or len(cells) != len(header):
            continue
        out.append(doc.event("rocm_row", n, gpu=cells[0], index=int(cells[0]), **_fields(header, cells)))
    return out
