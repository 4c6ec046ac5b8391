"""Slurm's own views of a failure: ``sinfo -R``, ``scontrol show node`` reasons, ``sacct`` states.

* ``sinfo -R``: ``REASON USER TIMESTAMP NODELIST`` columns, the reason cut to 20 characters
  (``%20E``); people also paste single rows (``sinfo -R | grep ...``), read when the user column
  is ``root`` or ``slurm`` (who set the reason), since a bare row has no header to go by.
* ``scontrol show node`` (multi-line or ``-o``): ``NodeName=``, ``State=IDLE+DRAIN``,
  ``Reason=Kill task failed [root@2024-08-08T19:12:57]``.
* ``sacct``: the fixed-width table (widths from the ``----- -----`` rule; long states are cut
  and marked ``+``, e.g. ``OUT_OF_ME+``) or ``-P``/``--parsable2`` output (``|``-separated).
"""
from __future__ import annotations

import calendar
import re
import time as _time
from typing import Dict, List, Optional, Tuple

from ..model import LogEvent
from .base import Doc

# Job states and their short codes (sacct(1), "JOB STATE CODES"); a cut state is expanded by prefix.
JOB_STATES = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
              "PENDING", "PREEMPTED", "RUNNING", "REQUEUED", "RESIZING", "REVOKED", "SUSPENDED", "TIMEOUT")
_ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d"
_SINFO_HEADER = re.compile(r"^\s*REASON\s+USER\s+TIMESTAMP\s+NODELIST\s*$")
_SINFO_ROW = re.compile(r"^(?P<reason>\S.*?)\s+(?P<user>[\w.-]+)\s+(?P<at>" + _ISO + r"|Unknown|None)\s+"
                        r"(?P<nodes>[\w.\-\[\],]+)\s*$")
_QUOTED = re.compile(r'^\s*"(?P<line>.*)",?\s*$')  # a command's output pasted as JSON strings (Ansible stdout_lines)
_SACCT_CMD = re.compile(r"\bsacct\b.*?(?:--fields|--format|-o)[ =](?P<cols>[\w,%.]+)")
_NODE_NAME = re.compile(r"\bNodeName=(?P<node>\S+)")
_STATE = re.compile(r"\bState=(?P<state>\S+)")
_BAD_STATE = re.compile(r"DOWN|DRAIN|FAIL|NOT_RESPONDING")
_REASON = re.compile(r"\bReason=(?P<reason>.*?)(?: \[(?P<user>[^@\]]+)@(?P<at>[^\]]+)\])?\s*(?=\s\w+=|$)")


def _iso_time(text: Optional[str]) -> Optional[float]:
    if not text or not re.fullmatch(_ISO, text):
        return None
    return float(calendar.timegm(_time.strptime(text, "%Y-%m-%dT%H:%M:%S")))


def _sinfo(doc: Doc) -> List[LogEvent]:
    out: List[LogEvent] = []
    in_table = False
    for n, raw in enumerate(doc.lines, 1):
        q = _QUOTED.match(raw)
        line = q["line"] if q else raw
        if _SINFO_HEADER.match(line):
            in_table = True
            continue
        m = _SINFO_ROW.match(line.rstrip())
        if m and (in_table or m["user"] in ("root", "slurm")):
            out.append(doc.event("slurm_node_reason", n, time=_iso_time(m["at"]), node=m["nodes"],
                                 reason=m["reason"].strip(), user=m["user"], at=m["at"], nodes=m["nodes"],
                                 view="sinfo"))
        elif not m:
            in_table = False
    return out


def _scontrol(doc: Doc) -> List[LogEvent]:
    """A node record's Reason; a record whose State says DOWN/DRAIN/FAIL/NOT_RESPONDING without a
    Reason (cut from the paste, or none set) yields that state as the reason."""
    out: List[LogEvent] = []
    node: Optional[Tuple[int, str]] = None
    state: Optional[Tuple[int, str]] = None
    reasoned = False

    def close() -> None:
        if node is not None and state is not None and not reasoned and _BAD_STATE.search(state[1]):
            out.append(doc.event("slurm_node_reason", state[0], node=node[1], reason=state[1], nodes=node[1],
                                 state=state[1], view="scontrol-state"))

    for n, line in enumerate(doc.lines + [""], 1):
        if not line.strip() or "JobId=" in line:
            close()
            node = None  # records are separated by blank lines; a job record's Reason is not a node's
            continue
        nm = _NODE_NAME.search(line)
        if nm:
            close()
            node, state, reasoned = (n, nm["node"]), None, False
        sm = _STATE.search(line)
        if sm and node is not None:
            state = (n, sm["state"])
        rm = _REASON.search(line)
        if rm and node is not None and rm["reason"].strip() not in ("", "(null)", "None"):
            reasoned = True
            out.append(doc.event("slurm_node_reason", n, time=_iso_time(rm["at"]), node=node[1],
                                 reason=rm["reason"].strip(), user=rm["user"], at=rm["at"], nodes=node[1],
                                 state=state[1] if state else None, view="scontrol"))
    return out


