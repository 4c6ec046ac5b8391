"""``dcgmi diag`` result tables and ``dcgmi health -c`` verdicts.

The diag table (DCGM 2.x/3.x) is two columns between ``+---+---+`` rules: a test name and its result
(``Pass``, ``Fail - All``, ``Fail - GPU: 0``, ``Pass - GPUs: 1, 2, 3``, ``Skip - All``), and
``Warning`` / ``Error`` / ``Info`` rows whose message DCGM cuts into fixed-width pieces over the
following rows with an empty first column (words are split mid-way, so pieces are joined as cut).
``dcgmi health -c`` says ``Overall Health: Healthy|Warning|Failure`` (``-j``: the same in JSON);
nv-hostengine logs each incident as ``Detected a WARNING in health system Thermal: '...'``.
``dcgmi dmon -e 230`` prints ``#Entity  XIDER`` then ``GPU 1  120`` rows: the last Xid per GPU (0: none),
read as one ``xid`` event per GPU, the kind the kernel log's Xid lines give (rules/gpu.py judges both).
"""
from __future__ import annotations

import re
from typing import List, Optional, Set

from ..model import LogEvent
from .base import Doc

_ROW = re.compile(r"^\|(?P<name>[^|]*)\|(?P<cell>[^|]*)\|?\s*$")  # a paste may cut the last "|"
_SECTION = re.compile(r"^[|+]-----\s+(?P<section>[A-Za-z][\w ]*?)\s+-+\+")
_RESULT = re.compile(r"^(?P<result>Pass|Fail|Skip|Warn)(?:\s*-\s*(?P<scope>All|GPUs?:\s*[\d,\s]+))?\s*$")
_GPU_IN_MSG = re.compile(r"^GPU (?P<gpu>\d+)\b")
_MESSAGE_ROWS = ("warning", "error", "info")
_OVERALL = re.compile(r"Overall Health\"?\s*:\s*(?:\{\s*\"value\"\s*:\s*\")?(?P<health>Healthy|Warning|Failure)")
# ``-j`` spreads it over lines: "Overall Health" : { "value" : "Healthy" }
_DMON_HEADER = re.compile(r"^#Entity\s+(?P<fields>[A-Z][\w ]*?)\s*$")
_DMON_ROW = re.compile(r"^(?P<entity>GPU|GPU-I|GPU-CI)\s+(?P<id>\d+)\s+(?P<values>\S.*?)\s*$")
_INCIDENT = re.compile(r"Detected an? (?P<level>WARNING|FAILURE|ERROR) in health system (?P<system>[\w ]+?): "
                       r"'(?P<message>[^']+)")


def _gpus(scope: Optional[str]) -> Optional[object]:
    if not scope or scope == "All":
        return "all" if scope else None
    return [int(x) for x in re.findall(r"\d+", scope)]


class _Message:
    def __init__(self, lineno: int, level: str, test: Optional[str], section: Optional[str], width: int):
        self.lineno, self.level, self.test, self.section, self.width = lineno, level, test, section, width
        self.pieces: List[str] = []

    def add(self, cell: str) -> None:
        # DCGM writes " " + piece padded to the column + " "; a piece is column width - 2 long.
        self.pieces.append(cell[1:1 + self.width])

    def text(self) -> str:
        return " ".join("".join(self.pieces).split())


def _diag(doc: Doc) -> List[LogEvent]:
    out: List[LogEvent] = []
    section: Optional[str] = None
    test: Optional[str] = None
    msg: Optional[_Message] = None

    def flush() -> None:
        if msg is not None:
            gm = _GPU_IN_MSG.match(msg.text())
            out.append(doc.event("dcgm_diag_message", msg.lineno, f"{msg.level}: {msg.text()}",
                                 level=msg.level, test=msg.test, section=msg.section, message=msg.text(),
                                 gpu_index=int(gm["gpu"]) if gm else None))

    for n, line in enumerate(doc.lines, 1):
        s = _SECTION.match(line)
        if s:
            flush()
            msg, section, test = None, s["section"].strip(), None
            continue
        m = _ROW.match(line.rstrip())
        if not m:
            flush()
            msg = None
            continue
        name, cell = m["name"].strip(), m["cell"]
        value = cell.strip()
        r = _RESULT.match(value)
        if name.lower() in _MESSAGE_ROWS:
            flush()
            msg = _Message(n, name.lower(), test, section, max(len(cell) - 3, 1))
            msg.add(cell)
        elif name and r is None:
            flush()
            msg, test = None, name  # metadata rows (DCGM Version ...) and the header
        elif r is not None:
            flush()
            msg = None
            test = name or test
            out.append(doc.event("dcgm_diag_result", n, f"{test}: {value}", test=test, section=section,
                                 result=r["result"].lower(), gpus=_gpus(r["scope"])))
        elif msg is not None and value:
            msg.add(cell)
    flush()
    return out


def _dmon_xids(doc: Doc) -> List[LogEvent]:
    """``xid`` per GPU whose dmon XIDER column reads a code (the first nonzero one of its samples)."""
    out: List[LogEvent] = []
    column: Optional[int] = None
    seen: Set[str] = set()
    for n, line in enumerate(doc.lines, 1):
        h = _DMON_HEADER.match(line.strip())
        if h:
            names = h["fields"].split()
            column = names.index("XIDER") if "XIDER" in names else None
            continue
        r = _DMON_ROW.match(line.strip()) if column is not None else None
        if r is None:
            continue
        values = r["values"].split()
        code = values[column] if column < len(values) else ""
        if code.isdigit() and int(code) > 0 and r["id"] not in seen:
            seen.add(r["id"])
            out.append(doc.event("xid", n, gpu=r["id"], pci=r["id"], xid=int(code), source="dcgmi dmon"))
    return out


def parse(doc: Doc) -> List[LogEvent]:
    """``dcgm_diag_result`` / ``dcgm_diag_message`` rows; ``dcgm_health`` and ``dcgm_health_incident``;
    ``xid`` from ``dcgmi dmon`` XIDER columns."""
    text = doc.text
    out: List[LogEvent] = []
    if "| Diagnostic" in text or "Fail - " in text or "Pass - " in text:
        out += _diag(doc)
    for m in _OVERALL.finditer(text):
        n = text.count("\n", 0, m.start()) + 1
        out.append(doc.event("dcgm_health", n, health=m["health"].lower()))
    if "#Entity" in text:
        out += _dmon_xids(doc)
    if "in health system" in text:
        for n, line in enumerate(doc.lines, 1):
            m2 = _INCIDENT.search(line)
            if m2:
                gm = re.search(r"\bGPU (\d+)", m2["message"])
                out.append(doc.event("dcgm_health_incident", n, level=m2["level"].lower(),
                                     system=m2["system"].strip(), message=m2["message"].strip(),
                                     gpu_index=int(gm.group(1)) if gm else None))
    return out

