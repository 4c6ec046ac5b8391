"""The last-resort guess: a word prior learned from the dev corpus (``prior.json``), when nothing else named a category.

The catalog and the lexicon name what people wrote down; a log of a shape they never saw often still
speaks its category's vocabulary ("munge", "throttle", "oom-kill", "ibv_poll_cq"). ``bench/train_prior.py``
learns, from dev cases only, a tf-idf centroid per category: each dev log is the unit vector of its
distinct words weighted by their idf, a category's centroid is the mean of its logs' vectors cut to its
top words. Here a log's distinct words are read the way the lexicon reads a log (its head, bounded; bytes
that are no word are skipped, so binary garbage only yields fewer words), its vector is compared with
each centroid by cosine, and a guess is made only when one category leads the next by PriorTable.margin (by the
smaller BESIDE_AN_ERROR when it names the category of an error line nothing else named).
Its confidence (CONFIDENCE) is below every rule's, and correlate never ranks it over a real finding
(fallback.is_fallback).
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet, Iterable, List, Optional, Tuple

from ...model import Verdict
from ..decoration import strip_ansi_bytes
from ..model import CATEGORIES, LogEvent, TriageFinding, from_events

PATH = Path(__file__).resolve().parent.parent / "prior.json"
KIND = "prior_words"
ID = "log.prior"
CONFIDENCE = 0.15         # a guess from words alone: below the first-error finding's 0.2
HEAD_BYTES = 1 << 20      # what is read of a log: bounded time (~10 ms a MiB), like the lexicon's head
MAX_TOKEN = 40
SHOWN = 5                 # words named in a finding
MIN_WORDS = 3
"""Known words a guess needs: one word ("step" of "step 1 ok") is a coincidence, not a lead (5-fold CV within dev,
541 cases: 297 right of 369 answered, against 298 of 370 with one); two words every run prints ("step", "loss" of a
clean training log) are none either (687 dev cases, 2026-12-02: no dev answer rests on fewer than 3)."""
_WORD_BYTES = b"abcdefghijklmnopqrstuvwxyz0123456789_-"
_SPLIT = bytes(c if c in _WORD_BYTES else 32 for c in range(256))
"""Every byte that cannot be part of a word becomes a space (after ASCII lower-casing): binary-safe, C speed."""
_DIGITS = b"0123456789"
_HEXISH = b"0123456789abcdefx_"
STOP = frozenset(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
                  "mon", "tue", "wed", "thu", "fri", "sat", "sun", "utc", "gmt", "cst", "cet", "pst", "pdt",
                  "est", "edt", "am", "pm"))
"""Timestamps' words: they say which tool printed the line (syslog, journal), not what failed."""
_STOP_BYTES = frozenset(s.encode() for s in STOP)


def normalise(raw: bytes) -> Optional[str]:
    """A word as the prior knows it, or None for a case's incidental strings: digits are dropped
    (pids, counts, device indices: ``mlx5_0`` is ``mlx_``→``mlx``), a token with digits and a hyphen
    (host names, dates, UUIDs, versions) or with digits and only hex letters and x (addresses, ``0x7f3a``) is none,
    and so is a two-letter hex fragment (a PCI bus number, ``ba`` of ``0000:ba:00.0``)."""
    t = raw.strip(b"-_")
    if t.translate(None, _DIGITS) != t:
        if b"-" in t or not t.translate(None, _HEXISH):
            return None
        t = t.translate(None, _DIGITS).strip(b"-_")
    if not 2 <= len(t) <= MAX_TOKEN or t in _STOP_BYTES or (len(t) == 2 and not t.translate(None, _HEXISH)):
        return None
    return t.decode("ascii")


_HEX_TOKEN = b"0123456789abcdefx"
"""Bytes of a number, a hex digit string or ``0x...``: a token of these alone that is not all letters holds a digit,
and normalise makes no word of it either."""
_HEX_PAIRS = frozenset(bytes((a, b)) for a in b"abcdefx" for b in b"abcdefx")


