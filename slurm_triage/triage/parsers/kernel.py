"""Kernel log lines in the forms people paste, with their time, host and the facts they state.

Prefixes (util-linux dmesg(1), journalctl(1) ``--output``, rsyslog): ``[  123.456789]`` (seconds
since boot), ``dmesg -H`` deltas ``[  +0.000844]``, ``dmesg -T`` ``[Tue Mar  5 10:11:12 2024]``,
``dmesg --time-format iso`` ``2024-04-29T14:55:41,678628+02:00``, journal ``short`` / syslog
``Mar 05 10:11:12 host kernel:`` (``short-precise`` adds microseconds; no year: the time is kept
only when the same file names a year elsewhere), ``short-iso`` ``2024-03-05T10:11:12+0100 host
kernel:``, and bare messages. Xid lines stay with the line scanner (``logs.py``, kind ``xid``);
this module adds what spans lines or the scanner does not read, as ``kmsg_*`` kinds: the
multi-line "fallen off the bus" text with its bus id, PCIe AER errors (via the node collector's
parser, :func:`slurm_triage.collect.kernel.parse_records`), GPU driver device lines, oom-killer
and memory-cgroup kills, hung tasks (D state), NVSwitch SXids, mlx5 (ConnectX) messages and
kernel call traces (also a pasted trace alone, without the report it belongs to). A
syslog priority (``<6>``, from ``dmesg -r`` or pstore) or a Markdown quote (``> ``) before a line is dropped.
"""
from __future__ import annotations

import calendar
import re
from datetime import datetime
from typing import Dict, List, Optional, Tuple

from ...collect.kernel import parse_records
from ..model import LogEvent
from .base import BDF, Doc, bus_id

_MON = r"(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_MONTHS = {m: i for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), 1)}
_UPTIME = re.compile(r"^\[\s*(?P<up>\d+\.\d+)\]\s?(?P<msg>.*)$")
_DELTA = re.compile(r"^\[\s*\+\d+\.\d+\]\s?(?P<msg>.*)$")
_DMESG_T = re.compile(r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) " + _MON + r" +(?P<d>\d+) (?P<hms>\d\d:\d\d:\d\d) "
                      r"(?P<y>\d{4})\]\s?(?P<msg>.*)$")
_ISO = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[.,](?P<frac>\d+))?(?P<tz>Z|[+-]\d\d:?\d\d)?\s+"
                  r"(?P<rest>.*)$")
_SYSLOG = re.compile(r"^" + _MON + r" +(?P<d>\d+) (?P<hms>\d\d:\d\d:\d\d)(?:\.(?P<frac>\d+))? (?P<rest>.*)$")
_HOST_TAG = re.compile(r"^(?P<host>[\w.\-]+) kernel:\s?(?P<msg>.*)$")
_BARE_KERNEL = re.compile(r"^kernel:\s?(?P<msg>.*)$")
_GATE = ("NVRM", "AER", "PCIe Bus Error", "fallen off", "out of memory", "Out of memory", "oom-kill:", "SXid",
         "mlx5_core", "nvidia ", "blocked for more than")
_OOM_KILL = re.compile(r"^(?P<scope>Memory cgroup out of memory|Out of memory)(?: \(oom_kill_allocating_task\))?: "
                       r"Kill(?:ed)? process (?P<pid>\d+) \((?P<comm>.+?)\)(?=[\s,]|$)(?P<rest>.*)$")
_OOM_CONTEXT = re.compile(r"^oom-kill:constraint=(?P<constraint>\w+),.*?(?:task_memcg=(?P<memcg>[^,]+),)?"
                          r"task=(?P<comm>[^,]+),pid=(?P<pid>\d+)")
_SXID = re.compile(r"^nvidia-nvswitch(?P<switch>\d+): SXid \(PCI:(?P<bus>" + BDF + r")\): (?P<sxid>\d+)"
                   r"(?:, (?P<severity>Fatal|Non-fatal|Nonfatal))?")
