"""False drains as a figure (issue 13, item 5): N healthy 4-node jobs on the lab, the real
hooks, random benign noise; drains per 1,000 jobs (goal 0), lost results, the Prolog's wall time.

Noise, drawn per job from a seeded RNG (every kind is benign: none may drain a node):
  - application Xids 43 / 45 / 13 on random GPUs of random nodes, in the driver's recorded
    shapes (tests/data/kernel/), some before the job (the Prolog reads them) and some while
    it runs (the Epilog reads them);
  - PCIe *correctable* AER bursts on a GPU (root port + device lines, as Linux logs them);
  - a busy node: CPU spinners while the job runs (the lab's nodes share one host, so the
    load is everyone's, the Prolog included);
  - a slow Pushgateway: a delaying proxy before the real one, some requests past the hooks'
    push budget (they are spooled and must still arrive exactly once).
Every push goes through lab/gateway_proxy.py, which counts what the gateway applied: a job's
result is lost when some node's ``last_job`` group never arrived. The Prolog's time is given
twice: its own ``hook_duration_seconds`` (measured before its push, interpreter start-up
excluded) and the job start latency (srun to the first task: the slowest node's whole Prolog,
pushes included, plus Slurm's own launch).

The lab lock (/tmp/slurm-lab/.test-lock) is taken per batch of jobs and given back between
batches, with the spool drained and the config restored, so lab tests can run in between.

    .venv/bin/python bench/bench_false_drains.py [--jobs 500] [--batch 25] [--seed 13] [--max-minutes M] [--format json]
"""
from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import random
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "lab"))

import labctl  # noqa: E402
from gateway_proxy import Counting, flush_spools  # noqa: E402

SCENARIO = ROOT / "tests" / "fakenvml" / "scenarios" / labctl.DEFAULT_SCENARIO
P_KERNEL, P_AER, P_BUSY, P_SLOW = 0.6, 0.3, 0.2, 0.25
"""Chance per job of each kind of noise."""
SLOW_SECONDS = (0.3, 4.5)
"""Delay range of a slow gateway: past the hooks' 3 s push budget at the upper end."""
BUSY_SPINNERS = 2
KEEP_LINES = 400
"""The noise log is cut back to empty (between jobs) once it has this many lines."""


def buses() -> List[str]:
    """The lab GPUs' bus ids as the scenario has them (0000:5d:00.0)."""
    return [g["pci_bus_id"][-12:].lower() for g in json.loads(SCENARIO.read_text())["gpus"]]


def uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def xid_lines(rng: random.Random, bus: str, t: float) -> List[str]:
    """One application's Xid burst on one GPU, in the driver's recorded shapes."""
    short = bus[:-2]  # the driver prints PCI:DDDD:BB:DD
    pid = rng.randint(1000, 4000000)
    code = rng.choice((13, 43, 45))
    if code == 13:  # tests/data/kernel/xid13_app.syslog.log
        text = [f"NVRM: Xid (PCI:{short}): 13, Graphics SM Warp Exception on (GPC {rng.randint(0, 7)}, TPC 0, "
                "SM 0): Illegal Instruction Encoding",
                f"NVRM: Xid (PCI:{short}): 13, Graphics Exception: ESR 0x5067b0=0x9 0x5067b4=0x24"]
    elif code == 43:  # the corpus' pt_main_thread shape
        text = [f"NVRM: Xid (PCI:{short}): 43, pid={pid}, name=pt_main_thread, Ch 00000008"]
    else:  # tests/data/kernel/xid45_after_nvlink.journal.log, a killed process' channels
        text = [f"NVRM: Xid (PCI:{short}): 45, pid={pid}, name=python3, Ch 0000000{k}" for k in range(1, 4)]
    return [f"[{t + i / 1e4:12.6f}] {line}" for i, line in enumerate(text)]


def aer_lines(rng: random.Random, bus: str, t: float) -> List[str]:
    """A correctable AER burst below a GPU's root port (tests/data/kernel/aer_corrected_nvme.log)."""
    port = f"{bus[:5]}{int(bus[5:7], 16) - 1:02x}:01.0"
    out = []
    for i in range(rng.randint(1, 3)):
        out += [f"pcieport {port}: AER: Corrected error received: {bus}",
                f"nvidia {bus}: AER: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
                f"nvidia {bus}: AER:   device [10de:2330] error status/mask=00000001/0000e000",
                f"nvidia {bus}: AER:    [ 0] RxErr"]
    return [f"[{t + i / 1e4:12.6f}] {line}" for i, line in enumerate(out)]


