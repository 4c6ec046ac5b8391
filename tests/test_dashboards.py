"""The Grafana dashboards as files: current schema, the data source as a variable (no
hard-coded UIDs), a job_id variable on the job dashboard, every panel with a PromQL target.
Whether each query parses and returns data is tests/test_dashboards_lab.py's job."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = sorted((ROOT / "etc" / "grafana").glob("slurm-triage-*.json"))
DS = {"type": "prometheus", "uid": "${datasource}"}
MIN_SCHEMA = 39  # Grafana 11


def load(path: Path) -> Dict[str, Any]:
    return json.loads(path.read_text())


def panels(dash: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])


def targets(dash: Dict[str, Any]) -> Iterator[Tuple[Dict[str, Any], Dict[str, Any]]]:
    for p in panels(dash):
        for t in p.get("targets", []):
            yield p, t


def uids(obj: Any) -> List[str]:
    if isinstance(obj, dict):
        return [str(v) for k, v in obj.items() if k == "uid"] + [u for v in obj.values() for u in uids(v)]
    if isinstance(obj, list):
        return [u for v in obj for u in uids(v)]
    return []


def test_both_dashboards_are_there():
    assert [p.name for p in DASHBOARDS] == ["slurm-triage-fleet.json", "slurm-triage-job.json"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_schema_and_data_source_variable(path):
    dash = load(path)
    assert dash["schemaVersion"] >= MIN_SCHEMA and "uid" not in dash and "__inputs" not in dash
    names = {v["name"]: v for v in dash["templating"]["list"]}
    assert names["datasource"]["type"] == "datasource" and names["datasource"]["query"] == "prometheus"
    assert set(uids(dash)) <= {"${datasource}", "-- Grafana --"}, f"{path.name}: hard-coded uid"
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            assert v["datasource"] == DS, v["name"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_panel_queries_prometheus_through_the_variable(path):
    dash = load(path)
    ids = [p["id"] for p in panels(dash)]
    assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"
    for p in panels(dash):
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, f"{path.name}: panel {p['title']!r} wider than the grid"
        if p["type"] == "row":
            continue
        assert p["datasource"] == DS and p.get("targets"), f"{path.name}: panel {p['title']!r}"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), f"{path.name}: panel {p['title']!r} repeats a refId"
        for t in p["targets"]:
            assert t["datasource"] == DS and t["expr"].strip(), f"{path.name}: panel {p['title']!r} {t['refId']}"


def test_the_job_dashboard_is_keyed_by_job_id():
    dash = load(ROOT / "etc" / "grafana" / "slurm-triage-job.json")
    assert "job_id" in {v["name"] for v in dash["templating"]["list"]}
    watcher = [t["expr"] for p, t in targets(dash) if "slurm_triage_watch_" in t["expr"] or "hang_suspected" in t["expr"]]
    assert watcher and all('slurm_job_id="$job_id"' in e for e in watcher)


def test_no_rate_or_increase_over_a_gauge():
    for path in DASHBOARDS:
        for p, t in targets(load(path)):
            for fn, arg in re.findall(r"\b(rate|increase|irate)\(\s*([a-z_:]+)", t["expr"]):
                assert arg.endswith("_total") or arg.endswith(":max"), f"{path.name}: {p['title']!r}: {fn}({arg})"
