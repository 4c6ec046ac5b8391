"""Kernel log facts: NVIDIA Xid lines, "fallen off the bus" messages and PCIe AER errors.

The Prolog and Epilog cannot learn about Xids from NVML (events are only seen while
registered), so the kernel log is the record. Sources: /dev/kmsg (read non-blocking
until EAGAIN, never waits), ``dmesg`` text, or a file in either format (a recorded log,
/var/log/kern.log). Reading is bounded: lines longer than MAX_LINE_BYTES are cut, files
larger than MAX_FILE_BYTES are read only up to that size, and only lines that mention
NVRM or AER are decoded and matched. ``since_seq`` lets the Epilog ask only for what
happened after the Prolog's ``last_seq``; for text sources the sequence is the line number.

Only the driver's own records count: a message must *start* with ``NVRM:`` (a segfault
report quoting a file named "NVRM: Xid ... 79" starts with the task name, and a task name
holds at most 15 bytes, too few for the pattern), a /dev/kmsg record must come from the
kernel (facility 0; user-space writes carry another), and the later lines of a multi-line
record count only when its first line is the driver's (NVRM or a device's dev_printk).
"""
from __future__ import annotations

import errno
import os
import re
from typing import Any, Dict, Iterable, Iterator, List, Optional, Set, Tuple

from ..config import Config
from ..pci import normalize
from ..printable import printable

MAX_LINE_BYTES = 64 * 1024
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_TEXT_CHARS = 400
KMSG_PATH = "/dev/kmsg"
KMSG_READ_BYTES = 64 * 1024  # one record per read(); a smaller buffer gets EINVAL
DMESG_PATHS = ("/usr/bin/dmesg", "/bin/dmesg")


class _Lazy:
    """A pattern compiled on first use: most kernel logs hold no NVRM or AER line at all, and
    compiling the dozen patterns below cost every Prolog's kernel probe ~3.5 ms of CPU."""

    __slots__ = ("_args", "_rx")

    def __init__(self, pattern: str, flags: int = 0):
        self._args, self._rx = (pattern, flags), None

    def __getattr__(self, name: str) -> Any:
        if self._rx is None:
            self._rx = re.compile(*self._args)
        return getattr(self._rx, name)


