"""Render a triage result for people (text, markdown) and for scripts (json); root cause first."""
from __future__ import annotations

import json
from typing import Any, Dict, List

from . import TriageResult
from .model import TriageFinding

_SKIP = ("lines", "lines_total")


def _where(f: TriageFinding) -> str:
    parts = [f"node {f.node}" if f.node else "", f"GPU {f.gpu}" if f.gpu else "",
             f"rank {f.rank}" if f.rank is not None else ""]
    return ", ".join(p for p in parts if p)


def _facts(f: TriageFinding) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in f.evidence.items() if k not in _SKIP and v not in (None, [], {}))


def _sources_line(sources: Dict[str, Any]) -> List[str]:
    out = []
    for path, s in sources.get("logs", {}).items():
        out.append(f"{path}: {s['lines']} lines, {s['events']} events" if s.get("read")
                   else f"{path}: NOT READ ({s.get('error')})")
    for name, s in sources.items():
        if name != "logs" and isinstance(s, dict) and not s.get("read", True):
            out.append(f"{name}: unreachable ({s.get('error')})")
    return out


def render_text(r: TriageResult) -> str:
    head = f"triage job {r.job}" if r.job else "triage of logs"
    lines = [head, ""]
    if not r.findings:
        lines.append("no known failure signature found in the logs")
    for i, f in enumerate(r.findings):
        if i == 0:
            lines.append(f"ROOT CAUSE [{f.category}] {f.summary}")
        else:
            rel = f"follows from {f.caused_by}" if f.caused_by else "independent"
            lines.append(f"- [{f.category}] {f.summary}  ({rel})")
        ind = "    " if i == 0 else "      "
        lines.append(f"{ind}id={f.id} verdict={f.verdict.value} confidence={f.confidence:.2f}"
                     + (f" {_where(f)}" if _where(f) else ""))
        if _facts(f):
            lines.append(f"{ind}evidence: {_facts(f)}")
        for ln in f.evidence.get("lines", [])[: 5 if i == 0 else 2]:
            lines.append(f"{ind}  {ln}")
        lines.append(f"{ind}action: {f.action}")
        if i == 0 and len(r.findings) > 1:
            lines += ["", "then:"]
    lines += ["", "sources:"] + ["  " + s for s in _sources_line(r.sources)]
    return "\n".join(lines) + "\n"


def render_markdown(r: TriageResult) -> str:
    lines = [f"# Triage: job {r.job}" if r.job else "# Triage of logs", ""]
    if not r.findings:
        lines.append("No known failure signature found in the logs.")
    for i, f in enumerate(r.findings):
        title = "Root cause" if i == 0 else ("Consequence" if f.caused_by else "Also found")
        lines.append(f"## {title}: {f.summary}")
        lines.append("")
        lines.append(f"- **category** `{f.category}`, **verdict** {f.verdict.value}, **confidence** {f.confidence:.2f}"
                     + (f", {_where(f)}" if _where(f) else "") + (f", follows from `{f.caused_by}`" if f.caused_by else ""))
        if _facts(f):
            lines.append(f"- **evidence** {_facts(f)}")
        lines.append(f"- **action** {f.action}")
        if f.evidence.get("lines"):
            lines += ["", "```"] + [ln.replace("```", "'''") for ln in f.evidence["lines"]] + ["```"]
        lines.append("")
    lines += ["## Sources", ""] + [f"- {s}" for s in _sources_line(r.sources)]
    return "\n".join(lines) + "\n"


def render_json(r: TriageResult) -> str:
    return json.dumps(r.to_dict(), indent=1, sort_keys=False) + "\n"


RENDERERS = {"text": render_text, "markdown": render_markdown, "json": render_json}
