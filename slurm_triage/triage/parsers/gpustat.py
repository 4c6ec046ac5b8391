"""``gpustat`` rows (https://github.com/wookayin/gpustat), the one-line-per-GPU view people paste.

``[0] NVIDIA A100 80GB PCIe | 52'C, 100 % | 10151 / 81920 MB | root(10141M)``: index, name,
temperature, (fan,) utilisation, (power,) memory used / total, then the processes that hold the
GPU (``user(memM)``, ``user:cmd/pid(memM)``); gpustat prints ``(null)`` for a process whose owner
it cannot resolve (another PID namespace, an exited job's zombie) and nothing when it sees none.
"""
from __future__ import annotations

import re
from typing import List

from ..model import LogEvent
from .base import Doc

_ROW = re.compile(r"^\s*\[(?P<index>\d+)\]\s+(?P<name>[^|]+?)\s*\|\s*(?P<temp>\d+)\s*['°]C,\s*"
                  r"(?:(?P<fan>\d+)\s*%,\s*)?(?P<util>\d+)\s*%(?:,\s*(?P<power>\d+)\s*/\s*(?P<cap>\d+)\s*W)?\s*\|\s*"
                  r"(?P<used>\d+)\s*/\s*(?P<total>\d+)\s*MB\s*\|(?P<procs>.*)$")
_PROC = re.compile(r"\S+\(\d+M\)")


def parse(doc: Doc) -> List[LogEvent]:
    """``gpustat_row`` per GPU row: its figures and whether any process that holds it is named."""
    out: List[LogEvent] = []
    for n, line in enumerate(doc.lines, 1):
        m = _ROW.match(line)
        if not m:
            continue
        procs = m["procs"].strip()
        out.append(doc.event(
            "gpustat_row", n, gpu=m["index"], index=int(m["index"]), name=m["name"], temp_c=float(m["temp"]),
            util_pct=float(m["util"]), mem_used_mib=float(m["used"]), mem_total_mib=float(m["total"]),
            power_w=float(m["power"]) if m["power"] else None, procs=procs,
            owners=len(_PROC.findall(procs))))
    return out
