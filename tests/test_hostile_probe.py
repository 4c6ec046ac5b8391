"""A probe killed at its deadline takes every helper it forked with it (issue 13, break 11):
the parallel /proc scan's children must not outlive the hook and write into closed pipes."""
from __future__ import annotations

import os
import time
from pathlib import Path

from slurm_triage.deadline import run_probe, run_probes


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def test_deadline_kills_the_probes_grandchildren(tmp_path: Path) -> None:
    pids = tmp_path / "pids"

    def helper() -> int:  # what collect/procs.py's parallel scan runs in each grandchild
        with open(pids, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        time.sleep(60)
        return 0

    def probe() -> int:  # a probe that fans out, then hangs with its helpers
        run_probes({str(i): (helper, 60.0) for i in range(3)})
        return 0

    t0 = time.monotonic()
    r = run_probe(probe, 1.0)
    assert r.timed_out and time.monotonic() - t0 < 5
    helpers = [int(x) for x in pids.read_text().split()]
    assert len(helpers) == 3
    deadline = time.monotonic() + 5
    while not all(_gone(p) for p in helpers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in helpers), "helpers of the killed probe are still running"


def test_a_probe_that_finishes_is_unaffected() -> None:
    def probe() -> int:
        return sum(r.value for r in run_probes({str(i): (lambda i=i: i, 5.0) for i in range(4)}).values())

    r = run_probe(probe, 5.0)
    assert r.ok and r.value == 6
