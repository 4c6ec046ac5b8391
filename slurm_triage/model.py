"""Verdicts and findings: the shared vocabulary of checks, hooks, sinks and reports.

Plain dataclasses that serialize to JSON with a schema number, so the same objects feed
the Pushgateway, the textfile collector, the CLI report and the tests.
"""
from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
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


@dataclass
class Finding:
    """One judged fact: what was seen, on which GPU/process, and what to do about it.

    ``evidence`` holds numbers with their units in the key names (``temp_celsius``),
    and ``seen_at`` (unix seconds) when the fact was collected.
    """

    id: str
    verdict: Verdict
    summary: str
    node: str = ""
    gpu: Optional[str] = None
    pid: Optional[int] = None
    evidence: Dict[str, Any] = field(default_factory=dict)
    action: str = ""
    hardware: bool = False
    """True when a FAIL means the node itself is unsafe (drain), not a job's leftovers."""

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["verdict"] = self.verdict.value
        return d

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Finding":
        d = dict(d)
        d["verdict"] = Verdict(d["verdict"])
        return cls(**d)


def sort_findings(findings: List[Finding]) -> List[Finding]:
    """Worst first, then by check id and GPU so output is stable."""
    return sorted(findings, key=lambda f: (-f.verdict.severity, f.id, f.gpu or "", f.pid or 0))
