"""What a paste shows of ``/dev/shm``, the tmpfs NCCL, PSM and PyTorch DataLoaders share memory through.

``df -h /dev/shm`` (or ``df``, in 1K blocks) rows: ``shm  64M  64M  0 100% /dev/shm``, optionally
with df -T's type column; 64M is Docker's default ``--shm-size``. ``ls -l /dev/shm`` rows of the
segments NCCL (``nccl-XXXXXX``, mkstemp names: src/misc/shmutils.cc) and PSM/PSM2 (``psm_*``,
``psm2_*``) create there; such names live only in /dev/shm, so a row names its place itself.
"""
from __future__ import annotations

import re
from typing import List, Optional

from ..model import LogEvent
from .base import Doc, size_bytes

_SIZE = r"\d+(?:[.,]\d+)?[KMGTP]?i?B?"
_DF = re.compile(rf"^\s*(?P<fs>\S+)\s+(?:[a-z][\w.]*\s+)?(?P<size>{_SIZE})\s+(?P<used>{_SIZE})\s+"
                 rf"(?P<avail>{_SIZE})\s+(?P<pct>\d+)%\s+/dev/shm/?\s*$")
_LS = re.compile(r"^\s*-[rwxsStT-]{9}[.+@]?\s+\d+\s+\S+\s+\S+\s+(?P<size>\d+(?:[.,]\d+)?[KMGTP]?)\s+"
                 r"\w{3}\s+\d+\s+[\d:]+\s+(?:/dev/shm/)?(?P<name>nccl-\w{6}|psm2?_\w+)\s*$")


def mib(text: str, bare_unit: str = "K") -> Optional[float]:
    """``text`` ("64M", "1.3G", "65536") in MiB; a bare number counts in ``bare_unit`` (df: 1K blocks, ls: B)."""
    m = re.match(r"(\d+(?:[.,]\d+)?)([KMGTP]?)", text)
    if not m:
        return None
    return size_bytes(m[1], m[2] or bare_unit) / (1 << 20)


def parse(doc: Doc) -> List[LogEvent]:
    """``shm_df`` per df row of /dev/shm (size, use), ``shm_segment`` per listed NCCL/PSM segment."""
    if "/dev/shm" not in doc.text and "nccl-" not in doc.text and "psm" not in doc.text:
        return []
    out: List[LogEvent] = []
    for n, line in enumerate(doc.lines, 1):
        m = _DF.match(line)
        if m:
            out.append(doc.event("shm_df", n, size_mib=mib(m["size"]), used_pct=int(m["pct"])))
            continue
        m = _LS.match(line)
        if m:
            out.append(doc.event("shm_segment", n, name=m["name"], size_mib=mib(m["size"], "B")))
    return out
