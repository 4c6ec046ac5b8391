"""The field's vocabulary (``lexicon.toml``): weighted words that point a failure line to a category.

The catalog names failure shapes exactly; the lexicon only says which way a line leans
("throttled" → thermal_power, "Permission denied" → security), so that when no shape matched,
:mod:`.rules.fallback` can still offer a low-confidence best guess and say which words led to it.
Knowledge stays in the TOML; this module loads and validates it, finds its words in a line, and
reads the lines of a log that may hold them (a bounded second pass, only when nothing was found:
the lines around the first errors, or the head of a paste without any error line).
"""
from __future__ import annotations

import functools
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Pattern, Sequence, Tuple

from .decoration import undecorate
from .model import CATEGORIES, LogEvent
from .tables import tables

PATH = Path(__file__).resolve().parent / "lexicon.toml"
KIND = "lexicon_hit"
WHOLE_KIND = "lexicon_text_hit"
"""The same hits over the head of a log that has error lines: the fallback's second opinion when
the words near those lines do not lead (the error line is generic, the cause is said elsewhere)."""
MAX_HITS = 2000           # hit lines kept per file (bounded memory on pathological logs)
HEAD_BYTES = 4 << 20      # what is read of a log without any error line (the parsers read as much)
WINDOW = 40               # lines read on either side of a first error line
MAX_LINE_CHARS = 4096
_KEYS = {"category": str, "weight": float, "terms": list, "sources": list, "examples": list}
_OPTIONAL = {"names_cause": bool, "near_error": bool}
"""``names_cause = true``: the group's words name a cause even far from any error line (a setting the
job chose), so that over a bare communication symptom they may say what lies behind it (rules.fallback.cause_lean).
``near_error = true``: the group's words count only on the lines near a first error (a part named in a failure
says more than the same part named in a pasted status table or an admin's drain reason)."""


class LexiconError(ValueError):
    """A lexicon group that cannot be used; the message names ``lexicon.toml:group N:key``."""


@dataclass(frozen=True)
class Term:
    text: str
    category: str
    weight: float
    names_cause: bool = False
    near_error: bool = False


@dataclass(frozen=True)
class Group:
    category: str
    weight: float
    terms: Tuple[str, ...]
    sources: Tuple[str, ...]
    examples: Tuple[str, ...]
    names_cause: bool = False
    near_error: bool = False


@dataclass(frozen=True)
class Lexicon:
    groups: Tuple[Group, ...]
    by_word: Dict[str, Tuple[Term, ...]]
    """A matched term's text (lower case, ``*`` kept) -> its weights per category."""
    checks: Tuple[Tuple[str, str, Pattern[str]], ...]
    """(literal, term, its regex), longest term first: a line is searched with a term's regex only when
    it holds the literal (one big alternation costs Python's regex engine ~20 ms a line)."""
    needles: Tuple[str, ...]
    """The terms as literals (lower case, without ``*``) for grep -F -i: a superset of the lines holding one."""


def _pattern(term: str) -> str:
    """A term as regex: whole word/phrase (edges bounded only where they are word characters). A phrase is
    matched as written, single-spaced, like its grep needle."""
    prefix = term.endswith("*")
    stem = term[:-1] if prefix else term
    body = re.escape(stem)
    # A word right after "/" is a path component ("/root/.cache", "configs/"), not what the line says.
    head = r"(?<![a-z0-9_/])" if re.match(r"\w", stem) else ""
    # Digits may follow a word: sensor and device labels number it ("power1", "fan2", "gpu0").
    tail = "" if prefix or not re.search(r"\w$", stem) else r"(?![a-z_])"
    return head + body + (r"\w*" if prefix else "") + tail


