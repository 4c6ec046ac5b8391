"""Verdicts and findings: the shared vocabulary of checks, hooks, sinks and reports.

Plain classes that serialize to JSON with a schema number, so the same objects feed
the Pushgateway, the textfile collector, the CLI report and the tests. (Not dataclasses:
every Prolog imports this, and the ``inspect`` that dataclasses pulls in cost ~10 ms of
CPU per hook.)
"""
from __future__ import annotations

import enum
from typing import Any, Dict, Iterable, List, Optional

SCHEMA = 1


class Verdict(str, enum.Enum):
    """Outcome of one check. UNKNOWN = could not evaluate; it never drains on its own."""

    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"
    UNKNOWN = "UNKNOWN"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]

    def __str__(self) -> str:  # so f-strings print "FAIL", not "Verdict.FAIL"
        return self.value


_SEVERITY = {Verdict.OK: 0, Verdict.UNKNOWN: 1, Verdict.WARN: 2, Verdict.FAIL: 3}


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The overall verdict: FAIL > WARN > UNKNOWN > OK; OK for an empty list."""
    out = Verdict.OK
    for v in verdicts:
        if v.severity > out.severity:
            out = v
    return out


class Finding:
    """One judged fact: what was seen, on which GPU/process, and what to do about it.

    ``evidence`` holds numbers with their units in the key names (``temp_celsius``),
    and ``seen_at`` (unix seconds) when the fact was collected. ``hardware``: True when a
    FAIL means the node itself is unsafe (drain), not a job's leftovers.
    """

    FIELDS = ("id", "verdict", "summary", "node", "gpu", "pid", "evidence", "action", "hardware")

    def __init__(self, id: str, verdict: Verdict, summary: str, node: str = "", gpu: Optional[str] = None,
                 pid: Optional[int] = None, evidence: Optional[Dict[str, Any]] = None, action: str = "",
                 hardware: bool = False):
        self.id, self.verdict, self.summary, self.node, self.gpu, self.pid = id, verdict, summary, node, gpu, pid
        self.evidence: Dict[str, Any] = {} if evidence is None else evidence
        self.action, self.hardware = action, hardware

    def _values(self) -> tuple:
        return tuple(getattr(self, k) for k in self.FIELDS)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Finding) and self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dataclass it was

    def __repr__(self) -> str:
        return "Finding(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.FIELDS) + ")"

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-able copy: later changes to the finding's evidence do not reach it."""
        d = {k: _copied(getattr(self, k)) for k in self.FIELDS}
        d["verdict"] = self.verdict.value
        return d

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Finding":
        d = dict(d)
        d["verdict"] = Verdict(d["verdict"])
        return cls(**d)


def _copied(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _copied(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_copied(x) for x in v)
    return v


def sort_findings(findings: List[Finding]) -> List[Finding]:
    """Worst first, then by check id and GPU so output is stable."""
    return sorted(findings, key=lambda f: (-f.verdict.severity, f.id, f.gpu or "", f.pid or 0))
