"""The shipped alert rules in the lab's real Prometheus: each injected fault (Xid 79 node,
NCCL hang, leftover rank, Pushgateway stopped) fires its alert through /api/v1/alerts, and
a healthy run fires none. Skipped (with the reason) when `make lab-up` has not run.

The lab's Prometheus reads $LAB_DIR/prom/rules/*.yml (lab/etc/prometheus.yml.in). Besides
the shipped file, this module installs a test-only copy of its alerts with every `for:` at
0s and the label lab="fast", so that a fault shows within seconds; the shipped file keeps
the documented thresholds and is checked to load without errors.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from typing import Any, Callable, Dict, Iterator, List

import pytest

import lab as labmod

RULES = labmod.ROOT / "etc" / "prometheus" / "slurm-triage.rules.yml"
FAST_FILE = "zz-lab-fast.rules.yml"
CLI = str(labmod.ROOT / ".venv" / "bin" / "slurm-triage")
FAST_WATCHER = "[watcher]\ninterval_seconds = 0.5\nhang_window_seconds = 2.0\nstraggler_window_seconds = 2.0\n"
# Alerts that look back over a window (increase, max_over_time): a fault of an earlier
# session (a stopped Pushgateway counts internal errors, an Xid test) keeps them firing
# until the window has passed: the healthy run checks instead that it counted no error itself.
WINDOWED = {name for name, expr in re.findall(r"- alert: (\w+)\n\s+(?:#.*\n\s+)*expr: ((?:.*\n)+?)\s+for: ",
                                              RULES.read_text())
            if "increase(" in expr or "max_over_time(" in expr}


def fast_copy(text: str) -> str:
    """The shipped alert groups with for: 0s and lab="fast" (no recording rules: those come
    from the shipped file, loaded next to it)."""
    groups = re.split(r"(?m)^(?=  - name: )", text)
    alert_groups = [g for g in groups[1:] if "- alert: " in g]
    out = "".join(alert_groups).replace("- name: slurm-triage.", "- name: lab-fast.")
    out = re.sub(r"(?m)^(\s+)for: \S+$", r"\1for: 0s", out)
    out = re.sub(r"(?m)^(\s+)labels:\n", lambda m: f"{m.group(0)}{m.group(1)}  lab: fast\n", out)
    return "groups:\n" + out


def prom_get(lab: labmod.Lab, path: str, **params: str) -> Any:
    url = lab.prometheus_url + path + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]


def query(lab: labmod.Lab, expr: str) -> List[Dict[str, Any]]:
    return prom_get(lab, "/api/v1/query", query=expr)["result"]


def reload(lab: labmod.Lab) -> None:
    req = urllib.request.Request(lab.prometheus_url + "/-/reload", method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


def firing(lab: labmod.Lab, fast: bool = True) -> List[Dict[str, str]]:
    """Labels (plus activeAt) of the alerts firing now; only the lab="fast" copies by default."""
    out = []
    for a in prom_get(lab, "/api/v1/alerts")["alerts"]:
        if a["state"] == "firing" and (a["labels"].get("lab") == "fast") == fast:
            out.append({**a["labels"], "activeAt": a["activeAt"]})
    return out


def wait_for(what: Callable[[], Any], seconds: float) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        got = what()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(1.0)


def wait_alert(lab: labmod.Lab, name: str, seconds: float = 45, **labels: str) -> List[Dict[str, str]]:
    def match() -> List[Dict[str, str]]:
        return [a for a in firing(lab) if a["alertname"] == name
                and all(a.get(k) == v for k, v in labels.items())]

    got = wait_for(match, seconds)
    assert got, f"{name}{labels} not firing after {seconds}s; firing: " + \
        json.dumps([{k: v for k, v in a.items() if k != "activeAt"} for a in firing(lab)])
    return got


def checked_since(lab: labmod.Lab, t0: float, nodes: List[str]) -> bool:
    """Prometheus holds, for every node, a check taken after t0 (the run's hooks are in)."""
    rows = query(lab, "max by (node) (slurm_triage:check_timestamp_seconds:freshest)")
    seen = {r["metric"].get("node"): float(r["value"][1]) for r in rows}
    return all(seen.get(n, 0) >= t0 for n in nodes)


def healthy_run(lab: labmod.Lab) -> float:
    """A 4-node job on healthy nodes; returns when Prometheus has every node's new check."""
    t0 = time.time()
    r = lab.srun("-N4", "true", timeout=60)
    assert r.returncode == 0, r.stderr
    lab.wait_idle()
    assert wait_for(lambda: checked_since(lab, t0, lab.nodes), 40), "the healthy run's checks never reached Prometheus"
    time.sleep(12)  # two evaluation intervals: the records, then the alerts, see the new check
    return t0


@pytest.fixture(scope="module")
def rules() -> Iterator[labmod.Lab]:
    """The lab with the shipped rules and their fast copy loaded. After the module, one
    healthy run replaces the faults' last groups (the next session starts from a quiet
    Prometheus) and the fast copy is removed."""
    lab = labmod.require()
    config = prom_get(lab, "/api/v1/status/config")["yaml"]
    rules_dir = lab.dir / "prom" / "rules"
    if str(rules_dir) not in config:
        pytest.skip(f"the lab's Prometheus config has no rule_files for {rules_dir} (a lab older than "
                    "lab/etc/prometheus.yml.in's rule_files): make lab-down && make lab-up")
    rules_dir.mkdir(exist_ok=True)
    (rules_dir / RULES.name).write_text(RULES.read_text())
    (rules_dir / FAST_FILE).write_text(fast_copy(RULES.read_text()))
    reload(lab)
    try:
        yield lab
    finally:
        lab.reset()
        healthy_run(lab)
        (rules_dir / FAST_FILE).unlink()
        reload(lab)


@pytest.fixture(scope="module")
def healthy(rules: labmod.Lab) -> float:
    """One healthy 4-node run on the reset lab; its start (unix time)."""
    rules.reset()
    return healthy_run(rules)


def internal_errors(lab: labmod.Lab, node: str) -> str:
    p = lab.node_dir(node) / "state" / "internal_errors_total"
    return p.read_text().strip() if p.exists() else "0"


def test_the_shipped_rules_load_without_errors(rules):
    groups = {g["name"]: g for g in prom_get(rules, "/api/v1/rules")["groups"]}
    for name in ("slurm-triage.records", "slurm-triage.node", "slurm-triage.job", "slurm-triage.self"):
        assert name in groups, sorted(groups)
        bad = [(r["name"], r.get("lastError")) for r in groups[name]["rules"] if r["health"] == "err"]
        assert not bad, bad
    shipped = [r for r in groups["slurm-triage.node"]["rules"] if r["name"] == "SlurmTriageXidCritical"]
    assert shipped[0]["duration"] == 60  # the documented for: 1m, not the test copy's 0s
    assert wait_for(lambda: [a for a in firing(rules, fast=False) if a["alertname"] == "SlurmTriageWatchdog"], 20)


def test_every_metric_the_rules_read_exists_in_the_lab(rules, healthy):
    used = set(re.findall(r"\b(slurm_triage_[a-z_]+|push_(?:failure_)?time_seconds|node_textfile_scrape_error)\b",
                          RULES.read_text()))
    # the watcher's and the --triage Prolog's families exist once a --triage step ran (a fresh lab has none)
    r = rules.srun("--triage", "-N4", "sleep", "7", timeout=90)
    assert r.returncode == 0, r.stderr
    rules.wait_idle()
    # slurm_triage_findings exists once a check found something, and a Prolog's findings are gone with
    # its Epilog: a published check of node1 with hot GPUs (a scenario's fixed NVML readings, no clock
    # involved) keeps one until the test deletes it.
    rules.set_scenario("node1", "h100x8-thermal.json")
    try:
        check = rules.run(CLI, "check", "--push", "--format", "json", user=None,
                          extra_env={"SLURM_TRIAGE_CONFIG": str(rules.triage_config), "SLURMD_NODENAME": "node1"})
        found = [f["id"] for f in json.loads(check.stdout)["findings"] if f["verdict"] != "OK"]
        assert any(f.startswith("gpu.") for f in found), check.stdout[-2000:] + check.stderr

        def missing() -> List[str]:
            return sorted(used - set(prom_get(rules, "/api/v1/label/__name__/values")))
        wait_for(lambda: not missing(), 30)
        assert not missing(), missing()
    finally:
        rules.set_scenario("node1", labmod.DEFAULT_SCENARIO)
        delete_check_group(rules, "node1")


def test_a_healthy_run_fires_no_alert(rules, healthy):
    lab = rules
    counts = {n: internal_errors(lab, n) for n in lab.nodes}
    healthy_run(lab)
    assert {n: internal_errors(lab, n) for n in lab.nodes} == counts, "the healthy run counted internal errors"
    loud = [a for a in firing(lab) + firing(lab, fast=False)
            if a["alertname"] != "SlurmTriageWatchdog" and a["alertname"] not in WINDOWED]
    assert not loud, loud


def test_windowed_alerts_are_told_apart():
    assert {"SlurmTriageInternalErrors", "SlurmTriageXidCritical", "SlurmTriageGpuEccUncorrectable"} <= WINDOWED
    assert "SlurmTriageGpuMissing" not in WINDOWED and "SlurmTriagePushgatewayDown" not in WINDOWED


def alert_keys(alerts: List[Dict[str, str]]) -> List[str]:
    return sorted(json.dumps({k: v for k, v in a.items() if k != "activeAt"}, sort_keys=True) for a in alerts)


def test_xid79_node_fires_gpu_missing_drained_and_xid(rules, lab):
    before = set(alert_keys(firing(lab)))  # an Xid of an earlier session counts for an hour
    lab.set_scenario("node2", "h100x8-xid79.json")
    r = lab.srun("-N4", "true", timeout=60)
    assert r.returncode != 0 and "node2" in r.stderr
    got = wait_alert(lab, "SlurmTriageGpuMissing", node="node2")
    assert got[0]["severity"] == "critical"
    wait_alert(lab, "SlurmTriageNodeDrainedByTriage", node="node2")
    # The Prolog's Xid finding lived until its Epilog deleted the group (seconds); the
    # runbook's confirmation, `slurm-triage check --push` on the node, publishes it to stay.
    try:
        check = lab.run(CLI, "check", "--push", user=None,
                        extra_env={"SLURM_TRIAGE_CONFIG": str(lab.triage_config), "SLURMD_NODENAME": "node2"})
        assert check.returncode == 1 and "Xid 79" in check.stdout, check.stdout + check.stderr
        xid = wait_alert(lab, "SlurmTriageXidCritical", node="node2")
        assert xid[0]["gpu_uuid"].startswith("GPU-")
        others = [k for k in alert_keys(firing(lab)) if k not in before and '"node": "node2"' not in k]
        assert not others, others
    finally:
        delete_check_group(lab, "node2")


def delete_check_group(lab: labmod.Lab, node: str) -> None:
    """Remove the `check --push` group (it would otherwise outlive the test)."""
    req = urllib.request.Request(f"{lab.pushgateway_url}/metrics/job/slurm_triage/instance/{node}", method="DELETE")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status in (200, 202)


def test_nccl_hang_fires_collective_hang_on_the_hung_node_only(rules, lab):
    with lab.config(FAST_WATCHER):
        lab.set_scenario("node1", "h100x8-busy.json")
        lab.set_scenario("node2", "h100x8-nccl-hang.json")
        step = subprocess.Popen(
            ["runuser", "-u", labmod.TEST_USER, "--", "env", "-i", "PATH=/usr/bin:/bin", f"SLURM_CONF={lab.slurm_conf}",
             "srun", "--triage", "-N2", "-w", "node1,node2", "sh", "-c",
             'test "$SLURM_NODEID" = 0 && echo "$SLURM_JOB_ID"; sleep 40'],
            cwd=str(lab.workdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert step.stdout is not None
            job = step.stdout.readline().strip()
            assert job.isdigit(), step.stderr.read() if step.stderr else job
            wait_alert(lab, "SlurmTriageCollectiveHangSuspected", node="node2", slurm_job_id=job)
            assert not [a for a in firing(lab) if a["alertname"] == "SlurmTriageCollectiveHangSuspected"
                        and a.get("node") == "node1"]
        finally:
            lab.run("scancel", "-u", labmod.TEST_USER, user=None)
            step.wait(60)


def test_leftover_rank_fires_leftovers_found(rules, lab):
    with lab.escaped_process("node1", shm=f"/dev/shm/nccl-lab-{uuid.uuid4().hex[:8]}") as left:
        lab.wait_idle(["node1"])
        job = lab.sbatch("-N1", "-w", "node1", "-o", "/dev/null", "--wrap", "sleep 60")
        lab.wait_job(job, states=("RUNNING",), timeout=30)
        got = wait_alert(lab, "SlurmTriageLeftoversFound", node="node1", check="leftover.process", slurm_job_id=str(job))
        assert got[0]["severity"] == "warning"
        assert left["pid"]  # still alive: the check saw a real escaped rank


def test_pushgateway_stopped_fires_pushgateway_down(rules, lab):
    pid = int((lab.dir / "run" / "pushgateway.pid").read_text())
    os.kill(pid, signal.SIGSTOP)  # a hung gateway: the scrape times out
    try:
        got = wait_alert(lab, "SlurmTriagePushgatewayDown", seconds=60)
        assert got[0]["severity"] == "critical" and got[0]["job"] == "pushgateway"
    finally:
        os.kill(pid, signal.SIGCONT)
    assert wait_for(lambda: not [a for a in firing(lab) if a["alertname"] == "SlurmTriagePushgatewayDown"], 60)
