"""`slurm-triage check`: snapshot this node, judge it, report, optionally push; and
`slurm-triage node resume`, which resumes a node we drained once the evidence allows."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .checks import run_checks
from .config import Config
from .model import SCHEMA, Finding, Verdict, worst
from .snapshot import take


@dataclass
class NodeReport:
    node: str
    snapshot: Dict[str, Any]
    findings: List[Finding]
    seconds: float
    delivery: Optional[str] = None
    warnings: List[str] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        return worst(f.verdict for f in self.findings)

    def to_dict(self, include_snapshot: bool = True) -> Dict[str, Any]:
        d: Dict[str, Any] = {"schema": SCHEMA, "node": self.node, "verdict": self.verdict.value,
                             "seconds": round(self.seconds, 4),
                             "findings": [f.to_dict() for f in self.findings]}
        if include_snapshot:
            d["snapshot"] = self.snapshot
        if self.delivery is not None:
            d["delivery"] = self.delivery
        if self.warnings:
            d["warnings"] = self.warnings
        return d


def check_node(cfg: Config, push: bool = False, sections: Optional[List[str]] = None,
               options: Optional[Dict[str, Dict[str, Any]]] = None,
               grouping: Optional[Dict[str, str]] = None) -> NodeReport:
    """Collect, judge and (with ``push``) deliver; never raises for a down Pushgateway."""
    t0 = time.monotonic()
    snap = take(cfg, sections, options)
    findings = run_checks(snap, cfg)
    report = NodeReport(cfg.get("node", "name"), snap, findings, time.monotonic() - t0,
                        warnings=list(cfg.warnings))
    if push and cfg.get("pushgateway", "url"):
        report.delivery = push_report(cfg, report, grouping or {})
    return report


def push_report(cfg: Config, report: NodeReport, grouping: Dict[str, str]) -> str:
    """Render and deliver (spooling on failure); returns a one-line delivery status."""
    from .sinks.exposition import render
    from .sinks.spool import deliver, stats

    key = {"job": "slurm_triage", "instance": report.node, **grouping}
    result = deliver(cfg, key, render(report.snapshot, report.findings, stats(cfg)))
    if result.error:
        return f"not delivered ({result.error}); {result.spooled} spooled, {result.pending} pending"
    return f"delivered ({result.sent} sent, {result.pending} pending)"


def render_text(report: NodeReport) -> str:
    """A table an admin reads at a glance: worst first, the action under each finding."""
    shown = [f for f in report.findings if f.verdict != Verdict.OK]
    lines = [f"{report.node}: {report.verdict.value}  ({len(shown)} findings, {report.seconds:.2f} s)"]
    gpus = (report.snapshot.get("gpu") or {}).get("gpus") or []
    by_uuid = {g.get("uuid"): g for g in gpus}
    if gpus:
        lines.append(f"  {len(gpus)} GPUs: {gpus[0].get('name', '?')}, driver "
                     f"{(report.snapshot.get('gpu') or {}).get('driver_version', '?')}")
    for w in report.warnings:
        lines.append(f"  warning: {w}")
    if shown:
        lines.append("")
        lines.append(f"  {'VERDICT':<8} {'CHECK':<22} {'WHERE':<28} SUMMARY")
    for f in shown:
        where = ""
        if f.gpu:
            g = by_uuid.get(f.gpu, {})
            where = f"GPU {g.get('index', '?')} {f.gpu[:12]}…" if len(f.gpu) > 14 else f.gpu
        elif f.pid is not None:
            where = f"pid {f.pid}"
        lines.append(f"  {f.verdict.value:<8} {f.id:<22} {where:<28} {f.summary}")
        if f.action:
            lines.append(f"  {'':<8} {'':<22} {'':<28} → {f.action}")
    if report.delivery:
        lines.append(f"  push: {report.delivery}")
    return "\n".join(lines) + "\n"


@dataclass
class Evidence:
    """What a resume is decided from: a verdict about the node, when, and from where."""
    allowed: bool
    why: str
    lines: List[str] = field(default_factory=list)


def _metrics(group: Dict[str, Any], name: str) -> List[Dict[str, Any]]:
    return ((group.get(name) or {}).get("metrics")) or []


def _value(m: Dict[str, Any]) -> Optional[float]:
    try:
        return float(m.get("value"))
    except (TypeError, ValueError):
        return None


def judge_pushed(groups: List[Dict[str, Any]], node: str, drained_at: Optional[float], reason: str,
                 now: float, max_age: float) -> Evidence:
    """Pure: may ``node`` be resumed on its newest pushed check result (``/api/v1/metrics``)?

    Only a result newer than the drain and younger than ``max_age`` counts, its verdict
    OK or WARN; for a drain that names a GPU, a result whose GPU probe did not answer
    (UNKNOWN) is no evidence that the GPU is back.
    """
    best: Optional[Tuple[float, Dict[str, Any]]] = None
    for g in groups:
        labels = g.get("labels") or {}
        if labels.get("job") != "slurm_triage" or labels.get("instance") != node:
            continue
        for m in _metrics(g, "slurm_triage_check_timestamp_seconds"):
            t = _value(m)
            if t is not None and _metrics(g, "slurm_triage_node_verdict") and (best is None or t > best[0]):
                best = (t, g)
    if best is None:
        return Evidence(False, f"no check result of {node} in the Pushgateway")
    t, g = best
    phase = (g.get("labels") or {}).get("phase") or "check"
    verdict = next((m["labels"].get("verdict") for m in _metrics(g, "slurm_triage_node_verdict")
                    if _value(m) == 1.0), "?")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))
    lines = [f"evidence: {node}'s own {phase} result pushed from {node}, taken {stamp} "
             f"({now - t:.0f} s ago): {verdict}"]
    gpus = [m.get("labels", {}) for m in _metrics(g, "slurm_triage_gpu_info")]
    driver = [m.get("labels", {}) for m in _metrics(g, "slurm_triage_gpu_driver_info")]
    if gpus:
        lines.append(f"  {len(gpus)} GPUs ({gpus[0].get('name', '?')}), driver "
                     f"{driver[0].get('driver_version', '?') if driver else '?'}: "
                     + ", ".join(f"{x.get('index', '?')}={x.get('gpu_uuid', '?')[:12]}" for x in gpus))
    bad = [m.get("labels", {}) for m in _metrics(g, "slurm_triage_findings")
           if m.get("labels", {}).get("verdict") in ("FAIL", "WARN", "UNKNOWN")]
    lines += [f"  {b.get('verdict')} {b.get('check')} {b.get('gpu_uuid') or ''}".rstrip() for b in bad[:5]]
    if drained_at is not None and t <= drained_at:
        return Evidence(False, f"{node}'s newest result ({stamp}) is not newer than its drain", lines)
    if now - t > max_age:
        return Evidence(False, f"{node}'s newest result ({stamp}) is older than drain.resume_max_age_seconds "
                               f"= {max_age:g}", lines)
    if verdict not in ("OK", "WARN"):
        return Evidence(False, f"{node}'s newest result is {verdict}", lines)
    gpu_up = [_value(m) for m in _metrics(g, "slurm_triage_probe_up") if m.get("labels", {}).get("probe") == "gpu"]
    if "GPU" in reason.upper() and gpu_up != [1.0]:
        return Evidence(False, f"{node} was drained for a GPU reason and its GPU probe gave no answer", lines)
    return Evidence(True, f"{node}'s own result is {verdict}", lines)


def _gateway_groups(cfg: Config) -> List[Dict[str, Any]]:
    import requests

    url = cfg.get("triage", "pushgateway_url") or cfg.get("pushgateway", "url")
    if not url:
        raise OSError("no Pushgateway configured (pushgateway.url)")
    with requests.Session() as session:
        session.trust_env = False
        try:
            # an admin's read of every group, as triage's: not bound by a hook's push timeout
            r = session.get(url.rstrip("/") + "/api/v1/metrics", timeout=cfg.get("triage", "prometheus_timeout_seconds"))
            r.raise_for_status()
            return r.json().get("data") or []
        except (requests.RequestException, ValueError) as e:
            raise OSError(f"{url}: {e}") from None


def resume_node(cfg: Config, node: str, force: bool = False, here: str = "") -> bool:
    """Resume ``node`` if its drain reason is ours and evidence *about it* no longer FAILs;
    True when resumed. On ``node`` itself (``here``), its checks run now; anywhere else its
    newest pushed check result decides (see judge_pushed). Slurm's "Prolog error" standing in
    for a reason we could not set (slurmctld was away) gets our reason back first, so the
    cause is judged, not lost."""
    from . import drains
    from .slurmctl import SlurmError, node_state, resume

    try:
        current = node_state(cfg, node)
        if current.hook_error and drains.pending(cfg, node) is not None:
            print(f"{node}: {drains.reapply(cfg, node)}")
            current = node_state(cfg, node)
        if not current.ours:
            print(f"{node}: reason {current.reason!r} is not ours; leaving it", file=sys.stderr)
            return False
        if not force:
            evidence = _judge_here(cfg, node, current.reason) if here == node else _judge_remote(cfg, node, current)
            for line in evidence.lines:
                print(line)
            if not evidence.allowed:
                print(f"{node}: {evidence.why}; not resuming. Run on {node}: slurm-triage check --push "
                      f"(or let its HealthCheckProgram push), then rerun `slurm-triage node resume {node}` "
                      "(--force to override)", file=sys.stderr)
                return False
        print(resume(cfg, node))
        drains.clear(cfg)
    except SlurmError as e:
        print(f"slurm-triage: {e}", file=sys.stderr)
        return False
    return True


def _judge_here(cfg: Config, node: str, reason: str) -> Evidence:
    report = check_node(cfg)
    lines = render_text(report).rstrip("\n").splitlines()
    if report.verdict == Verdict.FAIL:
        return Evidence(False, "checks still FAIL", lines)
    if "GPU" in reason.upper() and (report.snapshot.get("gpu") is None or "gpu" in (report.snapshot.get("errors") or {})):
        return Evidence(False, "drained for a GPU reason and the GPU probe gave no answer", lines)
    return Evidence(True, f"checks {report.verdict.value} on {node}", lines)


def _judge_remote(cfg: Config, node: str, current: Any) -> Evidence:
    try:
        groups = _gateway_groups(cfg)
    except OSError as e:
        return Evidence(False, f"cannot read {node}'s pushed results: {e}")
    return judge_pushed(groups, node, current.reason_time, current.reason, time.time(),
                        cfg.get("drain", "resume_max_age_seconds"))
