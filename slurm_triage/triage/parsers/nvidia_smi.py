"""The default ``nvidia-smi`` table, and the one-line errors nvidia-smi prints instead of it.

Each GPU takes two table rows (three since R525 with "MIG M."):
``|   0  NVIDIA A10     On  |   00000000:06:00.0 Off |    0 |`` then
``|  0%   32C    P8    21W /  150W |   1MiB /  23028MiB |   0%   Default |``; a cell that NVML could
not read shows ``ERR!``. When NVML cannot open a GPU at all nvidia-smi prints only
``Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error`` (or "GPU is lost").

``nvidia-smi --query-gpu=... --format=csv`` prints a header of the queried names (units in brackets:
``index, temperature.gpu, power.draw [W], clocks_throttle_reasons.hw_slowdown``) and one row per GPU
per sample (``-l``/``-lms`` repeat it). Rows without that header (``noheader``) name nothing and are
left alone. A csv cell reads ``[Unknown Error]``/``[GPU is lost]`` where the table shows ``ERR!``; such cells,
and a GPU temperature of 0 °C, become the row's ``err_cells``. Each GPU's samples become one ``smi_row``
(its hottest sample, so the table rules judge it like a table row) and, when clock-event reasons were queried, one ``smi_q_gpu`` with the reasons
active in at least REASON_SHARE of its samples (NVML: HW Slowdown "may be also reported during PState
or clock change", a single sample is not a slowdown).
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from ...collect.gpu import CLOCK_EVENT_REASONS
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
_PROCESSES = re.compile(r"^\|\s*Processes:")
_PROCESS_ROW = re.compile(r"^\|\s+\d+\s.*\s(?:C|G|C\+G|M|M\+C)\s+\S.*\|\s*$")
_TABLE_END = re.compile(r"^\+-{20,}\+\s*$")
"""The table's ``Processes:`` section: one row per process (``|  0   12345   C   python   1234MiB |``), or
``No running processes found``, closed by a ``+----+`` rule."""


def _value(cell: str) -> Optional[float]:
    return None if "ERR!" in cell or "N/A" in cell else number(cell)


_UNREADABLE = ("ERR!", "Unknown Error", "GPU is lost")


def _unreadable(cell: str, key: Optional[str]) -> bool:
    """A cell NVML could not fill: ERR!/[Unknown Error]/[GPU is lost], or a GPU temperature of 0 °C,
    which no powered GPU reads (NVML answers 0 for a GPU in a broken state)."""
    return any(u in cell for u in _UNREADABLE) or (key == "temp_c" and _value(cell) == 0)


# --query-gpu names (and their aliases) -> smi_row / smi_q_gpu fields (nvidia-smi --help-query-gpu)
_CSV_FIELDS = {"index": "index", "pci.bus_id": "bus_id", "gpu_bus_id": "bus_id", "name": "name", "gpu_name": "name",
               "temperature.gpu": "temp_c", "temperature.memory": "mem_temp_c", "power.draw": "power_w",
               "power.draw.instant": "power_w", "power.draw.average": "power_w", "power.limit": "power_cap_w",
               "enforced.power.limit": "power_cap_w", "utilization.gpu": "util_pct", "memory.used": "mem_used_mib",
               "memory.total": "mem_total_mib", "pstate": "perf", "clocks.sm": "sm_mhz", "clocks.current.sm": "sm_mhz",
               "clocks.max.sm": "sm_max_mhz"}
_CSV_MEASURES = ("temp_c", "mem_temp_c", "power_w", "power_cap_w", "util_pct", "sm_mhz", "sm_max_mhz")
_CSV_MARKERS = ("temperature.", "power.draw", "power.limit", "utilization.gpu", "clocks.", "_reasons.")
_CSV_NAME = re.compile(r"^(?P<name>[a-z_][a-z0-9_.]*)(?: \[[^\]]*\])?$")
_CSV_REASON = re.compile(r"^clocks_(?:throttle|event)_reasons\.(?P<reason>\w+)$")
# NVML's nvmlClocksEventReasons bits (the collector's table), named as nvidia-smi -q names them
# (parsers/nvidia_smi_q.py: "Idle", not NVML's GpuIdle)
_REASON_BITS = tuple((bit, "idle" if name == "gpu_idle" else name) for bit, name in CLOCK_EVENT_REASONS)
REASON_SHARE = 0.1


def _csv_header(line: str) -> Optional[List[str]]:
    """The query names of a ``--format=csv`` header line, or None when the line is not one."""
    cells = [c.strip() for c in line.split(",")]
    names = [m["name"] for m in (_CSV_NAME.match(c) for c in cells) if m]
    if len(cells) < 2 or len(names) != len(cells):
        return None
    measured = [n for n in names if _CSV_FIELDS.get(n) in _CSV_MEASURES or _CSV_REASON.match(n)]
    return names if measured else None


def _reasons(name: str, cell: str) -> Optional[List[str]]:
    """Active reasons one cell names: ``Active``/``Not Active`` per reason, a hex bitmask for ``.active``."""
    m = _CSV_REASON.match(name)
    if not m or m["reason"] == "supported":
        return None
    if m["reason"] == "active":
        try:
            mask = int(cell, 16)
        except ValueError:
            return None
        return [r for bit, r in _REASON_BITS if mask & bit]
    if cell not in ("Active", "Not Active"):
        return None
    return ["idle" if m["reason"] == "gpu_idle" else m["reason"]] if cell == "Active" else []


def _csv_rows(doc: Doc) -> List[Tuple[int, Dict[str, object], Optional[List[str]]]]:
    """(line, fields, active reasons or None when none were queried) per data row under a csv header."""
    rows: List[Tuple[int, Dict[str, object], Optional[List[str]]]] = []
    header: Optional[List[str]] = None
    for n, line in enumerate(doc.lines, 1):
        named = _csv_header(line)
        if named:
            header = named
            continue
        cells = [c.strip() for c in line.split(",")]
        if header is None or len(cells) != len(header):
            header = None if line.strip() else header
            continue
        fields: Dict[str, object] = {}
        reasons: Optional[List[str]] = None
        unreadable = [name for name, cell in zip(header, cells) if _unreadable(cell, _CSV_FIELDS.get(name))]
        if unreadable:
            fields["err_cells"] = unreadable
        for name, cell in zip(header, cells):
            active = _reasons(name, cell)
            if active is not None:
                reasons = (reasons or []) + active
            key = _CSV_FIELDS.get(name)
            if key in ("name", "perf"):
                fields[key] = cell
            elif key == "bus_id":
                fields[key] = bus_id(cell)
            elif key:
                fields[key] = _value(cell) if key != "index" or cell.isdigit() else None
        rows.append((n, fields, reasons))
    return rows


def _query_csv(doc: Doc) -> List[LogEvent]:
    """One ``smi_row`` (hottest sample) and, with reasons queried, one ``smi_q_gpu`` per GPU of csv rows."""
    per_gpu: Dict[str, List[Tuple[int, Dict[str, object], Optional[List[str]]]]] = {}
    for row in _csv_rows(doc):
        key = str(row[1].get("bus_id") or row[1].get("index") or "?")
        per_gpu.setdefault(key, []).append(row)
    out: List[LogEvent] = []
    for samples in per_gpu.values():
        n, fields, _ = max(samples, key=lambda r: float(r[1].get("temp_c") or 0.0))  # type: ignore[arg-type]
        bus = fields.get("bus_id")
        index = fields.get("index")
        row = {k: v for k, v in fields.items() if k not in ("sm_mhz", "sm_max_mhz", "err_cells")}
        unreadable = sorted({c for _, f, _ in samples for c in f.get("err_cells") or []})  # type: ignore[attr-defined]
        row["err_cells"] = unreadable or None
        row["index"] = int(index) if isinstance(index, float) else index
        out.append(doc.event("smi_row", n, gpu=bus, samples=len(samples), **row))  # type: ignore[arg-type]
        queried = [r for r in samples if r[2] is not None]
        if not queried:
            continue
        counts: Dict[str, int] = {}
        for _, _, active in queried:
            for r in set(active or []):
                counts[r] = counts.get(r, 0) + 1
        held = sorted(r for r, c in counts.items() if c >= max(1.0, REASON_SHARE * len(queried)))
        first = {r: next(ln for ln, _, a in queried if r in (a or [])) for r in held}
        cite = {"reason." + r: [ln, doc.lines[ln - 1].strip()] for r, ln in first.items()}
        if "temp_c" in fields:
            cite["temp_c"] = [n, doc.lines[n - 1].strip()]
        q = {k: v for k, v in fields.items() if k in ("temp_c", "mem_temp_c", "power_w", "sm_mhz", "sm_max_mhz")}
        if "power_cap_w" in fields:
            q["power_limit_w"] = fields["power_cap_w"]
        out.append(doc.event("smi_q_gpu", queried[0][0], gpu=bus, bus_id=bus, samples=len(queried),
                             reasons_active=held, reason_samples=counts, cite=cite, **q))  # type: ignore[arg-type]
    return out


def parse(doc: Doc) -> List[LogEvent]:
    """``smi_row`` per table GPU (and per GPU of ``--query-gpu`` csv rows, with their ``smi_q_gpu``);
    ``smi_processes`` (how many processes a closed Processes: section lists); ``smi_handle_error``,
    ``smi_no_devices``, ``smi_no_driver`` lines."""
    out: List[LogEvent] = []
    pending = None
    procs: Optional[List[int]] = None  # the open Processes: section: [its line, process rows, past its ==== rule]
    for n, line in enumerate(doc.lines, 1):
        if _PROCESSES.match(line):
            procs = [n, 0, 0]
            continue
        if procs is not None:
            if procs[2] and _TABLE_END.match(line.rstrip()):  # closed: a cut-off section says nothing
                out.append(doc.event("smi_processes", procs[0], count=procs[1]))
                procs = None
            elif line.startswith("|"):
                procs[1] += bool(procs[2] and _PROCESS_ROW.match(line.rstrip()))
                procs[2] = procs[2] or int(line.startswith("|=="))
            else:
                procs = None
            continue
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
                util_pct=_value(m2["util"]), compute_mode=m2["mode"].strip() or None,
                err_cells=sorted(k for k, v in cells.items() if _unreadable(v, "temp_c" if k == "temp" else k))
                or None))
    if "," in doc.text and any(m in doc.text for m in _CSV_MARKERS):
        out += _query_csv(doc)
    return out