def _group(raw: Dict[str, object], index: int) -> Group:
    where = f"lexicon.toml:group {index}"
    for key, typ in _KEYS.items():
        value = raw.get(key)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) if typ is float else isinstance(value, typ)
        if not ok:
            raise LexiconError(f"{where}:{key}: missing or not a {typ.__name__}")
        if typ is list and (not value or not all(isinstance(v, str) and v.strip() for v in value)):  # type: ignore[union-attr]
            raise LexiconError(f"{where}:{key}: must be a non-empty list of non-empty strings")
    extra = sorted(set(raw) - set(_KEYS) - set(_OPTIONAL))
    if extra:
        raise LexiconError(f"{where}:{extra[0]}: unknown key (known: {', '.join(list(_KEYS) + list(_OPTIONAL))})")
    for key, typ in _OPTIONAL.items():
        if key in raw and not isinstance(raw[key], typ):
            raise LexiconError(f"{where}:{key}: not a {typ.__name__}")
    if raw["category"] not in CATEGORIES:
        raise LexiconError(f"{where}:category: {raw['category']!r} not one of {', '.join(CATEGORIES)}")
    if not 0 < float(raw["weight"]) <= 5:  # type: ignore[arg-type]
        raise LexiconError(f"{where}:weight: must be in (0, 5]")
    terms = tuple(str(t).lower() for t in raw["terms"])  # type: ignore[union-attr]
    bad = [t for t in terms if t != t.strip() or "*" in t[:-1] or len(t.rstrip("*")) < 2]
    if bad:
        raise LexiconError(f"{where}:terms: {bad[0]!r}: a term is 2+ characters, '*' only at its end")
    if any(not s.startswith("https://") for s in raw["sources"]):  # type: ignore[union-attr]
        raise LexiconError(f"{where}:sources: every source is an https:// URL")
    return Group(str(raw["category"]), float(raw["weight"]), terms,  # type: ignore[arg-type]
                 tuple(raw["sources"]), tuple(raw["examples"]), bool(raw.get("names_cause", False)),  # type: ignore[arg-type]
                 bool(raw.get("near_error", False)))


def load(path: Path = PATH) -> Lexicon:
    """The lexicon at ``path``, validated; LexiconError names the group and key of any mistake."""
    groups = tuple(_group(g, i) for i, g in enumerate(tables(path, "group", LexiconError), 1))
    by_word: Dict[str, List[Term]] = {}
    for g in groups:
        for t in g.terms:
            if any(x.category == g.category for x in by_word.get(t, [])):
                raise LexiconError(f"{path.name}: term {t!r} appears twice under {g.category}")
            by_word.setdefault(t, []).append(Term(t, g.category, g.weight, g.names_cause, g.near_error))
    # Longest first, so that a phrase wins over a word inside it ("cuda out of memory" over "memory").
    words = sorted(by_word, key=lambda t: (-len(t), t))
    checks = tuple((t.rstrip("*"), t, re.compile(_pattern(t), re.IGNORECASE)) for t in words)
    needles = tuple(sorted({t.rstrip("*") for t in words}))
    return Lexicon(groups, {t: tuple(v) for t, v in by_word.items()}, checks, needles)


@functools.lru_cache(maxsize=None)
def lexicon() -> Lexicon:
    """The package's lexicon, loaded once per process."""
    return load()


_FRAME = re.compile(r'^(?:\S+:\s?)?\s*File "[^"]*", line \d+')
_DUMP_HEADER = re.compile(r'^\s*(?:Thread (?:0x[0-9A-Fa-f]+|\d+) \([\w+ ]+\)(?::\s*"[^"]*")?\s*$'
                          r'|(?:Current )?[Tt]hread 0x[0-9A-Fa-f]+ \(most recent call first\):'
                          r'|Process \d+: |Python v\d)')
"""A stack dump's own headers (py-spy's ``Thread 46 (idle): "MainThread"``, ``Process N:``, ``Python v3``;
faulthandler's ``Thread 0x... (most recent call first):``): the dump's layout, not thread exhaustion."""
_TABLE_HEADER = re.compile(r"^\s*\|?\s*(?:NVIDIA-SMI \d|GPU\s+Name\s|Fan\s+Temp\s+Perf|Processes:|GPU\s+(?:GI\s+CI\s+)?PID\s"
                           r"|(?:GPU|Device)\s+(?:Node\s+IDs\s+)?Temp\s)"
                           r"|^\s*(?:(?:index|name|uuid|timestamp|[a-z_]+(?:\.[a-z_]+)+)(?: \[[^\]]*\])?,\s*){2,}")
