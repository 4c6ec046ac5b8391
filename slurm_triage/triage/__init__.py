"""Job triage from logs: read the job's logs safely, judge them with pure rules, rank root cause first.

``triage_logs(paths)`` is the whole pipeline; ``cli.register`` adds ``slurm-triage triage``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from .logs import scan_many
from .model import SCHEMA, LogEvent, TriageFinding
from .rules import run_rules


@dataclass
class TriageResult:
    job: Optional[str]
    findings: List[TriageFinding]
    sources: Dict[str, Any] = field(default_factory=dict)
    events: List[LogEvent] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return {"schema": SCHEMA, "job": self.job, "findings": [f.to_dict() for f in self.findings],
                "sources": self.sources}


def triage_logs(paths: Sequence[str], job: Optional[str] = None,
                progress: Optional[Callable[[str, int], None]] = None) -> TriageResult:
    """Scan ``paths`` (unreadable ones are recorded in ``sources``, not raised) and rank the findings."""
    events, logs = scan_many(paths, progress=progress)
    return TriageResult(job, run_rules(events), {"logs": logs}, events)
