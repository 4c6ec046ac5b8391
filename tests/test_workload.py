"""The lab's training stand-in (lab/workload/train.py): a real ring all-reduce over TCP, leaked
communicator threads when restored, a stuck rank that leaves the others spinning; and under Slurm,
its step times in the Pushgateway."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Dict, List

import pytest

from conftest import ROOT, free_port

TRAIN = ROOT / "lab" / "workload" / "train.py"


def ranks(world: int, *args: str, timeout: float = 90) -> List[subprocess.CompletedProcess]:
    """``world`` local processes as Slurm would start them (SLURM_PROCID/NTASKS, MASTER_PORT)."""
    port = str(free_port())
    procs = []
    for r in range(world):
        env = {"PATH": "/usr/bin:/bin", "SLURM_PROCID": str(r), "SLURM_NTASKS": str(world),
               "SLURMD_NODENAME": f"n{r}", "SLURM_JOB_ID": "7", "MASTER_PORT": port}
        procs.append(subprocess.Popen([sys.executable, str(TRAIN), *args], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=timeout)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, ""))
    return out


def step_times(text: str) -> List[float]:
    return [float(x) for x in re.findall(r"step_time ([0-9.]+) s", text)]


def test_ring_allreduce_agrees_on_every_rank() -> None:
    res = ranks(3, "--steps", "6", "--log-every", "3", "--bytes", "300001")
    assert all(r.returncode == 0 for r in res), [r.stdout for r in res]
    sums = {re.search(r"done checksum (\w+)", r.stdout).group(1) for r in res}
    assert len(sums) == 1  # XOR of three different random buffers, reduced the same everywhere
    assert all(len(step_times(r.stdout)) == 2 for r in res)


def test_restored_ranks_leak_spinning_watchdog_threads() -> None:
    port = str(free_port())
    env = {"PATH": "/usr/bin:/bin", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "8", "MASTER_PORT": port}
    p = subprocess.Popen([sys.executable, str(TRAIN), "--mode", "restored", "--restore-threads", "6", "--steps",
                          "1000000", "--log-every", "5"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        names = [Path(f"/proc/{p.pid}/task/{t}/comm").read_text().strip() for t in os.listdir(f"/proc/{p.pid}/task")]
    finally:
        p.kill()
        p.communicate()
    assert names.count("pt_nccl_watchdg") == 6, names


@pytest.mark.xfail(strict=False, reason="a CPU-contention effect: 1.5-2x alone on the 2-core machine, but twice "
                                        "~1.0x inside the full suite (2026-12-01, cause not found); the lab's "
                                        "story (tests/test_stories_lab.py) checks the slowdown through triage")
def test_restored_ranks_step_slower_than_fresh_ones() -> None:
    # medians of six windows each (one window on a shared 2-core machine can be off either way):
    fresh = ranks(1, "--steps", "60", "--log-every", "10")[0]
    slow = ranks(1, "--mode", "restored", "--restore-threads", "6", "--steps", "60", "--log-every", "10")[0]
    # ~1.5-2x here; without leaked threads the two are alike (1.0x)
    assert median(step_times(slow.stdout)) > 1.3 * median(step_times(fresh.stdout)), (slow.stdout, fresh.stdout)


def test_stuck_rank_leaves_the_others_spinning_until_the_timeout() -> None:
    t0 = time.monotonic()
    res = ranks(3, "--mode", "stuck-rank", "--stuck-rank", "1", "--stuck-after", "2", "--timeout", "3",
                "--steps", "50", "--log-every", "1")
    assert all(r.returncode == 1 for r in res)
    assert "stopped joining the collective" in res[1].stdout
    for r in (res[0], res[2]):
        assert "ERROR step 3" in r.stdout and "collective stalled" in r.stdout, r.stdout
    assert time.monotonic() - t0 < 30


def walls(text: str) -> List[float]:
    return [float(x) for x in re.findall(r"wall ([0-9.]+) s", text)]


def test_slow_rank_computes_slower_on_its_node() -> None:
    res = ranks(2, "--mode", "slow-rank", "--slow-node", "n1", "--slow-factor", "4", "--steps", "8",
                "--log-every", "8", "--bytes", "1000")
    assert all(r.returncode == 0 for r in res)
    fast, slow = step_times(res[0].stdout)[0], step_times(res[1].stdout)[0]
    # each rank's own step time shows the straggler (4x the work; 2x leaves room for a loaded machine:
    # 2.47x was measured once with the two cores shared by other work) ...
    assert slow > 2.0 * fast, (fast, slow)
    assert walls(res[0].stdout)[0] > 0.7 * walls(res[1].stdout)[0]  # ... the wall time is everyone's


def test_step_times_reach_the_pushgateway_under_slurm(lab) -> None:
    import requests

    pgw = os.environ.get("PUSHGATEWAY_URL") or "http://127.0.0.1:9091"
    r = lab.srun("-N2", "-n4", "--ntasks-per-node=2", "/usr/bin/python3", str(labmod_checkout() / "lab/workload/train.py"),
                 "--steps", "10", "--log-every", "5", "--bytes", "100000", "--pushgateway", pgw, timeout=120)
    assert r.returncode == 0, r.stderr + r.stdout
    job = re.search(r"\[rank0\] start mode=\S+ job=(\d+)", r.stdout).group(1)
    groups = requests.get(pgw + "/api/v1/metrics", timeout=5).json()["data"]
    mine: Dict[str, str] = {g["labels"]["rank"]: g["labels"]["instance"] for g in groups
                            if g["labels"].get("job") == "training" and g["labels"].get("slurm_job_id") == job}
    assert sorted(mine) == ["0", "1", "2", "3"] and set(mine.values()) == {"node1", "node2"}, mine


def labmod_checkout() -> Path:
    import lab as labmod

    return Path(os.environ.get("LAB_CHECKOUT") or labmod.ROOT)