_RARE_VALUES = (b"false", b"disabled", b"inactive", b"not active", b"n/a",
                b"0\xc2\xb0c", b"0.0\xc2\xb0c", b"0.00\xc2\xb0c", b"0 c", b"0.00 c")
"""Values that say a field's thing is absent, zero-degree temperatures included (a sensor that reads nothing,
as the lexicon's _NO_READING has it: ``Temperature: 0.00°C``)."""
_COMMON_VALUES = (b"no",)  # a word of prose too: only looked for right after ": " (nvidia-smi -q's "Pending : No")
_CELL_VALUES = (b"pass", b"skip")  # a result table's cell (dcgmi's "| Page Retirement | Pass |"): only after "| "
_SEPARATORS = (b":", b": ", b"=", b"= ")
_VALUE_END = frozenset(b" \t\r\n,;)]|")
_LABEL_STOPS = (b"\n", b",", b";", b"|", b"(", b"[")
_LABEL_BYTES = 48         # how far back a field's label may start (nvidia-smi -q pads labels to ~40)
MAX_ABSENT = 4096         # absent fields blanked per log (bounded time on a pathological one)


def _without_absent_fields(low: bytes) -> bytes:
    """``low`` with the label of every field whose value says the thing is absent blanked out: a status
    table's ``Thermal HW: false``, nvidia-smi -q's ``HW Slowdown : Not Active``, a dcgmi test's ``| Pass |``
    name what they do NOT report (the lexicon reads them so too). Literal searches (C speed, ~0.3 ms a MiB each), not a regex
    over the whole log; a value that the log does not hold at all costs one search."""
    needles = [sep + v for v in _RARE_VALUES if v in low for sep in _SEPARATORS]
    needles += [b": " + v for v in _COMMON_VALUES] + [b"| " + v for v in _CELL_VALUES if v in low]
    spans: List[Tuple[int, int]] = []
    for needle in needles:
        at = low.find(needle)
        while at >= 0 and len(spans) < MAX_ABSENT:
            end = at + len(needle)
            if end == len(low) or low[end] in _VALUE_END:
                floor = max(0, at - _LABEL_BYTES)
                spans.append((max(floor, max(low.rfind(c, floor, at) + 1 for c in _LABEL_STOPS)), end))
            at = low.find(needle, end)
    if not spans:
        return low
    out, at = [], 0
    for a, b in sorted(spans):
        out += [low[at:max(a, at)], b" "]
        at = max(at, b)
    return b"".join(out + [low[at:]])


def words(data: bytes) -> FrozenSet[str]:
    """The distinct words of ``data`` (any bytes): lower-cased runs of letters, digits, ``_`` and ``-``, normalised,
    except the labels of fields that say their thing is absent. Runs of letters alone are their own word (set
    operations, C speed); only the others go through normalise."""
    return _words_of_lowered(data.lower())


def _words_of_lowered(low: bytes) -> FrozenSet[str]:
    # Each distinct line once: logs repeat themselves (every rank, every step), and only distinct words count.
    unique = b"\n".join(set(low.split(b"\n")))
    raw = set(_without_absent_fields(unique).translate(_SPLIT).split())
    plain = {t for t in raw if t.isalpha() and 2 <= len(t) <= MAX_TOKEN}
    # Numbers and hex addresses are most of a long log's distinct tokens: dropped before normalise, at C speed.
    mixed = [t for t in raw.difference(plain) if t.translate(None, _HEX_TOKEN)]
    out = {w for w in map(normalise, mixed) if w is not None}
    out.update(t.decode("ascii") for t in plain.difference(_STOP_BYTES, _HEX_PAIRS))
    return frozenset(out)


def read_head(path: str) -> bytes:
    """The first HEAD_BYTES of a log (gzip or not), cut at its last full line, without colour codes."""
    from ..logs import open_log  # lazy: logs imports the catalog

    with open_log(path) as fh:
        head = fh.read(HEAD_BYTES)
    return strip_ansi_bytes(head[:head.rfind(b"\n") + 1] or head)  # colour codes glue to the words


