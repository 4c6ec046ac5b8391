"""Triage rules over parsed log events: pure functions, registered explicitly so they can be listed.

Log rules take every :class:`LogEvent` of a job, job rules the whole :class:`JobEvidence`
(Slurm facts, metrics, our hooks' records); both return findings, and :func:`correlate` then
applies "first failure wins": the earliest non-symptom finding is the root cause, and symptoms
that usually follow another failure (collective timeouts, socket resets, Xid 45, a step
cancelled by srun) point to it with ``caused_by``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

from ...model import Verdict
from .. import healthy
from ..model import CATEGORIES, FALLBACK, JobEvidence, LogEvent, TriageFinding
from . import catalog, fallback, gpu, memory, metrics, nccl, pushed, slurm
from .common import of_kind

RuleFn = Callable[[Any], List[TriageFinding]]
"""A log rule takes List[LogEvent], a job rule (in JOB_RULES) takes JobEvidence."""


@dataclass(frozen=True)
class Rule:
    id: str
    categories: Tuple[str, ...]
    fn: RuleFn

    @property
    def doc(self) -> str:
        return (self.fn.__doc__ or "").strip().splitlines()[0]


RULES: Tuple[Rule, ...] = (
    Rule("log.xid", ("gpu_hardware",), gpu.xid_events),
    Rule("log.cuda_error", ("gpu_hardware",), gpu.cuda_errors),
    Rule("log.gpu_memory_held_elsewhere", ("host_resources",), memory.held_elsewhere),
    Rule("log.ib_completion", ("network",), nccl.ib_completion_errors),
    Rule("log.store_barrier", ("collective_hang", "config"), nccl.store_barrier_timeouts),
    Rule("log.watchdog", ("collective_hang",), nccl.watchdog_timeouts),
    Rule("log.slurm_cancel", ("scheduler",), slurm.cancellations),
    Rule("log.memory_request_refused", ("config",), slurm.memory_request_refused),
    Rule("log.catalog", CATEGORIES, catalog.catalog_findings),
    Rule("log.first_error", (FALLBACK,), fallback.first_error),
)
"""Python rules reason across lines; ``log.catalog`` judges every catalog entry that names none;
``log.first_error`` speaks only when the scan found nothing (its events come from a second pass)."""

JOB_RULES: Tuple[Rule, ...] = (
    Rule("slurm.state", ("scheduler", "memory"), slurm.job_state),
    Rule("metric.thermal", ("thermal_power",), metrics.thermal_throttling),
    Rule("metric.straggler", ("thermal_power", "host_resources"), metrics.stragglers),
    Rule("metric.hang", ("collective_hang",), metrics.power_axiom_hang),
    Rule("metric.gpu_events", ("gpu_hardware",), metrics.gpu_events),
    Rule("metric.ib", ("network",), metrics.ib_errors),
    Rule("metric.host", ("host_resources",), metrics.host_contention),
    Rule("metric.baseline", ("host_resources", "config"), metrics.baseline_diff),
    Rule("node.leftovers", ("host_resources",), pushed.leftovers),
    Rule("node.public_dashboard", ("security",), pushed.public_dashboards),
    Rule("node.hardware", ("gpu_hardware", "network"), pushed.node_hardware),
    Rule("node.rdma", ("network",), pushed.rdma_rises),
)


def _when(f: TriageFinding) -> Tuple[float, Tuple[int, int]]:
    return (f.first_time if f.first_time is not None else float("inf"), f.first_order)


def _after(f: TriageFinding, root: TriageFinding) -> bool:
    """False only when both carry times and ``f`` clearly came first (1 s of clock slack)."""
    if f.first_time is None or root.first_time is None:
        return True
    return f.first_time >= root.first_time - 1.0


CONFIDENT = 0.8
"""From here a root cause reads as established; a wrong one at this level misleads an SRE most."""
CONTESTED = 0.75
"""What a root cause may claim when it is only a symptom, or another cause contests it."""
SIMILAR = 0.15
"""A cause of another category within this much of the root's confidence contests it."""


