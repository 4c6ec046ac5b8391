"""Job-level triage vocabulary: log events in, ranked root-cause findings out.

Node checks judge one node (``slurm_triage.model.Finding``); triage judges a whole job and
must say which failure came first, so its findings also carry a category, a confidence, the
rank, and ``caused_by`` (the id of the finding this one follows from).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..model import Verdict

SCHEMA = 1

CATEGORIES = ("gpu_hardware", "network", "collective_hang", "memory", "thermal_power",
              "scheduler", "host_resources", "security", "config")
FALLBACK = "unknown"
"""The category of the first-error finding made when no known shape matched: never a root cause
over a real finding (see rules.correlate)."""


@dataclass
class LogEvent:
    """One matched log line. ``time`` is unix seconds when the line carries a timestamp."""

    kind: str
    source: str
    line: int
    text: str
    time: Optional[float] = None
    node: Optional[str] = None
    rank: Optional[int] = None
    gpu: Optional[str] = None
    fields: Dict[str, Any] = field(default_factory=dict)
    file_index: int = 0

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"

    @property
    def order(self) -> Tuple[int, int]:
        """Position in the input (file given first, then line): the order when times are missing."""
        return (self.file_index, self.line)


@dataclass
class TriageFinding:
    """A judged cause (or consequence) for a job, with the evidence that supports it."""

    id: str
    category: str
    verdict: Verdict
    confidence: float
    summary: str
    action: str
    node: Optional[str] = None
    gpu: Optional[str] = None
    rank: Optional[int] = None
    evidence: Dict[str, Any] = field(default_factory=dict)
    caused_by: Optional[str] = None
    consequence: bool = False
    """True for symptoms that usually follow another failure (timeouts, socket resets)."""
    tier: int = 1
    """0 for evidence that a later process error on that node follows from (a fatal Xid; a GPU whose
    memory other processes held when this one ran out)."""
    first_time: Optional[float] = None
    first_order: Tuple[int, int] = (1 << 30, 0)

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES and self.category != FALLBACK:
            raise ValueError(f"unknown category {self.category!r}")
        self.confidence = max(0.0, min(1.0, round(self.confidence, 2)))

    def to_dict(self) -> Dict[str, Any]:
        return {"id": self.id, "category": self.category, "verdict": self.verdict.value,
                "confidence": self.confidence, "node": self.node, "gpu": self.gpu, "rank": self.rank,
                "summary": self.summary, "evidence": self.evidence, "action": self.action,
                "caused_by": self.caused_by}


def from_events(events: List[LogEvent], **kw: Any) -> TriageFinding:
    """A finding whose time/position (used for ranking) and ``lines`` evidence come from ``events``."""
    times = [e.time for e in events if e.time is not None]
    f = TriageFinding(**kw)
    f.first_time = min(times) if times else None
    f.first_order = min(e.order for e in events)
    f.evidence.setdefault("lines", [f"{e.where}: {e.text}" for e in events[:5]])
    if len(events) > 5:
        f.evidence["lines_total"] = len(events)
    return f


@dataclass
class JobEvidence:
    """Everything gathered about one job, as plain facts; the job-level rules read only this.

    ``job``: Slurm's facts (sources.slurm.JobFacts.to_dict()); ``metrics``: Prometheus answers
    (sources.prometheus.shape() plus ``window``); ``nodes``: our hooks' records per node
    (sources.pushgateway); ``settings``: the [triage] thresholds; ``baseline``: another run to
    compare with (``--baseline``). A source that could not be read leaves its field empty.
    """

    job: Optional[Dict[str, Any]] = None
    events: List[LogEvent] = field(default_factory=list)
    metrics: Optional[Dict[str, Any]] = None
    nodes: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    settings: Dict[str, Any] = field(default_factory=dict)
    baseline: Optional["JobEvidence"] = None

    def setting(self, key: str) -> Any:
        from .sources import DEFAULTS

        return self.settings.get(key, DEFAULTS[key])