"""A GPU table's own column headers (nvidia-smi's ``Driver Version`` / ``Volatile Uncorr. ECC`` / ``Fan  Temp``
rows, rocm-smi's ``GPU  Temp  AvgPwr ... Fan``, ``nvidia-smi --query-gpu``'s CSV header ``index, name,
temperature.gpu, ...``): printed by every table, healthy or not, so no signal."""
_KEY = re.compile(r"[A-Z][a-z]+(?:[A-Z][a-z0-9]*)+=")
"""A CamelCase ``Key=`` of Slurm's node and job records (``ThreadsPerCore=1``, ``CoresPerSocket=``): a field's
name, which a prefix term (``thread*``) must not read as the thing."""
_DUMP_FRAME = re.compile(r"^\s*(?P<func>[\w.<>]+) \([^()\s]+:\d+\)\s*$")
"""A py-spy frame, ``    wait (threading.py:324)`` (its indent may be stripped already): its function names
what a thread does, its file path does not."""
_ABSENT = re.compile(r"[\w ]{0,12}?\s*(?:[:=]\s*(?:false|no|none|off|disabled|inactive|not active|n/a)"
                     r"|\|\s*(?:pass|skip)(?:\s*-\s*all)?\s*)"
                     r"(?=\s*(?:$|[,;)\]|]))", re.IGNORECASE)
"""A label whose value (the whole field) says the thing is absent (``Thermal HW: false``, ``HW Slowdown :
Not Active``), or a result table's cell that says its test passed or did not run (dcgmi's ``| Page Retirement
| Pass |``): a status table's field names the condition it does NOT report (``NET/IB : No route`` is no value)."""
_NO_READING = re.compile(r"\s*[:=]\s*-?0+(?:\.0+)?\s*°?\s*C\b", re.IGNORECASE)
"""A temperature that reads exactly zero degrees: a sensor that reports nothing, not heat."""
_TEMPERATURE = ("temperature", "temp")
_SIGNAL = re.compile(r"\bsignal:?\s*(\d+|killed|bus error|segmentation fault|terminated|interrupt|aborted)\b"
                     r"|\bSIG(HUP|INT|QUIT|ILL|TRAP|ABRT|BUS|FPE|KILL|SEGV|PIPE|ALRM|TERM|USR1|USR2|XCPU|XFSZ)\b",
                     re.IGNORECASE)
"""A signal named on a line, by number (``Killed by signal 2``), by name (``SIGTERM``) or by its description
(``killed by signal: Bus error``, as strsignal(3) words it)."""
_DENIALS = ("permission denied", "eacces", "errno 13", "permissionerror", "access denied", "operation not permitted",
            "not permitted", "eperm")
"""Words that say access was refused, not to what: the line's object decides (``shm_open failed : Permission
denied`` is the host's shared-memory set-up; ``Permission denied (publickey)`` stays a credential)."""
OBJECT_WEIGHT = 2.0  # a word that names what was denied: a concrete thing (shm, nvidia-container-cli), not a layer
_KILL_WORDS = ("killed",)
"""Words that mean the kernel's or the scheduler's SIGKILL only while the line names no other signal:
``Killed by signal 2`` is an interrupt (Ctrl-C, SIGINT), ``killed by signal 15`` a termination."""


def _other_signal(text: str) -> bool:
    """True when ``text`` names a signal and none of those is SIGKILL (9)."""
    named = [(m.group(1) or m.group(2)).upper() for m in _SIGNAL.finditer(text)]
    return bool(named) and not any(n in ("9", "KILL", "KILLED") for n in named)


