"""Safe, fast reading of job logs (Slurm stdout/stderr, torchrun, NCCL_DEBUG, kernel log copies).

Logs of long jobs reach gigabytes and may hold binary garbage, NUL bytes, invalid UTF-8,
megabyte-long lines or be gzip-compressed. Reading is therefore bytes-first: GNU ``grep -F``
(absolute path, LC_ALL=C, ``-a`` for binary garbage, cwd "/", so paths are made absolute first)
finds the lines holding any literal needle of the failure catalog (:mod:`.catalog`) at about ten
times the speed of Python, and only those lines are parsed here; a gzip log is decompressed into
grep's stdin. Machines without grep use the pure-Python scanner, which searches each block with
``bytes.find`` (C speed, no regex engine, but one pass per needle). Both paths feed the same line
parser, and a test holds them to the same events. Nothing here judges; :mod:`.rules` does.
"""
from __future__ import annotations

import calendar
import gzip
import os
import re
import subprocess
import threading
import zlib
from dataclasses import dataclass, field
from typing import IO, Callable, Dict, Iterable, List, Optional, Tuple

from . import catalog
from .catalog import Entry
from .decoration import strip_ansi, strip_ansi_bytes, undecorate
from .model import LogEvent

BLOCK_BYTES = 4 << 20
MAX_LINE_BYTES = 16 << 10   # a line is cut to this window around the hit
MAX_CARRY_BYTES = 1 << 20   # a "line" longer than this is split (garbage without newlines)
COLOUR_SNIFF_BYTES = 64 << 10  # a log with an escape code in this head is read without its colour codes
MAX_EVENTS_PER_KIND = 5000  # keeps memory bounded on pathological logs; the rest is counted
GREP_PATHS = ("/usr/bin/grep", "/bin/grep")
WC_PATHS = ("/usr/bin/wc", "/bin/wc")
_TOOL_ENV = {"LC_ALL": "C", "PATH": "/usr/bin:/bin"}


@dataclass(frozen=True)
class _Index:
    """The catalog as the scanner needs it: needles to search the bytes for, and per entry its gate.

    ``exact`` needles are compared as written, ``folded`` ones (entries marked ``nocase``) against
    the ASCII-lower-cased bytes; a line is a candidate when it holds either kind."""

    entries: Tuple[Entry, ...]
    exact: Tuple[bytes, ...]
    folded: Tuple[bytes, ...]
    gates: Tuple[Tuple[Entry, Tuple[str, ...]], ...]


def _index(entries: Tuple[Entry, ...]) -> _Index:
    exact = sorted({n.encode() for e in entries if not e.nocase for n in e.needles})
    folded = sorted({n.lower().encode() for e in entries if e.nocase for n in e.needles})
    gates = tuple((e, tuple(n.lower() if e.nocase else n for n in e.needles)) for e in entries)
    return _Index(entries, tuple(exact), tuple(folded), gates)


# Needles should be long and shared between entries: each distinct needle costs one pass over
# every block in the pure-Python scanner, and a short needle ending in a common letter
# (b"by peer") scans 10x slower than a long one.
INDEX = _index(catalog.entries())
NEEDLES: Tuple[bytes, ...] = INDEX.exact + INDEX.folded


def _holds_needle(raw: bytes) -> bool:
    """Whether a line holds an exact needle, or a folded one in any ASCII case (grep -i gives a superset)."""
    if any(n in raw for n in INDEX.exact):
        return True
    low = raw.lower()
    return any(n in low for n in INDEX.folded)


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


def _special(fields: Dict[str, object]) -> Tuple[Optional[str], Optional[int], Optional[str]]:
    """Pop the fields that say where: ``node``/``node_*`` (first with a value), ``rank``, ``gpu``."""
    node = None
    for k in [k for k in fields if k == "node" or k.startswith("node_")]:
        v = fields.pop(k)
        node = node or str(v)
    rank = fields.pop("rank", None)
    gpu = fields.pop("gpu", None)
    return node, (int(rank) if isinstance(rank, int) else None), (None if gpu is None else str(gpu))