@dataclass(frozen=True)
class PriorTable:
    """The learned table: each word's idf, each category's centroid (word -> weight, unit length);
    ``margin`` is the cosine lead a guess needs."""

    idf: Dict[str, float]
    weights: Dict[str, Dict[str, float]]
    margin: float
    header: Dict[str, object]

    @property
    def vocabulary(self) -> FrozenSet[str]:
        return frozenset(self.idf)


class PriorError(ValueError):
    """A prior.json that cannot be used; the message names the key."""


MAX_WORDS = 300   # per category: the table stays small (and reviewable)
_HEADER_KEYS = ("made_by", "date", "dev_cases", "split", "method")


def _number(v: object, lo: float, hi: float) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and lo < v <= hi


def load(path: Path = PATH) -> PriorTable:
    """The table at ``path``, validated: header keys, known categories, at most MAX_WORDS normalised words each,
    weights in (0, 1], an idf for exactly the words the categories list, a positive margin."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    header = doc.get("header")
    if not isinstance(header, dict) or any(k not in header for k in _HEADER_KEYS):
        raise PriorError(f"{path.name}:header: needs {', '.join(_HEADER_KEYS)}")
    margin = doc.get("decision", {}).get("margin")
    if not _number(margin, 0, 1):
        raise PriorError(f"{path.name}:decision.margin: a number in (0, 1]")
    weights = doc.get("categories")
    if not isinstance(weights, dict) or not weights or set(weights) - set(CATEGORIES):
        raise PriorError(f"{path.name}:categories: a non-empty object of known categories")
    for cat, ws in weights.items():
        if not isinstance(ws, dict) or len(ws) > MAX_WORDS or not all(
                _number(v, 0, 1) and normalise(k.encode()) == k for k, v in ws.items()):
            raise PriorError(f"{path.name}:categories.{cat}: at most {MAX_WORDS} normalised words, weights in (0, 1]")
    idf = doc.get("idf")
    listed = {w for ws in weights.values() for w in ws}
    if not isinstance(idf, dict) or set(idf) != listed or not all(_number(v, 0, 100) for v in idf.values()):
        raise PriorError(f"{path.name}:idf: a positive number for each word the categories list, and no other")
    return PriorTable(dict(idf), {c: dict(ws) for c, ws in weights.items()}, float(margin), dict(header))


@functools.lru_cache(maxsize=None)
def table() -> PriorTable:
    """The package's table, loaded once per process."""
    return load()


def scores(present: Iterable[str], tab: PriorTable) -> Dict[str, float]:
    """Category -> cosine of the log's idf vector (its distinct words the table knows) with the category's centroid."""
    vec = {w: tab.idf[w] for w in set(present) if w in tab.idf}
    norm = math.sqrt(sum(v * v for v in vec.values())) or 1.0
    return {c: sum(v * ws.get(w, 0.0) for w, v in vec.items()) / norm for c, ws in tab.weights.items()}


BESIDE_AN_ERROR = 0.02
"""The lead a guess needs when it names the category of an error line that nothing else named (half the
table's 0.04). The error already makes a finding (the log is no healthy one), and a best guess there beats
``unknown`` (5-fold CV within dev, 624 cases, on the 18 such cases: 13 right of 15 answered at 0.02, 13 of 18
at any lead, 9 of 10 at the table's 0.04); a generic line (``ERROR: step 3 returned 7``) stays unknown."""


def guess(present: Iterable[str], tab: Optional[PriorTable] = None,
          margin: Optional[float] = None) -> Optional[Tuple[str, float, float, List[str]]]:
    """(category, its cosine, the runner-up's, the words that weigh most for it) when the log holds MIN_WORDS
    words the table knows and one category's cosine leads the next one's by ``margin`` (default: the table's);
    else None."""
    tab = tab or table()
    margin = tab.margin if margin is None else margin
    have = {w for w in present if w in tab.idf}
    ranked = sorted(scores(have, tab).items(), key=lambda kv: (-kv[1], kv[0]))
    if len(have) < MIN_WORDS or not ranked:
        return None
    (top, score), runner = ranked[0], (ranked[1][1] if len(ranked) > 1 else 0.0)
    if score <= 0 or score - runner < margin:
        return None
    return top, score, runner, _strongest(have, tab, top)[:SHOWN]