def words_in(text: str, lex: Optional[Lexicon] = None) -> List[str]:
    """The lexicon terms in ``text`` (as written in the lexicon), in order of appearance, each once; none
    for a traceback's ``File "...", line N`` frame lines (paths and function names are not the failure)
    nor for a stack dump's thread and process headers (the frames under them do count), nor for a GPU table's
    column headers."""
    lex = lex or lexicon()
    if _FRAME.match(text) or _DUMP_HEADER.match(text) or _TABLE_HEADER.match(text):
        return []
    frame = _DUMP_FRAME.match(text)
    if frame:
        text = frame.group("func")
    low = text.lower()
    taken: List[Tuple[int, int]] = []
    found: List[Tuple[int, str]] = []
    for literal, term, rx in lex.checks:
        if literal not in low:
            continue
        for m in rx.finditer(text):
            a, b = m.span()
            if term.endswith("*") and _KEY.match(text, a):
                continue
            if not any(a < y and x < b for x, y in taken):  # a longer term already holds these characters
                taken.append((a, b))
                if all(w != term for _, w in found) and not _denied(text, b, term):
                    found.append((a, term))
    if found and any(w in _KILL_WORDS for _, w in found) and _other_signal(text):
        found = [(a, w) for a, w in found if w not in _KILL_WORDS]
    if any(w in _DENIALS for _, w in found):
        found = _denial_object(low, found, lex)
    return [w for _, w in sorted(found)]


def _denial_object(low: str, found: List[Tuple[int, str]], lex: Lexicon) -> List[Tuple[int, str]]:
    """A line that refuses access to a thing another category names (also as part of a call or a path:
    ``shm_open``, ``/dev/shm``): that thing's word instead of the denial words; else the line as found."""
    tokens = set(re.split(r"[^a-z0-9]+", low))
    objects = [t for t in tokens if any(x.category != "security" and x.weight >= OBJECT_WEIGHT and not x.names_cause
                                          for x in lex.by_word.get(t, ()))]
    if not objects and not any(any(x.category != "security" and x.weight >= OBJECT_WEIGHT for x in lex.by_word[w])
                               for _, w in found):
        return found
    kept = [(a, w) for a, w in found if w not in _DENIALS]
    at = min(a for a, w in found if w in _DENIALS)
    return kept + [(at, t) for t in sorted(objects) if all(w != t for _, w in kept)]


def _denied(text: str, end: int, term: str) -> bool:
    """The line's own value says the term's condition is absent: a false flag, a zero-degree temperature."""
    rest = text[end:end + 40]
    return bool(_ABSENT.match(rest)) or (term in _TEMPERATURE and bool(_NO_READING.match(rest)))


def scores(words: Iterable[str], lex: Optional[Lexicon] = None) -> Dict[str, float]:
    """Category -> summed weight of ``words``, read as free text (no error line: ``near_error`` terms do not count)."""
    lex = lex or lexicon()
    out: Dict[str, float] = {}
    for w in words:
        for t in lex.by_word.get(w, ()):
            if not t.near_error:
                out[t.category] = out.get(t.category, 0.0) + t.weight
    return out


def leaning(text: str, minimum: float = 3.0, lead: float = 1.5) -> Optional[Tuple[str, List[str]]]:
    """(category, its words) when ``text``'s words point clearly to one category: its weight at least
    ``minimum`` and ``lead`` times the next one's. For free text such as an admin's drain reason."""
    words = words_in(text)
    s = scores(words)
    ranked = sorted(s.items(), key=lambda kv: -kv[1])
    if not ranked or ranked[0][1] < minimum or (len(ranked) > 1 and ranked[0][1] < lead * ranked[1][1]):
        return None
    cat = ranked[0][0]
    return cat, [w for w in words if any(t.category == cat for t in lexicon().by_word[w])]


_GREP_PATHS = ("/usr/bin/grep", "/bin/grep")
_SED_PATHS = ("/usr/bin/sed", "/bin/sed")
_ENV = {"LC_ALL": "C", "PATH": "/usr/bin:/bin"}


