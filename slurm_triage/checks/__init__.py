"""Node checks: pure functions from collected facts to findings.

A check is one function registered with ``@check``; it reads the fact sections it names
in ``needs`` and returns findings. No I/O happens here, so every check is tested from
recorded facts. When a section could not be collected (probe error or deadline), the
checks that need it are not run and one UNKNOWN finding per missing section says why.
A check lists at most MAX_FINDINGS_PER_CHECK findings (hardware FAILs first); one more
finding counts the rest, so a user's 100,000 files cannot make 100,000 findings.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, List, NamedTuple, Tuple

from ..config import Config
from ..model import Finding, Verdict, sort_findings, worst

Facts = Dict[str, Any]
CheckFn = Callable[[Facts, Config], List[Finding]]
MAX_FINDINGS_PER_CHECK = 50

# Modules that hold checks, imported in this order; adding a module means adding it here.
MODULES = ("gpu", "xid", "leftovers", "listeners", "rdma", "sampling")


class CheckSpec(NamedTuple):
    id: str
    needs: Tuple[str, ...]
    fn: CheckFn

    @property
    def doc(self) -> str:
        return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else ""


REGISTRY: Dict[str, CheckSpec] = {}


def check(id: str, needs: Tuple[str, ...]) -> Callable[[CheckFn], CheckFn]:
    """Register ``fn`` as check ``id`` reading the fact sections ``needs``."""

    def deco(fn: CheckFn) -> CheckFn:
        if id in REGISTRY:
            raise ValueError(f"check id {id!r} registered twice")
        REGISTRY[id] = CheckSpec(id, tuple(needs), fn)
        return fn

    return deco


def load_all() -> Dict[str, CheckSpec]:
    for mod in MODULES:
        importlib.import_module(f"{__name__}.{mod}")
    return REGISTRY


def run_checks(facts: Facts, cfg: Config) -> List[Finding]:
    """Run every enabled check over ``facts``; UNKNOWN for sections that are missing."""
    node = facts.get("node", "")
    disabled = set(cfg.get("checks", "disabled"))
    errors: Dict[str, str] = facts.get("errors", {})
    findings: List[Finding] = []
    for section, err in sorted(errors.items()):
        findings.append(Finding(
            id=f"probe.{section}", verdict=Verdict.UNKNOWN, node=node,
            summary=f"could not collect {section} facts: {err}",
            evidence={"error": err}, action="look at the probe error; the checks needing it were not run"))
    for spec in load_all().values():
        if spec.id in disabled or any(facts.get(s) is None for s in spec.needs):
            continue
        for f in capped(spec.id, spec.fn(facts, cfg)):
            f.node = f.node or node
            findings.append(f)
    return sort_findings(findings)


def capped(check_id: str, found: List[Finding], limit: int = MAX_FINDINGS_PER_CHECK) -> List[Finding]:
    """At most ``limit`` findings, hardware FAILs and worse verdicts first, plus one that
    counts the rest (it keeps their worst verdict and, if any was hardware, that too)."""
    if len(found) <= limit:
        return found
    ranked = sorted(found, key=lambda f: (not f.hardware, -f.verdict.severity))
    kept, rest = ranked[:limit - 1], ranked[limit - 1:]
    by_verdict: Dict[str, int] = {}
    for f in rest:
        by_verdict[f.verdict.value] = by_verdict.get(f.verdict.value, 0) + 1
    counts = ", ".join(f"{n} {v}" for v, n in sorted(by_verdict.items()))
    kept.append(Finding(
        id=check_id, verdict=worst(f.verdict for f in rest), hardware=any(f.hardware for f in rest),
        summary=f"{len(rest)} more {check_id} findings not listed ({counts})",
        evidence={"omitted": len(rest), "by_verdict": by_verdict,
                  "examples": [f.summary for f in rest[:3]]},
        action=rest[0].action))
    return kept
