"""When no known failure shape matched: name the first error instead of "nothing found".

The earliest error-looking lines (the exception closing the first traceback, the first
error/fatal line) are what an SRE reads first; the finding says so with a low confidence and
the category ``unknown``, which never outranks a real finding.
"""
from __future__ import annotations

from typing import List

from ...model import Verdict
from ..model import FALLBACK, LogEvent, TriageFinding, from_events
from .common import of_kind, only

CONFIDENCE = 0.2


def first_error(events: List[LogEvent]) -> List[TriageFinding]:
    """The earliest exception / error line when no catalog entry or rule matched anything."""
    exc = of_kind(events, "first_exception")
    err = of_kind(events, "first_error")
    if not exc and not err:
        return []
    # Per file, the exception of the first traceback says more than a generic error line; the
    # earliest file (in the order given) wins.
    lead = min(exc or err, key=lambda e: e.order)
    shown = sorted(exc + err, key=lambda e: e.order)
    text = lead.text if len(lead.text) <= 200 else lead.text[:197] + "..."
    return [from_events(
        shown, id="log.first_error", category=FALLBACK, verdict=Verdict.WARN, confidence=CONFIDENCE,
        summary=text,
        action="read the log around this line; if it is a real failure shape, add it to the catalog "
               "(slurm_triage/triage/catalog) with its case",
        node=only(e.node for e in shown), rank=lead.rank,
        evidence={"exception": lead.fields.get("exception"), "first_line": lead.where})]