def _tool(paths: Sequence[str]) -> Optional[str]:
    return next((g for g in paths if os.access(g, os.X_OK)), None)


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def _head_lines(path: str, needles: Sequence[str], limit: int) -> Iterator[Tuple[int, bytes]]:
    """(line number, bytes) of the lines in the first ``limit`` bytes that hold a needle in any case:
    grep -F -i over the head piped in, else a pure-Python pass."""
    from .logs import open_log  # lazy: logs imports the catalog, not this module

    with open_log(path) as fh:
        head = fh.read(limit)
    head = head[:head.rfind(b"\n") + 1] or head
    grep = _tool(_GREP_PATHS)
    if grep:
        argv = [grep, "-a", "-n", "-i", "-F"] + [a for n in needles for a in ("-e", n)] + ["--", "-"]
        cp = subprocess.run(argv, input=head, capture_output=True, env=_ENV, cwd="/", timeout=60)
        for rec in cp.stdout.split(b"\n"):
            num, _, line = rec.partition(b":")
            if num.isdigit():
                yield int(num), line
        return
    low = tuple(n.encode() for n in needles)
    for n, line in enumerate(head.split(b"\n"), 1):
        if any(k in line.lower() for k in low):
            yield n, line


def _ranges(near: Sequence[int], window: int) -> List[Tuple[int, int]]:
    """The line ranges within ``window`` of the anchors, overlapping ones merged."""
    out: List[Tuple[int, int]] = []
    for a in sorted(set(near)):
        lo, hi = max(1, a - window), a + window
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _range_lines(path: str, ranges: List[Tuple[int, int]]) -> Iterator[Tuple[int, bytes]]:
    """(line number, bytes) of every line in ``ranges``: sed prints them (and quits after the last;
    it counts lines at memchr speed), else a pure-Python pass that stops there too."""
    from .logs import open_log

    last = ranges[-1][1]
    sed = _tool(_SED_PATHS)
    if sed and not _is_gzip(path):
        script = ";".join(f"{a},{b}{{=;p}}" for a, b in ranges) + f";{last}q"
        cp = subprocess.run([sed, "-n", script, "--", path], capture_output=True, env=_ENV, cwd="/", timeout=60)
        out = cp.stdout.split(b"\n")
        for num, line in zip(out[0::2], out[1::2]):
            if num.isdigit():
                yield int(num), line
        return
    with open_log(path) as fh:
        for n, line in enumerate(fh, 1):
            if n > last:
                return
            if any(a <= n <= b for a, b in ranges):
                yield n, line.rstrip(b"\n")


def hits(path: str, file_index: int = 0, near: Sequence[int] = (), window: int = WINDOW,
         source: Optional[str] = None, kind: str = KIND) -> List[LogEvent]:
    """``kind`` events (fields: ``words``) for the lines of one log holding lexicon terms:
    those within ``window`` lines of a line in ``near`` (the first error lines), or, when ``near``
    is empty (no error-looking line at all: a pasted table or status output; or the whole-log
    second opinion, WHOLE_KIND), the first MAX_HITS of them in the first HEAD_BYTES (a long log
    without a single error line is a healthy run)."""
    lex = lexicon()
    source = source or path
    path = os.path.abspath(path)
    lines = _range_lines(path, _ranges(near, window)) if near else _head_lines(path, lex.needles, HEAD_BYTES)
    out: List[LogEvent] = []
    for n, raw in lines:
        text = undecorate(raw[:MAX_LINE_CHARS * 4].replace(b"\x00", b"").decode("utf-8", "replace"))[0]
        text = text.strip()[:MAX_LINE_CHARS]
        words = words_in(text, lex)
        if not words:
            continue
        out.append(LogEvent(kind, source, n, text[:400], None, None, None, None, {"words": words}, file_index))
        if len(out) >= MAX_HITS:
            break
    return out
