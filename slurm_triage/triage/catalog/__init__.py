"""The failure catalog: one declarative entry per failure shape, kept as TOML data beside this file.

Knowledge of the field (which line means what, how sure it is, what to do) lives in
``<category>.toml``; code reads it. An entry's literal ``needles`` feed the grep prefilter and
the pure-Python scanner, its ``regex`` (named groups become event fields) confirms a line and
its ``summary``/``action`` word the finding. Entries whose meaning spans lines (SeqNum lag per
rank, Xid classes, IB status decoding) name the Python rule that judges them (``handled_by``);
the others are judged by :mod:`..rules.catalog`. :func:`load` validates everything and names
``file:entry:key`` in every error, so a typo in the data fails the tests, not a 3 a.m. triage.
"""
from __future__ import annotations

import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Pattern, Tuple

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

from ..model import CATEGORIES

DIR = Path(__file__).resolve().parent
ROLES = ("cause", "symptom", "context")
"""cause: a root cause on its own; symptom: usually follows another failure (ranked after a cause);
context: no finding, a fact other rules use (rank -> node from NCCL init lines)."""
VERDICTS = ("FAIL", "WARN")
BUILTIN_FIELDS = ("count", "nodes", "ranks", "gpus")
"""Names a summary may use besides the regex's groups: facts over all the entry's events."""
_REQUIRED = {"id": str, "category": str, "role": str, "confidence": float, "needles": list, "regex": str,
             "summary": str, "action": str, "sources": list, "examples": list}
_OPTIONAL = {"nocase": bool, "finding": str, "handled_by": str, "verdict": str, "tier": int, "shares": list,
             "note": str, "defers_to": list}
_ID = re.compile(r"^[a-z][a-z0-9_]*$")
_FINDING = re.compile(r"^[a-z][a-z0-9_.]*$")
_OPTIONAL_PART = re.compile(r"\[([^\[\]]*)\]")


class CatalogError(ValueError):
    """A catalog entry that cannot be used; the message starts with ``file:entry:key``."""


@dataclass(frozen=True)
class Entry:
    """One failure shape. ``needles`` are as written; the scanner compares them lower-cased when ``nocase``."""

    id: str
    category: str
    role: str
    confidence: float
    needles: Tuple[str, ...]
    regex: Pattern[str]
    summary: str
    action: str
    sources: Tuple[str, ...]
    examples: Tuple[str, ...]
    file: str
    nocase: bool = False
    finding: str = ""
    handled_by: str = ""
    verdict: str = ""
    tier: int = 1
    shares: Tuple[str, ...] = ()
    note: str = ""
    defers_to: Tuple[str, ...] = ()
    """Parser event kinds that judge this entry's line better when they decoded it (an ibstat port's
    state in its CA/port context): then the line-level match gives way to the structured rule."""

    @property
    def finding_id(self) -> str:
        return self.finding or f"log.{self.id}"

    @property
    def fields(self) -> Tuple[str, ...]:
        return tuple(self.regex.groupindex)


def _where(file: str, name: str, key: str) -> str:
    return f"{file}:{name}:{key}"


def _template_fields(text: str) -> List[str]:
    return [f for _, f, _, _ in string.Formatter().parse(_OPTIONAL_PART.sub(r"\1", text)) if f]


