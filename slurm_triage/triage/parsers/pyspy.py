"""``py-spy dump`` output: one ``pyspy_thread`` event per thread with its top frames.

py-spy prints ``Process 14310: <cmdline>``, ``Python v3.11.9 (<path>)``, then per thread
``Thread 4888 (idle): "MainThread"`` followed by frames ``func (file.py:123)``, innermost first
(``--locals`` adds indented ``Arguments:``/``Locals:`` lines, skipped here). Pastes from many ranks
are separated by the user's own banners (``===== node-0 PID 11841 =====``, ``# Rank 3``): a banner
that names a pid, host or rank sets it for the dumps below. Some authors list several identical
``"MainThread"`` headers over one shared stack (one per process): each header gets that stack.

Python's own faulthandler dump (``faulthandler.dump_traceback_later``'s ``Timeout (0:02:00)!``, a
registered signal) has the same shape: ``Thread 0x00007f1c8e7fc700 (most recent call first):`` (or
``Current thread 0x...``) over ``  File "/path/x.py", line 306 in wait`` frames, innermost first. It
names no thread: the one whose outermost frame is ``<module>`` is the main thread. A dump that follows
``Fatal Python error`` is a crash's, not a snapshot of waiting threads, and is left alone.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional

from ..model import LogEvent
from .base import Doc

MAX_FRAMES = 12
_PROCESS = re.compile(r"^Process (?P<pid>\d+): (?P<cmd>.*)$")
_THREAD = re.compile(r"^\s*Thread (?P<tid>0x[0-9A-Fa-f]+|\d+) \((?P<state>[\w+ ]+)\)(?::\s*\"(?P<name>[^\"]*)\")?\s*$")
_FRAME = re.compile(r"^\s+(?P<func>[^\s(][^()]*?) \((?P<file>[^()]+?)(?::(?P<line>\d+))?\)\s*(?:<--.*|#.*)?$")
_BANNER_PID = re.compile(r"\b(?:PID|pid)\s*[:=]?\s*(?P<pid>\d+)")
_BANNER_RANK = re.compile(r"\b[Rr]ank\s*[:=#]?\s*(?P<rank>\d+)\b")
_BANNER_HOST = re.compile(r"^[=#\-\s]*(?P<host>[A-Za-z][\w.\-]*\d[\w.\-]*)\s+(?:PID|pid)\b")
_FH_THREAD = re.compile(r"^\s*(?:Current thread|Thread) (?P<tid>0x[0-9A-Fa-f]+) (?:\[[^\]]*\] )?\(most recent call first\):\s*$")
_FH_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)\s*$')
"""``line N in func`` without the comma of a traceback's ``line N, in func``: faulthandler's own layout."""
_ERROR = re.compile(r"^Error: (?P<error>.+)$")
_SKIP = re.compile(r"^\s+(?:Arguments:|Locals:|native frames:)|^\s{8,}\w+: ")


def parse(doc: Doc) -> List[LogEvent]:
    """``pyspy_thread`` per thread (pid, rank and host when the paste names them, frames innermost first);
    ``pyspy_error`` where py-spy could not dump a process."""
    if not any(_THREAD.match(line) or line.startswith("Process ") for line in doc.lines):
        return [] if "Fatal Python error" in doc.text else _faulthandler(doc)
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


def _faulthandler(doc: Doc) -> List[LogEvent]:
    """``pyspy_thread`` per thread of faulthandler dumps (frames as py-spy writes them: ``func (file:line)``); a run
    of frames without a header is one thread."""
    out: List[LogEvent] = []
    current: Optional[LogEvent] = None
    for n, line in enumerate(doc.lines, 1):
        t = _FH_THREAD.match(line)
        if t:
            current = doc.event("pyspy_thread", n, tid=t["tid"], thread_state="dumped", frames=[])
            out.append(current)
            continue
        f = _FH_FRAME.match(line)
        if f:
            if current is None:  # frames pasted without their thread header: one thread all the same
                current = doc.event("pyspy_thread", n, thread_state="dumped", frames=[])
                out.append(current)
            frames = current.fields["frames"]
            if len(frames) < MAX_FRAMES:
                frames.append(f"{f['func']} ({f['file']}:{f['line']})")
            if f["func"] == "<module>":
                current.fields["thread_name"] = "MainThread"
            continue
        current = None
    return out