def calibrate(root: TriageFinding, others: List[TriageFinding]) -> None:
    """Cap ``root`` below CONFIDENT when it is a symptom (no cause was found, it usually follows one
    that the logs do not show) or when a cause of another category, not explained by the root
    (``others``: neither its consequence nor later on its node), is of similar strength."""
    if root.confidence < CONFIDENT:
        return
    why = ""
    if root.consequence:
        why = "a symptom or an exposure (ranked after any cause), and no cause was found"
    else:
        rival = next((f for f in others if not f.consequence and not fallback.is_fallback(f)
                      and f.category != root.category and f.confidence >= root.confidence - SIMILAR), None)
        if rival is not None:
            why = f"{rival.id} ({rival.category}, {rival.confidence:g}) points elsewhere"
    if why:
        root.evidence["confidence_note"] = f"lowered from {root.confidence:g}: {why}"
        root.confidence = CONTESTED


ADMITTED_CAUSES: Tuple[Tuple[str, Tuple[str, ...], str], ...] = (
    (r"^log\.xid\.(?:62|79)(?:\.|$)", ("thermal_power",),
     "NVIDIA's Xid table counts a thermal issue among the causes of Xid 62 and 79 (and a GPU off the bus "
     "follows power faults too)"),
)
"""(root finding ids, categories that may cause it, why): a loud failure that a quieter finding of such a
category on the same GPU and node can explain, when that finding is not clearly later."""


def _strongest(fits: List[TriageFinding]) -> Optional[TriageFinding]:
    """The most confident of ``fits``, the earliest of equals; None if none."""
    return max(fits, key=lambda f: (f.confidence, -_when(f)[0]), default=None)


def _admitted_cause(root: TriageFinding, findings: List[TriageFinding]) -> Optional[TriageFinding]:
    """The strongest finding that :data:`ADMITTED_CAUSES` lets explain ``root``: a cause (not a
    consequence, not a guess) of an admitted category, on the root's GPU and node where both name one."""
    cats = [c for pattern, c, _ in ADMITTED_CAUSES if re.search(pattern, root.id)]
    if not cats:
        return None
    fits = [f for f in findings if f is not root and not f.consequence and not fallback.is_fallback(f)
            and f.category in cats[0] and f.verdict is not Verdict.OK and _after(root, f)
            and (f.gpu is None or root.gpu is None or f.gpu == root.gpu)
            and (f.node is None or root.node is None or f.node == root.node)]
    return _strongest(fits)


SETTING_HINTS = r"^log\.setting\.|^log\.(?:nccl_unroutable_interface|openmpi_btl_tcp_address_mismatch)$"
"""Finding ids of the hints that show a setting or an environment (NCCL's env dump, the interface or network
it chose, a device the container lacks: catalog/config_context.toml): symptom-role, so ranked after any cause."""


def _setting_behind(root: TriageFinding, findings: List[TriageFinding]) -> Optional[TriageFinding]:
    """The strongest setting hint (:data:`SETTING_HINTS`) that may explain ``root``, a communication failure
    (collective timeout, socket/IB/OFI error) below CONFIDENT, when the hint is not clearly later: such a
    failure usually follows a cause the log names only quietly, and a setting the job chose is the likeliest."""
    if root.category not in fallback.COMMUNICATION or root.confidence >= CONFIDENT or re.search(SETTING_HINTS, root.id):
        return None
    fits = [f for f in findings if f is not root and re.search(SETTING_HINTS, f.id)
            and f.verdict is not Verdict.OK and _after(root, f)]
    return _strongest(fits)


def _symptom_only(root: TriageFinding) -> bool:
    """The root is a communication symptom (collective timeout, reset connection, generic NCCL
    error) and no cause was found: its cause is elsewhere, so the log's words may name it."""
    return root.consequence and root.category in fallback.COMMUNICATION and not fallback.is_fallback(root)


