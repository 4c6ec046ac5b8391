"""Render a triage result for people (text, markdown) and for scripts (json); root cause first.

People get readable evidence: times as UTC ISO, numbers with their units, long lists
shortened, and every control character escaped (log lines and job names are other people's
bytes: an ANSI escape or a newline in them must not forge report lines). JSON keeps the raw
values for scripts.
"""
from __future__ import annotations

import json
import math
import re
import time
from typing import Any, Dict, List

from . import TriageResult
from .model import TriageFinding
from .rules.fallback import is_fallback

_SKIP = ("lines", "lines_total")
MAX_ITEMS = 6
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_TIME_KEY = re.compile(r"(?:^|_)(?:time|at|start|end|since|until|seen)$")
_UNITS = (("_seconds", "s"), ("_ms", "ms"), ("_celsius", "°C"), ("_watts", "W"), ("_joules", "J"),
          ("_mhz", "MHz"), ("_percent", "%"), ("_fraction", ""))


def safe(text: Any) -> str:
    """``text`` as one line: control characters (C0 but tab, DEL, C1, bidi overrides) as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}" if ord(m.group(0)) < 0x100
                        else f"\\u{ord(m.group(0)):04x}", str(text))


def utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return f"{n} B"


def _number(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def readable(key: str, value: Any) -> str:
    """One evidence value for people: epoch times as UTC ISO, units from the key's suffix, lists shortened."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        if _TIME_KEY.search(key) and 1e8 < value < 1e11:
            return utc(value)
        if key.endswith("_bytes"):
            return _bytes(value)
        if key.endswith("_kb"):
            return _bytes(value * 1024)
        for suffix, unit in _UNITS:
            if key.endswith(suffix):
                return f"{_number(value)} {unit}".rstrip()
        return _number(value)
    if isinstance(value, (list, tuple)):
        shown = ", ".join(readable(key, v) for v in value[:MAX_ITEMS])
        more = f", … (+{len(value) - MAX_ITEMS} more)" if len(value) > MAX_ITEMS else ""
        return f"[{shown}{more}]"
    if isinstance(value, dict):
        items = list(value.items())
        shown = ", ".join(f"{k}: {readable(str(k), v)}" for k, v in items[:MAX_ITEMS])
        more = f", … (+{len(items) - MAX_ITEMS} more)" if len(items) > MAX_ITEMS else ""
        return "{" + shown + more + "}"
    return safe(value)


def _where(f: TriageFinding) -> str:
    parts = [f"node {f.node}" if f.node else "", f"GPU {f.gpu}" if f.gpu else "",
             f"rank {f.rank}" if f.rank is not None else ""]
    return ", ".join(p for p in parts if p)


def _facts(f: TriageFinding) -> str:
    return ", ".join(f"{k}={readable(k, v)}" for k, v in f.evidence.items() if k not in _SKIP and v not in (None, [], {}))


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
    when = " – ".join(utc(t) for t in (j.get("start"), j.get("end")) if t)
    return safe(f"state {j.get('state') or '?'}, exit {j.get('exit_code')}, nodes {j.get('nodelist') or '?'}"
                + (f", {when}" if when else ""))


# What an operator types first when the root cause sits on one node, by category; the others
# (memory, config, scheduler, security) are fixed in the job or the site: their action says how.
_NOW = {
    "gpu_hardware": ('scontrol update nodename={node} state=drain reason="triage: {reason}"',
                     "resubmit with sbatch --exclude={node} ..."),
    "thermal_power": ("resubmit with sbatch --exclude={node} ...",
                      'scontrol update nodename={node} state=drain reason="triage: {reason}"'),
    "network": ("resubmit with sbatch --exclude={node} ...",),
    "collective_hang": ("resubmit with sbatch --exclude={node} ...",),
    "host_resources": ("resubmit with sbatch --exclude={node} ...",),
}
_ANSI = {"root": "\033[1;31m", "FAIL": "\033[31m", "WARN": "\033[33m", "now": "\033[1m", "off": "\033[0m"}


def what_to_do_now(f: TriageFinding) -> str:
    """One line: the command for a node-local root cause, else the finding's action."""
    if f.node and f.category in _NOW:
        reason = re.sub(r"[\"\\\s]+", " ", f.summary)[:60].strip()
        return "; then ".join(t.format(node=f.node, reason=reason) for t in _NOW[f.category])
    return f.action


_COLOURED = re.compile(r"^(?P<root>ROOT CAUSE|FIRST ERROR)|^(?P<now>what to do now:)|(?<= verdict=)(?P<v>FAIL|WARN)(?= )")


def _colour(line: str) -> str:
    """ANSI colour for our own fixed words, applied after safe(): no log text can carry an escape."""
    def paint(m: "re.Match[str]") -> str:
        key = m.lastgroup if m.lastgroup != "v" else m.group("v")
        return f"{_ANSI[key or 'off']}{m.group(0)}{_ANSI['off']}"
    return _COLOURED.sub(paint, line)


def render_text(r: TriageResult, colour: bool = False) -> str:
    """The terminal report; ``colour`` (ANSI) only for a terminal that wants it (see cli)."""

    head = f"triage job {r.job}" if r.job else "triage of logs"
    lines = [head + (f": {_job_line(r)}" if _job_line(r) else ""), ""]
    if not r.findings:
        lines.append("no known failure signature found")
    for i, f in enumerate(r.findings):
        if i == 0:
            lines.append(f"{'FIRST ERROR' if is_fallback(f) else 'ROOT CAUSE'} [{f.category}] {f.summary}")
            lines.append("what to do now: " + what_to_do_now(f))
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
    return "\n".join(_colour(safe(ln)) if colour else safe(ln) for ln in lines) + "\n"


def render_markdown(r: TriageResult) -> str:
    lines = [f"# Triage: job {r.job}" if r.job else "# Triage of logs", ""]
    if _job_line(r):
        lines += [_job_line(r), ""]
    if not r.findings:
        lines.append("No known failure signature found.")
    for i, f in enumerate(r.findings):
        title = ("First error (no known signature)" if is_fallback(f) else "Root cause") if i == 0 \
            else ("Consequence" if f.caused_by else "Also found")
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
    return "\n".join(safe(ln) for ln in lines) + "\n"


def render_json(r: TriageResult) -> str:
    return json.dumps(r.to_dict(), indent=1, sort_keys=False) + "\n"


RENDERERS = {"text": render_text, "markdown": render_markdown, "json": render_json}
