"""Safe, fast reading of job logs (Slurm stdout/stderr, torchrun, NCCL_DEBUG, kernel log copies).

Logs of long jobs reach gigabytes and may hold binary garbage, NUL bytes, invalid UTF-8,
megabyte-long lines or be gzip-compressed. Reading is therefore bytes-first: on plain files GNU
``grep -F`` (absolute path, LC_ALL=C, ``-a`` for binary garbage) finds the lines holding any
literal needle at several times the speed of Python, and only those lines are parsed here;
gzip files, and machines without grep, use the pure-Python scanner, which searches each block
with ``bytes.find`` (C speed, no regex engine). Both paths feed the same line parser, and a test
holds them to the same events. Nothing here judges; :mod:`slurm_triage.triage.rules` does.
"""
from __future__ import annotations

import calendar
import gzip
import os
import re
import subprocess
from dataclasses import dataclass, field
from typing import IO, Callable, Dict, Iterable, List, Optional, Pattern, Tuple

from .model import LogEvent

BLOCK_BYTES = 4 << 20
MAX_LINE_BYTES = 16 << 10   # a line is cut to this window around the hit
MAX_CARRY_BYTES = 1 << 20   # a "line" longer than this is split (garbage without newlines)
MAX_EVENTS_PER_KIND = 5000  # keeps memory bounded on pathological logs; the rest is counted
GREP_PATHS = ("/usr/bin/grep", "/bin/grep")
WC_PATHS = ("/usr/bin/wc", "/bin/wc")
_TOOL_ENV = {"LC_ALL": "C", "PATH": "/usr/bin:/bin"}


@dataclass(frozen=True)
class Signature:
    """A line shape: literal ``needles`` (any one must occur) gate the detailed ``regex``."""

    kind: str
    needles: Tuple[bytes, ...]
    regex: Pattern[str]


def _sig(kind: str, needles: Tuple[bytes, ...], regex: str) -> Signature:
    return Signature(kind, needles, re.compile(regex))


# Shapes are taken from real reports; tests/corpus/*/meta.json name the sources. Needles are few
# long and shared between signatures on purpose: each distinct needle costs one pass over every
# block, and a short needle ending in a common letter (b"by peer") scans 10x slower than a long one.
SIGNATURES: Tuple[Signature, ...] = (
    _sig("watchdog_timeout", (b"Watchdog caught collective",),
         r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
         r"[^)]*?Timeout\(ms\)=(?P<timeout_ms>\d+)\) ran for (?P<ran_ms>\d+) milli"),
    _sig("watchdog_progress", (b"detected by watchdog at work",),
         r"detected by watchdog at work: (?P<seq>\d+), last enqueued NCCL work: (?P<enqueued>-?\d+), "
         r"last completed NCCL work: (?P<completed>-?\d+)"),
    _sig("heartbeat_timeout", (b"Heartbeat monitor timed out", b"watchdog got stuck"),
         r"Heartbeat monitor timed out|watchdog got stuck for (?P<stuck_s>\d+) seconds"),
    _sig("barrier_timeout", (b"store based barrier",),
         r"Timed out initializing process group in store based barrier on rank:? (?P<barrier_rank>\d+), "
         r"for key: (?P<key>\S+) \(world_size=(?P<world_size>\d+), worker_count=(?P<worker_count>\d+), "
         r"timeout=(?P<timeout>[^)]+)\)"),
    _sig("ib_completion", (b"completion from peer",),
         r"Got completion from peer (?P<peer>\S+) with (?:error |status=)(?P<status>\d+),? opcode[= ](?P<opcode>\d+)"
         r",? len[= ](?P<len>\d+),? vendor err (?P<vendor_err>\d+)(?: \((?P<direction>\w+)\))?"),
    _sig("addr_in_use", (b"ddress already in use", b"EADDRINUSE"),
         r"bind to (?P<bind>\S+?) \(errno: 98|EADDRINUSE|[Aa]ddress already in use"),
    _sig("shm_exhausted", (b"posix_fallocate", b"/dev/shm"),
         r"posix_fallocate failed\s*:\s*No space left|failed to extend (?P<path>/dev/shm/\S+) to (?P<size>\d+) bytes"
         r"|Error while creating shared memory segment (?P<segment>\S+)(?: \(size (?P<seg_size>\d+)\))?"
         r"|unable to allocate shared memory"),
    _sig("cuda_oom", (b"CUDA",),
         r"(?:OutOfMemoryError: )?CUDA out of memory\.(?: Tried to allocate (?P<alloc>[\d.]+ [KMGT]?i?B))?(?:.*?\(?GPU (?P<gpu>\d+))?"
         r"|OutOfMemoryError"),
    _sig("cuda_error", (b"CUDA", b"cuda runtime error"),
         r"(?:CUDA error|cuda runtime error \(\d+\)|CUDA_ERROR_\w+)\s*:\s*(?P<msg>an illegal memory access|"
         r"uncorrectable ECC error|unspecified launch failure|an illegal instruction|misaligned address|"
         r"hardware stack error|unrecoverable|device-side assert)"),
    _sig("host_oom", (b"Out of memory: Kill", b"invoked oom-killer"),
         r"Out of memory: Kill(?:ed)? process (?P<pid>\d+) \((?P<comm>[^)]*)\)|(?P<comm2>\S+) invoked oom-killer"),
    _sig("cgroup_oom", (b"oom-kill event", b"oom_kill event", b"Out Of Memory"),
         r"Detected (?P<count>\d+) oom[-_]kill events?(?:\(s\))? in (?:StepId=|step )(?P<step>\w+(?:\.\w+)?)"
         r"|srun: error: (?P<oom_node>[\w.-]+): tasks? (?P<tasks>[\d,-]+): Out Of Memory"),
    _sig("slurm_cancel", (b"CANCELLED AT",),
         r"\*\*\* (?P<what>JOB|STEP) (?P<id>[\w.]+) (?:ON (?P<cancel_node>\S+) )?CANCELLED AT (?P<at>\S+)"
         r"(?: DUE TO (?P<reason>[A-Z_ ]+?))?(?: on (?P<cancel_node2>\S+))? \*\*\*"),
    _sig("xid", (b"NVRM",),
         r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>\d+)(?:, (?P<detail>.*))?"),
    _sig("fallen_off_bus", (b"NVRM",), r"fallen off the bus"),
    _sig("conn_reset", (b"Connection reset by peer", b"Connection closed by peer", b"remote process exited"),
         r"Connection reset by peer|Connection closed by peer|remote process exited or there was a network error"),
    _sig("nccl_rank", (b"Init COMPLETE",),
         r"NCCL INFO comm 0x[0-9a-f]+ rank (?P<comm_rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<dev>\d+)"),
)