def correlate(findings: List[TriageFinding]) -> List[TriageFinding]:
    """Rank findings root cause first, its consequences next, then the rest; set ``caused_by``. The
    root is the earliest cause; when no cause carries a time, the order of a paste says nothing, and
    hardware evidence (tier 0) goes first. A loud failure gives way to a finding the paste shows
    that can cause it (:data:`ADMITTED_CAUSES`), a communication failure to a setting the log shows
    (:func:`_setting_behind`) unless the log's words already lean to a cause behind it; a
    contested root cause is not left confident (:func:`calibrate`); a communication symptom
    without a cause gives way to the cause its log's words point to (:func:`fallback.cause_lean`)."""
    if not findings:
        return []
    leans = [f for f in findings if f.id == fallback.LEAN_ID]
    findings = [f for f in findings if f.id != fallback.LEAN_ID]
    if not findings:
        return []
    known = [f for f in findings if not fallback.is_fallback(f)] or findings
    primaries = [f for f in known if not f.consequence] or known
    untimed = all(f.first_time is None for f in primaries)
    root = min(primaries, key=lambda f: (f.tier, _when(f)) if untimed else (_when(f), f.tier))
    symptom: Optional[TriageFinding] = None
    cause = _admitted_cause(root, findings)
    if cause is None and not (leans and _symptom_only(root)):
        cause = _setting_behind(root, findings)
    if cause is not None:
        # The loud failure stays, as the consequence of what the paste shows could cause it.
        symptom, root = root, cause
        root.evidence["explains"] = symptom.id
    elif leans and _symptom_only(root):
        # The guess goes first; the symptom the log showed stays, as its consequence.
        symptom, root, findings = root, leans[0], [leans[0]] + findings
        root.evidence["symptom"] = symptom.id
    children: List[TriageFinding] = []
    others: List[TriageFinding] = []
    for f in findings:
        if f is root:
            continue
        same_node = f.node is None or root.node is None or f.node == root.node
        if f is symptom or _after(f, root) and (f.consequence or (f.tier > root.tier and same_node)):
            f.caused_by = root.id
            children.append(f)
        else:
            others.append(f)
    children.sort(key=_when)
    others.sort(key=lambda f: (-f.verdict.severity, -f.confidence, _when(f)))
    calibrate(root, others)
    return [root] + children + others


def structured_rules() -> Tuple[Rule, ...]:
    """The rules over the structured parsers' events (rules/structured.py), when that layer is present."""
    try:
        from .structured import RULES as found
    except ImportError:
        return ()
    return tuple(found)


def _log_findings(events: List[LogEvent], rules: Tuple[Rule, ...]) -> List[TriageFinding]:
    out: List[TriageFinding] = []
    for rule in rules:
        out.extend(rule.fn(events))
    for rule in structured_rules():
        try:
            out.extend(rule.fn(events))
        except Exception:  # noqa: BLE001 - a broken structured rule must not hide what the others found
            continue
    return out


ABSENCE_GUESSES = SETTING_HINTS + r"|^stall\."
"""Findings that infer a failure from what a log shows quietly or lacks (a setting, a log that stops):
a log that says its run succeeded, without any error line, contradicts them (:func:`_unless_healthy`)."""


def _unless_healthy(events: List[LogEvent], findings: List[TriageFinding]) -> List[TriageFinding]:
    """Nothing, when the log says its run succeeded (:mod:`..healthy` markers), shows no error line and
    holds only guesses (the fallback's, :data:`ABSENCE_GUESSES`): a healthy run's settings and words
    name no cause. Else ``findings`` as they are."""
    if not of_kind(events, healthy.KIND) or of_kind(events, "first_error") or of_kind(events, "first_exception"):
        return findings
    if all(fallback.is_fallback(f) or re.search(ABSENCE_GUESSES, f.id) for f in findings):
        return []
    return findings


def run_rules(events: List[LogEvent], rules: Optional[Tuple[Rule, ...]] = None) -> List[TriageFinding]:
    """Every rule over ``events``, correlated and ranked."""
    return correlate(_unless_healthy(events, _log_findings(events, rules or RULES)))


def run_job_rules(ev: JobEvidence) -> List[TriageFinding]:
    """Log rules over ``ev.events`` and job rules over ``ev``, correlated together: first failure wins
    across log and metric evidence."""
    out = _unless_healthy(ev.events, _log_findings(ev.events, RULES))
    for rule in JOB_RULES:
        out.extend(rule.fn(ev))
    return correlate(out)


def worst_verdict(findings: List[TriageFinding]) -> Verdict:
    return max((f.verdict for f in findings), key=lambda v: v.severity, default=Verdict.OK)
