"""What a run that succeeded says of itself (``healthy.toml``): lines that keep a log without any
error line from being guessed at.

The fallback's word guess and the setting hints are there for failure logs that show no error line
(a hang, a status table); a log whose tool says its work succeeded (nccl-tests found no wrong value,
torchrun's workers finished) is not such a log. Knowledge stays in the TOML; this module loads and
validates it and reads the marker lines of a log (a bounded second pass, like the error lines').
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Pattern, Tuple

from .decoration import undecorate
from .logs import grep_lines
from .model import LogEvent
from .tables import tables

PATH = Path(__file__).resolve().parent / "healthy.toml"
KIND = "healthy_marker"
MAX_LINES = 50
_KEYS = {"id": str, "what": str, "needles": list, "regex": str, "sources": list, "examples": list}


class HealthyError(ValueError):
    """A marker that cannot be used; the message names ``healthy.toml:marker N:key``."""


@dataclass(frozen=True)
class Marker:
    id: str
    what: str
    needles: Tuple[str, ...]
    regex: Pattern[str]
    sources: Tuple[str, ...]
    examples: Tuple[str, ...]


def _marker(raw: dict, n: int) -> Marker:
    where = f"{PATH.name}:marker {n}"
    for key, typ in _KEYS.items():
        if not isinstance(raw.get(key), typ) or not raw[key]:
            raise HealthyError(f"{where}:{key}: missing or not a non-empty {typ.__name__}")
    extra = sorted(set(raw) - set(_KEYS))
    if extra:
        raise HealthyError(f"{where}:{extra[0]}: unknown key (known: {', '.join(_KEYS)})")
    try:
        rx = re.compile(raw["regex"])
    except re.error as e:
        raise HealthyError(f"{where}:regex: {e}") from None
    if any(not s.startswith("https://") for s in raw["sources"]):
        raise HealthyError(f"{where}:sources: every source is an https:// URL")
    return Marker(raw["id"], raw["what"], tuple(raw["needles"]), rx, tuple(raw["sources"]), tuple(raw["examples"]))


def load(path: Path = PATH) -> Tuple[Marker, ...]:
    """The markers at ``path``, validated; HealthyError names the marker and key of any mistake."""
    out = tuple(_marker(m, i) for i, m in enumerate(tables(path, "marker", HealthyError), 1))
    ids = [m.id for m in out]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise HealthyError(f"{path.name}: marker id {dup[0]!r} appears twice")
    return out


@functools.lru_cache(maxsize=None)
def markers() -> Tuple[Marker, ...]:
    return load()


def match(text: str) -> List[Marker]:
    """The markers whose needle and regex the line holds (a label such as ``0: `` removed first)."""
    line, _ = undecorate(text)
    return [m for m in markers() if any(n in text for n in m.needles) and m.regex.search(line)]


def events(path: str, file_index: int = 0) -> List[LogEvent]:
    """One event per marker line of ``path`` (at most MAX_LINES lines are read)."""
    out: List[LogEvent] = []
    needles = [n for m in markers() for n in m.needles]
    for n, raw in grep_lines(path, needles, fold=False, limit=MAX_LINES):
        text = raw.replace(b"\x00", b"").decode("utf-8", "replace").rstrip("\r\n")
        for m in match(text):
            out.append(LogEvent(KIND, path, n, text.strip()[:400], fields={"marker": m.id, "what": m.what},
                                file_index=file_index))
    return out
