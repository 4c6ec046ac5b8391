"""Metric evidence: a real Prometheus (backfilled with promtool, as a site's long history would be)
queried with server-side aggregation, and the pure metric rules on fixtures.

The history is 4 nodes × 8 GPUs × 6 h @ 60 s of dcgm-exporter-style series (bench/bench_triage_prom.py
writes it): GPU 3 of gpu0003 runs hot with HW_THERMAL|HW_SLOWDOWN reasons and a sagging clock from
45 min on, every GPU spins at 100 % util on idle power for 30 min at 4 h, gpu0001's IB symbol error
counter rises, and the watcher's thread count on gpu0002 grows all job.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import Iterator, Tuple

import pytest

from conftest import cli
from slurm_triage.triage.model import JobEvidence
from slurm_triage.triage.rules import metrics as mr
from slurm_triage.triage.rules import run_job_rules
from slurm_triage.triage.sources import DEFAULTS, prometheus

ROOT = Path(__file__).resolve().parent.parent
JOB = "777"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_triage_prom", ROOT / "bench" / "bench_triage_prom.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


@pytest.fixture(scope="module")
def prom(tmp_path_factory) -> Iterator[Tuple[object, object]]:
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (Debian package prometheus)")
    bench = _bench()
    work = tmp_path_factory.mktemp("prom")
    s = bench.Scenario.make(nodes=4, seconds=6 * 3600, step=60)
    bench.build(s, work, JOB, per_metric=False)
    server = bench.PrometheusServer(work / "data")
    server.start()
    try:
        server.wait_for("count(DCGM_FI_DEV_GPU_UTIL)", s.end)
        yield server, s
    finally:
        server.stop()


def _settings(url: str) -> dict:
    return {**DEFAULTS, "prometheus_url": url}


def test_range_step_stays_under_the_point_limit() -> None:
    eleven_days = 11 * 86400
    step = prometheus.range_step(eleven_days, 10000)
    assert step >= 87 and eleven_days / step <= 11000
    assert prometheus.range_step(3600, 10000) == 15.0
    assert prometheus.range_step(13, 10000) == 2.0  # a 13 s job is still seen several times
    assert prometheus.runs([0, 60, 120, 600, 660], 60) == [(0, 120), (600, 660)]


def test_thermal_straggler_first_and_hang_window(prom) -> None:
    server, s = prom
    nodes = [s.node(i) for i in range(s.nodes)]
    facts, rec = prometheus.gather(_settings(server.url), JOB, nodes, s.start, s.end)
    assert rec["read"] and not rec.get("errors"), rec
    assert len(facts["gpus"]) == 32 and rec["step_seconds"] == 15
    found = run_job_rules(JobEvidence(job={"job_id": JOB}, metrics=facts))
    root = found[0]
    assert root.id == f"metric.thermal.{s.straggler_node}.3" and root.category == "thermal_power"
    assert (root.node, root.gpu) == (s.straggler_node, "3") and root.verdict.value == "FAIL"
    assert abs(root.first_time - s.straggler_from) <= 60
    strag = next(f for f in found if f.id == f"metric.straggler.{s.straggler_node}")
    assert strag.caused_by == root.id and strag.gpu == "3"
    hang = next(f for f in found if f.id == "metric.hang")
    w = hang.evidence["windows"][0]
    assert abs(w["start"] - s.hang[0]) <= 120 and abs(w["end"] - s.hang[1]) <= 180
    assert len(w["nodes"]) == 4 and hang.category == "collective_hang" and hang.caused_by == root.id
    ids = {f.id for f in found}
    assert "metric.ib.gpu0001.mlx5_0.1" in ids and "metric.thread_leak.gpu0002" in ids
    assert not any(i.startswith("metric.thermal.") and i != root.id for i in ids)


def test_a_sample_in_the_second_after_slurms_end_is_the_jobs_own(prom) -> None:
    # Slurm's End is whole seconds: a job that ended at E+0.95 says E, and its last scrape at E+0.9
    # (what a short job's watcher pushed last) must still count; gpu0002's thread count grows by
    # one a sample, so missing the last sample shows
    server, s = prom
    nodes = [s.node(i) for i in range(s.nodes)]
    facts, rec = prometheus.gather(_settings(server.url), JOB, nodes, s.start, s.end - 0.9)
    assert rec["read"], rec
    assert facts["threads"][s.node(2)]["max"] == 200 + (s.end - s.start) // s.step


def test_cli_names_straggler_and_reports_query_times(prom, tmp_path: Path) -> None:
    server, s = prom
    conf = _bench().dead_slurm_conf(tmp_path)
    cp = cli("triage", JOB, "--prometheus", server.url, "--nodes", f"gpu[0000-{s.nodes - 1:04d}]",
             "--since", str(s.start), "--until", str(s.end), "--format", "json",
             env={"SLURM_TRIAGE_CONFIG": "", "SLURM_CONF": str(conf)}, timeout=120)
    assert cp.returncode == 1, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["schema"] == 1 and doc["findings"][0]["node"] == s.straggler_node and doc["findings"][0]["gpu"] == "3"
    p = doc["sources"]["prometheus"]
    assert p["read"] and p["queries"] >= 15 and p["query_seconds_sum"] > 0
    assert doc["sources"]["slurm"]["read"] is False  # a note, not a crash


def test_wrong_metric_name_finds_nothing_but_does_not_fail(prom) -> None:
    server, s = prom
    st = {**_settings(server.url), "metric_clock_reasons": ["no_such_metric"], "metric_ib_errors": ["nope_total"]}
    facts, rec = prometheus.gather(st, JOB, [s.node(i) for i in range(s.nodes)], s.start, s.end)
    assert rec["read"] and facts["ib"] == []
    assert all(g.get("thermal_fraction") is None for g in facts["gpus"])
    assert not mr.thermal_throttling(JobEvidence(metrics=facts))


def test_unreachable_prometheus_is_a_record() -> None:
    facts, rec = prometheus.gather(_settings("http://127.0.0.1:9"), JOB, ["n1"], 0, 3600)
    assert facts is None and rec["read"] is False and rec["error"]
    facts, rec = prometheus.gather(_settings(""), JOB, ["n1"], 0, 3600)
    assert facts is None and "prometheus_url" in rec["error"]


# ---- pure rules on fixtures ---------------------------------------------------------------------

def _gpu(node: str, gpu: str, clock: float = 1980, **kw) -> dict:
    return {"node": node, "gpu": gpu, "uuid": f"GPU-{node}-{gpu}", "clock": clock, "util": 95.0, "power": 600.0,
            "temp_max": 65.0, "thermal_fraction": 0.0, **kw}


def test_thermal_uses_the_gpus_own_threshold() -> None:
    hot = _gpu("a", "1", clock=1400, temp_max=80.0, thermal_fraction=0.5, thermal_since=100.0)
    metrics = {"gpus": [hot, _gpu("a", "0"), _gpu("b", "0")]}
    generic = mr.thermal_throttling(JobEvidence(metrics=metrics))
    assert generic[0].verdict.value == "WARN"  # 80 C is far from the default 87 C
    nodes = {"a": {"gpus": {"GPU-a-1": {"slowdown_temp_celsius": 83}}, "findings": [], "watch": {}}}
    own = mr.thermal_throttling(JobEvidence(metrics=metrics, nodes=nodes))
    assert own[0].verdict.value == "FAIL" and own[0].evidence["slowdown_from"] == "prolog snapshot"


def test_step_time_straggler_factor() -> None:
    steps = {"a": 1.0, "b": 1.1, "c": 1.05, "d": 2.5}
    out = mr.stragglers(JobEvidence(metrics={"step_time": steps}))
    assert [f.node for f in out] == ["d"] and out[0].category == "host_resources"
    assert not mr.stragglers(JobEvidence(metrics={"step_time": {**steps, "d": 2.0}}))
    assert mr.stragglers(JobEvidence(metrics={"step_time": {**steps, "d": 2.0}}, settings={"straggler_factor": 1.5}))


def test_gpu_events_and_ib() -> None:
    m = {"gpu_events": [{"kind": "xid", "node": "a", "gpu": "2", "time": 50.0, "value": 79},
                        {"kind": "row_remap_failure", "node": "b", "gpu": "0", "time": 60.0, "value": 1}],
         "ib": [{"node": "c", "device": "mlx5_1", "port": "1", "counter": "node_infiniband_link_downed_total",
                 "delta": 2.0}]}
    found = run_job_rules(JobEvidence(metrics=m))
    assert found[0].id == "metric.xid.a.2" and "fallen off the bus" in found[0].summary
    ib = next(f for f in found if f.category == "network")
    assert ib.verdict.value == "FAIL" and ib.evidence["deltas"] == {"link_downed": 2.0}


def test_baseline_diff_names_what_differs() -> None:
    now = JobEvidence(job={"job_id": "2"}, metrics={"gpus": [_gpu("a", "0", util=40.0)],
                                                    "threads": {"a": {"min": 100, "max": 3000}}})
    base = JobEvidence(job={"job_id": "1"}, metrics={"gpus": [_gpu("a", "0")], "threads": {"a": {"min": 100, "max": 300}}})
    assert not mr.baseline_diff(now)
    now.baseline = base
    f = mr.baseline_diff(now)[0]
    assert set(f.evidence["differences"]) == {"median GPU utilization %", "max threads per node"}
    assert f.category == "host_resources" and "job 1" in f.summary


def test_run_queue_outlier() -> None:
    rq = {"a": 3.0, "b": 3.5, "c": 2.8, "d": 40.0}
    out = mr.host_contention(JobEvidence(metrics={"procs_running": rq}))
    assert [f.id for f in out] == ["metric.run_queue.d"]


def test_settings_come_from_the_config_file(tmp_path) -> None:
    from slurm_triage.config import load
    from slurm_triage.triage.sources import settings

    p = tmp_path / "c.toml"
    p.write_text('[triage]\nstraggler_factor = 3\n[pushgateway]\nurl = "http://127.0.0.1:9"\n')
    s = settings(load(str(p)))
    assert s["straggler_factor"] == 3.0 and s["hang_min_seconds"] == DEFAULTS["hang_min_seconds"]
    assert s["pushgateway_url"] == "http://127.0.0.1:9"  # falls back to pushgateway.url