NEEDLES: Tuple[bytes, ...] = tuple(sorted({n for s in SIGNATURES for n in s.needles}))
_NEEDLE_STR = {s.kind: tuple(n.decode() for n in s.needles) for s in SIGNATURES}

# Prefixes that say where a line comes from.
_NCCL_PREFIX = re.compile(r"(?:^|\s|\])(?P<host>[A-Za-z][\w.-]*):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\]")
_RANK = re.compile(r"\[(?:rank|PG [^\]]*?Rank |Rank )(?P<rank>\d+)\]")
_ISO = re.compile(r"(?P<y>(?:19|20)\d\d)-(?P<mo>\d\d)-(?P<d>\d\d)[ T](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,](?P<f>\d+))?")
_GLOG = re.compile(r"\[[IWEF](?P<mo>\d{1,2})(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.(?P<f>\d+))?")
_SYSLOG = re.compile(r"^(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(?P<d>\d\d?) "
                     r"(?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)")
_SYSLOG_HOST = re.compile(r"^[A-Z][a-z]{2} +\d\d? \d\d:\d\d:\d\d (?P<host>[\w.-]+) kernel:")
_MONTHS = {m: i for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), 1)}


def parse_time(text: str, year_hint: Optional[int]) -> Tuple[Optional[float], Optional[int]]:
    """(unix seconds, year seen) for the first timestamp in ``text``; both None if none.

    glog (``[E0321 02:07:08.4]``) and syslog stamps have no year: ``year_hint`` (the last year
    seen in the same file) fills it, else 2000, which keeps them ordered within one file.
    """
    m = _ISO.search(text)
    if m:
        year = int(m["y"])
        mo, d = int(m["mo"]), int(m["d"])
    else:
        m = _GLOG.search(text)
        if m:
            mo, d = int(m["mo"]), int(m["d"])
        else:
            m = _SYSLOG.search(text)
            if not m:
                return None, None
            mo, d = _MONTHS[m["mon"]], int(m["d"])
        year = year_hint or 2000
    if not (1 <= mo <= 12 and 1 <= d <= 31):
        return None, None
    f = m.groupdict().get("f")
    frac = float("0." + f) if f else 0.0
    try:
        t = calendar.timegm((year, mo, d, int(m["h"]), int(m["mi"]), int(m["s"]), 0, 0, 0)) + frac
    except (ValueError, OverflowError):
        return None, None
    return t, (year if _ISO is m.re else None)


