"""What every structured-output parser shares: the decoded lines of one file and how an event is made.

A parser sees the whole (bounded) file as a list of lines, because tables and per-GPU blocks span
many lines; it emits facts as :class:`LogEvent` with 1-based line numbers, never judgements.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, List, Optional

from ...pci import normalize
from ..model import LogEvent

MAX_TEXT_CHARS = 400
BDF = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


@dataclass
class Doc:
    """One file's decoded lines (``lines[0]`` is line 1) as their programs wrote them, the rank that
    each line's launcher label named (``ranks``, :mod:`..decoration`; empty when not known), and
    where its events come from."""

    source: str
    lines: List[str]
    file_index: int = 0
    ranks: List[Optional[int]] = field(default_factory=list)

    @cached_property
    def text(self) -> str:
        """All lines joined, for the formats' quick "is it there at all" checks."""
        return "\n".join(self.lines)

    def event(self, kind: str, lineno: int, text: Optional[str] = None, *, time: Optional[float] = None,
              node: Optional[str] = None, rank: Optional[int] = None, gpu: Optional[str] = None,
              **fields: Any) -> LogEvent:
        """An event for line ``lineno`` (1-based); ``text`` defaults to that line, stripped."""
        body = self.lines[lineno - 1] if text is None else text
        return LogEvent(kind, self.source, lineno, body.strip()[:MAX_TEXT_CHARS], time, node, rank, gpu,
                        {k: v for k, v in fields.items() if v is not None}, self.file_index)


def bus_id(text: str) -> Optional[str]:
    """Canonical PCI bus id, or None when ``text`` is not one."""
    try:
        return normalize(text)
    except ValueError:
        return None


BYTES_PER_UNIT = {"bytes": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50,
                  "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
                  "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12}
"""Size units as tools print them: coreutils' single letters (df -h, ls -lh) and IEC names are powers of
1024, PyTorch's "KB/MB/GB" powers of 1000."""


def size_bytes(value: str, unit: str) -> float:
    """``value`` (``"1.3"``, ``"64,5"``) ``unit`` (a BYTES_PER_UNIT key) in bytes."""
    return float(value.replace(",", ".")) * BYTES_PER_UNIT[unit]


def number(text: str) -> Optional[float]:
    """The first number in ``text`` ("89 C", "67.97 W", "N/A" -> None)."""
    m = _NUMBER.search(text or "")
    return float(m.group(0)) if m else None
