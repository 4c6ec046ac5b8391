"""Job triage: gather a job's evidence (Slurm, Prometheus, our hooks' records, its logs), judge it
with pure rules, rank the root cause first.

``triage_logs(paths)`` judges logs alone; ``triage_job(cfg, job_id, ...)`` is the whole pipeline;
``cli.register`` adds ``slurm-triage triage``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import subprocess
import time
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..config import Config
from . import healthy, lexicon
from .logs import error_lines, expand_paths, scan_many
from .model import SCHEMA, JobEvidence, LogEvent, TriageFinding
from .rules import fallback, prior, run_job_rules, run_rules


@dataclass
class TriageResult:
    job: Optional[str]
    findings: List[TriageFinding]
    sources: Dict[str, Any] = field(default_factory=dict)
    events: List[LogEvent] = field(default_factory=list)
    job_facts: Optional[Dict[str, Any]] = None

    def to_dict(self) -> Dict[str, Any]:
        job: Any = self.job
        if self.job_facts:
            job = {"id": self.job, **{k: v for k, v in self.job_facts.items() if k not in ("job_id", "steps", "sources")},
                   "via": self.job_facts.get("sources")}
        return {"schema": SCHEMA, "job": job, "findings": [f.to_dict() for f in self.findings],
                "sources": self.sources}


def first_error_events(paths: Sequence[str], logs: Dict[str, Dict[str, Any]]) -> List[LogEvent]:
    """The first traceback exception / error line of every readable log, the lexicon's words near
    them, (for a log with such lines) the lexicon's words over its head too, the words the learned
    prior knows, and the lines that say a run succeeded (second pass, bounded)."""
    out: List[LogEvent] = []
    for i, p in enumerate(paths):
        if (logs.get(p) or {}).get("read"):
            try:
                first = error_lines(p, i)
                out += first + lexicon.hits(p, i, near=[e.line for e in first])
                if first:
                    out += lexicon.hits(p, i, kind=lexicon.WHOLE_KIND)
                out += [e for e in (prior.event(p, i),) if e is not None]
                out += healthy.events(p, i)
            except (OSError, EOFError, zlib.error, subprocess.SubprocessError):
                continue  # the scan already read it; a second-pass failure only loses the hint
    return out


def triage_logs(paths: Sequence[str], job: Optional[str] = None,
                progress: Optional[Callable[[str, int], None]] = None) -> TriageResult:
    """Scan ``paths`` (unreadable ones are recorded in ``sources``, not raised) and rank the findings;
    when nothing known matched, the first error lines say something rather than nothing."""
    paths = expand_paths(paths)
    events, logs = scan_many(paths, progress=progress)
    findings = run_rules(events)
    if only_weak(findings):
        events += first_error_events(paths, logs)
        findings = run_rules(events)
    return TriageResult(job, findings, {"logs": logs}, events)


WEAK = 0.5


def only_weak(findings: List[TriageFinding]) -> bool:
    """Nothing found, or only weak symptoms (an exposure, a socket reset) or communication ones (a
    collective timeout): then the first error lines and the whole log's words are worth reading too
    (they never outrank what was found; over a communication symptom they may name its cause)."""
    return all(f.consequence and (f.confidence < WEAK or f.category in fallback.COMMUNICATION) for f in findings)


def _window(facts: Any, since: Optional[float], until: Optional[float]) -> Tuple[Optional[float], Optional[float]]:
    start = since if since is not None else (facts.start if facts else None)
    end = until if until is not None else (facts.end if facts and facts.end else None)
    if end is None and start is not None:
        end = time.time()  # still running
    return start, end


def gather_job(cfg: Config, job_id: Optional[str], settings: Dict[str, Any], nodes: Sequence[str] = (),
               since: Optional[float] = None, until: Optional[float] = None, with_hooks: bool = True,
               progress: Optional[Callable[[str], None]] = None) -> Tuple[JobEvidence, Dict[str, Any], Any]:
    """Slurm facts, metrics and hook records of one job (no logs): evidence, source records, JobFacts."""
    from .sources import bundles, prometheus, pushgateway, slurm

    sources: Dict[str, Any] = {}
    facts = None
    if job_id:
        facts, sources["slurm"] = slurm.fetch(job_id, settings["sacct"], cfg.get("hooks", "scontrol"),
                                              float(settings["slurm_timeout_seconds"]))
    node_list = list(nodes) or (facts.nodes if facts else [])
    start, end = _window(facts, since, until)
    metrics = None
    if node_list and start is not None and end is not None:
        metrics, sources["prometheus"] = prometheus.gather(settings, job_id or "", node_list, start, end, progress)
    elif settings["prometheus_url"]:
        sources["prometheus"] = {"read": False, "error": "no node list or time window for the job "
                                                         "(Slurm does not know it: give --nodes and --since)"}
    nodes_facts: Dict[str, Dict[str, Any]] = {}
    if with_hooks and job_id:
        nodes_facts, recs = pushgateway.gather(cfg, settings["pushgateway_url"], job_id, node_list)
        sources.update(recs)
        found, sources["bundles"] = bundles.gather(cfg.get("watcher", "evidence_dir"), job_id, job_uid(facts),
                                                   window=(start, end))
        nodes_facts = pushgateway.merge(nodes_facts, found)
    ev = JobEvidence(job=facts.to_dict() if facts else None, metrics=metrics, nodes=nodes_facts, settings=settings)
    return ev, sources, facts


def job_uid(facts: Any) -> Optional[int]:
    """The job's uid from Slurm's facts (scontrol's UserId, else the user name sacct gives)."""
    if facts is None:
        return None
    if facts.uid is not None:
        return int(facts.uid)
    if facts.user:
        import pwd

        try:
            return pwd.getpwnam(facts.user).pw_uid
        except KeyError:
            return None
    return None


def triage_job(cfg: Config, job_id: Optional[str], logs: Sequence[str] = (), baseline: Optional[str] = None,
               since: Optional[float] = None, until: Optional[float] = None, nodes: Sequence[str] = (),
               progress: Optional[Callable[[str], None]] = None,
               log_progress: Optional[Callable[[str, int], None]] = None) -> TriageResult:
    """The whole pipeline for one job; every source that fails is a note in ``sources``, never an error."""
    from .sources import settings as read_settings

    s = read_settings(cfg)
    ev, sources, facts = gather_job(cfg, job_id, s, nodes, since, until, progress=progress)
    # The job's own logs, also when unreadable from here (node-local paths): the sources block says so.
    paths = list(dict.fromkeys(p for p in ((facts.stdout, facts.stderr) if facts else ()) if p))
    paths += [p for p in expand_paths(logs) if p not in paths]
    ev.events, sources["logs"] = scan_many(paths, progress=log_progress)
    if baseline:
        ev.baseline, base_sources, _ = gather_job(cfg, baseline, s, with_hooks=False, progress=progress)
        sources["baseline"] = {"read": bool(ev.baseline.job or ev.baseline.metrics), "job": baseline,
                               **{k: v for k, v in base_sources.items() if not v.get("read")}}
    findings = run_job_rules(ev)
    if only_weak(findings):
        ev.events += first_error_events(paths, sources["logs"]) + completed(facts)
        findings = run_job_rules(ev)
    result = TriageResult(job_id, findings, sources, ev.events)
    result.job_facts = ev.job
    return result


def completed(facts: Any) -> List[LogEvent]:
    """Slurm's word that the job and every step of it succeeded (COMPLETED, exit 0, no signal), as a success
    marker (:mod:`.healthy`): with no error line in its logs, the word guess and setting hints name no cause."""
    if facts is None or facts.state != "COMPLETED" or facts.exit_code != 0 or facts.signal:
        return []
    if any(st.get("state") != "COMPLETED" for st in facts.steps):
        return []
    return [LogEvent(healthy.KIND, "slurm", 0, f"job {facts.job_id}: state COMPLETED, exit 0",
                     fields={"marker": "slurm_completed", "what": "Slurm says the job and its steps completed, exit 0"})]


def evidence_read(sources: Dict[str, Any]) -> bool:
    """True when at least one source other than Slurm itself gave evidence (logs, metrics, hook records)."""
    if any(v.get("read") for v in (sources.get("logs") or {}).values()):
        return True
    return any((sources.get(k) or {}).get("read") for k in ("prometheus", "state", "slurm")) or \
        bool((sources.get("pushgateway") or {}).get("nodes"))