class Noise:
    """The benign noise of one job, drawn up front so a seed replays the run."""

    def __init__(self, rng: random.Random, nodes: List[str], gpus: List[str]):
        self.before: Dict[str, int] = {}
        self.during: Dict[str, int] = {}
        self.aer: Dict[str, int] = {}
        if rng.random() < P_KERNEL:
            for n in rng.sample(nodes, rng.randint(1, len(nodes))):
                (self.before if rng.random() < 0.5 else self.during)[n] = rng.randint(1, 3)
        if rng.random() < P_AER:
            for n in rng.sample(nodes, rng.randint(1, 2)):
                self.aer[n] = 1
        self.busy = rng.random() < P_BUSY
        self.slow = rng.random() < P_SLOW
        self.rng = random.Random(rng.random())
        self.gpus = gpus

    def kinds(self) -> List[str]:
        return ([k for k, v in (("xid", self.before or self.during), ("aer", self.aer)) if v]
                + [k for k, v in (("busy", self.busy), ("slow_gateway", self.slow)) if v])

    def write(self, lab: labctl.Lab, which: Dict[str, int], aer: bool = False) -> int:
        n_lines = 0
        for node, bursts in which.items():
            lines: List[str] = []
            for _ in range(bursts):
                bus = self.rng.choice(self.gpus)
                lines += (aer_lines if aer else xid_lines)(self.rng, bus, uptime())
            with open(lab.node_dir(node) / "kernel.log", "a") as fh:
                fh.write("\n".join(lines) + "\n")
            n_lines += len(lines)
        return n_lines


