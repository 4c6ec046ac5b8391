"""Issue 13 item 5 in CI: bench/bench_false_drains.py, short. Healthy jobs under benign noise
(application Xids 13/43/45, correctable AER, a busy host, a slow Pushgateway) drain nothing
and lose no result; the full run (500 jobs) is the bench's."""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_false_drains  # noqa: E402

JOBS = int(os.environ.get("SLURM_TRIAGE_FALSE_DRAIN_JOBS", "20"))


def test_noisy_healthy_jobs_drain_nothing_and_lose_nothing(lab):
    r = bench_false_drains.run(lab, JOBS, batch=JOBS, seed=int(os.environ.get("SLURM_TRIAGE_SEED", "13")),
                               lock=False)  # this test holds the lab's lock already
    print("\n" + bench_false_drains.text(r))
    assert r["failed_jobs"] == 0, r["failures"]
    assert r["drains"] == 0, r["drained"]
    assert r["lost_results"] == 0 and r["spooled_left"] == 0
    # Printed, not asserted: under the slow gateway a replayed Prolog PUT that timed out can be
    # applied after the Epilog's DELETE of the same group (2 live groups in a 201-job run) and
    # a timed-out PUT the gateway still applied is replayed (doubled, same content).
    assert r["prolog_seconds"]["n"] >= len(lab.nodes) * JOBS // 2, r["prolog_seconds"]
    assert set(r["noise_jobs"]) >= {"xid", "aer", "busy", "slow_gateway"}, r["noise_jobs"]