def parse_line(text: str, source: str, line: int, file_index: int = 0,
               year_hint: Optional[int] = None) -> Tuple[List[LogEvent], Optional[int]]:
    """Events for one decoded line (usually none or one: one per catalog entry that matches), and the
    year it revealed."""
    events: List[LogEvent] = []
    year_seen: Optional[int] = None
    shown = strip_ansi(text)  # the evidence keeps the rank label, not the colours; a collector's stamp is a time
    body, label_rank = undecorate(shown)  # what the entries' regexes are written for
    low = body.lower()
    for entry, needles in INDEX.gates:
        hay = low if entry.nocase else body
        if not any(n in hay for n in needles):
            continue
        m = entry.regex.search(body)
        if not m:
            continue
        if not events:
            t, year_seen = parse_time(shown, year_hint)
        fields = _int_fields(m.groupdict())
        node, rank, gpu = _special(fields)
        pm = _NCCL_PREFIX.search(body)
        if pm:
            node = node or pm["host"]
            gpu = gpu or pm["dev"]
        sm = None if node else _SYSLOG_HOST.match(body)
        if sm:
            node = sm["host"]
        if rank is None:
            rm = _RANK.search(text)
            rank = int(rm["rank"]) if rm else label_rank
        events.append(LogEvent(entry.id, source, line, shown.strip()[:400], t, node, rank, gpu, fields, file_index))
    return events, year_seen


def open_log(path: str) -> IO[bytes]:
    """A binary stream of the log; gzip is recognized by its magic bytes, not the name. Closing it
    closes the file (a GzipFile over a ``fileobj`` would leave that open: a descriptor per read log
    in a long-lived MCP server)."""
    fh = open(path, "rb")
    magic = fh.read(2)
    fh.seek(0)
    if magic == b"\x1f\x8b":
        fh.close()
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return fh


@dataclass
class ScanStats:
    bytes: int = 0
    lines: int = 0
    candidate_lines: int = 0
    dropped_events: Dict[str, int] = field(default_factory=dict)


def _find_all(data: bytes, needles: Tuple[bytes, ...], hits: Dict[int, int]) -> None:
    for needle in needles:
        i = data.find(needle)
        while i != -1:
            start = data.rfind(b"\n", 0, i) + 1
            if start not in hits or i < hits[start]:
                hits[start] = i
            end = data.find(b"\n", i)
            if end == -1:
                break
            i = data.find(needle, end)