_MLX5 = re.compile(r"^mlx5_core (?P<bus>" + BDF + r")(?: (?P<ifname>[\w.\-]+))?: (?P<msg>.+)$")
_NVIDIA_DEV = re.compile(r"^nvidia (?P<bus>" + BDF + r"): (?P<msg>.+)$")
_HUNG = re.compile(r"^INFO: task (?P<comm>.+?):(?P<pid>\d+) blocked for more than (?P<seconds>\d+) seconds")
# A kernel stack frame (oops, WARN, hung-task and soft-lockup reports): "[<ffffffffc33d41c2>] fn+0xb2/0xe0 [mod]"
# (before 4.14), " fn+0xb2/0xe0 [mod]", "? fn+0x..." (unreliable), "RIP: 0010:fn+0x.../0x... [mod]".
_FRAME = re.compile(r"^(?:\[<[0-9a-f]+>\]\s*)?(?:RIP: [0-9a-f]{4}:)?(?:\? )?(?P<fn>[A-Za-z_][\w.]*)"
                    r"\+0x[0-9a-f]+/0x[0-9a-f]+(?:\s+\[(?P<mod>\w+)\])?")
_TRACE_GAP = 3  # "Call Trace:", "<TASK>" and register lines may sit between frames of one trace
# Wrappers around a line: syslog priority "<6>" (dmesg -r, pstore) and a Markdown quote "> ".
_WRAP = re.compile(r"^(?:>\s?|<\d{1,3}>)")