def _state(raw: str) -> Tuple[str, Optional[str]]:
    """(state name, "by <uid>" detail): ``CANCELLED by 0`` -> (CANCELLED, 0); ``OUT_OF_ME+`` expanded."""
    text = raw.strip()
    m = re.match(r"^(?P<s>[A-Z_]+\+?)(?: by (?P<by>\d+))?$", text)
    if not m:
        return text, None
    name, by = m["s"], m["by"]
    if name.endswith("+"):
        hits = [s for s in JOB_STATES if s.startswith(name[:-1])]
        name = hits[0] if len(hits) == 1 else name
    return name, by


def _sacct_row(doc: Doc, n: int, row: Dict[str, str]) -> Optional[LogEvent]:
    jobid = row.get("jobid", "").strip()
    raw_state = row.get("state", "").strip()
    if not jobid or not raw_state or not re.match(r"^\d", jobid):
        return None
    state, by = _state(raw_state)
    if state not in JOB_STATES:
        return None
    fields = {k: v.strip() for k, v in row.items() if v.strip() and k not in ("jobid", "state")}
    exit_code = fields.get("exitcode")
    nodes = fields.get("nodelist")
    return doc.event("sacct_job", n, node=None if not nodes or nodes.startswith("None") else nodes, jobid=jobid,
                     state=state, cancelled_by=by, state_text=raw_state, exit_code=exit_code,
                     **{k: v for k, v in fields.items() if k in ("jobname", "partition", "nodelist", "elapsed",
                                                               "derivedexitcode", "reason", "end", "start")})


def _sacct(doc: Doc) -> List[LogEvent]:
    out: List[LogEvent] = []
    lines = doc.lines
    n = 0
    command_cols: Optional[List[str]] = None
    while n < len(lines):
        line = lines[n]
        cmd = _SACCT_CMD.search(line)
        if cmd and re.search(r"\s(?:-P|-p|--parsable2?)\b", line):
            command_cols = [c.split("%")[0].strip().lower() for c in cmd["cols"].split(",")]
            n += 1
            continue
        if command_cols and line.strip() and "|" not in line:
            command_cols = None  # the command's output has ended
        if command_cols and line.count("|") >= len(command_cols) - 1:
            ev = _sacct_row(doc, n + 1, dict(zip(command_cols, line.split("|"))))
            if ev:
                out.append(ev)
            n += 1
            continue
        if "|" in line and re.search(r"(?:^|\|)JobID\|", line) and "State" in line.split("|"):
            cols = [c.strip().lower() for c in line.split("|")]
            n += 1
            while n < len(lines) and "|" in lines[n]:
                cells = lines[n].split("|")
                ev = _sacct_row(doc, n + 1, dict(zip(cols, cells)))
                if ev:
                    out.append(ev)
                n += 1
            continue
        rule = lines[n + 1] if n + 1 < len(lines) else ""
        if re.match(r"^\s*JobID\b", line) and "State" in line.split() and re.fullmatch(r"[-\s]+", rule or "x"):
            spans = [(m.start(), m.end()) for m in re.finditer(r"-+", rule)]
            cols = [line[a:b].strip().lower() for a, b in spans]
            n += 2
            while n < len(lines) and lines[n].strip() and not re.match(r"^\s*JobID\b", lines[n]):
                row = {c: lines[n][a:b + 1] for c, (a, b) in zip(cols, spans)}
                ev = _sacct_row(doc, n + 1, row)
                if ev:
                    out.append(ev)
                n += 1
            continue
        n += 1
    return out


def parse(doc: Doc) -> List[LogEvent]:
    """``slurm_node_reason`` (sinfo -R, scontrol show node) and ``sacct_job`` events."""
    text = doc.text
    out: List[LogEvent] = []
    if "NodeName=" in text:
        out += _scontrol(doc)
    if "TIMESTAMP" in text or " root " in text or " slurm " in text or "\"Kill task failed" in text:
        out += _sinfo(doc)
    if "sacct" in text or ("JobID" in text and "State" in text):
        out += _sacct(doc)
    return out