def _block_hits(data: bytes) -> Dict[int, int]:
    """{line start: first hit offset} for lines holding any needle (folded ones in any ASCII case)."""
    hits: Dict[int, int] = {}
    _find_all(data, INDEX.exact, hits)
    if INDEX.folded:
        _find_all(data.lower(), INDEX.folded, hits)  # bytes.lower() is ASCII-only: offsets stay
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
    low = line.lower()
    found = [line.find(n) for n in INDEX.exact] + [low.find(n) for n in INDEX.folded]
    hit = min((i for i in found if i != -1), default=0)
    lo = max(0, hit - MAX_LINE_BYTES // 2)
    return line[lo:lo + MAX_LINE_BYTES]


def _coloured(path: str) -> bool:
    """True when the log's head holds escape codes (a coloured log is coloured from its start)."""
    with open_log(path) as fh:
        try:
            return b"\x1b" in fh.read(COLOUR_SNIFF_BYTES)
        except (EOFError, zlib.error):
            return False  # a broken gzip: the scan reports it


def _last_byte(path: str) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell() == 0:
            return b""
        fh.seek(-1, os.SEEK_END)
        return fh.read(1)


def _grep_argv(grep: str, target: str) -> List[str]:
    """``grep -a -n -F`` over every needle, with ``-i`` when some entry folds case (then a superset
    of the candidate lines, narrowed per line by :func:`_holds_needle`)."""
    fold = ["-i"] if INDEX.folded else []
    return [grep, "-a", "-n", "-F", *fold] + [a for n in NEEDLES for a in ("-e", n.decode())] + ["--", target]


class _Feeder(threading.Thread):
    """Decompresses a gzip log (and takes the colour codes out of a coloured one) into grep's stdin,
    and counts its bytes, lines and last byte."""

    def __init__(self, path: str, sink: IO[bytes], colour: bool = False):
        super().__init__(daemon=True)
        self.path, self.sink, self.colour = path, sink, colour
        self.bytes = self.newlines = 0
        self.last = b""
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            with open_log(self.path) as fh:
                while True:
                    block = fh.read(BLOCK_BYTES)
                    if not block:
                        break
                    self.bytes += len(block)
                    self.newlines += block.count(b"\n")
                    self.last = block[-1:]
                    self.sink.write(strip_ansi_bytes(block) if self.colour else block)
        except (OSError, EOFError, zlib.error) as e:  # a broken pipe, or a corrupt gzip stream
            self.error = e if isinstance(e, OSError) else OSError(f"{type(e).__name__}: {e}")
        finally:
            try:
                self.sink.close()
            except OSError:
                pass


def _scan_grep(grep: str, wc_bin: str, path: str, file_index: int, source: str,
               progress: Optional[Callable[[str, int], None]], gz: bool = False,
               colour: bool = False) -> Tuple[List[LogEvent], ScanStats]:
    """The candidate lines from ``grep``; only they are parsed in Python. A gzip log is decompressed
    here and piped through grep, so compressed logs get the same speed; so is a coloured one, without
    its escape codes (they split the needles: ``NCCL \x1b[33mWARN``)."""
    if not os.access(path, os.R_OK):
        open(path, "rb").close()  # raises the same OSError the pure scanner would
    sink = _Sink(source, file_index)
    wc = feeder = None
    if gz or colour:
        proc = subprocess.Popen(_grep_argv(grep, "-"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=_TOOL_ENV, cwd="/")
        assert proc.stdin is not None
        feeder = _Feeder(path, proc.stdin, colour)
        feeder.start()
    else:
        # Lines are counted by wc on the other core while grep runs (both SIMD memchr loops;
        # counting in Python would cost more than grep itself).
        wc = subprocess.Popen([wc_bin, "-l", "--", path], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              env=_TOOL_ENV, cwd="/")
        proc = subprocess.Popen(_grep_argv(grep, path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=_TOOL_ENV, cwd="/")
    assert proc.stdout is not None and proc.stderr is not None
    with proc:  # closes grep's pipes and reaps it, also when a line's parse raises
        carry = b""
        while True:
            chunk = proc.stdout.read(1 << 20)
            buf = carry + chunk if carry else chunk
            parts = buf.split(b"\n")
            carry = parts.pop() if chunk else b""
            for rec in parts:
                num, _, line = rec.partition(b":")
                if num.isdigit() and _holds_needle(line):
                    sink.line(_window(line), int(num))
            if not chunk:
                break
        err = proc.stderr.read()
    rc = proc.returncode
    if feeder is not None:
        feeder.join()
        if feeder.error is not None:
            raise feeder.error
        sink.stats.bytes = feeder.bytes
        sink.stats.lines = feeder.newlines + (1 if feeder.last and feeder.last != b"\n" else 0)
    if rc > 1:  # 1 = no line matched
        raise OSError(f"grep exit {rc}: {err.decode('utf-8', 'replace').strip()[:200]}")
    if wc is not None:
        counted = wc.communicate()[0].split()[:1]
        if not counted or not counted[0].isdigit():
            raise OSError(f"wc -l gave no count for {path}")
        last = _last_byte(path)
        sink.stats.bytes = os.path.getsize(path)
        sink.stats.lines = int(counted[0]) + (1 if last and last != b"\n" else 0)
    if progress is not None:
        progress(source, sink.stats.bytes)
    return sink.events, sink.stats


def scan(path: str, file_index: int = 0, source: Optional[str] = None,
         progress: Optional[Callable[[str, int], None]] = None,
         prefilter: bool = True) -> Tuple[List[LogEvent], ScanStats]:
    """All events in one log file, in file order. Raises OSError when the file cannot be read.

    ``prefilter=False`` forces the pure-Python scanner."""
    source = source or path
    path = os.path.abspath(path)  # grep and wc run with cwd "/"
    grep, wc = grep_binary(), _binary(WC_PATHS)
    colour = _coloured(path)
    if grep and wc and prefilter:
        return _scan_grep(grep, wc, path, file_index, source, progress, gz=_is_gzip(path), colour=colour)
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
            if colour:
                data = strip_ansi_bytes(data)  # no newline goes: the line numbers stay
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


def _ere(needle: str, fold: bool) -> str:
    out = []
    for ch in needle:
        if fold and ch.isalpha() and ch.isascii():
            out.append(f"[{ch.lower()}{ch.upper()}]")
        else:
            out.append(re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", ch))
    return "".join(out)


def grep_pattern() -> str:
    """The needles as one POSIX ERE (folded ones as ``[aA]`` classes), so a benchmark or a test can
    run ``grep -E`` on exactly the scanner's candidate lines."""
    return "|".join([_ere(n.decode(), False) for n in INDEX.exact] + [_ere(n.decode(), True) for n in INDEX.folded])


LOG_SUFFIXES = (".out", ".err", ".log", ".gz")


def expand_paths(paths: Iterable[str]) -> List[str]:
    """Absolute paths (the scanners run tools with cwd "/"); a directory stands for its ``*.out``,
    ``*.err``, ``*.log`` and ``*.gz`` regular files, in name order (itself when it has none, so the
    report says why nothing was read)."""
    out: List[str] = []
    for p in paths:
        a = os.path.abspath(p)
        if os.path.isdir(a):
            names = sorted(n for n in os.listdir(a) if n.endswith(LOG_SUFFIXES))
            files = [os.path.join(a, n) for n in names if os.path.isfile(os.path.join(a, n))]
            out += files or [a]
        else:
            out.append(a)
    return list(dict.fromkeys(out))


def structured_events(path: str, file_index: int) -> List[LogEvent]:
    """Events from the structured-output parsers (nvidia-smi -q, dcgmi, sinfo -R, ...) for one file.

    The parsers are a separate layer: when they are missing or fail on a file, triage goes on with
    the line scanner's events alone."""
    try:
        from .parsers import parse_file
    except ImportError:
        return []
    try:
        return list(parse_file(path, file_index))
    except Exception:  # noqa: BLE001 - a parser bug must never cost the whole triage
        return []


def scan_many(paths: Iterable[str], progress: Optional[Callable[[str, int], None]] = None
              ) -> Tuple[List[LogEvent], Dict[str, Dict[str, object]]]:
    """Events from every readable path, and a per-path account of what was read or why not."""
    events: List[LogEvent] = []
    sources: Dict[str, Dict[str, object]] = {}
    for i, p in enumerate(paths):
        if os.path.isdir(p):
            sources[p] = {"read": False, "error": "a directory without *.out, *.err, *.log or *.gz files"}
            continue
        try:
            evs, st = scan(p, file_index=i, progress=progress)
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            sources[p] = {"read": False, "error": f"{type(e).__name__}: {e}"}
            continue
        evs += structured_events(p, i)
        events.extend(evs)
        sources[p] = {"read": True, "bytes": st.bytes, "lines": st.lines, "events": len(evs)}
        if st.dropped_events:
            sources[p]["dropped_events"] = st.dropped_events
    return events, sources


# Error-looking lines, read only when no catalog entry matched (a second, bounded pass).
_ERRORISH = ("traceback (most recent", "error", "fatal", "exception", "failed", "failure", "panic",
             "abort", "segmentation fault", "core dumped", "killed", "interrupt")
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
# The exception line closes a traceback at column 0 (frames are indented), after an optional
# rank/host label ("[rank3]: ", "0: ", "node1: ").
_EXCEPTION = re.compile(r"^(?:\[rank\d+\]:\s?|[\w.-]+: )?(?P<exc>(?:[A-Za-z_]\w*\.)*[A-Z]\w*"
                        r"(?:Error|Exception|Interrupt|Failure|Exit))(?::\s|:?$)")
_ERROR = re.compile(r"\b(?:error|fatal|failed|failure|panic|abort(?:ed|ing)?|segmentation fault|core dumped|killed)\b",
                    re.IGNORECASE)
_NOT_ERROR = re.compile(r"\b(?:0|no) errors?\b|error[_-]?(?:rate|count|log|file)|errors?=0\b|ignore[_ -]?errors?"
                        r"|\berrors?\s*:\s*0\s*$"  # a counter at zero (nvidia-smi -q's "Correctable Error : 0")
                        r"|\balgbw\s+busbw\s+error\b"  # nccl-tests' column header (its "error" is a value deviation)
                        r"|NET/Plugin ?: Failed to find nccl\w+ symbol",  # NCCL probing its plugins' older API versions
                        re.IGNORECASE)
MAX_ERROR_LINES = 400


def grep_lines(path: str, needles: Iterable[str], fold: bool = True, limit: int = MAX_ERROR_LINES
               ) -> Iterable[Tuple[int, bytes]]:
    """(line number, line) of the first ``limit`` lines of ``path`` holding any of ``needles`` (literal;
    ``fold``: case-insensitive), through grep where it runs, else read here."""
    needles = tuple(needles)
    grep = grep_binary()
    path = os.path.abspath(path)
    if grep and not _is_gzip(path):
        argv = [grep, "-a", "-n", "-F", "-m", str(limit)] + (["-i"] if fold else [])
        argv += [a for n in needles for a in ("-e", n)] + ["--", path]
        cp = subprocess.run(argv, capture_output=True, env=_TOOL_ENV, cwd="/", timeout=60)
        if cp.returncode > 1:
            raise OSError(f"grep exit {cp.returncode}: {cp.stderr.decode('utf-8', 'replace').strip()[:200]}")
        for rec in cp.stdout.split(b"\n"):
            num, _, line = rec.partition(b":")
            if num.isdigit():
                yield int(num), line[:MAX_LINE_BYTES]
        return
    keys = tuple(n.lower().encode() if fold else n.encode() for n in needles)
    found = 0
    with open_log(path) as fh:
        for n, line in enumerate(fh, 1):
            low = line[:MAX_LINE_BYTES].lower() if fold else line[:MAX_LINE_BYTES]
            if any(k in low for k in keys):
                yield n, line[:MAX_LINE_BYTES]
                found += 1
                if found >= limit:
                    return


def error_lines(path: str, file_index: int = 0, source: Optional[str] = None) -> List[LogEvent]:
    """The first traceback's exception line (kind ``first_exception``) and the first error/fatal line
    (``first_error``) of one log: what an SRE reads first when no known shape matched."""
    source = source or path
    out: List[LogEvent] = []
    in_traceback = False
    want = {"first_exception", "first_error"}
    year: Optional[int] = None
    for n, raw in grep_lines(path, _ERRORISH):
        line = raw.replace(b"\x00", b"").decode("utf-8", "replace").rstrip("\r\n")
        full, label_rank = undecorate(line)
        text = full.strip()
        kind = None
        m = _EXCEPTION.search(full)
        if _TRACEBACK.search(text):
            in_traceback = True
        elif in_traceback and "first_exception" in want and m:
            kind = "first_exception"
        # An exception line pasted without its traceback ("RuntimeError: CUDA out of memory") is an error line too.
        if kind is None and "first_error" in want and (_ERROR.search(text) or (m and not in_traceback)) \
                and not _NOT_ERROR.search(text):
            kind = "first_error"
        if kind is None:
            continue
        t, y = parse_time(text, year)
        year = y or year
        fields: Dict[str, object] = {"exception": m["exc"]} if m and kind == "first_exception" else {}
        rm = _RANK.search(line)
        out.append(LogEvent(kind, source, n, strip_ansi(line).strip()[:400], t, None,
                            int(rm["rank"]) if rm else label_rank, None,
                            fields, file_index))
        want.discard(kind)
        if not want:
            break
    return out
