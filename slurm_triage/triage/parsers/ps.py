"""``ps aux`` rows (procps ps(1), BSD syntax): ``USER PID %CPU %MEM VSZ RSS TTY STAT START TIME COMMAND``.

People paste them (often through ``| grep nvidia``) to show what hangs on a node. STAT's first letter is
the process state: ``D`` uninterruptible sleep (waiting inside the kernel, usually on a device or file
system; it cannot be killed), ``Z`` a zombie. The header is often cut by grep, so a row stands alone.
"""
from __future__ import annotations

import re
from typing import List

from ..model import LogEvent
from .base import Doc

_ROW = re.compile(r"^\s*(?P<user>[\w.+\-]+)\s+(?P<pid>\d+)\s+\d+(?:[.,]\d+)?\s+\d+(?:[.,]\d+)?\s+\d+\s+\d+\s+"
                  r"(?P<tty>\S+)\s+(?P<stat>[DRSTtWXZI][<NLsl+]*)\s+(?P<start>[\w:.]+)\s+"
                  r"(?P<time>\d+:\d\d(?::\d\d)?)\s+(?P<cmd>\S.*)$")


def parse(doc: Doc) -> List[LogEvent]:
    """``ps_row`` per process row: pid, state letter and command."""
    out: List[LogEvent] = []
    for n, line in enumerate(doc.lines, 1):
        m = _ROW.match(line)
        if m:
            out.append(doc.event("ps_row", n, pid=int(m["pid"]), user=m["user"], state=m["stat"][0],
                                 stat=m["stat"], command=m["cmd"].strip()))
    return out
