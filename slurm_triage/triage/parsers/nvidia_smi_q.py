"""``nvidia-smi -q`` text: one ``smi_q_gpu`` event per GPU block with the figures a rule needs.

The layout is ``Key : Value`` lines nested by indentation under ``GPU 00000000:07:00.0`` headers
(NVIDIA's nvidia-smi man page, "-q"). Drivers before R535 print "Clocks Throttle Reasons", later
ones "Clocks Event Reasons"; both are read. People often paste only a section (``nvidia-smi -q |
grep -A8 'Clocks Throttle'``, the ECC block): such a section without a GPU header still becomes an
event, with ``bus_id`` unknown. Values that are "N/A" or "Unknown Error" stay out of the figures;
"Unknown Error" values are listed, since NVML answers so for a GPU it can no longer reach.
"""
from __future__ import annotations

import calendar
import re
import time as _time
from typing import Dict, List, Optional, Tuple

from ..model import LogEvent
from .base import Doc, bus_id, number

_GPU = re.compile(r"^GPU (?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_KV = re.compile(r"^(?P<ind>[ \t]*)(?P<key>[A-Za-z][\w .()/+\-]*?)\s+:\s?(?P<val>.*)$")
_SECTION = re.compile(r"^(?P<ind>[ \t]*)(?P<key>[A-Z][\w .()/+\-]*[\w)])\s*$")
_REASONS = ("clocks throttle reasons", "clocks event reasons")
# Sections that open a block even without a GPU header (pasted excerpts).
_ANCHORS = _REASONS + ("ecc errors", "remapped rows", "retired pages", "temperature")
# "Active", also with a note after it ("Active      (bitmask 0x20)" in hand-annotated pastes); never "Not Active".
_ACTIVE = re.compile(r"active\b", re.IGNORECASE)
_MARKERS = ("NVSMI LOG", "Clocks Throttle Reasons", "Clocks Event Reasons", "Remapped Rows", "ECC Errors",
            "Retired Pages", "Retired pages")

Cite = Dict[str, Tuple[int, str]]


def _snake(key: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", key.lower()).strip("_")


class _Block:
    """The ``path -> (value, line)`` pairs of one GPU block; paths are lower-case, '/'-joined."""

    def __init__(self, lineno: int, bus: Optional[str]):
        self.lineno, self.bus = lineno, bus
        self.values: Dict[str, Tuple[str, int]] = {}
        self.stack: List[Tuple[int, str]] = []

    def add(self, indent: int, key: str, value: Optional[str], lineno: int) -> None:
        while self.stack and self.stack[-1][0] >= indent:
            self.stack.pop()
        path = "/".join([k for _, k in self.stack] + [key.lower()])
        if value is None:
            self.stack.append((indent, key.lower()))
        elif path not in self.values:
            self.values[path] = (value.strip(), lineno)
        if value is not None and value.strip() == "" and key.lower() in _ANCHORS:
            self.stack.append((indent, key.lower()))  # "Clocks Throttle Reasons :" with children

    def find(self, *suffixes: str) -> Optional[Tuple[str, str, int]]:
        """(path, value, line) of the first path ending in one of ``suffixes``."""
        for suffix in suffixes:
            for path, (val, line) in self.values.items():
                if path == suffix or path.endswith("/" + suffix):
                    return path, val, line
        return None


def _figure(block: _Block, fields: Dict[str, object], cite: Cite, doc: Doc, name: str, *suffixes: str) -> None:
    hit = block.find(*suffixes)
    if hit is None:
        return
    value = number(hit[1])
    if value is not None and "N/A" not in hit[1]:
        fields[name] = int(value) if value.is_integer() else value
        cite[name] = (hit[2], doc.lines[hit[2] - 1].strip())


def _flag(block: _Block, fields: Dict[str, object], cite: Cite, doc: Doc, name: str, *suffixes: str) -> None:
    hit = block.find(*suffixes)
    if hit is not None and hit[1].lower() in ("yes", "no"):
        fields[name] = hit[1].lower() == "yes"
        cite[name] = (hit[2], doc.lines[hit[2] - 1].strip())


def _ecc_sum(block: _Block, scope: str) -> Tuple[Optional[int], List[int]]:
    """Uncorrectable ECC errors in ``scope`` (volatile/aggregate), Ampere+ or older layout."""
    total, lines = 0, []
    seen = False
    for path, (val, line) in block.values.items():
        parts = path.split("/")
        if "ecc errors" not in parts or scope not in parts:
            continue
        leaf = parts[-1]
        counts = ("uncorrectable" in leaf and "sources" not in path) or (leaf == "total" and "double bit" in parts)
        if not counts or not val.strip().isdigit():
            continue
        seen = True
        if int(val) > 0:
            total += int(val)
            lines.append(line)
    return (total if seen else None), lines


def _timestamp(doc: Doc) -> Optional[float]:
    for line in doc.lines[:40]:
        m = re.match(r"^Timestamp\s+:\s+(?P<t>\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\s*$", line)
        if m:
            try:
                return float(calendar.timegm(_time.strptime(" ".join(m["t"].split()), "%a %b %d %H:%M:%S %Y")))
            except ValueError:
                return None
    return None


def _event(doc: Doc, block: _Block, when: Optional[float]) -> Optional[LogEvent]:
    fields: Dict[str, object] = {}
    cite: Cite = {}
    if block.bus:
        fields["bus_id"] = block.bus
    for name, key in (("product", "product name"), ("uuid", "gpu uuid")):
        hit = block.find(key)
        if hit and hit[1] not in ("N/A", "Unknown Error"):
            fields[name] = hit[1]
    reasons = [(p, v, ln) for p, (v, ln) in block.values.items()
               if any(p.startswith(r + "/") or ("/" + r + "/") in p for r in _REASONS)]
    active = [(p.split("/")[-1], ln) for p, v, ln in reasons if _ACTIVE.match(v)]
    if reasons:
        fields["reasons_listed"] = len(reasons)
        fields["reasons_active"] = [_snake(k) for k, _ in active]
        for key, ln in active:
            cite["reason." + _snake(key)] = (ln, doc.lines[ln - 1].strip())
    _figure(block, fields, cite, doc, "temp_c", "temperature/gpu current temp")
    _figure(block, fields, cite, doc, "slowdown_c", "temperature/gpu slowdown temp")
    _figure(block, fields, cite, doc, "shutdown_c", "temperature/gpu shutdown temp")
    _figure(block, fields, cite, doc, "max_operating_c", "temperature/gpu max operating temp")
    _figure(block, fields, cite, doc, "mem_temp_c", "temperature/memory current temp")
    _figure(block, fields, cite, doc, "mem_max_operating_c", "temperature/memory max operating temp")
    _figure(block, fields, cite, doc, "power_w", "power readings/power draw", "gpu power readings/power draw",
            "gpu power readings/instantaneous power draw", "gpu power readings/average power draw")
    _figure(block, fields, cite, doc, "power_limit_w", "power readings/enforced power limit",
            "gpu power readings/current power limit", "power readings/power limit")
    _figure(block, fields, cite, doc, "sm_mhz", "clocks/sm")
    _figure(block, fields, cite, doc, "sm_max_mhz", "max clocks/sm")
    _flag(block, fields, cite, doc, "remap_pending", "remapped rows/pending")
    _flag(block, fields, cite, doc, "remap_failure", "remapped rows/remapping failure occurred")
    _figure(block, fields, cite, doc, "remap_uncorrectable", "remapped rows/uncorrectable error")
    _flag(block, fields, cite, doc, "retired_pending", "retired pages/pending page blacklist",
          "retired pages/pending page retirement")
    _figure(block, fields, cite, doc, "retired_dbe", "retired pages/double bit ecc")
    _flag(block, fields, cite, doc, "reset_required", "gpu reset status/reset required")
    _flag(block, fields, cite, doc, "drain_and_reset", "gpu reset status/drain and reset recommended")
    for scope in ("volatile", "aggregate"):
        total, lines = _ecc_sum(block, scope)
        if total is not None:
            fields[f"ecc_{scope}_uncorrectable"] = total
            if lines:
                cite[f"ecc_{scope}_uncorrectable"] = (lines[0], doc.lines[lines[0] - 1].strip())
    unknown = sorted(p for p, (v, _) in block.values.items() if v.lower() == "unknown error")
    if unknown:
        fields["unknown_error_fields"] = unknown
        ln = block.values[unknown[0]][1]
        cite["unknown_error"] = (ln, doc.lines[ln - 1].strip())
    if len(fields) <= (1 if block.bus else 0):
        return None  # a header with nothing we read
    fields["cite"] = {k: list(v) for k, v in cite.items()}
    return doc.event("smi_q_gpu", block.lineno, time=when, gpu=block.bus, **fields)


def parse(doc: Doc) -> List[LogEvent]:
    """One ``smi_q_gpu`` event per GPU block (or pasted section) of ``nvidia-smi -q`` output."""
    if not any(m in line for line in doc.lines for m in _MARKERS):
        return []
    when = _timestamp(doc)
    blocks: List[_Block] = []
    block: Optional[_Block] = None
    for n, line in enumerate(doc.lines, 1):
        if not line.strip() or line.strip() in ("[...]", "..."):
            continue
        m = _GPU.match(line)
        if m:
            block = _Block(n, bus_id(m["bus"]))
            blocks.append(block)
            continue
        kv = _KV.match(line)
        sec = None if kv else _SECTION.match(line)
        if not kv and not sec:
            block = None if block is not None and block.bus is None else block
            continue
        key = (kv or sec)["key"].strip()  # type: ignore[index]
        indent = len((kv or sec)["ind"].expandtabs(4))  # type: ignore[index]
        if block is None:
            if key.lower() not in _ANCHORS:
                continue
            block = _Block(n, None)
            blocks.append(block)
        block.add(indent, key, kv["val"] if kv else None, n)
    return [e for e in (_event(doc, b, when) for b in blocks) if e is not None]
