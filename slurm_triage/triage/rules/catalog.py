"""The catalog rule: findings for the failure shapes whose meaning is in the data alone.

Each catalog entry without ``handled_by`` becomes one finding per finding id (entries may share
one, e.g. the kernel's and the cgroup's OOM kills), worded by the entry's summary template over
the fields its regex pulled out of every matching line. Reasoning across lines stays in the
Python rules that the other entries name.
"""
from __future__ import annotations

from typing import Dict, FrozenSet, List

from ...model import Verdict
from ..catalog import Entry, entries, render
from ..model import LogEvent, TriageFinding, from_events
from .common import only, ranks_text

MAX_VALUES = 8


def _distinct(values: List[object]) -> List[object]:
    return list(dict.fromkeys(v for v in values if v is not None and v != ""))


def _values(evs: List[LogEvent]) -> Dict[str, List[object]]:
    keys: Dict[str, None] = {}
    for e in evs:
        keys.update(dict.fromkeys(e.fields))
    return {k: _distinct([e.fields.get(k) for e in evs]) for k in keys}


def _text(values: List[object]) -> str:
    shown = ", ".join(str(v) for v in values[:4])
    return shown + (f", … ({len(values)})" if len(values) > 4 else "")


def _finding(fid: str, lead: Entry, evs: List[LogEvent], cause: bool) -> TriageFinding:
    fields = _values(evs)
    nodes = sorted({e.node for e in evs if e.node})
    ranks = sorted({e.rank for e in evs if e.rank is not None})
    gpus = _distinct([e.gpu for e in evs])
    words = {k: _text(v) for k, v in fields.items() if v}
    words.update(count=str(len(evs)), nodes=", ".join(nodes), ranks=ranks_text(ranks) if ranks else "",
                 gpus=_text(gpus) if gpus else "")
    evidence: Dict[str, object] = {"count": len(evs)}
    for k, v in fields.items():
        if v:
            evidence[k] = v[0] if len(v) == 1 else v[:MAX_VALUES]
    if nodes:
        evidence["nodes"] = nodes
    if ranks:
        evidence["ranks"] = ranks
    role = "cause" if cause else lead.role
    return from_events(
        evs, id=fid, category=lead.category, verdict=Verdict(lead.verdict),
        confidence=lead.confidence, summary=render(lead.summary, words), action=render(lead.action, words),
        node=only(nodes), gpu=only(str(g) for g in gpus), rank=ranks[0] if len(ranks) == 1 else None,
        evidence=evidence, consequence=role == "symptom", tier=lead.tier)


def deferring_kinds() -> FrozenSet[str]:
    """Ids of the entries that give way to a parser's event on the same line (``defers_to``)."""
    return frozenset(e.id for e in entries() if e.defers_to)


def catalog_findings(events: List[LogEvent]) -> List[TriageFinding]:
    """Catalog entries judged by their data alone: one finding per finding id, worded by its surest entry;
    a line that a parser decoded in context (``defers_to``) is left to the structured rule."""
    by_id = {e.id: e for e in entries()}
    parsed = {(ev.source, ev.line, ev.kind) for ev in events}
    groups: Dict[str, List[LogEvent]] = {}
    for ev in events:
        entry = by_id.get(ev.kind)
        if entry is None or entry.handled_by or entry.role == "context":
            continue
        if any((ev.source, ev.line, k) in parsed for k in entry.defers_to):
            continue
        groups.setdefault(entry.finding_id, []).append(ev)
    out: List[TriageFinding] = []
    for fid, evs in groups.items():
        members = [by_id[e.kind] for e in evs]
        lead = max(members, key=lambda m: m.confidence)
        out.append(_finding(fid, lead, evs, any(m.role == "cause" for m in members)))
    return out
