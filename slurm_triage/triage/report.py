"""Render a triage result for people (text, markdown) and for scripts (json); root cause first."""
from __future__ import annotations

import json
import time
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


def _source_facts(name: str, s: Dict[str, Any]) -> str:
    if name == "prometheus":
        return (f"{s.get('queries')} queries in {s.get('seconds')} s (sum of query times {s.get('query_seconds_sum')} s, "
                f"step {s.get('step_seconds'):.0f} s, {s.get('gpus')} GPUs)"
                + (f"; failed: {', '.join(s['errors'])}" if s.get("errors") else ""))
    keys = [k for k in ("via", "state", "nodes", "url", "job") if s.get(k) not in (None, "", [])]
    return ", ".join(f"{k} {','.join(map(str, s[k])) if isinstance(s[k], list) else s[k]}" for k in keys)


def _sources_line(sources: Dict[str, Any]) -> List[str]:
    out = []
    for path, s in sources.get("logs", {}).items():
        out.append(f"{path}: {s['lines']} lines, {s['events']} events" if s.get("read")
                   else f"{path}: NOT READ ({s.get('error')})")
    for name, s in sources.items():
        if name == "logs" or not isinstance(s, dict):
            continue
        out.append(f"{name}: " + (_source_facts(name, s) or "read") if s.get("read", True)
                   else f"{name}: unreachable ({s.get('error')})")
    return out


def _job_line(r: TriageResult) -> str:
    j = r.job_facts or {}
    if not j:
        return ""
    when = "–".join(time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) for t in (j.get("start"), j.get("end")) if t)
    return (f"state {j.get('state') or '?'}, exit {j.get('exit_code')}, nodes {j.get('nodelist') or '?'}"
            + (f", {when}" if when else ""))


def render_text(r: TriageResult) -> str:
    head = f"triage job {r.job}" if r.job else "triage of logs"
    lines = [head + (f": {_job_line(r)}" if _job_line(r) else ""), ""]
    if not r.findings:
        lines.append("no known failure signature found")
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
    if _job_line(r):
        lines += [_job_line(r), ""]
    if not r.findings:
        lines.append("No known failure signature found.")
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
