"""The product's stories end to end in the lab, with the training stand-in (lab/workload/train.py):
a thermal straggler found through step time, and a checkpoint-restore thread leak against its
fresh baseline. (RDMA retransmits: tests/test_rdma_lab.py; the collective hang: test_triage_lab.py.)"""
from __future__ import annotations

import json
import subprocess

import lab as labmod
from test_triage_lab import FAST, GPU5, triage


def test_thermal_straggler_through_step_time(lab):
    for n in ("node1", "node2"):
        lab.set_scenario(n, "h100x8-busy.json")
    with lab.config(FAST):
        job = lab.train("slow-rank", 3, during=lambda: lab.set_scenario("node2", "h100x8-thermal.json"),
                        extra=["--slow-node", "node2", "--slow-factor", "6"], scrapes=2)
    report = triage(lab, job)
    root = report["findings"][0]
    assert root["category"] == "thermal_power" and root["node"] == "node2" and root["gpu"] == GPU5, root
    strag = [f for f in report["findings"] if f["id"] == "metric.straggler.node2"]
    assert strag and strag[0]["caused_by"] == root["id"], report["findings"]
    ev = strag[0]["evidence"]
    assert ev["step_time_seconds"] > 2 * ev["peers_median_step_seconds"], ev


LEAKED = 6  # per rank: the ranks' CPU share and the run queue differ by far more than a busy machine's noise


def test_restored_job_thread_leak_against_its_fresh_baseline(lab):
    for n in ("node1", "node2"):
        lab.set_scenario(n, "h100x8-busy.json")
    with lab.config(FAST):  # one after the other: the lab's nodes share one kernel and so its run queue
        fresh = lab.train("fresh", 3, scrapes=2)
        restored = lab.train("restored", 3, extra=["--restore-threads", str(LEAKED)], scrapes=2)
    r = subprocess.run([str(labmod.ROOT / ".venv/bin/slurm-triage"), "triage", restored, "--baseline", fresh,
                        "--format", "json"], capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "SLURM_CONF": lab.slurm_conf,
                            "SLURM_TRIAGE_CONFIG": str(lab.triage_config)})
    root = json.loads(r.stdout)["findings"][0]
    assert root["id"] == "metric.baseline.threads" and root["category"] == "host_resources", root
    ev = root["evidence"]
    d = ev["differences"]
    # the lab's watchers see both ranks (one kernel): LEAKED per rank, 2 ranks
    assert d["max threads per node"]["this"] >= d["max threads per node"]["baseline"] + 2 * LEAKED, d
    assert d["median runnable tasks per node"]["ratio"] > 1.5 and d["median step time s"]["ratio"] > 1.5, d
    leaked = ev["new_threads"][0]
    assert leaked["thread"] == "pt_nccl_watchdg" and leaked["count"] == LEAKED and leaked["comm"] == "python3", ev
    assert set(ev["hardware_unchanged"]) == {"median GPU utilization %", "median GPU power W"}, ev
    assert "did not differ" in root["summary"] and f"pid {leaked['pid']}" in root["summary"]
