"""`slurm-triage check`: snapshot this node, judge it, report, optionally push."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

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