def _int_fields(d: Dict[str, Optional[str]]) -> Dict[str, object]:
    out: Dict[str, object] = {}
    for k, v in d.items():
        if v is None:
            continue
        out[k] = int(v) if v.lstrip("-").isdigit() and len(v) < 19 else v
    return out


def parse_line(text: str, source: str, line: int, file_index: int = 0,
               year_hint: Optional[int] = None) -> Tuple[List[LogEvent], Optional[int]]:
    """Events for one decoded line (usually none or one), and the year it revealed."""
    events: List[LogEvent] = []
    year_seen: Optional[int] = None
    for sig in SIGNATURES:
        if not any(n in text for n in _NEEDLE_STR[sig.kind]):
            continue
        m = sig.regex.search(text)
        if not m:
            continue
        if not events:
            t, year_seen = parse_time(text, year_hint)
        fields = _int_fields(m.groupdict())
        node = fields.pop("cancel_node", None) or fields.pop("cancel_node2", None) or fields.pop("oom_node", None)
        gpu = None
        pm = _NCCL_PREFIX.search(text)
        if pm:
            node = node or pm["host"]
            gpu = pm["dev"]
        sm = None if node else _SYSLOG_HOST.match(text)
        if sm:
            node = sm["host"]
        if "gpu" in fields:
            gpu = str(fields.pop("gpu"))
        rm = _RANK.search(text)
        rank = int(rm["rank"]) if rm else None
        if sig.kind == "nccl_rank":
            rank = int(fields["comm_rank"])
        clean = text.strip()
        events.append(LogEvent(sig.kind, source, line, clean[:400], t, node, rank, gpu, fields, file_index))
    return events, year_seen


def open_log(path: str) -> IO[bytes]:
    """A binary stream of the log; gzip is recognized by its magic bytes, not the name."""
    fh = open(path, "rb")
    magic = fh.read(2)
    fh.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=fh, mode="rb")  # type: ignore[return-value]
    return fh


@dataclass
class ScanStats:
    bytes: int = 0
    lines: int = 0
    candidate_lines: int = 0
    dropped_events: Dict[str, int] = field(default_factory=dict)


def _block_hits(data: bytes) -> Dict[int, int]:
    """{line start: first hit offset} for lines holding any needle."""
    hits: Dict[int, int] = {}
    for needle in NEEDLES:
        i = data.find(needle)
        while i != -1:
            start = data.rfind(b"\n", 0, i) + 1
            if start not in hits or i < hits[start]:
                hits[start] = i
            end = data.find(b"\n", i)
            if end == -1:
                break
            i = data.find(needle, end)
    return hits


class _Sink:
    """Parses candidate lines in file order (the year seen carries over) and caps events per kind."""

    def __init__(self, source: str, file_index: int):
        self.source, self.file_index = source, file_index
        self.stats = ScanStats()
        self.events: List[LogEvent] = []
        self.per_kind: Dict[str, int] = {}
        self.year: Optional[int] = None

    def line(self, raw: bytes, lineno: int) -> None:
        text = raw.replace(b"\x00", b"").decode("utf-8", "replace").rstrip("\r")
        self.stats.candidate_lines += 1
        found, y = parse_line(text, self.source, lineno, self.file_index, self.year)
        self.year = y or self.year
        for ev in found:
            n = self.per_kind.get(ev.kind, 0) + 1
            self.per_kind[ev.kind] = n
            if n <= MAX_EVENTS_PER_KIND:
                self.events.append(ev)
            else:
                self.stats.dropped_events[ev.kind] = self.stats.dropped_events.get(ev.kind, 0) + 1


def _binary(paths: Tuple[str, ...]) -> Optional[str]:
    return next((g for g in paths if os.access(g, os.X_OK)), None)