def _entry(raw: Dict[str, Any], file: str, index: int) -> Entry:
    name = str(raw.get("id") or f"#{index}")
    for key, typ in _REQUIRED.items():
        if key not in raw:
            raise CatalogError(f"{_where(file, name, key)}: missing")
    for key, value in raw.items():
        typ = _REQUIRED.get(key) or _OPTIONAL.get(key)
        if typ is None:
            raise CatalogError(f"{_where(file, name, key)}: unknown key (known: {', '.join([*_REQUIRED, *_OPTIONAL])})")
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) if typ is float else isinstance(value, typ)
        if not ok or (typ is int and isinstance(value, bool)):
            raise CatalogError(f"{_where(file, name, key)}: must be {typ.__name__}, got {type(value).__name__}")
        if typ is list and not all(isinstance(v, str) and v for v in value):
            raise CatalogError(f"{_where(file, name, key)}: must be a list of non-empty strings")
    if not _ID.match(name):
        raise CatalogError(f"{_where(file, name, 'id')}: must match {_ID.pattern}")
    if raw["category"] not in CATEGORIES:
        raise CatalogError(f"{_where(file, name, 'category')}: {raw['category']!r} not one of {', '.join(CATEGORIES)}")
    if raw["role"] not in ROLES:
        raise CatalogError(f"{_where(file, name, 'role')}: {raw['role']!r} not one of {', '.join(ROLES)}")
    if not 0.0 < float(raw["confidence"]) <= 1.0:
        raise CatalogError(f"{_where(file, name, 'confidence')}: must be in (0, 1]")
    if raw.get("verdict", "FAIL") not in VERDICTS:
        raise CatalogError(f"{_where(file, name, 'verdict')}: not one of {', '.join(VERDICTS)}")
    if "finding" in raw and not _FINDING.match(raw["finding"]):
        raise CatalogError(f"{_where(file, name, 'finding')}: must match {_FINDING.pattern}")
    if not raw["needles"] or not raw["examples"] or not raw["sources"]:
        raise CatalogError(f"{_where(file, name, 'needles/examples/sources')}: must not be empty")
    if any(not s.startswith("https://") for s in raw["sources"]):
        raise CatalogError(f"{_where(file, name, 'sources')}: every source is an https:// URL")
    nocase = bool(raw.get("nocase", False))
    try:
        regex = re.compile(raw["regex"], re.IGNORECASE if nocase else 0)
    except re.error as e:
        raise CatalogError(f"{_where(file, name, 'regex')}: {e}") from None
    clash = sorted(set(regex.groupindex) & set(BUILTIN_FIELDS))
    if clash:
        raise CatalogError(f"{_where(file, name, 'regex')}: group {clash[0]!r} is a built-in summary field")
    known = set(regex.groupindex) | set(BUILTIN_FIELDS)
    for key in ("summary", "action"):
        try:
            unknown = sorted(set(_template_fields(raw[key])) - known)
        except ValueError as e:
            raise CatalogError(f"{_where(file, name, key)}: {e}") from None
        if unknown:
            raise CatalogError(f"{_where(file, name, key)}: names {', '.join(unknown)}, not a regex group "
                               f"or one of {', '.join(BUILTIN_FIELDS)}")
    return Entry(id=name, category=raw["category"], role=raw["role"], confidence=float(raw["confidence"]),
                 needles=tuple(raw["needles"]), regex=regex, summary=raw["summary"], action=raw["action"],
                 sources=tuple(raw["sources"]), examples=tuple(raw["examples"]), file=file, nocase=nocase,
                 finding=raw.get("finding", ""), handled_by=raw.get("handled_by", ""),
                 verdict=raw.get("verdict", "FAIL" if raw["role"] == "cause" else "WARN"),
                 tier=int(raw.get("tier", 1)), shares=tuple(raw.get("shares", ())), note=raw.get("note", ""),
                 defers_to=tuple(raw.get("defers_to", ())))


def load(directory: Path = DIR) -> Tuple[Entry, ...]:
    """Every entry of every ``*.toml`` in ``directory``, in file then entry order; CatalogError if any is bad."""
    entries: List[Entry] = []
    seen: Dict[str, str] = {}
    for path in sorted(directory.glob("*.toml")):
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise CatalogError(f"{path.name}:-:-: not valid TOML: {e}") from None
        extra = sorted(set(data) - {"entry"})
        if extra:
            raise CatalogError(f"{path.name}:-:{extra[0]}: unknown top-level key (only [[entry]] tables)")
        for i, raw in enumerate(data.get("entry", []), 1):
            e = _entry(raw, path.name, i)
            if e.id in seen:
                raise CatalogError(f"{_where(path.name, e.id, 'id')}: also defined in {seen[e.id]}")
            seen[e.id] = path.name
            entries.append(e)
    for e in entries:
        for other in e.shares:
            if other not in seen:
                raise CatalogError(f"{_where(e.file, e.id, 'shares')}: no entry {other!r}")
    return tuple(entries)


def render(template: str, values: Dict[str, str]) -> str:
    """``template`` with ``{field}`` filled; a ``[...]`` part is dropped when a field in it has no value."""
    def part(m: "re.Match[str]") -> str:
        return m.group(1) if all(values.get(f) for f in _template_fields(m.group(1))) else ""

    text = _OPTIONAL_PART.sub(part, template)
    return string.Formatter().vformat(text, (), _Missing(values))


class _Missing(dict):
    def __missing__(self, key: str) -> str:
        return "?"


_ENTRIES: Optional[Tuple[Entry, ...]] = None


def entries() -> Tuple[Entry, ...]:
    """The package's catalog, loaded once per process."""
    global _ENTRIES
    if _ENTRIES is None:
        _ENTRIES = load()
    return _ENTRIES
