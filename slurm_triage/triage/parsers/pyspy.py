"""``py-spy dump`` output: one ``pyspy_thread`` event per thread with its top frames.

py-spy prints ``Process 14310: <cmdline>``, ``Python v3.11.9 (<path>)``, then per thread
``Thread 4888 (idle): "MainThread"`` followed by frames ``func (file.py:123)``, innermost first
(``--locals`` adds indented ``Arguments:``/``Locals:`` lines, skipped here). Pastes from many ranks
are separated by the user's own banners (``===== node-0 PID 11841 =====``, ``# Rank 3``): a banner
that names a pid, host or rank sets it for the dumps below. Some authors list several identical
``"MainThread"`` headers over one shared stack (one per process): each header gets that stack.
"""
from __future__ import annotations

import re
from typing import Dict, List

from ..model import LogEvent
from .base import Doc

MAX_FRAMES = 12
_PROCESS = re.compile(r"^Process (?P<pid>\d+): (?P<cmd>.*)$")
_THREAD = re.compile(r"^\s*Thread (?P<tid>0x[0-9A-Fa-f]+|\d+) \((?P<state>[\w+ ]+)\)(?::\s*\"(?P<name>[^\"]*)\")?\s*$")
_FRAME = re.compile(r"^\s+(?P<func>[^\s(][^()]*?) \((?P<file>[^()]+?)(?::(?P<line>\d+))?\)\s*(?:<--.*|#.*)?$")
_BANNER_PID = re.compile(r"\b(?:PID|pid)\s*[:=]?\s*(?P<pid>\d+)")
_BANNER_RANK = re.compile(r"\b[Rr]ank\s*[:=#]?\s*(?P<rank>\d+)\b")
_BANNER_HOST = re.compile(r"^[=#\-\s]*(?P<host>[A-Za-z][\w.\-]*\d[\w.\-]*)\s+(?:PID|pid)\b")
_ERROR = re.compile(r"^Error: (?P<error>.+)$")
_SKIP = re.compile(r"^\s+(?:Arguments:|Locals:|native frames:)|^\s{8,}\w+: ")


def parse(doc: Doc) -> List[LogEvent]:
    """``pyspy_thread`` per thread (pid, rank and host when the paste names them, frames innermost first);
    ``pyspy_error`` where py-spy could not dump a process."""
    if not any(_THREAD.match(line) or line.startswith("Process ") for line in doc.lines):
        return []
    out: List[LogEvent] = []
    context: Dict[str, object] = {}
    current: List[LogEvent] = []  # headers waiting for their frames (several when grouped)
    stacked = False
    for n, line in enumerate(doc.lines, 1):
        t = _THREAD.match(line)
        if t:
            grouped = (not stacked and current and t["name"] == "MainThread"
                       and all(e.fields.get("thread_name") == "MainThread" for e in current))
            if not grouped:
                current = []
            ev = doc.event("pyspy_thread", n, rank=context.get("rank"),  # type: ignore[arg-type]
                           node=context.get("host"), tid=t["tid"], thread_state=t["state"],  # type: ignore[arg-type]
                           thread_name=t["name"], pid=context.get("pid"), frames=[])
            out.append(ev)
            current.append(ev)
            stacked = False
            continue
        f = _FRAME.match(line)
        if f and current and not _SKIP.match(line):
            frame = f"{f['func'].strip()} ({f['file']}" + (f":{f['line']})" if f["line"] else ")")
            for ev in current:
                if len(ev.fields["frames"]) < MAX_FRAMES:
                    ev.fields["frames"].append(frame)
            stacked = True
            continue
        if not line.strip() or _SKIP.match(line) or (line[:1].isspace() and current):
            continue
        current, stacked = [], False
        p = _PROCESS.match(line.strip())
        if p:
            context = {k: v for k, v in context.items() if k != "pid"}
            context["pid"] = int(p["pid"])
            continue
        if line.startswith("Python v"):
            continue
        e = _ERROR.match(line.strip())
        if e:  # py-spy could not read the process (EPERM while it sits in the kernel, gone, ...)
            out.append(doc.event("pyspy_error", n, rank=context.get("rank"),  # type: ignore[arg-type]
                                 node=context.get("host"), pid=context.get("pid"),  # type: ignore[arg-type]
                                 error=e["error"]))
            continue
        banner: Dict[str, object] = {}
        pm, rm, hm = _BANNER_PID.search(line), _BANNER_RANK.search(line), _BANNER_HOST.match(line)
        if pm:
            banner["pid"] = int(pm["pid"])
        if rm:
            banner["rank"] = int(rm["rank"])
        if hm:
            banner["host"] = hm["host"]
        if banner:
            context = banner
    return out