_BDF = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
_KMSG = _Lazy(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$", re.S)
_DMESG_TS = _Lazy(r"^\[\s*(\+?)(\d+\.\d+)\]\s?(.*)$", re.S)  # "+" = dmesg -H delta
_SYSLOG = _Lazy(r"^.*?\bkernel: (.*)$", re.S)
_CALLER = _Lazy(r"^\[\s*[TC]\d+\]\s?")  # dmesg's caller id column (CONFIG_PRINTK_CALLER)
DRIVER_PREFIX = "NVRM:"
_DEV_PREFIX = _Lazy(r"^\S+ " + _BDF + r": ")  # dev_printk's "<driver> <device>: " (AER lines)
# NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has fallen off the bus.  (old drivers omit "PCI:";
# MIG adds " GPU-I:05" before the parenthesis)
_XID = _Lazy(r"^NVRM: Xid \((?:PCI:)?(" + _BDF + r")[^)]*\): (\d+)")
_GPU_AT = _Lazy(r"^NVRM: GPU at PCI:(" + _BDF + r"): (GPU-[0-9a-fA-F-]+)")
# Probe-time message printed without an Xid; one record with embedded newlines, or 2-3 lines.
_FALLEN_START = _Lazy(r"^NVRM: The NVIDIA GPU (" + _BDF + r")")
_FALLEN_END = _Lazy(r"^NVRM: fallen off the bus and is not responding to commands")
_FALLEN_SAME_LINE = _Lazy(r"fallen off the bus and is not responding to commands")
# "NVRM: GPU 0000:05:00.0: GPU has fallen off the bus." / "NVRM: GPU at 0000:01:00.0 has fallen off the bus."
_FALLEN_ONE = _Lazy(r"^NVRM: GPU (?:at )?(?:PCI:)?(" + _BDF + r"):? (?:GPU )?has fallen off the bus")
_SEVERITY = r"(Corrected|Correctable|Uncorrected \((?:Non-)?Fatal\)|Uncorrectable \((?:Non-)?Fatal\))"
_AER_DETAIL = _Lazy(r"^(\S+) (" + _BDF + r"): (?:AER: )?PCIe Bus Error: severity=" + _SEVERITY)
_AER_RECEIVED = _Lazy(r"^(\S+) (" + _BDF + r"): AER: (?:Multiple )?" + _SEVERITY
                    + r" error (?:message )?received(?: from)?:? (?:id=([0-9a-fA-F]{4})|(" + _BDF + r"))")
_FALLEN_WINDOW = 4  # lines within which the multi-line fallen-off message must complete

Record = Tuple[int, Optional[float], str]
"""(seq, seconds since boot or None, message text possibly holding several lines)."""


def _severity(word: str) -> str:
    if word.startswith("Correct"):
        return "corrected"
    return "nonfatal" if "Non-Fatal" in word else "fatal"


def _bus(text: str) -> str:
    return normalize(text)


def _event(kind: str, rec: Record, line: str, bus: str, **extra: Any) -> Dict[str, Any]:
    ev = {"kind": kind, "pci_bus_id": bus, "xid": None, "time": rec[1], "seq": rec[0],
          "text": printable(line[:MAX_TEXT_CHARS]), "uuid": None, "severity": None, "driver": None}
    ev.update(extra)
    return ev


def parse_records(records: Iterable[Record], since_seq: Optional[int] = None) -> Tuple[List[Dict[str, Any]], Optional[int]]:
    """Turn log records into events; returns (events, highest seq seen)."""
    events: List[Dict[str, Any]] = []
    last_seq: Optional[int] = None
    uuids: Dict[str, str] = {}
    pending: Optional[Tuple[str, Record, str, int]] = None  # (bus, record, first line, lines left)
    burst: Set[Tuple[str, str]] = set()
    for rec in records:
        seq = rec[0]
        if last_seq is None or seq > last_seq:
            last_seq = seq
        if since_seq is not None and seq <= since_seq:
            continue
        lines = rec[2].split("\n")
        first = lines[0].strip()
        driver_record = first.startswith(DRIVER_PREFIX) or bool(_DEV_PREFIX.match(first))
        for n, raw in enumerate(lines):
            line = raw.strip()
            if n and not driver_record:
                break  # a later line of someone else's message (e.g. a quoted file name)
            if pending is not None:
                if _FALLEN_END.search(line):
                    events.append(_event("fallen_off_bus", pending[1], pending[2] + " ... " + line, pending[0]))
                    pending = None
                    continue
                pending = None if pending[3] <= 1 else (pending[0], pending[1], pending[2], pending[3] - 1)
            m = _XID.search(line)
            if m:
                bus = _bus(m.group(1))
                events.append(_event("xid", rec, line, bus, xid=int(m.group(2)), uuid=uuids.get(bus)))
                continue
            m = _GPU_AT.search(line)
            if m:
                uuids[_bus(m.group(1))] = m.group(2)
                continue
            m = _FALLEN_START.search(line)
            if m:
                if _FALLEN_SAME_LINE.search(line):
                    events.append(_event("fallen_off_bus", rec, line, _bus(m.group(1))))
                else:
                    pending = (_bus(m.group(1)), rec, line, _FALLEN_WINDOW)
                continue
            m = _FALLEN_ONE.search(line)
            if m:
                bus = _bus(m.group(1))
                events.append(_event("fallen_off_bus", rec, line, bus, uuid=uuids.get(bus)))
                continue
            m = _AER_RECEIVED.search(line)
            if m:
                # A new error burst: the root port names the source; detail lines follow.
                burst = set()
                if m.group(5):
                    src = _bus(m.group(5))
                else:  # old kernels: requester id = bus(8) dev(5) fn(3), same domain as the port
                    rid = int(m.group(4), 16)
                    src = f"{_bus(m.group(2))[:4]}:{rid >> 8:02x}:{(rid >> 3) & 0x1F:02x}.{rid & 7}"
                sev = _severity(m.group(3))
                burst.add((src, sev))
                events.append(_event("aer", rec, line, src, severity=sev,
                                     driver=m.group(1) if src == _bus(m.group(2)) else None))
                continue
            m = _AER_DETAIL.search(line)
            if m:
                dev, sev = _bus(m.group(2)), _severity(m.group(3))
                if (dev, sev) not in burst:
                    burst.add((dev, sev))
                    events.append(_event("aer", rec, line, dev, severity=sev, driver=m.group(1)))
    return events, last_seq


def _decode(raw: bytes) -> str:
    return raw.replace(b"\x00", b"").decode("utf-8", "replace").rstrip("\r\n")


def _interesting(raw: bytes) -> bool:
    return b"NVRM" in raw or b"AER" in raw or b"PCIe Bus Error" in raw or b"fallen off the bus" in raw


def parse_kmsg_record(raw: bytes) -> Optional[Record]:
    """One /dev/kmsg record ``prio,seq,usec,flags;text`` (+ dictionary lines) -> Record.

    The kernel escapes newlines inside a message as ``\\x0a``; lines after the first that
    start with a space are the record's key=value dictionary and are dropped.
    """
    m = _KMSG.match(_decode(raw).split("\n", 1)[0])
    if not m:
        return None
    if int(m.group(1)) >> 3:  # facility != kernel: written to /dev/kmsg by user space
        return int(m.group(2)), None, ""
    text = m.group(4).replace("\\x0a", "\n")
    return int(m.group(2)), int(m.group(3)) / 1e6, text


def records_from_lines(lines: Iterable[Tuple[int, bytes]]) -> Iterator[Record]:
    """Records from text lines (dmesg output or a file), either format detected per line.

    ``lines`` yields (line number, raw bytes). A dmesg line that starts with whitespace and
    has no timestamp continues the previous record (how dmesg prints multi-line messages).
    Only records that may hold an event are decoded; the rest only advance the sequence.
    """
    pending: Optional[Record] = None
    pending_kmsg = False
    for lineno, raw in lines:
        if raw[:1] in (b" ", b"\t") and pending is not None:
            # kmsg: dictionary line (SUBSYSTEM=..., DEVICE=...); dmesg: continuation of the message
            if not pending_kmsg and (pending[2] or _interesting(raw)):
                pending = (pending[0], pending[1], pending[2] + "\n" + _decode(raw))
            continue
        if pending is not None:
            yield pending
        m = _KMSG.match(raw[:64].decode("latin-1")) if raw[:1].isdigit() else None
        if m:
            rec = parse_kmsg_record(raw) if _interesting(raw) else None
            pending, pending_kmsg = rec or (int(m.group(2)), None, ""), True
            continue
        pending_kmsg = False
        if not _interesting(raw):
            pending = (lineno, None, "")
            continue
        text = _decode(raw)
        if not text.startswith("["):
            m = _SYSLOG.match(text)
            if m:
                text = m.group(1)
        ts: Optional[float] = None
        m = _DMESG_TS.match(text)
        if m:
            ts, text = (None if m.group(1) else float(m.group(2))), m.group(3)
        text = _CALLER.sub("", text, count=1)
        pending = (lineno, ts, text)
    if pending is not None:
        yield pending


def _file_lines(path: str) -> Iterator[Tuple[int, bytes]]:
    """Numbered lines of a file, each cut at MAX_LINE_BYTES, at most MAX_FILE_BYTES read."""
    with open(path, "rb") as fh:
        lineno, budget = 0, MAX_FILE_BYTES
        while budget > 0:
            chunk = fh.readline(min(MAX_LINE_BYTES, budget))
            if not chunk:
                return
            budget -= len(chunk)
            lineno += 1
            line = chunk
            while not chunk.endswith(b"\n") and budget > 0:  # skip the rest of an over-long line
                chunk = fh.readline(min(MAX_LINE_BYTES, budget))
                if not chunk:
                    break
                budget -= len(chunk)
            yield lineno, line


def _kmsg_records(path: str = KMSG_PATH) -> Iterator[Record]:
    """Every record now in the ring buffer; stops at EAGAIN (never blocks)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                raw = os.read(fd, KMSG_READ_BYTES)
            except OSError as e:
                if e.errno == errno.EAGAIN:
                    return
                if e.errno == errno.EPIPE:  # records overwritten while reading: carry on
                    continue
                raise
            if not raw:
                return
            if not _interesting(raw):
                m = _KMSG.match(raw[:64].decode("latin-1"))
                if m:
                    yield int(m.group(2)), None, ""
                continue
            rec = parse_kmsg_record(raw)
            if rec is not None:
                yield rec
    finally:
        os.close(fd)


def _dmesg_lines(timeout: float) -> Iterator[Tuple[int, bytes]]:
    binary = next((p for p in DMESG_PATHS if os.path.exists(p)), None)
    if binary is None:
        raise RuntimeError("no dmesg binary in " + " or ".join(DMESG_PATHS))
    import subprocess  # only the dmesg source: ~10 ms of import every kernel probe paid

    out = subprocess.run([binary], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                         env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"}, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{binary} exited {out.returncode}: {_decode(out.stderr[:200])}")
    for n, line in enumerate(out.stdout.split(b"\n"), 1):
        yield n, line[:MAX_LINE_BYTES]


def collect(cfg: Config, since_seq: Optional[int] = None) -> Dict[str, Any]:
    """Kernel log events (see docs/architecture.md ``kernel``) after ``since_seq``."""
    source = cfg.get("kernel", "source")
    records: Iterable[Record]
    if source == "file":
        path = cfg.get("kernel", "path")
        if not path:
            raise ValueError('kernel.source = "file" needs kernel.path')
        records = records_from_lines(_file_lines(path))
    elif source == "dmesg":
        records = records_from_lines(_dmesg_lines(cfg.get("kernel", "deadline_seconds")))
    elif source == "kmsg":
        records = _kmsg_records()
    else:  # auto
        try:
            events, last = parse_records(_kmsg_records(), since_seq)
            return {"source": "kmsg", "events": events, "last_seq": last}
        except OSError:
            source = "dmesg"
            records = records_from_lines(_dmesg_lines(cfg.get("kernel", "deadline_seconds")))
    events, last = parse_records(records, since_seq)
    return {"source": source, "events": events, "last_seq": last}