def _stamp(m: "re.Match[str]", year: Optional[int]) -> Optional[float]:
    if year is None:
        return None
    try:
        t = calendar.timegm((year, _MONTHS[m["mon"]], int(m["d"]), *map(int, m["hms"].split(":")), 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    return t + (float("0." + m["frac"]) if m.groupdict().get("frac") else 0.0)


def _iso(m: "re.Match[str]") -> Optional[float]:
    tz = m["tz"] or "Z"
    tz = "+00:00" if tz == "Z" else (tz if ":" in tz else tz[:3] + ":" + tz[3:])
    try:
        t = datetime.fromisoformat(m["ts"] + tz).timestamp()
    except ValueError:
        return None
    return t + (float("0." + m["frac"]) if m["frac"] else 0.0)


def split_prefix(line: str, year: Optional[int]) -> Tuple[Optional[float], Optional[float], Optional[str], str]:
    """(unix time, seconds since boot, host, message) of one kernel log line; unknown parts None."""
    line = _WRAP.sub("", line, count=1)
    m = _UPTIME.match(line)
    if m:
        return None, float(m["up"]), None, m["msg"]
    m = _DELTA.match(line)
    if m:
        return None, None, None, m["msg"]
    m = _DMESG_T.match(line)
    if m:
        return _stamp(m, int(m["y"])), None, None, m["msg"]
    host: Optional[str] = None
    when: Optional[float] = None
    m = _ISO.match(line)
    m2 = None if m else _SYSLOG.match(line)
    rest = line
    if m:
        when, rest = _iso(m), m["rest"]
    elif m2:
        when, rest = _stamp(m2, year), m2["rest"]
    if m or m2:
        h = _HOST_TAG.match(rest)
        if h:
            host, rest = h["host"], h["msg"]
        elif m2:
            return when, None, None, rest  # another program's syslog line
    else:
        b = _BARE_KERNEL.match(line.strip())
        rest = b["msg"] if b else line.strip()
    u = _UPTIME.match(rest)  # kern.log keeps dmesg's "[ 82659.755847] " after "kernel:"
    if u:
        return when, float(u["up"]), host, u["msg"]
    return when, None, host, rest


def _year(doc: Doc) -> Optional[int]:
    for line in doc.lines[:2000]:
        m = _DMESG_T.match(line) or _ISO.match(line)
        if m:
            return int(m["y"]) if "y" in m.groupdict() else int(m["ts"][:4])
    return None


def _traces(doc: Doc, year: Optional[int]) -> List[LogEvent]:
    """``kmsg_call_trace`` per run of stack frames, also a pasted trace without its report's header:
    the functions and the module of each frame (``""`` for the core kernel)."""
    out: List[LogEvent] = []
    run: List[Tuple[int, str, str]] = []

    def close() -> None:
        if len(run) >= 2:
            when, up, host, _ = split_prefix(doc.lines[run[0][0] - 1], year)
            out.append(doc.event("kmsg_call_trace", run[0][0], time=when, node=host, end_line=run[-1][0],
                                 functions=[f for _, f, _ in run][:40], modules=[m for _, _, m in run][:40],
                                 **({"uptime_s": up} if up is not None else {})))
        run.clear()

    for n, line in enumerate(doc.lines, 1):
        if "+0x" not in line:
            if run and n - run[-1][0] > _TRACE_GAP:
                close()
            continue
        m = _FRAME.match(split_prefix(line, year)[3].strip())
        if m:
            if run and n - run[-1][0] > _TRACE_GAP:
                close()
            run.append((n, m["fn"], m["mod"] or ""))
    close()
    return out


def parse(doc: Doc) -> List[LogEvent]:
    """``kmsg_gpu_lost``, ``kmsg_aer``, ``kmsg_gpu_dev``, ``kmsg_oom_kill``, ``kmsg_hung_task``, ``kmsg_sxid``,
    ``kmsg_mlx5``, ``kmsg_call_trace``."""
    framed, gated = "+0x" in doc.text, any(g in doc.text for g in _GATE)
    if not framed and not gated:
        return []
    year = _year(doc)
    out: List[LogEvent] = _traces(doc, year) if framed else []
    if not gated:
        return out
    heads: Dict[int, Tuple[Optional[float], Optional[float], Optional[str]]] = {}
    records = []
    kills: Dict[int, LogEvent] = {}
    contexts: Dict[int, Dict[str, Optional[str]]] = {}
    for n, line in enumerate(doc.lines, 1):
        if not any(g in line for g in _GATE):
            continue
        when, up, host, msg = split_prefix(line, year)
        msg = msg.strip()
        heads[n] = (when, up, host)
        extra = {"uptime_s": up} if up is not None else {}
        if any(g in msg for g in ("NVRM", "AER", "PCIe Bus Error", "fallen off")):
            records.append((n, None, msg))
        m = _OOM_KILL.match(msg)
        if m:
            rss = re.search(r"anon-rss:(\d+)kB", m["rest"])
            ev = doc.event("kmsg_oom_kill", n, time=when, node=host, pid=int(m["pid"]), comm=m["comm"],
                           cgroup=m["scope"].startswith("Memory cgroup"),
                           anon_rss_kb=int(rss.group(1)) if rss else None, **extra)
            out.append(ev)
            kills[int(m["pid"])] = ev
            continue
        m = _OOM_CONTEXT.match(msg)
        if m:
            job = re.search(r"/job_(\d+)", m["memcg"] or "")
            contexts[int(m["pid"])] = {"constraint": m["constraint"], "memcg": m["memcg"],
                                       "job_id": job.group(1) if job else None}
            continue
        m = _SXID.match(msg)
        if m:
            out.append(doc.event("kmsg_sxid", n, time=when, node=host, gpu=None, bus_id=bus_id(m["bus"]),
                                 switch=int(m["switch"]), sxid=int(m["sxid"]),
                                 fatal=(m["severity"] == "Fatal") if m["severity"] else None, **extra))
            continue
        m = _MLX5.match(msg)
        if m:
            out.append(doc.event("kmsg_mlx5", n, time=when, node=host, bus_id=bus_id(m["bus"]),
                                 ifname=m["ifname"], message=m["msg"], **extra))
            continue
        m = _HUNG.match(msg)
        if m:
            out.append(doc.event("kmsg_hung_task", n, time=when, node=host, comm=m["comm"], pid=int(m["pid"]),
                                 blocked_s=int(m["seconds"]), **extra))
            continue
        m = _NVIDIA_DEV.match(msg)
        if m:
            out.append(doc.event("kmsg_gpu_dev", n, time=when, node=host, gpu=bus_id(m["bus"]),
                                 bus_id=bus_id(m["bus"]), message=m["msg"], **extra))
    for pid, ev in kills.items():  # the kernel prints the oom-kill: context line just before the kill
        ev.fields.update({k: v for k, v in contexts.get(pid, {}).items() if v is not None})
    for rec in parse_records(records)[0]:
        n = rec["seq"]
        when, up, host = heads.get(n, (None, None, None))
        extra = {"uptime_s": up} if up is not None else {}
        if rec["kind"] == "fallen_off_bus":
            out.append(doc.event("kmsg_gpu_lost", n, rec["text"], time=when, node=host, gpu=rec["pci_bus_id"],
                                 bus_id=rec["pci_bus_id"], uuid=rec["uuid"], **extra))
        elif rec["kind"] == "aer":
            out.append(doc.event("kmsg_aer", n, time=when, node=host, bus_id=rec["pci_bus_id"],
                                 severity=rec["severity"], driver=rec["driver"], **extra))
    out.sort(key=lambda e: e.line)
    return out