def grep_binary() -> Optional[str]:
    """GNU grep by absolute path (never through PATH: triage may run as root)."""
    return _binary(GREP_PATHS)


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def _window(line: bytes) -> bytes:
    """A line cut to MAX_LINE_BYTES around its first needle, as the block scanner cuts it."""
    if len(line) <= MAX_LINE_BYTES:
        return line
    hit = min((i for i in (line.find(n) for n in NEEDLES) if i != -1), default=0)
    lo = max(0, hit - MAX_LINE_BYTES // 2)
    return line[lo:lo + MAX_LINE_BYTES]


def _last_byte(path: str) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell() == 0:
            return b""
        fh.seek(-1, os.SEEK_END)
        return fh.read(1)


def _scan_grep(grep: str, wc_bin: str, path: str, file_index: int, source: str,
               progress: Optional[Callable[[str, int], None]]) -> Tuple[List[LogEvent], ScanStats]:
    """The candidate lines from ``grep -a -n -F``; only they are parsed in Python."""
    if not os.access(path, os.R_OK):
        open(path, "rb").close()  # raises the same OSError the pure scanner would
    argv = [grep, "-a", "-n", "-F"] + [a for n in NEEDLES for a in ("-e", n.decode())] + ["--", path]
    sink = _Sink(source, file_index)
    # Lines are counted by wc on the other core while grep runs (both SIMD memchr loops;
    # counting in Python would cost more than grep itself).
    wc = subprocess.Popen([wc_bin, "-l", "--", path], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          env=_TOOL_ENV, cwd="/")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_TOOL_ENV, cwd="/")
    assert proc.stdout is not None
    carry = b""
    while True:
        chunk = proc.stdout.read(1 << 20)
        buf = carry + chunk if carry else chunk
        parts = buf.split(b"\n")
        carry = parts.pop() if chunk else b""
        for rec in parts:
            num, _, line = rec.partition(b":")
            if num.isdigit():
                sink.line(_window(line), int(num))
        if not chunk:
            break
    err = proc.stderr.read() if proc.stderr else b""
    rc = proc.wait()
    counted = wc.communicate()[0].split()[:1]
    if rc > 1:  # 1 = no line matched
        raise OSError(f"grep exit {rc}: {err.decode('utf-8', 'replace').strip()[:200]}")
    sink.stats.bytes = os.path.getsize(path)
    last = _last_byte(path)
    if not counted or not counted[0].isdigit():
        raise OSError(f"wc -l gave no count for {path}")
    sink.stats.lines = int(counted[0]) + (1 if last and last != b"\n" else 0)
    if progress is not None:
        progress(source, sink.stats.bytes)
    return sink.events, sink.stats


def scan(path: str, file_index: int = 0, source: Optional[str] = None,
         progress: Optional[Callable[[str, int], None]] = None,
         prefilter: bool = True) -> Tuple[List[LogEvent], ScanStats]:
    """All events in one log file, in file order. Raises OSError when the file cannot be read.

    ``prefilter=False`` forces the pure-Python scanner (gzip files always use it)."""
    source = source or path
    grep, wc = grep_binary(), _binary(WC_PATHS)
    if grep and wc and prefilter and not _is_gzip(path):
        return _scan_grep(grep, wc, path, file_index, source, progress)
    sink = _Sink(source, file_index)
    stats = sink.stats
    lineno = 1
    carry = last = b""
    with open_log(path) as fh:
        while True:
            block = fh.read(BLOCK_BYTES)
            stats.bytes += len(block)
            last = block[-1:] or last
            buf = carry + block if carry else block
            if not block:
                data, carry = buf, b""
            else:
                cut = buf.rfind(b"\n") + 1
                if cut == 0 and len(buf) <= MAX_CARRY_BYTES:
                    carry = buf
                    continue
                cut = cut or len(buf)  # an over-long line is split; its line number stays
                data, carry = buf[:cut], buf[cut:]
            hits = _block_hits(data) if data else {}
            pos = 0
            for start in sorted(hits):
                lineno += data.count(b"\n", pos, start)
                pos = start
                end = data.find(b"\n", start)
                end = len(data) if end == -1 else end
                lo = max(start, hits[start] - MAX_LINE_BYTES // 2)
                sink.line(data[lo:min(end, lo + MAX_LINE_BYTES)], lineno)
            lineno += data.count(b"\n", pos)
            if progress is not None:
                progress(source, stats.bytes)
            if not block:
                break
    stats.lines = lineno - 1 + (1 if last and last != b"\n" else 0)
    return sink.events, stats


def grep_pattern() -> str:
    """The needles as one POSIX ERE, so a benchmark can run ``grep -E`` on the same signatures."""
    return "|".join(re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", n.decode()) for n in NEEDLES)


def scan_many(paths: Iterable[str], progress: Optional[Callable[[str, int], None]] = None
              ) -> Tuple[List[LogEvent], Dict[str, Dict[str, object]]]:
    """Events from every readable path, and a per-path account of what was read or why not."""
    events: List[LogEvent] = []
    sources: Dict[str, Dict[str, object]] = {}
    for i, p in enumerate(paths):
        try:
            evs, st = scan(p, file_index=i, progress=progress)
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            sources[p] = {"read": False, "error": f"{type(e).__name__}: {e}"}
            continue
        events.extend(evs)
        sources[p] = {"read": True, "bytes": st.bytes, "lines": st.lines, "events": len(evs)}
        if st.dropped_events:
            sources[p]["dropped_events"] = st.dropped_events
    return events, sources