def _strongest(have: Iterable[str], tab: PriorTable, category: str) -> List[str]:
    """The words of ``have`` that the category's centroid lists, the largest contribution (idf x weight) first."""
    ws = tab.weights[category]
    return sorted((w for w in have if w in ws), key=lambda w: (-tab.idf[w] * ws[w], w))


def _line_of(data: bytes, low: bytes, word: str) -> Optional[Tuple[int, str]]:
    """(line number, text) of the first line of ``data`` (``low``: lower-cased) holding ``word`` as a whole word."""
    w = word.encode()
    at = low.find(w)
    while at >= 0 and (at > 0 and low[at - 1] in _INNER or low[at + len(w):at + len(w) + 1].isalpha()
                       or low[at + len(w):at + len(w) + 1] in (b"_", b"-")):
        at = low.find(w, at + 1)
    if at < 0:
        return None
    start = data.rfind(b"\n", 0, at) + 1
    end = data.find(b"\n", at)
    text = data[start:end if end >= 0 else len(data)][:400].replace(b"\x00", b"").decode("utf-8", "replace").strip()
    return data.count(b"\n", 0, at) + 1, text


_INNER = frozenset(_WORD_BYTES)


def event(path: str, file_index: int = 0, source: Optional[str] = None) -> Optional[LogEvent]:
    """A KIND event with the log's words that the table knows (fields ``words``), placed on the first line
    of the strongest word of the category this log alone leans to; None when it holds none of them."""
    tab = table()
    data = read_head(path)
    low = data.lower()
    known = sorted(_words_of_lowered(low) & tab.vocabulary)
    if not known:
        return None
    ranked = sorted(scores(known, tab).items(), key=lambda kv: (-kv[1], kv[0]))
    at = None
    for w in _strongest(known, tab, ranked[0][0])[:3]:
        at = _line_of(data, low, w)
        if at is not None:
            break
    line, text = at or (1, "")
    return LogEvent(KIND, source or path, line, text, fields={"words": known}, file_index=file_index)


def prior_guess(events: List[LogEvent], margin: Optional[float] = None
                ) -> Optional[Tuple[str, List[str], List[LogEvent]]]:
    """(category, the words that led to it, the events that hold them) from every KIND event, or None."""
    prior = [e for e in events if e.kind == KIND]
    found = guess((w for e in prior for w in e.fields["words"]), margin=margin)
    if found is None:
        return None
    category, _, _, shown = found
    held = [e for e in prior if set(e.fields["words"]) & set(shown)]
    return category, shown, held


def finding(events: List[LogEvent]) -> List[TriageFinding]:
    """The prior's own low-confidence finding, for a log where nothing at all was found."""
    found = prior_guess(events)
    if found is None:
        return []
    category, shown, held = found
    summary = (f"no error line and no known failure shape; the log's words {', '.join(shown)} lean to {category} "
               f"(learned from the dev corpus): {held[0].text[:160]}")
    action = (f"a guess from the log's words only: confirm {category} in the log; if it is a real failure shape, "
              f"add it to the catalog (slurm_triage/triage/catalog) with its case")
    return [from_events(held, id=ID, category=category, verdict=Verdict.WARN, confidence=CONFIDENCE, summary=summary,
                        action=action, evidence={"prior": {"guess": category, "words": shown}})]


def name(found: TriageFinding, category: str, shown: List[str]) -> None:
    """Give an ``unknown`` first-error finding the prior's category (its lexicon evidence stays as it was)."""
    found.category, found.confidence = category, CONFIDENCE
    found.summary += f" — best guess {category} (the learned prior's words: {', '.join(shown)})"
    found.action = f"a guess from the log's words only: confirm {category} in the log around this line; " + \
        found.action.split("; ", 1)[-1]
    found.evidence["prior"] = {"guess": category, "words": shown}