@contextmanager
def spinners(count: int) -> Iterator[None]:
    """``count`` CPU-bound processes for the block (ours, stopped by pid)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


@contextmanager
def lab_turn(lock: bool) -> Iterator[None]:
    """The lab's exclusive lock for one batch (not when a test that holds it already calls us)."""
    if not lock:
        yield
        return
    with open(labctl.lab_dir() / ".test-lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def spooled(lab: labctl.Lab) -> int:
    return sum(len(list((lab.node_dir(n) / "spool").glob("*.json"))) for n in lab.nodes)


def settle(lab: labctl.Lab, timeout: float = 90) -> None:
    """Wait until no node runs or completes a job (a drained node counts as settled) and no hook
    publisher still pushes (an OK hook's results leave after the hook, through the proxy)."""
    for n in lab.nodes:
        lab.wait_node(n, lambda s: not any(w in s for w in ("ALLOC", "MIX", "COMPLETING")), timeout)
    lab.wait_published(timeout)


def drained(lab: labctl.Lab) -> Dict[str, str]:
    """node -> reason for every node drained now (one sinfo call)."""
    out = lab.run("sinfo", "-h", "-N", "-o", "%N|%T|%E", user=None, timeout=30).stdout
    return {f[0]: f[2] for f in (line.split("|", 2) for line in out.splitlines())
            if len(f) == 3 and ("drain" in f[1] or "down" in f[1] or "fail" in f[1])}


def run_job(lab: labctl.Lab, noise: Noise) -> Tuple[Optional[int], float, Optional[float], str]:
    """(job id or None, srun wall seconds, start latency, stderr) of one 4-node step under
    ``noise``. The start latency runs from srun's start to the first task's first instruction:
    it holds the slowest node's whole Prolog, its pushes included."""
    noise.write(lab, noise.before)
    noise.write(lab, noise.aer, aer=True)
    timer = threading.Timer(0.2, noise.write, (lab, noise.during))
    t0, w0 = time.monotonic(), time.time()
    with (spinners(BUSY_SPINNERS) if noise.busy else _nothing()):
        timer.start()
        try:
            r = lab.srun("-N4", "sh", "-c",
                         'test "$SLURM_NODEID" = 0 && echo "$(date +%s.%N) $SLURM_JOB_ID"; sleep 0.5', timeout=120)
        finally:
            timer.join()
    wall = time.monotonic() - t0
    words = r.stdout.split()
    if r.returncode != 0 or len(words) < 2 or not words[-1].isdigit():
        return None, wall, None, r.stderr
    return int(words[-1]), wall, float(words[-2]) - w0, r.stderr


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def pct(values: List[float], q: float) -> Optional[float]:
    """The q-quantile by nearest rank (None without values)."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def run(lab: labctl.Lab, jobs: int, batch: int = 25, seed: int = 13, lock: bool = True,
        progress: bool = False, max_seconds: float = float("inf")) -> Dict[str, Any]:
    """Run the bench (no new job after ``max_seconds``: the figures say how many ran)."""
    rng = random.Random(seed)
    gpus = buses()
    rng_delay = random.Random(seed + 1)
    slow = [False]  # the current job's gateway is slow (its Prolog and Epilog pushes)
    proxy = Counting(lab.pushgateway_url, delay=lambda: rng_delay.uniform(*SLOW_SECONDS) if slow[0] else 0.0)
    ran: List[int] = []
    failed: List[str] = []
    drains: List[Dict[str, str]] = []
    walls: List[float] = []
    starts: List[float] = []
    load = [os.getloadavg()[0]]
    noise_count: Dict[str, int] = {}
    recovery = 0
    t_start = time.monotonic()
    try:
        done = 0
        while done < jobs and time.monotonic() - t_start < max_seconds:
            with lab_turn(lock):
                text = lab.triage_config.read_text()
                logs = {n: (lab.node_dir(n) / "kernel.log").read_bytes() for n in lab.nodes}
                try:
                    with lab.config(replace=text.replace(lab.pushgateway_url, proxy.url)):
                        lab.wait_idle(timeout=60)
                        before = drained(lab)
                        for _ in range(min(batch, jobs - done)):
                            if time.monotonic() - t_start >= max_seconds:
                                break
                            noise = Noise(rng, lab.nodes, gpus)
                            for k in noise.kinds():
                                noise_count[k] = noise_count.get(k, 0) + 1
                            slow[0] = noise.slow
                            job, wall, start, err = run_job(lab, noise)
                            done += 1
                            walls.append(wall)
                            if start is not None:
                                starts.append(start)
                            if job is None:
                                failed.append(err.strip()[-300:])
                            else:
                                ran.append(job)
                            settle(lab)  # every Epilog has run
                            slow[0] = False
                            now = drained(lab)
                            new = {n: r for n, r in now.items() if n not in before}
                            if new:
                                drains.append({"job": str(job), **new})
                                for n in new:
                                    lab.resume(n)
                            if sum(len(p.read_bytes().splitlines()) for p in
                                   (lab.node_dir(n) / "kernel.log" for n in lab.nodes)) > KEEP_LINES:
                                for n in lab.nodes:
                                    (lab.node_dir(n) / "kernel.log").write_bytes(logs[n])
                            if progress and done % 10 == 0:
                                print(f"  {done}/{jobs} jobs, {len(drains)} drains, {len(failed)} failed, "
                                      f"{time.monotonic() - t_start:.0f} s", file=sys.stderr, flush=True)
                        # before giving the lab back: what the slow gateway left in the spools
                        tries = 0
                        while spooled(lab) and tries < 5:
                            job, _, _, err = run_job(lab, Noise(random.Random(0), [], gpus))
                            tries += 1
                            recovery += 1
                            if job is not None:
                                ran.append(job)
                            settle(lab)
                        if spooled(lab):  # a backlog the jobs could not clear: replayed without new jobs
                            flush_spools(lab)
                finally:
                    for n in lab.nodes:
                        (lab.node_dir(n) / "kernel.log").write_bytes(logs[n])
                time.sleep(1.0)  # late answers of the proxy reach the gateway
    finally:
        proxy.close()
    load.append(os.getloadavg()[0])
    return report(lab, proxy, jobs, ran, failed, drains, walls, starts, noise_count, recovery,
                  time.monotonic() - t_start, load)


def report(lab: labctl.Lab, proxy: Counting, jobs: int, ran: List[int], failed: List[str],
           drains: List[Dict[str, str]], walls: List[float], starts: List[float], noise: Dict[str, int],
           recovery: int, seconds: float, load: List[float]) -> Dict[str, Any]:
    ids = {str(j) for j in ran}
    got = {(g.get("instance"), g.get("slurm_job_id")) for g in proxy.delivered("last_job")}
    expected = {(n, j) for n in lab.nodes for j in ids}
    groups = gateway_groups(lab)
    live = [g for g in groups if g.get("phase") == "prolog" and g.get("slurm_job_id") in ids]
    prolog = proxy.hook_seconds("prolog", ids)
    total = len(ran) + len(failed)
    return {
        "jobs": jobs, "jobs_run": total, "recovery_jobs": recovery, "failed_jobs": len(failed),
        "failures": failed[:5], "drains": len(drains),
        "drains_per_1000_jobs": round(1000.0 * len(drains) / max(total, 1), 2), "drained": drains[:10],
        "lost_results": len(expected - got), "doubled_results": proxy.doubled("last_job"),
        "live_prolog_groups_left": len(live), "spooled_left": spooled(lab),
        "prolog_seconds": {"n": len(prolog), "p50": pct(prolog, 0.5), "p99": pct(prolog, 0.99),
                           "max": max(prolog) if prolog else None},
        "start_latency_seconds": {"p50": pct(starts, 0.5), "p99": pct(starts, 0.99),
                                  "max": max(starts) if starts else None},
        "srun_seconds": {"p50": pct(walls, 0.5), "p99": pct(walls, 0.99), "max": max(walls) if walls else None},
        "noise_jobs": noise, "wall_seconds": round(seconds, 1), "loadavg_1min_start_end": load,
    }


def gateway_groups(lab: labctl.Lab) -> List[Dict[str, str]]:
    import requests

    data = requests.get(lab.pushgateway_url + "/api/v1/metrics", timeout=10).json()["data"]
    return [g["labels"] for g in data]


def text(r: Dict[str, Any]) -> str:
    def s(v: Optional[float]) -> str:
        return "-" if v is None else f"{v:.3f}"
    p, w, st = r["prolog_seconds"], r["srun_seconds"], r["start_latency_seconds"]
    return "\n".join([
        f"false drains: {r['drains']} in {r['jobs_run']} jobs = {r['drains_per_1000_jobs']} per 1,000 jobs"
        f" (+{r['recovery_jobs']} spool-recovery jobs)",
        f"failed jobs: {r['failed_jobs']}; lost results: {r['lost_results']}; doubled: {r['doubled_results']}; "
        f"live prolog groups left: {r['live_prolog_groups_left']}; spooled left: {r['spooled_left']}",
        f"Prolog's own time before its push (hook_duration_seconds, n={p['n']}): p50 {s(p['p50'])} s, "
        f"p99 {s(p['p99'])} s, max {s(p['max'])} s",
        f"job start latency (srun -> first task: the slowest node's whole Prolog, pushes included): "
        f"p50 {s(st['p50'])} s, p99 {s(st['p99'])} s, max {s(st['max'])} s",
        f"srun wall: p50 {s(w['p50'])} s, p99 {s(w['p99'])} s, max {s(w['max'])} s",
        "jobs with noise: " + ", ".join(f"{k} {v}" for k, v in sorted(r["noise_jobs"].items())),
        f"bench wall time: {r['wall_seconds']} s; 1-min load average at start/end: "
        + "/".join(f"{x:.2f}" for x in r["loadavg_1min_start_end"])])


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--batch", type=int, default=25, help="jobs per turn on the lab lock")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--format", choices=("text", "json"), default="text")
    ap.add_argument("--max-minutes", type=float, default=float("inf"),
                    help="start no job after this long (the figures cover the jobs that ran)")
    args = ap.parse_args(argv)
    lab = labctl.find()
    if lab is None:
        print("the Slurm lab is not up: run `make lab-up`", file=sys.stderr)
        return 2
    r = run(lab, args.jobs, args.batch, args.seed, progress=True, max_seconds=args.max_minutes * 60)
    print(json.dumps(r, indent=1) if args.format == "json" else text(r))
    return 0 if r["drains"] == 0 and r["lost_results"] == 0 and r["failed_jobs"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
