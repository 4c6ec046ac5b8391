"""The shipped Prometheus rules: promtool accepts them, their unit tests pass, and every
alert follows the conventions an SRE expects (severity, for:, runbook section, a test that
fires it and one that does not). promtool comes with Debian's `prometheus` package."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Set

import pytest

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "etc" / "prometheus" / "slurm-triage.rules.yml"
TESTS = sorted((ROOT / "etc" / "prometheus" / "tests").glob("*.yml"))
RUNBOOK = ROOT / "docs" / "runbook.md"
DEAD_MANS_SWITCH = "SlurmTriageWatchdog"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus)")
    return path


def alerts() -> Dict[str, Dict[str, str]]:
    """alert name -> {for, severity, runbook_url, line} read from the rules file's own layout
    (`- alert:` blocks of `key: value` lines; PyYAML is not a dependency)."""
    out: Dict[str, Dict[str, str]] = {}
    current: Dict[str, str] = {}
    for n, line in enumerate(RULES.read_text().splitlines(), 1):
        m = re.match(r"\s*- (alert|record): (\S+)", line)
        if m:
            current = {"line": str(n)}
            if m.group(1) == "alert":
                out[m.group(2)] = current
            continue
        m = re.match(r"\s*(for|severity|runbook_url): (\S+)\s*$", line)
        if m:
            current[m.group(1)] = m.group(2)
    return out


def cases_expecting(kind: str) -> Set[str]:
    """Alert names with a promtool case that expects them firing ("fires") or none ("quiet")."""
    names: Set[str] = set()
    for path in TESTS:
        text = path.read_text()
        for name, rest in re.findall(r"alertname: (\w+)\n\s*exp_alerts:(.*)", text):
            if (rest.strip().startswith("[]")) == (kind == "quiet"):
                names.add(name)
    return names


def test_promtool_check_rules_is_clean():
    r = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_promtool_unit_tests_pass():
    assert TESTS, "no etc/prometheus/tests/*.yml"
    r = subprocess.run([promtool(), "test", "rules", *map(str, TESTS)], capture_output=True, text=True,
                       cwd=str(RULES.parent), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_broken_expectation_fails(tmp_path):
    """The unit tests can fail: the Xid case expecting node4 (an application Xid 45, WARN) must."""
    src = (RULES.parent / "tests" / "node.yml").read_text()
    bad = src.replace("exp_labels: {severity: critical, node: node2, gpu_uuid: GPU-3}",
                      "exp_labels: {severity: critical, node: node4, gpu_uuid: GPU-1}", 1)
    assert bad != src
    (tmp_path / "tests").mkdir()
    shutil.copy(RULES, tmp_path / RULES.name)
    (tmp_path / "tests" / "node.yml").write_text(bad)
    r = subprocess.run([promtool(), "test", "rules", "tests/node.yml"], capture_output=True, text=True,
                       cwd=str(tmp_path), timeout=120)
    assert r.returncode != 0 and "SlurmTriageXidCritical" in r.stdout + r.stderr


def test_every_alert_has_severity_for_and_its_runbook_section():
    anchors = set(re.findall(r'<a id="(alert-name-[a-z]+)"></a>', RUNBOOK.read_text()))
    problems: List[str] = []
    for name, a in alerts().items():
        where = f"{RULES.name}:{a['line']}: {name}"
        if not re.fullmatch(r"SlurmTriage[A-Z][A-Za-z]+", name):
            problems.append(f"{where}: not a SlurmTriage CamelCase name")
        if name == DEAD_MANS_SWITCH:
            if "for" in a or a.get("severity") != "none":
                problems.append(f"{where}: the dead man's switch fires at once with severity none")
        else:
            if a.get("severity") not in ("warning", "critical"):
                problems.append(f"{where}: severity {a.get('severity')!r}")
            if "for" not in a:
                problems.append(f"{where}: no for:")
        anchor = f"alert-name-{name.lower()}"
        if a.get("runbook_url") != f"docs/runbook.md#{anchor}":
            problems.append(f"{where}: runbook_url {a.get('runbook_url')!r}")
        if anchor not in anchors:
            problems.append(f"{where}: docs/runbook.md has no section {anchor}")
    assert not problems, "\n".join(problems)


def test_every_alert_has_a_firing_and_a_quiet_unit_test():
    names = set(alerts())
    missing_fire = names - cases_expecting("fires")
    missing_quiet = names - cases_expecting("quiet") - {DEAD_MANS_SWITCH}
    assert not missing_fire, f"no promtool case fires: {sorted(missing_fire)}"
    assert not missing_quiet, f"no promtool case expects silence: {sorted(missing_quiet)}"


def test_no_rate_or_increase_over_a_gauge():
    """Hook gauges are last values: rate()/increase() may only take counters (*_total) or
    records of merged counters (:max)."""
    text = RULES.read_text()
    for fn, arg in re.findall(r"\b(rate|increase|irate)\(\s*([a-z_:]+)", text):
        assert arg.endswith("_total") or arg.endswith(":max"), f"{fn}({arg}[...]) over a gauge"


def test_every_finding_category_has_a_runbook_section():
    from slurm_triage.triage.model import CATEGORIES

    anchors = set(re.findall(r'<a id="category-([a-z_]+)"></a>', RUNBOOK.read_text()))
    assert set(CATEGORIES) <= anchors, sorted(set(CATEGORIES) - anchors)
