"""The in-step watcher under real Slurm: started by the SPANK plugin for `srun --triage`, as
the job's user, on every node of the step; it must flag a hang and never outlive its step."""
from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from typing import Dict, Iterator, Optional

import pytest

import lab as labmod

FAST = "[watcher]\ninterval_seconds = 0.5\nhang_window_seconds = 2.0\nstraggler_window_seconds = 2.0\n"


@pytest.fixture
def fast(lab: labmod.Lab) -> Iterator[labmod.Lab]:
    """The lab with a watcher that samples every 0.5 s over 2 s windows."""
    with lab.config(FAST):
        yield lab


def watch_flags(lab: labmod.Lab, job: str) -> Dict[str, float]:
    """node -> slurm_triage_hang_suspected of the job's live watch groups."""
    with urllib.request.urlopen(lab.pushgateway_url + "/api/v1/metrics", timeout=5) as r:
        data = json.load(r)["data"]
    out = {}
    for g in data:
        lb = g["labels"]
        if lb.get("phase") == "watch" and lb.get("slurm_job_id") == job:
            for m in (g.get("slurm_triage_hang_suspected") or {}).get("metrics", []):
                out[lb["instance"]] = float(m["value"])
    return out


def watchers() -> str:
    return subprocess.run(["pgrep", "-a", "-u", labmod.TEST_USER, "triage-watcher"],
                          capture_output=True, text=True).stdout.strip()


def no_watcher_within(seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while watchers():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def start_step(lab: labmod.Lab, *cmd: str) -> "subprocess.Popen[str]":
    return subprocess.Popen(
        ["runuser", "-u", labmod.TEST_USER, "--", "env", "-i", "PATH=/usr/bin:/bin", f"SLURM_CONF={lab.slurm_conf}",
         "srun", "--triage", "-N2", "-w", "node1,node2", "sh", "-c",
         'test "$SLURM_NODEID" = 0 && echo "$SLURM_JOB_ID"; ' + " ".join(cmd)],
        cwd=str(lab.workdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def job_of(proc: "subprocess.Popen[str]") -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.isdigit(), line
    return line


def wait_for(pred, seconds: float) -> Optional[object]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.3)
    return None


def test_hang_is_flagged_on_the_hung_node_only_and_the_watchers_end_with_the_step(fast):
    lab = fast
    lab.set_scenario("node1", "h100x8-busy.json")
    lab.set_scenario("node2", "h100x8-nccl-hang.json")
    step = start_step(lab, "sleep 8")
    job = job_of(step)
    flags = wait_for(lambda: (lambda f: f if f.get("node2") == 1.0 else None)(watch_flags(lab, job)), 20)
    assert flags, watch_flags(lab, job)
    assert flags.get("node1") == 0.0  # training at 600-690 W is no hang
    assert step.wait(60) == 0
    assert no_watcher_within(5), watchers()


def test_no_watcher_outlives_scancel(fast):
    lab = fast
    step = start_step(lab, "sleep 60")
    job = job_of(step)
    assert wait_for(lambda: watchers(), 15), "no watcher started"
    lab.run("scancel", job, user=None)
    step.wait(60)
    assert no_watcher_within(10), watchers()


def test_no_watcher_outlives_a_crashing_task(fast):
    lab = fast
    step = start_step(lab, "sleep 2; kill -SEGV $$")
    job_of(step)
    assert step.wait(60) != 0
    assert no_watcher_within(10), watchers()
